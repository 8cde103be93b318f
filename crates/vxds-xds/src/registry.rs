//! Who is connected and what each stream subscribes to, so that a revision visits only the
//! streams it concerns.
//!
//! The dispatcher follows the index; for each new snapshot it looks up the changed resources
//! (by name, by type for wildcard subscribers, by collection for glob subscribers) and marks
//! them in the inboxes of the streams that care. An inbox coalesces: however many revisions
//! pass while a stream is busy, it holds each changed resource once, and the stream catches up
//! with one computation from the latest snapshot. Work per revision is proportional to the
//! subscriptions it touches, and a slow stream costs memory only for what changed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use vxds_core::xdstp::XdstpUrn;
use vxds_envoy::changeset::ResourceKey;
use vxds_store::Index;

use crate::machine::Interest;
use crate::status::ClientStatus;

/// The changes waiting for one stream.
#[derive(Debug, Default)]
pub struct Inbox {
    pending: Mutex<Pending>,
    notify: Notify,
}

#[derive(Debug, Default)]
struct Pending {
    keys: BTreeSet<ResourceKey>,
    everything: bool,
}

impl Inbox {
    fn mark(&self, key: &ResourceKey) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.keys.insert(key.clone());
        }
        self.notify.notify_one();
    }

    fn mark_everything(&self) {
        if let Ok(mut pending) = self.pending.lock() {
            pending.everything = true;
            pending.keys.clear();
        }
        self.notify.notify_one();
    }

    /// Waits until something is marked (a mark made before the wait counts).
    pub async fn wait(&self) {
        self.notify.notified().await;
    }

    /// What was marked since the last take: the keys, or `None` for everything.
    pub fn take(&self) -> Option<BTreeSet<ResourceKey>> {
        let Ok(mut pending) = self.pending.lock() else {
            return None;
        };
        if std::mem::take(&mut pending.everything) {
            return None;
        }
        Some(std::mem::take(&mut pending.keys))
    }
}

#[derive(Debug)]
struct Entry {
    inbox: Arc<Inbox>,
    status: Arc<Mutex<ClientStatus>>,
    interest: BTreeMap<String, Interest>,
}

#[derive(Debug, Default)]
struct Indexes {
    streams: HashMap<u64, Entry>,
    by_name: HashMap<(String, String), HashSet<u64>>,
    wildcard: HashMap<String, HashSet<u64>>,
    by_collection: HashMap<(String, String), HashSet<u64>>,
}

impl Indexes {
    fn unindex(&mut self, id: u64, interest: &BTreeMap<String, Interest>) {
        for (type_url, i) in interest {
            for name in &i.names {
                remove(&mut self.by_name, &(type_url.clone(), name.clone()), id);
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

    fn index(&mut self, id: u64, interest: &BTreeMap<String, Interest>) {
        for (type_url, i) in interest {
            for name in &i.names {
                self.by_name
                    .entry((type_url.clone(), name.clone()))
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

fn remove<K: std::hash::Hash + Eq>(map: &mut HashMap<K, HashSet<u64>>, key: &K, id: u64) {
    if let Some(set) = map.get_mut(key) {
        set.remove(&id);
        if set.is_empty() {
            map.remove(key);
        }
    }
}

/// Every connected stream.
#[derive(Debug, Default)]
pub struct Registry {
    indexes: Mutex<Indexes>,
    next_id: AtomicU64,
}

/// A stream's place in the registry; dropping it (the stream ended) removes the stream.
#[derive(Debug)]
pub struct Registration {
    pub id: u64,
    pub inbox: Arc<Inbox>,
    registry: Arc<Registry>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Ok(mut indexes) = self.registry.indexes.lock()
            && let Some(entry) = indexes.streams.remove(&self.id)
        {
            indexes.unindex(self.id, &entry.interest);
        }
    }
}

impl Registry {
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn register(self: &Arc<Self>, id: u64, status: Arc<Mutex<ClientStatus>>) -> Registration {
        let inbox = Arc::new(Inbox::default());
        if let Ok(mut indexes) = self.indexes.lock() {
            indexes.streams.insert(
                id,
                Entry {
                    inbox: inbox.clone(),
                    status,
                    interest: BTreeMap::new(),
                },
            );
        }
        Registration {
            id,
            inbox,
            registry: self.clone(),
        }
    }

    /// Replaces what stream `id` subscribes to.
    pub fn set_interest(&self, id: u64, interest: BTreeMap<String, Interest>) {
        let Ok(mut indexes) = self.indexes.lock() else {
            return;
        };
        let Some(old) = indexes
            .streams
            .get_mut(&id)
            .map(|e| std::mem::take(&mut e.interest))
        else {
            return;
        };
        indexes.unindex(id, &old);
        indexes.index(id, &interest);
        if let Some(entry) = indexes.streams.get_mut(&id) {
            entry.interest = interest;
        }
    }

    /// Marks `changed` for the streams that subscribe to it.
    pub fn dispatch(&self, changed: &BTreeSet<ResourceKey>) {
        let Ok(indexes) = self.indexes.lock() else {
            return;
        };
        for key in changed {
            let mut streams: HashSet<u64> = HashSet::new();
            if let Some(ids) = indexes
                .by_name
                .get(&(key.type_url.clone(), key.name.clone()))
            {
                streams.extend(ids);
            }
            if let Some(ids) = indexes.wildcard.get(&key.type_url) {
                streams.extend(ids);
            }
            if !indexes.by_collection.is_empty()
                && let Some(collection) =
                    XdstpUrn::parse(&key.name).ok().and_then(|u| u.collection())
                && let Some(ids) = indexes
                    .by_collection
                    .get(&(key.type_url.clone(), collection.to_string()))
            {
                streams.extend(ids);
            }
            for id in streams {
                if let Some(entry) = indexes.streams.get(&id) {
                    entry.inbox.mark(key);
                }
            }
        }
    }

    /// Every stream must look at everything again.
    pub fn dispatch_everything(&self) {
        if let Ok(indexes) = self.indexes.lock() {
            indexes
                .streams
                .values()
                .for_each(|e| e.inbox.mark_everything());
        }
    }

    pub fn len(&self) -> usize {
        self.indexes.lock().map(|i| i.streams.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every stream's status, by stream id.
    pub fn clients(&self) -> Vec<ClientStatus> {
        let statuses: Vec<Arc<Mutex<ClientStatus>>> = match self.indexes.lock() {
            Ok(indexes) => indexes.streams.values().map(|e| e.status.clone()).collect(),
            Err(_) => return Vec::new(),
        };
        let mut clients: Vec<ClientStatus> = statuses
            .iter()
            .filter_map(|s| s.lock().ok().map(|s| s.clone()))
            .collect();
        clients.sort_by_key(|c| c.stream_id);
        clients
    }
}

/// Follows the index and tells the streams what changed.
pub async fn dispatch_changes(index: Index, registry: Arc<Registry>) {
    let mut snapshots = index.subscribe();
    let mut last = snapshots.borrow_and_update().revision;
    while snapshots.changed().await.is_ok() {
        let snapshot = snapshots.borrow_and_update().clone();
        match snapshot.changed_since(last) {
            Some(changed) => registry.dispatch(&changed),
            None => registry.dispatch_everything(),
        }
        last = snapshot.revision;
    }
}
