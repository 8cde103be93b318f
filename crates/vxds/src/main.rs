//! The `vxds` binary: the server (`serve`) and the command line operators and CI use.
#![forbid(unsafe_code)]

mod commands;
mod fixtures;
mod heap;
mod serve;
mod target;
mod tls;

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

/// The SQLite file `vxds` uses when no database is named: zero set-up.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://vxds.db";

#[derive(Debug, Parser)]
#[command(
    name = "vxds",
    version,
    about = "An authoritative xDS control plane with TP2 dynamic-parameter variants"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format.
    #[arg(long, global = true, env = "VXDS_LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the server: the admin API (and the xDS server).
    Serve(Box<serve::ServeArgs>),
    /// Apply pending database migrations and exit.
    Migrate {
        /// `postgres://...` or `sqlite://...`.
        #[arg(long, env = "VXDS_DATABASE_URL", default_value = DEFAULT_DATABASE_URL)]
        database_url: String,
    },
    /// Apply fixture files as one changeset, to a server or straight to a database.
    Apply(commands::apply::ApplyArgs),
    /// Check fixture files offline against every rule the server checks.
    Validate(commands::validate::ValidateArgs),
    /// Show how the resources the fixtures name differ on the server, as unified diffs (exit
    /// 0 when equal, 1 when different).
    Diff(commands::diff::DiffArgs),
    /// Write the store as fixtures that `apply` takes back unchanged.
    Export(commands::export::ExportArgs),
    /// Show the variant a client with these parameters receives, and why.
    Resolve(commands::resolve::ResolveArgs),
    /// Make the store equal to its state right after a past revision, as a new revision.
    Rollback(commands::rollback::RollbackArgs),
    /// How far a revision reached the fleet: which clients accepted or refused it.
    #[command(subcommand)]
    Rollout(commands::rollout::RolloutCommand),
    /// Admin API tokens.
    #[command(subcommand)]
    Token(commands::token::TokenCommand),
    /// Write a development CA, server and client certificates for (mutual) TLS.
    DevCerts(commands::dev_certs::DevCertsArgs),
    /// Print the admin API's OpenAPI document (as checked in at api/openapi.yaml).
    Openapi,
}

fn init_logging(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // One crypto provider for every TLS client in the process (Postgres, the admin client).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let default_level = if matches!(cli.command, Command::Serve(_)) {
        "info"
    } else {
        "warn"
    };
    init_logging(cli.log_format, default_level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::run(*args).await,
            Command::Migrate { database_url } => {
                vxds_store::migrate_url(&database_url).await?;
                commands::out(&format!("migrated {}\n", vxds_store::redact(&database_url)));
                Ok(ExitCode::SUCCESS)
            }
            Command::Apply(args) => commands::apply::run(args).await,
            Command::Validate(args) => commands::validate::run(args),
            Command::Diff(args) => commands::diff::run(args).await,
            Command::Export(args) => commands::export::run(args).await,
            Command::Resolve(args) => commands::resolve::run(args).await,
            Command::Rollback(args) => commands::rollback::run(args).await,
            Command::Rollout(command) => commands::rollout::run(command).await,
            Command::Token(command) => commands::token::run(command),
            Command::DevCerts(args) => commands::dev_certs::run(args),
            Command::Openapi => {
                commands::out(&vxds_admin::openapi_yaml());
                Ok(ExitCode::SUCCESS)
            }
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
