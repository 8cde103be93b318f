//! Reading the head now and then, for what no notification announces: on SQLite, commits by
//! other processes (`vxds apply --database-url` beside a running server); on Postgres, the
//! revisions a half-open LISTEN connection never delivers (a failover without a reset). A head
//! found *below* what this process has seen means the database was restored or failed over to
//! a lagging replica: the head is moved back and the reset counter ticks, so that the index
//! reloads instead of skipping reused revision numbers.

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

pub(super) struct Poller {
    pub pool: AnyPool,
    pub backend: Backend,
    pub head: watch::Sender<u64>,
    pub resets: watch::Sender<u64>,
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
            // What this process had seen before the read: a committed revision cannot vanish,
            // so a database head below it was restored or failed over.
            let seen = *poller.head.borrow();
            let database = match read_head(&poller.pool).await {
                Ok(revision) => revision,
                Err(e) => {
                    debug!(error = %e, "polling the head failed");
                    poller.health.observe(&e);
                    continue;
                }
            };
            if database < seen {
                warn!(
                    database,
                    seen,
                    "the database head is below the revision this server has seen (restored, \
                     or failed over to a lagging replica); reloading the index"
                );
                poller.metrics.head_resets.inc();
                poller.head.send_replace(database);
                poller.notified.revision.store(database, Ordering::Relaxed);
                poller.resets.send_modify(|resets| *resets += 1);
                behind = None;
                continue;
            }
            publish(&poller.head, database);
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
