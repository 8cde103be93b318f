//! `vxds rollout status N [--wait] [--timeout D]`: how far revision N reached the fleet
//! (`GET /v1/revisions/{n}/rollout`), like `kubectl rollout status`: exit 0 when every stream
//! it changed accepted it, 1 when a client refused it (each refusing node and its error text
//! are printed), 2 on a timeout (or, without `--wait`, a rollout still in progress) or an error.
//! Also the report of `vxds apply --wait`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use axum::http::Method;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::target::{Target, TargetArgs};

#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// Show (`--wait`: wait for) a revision's rollout: 0 accepted everywhere, 1 refused, 2
    /// timed out or failed.
    Status(StatusArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The revision.
    revision: u64,
    #[command(flatten)]
    target: TargetArgs,
    /// Wait until every stream the revision changed accepted it, or one refused it.
    #[arg(long)]
    wait: bool,
    /// With `--wait`: give up after this long (exit 2).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

/// The longest a single request waits; longer waits are several requests.
const REQUEST_WAIT: Duration = Duration::from_secs(60);

pub async fn run(command: RolloutCommand) -> anyhow::Result<ExitCode> {
    match command {
        RolloutCommand::Status(args) => {
            let target = Target::connect_without_index(&args.target).await?;
            let result = status(&args, &target).await;
            target.close().await;
            result
        }
    }
}

async fn status(args: &StatusArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let deadline = tokio::time::Instant::now() + args.timeout;
    loop {
        let mut path = format!("/v1/revisions/{}/rollout", args.revision);
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        if args.wait && !remaining.is_zero() {
            let wait = remaining.min(REQUEST_WAIT);
            path.push_str(&format!("?wait={}ms", wait.as_millis().max(1)));
        }
        let reply = target.call(Method::GET, &path, None).await?;
        if reply.status != 200 {
            bail!(
                "HTTP {}: {}",
                reply.status,
                reply.body["detail"].as_str().unwrap_or("no detail")
            );
        }
        let progressing = reply.body["state"] == "progressing";
        if args.wait && progressing && tokio::time::Instant::now() < deadline {
            continue;
        }
        return Ok(report(&reply.body, "", args.wait));
    }
}

/// One line of counts: `revision 7: 3/3 streams accepted`.
pub fn counts(status: &Value) -> String {
    let n = |k: &str| status[k].as_u64().unwrap_or_default();
    let mut line = format!(
        "revision {}: {}/{} streams accepted",
        n("revision"),
        n("acked"),
        n("streams")
    );
    for (key, label) in [
        ("nacked", "refused"),
        ("pending", "pending"),
        ("gone", "left"),
    ] {
        if n(key) > 0 {
            line.push_str(&format!(", {} {label}", n(key)));
        }
    }
    if let Some(p50) = status["ack_time"]["p50_ms"].as_u64() {
        let p99 = status["ack_time"]["p99_ms"].as_u64().unwrap_or_default();
        let max = status["ack_time"]["max_ms"].as_u64().unwrap_or_default();
        line.push_str(&format!(
            " (time to ACK p50 {p50} ms, p99 {p99} ms, max {max} ms)"
        ));
    }
    line
}

/// Prints a rollout status; the exit code it means. `prefix` starts each line.
pub fn report(status: &Value, prefix: &str, waited: bool) -> ExitCode {
    let mut text = format!("{prefix}{}\n", counts(status));
    let code = match status["state"].as_str() {
        Some("complete") => {
            text.push_str(&format!("{prefix}rollout complete\n"));
            ExitCode::SUCCESS
        }
        Some("failed") => {
            for nack in status["nacks"].as_array().into_iter().flatten() {
                text.push_str(&format!(
                    "{prefix}refused by node {} ({}, replica {}): {}\n",
                    nack["node"].as_str().unwrap_or_default(),
                    nack["type_url"].as_str().unwrap_or_default(),
                    nack["replica"].as_str().unwrap_or_default(),
                    nack["error"].as_str().unwrap_or_default(),
                ));
            }
            text.push_str(&format!("{prefix}rollout failed: clients refused it\n"));
            ExitCode::from(1)
        }
        _ => {
            text.push_str(&format!(
                "{prefix}{}\n",
                if waited {
                    "timed out waiting for the rollout"
                } else {
                    "rollout in progress"
                }
            ));
            ExitCode::from(2)
        }
    };
    super::out(&text);
    code
}

/// The report of `apply --wait`: the revision's rollout and, after a refusal, its undoing.
pub fn report_outcome(outcome: &Value) -> ExitCode {
    let code = report(&outcome["status"], "", true);
    if let Some(refused) = outcome["revert_refused"].as_str() {
        super::out(&format!("{refused}\n"));
    }
    let reverted = &outcome["reverted"];
    if reverted.is_object() {
        let first = outcome["status"]["nacks"][0].clone();
        super::out(&format!(
            "reverted: revision {} restores revision {}'s state, because node {} refused {}: {}\n",
            reverted["revision"],
            reverted["restored_to"],
            first["node"].as_str().unwrap_or_default(),
            first["type_url"].as_str().unwrap_or_default(),
            first["error"].as_str().unwrap_or_default(),
        ));
        let revert_code = report(&reverted["status"], "revert: ", true);
        if revert_code != ExitCode::SUCCESS {
            return ExitCode::from(2);
        }
    }
    code
}
