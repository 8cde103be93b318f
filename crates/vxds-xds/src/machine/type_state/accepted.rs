//! Held = accepted: what a client holds of a type is what it acknowledged, not what it was
//! sent. A response's changes wait in `unacked` (Delta: the items it added, updated or removed;
//! SotW: the whole state it carried) until the client answers it: an ACK applies them, a NACK
//! drops them and the client keeps what it had. Heartbeats renew the accepted items at their
//! accepted versions (Envoy takes a heartbeat only at the version it holds), and the NACK scope
//! reads the accepted items' references.
//!
//! SotW keeps the state of every unanswered response: a client lagging under churn answers a
//! superseded response too (a stale nonce), and an ACK of it means it holds that state. Bounded:
//! one entry per unanswered response, and a stream past `--xds-max-unanswered` is ended.

use std::collections::btree_map::Entry;
use std::time::Duration;

use super::sotw_state::SotwState;
use super::*;

/// What the client accepted, by key, with the TTL'd items also in TTL order: the stream's
/// shortest TTL (asked after every request, to set its heartbeat timer) is the first of them
/// that heartbeats renew, found without walking the items that have none (issue 20: a stream
/// holding 2,000 clusters walked all of them on every request).
#[derive(Clone, Debug, Default)]
pub(crate) struct Accepted {
    items: BTreeMap<ItemKey, Item>,
    /// `(ttl, key)` of each TTL'd item, kept in step with `items` by every change.
    timed: BTreeSet<(Duration, ItemKey)>,
}

impl Accepted {
    pub(crate) fn insert(&mut self, key: ItemKey, item: Item) {
        let ttl = item.ttl();
        match self.items.entry(key) {
            Entry::Occupied(mut held) => {
                let before = held.get().ttl();
                if before != ttl {
                    if let Some(before) = before {
                        self.timed.remove(&(before, held.key().clone()));
                    }
                    if let Some(ttl) = ttl {
                        self.timed.insert((ttl, held.key().clone()));
                    }
                }
                held.insert(item);
            }
            Entry::Vacant(free) => {
                if let Some(ttl) = ttl {
                    self.timed.insert((ttl, free.key().clone()));
                }
                free.insert(item);
            }
        }
    }

    pub(crate) fn remove(&mut self, key: &ItemKey) {
        if let Some(ttl) = self.items.remove(key).and_then(|item| item.ttl()) {
            self.timed.remove(&(ttl, key.clone()));
        }
    }

    pub(crate) fn contains_key(&self, key: &ItemKey) -> bool {
        self.items.contains_key(key)
    }

    /// Whether it holds variants of `name` (locator subscriptions), found by range.
    pub(crate) fn has_variants(&self, name: &Arc<str>) -> bool {
        let first = ItemKey::Variant(name.clone(), vxds_core::ConstraintsId::MIN);
        let last = ItemKey::Variant(name.clone(), vxds_core::ConstraintsId::MAX);
        self.items.range(first..=last).next().is_some()
    }

    pub(crate) fn iter(&self) -> std::collections::btree_map::Iter<'_, ItemKey, Item> {
        self.items.iter()
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &Item> {
        self.items.values()
    }

    /// The accepted items become exactly `state` (sorted by key, as a SotW response carries
    /// it), changed in place: a SotW ACK usually changes one item of many, and rebuilding
    /// the tree cost every stream an allocation per item per revision. Whether some key
    /// left.
    pub(crate) fn become_state(&mut self, state: &[(ItemKey, Item)]) -> bool {
        // Usually the same keys as before: the values are replaced in place, in one walk
        // without a search by key; only a changed TTL touches `timed`. A key that differs
        // ends the walk, and the rest goes by key.
        let mut in_step = self.items.len() == state.len();
        let mut retimed = Vec::new();
        if in_step {
            for ((key, held), (new_key, item)) in self.items.iter_mut().zip(state) {
                if !key.same(new_key) {
                    in_step = false;
                    break;
                }
                // The same variant: nothing to replace (a revision changes one item of many).
                if held.same(item) {
                    continue;
                }
                let (before, after) = (held.ttl(), item.ttl());
                if before != after {
                    retimed.push((key.clone(), before, after));
                }
                *held = item.clone();
            }
        }
        for (key, before, after) in retimed {
            if let Some(before) = before {
                self.timed.remove(&(before, key.clone()));
            }
            if let Some(after) = after {
                self.timed.insert((after, key));
            }
        }
        if in_step {
            return false;
        }
        let gone: Vec<ItemKey> = self
            .items
            .keys()
            .filter(|k| state.binary_search_by(|(s, _)| s.cmp(*k)).is_err())
            .cloned()
            .collect();
        for key in &gone {
            self.remove(key);
        }
        for (key, item) in state {
            self.insert(key.clone(), item.clone());
        }
        !gone.is_empty()
    }

    /// The TTL'd items' keys, shortest TTL first, with their TTLs.
    pub(crate) fn by_ttl(&self) -> impl Iterator<Item = (Duration, &ItemKey)> {
        self.timed.iter().map(|(ttl, key)| (*ttl, key))
    }
}

impl FromIterator<(ItemKey, Item)> for Accepted {
    fn from_iter<I: IntoIterator<Item = (ItemKey, Item)>>(items: I) -> Self {
        let mut accepted = Accepted::default();
        for (key, item) in items {
            accepted.insert(key, item);
        }
        accepted
    }
}

impl<'a> IntoIterator for &'a Accepted {
    type Item = (&'a ItemKey, &'a Item);
    type IntoIter = std::collections::btree_map::Iter<'a, ItemKey, Item>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

/// What an unanswered response carried.
#[derive(Clone, Debug)]
pub(crate) enum Carried {
    /// Delta: items added or updated (`Some`) and removed (`None`).
    Changes(Vec<(ItemKey, Option<Item>)>),
    /// SotW: the whole state of the type, with the response's version (shared with every
    /// stream whose response carried the same).
    State(Arc<SotwState>),
}

impl TypeState {
    /// Records what response `seq` carried, until the client answers it.
    pub(super) fn carry(&mut self, seq: u64, carried: Carried) {
        match carried {
            Carried::Changes(changes) if changes.is_empty() => {}
            carried => {
                insert_by_seq(&mut self.unacked, seq, carried);
            }
        }
    }

    /// The client accepted response `seq`: it holds what it carried, and what every earlier
    /// unanswered response carried (clients answer in order; a SotW response supersedes).
    pub(super) fn accept_through(&mut self, seq: u64) {
        // Taken from the front: usually the only one, held inline.
        let through = self.unacked.partition_point(|(s, _)| *s <= seq);
        let taken: BySeq<Carried> = self.unacked.drain(..through).collect();
        // Whether something may have left what the client holds: only then can the
        // renewal bookkeeping below hold keys it no longer has (most ACKs only add).
        let mut removed = false;
        for (_, carried) in taken {
            match carried {
                Carried::Changes(changes) => {
                    for (key, item) in changes {
                        match item {
                            Some(item) => {
                                if item.ttl().is_some() {
                                    self.fresh.insert(key.clone());
                                    self.renew_with_body.remove(&key);
                                }
                                self.accepted.insert(key, item)
                            }
                            None => {
                                removed = true;
                                self.accepted.remove(&key)
                            }
                        }
                    }
                }
                Carried::State(state) => {
                    removed |= self.accepted.become_state(state.items());
                    // Rewritten in place: once per ACK on every SotW stream.
                    let version = state.version();
                    match &mut self.accepted_version {
                        Some(accepted) => {
                            accepted.clear();
                            accepted.push_str(version);
                        }
                        None => self.accepted_version = Some(version.to_string()),
                    }
                    let timed = self.accepted.by_ttl();
                    self.fresh.extend(timed.map(|(_, k)| k.clone()));
                }
            }
        }
        if !removed {
            return;
        }
        self.renewed.retain(|k, _| self.accepted.contains_key(k));
        self.fresh.retain(|k| self.accepted.contains_key(k));
        self.renew_with_body
            .retain(|k| self.accepted.contains_key(k));
    }

    /// The client refused response `seq`: it keeps what it had accepted. A SotW response
    /// answers for those it superseded: they will not be answered any more.
    pub(super) fn refuse(&mut self, seq: u64) {
        match remove_by_seq(&mut self.unacked, seq) {
            Some(Carried::State(..)) => self.unacked.retain(|(s, _)| *s > seq),
            // Delta: clients answer in order, so an earlier response left unanswered was
            // taken without a word.
            _ if seq > 0
                && self
                    .unacked
                    .iter()
                    .take_while(|(s, _)| *s < seq)
                    .all(|(_, c)| matches!(c, Carried::Changes(_))) =>
            {
                self.accept_through(seq - 1)
            }
            _ => {}
        }
    }

    /// SotW: the client answered response `seq`, which a later one superseded (a stale
    /// nonce). An ACK means it holds that response's state, at its version; a NACK, that it
    /// kept what it had. Whether `seq` was a response still unanswered.
    pub(super) fn answer_superseded_state(&mut self, seq: u64, accepted: bool) -> bool {
        if !matches!(
            self.unacked.iter().find(|(s, _)| *s == seq),
            Some((_, Carried::State(..)))
        ) {
            return false;
        }
        if accepted {
            self.accept_through(seq);
        } else {
            remove_by_seq(&mut self.unacked, seq);
        }
        true
    }

    /// Items with a change in flight: a heartbeat at the accepted version would arrive after
    /// the change and not match what the client then holds.
    pub(super) fn in_flight(&self) -> BTreeSet<&ItemKey> {
        self.unacked
            .iter()
            .flat_map(|(_, carried)| match carried {
                Carried::Changes(changes) => changes.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                Carried::State(state) => state.items().iter().map(|(k, _)| k).collect(),
            })
            .collect()
    }

    /// Delta reconnect: what the client reported in `initial_resource_versions` at the version
    /// the server has is held and accepted, so its TTL is renewed like anything delivered here
    /// (Envoy's TTL timers survive a reconnect).
    pub(super) fn accept_reported(&mut self) {
        // A walk of everything the client holds: on the refresh path of every stream, so only
        // while a reconnect's reports are still unmatched.
        if !self.reported_pending {
            return;
        }
        let matching: Vec<(ItemKey, Item)> = self
            .sent
            .iter()
            .filter_map(|(key, sent)| match sent {
                Sent::Reported(version) => self
                    .desired
                    .get(key)
                    .filter(|item| item.version() == version)
                    .map(|item| (key.clone(), item.clone())),
                Sent::Delivered(_) => None,
            })
            .collect();
        for (key, item) in matching {
            self.send(key.clone(), Sent::Delivered(item.clone()));
            if item.ttl().is_some() {
                self.renew_with_body.insert(key.clone());
            }
            self.accepted.insert(key, item);
        }
        self.reported_pending = self
            .sent
            .values()
            .any(|sent| matches!(sent, Sent::Reported(_)));
    }

    /// The newest unanswered response that carries something under `name` (by name or as a
    /// variant): rollout tracking waits for its answer.
    pub(crate) fn in_flight_carrying(&self, name: &Arc<str>) -> Option<u64> {
        let matches = |k: &ItemKey| Arc::ptr_eq(k.name(), name) || k.name() == name;
        self.unacked
            .iter()
            .rev()
            .find(|(_, carried)| match carried {
                Carried::Changes(changes) => changes.iter().any(|(k, _)| matches(k)),
                Carried::State(state) => state.items().iter().any(|(k, _)| matches(k)),
            })
            .map(|(seq, _)| *seq)
    }

    /// The accepted items, for the NACK scope's references.
    pub(crate) fn accepted_items(&self) -> impl Iterator<Item = &Item> {
        self.accepted.values()
    }
}
