//! One resource type on one stream: the state and its parts, one module each —
//! - `subscriptions`: what the client subscribed to, and what it was sent;
//! - `desired`: what it should have, from a snapshot;
//! - `accepted`: what it holds — what it acknowledged (held = accepted);
//! - `respond`: the responses that close the gap, and the client's answers;
//! - `sotw_state`: a SotW response's whole state, shared by the streams that send the same;
//! - `heartbeat`: the renewal of the TTLs of what it accepted;
//! - `lists`: list collections built per subscriber.
//!
//! Items are what a client tracks: a resource by name (plain-name, wildcard and glob
//! subscriptions) or a variant by name and constraints (locator subscriptions, TP2). The
//! desired state is kept per resource, so a change to one resource costs work for that resource
//! only. Closing the gap happens in two phases: *make* (additions and updates, and telling the
//! client what does not exist) and *break* (removals of what the client has), which the machine
//! runs once the client has answered everything in flight before them.

mod accepted;
mod desired;
pub(crate) mod heartbeat;
mod lists;
mod respond;
mod sotw_state;
mod subscriptions;
mod touched;

use desired::glob_scan_prefix;
pub(crate) use respond::nonce_seq;
use touched::Touched;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;
use vxds_core::impact::Subscription;
use vxds_core::xdstp::{SubscriptionName, XdstpUrl};
use vxds_core::{ConstraintsId, ParamSet};
use vxds_envoy::collections::ListCollection;
use vxds_store::{IndexedResource, Snapshot};

pub(crate) use crate::held::{Item, Sent};
use crate::status::{HeldKey, SubscriptionGroup};

/// What a client tracks. Names are shared (with the index, or with the subscription), since
/// every stream holds one key per resource it tracks.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum ItemKey {
    /// A resource by name, as the client spells it.
    Name(Arc<str>),
    /// A variant of a resource subscribed by locator: name and constraints identify it.
    Variant(Arc<str>, ConstraintsId),
}

impl ItemKey {
    pub(crate) fn name(&self) -> &Arc<str> {
        match self {
            ItemKey::Name(n) | ItemKey::Variant(n, _) => n,
        }
    }

    /// The same key, by pointer first: keys come from the index and the subscriptions, so
    /// the same key is nearly always the same `Arc` (a string comparison otherwise).
    fn same(&self, other: &ItemKey) -> bool {
        match (self, other) {
            (ItemKey::Name(a), ItemKey::Name(b)) => Arc::ptr_eq(a, b) || a == b,
            (ItemKey::Variant(a, x), ItemKey::Variant(b, y)) => {
                x == y && (Arc::ptr_eq(a, b) || a == b)
            }
            _ => false,
        }
    }

    fn held_key(&self) -> HeldKey {
        match self {
            ItemKey::Name(n) => (n.clone(), None),
            ItemKey::Variant(n, id) => (n.clone(), Some(*id)),
        }
    }
}

/// A subscription that currently matches nothing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Missing {
    Name(String),
    /// A locator: its spelling and parameters, both shared (`crate::intern`).
    Locator(Arc<str>, Arc<ParamSet>),
    Glob(String),
}

/// The locator subscriptions of one spelling: its normal form and each parameter set it is
/// subscribed with. Names and parameter sets are interned, shared by every stream that
/// subscribes alike, so a locator subscription costs a stream a few pointers.
#[derive(Clone, Debug)]
struct Locators {
    normal: Arc<str>,
    /// Distinct, usually one: held inline, so that one costs no allocation of its own.
    params: SmallVec<[Arc<ParamSet>; 1]>,
}

/// What changed in what the client holds since the status last looked.
#[derive(Debug)]
pub(crate) enum HeldChanges {
    /// Everything may have: copy it all (SotW replaces its whole state anyway).
    All,
    /// These, in order; `None` for what the client no longer holds.
    Some(Vec<(HeldKey, Option<Sent>)>),
}

#[derive(Clone, Debug)]
struct Glob {
    url: XdstpUrl,
    params: Arc<ParamSet>,
    constrained: bool,
}

/// What a stream wants of a type, for the registry: which changes concern it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Interest {
    /// Resource names in normal form, shared (`crate::intern`): the registry keeps every
    /// stream's interest.
    pub names: BTreeSet<Arc<str>>,
    pub wildcard: bool,
    /// Glob collections, as normal-form URLs (`xdstp://a/T/path/*?ctx`).
    pub collections: BTreeSet<String>,
}

/// The outcome of acknowledging a response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ack {
    Acked { version: Arc<str> },
    Nacked { version: Arc<str>, message: String },
}

#[derive(Debug)]
pub(crate) struct TypeState {
    /// Shared with every response of the type and every stream's state of it (interned).
    pub type_url: Arc<str>,
    /// Shared with every stream whose parameters are equal (`crate::intern`).
    pub default_params: Arc<ParamSet>,
    pub seen_request: bool,

    legacy_wildcard: bool,
    explicit_wildcard: bool,
    /// The client left the wildcard since the last refresh: it dropped what only the wildcard
    /// gave it (Envoy's `DeltaSubscriptionState` clears its wildcard resources; a SotW client
    /// takes the next response as its whole state), so that is forgotten, not removed.
    left_wildcard: bool,
    /// Some of `sent` is only what a reconnecting client reported holding (`Sent::Reported`),
    /// not yet matched to the desired state: only then does a refresh look through `sent`.
    reported_pending: bool,
    /// Plain-name subscriptions: spelling → normal form, both shared (`crate::intern`; one
    /// `Arc` when they are the same), so that the registry's interest takes them as they are.
    names: BTreeMap<Arc<str>, Arc<str>>,
    /// Spellings that differ from their normal form (xdstp context parameters out of order),
    /// by normal form. A spelling in normal form is found in `names` directly.
    names_by_normal: BTreeMap<String, BTreeSet<Arc<str>>>,
    /// Locator subscriptions, by spelling.
    locators: BTreeMap<Arc<str>, Locators>,
    /// Locator spellings that differ from their normal form, by normal form (as for `names`).
    locators_by_normal: BTreeMap<Arc<str>, BTreeSet<Arc<str>>>,
    globs: BTreeMap<String, Glob>,
    /// List collections subscribed to (by name or locator), by normal name.
    lists: BTreeMap<String, ListCollection>,
    /// The client takes list collections with inline entries.
    pub inline_lists: bool,
    /// For secrets: which variants may be served (`None` for other types).
    pub secrets: Option<crate::machine::SecretAccess>,

    desired: BTreeMap<ItemKey, Item>,
    /// The desired items of a resource (by normal name), except those keyed by the normal
    /// name itself, which are found directly: most resources need no entry here.
    by_normal: Touched<BTreeMap<String, Vec<ItemKey>>>,
    missing: Touched<BTreeSet<Missing>>,
    glob_members: Touched<BTreeMap<String, BTreeSet<Arc<str>>>>,

    /// Resources (normal names) to look at again; everything when `full_refresh`.
    stale_normals: Touched<BTreeSet<String>>,
    full_refresh: bool,
    /// Items whose desired state may differ from what the client has.
    dirty: Touched<BTreeSet<ItemKey>>,
    /// Answer even if nothing changed: new subscriptions deserve an answer (SotW: any; Delta:
    /// a new wildcard, the one subscription nothing else answers when it matches nothing).
    pub force_send: bool,

    sent: BTreeMap<ItemKey, Sent>,
    reported_missing: Touched<BTreeSet<Missing>>,
    /// How `sent` changed since the stream's status last looked.
    held_changes: HeldChanges,

    /// SotW: the last response's sequence number (its nonce) and version; the version the
    /// client refused (until it accepts another).
    pub last_seq: Option<u64>,
    last_version: Option<Arc<str>>,
    nacked_version: Option<Arc<str>>,
    /// Responses not yet acknowledged (or refused), by sequence number (their nonce's
    /// value: a nonce is its sequence number in decimal).
    outstanding: BySeq<Outstanding>,
    /// The latest refusal, until a later response is accepted.
    refused: Option<Refused>,
    /// Names reported at connect (`initial_resource_versions`) not yet matched to what the
    /// subscriptions want: a locator's may be a variant. Empty after the first refresh.
    reported_names: Touched<BTreeSet<Arc<str>>>,
    /// Removals due, each with the sequence number of the last response sent when it became
    /// due: it may go once every response up to that one is accepted.
    removal_stamps: Touched<BTreeMap<ItemKey, u64>>,
    /// The removals that became due in the last poll (rollout tracking: they are the marked
    /// revisions').
    pub removals_due_now: Vec<ItemKey>,
    /// Rollout tracking follows what the resources sent name (set for a poll): the upserts
    /// that name something are kept in `referencing` until the machine looks.
    pub follow_references: bool,
    /// Items sent in the last poll that name resources of other types (see
    /// `follow_references`), by the name the client knows them by.
    /// One inline: a revision usually changes one resource of a type per stream.
    pub referencing: SmallVec<[(Arc<str>, Item); 1]>,

    /// What the client accepted (held = ACKed, not sent): heartbeats renew these, at these
    /// versions, and the NACK scope reads their references. See `accepted`.
    accepted: accepted::Accepted,
    /// The version of the last response the client accepted (SotW heartbeats carry it).
    accepted_version: Option<String>,
    /// The changes each unanswered response carried, by sequence number (Delta: its changes;
    /// SotW: its whole state), applied to `accepted` when it is acknowledged.
    unacked: BySeq<accepted::Carried>,
    /// Responses sent after the last one of this type the client answered (a nonce never
    /// sent, or already answered, resets nothing).
    pub unanswered: usize,
    /// When each accepted TTL'd item was last renewed by a heartbeat.
    renewed: Touched<BTreeMap<ItemKey, std::time::Instant>>,
    /// TTL'd items just accepted with their bodies (their TTL restarted then): renewed as of
    /// the next heartbeat round, which sends them nothing yet.
    fresh: Touched<BTreeSet<ItemKey>>,
    /// TTL'd items a reconnecting client reported holding: their TTL has run since the last
    /// server's renewal, for how long nobody knows, so the first renewal carries the body —
    /// it restores what may have lapsed meanwhile, where a bodiless one would be refused.
    renew_with_body: Touched<BTreeSet<ItemKey>>,
}

/// Entries by sequence number, ascending: the responses in flight and what they carried.
/// Usually one, between a response and its ACK, or none: held inline, so that a response
/// and its answer allocate and free no B-tree node on every stream for every revision.
/// Sequence numbers only grow, so an entry is nearly always pushed last.
pub(crate) type BySeq<T> = SmallVec<[(u64, T); 1]>;

/// Records `value` under `seq`, replacing what was there (`BTreeMap::insert`).
pub(crate) fn insert_by_seq<T>(entries: &mut BySeq<T>, seq: u64, value: T) {
    let at = entries.partition_point(|(s, _)| *s < seq);
    match entries.get_mut(at) {
        Some((s, held)) if *s == seq => *held = value,
        _ => entries.insert(at, (seq, value)),
    }
}

/// Takes the entry under `seq` out.
pub(crate) fn remove_by_seq<T>(entries: &mut BySeq<T>, seq: u64) -> Option<T> {
    let at = entries.binary_search_by_key(&seq, |(s, _)| *s).ok()?;
    Some(entries.remove(at).1)
}

/// How far the client's answers reach, for the removal-eligibility rule.
#[derive(Debug, Default)]
pub(crate) struct Settled {
    /// Every response before this one is answered.
    pub unanswered_before: u64,
    /// No response before this one stands refused.
    pub refused_before: u64,
    /// What the client's accepted configuration names, by type URL (only filled while a
    /// refusal stands).
    pub referenced: BTreeMap<&'static str, BTreeSet<String>>,
}

impl Settled {
    /// How far the client's answers reach over `types`; while a refusal stands, what its
    /// accepted configuration names (a refused update holds back only those removals).
    pub(crate) fn of<'a>(types: impl Iterator<Item = &'a TypeState> + Clone) -> Settled {
        let mut settled = Settled {
            unanswered_before: u64::MAX,
            refused_before: u64::MAX,
            referenced: BTreeMap::new(),
        };
        for ty in types.clone() {
            let (unanswered, refused) = ty.unsettled_from();
            settled.unanswered_before = settled.unanswered_before.min(unanswered);
            settled.refused_before = settled.refused_before.min(refused);
        }
        if settled.refused_before != u64::MAX {
            for ty in types {
                for item in ty.accepted_items() {
                    for (type_url, name) in &item.variant().references {
                        settled
                            .referenced
                            .entry(*type_url)
                            .or_default()
                            .insert(name.to_string());
                    }
                }
            }
        }
        settled
    }

    pub fn references(&self, type_url: &str, name: &str) -> bool {
        self.referenced
            .get(type_url)
            .is_some_and(|names| names.contains(name))
    }
}

/// A response awaiting the client's answer.
#[derive(Clone, Debug)]
struct Outstanding {
    version: Arc<str>,
    /// Its sequence number (the nonce).
    seq: u64,
    /// The earliest response it answers for: itself, or (SotW) the oldest it superseded.
    since: u64,
    /// A heartbeat: it carries nothing new, so its ACK lifts no refusal.
    heartbeat: bool,
    /// What a Delta heartbeat renewed (mostly without bodies). Envoy takes a bodiless renewal
    /// only of a resource it holds at that version: refused, it means the client's TTL ran out
    /// first and it dropped them. Boxed: one per type on every stream, nearly always empty.
    renewing: Box<[ItemKey]>,
}

/// A refused response: what was computed after `since` may depend on it.
#[derive(Clone, Copy, Debug)]
struct Refused {
    seq: u64,
    since: u64,
}

impl TypeState {
    pub fn new(type_url: &str, default_params: ParamSet) -> Self {
        Self {
            type_url: crate::intern::name(type_url),
            default_params: crate::intern::params(default_params),
            seen_request: false,
            legacy_wildcard: false,
            explicit_wildcard: false,
            left_wildcard: false,
            reported_pending: false,
            names: BTreeMap::new(),
            names_by_normal: BTreeMap::new(),
            locators: BTreeMap::new(),
            locators_by_normal: BTreeMap::new(),
            globs: BTreeMap::new(),
            lists: BTreeMap::new(),
            inline_lists: false,
            secrets: None,
            desired: BTreeMap::new(),
            by_normal: Touched::default(),
            missing: Touched::default(),
            glob_members: Touched::default(),
            stale_normals: Touched::default(),
            full_refresh: true,
            dirty: Touched::default(),
            force_send: false,
            sent: BTreeMap::new(),
            reported_missing: Touched::default(),
            held_changes: HeldChanges::All,
            last_seq: None,
            last_version: None,
            nacked_version: None,
            outstanding: BySeq::new(),
            refused: None,
            reported_names: Touched::default(),
            removal_stamps: Touched::default(),
            removals_due_now: Vec::new(),
            follow_references: false,
            referencing: SmallVec::new(),
            accepted: accepted::Accepted::default(),
            accepted_version: None,
            unacked: BySeq::new(),
            unanswered: 0,
            renewed: Touched::default(),
            fresh: Touched::default(),
            renew_with_body: Touched::default(),
        }
    }

    /// Removals due and not yet sent (held back until earlier responses are answered). A
    /// stamp outlives its removal until the next poll, so what was sent is passed over.
    pub fn removals_waiting(&self) -> bool {
        self.removal_stamps
            .keys()
            .any(|k| self.sent.contains_key(k) && !self.desired.contains_key(k))
    }

    /// The removals due and not yet sent (see [`Self::removals_waiting`]).
    pub fn removals_held(&self) -> impl Iterator<Item = &ItemKey> {
        self.removal_stamps
            .keys()
            .filter(|k| self.sent.contains_key(*k) && !self.desired.contains_key(*k))
    }

    /// An item sent now: rollout tracking follows what it names, when asked to.
    fn note_referencing(&mut self, key: &ItemKey, item: &Item) {
        if self.follow_references && !item.variant().references.is_empty() {
            self.referencing.push((key.name().clone(), item.clone()));
        }
    }

    /// Whether the client holds accepted something under `name` (by name or as a variant).
    pub fn holds_accepted(&self, name: &Arc<str>) -> bool {
        self.accepted.contains_key(&ItemKey::Name(name.clone())) || self.accepted.has_variants(name)
    }

    /// Whether the client subscribes to `name` by that name (a plain name or a locator; not
    /// by a wildcard or a glob).
    pub fn subscribes_by_name(&self, name: &Arc<str>) -> bool {
        self.names.contains_key(&**name) || self.locators.contains_key(&**name)
    }

    /// Whether the client subscribes to `name`: a response of the type answers for it.
    pub fn subscribes(&self, name: &Arc<str>) -> bool {
        self.wildcard()
            || self.names.contains_key(&**name)
            || self.locators.contains_key(&**name)
            || self.desires_name(name)
    }

    /// Whether the client subscribes to the type and holds what it should of it: nothing in
    /// flight, refused, held back or still to match from what it reported at connect.
    pub fn in_sync(&self) -> bool {
        self.seen_request
            && self.outstanding.is_empty()
            && self.refused.is_none()
            && !self.reported_pending
            && !self.removals_waiting()
    }

    /// What the client was last sent under `name` (by name, or the first variant).
    pub fn sent_item(&self, name: &Arc<str>) -> Option<&Item> {
        let by_name = self.sent.get(&ItemKey::Name(name.clone()));
        let sent = by_name.or_else(|| {
            let first = ItemKey::Variant(name.clone(), ConstraintsId::MIN);
            let last = ItemKey::Variant(name.clone(), ConstraintsId::MAX);
            self.sent.range(first..=last).next().map(|(_, s)| s)
        });
        match sent {
            Some(Sent::Delivered(item)) => Some(item),
            _ => None,
        }
    }

    /// Whether a poll would find nothing to do for this type: nothing to refresh, nothing that
    /// may differ from what the client has, nothing to answer or report, no removal waiting.
    /// The common case after an ACK, which every stream sends for every response.
    pub fn quiet(&self) -> bool {
        !self.full_refresh
            && !self.force_send
            && !self.reported_pending
            && self.stale_normals.is_empty()
            && self.dirty.is_empty()
            && self.removal_stamps.is_empty()
            && self.missing.is_empty()
            && self.glob_members.is_empty()
            && self.reported_names.is_empty()
    }

    /// Frees the bookkeeping that emptied: an emptied B-tree keeps its first node (up to
    /// 700 bytes), and an idle stream would keep several, all empty. Called by every poll
    /// that sends nothing; only the collections changed since the last call are looked at
    /// (`touched`: replacing one costs a drop, even of a map that holds no node).
    pub fn free_emptied(&mut self) {
        fn by_seq<T>(entries: &mut BySeq<T>) {
            if entries.is_empty() && entries.spilled() {
                *entries = BySeq::new();
            }
        }
        by_seq(&mut self.outstanding);
        by_seq(&mut self.unacked);
        self.renewed.free_if_emptied();
        self.fresh.free_if_emptied();
        self.renew_with_body.free_if_emptied();
        self.removal_stamps.free_if_emptied();
        // Filled only while rollout tracking follows references; a full state's worth of
        // room is not kept on an idle stream.
        if self.referencing.is_empty() && self.referencing.spilled() {
            self.referencing = SmallVec::new();
        }
        self.by_normal.free_if_emptied();
        self.glob_members.free_if_emptied();
        self.dirty.free_if_emptied();
        self.missing.free_if_emptied();
        self.reported_missing.free_if_emptied();
        self.reported_names.free_if_emptied();
        self.stale_normals.free_if_emptied();
    }
}

#[cfg(test)]
mod by_seq_tests {
    use super::*;

    /// The in-flight lists behave as maps by sequence number, kept in order.
    #[test]
    fn entries_by_sequence_number_behave_as_a_map() {
        let mut entries: BySeq<&str> = BySeq::new();
        insert_by_seq(&mut entries, 5, "five");
        insert_by_seq(&mut entries, 9, "nine");
        insert_by_seq(&mut entries, 7, "seven");
        insert_by_seq(&mut entries, 9, "nine again");
        assert_eq!(&entries[..], [(5, "five"), (7, "seven"), (9, "nine again")]);
        assert_eq!(remove_by_seq(&mut entries, 7), Some("seven"));
        assert_eq!(remove_by_seq(&mut entries, 7), None);
        assert_eq!(remove_by_seq(&mut entries, 6), None);
        assert_eq!(&entries[..], [(5, "five"), (9, "nine again")]);
        // One entry stays inline: a response and its answer allocate nothing.
        let mut one: BySeq<&str> = BySeq::new();
        insert_by_seq(&mut one, 1, "one");
        assert!(!one.spilled());
        assert_eq!(remove_by_seq(&mut one, 1), Some("one"));
        assert!(one.is_empty() && !one.spilled());
    }
}
