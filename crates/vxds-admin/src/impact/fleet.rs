//! The fleet's clients: every replica publishes its client summary to the store on a period,
//! and a preview reads every unexpired one. This replica's own summary is computed afresh for
//! each preview rather than read back, so a client that just connected here counts at once.
//! On SQLite the one server publishes too: `vxds apply --dry-run --database-url sqlite:...`
//! (the admin API run in-process, with no xDS server of its own) then sees its clients.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use vxds_core::impact::ClientSummary;
use vxds_store::Store;

use super::ReplicaRepr;
use crate::AdminState;
use crate::problem::ApiError;
use crate::repr::timestamp;

/// How often a replica publishes its summary, by default.
pub const DEFAULT_SUMMARY_PERIOD: Duration = Duration::from_secs(5);
/// A summary counts for this many periods: a replica that misses two publishes in a row is
/// still counted, one that stopped drops out.
pub const STALE_PERIODS: u32 = 3;
/// How long a replica waits, after a revision settles on it, before publishing its summary:
/// the settling of several streams' revisions goes out in one publish.
pub const SETTLED_DEBOUNCE: Duration = Duration::from_millis(100);

pub(super) struct Fleet {
    pub replicas: Vec<ReplicaRepr>,
    pub summary: ClientSummary,
}

/// This replica's summary (if an xDS server runs in this process) and every other replica's
/// from the store.
pub(super) async fn gather(state: &AdminState) -> Result<Fleet, ApiError> {
    let published = state.store.client_summaries().await?;
    let local = match &state.clients {
        Some(registry) => {
            let registry = registry.clone();
            Some(
                tokio::task::spawn_blocking(move || registry.summary())
                    .await
                    .map_err(|e| {
                        tracing::error!(error = %e, "building the client summary panicked");
                        ApiError::Internal
                    })?,
            )
        }
        None => None,
    };
    let own_id = state.replica_id.as_deref();
    let mut replicas = Vec::new();
    let mut summaries = Vec::new();
    if let Some(local) = local {
        replicas.push(ReplicaRepr {
            replica_id: own_id.unwrap_or("local").to_owned(),
            streams: local.streams,
            published_at: timestamp(now_ms()),
            local: true,
        });
        summaries.push(local);
    }
    for row in published {
        if own_id == Some(row.replica_id.as_str()) && !summaries.is_empty() {
            continue;
        }
        replicas.push(ReplicaRepr {
            replica_id: row.replica_id,
            streams: row.summary.streams,
            published_at: timestamp(row.published_at_ms),
            local: false,
        });
        summaries.push(row.summary);
    }
    Ok(Fleet {
        summary: ClientSummary::merge(&summaries),
        replicas,
    })
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Publishes `registry`'s summary as `replica_id` every `period`, valid for
/// [`STALE_PERIODS`] periods, until the task is aborted; an unchanged summary is only renewed. A failed publish is logged and
/// retried at the next period; the caller withdraws the summary when it shuts down
/// ([`Store::withdraw_client_summary`]).
pub async fn publish_summaries(
    store: Store,
    registry: Arc<vxds_xds::Registry>,
    replica_id: String,
    period: Duration,
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    let valid_for = period * STALE_PERIODS;
    // What the store holds for this replica, as far as it knows: renewed while unchanged.
    let mut published: Option<ClientSummary> = None;
    loop {
        // On the period; and soon after a revision settles on this replica or a stream refuses
        // one (debounced), so that a rollout waited on from another replica is not a period
        // late.
        tokio::select! {
            _ = ticks.tick() => {}
            () = registry.rollouts.settled.notified() => {
                tokio::time::sleep(SETTLED_DEBOUNCE).await;
            }
        }
        let registry = registry.clone();
        let Ok(summary) = tokio::task::spawn_blocking(move || registry.summary()).await else {
            continue;
        };
        let result = if published.as_ref() == Some(&summary) {
            match store.renew_client_summary(&replica_id, valid_for).await {
                Ok(true) => Ok(()),
                Ok(false) => {
                    store
                        .publish_client_summary(&replica_id, &summary, valid_for)
                        .await
                }
                Err(e) => Err(e),
            }
        } else {
            store
                .publish_client_summary(&replica_id, &summary, valid_for)
                .await
        };
        published = result.is_ok().then_some(summary);
        match result {
            Ok(()) if failing => {
                failing = false;
                tracing::info!(replica = %replica_id, "publishing the client summary again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(replica = %replica_id, error = %e, "could not publish the client summary; other replicas' impact previews miss this one's clients until it can");
            }
            Err(_) => {}
        }
    }
}
