//! `GET /v1/revisions/{revision}/rollout`: how far a revision reached the fleet.
//!
//! This replica's counts are live (`vxds_xds::rollout`); every other replica's come from the
//! client summary it publishes to the store — every `--client-summary-period` (5 s), and
//! 100 ms after a revision settles on it or one of its streams refuses one. So the fleet's
//! status is right within about 100 ms plus a database round trip of each replica's own.
//! Each replica remembers the last [`vxds_xds::rollout::ROLLOUT_WINDOW`] revisions (and
//! publishes the last [`vxds_xds::rollout::PUBLISHED_WINDOW`] that concern its streams); an
//! older revision answers 410.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use vxds_core::rollout::{RolloutRecord, RolloutState, RolloutStatus};
use vxds_store::{RestoreError, RestoreOptions};
use vxds_xds::rollout::Known;

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody, ReadProblems};
use crate::query::{PathParams, Query};

/// The rollout status of a revision across the fleet.
///
/// `streams` counts the streams, on every replica, whose resolved resources the revision
/// changed; `acked` those that accepted it (or a later revision), `nacked` those that refused
/// it (with `nacks`: node, type, the client's error text and replica), `pending` those still
/// to answer, `gone` those that left first (their node not back within 30 s to answer for
/// them). `state` is `complete` once nothing is pending or
/// undecided, `failed` as soon as a stream refused it. `ack_time` is from the commit to each
/// ACK. `rollout` events on `GET /v1/events` say when it moves. With `wait`, answers once the
/// rollout completes or fails, or when the wait ends (`state` then still `progressing`).
#[utoipa::path(
    get,
    path = "/v1/revisions/{revision}/rollout",
    operation_id = "getRevisionRollout",
    tag = "revisions",
    params(
        ("revision" = u64, Path, description = "The revision number", minimum = 1, maximum = 9223372036854775807_i64),
        RolloutParams,
    ),
    responses(
        (status = 200, description = "The revision's rollout across the fleet", body = RolloutStatus),
        (status = 400, description = "Not a revision number", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such revision (yet)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 410, description = "Older than the revisions whose rollout is remembered (`history_pruned`; the detail names the oldest)", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn get(
    State(state): State<AdminState>,
    path: PathParams,
    Query(params): Query<RolloutParams>,
) -> Result<Json<RolloutStatus>, ApiError> {
    let n = crate::revisions::revision_number(&path)?;
    let wait = WaitParams {
        wait: params.wait,
        revert_on_nack: None,
    }
    .wait()?;
    match wait {
        Some(wait) => wait_for(&state, n, tokio::time::Instant::now() + wait)
            .await
            .map(Json),
        None => status(&state, n).await.map(Json),
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RolloutParams {
    /// Wait up to this long (`30s`; at most `1h`) for the rollout to complete or fail.
    wait: Option<String>,
}

/// The fleet's rollout of revision `n`.
pub async fn status(state: &AdminState, n: u64) -> Result<RolloutStatus, ApiError> {
    let head = state.store.head_revision().await?;
    if n == 0 || n > head {
        return Err(ApiError::NotFound(format!(
            "there is no revision {n} (the head is {head})"
        )));
    }
    let own_id = state.replica_id.as_deref().unwrap_or("local");
    let mut records: Vec<(String, RolloutRecord)> = Vec::new();
    let mut forgotten = None;
    // Replicas that started (or reloaded) after `n`: their streams' answers to it were never
    // recorded, so they count nothing — and must not pass for "concerned none".
    let mut started_after = Vec::new();
    if let Some(registry) = &state.clients {
        match registry.rollouts.get(n) {
            Known::Record(record) => records.push((own_id.to_owned(), *record)),
            Known::Forgotten { oldest } => forgotten = Some(oldest),
            // In place before this replica started: unknown here.
            Known::BeforeStart => started_after.push(own_id.to_owned()),
            // Committed, not yet dispatched here: still to come.
            Known::NotYet => records.push((own_id.to_owned(), RolloutRecord::new(n, None))),
        }
    }
    for row in state.store.client_summaries().await? {
        if state.clients.is_some() && row.replica_id == own_id {
            continue;
        }
        let summary = row.summary;
        if summary.rollout_loaded.is_some_and(|loaded| n <= loaded) {
            if summary.streams > 0 {
                started_after.push(row.replica_id);
            }
            continue;
        }
        // A replica that has told its streams of no revision since it started (just
        // restarted, say) has every revision still to come; one without streams has nothing
        // to count.
        let head = match summary.rollout_head {
            Some(head) => head,
            None if summary.streams > 0 => 0,
            None => continue,
        };
        // Revisions the replica applied together share one record, which says which it counts.
        match summary.rollouts.into_iter().find(|r| r.covers(n)) {
            Some(mut record) => {
                record.revision = n;
                records.push((row.replica_id, record));
            }
            // Still to come there.
            None if head < n => records.push((row.replica_id, RolloutRecord::new(n, None))),
            // Dispatched there and concerned none of its streams (or past what it publishes).
            None => {}
        }
    }
    if records.is_empty()
        && let Some(oldest) = forgotten
    {
        return Err(ApiError::HistoryPruned(format!(
            "revision {n}'s rollout is no longer remembered: replicas keep the last {} \
             revisions' (the oldest here is {oldest})",
            vxds_xds::rollout::ROLLOUT_WINDOW
        )));
    }
    if records.is_empty() && !started_after.is_empty() {
        return Err(ApiError::HistoryPruned(format!(
            "revision {n}'s rollout was not recorded: it was in place before {} started or \
             reloaded its index, so its streams' answers to it are unknown",
            started_after.join(", ")
        )));
    }
    Ok(RolloutStatus::merge(
        n,
        records.iter().map(|(replica, r)| (replica.as_str(), r)),
    ))
}

/// How often a wait re-reads the other replicas' published counts (this replica's own wake it
/// at once).
const FLEET_RECHECK: Duration = Duration::from_millis(250);
/// How much of the client's error text a revert's message quotes.
const REVERT_REASON_CHARS: usize = 300;
/// The longest wait a request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// A wait for a rollout (`?wait=30s`), and what to do on a refusal.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParams {
    /// After committing, wait up to this long (`30s`, `2m`; at most `1h`) for every stream the
    /// revision changed to accept it; the answer's `rollout` says how it went.
    pub wait: Option<String>,
    /// With `wait`: when a client refuses the revision, restore the state before it as a new
    /// revision — only if nothing was committed since (`expected_revision`) — and wait for that.
    pub revert_on_nack: Option<bool>,
}

impl WaitParams {
    /// The wait asked for, checked.
    pub fn wait(&self) -> Result<Option<Duration>, ApiError> {
        let Some(text) = &self.wait else {
            return Ok(None);
        };
        let bad = |reason: String| ApiError::bad_parameter("wait", "invalid_wait", reason);
        let wait = humantime::parse_duration(text)
            .map_err(|e| bad(format!("`{text}` is not a duration ({e}); e.g. `30s`")))?;
        if wait > MAX_WAIT {
            return Err(bad(format!("`{text}` is longer than the longest wait, 1h")));
        }
        Ok(Some(wait))
    }
}

/// What became of a committed revision's rollout, and of its undoing.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RolloutOutcome {
    /// The revision's status when the wait ended: `complete`, `failed` (a client refused it)
    /// or `progressing` (the wait timed out).
    pub status: RolloutStatus,
    /// With `revert_on_nack`, after a refusal: the revision that restored the state before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reverted: Option<Reverted>,
    /// Why nothing was reverted after a refusal (someone committed since).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revert_refused: Option<String>,
}

/// The revision that undid a refused one.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Reverted {
    /// The new revision.
    pub revision: u64,
    /// Whose state it restored (the revision before the refused one).
    pub restored_to: u64,
    /// Its own rollout, waited for in what remained of the wait.
    pub status: RolloutStatus,
}

/// Waits until revision `n` completes or fails across the fleet, or `until`.
pub async fn wait_for(
    state: &AdminState,
    n: u64,
    until: tokio::time::Instant,
) -> Result<RolloutStatus, ApiError> {
    loop {
        let changed = state.clients.as_ref().map(|r| r.rollouts.clone());
        let notified = changed.as_ref().map(|r| r.changed.notified());
        let notified = async move {
            match notified {
                Some(n) => n.await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(notified);
        let status = status(state, n).await?;
        if status.state != RolloutState::Progressing || tokio::time::Instant::now() >= until {
            return Ok(status);
        }
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(FLEET_RECHECK) => {}
            () = tokio::time::sleep_until(until) => {}
        }
    }
}

/// After committing `revision`: waits for its rollout, and (`revert`) undoes it on a refusal.
pub async fn follow(
    state: &AdminState,
    revision: u64,
    wait: Duration,
    revert: bool,
    author: Option<String>,
) -> Result<RolloutOutcome, ApiError> {
    let until = tokio::time::Instant::now() + wait;
    let status = wait_for(state, revision, until).await?;
    let mut outcome = RolloutOutcome {
        status,
        reverted: None,
        revert_refused: None,
    };
    if !revert || outcome.status.state != RolloutState::Failed {
        return Ok(outcome);
    }
    let previous = revision - 1;
    let first = outcome.status.nacks.first();
    let why = first.map_or_else(String::new, |n| {
        let error: String = n.error.chars().take(REVERT_REASON_CHARS).collect();
        format!(": {} refused {}: {error}", n.node, n.type_url)
    });
    let options = RestoreOptions {
        expected_revision: Some(revision),
        dry_run: false,
        message: Some(format!(
            "revert revision {revision}, refused by clients{why}"
        )),
    };
    let applied = match state.store.restore(previous, options, author).await {
        Ok(restored) => crate::changesets::record(state, Ok(restored.applied), None),
        Err(RestoreError::Apply(e)) => crate::changesets::record(state, Err(e), None),
        Err(e) => Err(e.into()),
    };
    let applied = match applied {
        Ok(applied) => applied,
        Err(ApiError::Conflict { detail, .. }) => {
            outcome.revert_refused = Some(format!(
                "not reverted: another revision was committed after {revision} ({detail})"
            ));
            return Ok(outcome);
        }
        Err(e) => return Err(e),
    };
    let status = wait_for(state, applied.revision, until).await?;
    outcome.reverted = Some(Reverted {
        revision: applied.revision,
        restored_to: previous,
        status,
    });
    Ok(outcome)
}
