//! The in-memory index the ADS server reads: the store's state at one revision, kept current
//! from the change feed by one writer task.
//!
//! A [`Snapshot`] is immutable and holds exactly one revision's state. The writer builds the
//! next one from the previous with persistent maps (`imbl`), so a revision costs work in the
//! size of its change, not of the store, and unchanged resources are shared, never copied.
//! Readers take an `Arc` to the current snapshot (a brief borrow of a watch channel) and never
//! touch the database or block the writer. Variant bodies are held encoded, once, for every
//! stream to share.
//!
//! Here: the options, the read handle ([`Index`]) and the one writer task ([`start`]); a
//! snapshot and its builder are in `snapshot`, a resource ready to send in `resource`.

use std::sync::Arc;

use backon::RetryableWithContext;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{debug, error, warn};

use crate::error::StoreError;
use crate::model::Followed;
use crate::store::{Store, retry_policy};

mod resource;
mod snapshot;

pub use resource::{IndexedResource, IndexedVariant};
pub use snapshot::{
    ChangedKey, Derivation, DerivedKey, RevisionChanges, Snapshot, SnapshotBuilder,
};

/// The default bound of the change lists a snapshot remembers for consumers that fell behind
/// (`--index-history-bytes`): 16 MiB, about 65,000 changed names. Beyond it, the xDS server
/// treats every resource as changed and the event stream reads the store's history.
pub const DEFAULT_INDEX_HISTORY_BYTES: usize = 16 << 20;

/// How the index is kept.
#[derive(Clone, Copy, Debug)]
pub struct IndexOptions {
    /// The change lists kept, by their estimated size in memory; the newest revision's is
    /// always kept.
    pub history_bytes: usize,
}

impl Default for IndexOptions {
    fn default() -> Self {
        Self {
            history_bytes: DEFAULT_INDEX_HISTORY_BYTES,
        }
    }
}

/// A read handle on the index. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Index {
    snapshots: watch::Receiver<Arc<Snapshot>>,
    /// For a fixed index, the sender, kept so that waiting readers wait rather than see a
    /// closed channel.
    _fixed: Option<Arc<watch::Sender<Arc<Snapshot>>>>,
}

impl Index {
    /// The current snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshots.borrow().clone()
    }

    /// A receiver that is told of every new snapshot.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshots.clone()
    }

    /// The first snapshot at `revision` or later.
    pub async fn wait_for(&self, revision: u64) -> Arc<Snapshot> {
        let mut rx = self.snapshots.clone();
        match rx.wait_for(|s| s.revision >= revision).await {
            Ok(snapshot) => snapshot.clone(),
            // The writer is gone; the last snapshot is all there will be.
            Err(_) => self.snapshot(),
        }
    }

    /// An index over fixed state, not following any store (tests and offline tools).
    pub fn fixed(snapshot: Snapshot) -> Self {
        let (tx, rx) = watch::channel(Arc::new(snapshot));
        Self {
            snapshots: rx,
            _fixed: Some(Arc::new(tx)),
        }
    }
}

/// Loads the index from `store`, then keeps it current in a task of its own.
pub async fn start(store: Store) -> Result<(Index, JoinHandle<()>), StoreError> {
    start_with(store, IndexOptions::default()).await
}

/// [`start`] with options. The index starts from the head's state (its cost is the state's
/// size, not the history's length), remembering no change list older than the head's.
pub async fn start_with(
    store: Store,
    options: IndexOptions,
) -> Result<(Index, JoinHandle<()>), StoreError> {
    let mut builder = Snapshot::empty(options).builder();
    let batch = store.current_state_into(&mut builder).await?;
    let initial = builder.finish(batch);
    debug!(
        revision = initial.revision,
        resources = initial.len(),
        "index loaded"
    );
    let (tx, rx) = watch::channel(Arc::new(initial));
    let writer = tokio::spawn(follow(store, tx));
    Ok((
        Index {
            snapshots: rx,
            _fixed: None,
        },
        writer,
    ))
}

/// The one writer: waits for the head to pass the index (or for the store to ask for a check),
/// reads what changed after the revision it holds, checking that the database still holds
/// that revision as the same commit, and publishes. A database that no longer holds it (its
/// head went back, or the number is another commit: a failover to a lagging standby, a
/// restore) is loaded again whole, as a new epoch.
async fn follow(store: Store, tx: watch::Sender<Arc<Snapshot>>) {
    let mut head = store.watch_head();
    let mut checks = store.watch_checks();
    loop {
        let current = tx.borrow().clone();
        tokio::select! {
            moved = head.wait_for(|h| *h > current.revision) => {
                if moved.is_err() {
                    warn!("the store's head watch closed; the index stops following");
                    return;
                }
            }
            checked = checks.changed() => {
                if checked.is_err() {
                    return;
                }
            }
        }
        // The changed resources are indexed as they are read (each attempt starts over).
        let (builder, followed) = {
            |mut builder: SnapshotBuilder| {
                let store = &store;
                let current = &current;
                async move {
                    let followed = store
                        .changes_after_into(current.revision, current.commit_id, &mut builder)
                        .await;
                    (builder, followed)
                }
            }
        }
        .retry(retry_policy())
        .context(current.builder())
        .notify(
            |e, after| error!(error = %e, ?after, "reading changes for the index failed; retrying"),
        )
        .await;
        match followed {
            Ok(Followed::Changes(batch)) if batch.revision <= current.revision => {
                // Nothing new. If the head this process knows of is ahead of the database (it
                // heard of revisions a failover lost), it is set back, or this loop would spin.
                if *head.borrow() > batch.revision {
                    store.correct_head(batch.revision).await;
                }
            }
            Ok(Followed::Changes(batch)) => {
                let next = builder.finish(batch);
                debug!(revision = next.revision, "index advanced");
                tx.send_replace(Arc::new(next));
            }
            Ok(Followed::Diverged { head: database }) => {
                warn!(
                    indexed = current.revision,
                    database,
                    "the database no longer holds the indexed revision (restored, or failed \
                     over to a lagging replica); reloading the index"
                );
                let (builder, batch) = {
                    |mut builder: SnapshotBuilder| {
                        let store = &store;
                        async move {
                            let batch = store.current_state_into(&mut builder).await;
                            (builder, batch)
                        }
                    }
                }
                .retry(retry_policy())
                .context(current.builder())
                .notify(
                    |e, after| error!(error = %e, ?after, "reloading the index failed; retrying"),
                )
                .await;
                match batch {
                    Ok(batch) => {
                        let mut reloaded = builder.finish(batch);
                        reloaded.epoch = current.epoch + 1;
                        warn!(
                            revision = reloaded.revision,
                            epoch = reloaded.epoch,
                            "index reloaded from the database"
                        );
                        store.metrics().head_resets.inc();
                        let revision = reloaded.revision;
                        tx.send_replace(Arc::new(reloaded));
                        store.correct_head(revision).await;
                    }
                    Err(e) => error!(error = %e, "giving up on reloading the index"),
                }
            }
            Err(e) => error!(error = %e, "giving up on a batch of changes"),
        }
        if tx.is_closed() {
            return;
        }
    }
}
