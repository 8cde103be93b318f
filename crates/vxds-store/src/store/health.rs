//! Whether the database answers, as this process last found it, so that requests fail at once
//! while it does not instead of each waiting out the acquire timeout.
//!
//! Evidence moves the state: the LISTEN connection failing to reconnect, or a probe that gets
//! no answer, makes the store *down*; a probe that gets one, or LISTEN reconnecting, makes it
//! *up*. Anything else that merely smells of an outage (a request or a head poll that could not
//! reach the database, the LISTEN connection dropping) asks for a probe now. While the store
//! is down a probe runs every [`PROBE_PERIOD`] on a fresh connection (never the pool, whose
//! acquire retries until its timeout), so recovery is noticed within that, without a restart.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use sqlx::{AnyConnection, Connection};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::read_head;
use super::write::now_ms;
use crate::error::StoreError;

/// How often a store that is down is probed.
pub const PROBE_PERIOD: Duration = Duration::from_millis(500);

/// The store as this process last found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreState {
    Up,
    Down {
        /// When it was found down, Unix milliseconds.
        since_ms: i64,
        reason: DownReason,
    },
}

impl StoreState {
    pub fn is_up(&self) -> bool {
        matches!(self, StoreState::Up)
    }
}

/// Why the store was found down; fixed texts, safe to show anyone (no database words).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DownReason {
    /// The change feed's connection was lost and cannot be made again.
    ChangeFeedLost,
    /// A probe got no answer within the acquire timeout.
    NoAnswer,
    /// The store was closed.
    Closed,
}

impl DownReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DownReason::ChangeFeedLost => "the change feed's connection was lost",
            DownReason::NoAnswer => "the database does not answer",
            DownReason::Closed => "the store was closed",
        }
    }
}

/// The state, its metrics, and the way to ask for a probe. Shared by the store's tasks.
#[derive(Debug)]
pub(super) struct Health {
    state: watch::Sender<StoreState>,
    probe: Notify,
    up: Gauge,
    outages: Counter,
}

impl Health {
    pub fn new(up: Gauge, outages: Counter) -> Self {
        up.set(1);
        Self {
            state: watch::channel(StoreState::Up).0,
            probe: Notify::new(),
            up,
            outages,
        }
    }

    pub fn state(&self) -> StoreState {
        *self.state.borrow()
    }

    pub fn watch(&self) -> watch::Receiver<StoreState> {
        self.state.subscribe()
    }

    /// Fails at once while the store is down.
    pub fn check(&self) -> Result<(), StoreError> {
        if self.state().is_up() {
            Ok(())
        } else {
            Err(StoreError::Down)
        }
    }

    pub fn down(&self, reason: DownReason) {
        // The gauge first: whoever sees the new state sees the gauge agree.
        let changed = self.state.send_if_modified(|state| {
            let was_up = state.is_up();
            if was_up {
                self.up.set(0);
                *state = StoreState::Down {
                    since_ms: now_ms(),
                    reason,
                };
            }
            was_up
        });
        if changed && reason != DownReason::Closed {
            warn!(
                reason = reason.as_str(),
                "the store is down; requests that need it are refused (503) until it answers"
            );
            self.outages.inc();
        }
    }

    pub fn up(&self) {
        let mut since = None;
        self.state.send_if_modified(|state| match *state {
            StoreState::Down { since_ms, .. } => {
                since = Some(since_ms);
                self.up.set(1);
                *state = StoreState::Up;
                true
            }
            StoreState::Up => false,
        });
        if let Some(since_ms) = since {
            info!(down_ms = now_ms() - since_ms, "the store answers again");
        }
    }

    /// Something failed as if the database were away: check now.
    pub fn suspect(&self) {
        self.probe.notify_one();
    }

    /// Reports an operation's error: one that could not reach the database asks for a
    /// probe (a refusal while down does not: the prober is on it already).
    pub fn observe(&self, error: &StoreError) {
        if matches!(error, StoreError::Unavailable(_)) && error.is_outage() {
            self.suspect();
        }
    }
}

/// Probes when asked, and every [`PROBE_PERIOD`] while the store is down. `url` is what the
/// pool connects to; `timeout` bounds a probe (the acquire timeout).
pub(super) fn spawn_prober(health: Arc<Health>, url: String, timeout: Duration) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if health.state().is_up() {
                health.probe.notified().await;
            } else {
                // Asked again meanwhile (another failure) or not: probe on the period.
                let _ = tokio::time::timeout(PROBE_PERIOD, health.probe.notified()).await;
            }
            match probe(&url, timeout).await {
                Ok(()) => health.up(),
                Err(e) => {
                    tracing::debug!(error = %e, "probing the store failed");
                    health.down(DownReason::NoAnswer);
                }
            }
        }
    })
}

/// Connects afresh and reads the head. Only an outage fails it: a database that answers with
/// an error is up (the request that asked will report that error itself).
async fn probe(url: &str, timeout: Duration) -> Result<(), StoreError> {
    let attempt = async {
        let mut conn = AnyConnection::connect(url).await?;
        let head = read_head(&mut conn).await;
        let _ = conn.close().await;
        head.map(drop)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Err(_) => Err(StoreError::Unavailable(sqlx::Error::PoolTimedOut)),
        Ok(Err(e)) if e.is_outage() => Err(e),
        Ok(_) => Ok(()),
    }
}
