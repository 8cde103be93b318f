//! Learning of revisions committed by other replicas: Postgres `LISTEN/NOTIFY`.
//!
//! Every commit notifies `vxds_revisions` with its revision number inside the transaction, so
//! the notification is delivered exactly when the commit is visible. A lost connection loses
//! notifications, so after every (re)connect the listener reads the head revision once to
//! catch up. A connection that goes half-open delivers nothing and reports no error: the head
//! poller ([`super::follow`]) notices the gap and tells the listener to reconnect.
//!
//! The listener is also the first to know that the database went away: a dropped connection
//! asks for a probe, and a reconnection that fails for want of the database marks the store
//! down; one that succeeds marks it up ([`super::health`]).

use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use sqlx::AnyPool;
use sqlx::postgres::{PgListener, PgPoolOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::follow::Notified;
use super::health::{DownReason, Health};
use super::{StoreMetrics, publish, read_head, retry_policy};

pub(crate) const CHANNEL: &str = "vxds_revisions";

pub(super) struct Listener {
    pub url: String,
    /// Bounds each (re)connection, as it bounds the pool's acquire.
    pub acquire_timeout: Duration,
    pub pool: AnyPool,
    pub head: watch::Sender<u64>,
    pub checks: watch::Sender<u64>,
    pub notified: Arc<Notified>,
    pub health: Arc<Health>,
    pub metrics: StoreMetrics,
}

pub(super) fn spawn_listener(listener: Listener) -> JoinHandle<()> {
    let Listener {
        url,
        acquire_timeout,
        pool,
        head,
        checks,
        notified,
        health,
        metrics,
    } = listener;
    tokio::spawn(async move {
        let mut connected_before = false;
        loop {
            if std::mem::replace(&mut connected_before, true) {
                metrics.listen_reconnects.inc();
            }
            let mut listener = (|| async {
                // PgListener::connect's own pool waits 30 s for a connection, and reconnects
                // inside `try_recv` as long: bound it, and reconnect here instead, so that a
                // lost connection is reported at once.
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .max_lifetime(None)
                    .idle_timeout(None)
                    .acquire_timeout(acquire_timeout)
                    .connect(&url)
                    .await?;
                let mut listener = PgListener::connect_with(&pool).await?;
                listener.eager_reconnect(false);
                listener.listen(CHANNEL).await?;
                Ok::<_, sqlx::Error>(listener)
            })
            // Every second at most: once the database is back, this replica should hear of
            // other replicas' commits soon.
            .retry(retry_policy().with_max_delay(Duration::from_secs(1)))
            .notify(|e, after| {
                if crate::error::is_outage(e) {
                    health.down(DownReason::ChangeFeedLost);
                }
                warn!(error = %e, ?after, "LISTEN connection failed; retrying");
            })
            .await
            .expect("the retry policy never gives up");
            // Whatever was committed while we were not listening. A reconnection may reach
            // another server (a failover): the index checks it still holds the database's
            // revision.
            match (|| read_head(&pool)).retry(retry_policy()).await {
                Ok(revision) => {
                    health.up();
                    if !super::follow::observed(&head, &notified, &checks, revision, true) {
                        notified.record(revision);
                    }
                }
                Err(e) => warn!(error = %e, "reading the head revision failed"),
            }
            loop {
                let received = tokio::select! {
                    received = listener.try_recv() => received,
                    // The poller found us behind: the connection is half-open.
                    () = notified.stale.notified() => break,
                };
                match received {
                    Ok(Some(notification)) => match notification.payload().parse::<u64>() {
                        Ok(revision) => {
                            debug!(revision, "notified of a revision");
                            notified.record(revision);
                            publish(&head, revision);
                        }
                        Err(_) => warn!(
                            payload = notification.payload(),
                            "ignoring a malformed notification"
                        ),
                    },
                    // The connection dropped: reconnect and catch up. Is the database gone?
                    Ok(None) => {
                        health.suspect();
                        break;
                    }
                    Err(e) => {
                        warn!(error = %e, "LISTEN connection failed");
                        health.suspect();
                        break;
                    }
                }
            }
        }
    })
}
