//! `vxds token create --scope metrics|read|write|secrets --name NAME`: a new random admin API token, printed
//! once, and the line for the token file, which holds only the token's SHA-256.

use std::process::ExitCode;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use clap::{Args, Subcommand, ValueEnum};

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a new random token (once) and its hashed line for `--admin-token-file`.
    Create(CreateArgs),
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// What the token may do: `metrics` (`/metrics` only), `read` (secret key material
    /// redacted), `write` (reads too), or `secrets` (writes, and sees secret key material).
    #[arg(long, value_enum)]
    scope: TokenScope,
    /// The name recorded as the author of the revisions the token writes: one word.
    #[arg(long, value_parser = parse_name)]
    name: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum TokenScope {
    Metrics,
    Read,
    Write,
    Secrets,
}

fn parse_name(name: &str) -> Result<String, String> {
    if name.is_empty() || name.chars().any(char::is_whitespace) || name.starts_with('#') {
        return Err("a token name is one word, without spaces, not starting with `#`".into());
    }
    Ok(name.to_owned())
}

pub fn run(command: TokenCommand) -> anyhow::Result<ExitCode> {
    match command {
        TokenCommand::Create(args) => create(args),
    }
}

fn create(args: CreateArgs) -> anyhow::Result<ExitCode> {
    // A token that starts with `-` reads as a flag in `--token $TOKEN` (one in 64 would): such
    // a draw is thrown away, which costs under one bit of the 256.
    let token = loop {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret)
            .map_err(|e| anyhow::anyhow!("reading the operating system's random numbers: {e}"))?;
        let token = URL_SAFE_NO_PAD.encode(secret);
        if !token.starts_with('-') {
            break token;
        }
    };
    let scope = match args.scope {
        TokenScope::Metrics => "metrics",
        TokenScope::Read => "read",
        TokenScope::Write => "write",
        TokenScope::Secrets => "secrets",
    };
    let line = format!(
        "{scope} {}{} {}",
        vxds_admin::auth::SHA256_PREFIX,
        vxds_admin::auth::token_sha256_hex(&token),
        args.name
    );
    // The line must be one the server loads and that matches the token.
    let loaded = vxds_admin::Tokens::parse(&line)?;
    anyhow::ensure!(loaded.len() == 1, "the token file line did not load");
    eprintln!(
        "The first line is the token: it is shown only this once, and the server does not keep \
         it. Add the second line to the admin token file (--admin-token-file)."
    );
    super::out(&format!("{token}\n{line}\n"));
    Ok(ExitCode::SUCCESS)
}
