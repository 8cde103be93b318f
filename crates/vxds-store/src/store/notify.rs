//! Learning of revisions committed by other replicas: Postgres `LISTEN/NOTIFY`.
//!
//! Every commit notifies `vxds_revisions` with its revision number inside the transaction, so
//! the notification is delivered exactly when the commit is visible. A lost connection loses
//! notifications, so after every (re)connect the listener reads the head revision once to
//! catch up. A connection that goes half-open delivers nothing and reports no error: the head
//! poller ([`super::follow`]) notices the gap and tells the listener to reconnect.

use std::sync::Arc;

use backon::Retryable;
use sqlx::AnyPool;
use sqlx::postgres::PgListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

use super::follow::Notified;
use super::{StoreMetrics, publish, read_head, retry_policy};

pub(crate) const CHANNEL: &str = "vxds_revisions";

pub(super) fn spawn_listener(
    url: String,
    pool: AnyPool,
    head: watch::Sender<u64>,
    notified: Arc<Notified>,
    metrics: StoreMetrics,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connected_before = false;
        loop {
            if std::mem::replace(&mut connected_before, true) {
                metrics.listen_reconnects.inc();
            }
            let mut listener = (|| async {
                let mut listener = PgListener::connect(&url).await?;
                listener.listen(CHANNEL).await?;
                Ok::<_, sqlx::Error>(listener)
            })
            .retry(retry_policy())
            .notify(|e, after| warn!(error = %e, ?after, "LISTEN connection failed; retrying"))
            .await
            .expect("the retry policy never gives up");
            // Whatever was committed while we were not listening.
            match (|| read_head(&pool)).retry(retry_policy()).await {
                Ok(revision) => {
                    notified.record(revision);
                    publish(&head, revision);
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
                    // The connection dropped: reconnect and catch up.
                    Ok(None) => break,
                    Err(e) => {
                        warn!(error = %e, "LISTEN connection failed");
                        break;
                    }
                }
            }
        }
    })
}
