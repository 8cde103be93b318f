//! Who is connected and what each stream subscribes to, so that a revision visits only the
//! streams it concerns.
//!
//! The dispatcher follows the index; for each new snapshot it looks up the changed resources
//! (by name, by type for wildcard subscribers, by collection for glob subscribers) and marks
//! them in the inboxes of the streams that care, each stream once per revision. An inbox
//! coalesces: however many revisions pass while a stream is busy, it holds each changed
//! resource once, and the stream catches up with one computation. Work per revision is
//! proportional to the subscriptions it touches, and a slow stream costs memory only for what
//! changed.
//!
//! One revision at a time (A74): a snapshot is *published* to the streams only after every
//! stream it concerns has been marked, and streams compute only from published snapshots
//! ([`Registry::catch_up`]), so no stream sees a revision's data without its changes. The
//! registry's lock is held per chunk of changed resources, never while marking, so streams
//! connect and leave during a big push; a stream whose interest changes mid-dispatch is marked
//! with the whole revision being dispatched.

pub mod heartbeats;
pub mod wake;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;
use tokio::sync::watch;
use vxds_core::xdstp::XdstpUrn;
use vxds_store::{Index, Snapshot};

use crate::machine::{StreamInterest, StreamMachine};
use crate::rollout::{Mark, TypeMask};
use crate::status::ClientStatus;

/// Changed resources looked up per lock of the registry.
const DISPATCH_CHUNK: usize = 256;

/// Hashes stream ids, sequential numbers, with one multiplication: the dispatcher looks every
/// stream a revision concerns up by id, and SipHash cost more than the rest of the lookup.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, id: u64) {
        // An odd multiplier: distinct low bits stay distinct, and the high bits mix.
        self.0 = (self.0.rotate_left(5) ^ id).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type Ids = BuildHasherDefault<IdHasher>;
type IdSet = HashSet<u64, Ids>;

/// A changed resource, shared by the index's change list and every inbox it is marked in (a
/// revision marks thousands).
pub use vxds_store::ChangedKey;

/// The changes waiting for one stream.
#[derive(Debug)]
pub struct Inbox {
    pending: Mutex<Pending>,
    /// The stream's task: raised [`wake::MARKED`] by every mark.
    wake: Arc<wake::Wake>,
}

/// Changed keys, in order and once each: held inline for the one or two a revision changes
/// for most streams (a B-tree allocated a node on every mark and freed it on every take).
pub type MarkedKeys = SmallVec<[ChangedKey; 2]>;

/// The revisions marked, with the types each changed for the stream: inline for two.
pub type MarkedRevisions = SmallVec<[(u64, TypeMask); 2]>;

#[derive(Debug, Default)]
struct Pending {
    keys: MarkedKeys,
    everything: bool,
    /// The latest revision marked, in the index's latest epoch: the stream must compute from
    /// a snapshot at least as new — by `(epoch, revision)`, since a reload after the head went
    /// back (failover) starts a new epoch at a lower revision.
    revision: u64,
    epoch: u64,
    /// Every revision marked, with the types it changed for the stream, for rollout
    /// tracking (`crate::rollout`); at most [`crate::rollout::MAX_CONCERNS`], the oldest given
    /// up beyond.
    revisions: MarkedRevisions,
    /// The index epoch of `revisions`: a mark of a later epoch (a reload) drops them, since
    /// their numbers now name other revisions, whose records are not theirs.
    revisions_epoch: u64,
}

/// What a stream was told since it last looked.
#[derive(Debug, Default)]
pub struct Marked {
    /// The changed resources, or `None` for everything.
    pub keys: Option<MarkedKeys>,
    pub revision: u64,
    pub epoch: u64,
    /// Each revision marked, oldest first, with the types it changed for the stream.
    pub revisions: MarkedRevisions,
    /// Their index epoch.
    pub revisions_epoch: u64,
}

/// A mark's effect on rollout tracking: whether `revision` is new to the inbox, and the
/// revision given up to make room.
#[derive(Debug, Default)]
struct MarkResult {
    added: bool,
    evicted: Option<u64>,
}

impl Pending {
    fn note(&mut self, revision: u64, epoch: u64, types: TypeMask) -> MarkResult {
        if epoch != self.revisions_epoch {
            // Revisions of the epoch before a reload: their records went with it (and a
            // number among them may be marked again in this epoch, as another revision).
            self.revisions.clear();
            self.revisions_epoch = epoch;
        }
        if let Some((_, known)) = self.revisions.iter_mut().find(|(r, _)| *r == revision) {
            // Marked again (its whole change, the stream's interest having changed).
            *known = known.union(types);
            return MarkResult::default();
        }
        let evicted = (self.revisions.len() >= crate::rollout::MAX_CONCERNS)
            .then(|| self.revisions.remove(0).0);
        self.revisions.push((revision, types));
        MarkResult {
            added: true,
            evicted,
        }
    }
}

impl Inbox {
    fn mark<'a>(
        &self,
        keys: impl IntoIterator<Item = &'a ChangedKey>,
        revision: u64,
        epoch: u64,
    ) -> MarkResult {
        let mut result = MarkResult::default();
        if let Ok(mut pending) = self.pending.lock() {
            // The types the revision changed for the stream: keys come sorted by type, so a
            // type is looked up once per run of its keys.
            let mut types = TypeMask::NONE;
            let mut last_type: Option<&str> = None;
            let everything = pending.everything;
            let held = pending.keys.len();
            for key in keys {
                if last_type != Some(key.type_url.as_str()) {
                    types = types.with(&key.type_url);
                    last_type = Some(&key.type_url);
                }
                if !everything {
                    pending.keys.push(key.clone());
                }
            }
            // A dispatch marks a stream with keys in order, once each, usually after what
            // it holds (a later revision's): checked over the new keys only. Otherwise the
            // two sorted runs are merged (a stable sort finds them: linear in what is held,
            // not a full sort on every mark of a busy stream holding many keys).
            let appended = &pending.keys[held.saturating_sub(1)..];
            if !appended.windows(2).all(|w| w[0] < w[1]) {
                pending.keys.sort();
                pending.keys.dedup();
            }
            if (epoch, revision) > (pending.epoch, pending.revision) {
                (pending.epoch, pending.revision) = (epoch, revision);
            }
            result = pending.note(revision, epoch, types);
        }
        self.wake.raise(wake::MARKED);
        result
    }

    fn mark_everything(&self, revision: u64, epoch: u64) -> MarkResult {
        let mut result = MarkResult::default();
        if let Ok(mut pending) = self.pending.lock() {
            result = pending.note(revision, epoch, TypeMask::ALL);
            pending.everything = true;
            pending.keys.clear();
            // Everything is computed afresh, from this revision on: earlier marks are moot
            // (and after a head that went backwards, never published again).
            pending.revision = revision;
            pending.epoch = epoch;
        }
        self.wake.raise(wake::MARKED);
        result
    }

    /// The revisions marked and not yet taken (the stream left), and their epoch.
    fn abandon(&self) -> (u64, Vec<u64>) {
        self.pending
            .lock()
            .map(|mut p| {
                let revisions = std::mem::take(&mut p.revisions);
                (
                    p.revisions_epoch,
                    revisions.into_iter().map(|(r, _)| r).collect(),
                )
            })
            .unwrap_or_default()
    }

    /// What was marked since the last take.
    pub fn take(&self) -> Marked {
        let Ok(mut pending) = self.pending.lock() else {
            return Marked::default();
        };
        let revision = std::mem::take(&mut pending.revision);
        let epoch = std::mem::take(&mut pending.epoch);
        let revisions = std::mem::take(&mut pending.revisions);
        let revisions_epoch = pending.revisions_epoch;
        if std::mem::take(&mut pending.everything) {
            return Marked {
                keys: None,
                revision,
                epoch,
                revisions,
                revisions_epoch,
            };
        }
        Marked {
            keys: Some(std::mem::take(&mut pending.keys)),
            revision,
            epoch,
            revisions,
            revisions_epoch,
        }
    }
}

/// A stream a revision concerns: its inbox, and the changed resources it is marked with.
type Target<'a> = (Arc<Inbox>, SmallVec<[&'a ChangedKey; 2]>);

/// The revision being dispatched, for streams whose interest changes meanwhile.
#[derive(Debug)]
struct Dispatching {
    revision: u64,
    epoch: u64,
    /// `None`: everything changed.
    changed: Option<Arc<[ChangedKey]>>,
}

#[derive(Debug)]
struct Entry {
    inbox: Arc<Inbox>,
    status: Arc<Mutex<ClientStatus>>,
    /// Shared with every stream that subscribes alike (`crate::intern`).
    interest: Arc<StreamInterest>,
}

#[derive(Debug, Default)]
struct Indexes {
    dispatching: Option<Dispatching>,
    streams: HashMap<u64, Entry, Ids>,
    by_name: HashMap<(String, String), IdSet>,
    wildcard: HashMap<String, IdSet>,
    by_collection: HashMap<(String, String), IdSet>,
}

/// The sets of streams a change to `key` concerns, of those that exist: by name, by wildcard,
/// by collection.
fn concerned<'i>(indexes: &'i Indexes, key: &ChangedKey) -> [Option<&'i IdSet>; 3] {
    let by_name = indexes
        .by_name
        .get(&(key.type_url.to_string(), key.name.clone()));
    let wildcard = indexes.wildcard.get(key.type_url.as_str());
    let by_collection = if indexes.by_collection.is_empty() {
        None
    } else {
        XdstpUrn::parse(&key.name)
            .ok()
            .and_then(|u| u.collection())
            .and_then(|collection| {
                indexes
                    .by_collection
                    .get(&(key.type_url.to_string(), collection.to_string()))
            })
    };
    [by_name, wildcard, by_collection]
}

impl Indexes {
    fn unindex(&mut self, id: u64, interest: &StreamInterest) {
        for (type_url, i) in interest {
            for name in &i.names {
                remove(&mut self.by_name, &(type_url.clone(), name.to_string()), id);
            }
            if i.wildcard {
                remove(&mut self.wildcard, type_url, id);
            }
            for collection in &i.collections {
                remove(
                    &mut self.by_collection,
                    &(type_url.clone(), collection.clone()),
                    id,
                );
            }
        }
    }

    fn index(&mut self, id: u64, interest: &StreamInterest) {
        for (type_url, i) in interest {
            for name in &i.names {
                self.by_name
                    .entry((type_url.clone(), name.to_string()))
                    .or_default()
                    .insert(id);
            }
            if i.wildcard {
                self.wildcard
                    .entry(type_url.clone())
                    .or_default()
                    .insert(id);
            }
            for collection in &i.collections {
                self.by_collection
                    .entry((type_url.clone(), collection.clone()))
                    .or_default()
                    .insert(id);
            }
        }
    }
}

fn remove<K: std::hash::Hash + Eq>(map: &mut HashMap<K, IdSet>, key: &K, id: u64) {
    if let Some(set) = map.get_mut(key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// Every connected stream.
#[derive(Debug)]
pub struct Registry {
    indexes: Mutex<Indexes>,
    next_id: AtomicU64,
    /// The latest snapshot whose changes every stream has been told of.
    published: watch::Sender<Arc<Snapshot>>,
    /// The streams that hold TTL'd resources, for the one heartbeat task.
    pub heartbeats: heartbeats::Heartbeats,
    /// Clients connecting and leaving, ACKs and NACKs, for `GET /v1/events`.
    pub events: crate::events::ClientEvents,
    /// Which streams each recent revision changed, and their answers.
    pub rollouts: Arc<crate::rollout::Rollouts>,
    /// The last client summary's streams and entries, with the count of changes to what it
    /// read (`crate::status::summary_inputs`) when its walk began.
    pub(crate) summary_cache: Mutex<Option<(u64, vxds_core::impact::ClientSummary)>>,
}

/// A stream's place in the registry; dropping it (the stream ended) removes the stream.
#[derive(Debug)]
pub struct Registration {
    pub id: u64,
    pub inbox: Arc<Inbox>,
    /// What wakes the stream's task: a mark of its inbox, its heartbeat ([`wake`]).
    pub wake: Arc<wake::Wake>,
    registry: Arc<Registry>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut indexes) = self.registry.indexes.lock()
            && let Some(entry) = indexes.streams.remove(&self.id)
        {
            indexes.unindex(self.id, &entry.interest);
            crate::status::summary_inputs_changed();
        }
        self.registry.heartbeats.remove(self.id);
        let (epoch, revisions) = self.inbox.abandon();
        self.registry.rollouts.undecided_gone_in(epoch, &revisions);
    }
}

impl Registry {
    /// A registry whose streams start from `snapshot`.
    pub fn new(snapshot: Arc<Snapshot>) -> Self {
        let events = crate::events::ClientEvents::default();
        let rollouts = crate::rollout::Rollouts::new(events.clone())
            .with_reconnect_grace(crate::rollout::RECONNECT_GRACE);
        rollouts.loaded(snapshot.epoch, snapshot.revision);
        Self {
            indexes: Mutex::default(),
            next_id: AtomicU64::new(0),
            published: watch::channel(snapshot).0,
            heartbeats: heartbeats::Heartbeats::default(),
            rollouts: Arc::new(rollouts),
            events,
            summary_cache: Mutex::default(),
        }
    }

    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn register(self: &Arc<Self>, id: u64, status: Arc<Mutex<ClientStatus>>) -> Registration {
        let wake = Arc::new(wake::Wake::default());
        let inbox = Arc::new(Inbox {
            pending: Mutex::default(),
            wake: wake.clone(),
        });
        // Outside the registry's lock: interning takes the interner's.
        let nothing = crate::machine::shared_interest(StreamInterest::new());
        if let Ok(mut indexes) = self.indexes.lock() {
            indexes.streams.insert(
                id,
                Entry {
                    inbox: inbox.clone(),
                    status,
                    interest: nothing,
                },
            );
        }
        crate::status::summary_inputs_changed();
        Registration {
            id,
            inbox,
            wake,
            registry: self.clone(),
        }
    }

    /// Replaces what stream `id` subscribes to.
    pub fn set_interest(&self, id: u64, interest: StreamInterest) {
        let interest = crate::machine::shared_interest(interest);
        let Ok(mut guard) = self.indexes.lock() else {
            return;
        };
        let Some(old) = guard.streams.get_mut(&id).map(|e| e.interest.clone()) else {
            return;
        };
        guard.unindex(id, &old);
        guard.index(id, &interest);
        let indexes = &mut *guard;
        let Some(entry) = indexes.streams.get_mut(&id) else {
            return;
        };
        entry.interest = interest;
        // A revision being dispatched may have looked this stream up before the change: it
        // gets the whole revision, and waits for its publication before computing. Marked
        // outside the lock: a revision can be large.
        let catch_up = indexes
            .dispatching
            .as_ref()
            .map(|d| (entry.inbox.clone(), d.changed.clone(), d.revision, d.epoch));
        drop(guard);
        let marked = match catch_up {
            Some((inbox, Some(changed), revision, epoch)) => {
                (inbox.mark(changed.iter(), revision, epoch), revision)
            }
            Some((inbox, None, revision, epoch)) => {
                (inbox.mark_everything(revision, epoch), revision)
            }
            None => return,
        };
        self.rollout_marked(marked.0, marked.1);
    }

    /// Counts a mark into the rollout records: before the revision's publication, so before
    /// the stream can decide.
    fn rollout_marked(&self, result: MarkResult, revision: u64) {
        let added = self.rollout_evicted(result);
        self.rollouts.marked_by(revision, added);
    }

    /// Counts the revision a mark gave up; whether the mark was new to its inbox (1), for
    /// the caller to count, once for every stream a dispatch marks.
    fn rollout_evicted(&self, result: MarkResult) -> u64 {
        if let Some(evicted) = result.evicted {
            self.rollouts.undecided_gone(&[evicted]);
        }
        u64::from(result.added)
    }

    /// The latest published snapshot.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.published.borrow().clone()
    }

    /// Waits until a snapshot at `revision` or later is published: every stream it concerns
    /// has been told of it.
    pub async fn wait_published(&self, revision: u64) -> Arc<Snapshot> {
        let mut published = self.published.subscribe();
        match published.wait_for(|s| s.revision >= revision).await {
            Ok(snapshot) => snapshot.clone(),
            Err(_) => self.snapshot(),
        }
    }

    /// Brings `machine` up to date with what its inbox holds, and returns the snapshot to
    /// compute from: published, and at least as new as every change the machine was told of.
    pub async fn catch_up(&self, inbox: &Inbox, machine: &mut StreamMachine) -> Arc<Snapshot> {
        self.catch_up_marked(inbox, machine, &mut Vec::new()).await
    }

    /// [`Self::catch_up`], adding each revision marked to `revisions`.
    pub async fn catch_up_marked(
        &self,
        inbox: &Inbox,
        machine: &mut StreamMachine,
        revisions: &mut impl Extend<Mark>,
    ) -> Arc<Snapshot> {
        // Subscribed only to wait: nearly every call (after every request and every mark)
        // finds its revision published, and a receiver made and dropped each time cost two
        // atomic counts and, on the last one's drop, a wake of the sender's waiters.
        let mut published: Option<watch::Receiver<Arc<Snapshot>>> = None;
        loop {
            // Snapshot first, then the inbox: every mark up to its revision is in the inbox
            // by the time it is published.
            let snapshot = self.published.borrow().clone();
            let marked = inbox.take();
            revisions.extend(marked.revisions.iter().map(|&(revision, types)| Mark {
                epoch: marked.revisions_epoch,
                revision,
                types,
            }));
            match &marked.keys {
                Some(keys) => machine.on_changes(keys.iter().map(|k| &**k)),
                None => machine.on_everything_changed(),
            }
            if (marked.epoch, marked.revision) <= (snapshot.epoch, snapshot.revision) {
                return snapshot;
            }
            // Marked for a revision still being dispatched: wait for it, then look again.
            // Boxed: the wait is rare, and inline it made every computation's future (made
            // and moved into the stream task's state on every revision) hundreds of bytes.
            let wanted = (marked.epoch, marked.revision);
            let receiver = published.get_or_insert_with(|| self.published.subscribe());
            if Box::pin(receiver.wait_for(|s| (s.epoch, s.revision) >= wanted))
                .await
                .is_err()
            {
                return self.snapshot();
            }
        }
    }

    /// Tells the streams `snapshot` concerns what changed (everything, when `changed` is
    /// `None`), then publishes it.
    pub fn dispatch(&self, snapshot: Arc<Snapshot>, changed: Option<BTreeSet<ChangedKey>>) {
        let revision = snapshot.revision;
        let epoch = snapshot.epoch;
        self.rollouts.dispatching_in(
            epoch,
            self.snapshot().revision,
            revision,
            snapshot.committed_at_ms(),
        );
        // Shared by every inbox marked: a stream's costs an `Arc`, not two strings.
        let changed: Option<Arc<[ChangedKey]>> = changed.map(|c| c.into_iter().collect());
        if let Ok(mut indexes) = self.indexes.lock() {
            indexes.dispatching = Some(Dispatching {
                revision,
                epoch,
                changed: changed.clone(),
            });
        }
        match &changed {
            Some(changed) => {
                let mut added = 0;
                if let [key] = &changed[..]
                    && let Some(inboxes) = self.sole_targets(key)
                {
                    for inbox in &inboxes {
                        added += self.rollout_evicted(inbox.mark([key], revision, epoch));
                    }
                } else {
                    for (inbox, keys) in self.targets(changed).into_values() {
                        added += self.rollout_evicted(inbox.mark(keys, revision, epoch));
                    }
                }
                self.rollouts.marked_by(revision, added);
            }
            None => {
                let inboxes: Vec<Arc<Inbox>> = match self.indexes.lock() {
                    Ok(indexes) => indexes.streams.values().map(|e| e.inbox.clone()).collect(),
                    Err(_) => Vec::new(),
                };
                let mut added = 0;
                for inbox in &inboxes {
                    added += self.rollout_evicted(inbox.mark_everything(revision, epoch));
                }
                self.rollouts.marked_by(revision, added);
            }
        }
        if let Ok(mut indexes) = self.indexes.lock() {
            indexes.dispatching = None;
            self.published.send_replace(snapshot);
        }
        self.rollouts.published(revision);
    }

    /// The inboxes of the streams `key` concerns when they are one set of the index (by name,
    /// by wildcard or by collection), each once: the common revision, one resource changed
    /// for the streams that name it or for every wildcard stream. `None` when several sets
    /// overlap: then [`Self::targets`] merges them per stream.
    fn sole_targets(&self, key: &ChangedKey) -> Option<Vec<Arc<Inbox>>> {
        let indexes = self.indexes.lock().ok()?;
        let mut sets = concerned(&indexes, key).into_iter().flatten();
        let Some(ids) = sets.next() else {
            return Some(Vec::new());
        };
        if sets.next().is_some() {
            return None;
        }
        let streams = ids.iter().filter_map(|id| indexes.streams.get(id));
        Some(streams.map(|entry| entry.inbox.clone()).collect())
    }

    /// The streams each changed resource concerns, looked up a chunk at a time. A stream's
    /// keys are held inline up to two (most revisions change one resource a stream sees).
    fn targets<'a>(&self, changed: &'a [ChangedKey]) -> HashMap<u64, Target<'a>, Ids> {
        let mut targets: HashMap<u64, Target<'a>, Ids> = HashMap::default();
        for chunk in changed.chunks(DISPATCH_CHUNK) {
            let Ok(indexes) = self.indexes.lock() else {
                return targets;
            };
            for key in chunk {
                for ids in concerned(&indexes, key).into_iter().flatten() {
                    if targets.is_empty() {
                        targets.reserve(ids.len());
                    }
                    for id in ids {
                        let Some(entry) = indexes.streams.get(id) else {
                            continue;
                        };
                        let keys = &mut targets
                            .entry(*id)
                            .or_insert_with(|| (entry.inbox.clone(), SmallVec::new()))
                            .1;
                        // A stream found twice for one key (by name and by wildcard) gets
                        // it once; keys come in order, so a repeat is the last one pushed.
                        if !keys.last().is_some_and(|last| Arc::ptr_eq(last, key)) {
                            keys.push(key);
                        }
                    }
                }
            }
        }
        targets
    }

    pub fn len(&self) -> usize {
        self.indexes.lock().map(|i| i.streams.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every stream's shared status, in no order.
    pub(crate) fn statuses(&self) -> Vec<Arc<Mutex<ClientStatus>>> {
        match self.indexes.lock() {
            Ok(indexes) => indexes.streams.values().map(|e| e.status.clone()).collect(),
            Err(_) => Vec::new(),
        }
    }

    /// At most `limit` streams' statuses with ids above `after`, by stream id, and whether
    /// more follow: only those are copied.
    pub fn clients_page(&self, after: u64, limit: usize) -> (Vec<ClientStatus>, bool) {
        let mut page: Vec<(u64, Arc<Mutex<ClientStatus>>)> = match self.indexes.lock() {
            Ok(indexes) => indexes
                .streams
                .iter()
                .filter(|(id, _)| **id > after)
                .map(|(id, e)| (*id, e.status.clone()))
                .collect(),
            Err(_) => Vec::new(),
        };
        let more = page.len() > limit;
        if more {
            page.select_nth_unstable_by_key(limit, |(id, _)| *id);
            page.truncate(limit);
        }
        page.sort_unstable_by_key(|(id, _)| *id);
        let clients = page
            .iter()
            .filter_map(|(_, s)| s.lock().ok().map(|s| s.clone()))
            .collect();
        (clients, more)
    }

    /// Every stream's status, by stream id.
    pub fn clients(&self) -> Vec<ClientStatus> {
        let statuses = self.statuses();
        let mut clients: Vec<ClientStatus> = statuses
            .iter()
            .filter_map(|s| s.lock().ok().map(|s| s.clone()))
            .collect();
        clients.sort_by_key(|c| c.stream_id);
        clients
    }
}

/// Follows the index and tells the streams what changed, one revision at a time.
pub async fn dispatch_changes(index: Index, registry: Arc<Registry>) {
    let mut snapshots = index.subscribe();
    loop {
        let snapshot = snapshots.borrow_and_update().clone();
        // Only the revision and epoch of the last published snapshot are kept across the wait:
        // holding the snapshot itself would keep the previous index alive until the next write
        // (after deleting 100,000 resources, all of them).
        let (last_revision, last_epoch) = {
            let last = registry.snapshot();
            (last.revision, last.epoch)
        };
        if snapshot.revision != last_revision || snapshot.epoch != last_epoch {
            // A reloaded index (the database went back or diverged: a restore, a failover to
            // a lagging standby) invalidates everything, even at the same revision number.
            let changed = (snapshot.epoch == last_epoch && snapshot.revision > last_revision)
                .then(|| snapshot.changed_since(last_revision))
                .flatten();
            registry.dispatch(snapshot, changed);
        }
        if snapshots.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
