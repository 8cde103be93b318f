//! Reading the head now and then, for what no notification announces: on SQLite, commits by
//! other processes (`vxds apply --database-url` beside a running server); on Postgres, the
//! revisions a half-open LISTEN connection never delivers (a failover without a reset). A head
//! found *below* what this process has seen means the database was restored or failed over to
//! a lagging replica: the head is moved back and the index is asked to check its revision
//! against the database (it reloads instead of skipping reused revision numbers). Every poll
//! asks for that check: a failover (or, on SQLite, a file restored under the running server)
//! that reused the very revision number indexed, with no commit since, shows no other sign.
//! A writer that finds the head below what it has seen asks for it too ([`observed`], under
//! the writers' lock).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::AnyPool;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::health::Health;
use super::{Backend, StoreMetrics, publish, read_head};

/// What LISTEN has delivered, and the way to tell it to reconnect.
#[derive(Debug)]
pub(super) struct Notified {
    /// The newest revision announced by a notification (or read at its (re)connect).
    pub revision: AtomicU64,
    /// Told when the poller finds LISTEN behind: the listener reconnects.
    pub stale: Notify,
}

impl Notified {
    pub fn new(head: u64) -> Self {
        Self {
            revision: AtomicU64::new(head),
            stale: Notify::new(),
        }
    }

    pub fn record(&self, revision: u64) {
        self.revision.fetch_max(revision, Ordering::Relaxed);
    }
}

/// A head read from the database: published. Below what this process has seen, the database
/// was restored or failed over to a lagging replica: the head moves back and the index is
/// asked to check its revision (so it is too whenever `check`). True if the head went back.
pub(super) fn observed(
    head: &watch::Sender<u64>,
    notified: &Notified,
    checks: &watch::Sender<u64>,
    database: u64,
    check: bool,
) -> bool {
    let seen = *head.borrow();
    let went_back = database < seen;
    if went_back {
        warn!(
            database,
            seen,
            "the database head is below the revision this server has seen (restored, or \
             failed over to a lagging replica); the index checks what it holds"
        );
        head.send_replace(database);
        notified.revision.store(database, Ordering::Relaxed);
    } else {
        publish(head, database);
    }
    if went_back || check {
        checks.send_modify(|checks| *checks = checks.wrapping_add(1));
    }
    went_back
}

pub(super) struct Poller {
    pub pool: AnyPool,
    pub backend: Backend,
    pub head: watch::Sender<u64>,
    pub checks: watch::Sender<u64>,
    pub notified: Arc<Notified>,
    pub health: Arc<Health>,
    pub metrics: StoreMetrics,
    pub period: Duration,
}

pub(super) fn spawn_head_poller(poller: Poller) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(poller.period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A revision LISTEN was behind on at the previous poll: still behind now means it
        // missed it (one period is ample for a notification in flight).
        let mut behind: Option<u64> = None;
        loop {
            ticks.tick().await;
            let database = match read_head(&poller.pool).await {
                Ok(revision) => revision,
                Err(e) => {
                    debug!(error = %e, "polling the head failed");
                    poller.health.observe(&e);
                    continue;
                }
            };
            // The check costs a few indexed reads (the revision's commit id): on SQLite every
            // 500 ms by default, on Postgres every 10 s.
            if observed(
                &poller.head,
                &poller.notified,
                &poller.checks,
                database,
                true,
            ) {
                behind = None;
                continue;
            }
            if poller.backend != Backend::Postgres {
                continue;
            }
            let announced = poller.notified.revision.load(Ordering::Relaxed);
            match behind {
                Some(revision) if announced < revision => {
                    warn!(
                        revision,
                        announced, "LISTEN missed a revision; reconnecting it"
                    );
                    poller.metrics.missed_notifications.inc();
                    poller.notified.stale.notify_one();
                    behind = None;
                }
                _ => behind = (database > announced).then_some(database),
            }
        }
    })
}
