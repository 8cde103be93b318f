//! `vxds rollback --to N`: the state right after revision N back as a new revision, through
//! `POST /v1/revisions/{n}/restore` (validated like any changeset; `--expected-revision`
//! guards against a store that moved since the operator looked).

use std::process::ExitCode;

use anyhow::bail;
use axum::http::Method;
use clap::Args;
use serde_json::json;

use super::{print_problem, refused};
use crate::target::{Target, TargetArgs};

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The revision whose state to restore (0: the empty store).
    #[arg(long)]
    to: u64,
    #[command(flatten)]
    target: TargetArgs,
    /// Refuse unless the store's head revision is this one.
    #[arg(long)]
    expected_revision: Option<u64>,
    /// Validate and report, commit nothing.
    #[arg(long)]
    dry_run: bool,
    /// Added to the revision's message, after `restore to revision N`.
    #[arg(short, long)]
    message: Option<String>,
}

pub async fn run(args: RollbackArgs) -> anyhow::Result<ExitCode> {
    let target = Target::connect(&args.target).await?;
    let result = rollback(&args, &target).await;
    target.close().await;
    result
}

async fn rollback(args: &RollbackArgs, target: &Target) -> anyhow::Result<ExitCode> {
    let mut body = json!({"dry_run": args.dry_run});
    if let Some(expected) = args.expected_revision {
        body["expected_revision"] = json!(expected);
    }
    if let Some(message) = &args.message {
        body["message"] = json!(message);
    }
    let path = format!("/v1/revisions/{}/restore", args.to);
    let reply = target.call(Method::POST, &path, Some(&body)).await?;
    match reply.status {
        200 => {
            let changed = reply.body["changed"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut text = format!("{}\n", reply.body["summary"].as_str().unwrap_or_default());
            text.push_str(&super::change_table(&changed));
            if reply.body["impact"].is_object() {
                text.push_str(&super::impact::table(&reply.body["impact"]));
            }
            super::out(&text);
            for warning in reply.body["warnings"].as_array().into_iter().flatten() {
                eprintln!("{}", super::format_item("warning", warning, &locate));
            }
            Ok(ExitCode::SUCCESS)
        }
        404 | 409 | 422 => {
            print_problem(&reply.body, &locate);
            Ok(refused())
        }
        status => bail!(
            "HTTP {status}: {}",
            reply.body["detail"].as_str().unwrap_or("no detail")
        ),
    }
}

/// Problems of a restore name their resource in the message; the pointer is the request's.
fn locate(pointer: &str) -> String {
    if pointer.is_empty() {
        "restore".to_owned()
    } else {
        pointer.to_owned()
    }
}
