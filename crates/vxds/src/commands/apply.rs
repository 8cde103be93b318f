//! `vxds apply -f PATH...`: fixtures as one changeset; `--prune` also deletes what they do not
//! mention, guarded by the revision the listing was read at (retried if the store moves).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::bail;
use axum::http::Method;
use clap::Args;
use vxds_core::xdstp;
use vxds_envoy::changeset::{DeleteRequest, OperationRequest};
use vxds_envoy::resource::ResourceType;

use super::{print_problem, refused};
use crate::fixtures;
use crate::target::{Target, TargetArgs};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Fixture files or folders.
    #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    target: TargetArgs,
    /// Validate and report, commit nothing; shows which connected clients (of every replica)
    /// each change would move to another variant, update, lose or give the resource.
    #[arg(long)]
    dry_run: bool,
    #[command(flatten)]
    prune: super::prune::PruneArgs,
    /// Recorded with the revision.
    #[arg(short, long)]
    message: Option<String>,
    /// After committing, wait up to this long for every client stream the revision changed to
    /// accept it: exit 0 when all did, 1 when a client refused it (naming the node and its
    /// error), 2 on a timeout or an error — a write the server refuses included, since nothing
    /// was committed (see `vxds rollout status`).
    #[arg(long, value_parser = humantime::parse_duration)]
    wait: Option<std::time::Duration>,
    /// With `--wait`: when a client refuses the revision, restore the state before it as a
    /// new revision (unless someone committed since), wait for that, and exit 1.
    #[arg(long, requires = "wait")]
    revert_on_nack: bool,
}

/// How often a prune is retried when the store moves between listing and applying.
const PRUNE_ATTEMPTS: usize = 3;

pub async fn run(args: ApplyArgs) -> anyhow::Result<ExitCode> {
    let fixtures = fixtures::load(&args.files)?;
    let scope = args.prune.scope()?;
    let target = Target::connect_without_index(&args.target).await?;
    let result = apply(&args, scope.as_ref(), &fixtures, &target).await;
    target.close().await;
    result
}

async fn apply(
    args: &ApplyArgs,
    scope: Option<&super::prune::Scope>,
    fixtures: &fixtures::Fixtures,
    target: &Target,
) -> anyhow::Result<ExitCode> {
    for attempt in 1..=PRUNE_ATTEMPTS {
        let mut changeset = fixtures.changeset();
        changeset.dry_run = args.dry_run;
        changeset.message = args.message.clone();
        if let Some(scope) = scope {
            let head = target.head().await?;
            let mentioned = mentioned_keys(fixtures);
            for (type_url, name) in scope.deletions(target, &mentioned).await? {
                changeset
                    .operations
                    .push(OperationRequest::Delete(DeleteRequest {
                        resource_type: type_url,
                        name,
                        expected_version: None,
                    }));
            }
            changeset.expected_revision = Some(head);
        }
        let mut path = "/v1/changesets".to_owned();
        if let Some(wait) = args.wait.filter(|_| !args.dry_run) {
            path.push_str(&format!("?wait={}ms", wait.as_millis().max(1)));
            if args.revert_on_nack {
                path.push_str("&revert_on_nack=true");
            }
        }
        let reply = target.send(Method::POST, &path, &changeset).await?;
        drop(changeset);
        match reply.status {
            200 => {
                print_result(&reply.body, fixtures);
                if reply.body["rollout"].is_object() {
                    return Ok(super::rollout::report_outcome(&reply.body["rollout"]));
                }
                return Ok(ExitCode::SUCCESS);
            }
            409 if scope.is_some() && attempt < PRUNE_ATTEMPTS => continue,
            400 | 409 | 422 => {
                print_problem(&reply.body, &|p| fixtures.locate(p));
                if args.wait.is_some() && !args.dry_run {
                    // Nothing was committed, so there is no rollout to wait for: an error (2),
                    // never confused with a client refusing the revision (1).
                    eprintln!("error: nothing was committed; no rollout to wait for");
                    return Ok(ExitCode::from(2));
                }
                return Ok(refused());
            }
            status => bail!(
                "HTTP {status}: {}",
                reply.body["detail"].as_str().unwrap_or("no detail")
            ),
        }
    }
    bail!("the store kept changing while pruning; try again")
}

/// The keys the fixtures name, as the store keys them.
pub(crate) fn mentioned_keys(fixtures: &fixtures::Fixtures) -> BTreeSet<(String, String)> {
    fixtures
        .documents
        .iter()
        .filter_map(|d| {
            let ty = ResourceType::resolve(&d.resource_type).ok()?;
            let name = xdstp::normalize(&d.name).ok()?.into_owned();
            Some((ty.type_url().to_owned(), name))
        })
        .collect()
}

fn print_result(body: &serde_json::Value, fixtures: &fixtures::Fixtures) {
    let revision = body["revision"].as_u64().unwrap_or_default();
    let changed = body["changed"].as_array().cloned().unwrap_or_default();
    let dry = if body["dry_run"] == true {
        " (dry run: nothing written)"
    } else {
        ""
    };
    let mut text = String::new();
    if changed.is_empty() {
        text.push_str(&format!(
            "no changes; the store stays at revision {revision}{dry}\n"
        ));
    } else {
        let plural = if changed.len() == 1 { "" } else { "s" };
        text.push_str(&format!(
            "revision {revision}: {} change{plural}{dry}\n",
            changed.len()
        ));
        text.push_str(&super::change_table(&changed));
    }
    if body["impact"].is_object() {
        text.push_str(&super::impact::table(&body["impact"]));
    }
    super::out(&text);
    for warning in body["warnings"].as_array().into_iter().flatten() {
        eprintln!(
            "{}",
            super::format_item("warning", warning, &|p| fixtures.locate(p))
        );
    }
}
