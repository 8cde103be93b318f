//! One revision's state: an immutable [`Snapshot`] (the resources by type and name, the change
//! lists it remembers, what was derived from it), and the [`SnapshotBuilder`] that makes the
//! next one from it as the store reads what changed.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use imbl::{OrdMap, Vector};
use vxds_envoy::changeset::ResourceKey;

use super::{DEFAULT_INDEX_HISTORY_BYTES, IndexOptions, IndexedResource};
use crate::model::{ChangeBatch, StoredResource};
use crate::store::ResourceSink;

/// A changed resource's key, shared by the index's change lists and the streams told of it.
pub type ChangedKey = Arc<ResourceKey>;

/// The resources a revision changed.
#[derive(Clone, Debug)]
pub struct RevisionChanges {
    pub revision: u64,
    /// Its commit id: event-stream ids carry it, so that a reader resuming after a failover
    /// that reused the number is told to reset.
    pub commit_id: i64,
    /// When it was committed (Unix milliseconds), for push-latency metrics.
    pub committed_at_ms: i64,
    /// Shared with whoever is told of them (every stream's inbox), never copied.
    pub changed: Arc<[ChangedKey]>,
    /// Who committed it and why (`GET /v1/events` shows them without asking the store).
    pub author: Option<Arc<str>>,
    pub message: Option<Arc<str>>,
}

impl RevisionChanges {
    /// Roughly what it holds in memory: the names, their keys' strings and the text.
    fn footprint(&self) -> usize {
        const PER_KEY: usize =
            std::mem::size_of::<ChangedKey>() + 16 + std::mem::size_of::<ResourceKey>() + 2 * 16;
        let text = self.author.as_ref().map_or(0, |a| a.len())
            + self.message.as_ref().map_or(0, |m| m.len());
        std::mem::size_of::<Self>()
            + text
            + self
                .changed
                .iter()
                .map(|k| PER_KEY + k.type_url.len() + k.name.len())
                .sum::<usize>()
    }
}

/// The store's state at one revision.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub revision: u64,
    /// The revision's commit id (see [`ChangeBatch::commit_id`]).
    pub commit_id: i64,
    /// Counts the times the index was reloaded because the database no longer held what it
    /// had indexed (a failover to a lagging standby, a restore). Snapshots of different
    /// epochs do not follow one another: the same revision number may be other content, and
    /// whoever follows the index treats everything as changed.
    pub epoch: u64,
    /// By type URL, then by name: keys share the resources' own strings.
    resources: OrdMap<Arc<str>, ByName>,
    history: Vector<RevisionChanges>,
    /// The change lists' estimated size, and its bound.
    history_bytes: usize,
    history_limit: HistoryLimit,
    derived: Derived,
}

/// One type's resources by name.
type ByName = OrdMap<Arc<str>, Arc<IndexedResource>>;

/// [`IndexOptions::history_bytes`], carried from one snapshot to the next.
#[derive(Clone, Copy, Debug)]
struct HistoryLimit(usize);

impl Default for HistoryLimit {
    fn default() -> Self {
        HistoryLimit(DEFAULT_INDEX_HISTORY_BYTES)
    }
}

/// What a resource made from a snapshot is keyed by: the name asked for (with its `#entry=`),
/// the subscriber's parameters, and whether it takes inline entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DerivedKey {
    pub name: String,
    pub entry: Option<String>,
    pub params: vxds_core::ParamSet,
    pub inline: bool,
}

/// A resource made from a snapshot for a subscriber, and its variant; `None`: none exists.
pub type Derivation = Option<(Arc<IndexedResource>, usize)>;

/// Resources made from one snapshot (list collections, per subscriber parameters), kept with
/// it so that streams with equal parameters build each once; a new snapshot starts empty.
#[derive(Clone, Debug, Default)]
struct Derived(Arc<std::sync::Mutex<HashMap<DerivedKey, Derivation>>>);

/// Distinct derivations kept per snapshot: beyond, they are made but not kept, so that clients
/// inventing parameter sets cannot grow the cache.
const DERIVED_LIMIT: usize = 4096;

impl Snapshot {
    /// An empty snapshot whose change lists are bounded by `options`.
    pub fn empty(options: IndexOptions) -> Self {
        Snapshot {
            history_limit: HistoryLimit(options.history_bytes),
            ..Snapshot::default()
        }
    }

    /// What the change lists this snapshot remembers take in memory (estimated).
    pub fn history_bytes(&self) -> usize {
        self.history_bytes
    }

    /// The oldest revision whose change list this snapshot remembers (its own revision + 1
    /// when none).
    pub fn oldest_remembered(&self) -> u64 {
        self.history
            .front()
            .map_or(self.revision + 1, |h| h.revision)
    }

    /// A resource made from this snapshot by `make`, made once per `key` while the snapshot is
    /// current (the lock is not held while making).
    pub fn derive(&self, key: DerivedKey, make: impl FnOnce() -> Derivation) -> Derivation {
        if let Ok(cache) = self.derived.0.lock()
            && let Some(found) = cache.get(&key)
        {
            return found.clone();
        }
        let made = make();
        if let Ok(mut cache) = self.derived.0.lock()
            && cache.len() < DERIVED_LIMIT
        {
            cache.insert(key, made.clone());
        }
        made
    }

    pub fn get(&self, type_url: &str, name: &str) -> Option<&Arc<IndexedResource>> {
        self.resources.get(type_url)?.get(name)
    }

    /// Every resource of a type, in name order.
    pub fn of_type<'a>(
        &'a self,
        type_url: &'a str,
    ) -> impl Iterator<Item = &'a Arc<IndexedResource>> + 'a {
        self.with_prefix(type_url, "")
    }

    /// Resources of a type whose names start with `prefix`, in name order.
    pub fn with_prefix<'a>(
        &'a self,
        type_url: &'a str,
        prefix: &'a str,
    ) -> impl Iterator<Item = &'a Arc<IndexedResource>> + 'a {
        let by_name = self.resources.get(type_url);
        by_name
            .into_iter()
            .flat_map(move |m| {
                m.range::<_, str>((
                    std::ops::Bound::Included(prefix),
                    std::ops::Bound::Unbounded,
                ))
            })
            .take_while(move |(name, _)| name.starts_with(prefix))
            .map(|(_, r)| r)
    }

    pub fn len(&self) -> usize {
        self.resources.values().map(|m| m.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    /// The resources changed after `revision` up to this snapshot; `None` if that is further
    /// back than the history kept (treat everything as changed).
    pub fn changed_since(&self, revision: u64) -> Option<BTreeSet<ChangedKey>> {
        if revision >= self.revision {
            return Some(BTreeSet::new());
        }
        if revision + 1 < self.oldest_remembered() {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|h| h.revision > revision)
                .flat_map(|h| h.changed.iter().cloned())
                .collect(),
        )
    }

    /// Each revision after `revision` that this snapshot still remembers, oldest first.
    pub fn revisions_since(&self, revision: u64) -> impl Iterator<Item = &RevisionChanges> {
        self.history.iter().filter(move |h| h.revision > revision)
    }

    /// When the newest revision in this snapshot was committed, if it is remembered.
    pub fn committed_at_ms(&self) -> Option<i64> {
        self.history
            .back()
            .filter(|h| h.revision == self.revision)
            .map(|h| h.committed_at_ms)
    }

    /// The next snapshot: this one with `batch` applied. The index writer builds every
    /// snapshot this way (through a [`SnapshotBuilder`], which takes the resources as the
    /// store reads them); tests and offline tools may too.
    pub fn apply(&self, mut batch: ChangeBatch) -> Snapshot {
        let mut builder = self.builder();
        builder.begin(batch.complete);
        // Deletions first, then the resources: a key in both ends present, as the store never
        // sends (its deletions are what it no longer has).
        for key in std::mem::take(&mut batch.deleted) {
            builder.delete(&key);
        }
        builder.finish(batch)
    }

    /// A builder of the next snapshot from this one (see [`SnapshotBuilder`]).
    pub fn builder(&self) -> SnapshotBuilder {
        let mut next = self.clone();
        // What was derived from this snapshot does not hold for the next.
        next.derived = Derived::default();
        SnapshotBuilder {
            base: self.clone(),
            next,
        }
    }

    /// The database's whole state (`batch` is complete) in place of this snapshot's, which
    /// the database no longer holds: a new epoch.
    pub fn reload(&self, batch: ChangeBatch) -> Snapshot {
        let mut next = self.apply(ChangeBatch {
            complete: true,
            ..batch
        });
        next.epoch = self.epoch + 1;
        next
    }
}

/// The next snapshot, built from the previous one as the store reads the resources that
/// changed ([`ResourceSink`]): each is indexed as it arrives, so that a large write is never
/// held twice (as read, and as indexed).
#[derive(Debug)]
pub struct SnapshotBuilder {
    base: Snapshot,
    next: Snapshot,
}

impl ResourceSink for SnapshotBuilder {
    fn begin(&mut self, complete: bool) {
        self.next = self.base.clone();
        self.next.derived = Derived::default();
        if complete {
            // The whole state: nothing held before counts, and the change lists no longer
            // join up with it.
            self.next.resources = OrdMap::new();
            self.next.history = Vector::new();
            self.next.history_bytes = 0;
        }
    }

    fn put(&mut self, stored: StoredResource) {
        let resources = &mut self.next.resources;
        let type_url = match resources.get_key_value(stored.key.type_url.as_str()) {
            Some((type_url, _)) => type_url.clone(),
            None => {
                let type_url: Arc<str> = Arc::from(stored.key.type_url.as_str());
                resources.insert(type_url.clone(), OrdMap::new());
                type_url
            }
        };
        let resource = Arc::new(IndexedResource::from_stored(stored, type_url.clone()));
        if let Some(by_name) = resources.get_mut(&*type_url) {
            by_name.insert(resource.name.clone(), resource);
        }
    }
}

impl SnapshotBuilder {
    fn delete(&mut self, key: &ResourceKey) {
        let resources = &mut self.next.resources;
        if let Some(by_name) = resources.get_mut(key.type_url.as_str()) {
            by_name.remove(key.name.as_str());
            if by_name.is_empty() {
                resources.remove(key.type_url.as_str());
            }
        }
    }

    /// The snapshot: what was put, with `batch`'s resources (if any) put and its deletions
    /// made, and its change lists and revision. [`ResourceSink::begin`] must have been called.
    pub fn finish(mut self, batch: ChangeBatch) -> Snapshot {
        for stored in batch.resources {
            self.put(stored);
        }
        for key in &batch.deleted {
            self.delete(key);
        }
        let mut next = self.next;
        for change in batch.revisions {
            let change = RevisionChanges {
                revision: change.revision,
                commit_id: change.commit_id,
                committed_at_ms: change.committed_at_ms,
                changed: change.changed.into_iter().map(Arc::new).collect(),
                author: change.author.map(Into::into),
                message: change.message.map(Into::into),
            };
            next.history_bytes += change.footprint();
            next.history.push_back(change);
        }
        // Bounded by size, not count: one revision of 10,000 names weighs what 10,000 of one do.
        while next.history_bytes > next.history_limit.0 && next.history.len() > 1 {
            if let Some(dropped) = next.history.pop_front() {
                next.history_bytes -= dropped.footprint();
            }
        }
        next.revision = batch.revision;
        next.commit_id = batch.commit_id;
        next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(revision: u64, names: usize) -> ChangeBatch {
        ChangeBatch {
            revision,
            commit_id: 0,
            revisions: vec![crate::model::RevisionChangeList {
                revision,
                committed_at_ms: 1,
                changed: (0..names)
                    .map(|i| ResourceKey {
                        type_url: "t".into(),
                        name: format!("endpoint-{i}"),
                    })
                    .collect(),
                ..Default::default()
            }],
            resources: vec![],
            deleted: vec![],
            complete: false,
        }
    }

    #[test]
    fn the_history_is_bounded_by_bytes_not_revisions() {
        let limit = 1 << 20;
        let mut snapshot = Snapshot::empty(IndexOptions {
            history_bytes: limit,
        });
        // Revisions of 1,000 names each: far fewer than 4,096 fit in a MiB.
        for revision in 1..=200 {
            snapshot = snapshot.apply(batch(revision, 1000));
            assert!(snapshot.history_bytes() <= limit);
        }
        let kept = snapshot.revisions_since(0).count();
        assert!(kept > 1 && kept < 20, "{kept} revisions kept");
        assert_eq!(snapshot.changed_since(200 - kept as u64 - 1), None);
        assert_eq!(
            snapshot.changed_since(199).map(|c| c.len()),
            Some(1000),
            "the newest revision's change list"
        );
        // Revisions of one name each: thousands fit.
        for revision in 201..=5200 {
            snapshot = snapshot.apply(batch(revision, 1));
        }
        assert!(snapshot.revisions_since(0).count() >= 5000);
        assert!(snapshot.changed_since(200).is_some());
        // One revision larger than the bound is still kept: it is the newest.
        snapshot = snapshot.apply(batch(5201, 20_000));
        assert_eq!(snapshot.revisions_since(0).count(), 1);
        assert!(snapshot.changed_since(5200).is_some());
    }

    fn stored(type_url: &str, name: &str) -> StoredResource {
        let constraints = vxds_core::Constraints::unconstrained().canonical();
        StoredResource {
            key: ResourceKey {
                type_url: type_url.into(),
                name: name.into(),
            },
            version: "v".into(),
            revision: 1,
            created_revision: 1,
            created_at_ms: 1,
            updated_at_ms: 1,
            shared: false,
            variants: vec![crate::model::StoredVariant {
                id: constraints.id(),
                constraints,
                body: vec![],
                version: "v".into(),
                created_at_ms: 1,
                updated_at_ms: 1,
                ttl: None,
            }],
        }
    }

    #[test]
    fn resources_are_found_by_type_and_name_and_prefixes_stay_within_their_type() {
        let mut next = batch(1, 0);
        next.resources = vec![
            stored("a", "x/1"),
            stored("a", "x/2"),
            stored("a", "y"),
            stored("b", "x/3"),
        ];
        let snapshot = Snapshot::default().apply(next);
        assert_eq!(snapshot.len(), 4);
        assert_eq!(snapshot.get("a", "x/2").map(|r| &*r.name), Some("x/2"));
        assert!(snapshot.get("b", "x/2").is_none());
        let names: Vec<&str> = snapshot.with_prefix("a", "x/").map(|r| &*r.name).collect();
        assert_eq!(names, ["x/1", "x/2"]);
        assert_eq!(snapshot.of_type("b").count(), 1);
        // Resources of one type share its type URL.
        let (one, two) = (snapshot.get("a", "x/1"), snapshot.get("a", "y"));
        assert!(Arc::ptr_eq(&one.unwrap().type_url, &two.unwrap().type_url));

        let mut gone = batch(2, 0);
        gone.deleted = vec![ResourceKey {
            type_url: "b".into(),
            name: "x/3".into(),
        }];
        let snapshot = snapshot.apply(gone);
        assert_eq!(snapshot.len(), 3);
        assert_eq!(snapshot.of_type("b").count(), 0);
        assert!(snapshot.get("b", "x/3").is_none());
    }

    #[test]
    fn derivations_are_made_once_per_snapshot() {
        let snapshot = Snapshot::default();
        let key = DerivedKey {
            name: "xdstp://a/envoy.config.listener.v3.ListenerCollection/c".into(),
            entry: None,
            params: vxds_core::ParamSet::default(),
            inline: false,
        };
        let mut made = 0;
        for _ in 0..3 {
            let _ = snapshot.clone().derive(key.clone(), || {
                made += 1;
                None
            });
        }
        assert_eq!(made, 1);
        let next = snapshot.apply(ChangeBatch {
            revision: 1,
            commit_id: 0,
            revisions: vec![],
            resources: vec![],
            deleted: vec![],
            complete: false,
        });
        let _ = next.derive(key, || {
            made += 1;
            None
        });
        assert_eq!(made, 2);
    }
}
