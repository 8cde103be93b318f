//! One resource type on one stream: what the client subscribed to, what it should have (from a
//! snapshot), what it has (what was sent), and the responses that close the gap.
//!
//! Items are what a client tracks: a resource by name (plain-name, wildcard and glob
//! subscriptions) or a variant by name and constraints (locator subscriptions, TP2). The
//! desired state is kept per resource, so a change to one resource costs work for that resource
//! only. Closing the gap happens in two phases: *make* (additions and updates, and telling the
//! client what does not exist) and *break* (removals of what the client has), which the machine
//! only runs once the client has acknowledged everything in flight.

mod accepted;
pub(crate) mod heartbeat;
mod lists;
mod respond;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;
use vxds_core::impact::Subscription;
use vxds_core::xdstp::{SubscriptionName, XdstpUrl};
use vxds_core::{ConstraintsId, ParamSet};
use vxds_envoy::collections::ListCollection;
use vxds_store::{IndexedResource, IndexedVariant, Snapshot};

use crate::status::{HeldKey, HeldResource, SubscriptionGroup};
use crate::wire::{Naming, Wrapped};

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
    fn name(&self) -> &Arc<str> {
        match self {
            ItemKey::Name(n) | ItemKey::Variant(n, _) => n,
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

#[derive(Clone, Debug)]
pub(crate) struct Item {
    resource: Arc<IndexedResource>,
    variant: usize,
    /// Named with its constraints (locator subscriptions) or the legacy way.
    constrained: bool,
}

impl Item {
    pub(crate) fn variant(&self) -> &IndexedVariant {
        &self.resource.variants[self.variant]
    }

    fn version(&self) -> &Arc<str> {
        &self.variant().version
    }

    /// Whether this is the variant `params` resolved to (in the snapshot it came from).
    fn resolves(&self, params: &ParamSet) -> bool {
        self.resource.matcher.resolve(params) == Some(self.variant)
    }

    /// The constraints it is named with: a locator subscription's variant's, else none.
    fn constraints(&self) -> Option<Bytes> {
        self.constrained
            .then(|| self.variant().constraints_bytes.clone())
            .flatten()
    }

    fn wrapped(&self, name: &Arc<str>) -> Wrapped {
        let variant = self.variant();
        let naming = if self.constrained {
            Naming::Constrained(variant.constraints_bytes.clone())
        } else {
            Naming::Legacy
        };
        Wrapped {
            name: name.clone(),
            naming,
            version: variant.version.clone(),
            body: Some(variant.body.clone()),
            ttl: variant.ttl,
        }
    }

    /// Its TTL: such an item is always sent wrapped, and kept alive by heartbeats.
    fn ttl(&self) -> Option<std::time::Duration> {
        self.variant().ttl
    }
}

/// What the client has of an item.
#[derive(Clone, Debug)]
pub(crate) enum Sent {
    /// Sent on this stream: the variant as the snapshot of the time held it.
    Delivered(Item),
    /// What the client said it had at connect (`initial_resource_versions`); never sent here.
    Reported(Arc<str>),
}

impl Sent {
    fn version(&self) -> &Arc<str> {
        match self {
            Sent::Delivered(item) => item.version(),
            Sent::Reported(version) => version,
        }
    }

    fn constraints(&self) -> Option<Bytes> {
        match self {
            Sent::Delivered(item) => item.constraints(),
            Sent::Reported(_) => None,
        }
    }

    /// As operators see it, under `name`. Every field is shared, not copied.
    pub(crate) fn held(&self, name: &Arc<str>) -> HeldResource {
        let delivered = match self {
            Sent::Delivered(item) => Some(item),
            Sent::Reported(_) => None,
        };
        HeldResource {
            name: name.clone(),
            version: self.version().clone(),
            constraints: delivered
                .filter(|item| item.constrained)
                .and_then(|item| item.variant().constraints_text.clone()),
            body: delivered.map(|item| item.variant().body.clone()),
        }
    }
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
    Acked { version: String },
    Nacked { version: String, message: String },
}

#[derive(Debug)]
pub(crate) struct TypeState {
    pub type_url: String,
    /// Shared with every stream whose parameters are equal (`crate::intern`).
    pub default_params: Arc<ParamSet>,
    pub seen_request: bool,

    legacy_wildcard: bool,
    explicit_wildcard: bool,
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

    desired: BTreeMap<ItemKey, Item>,
    /// The desired items of a resource (by normal name), except those keyed by the normal
    /// name itself, which are found directly: most resources need no entry here.
    by_normal: BTreeMap<String, Vec<ItemKey>>,
    missing: BTreeSet<Missing>,
    glob_members: BTreeMap<String, BTreeSet<Arc<str>>>,

    /// Resources (normal names) to look at again; everything when `full_refresh`.
    stale_normals: BTreeSet<String>,
    full_refresh: bool,
    /// Items whose desired state may differ from what the client has.
    dirty: BTreeSet<ItemKey>,
    /// SotW: answer even if nothing changed (new subscriptions deserve an answer).
    pub force_send: bool,

    sent: BTreeMap<ItemKey, Sent>,
    reported_missing: BTreeSet<Missing>,
    /// How `sent` changed since the stream's status last looked.
    held_changes: HeldChanges,

    /// SotW: the last response's nonce and version; the version the client refused (until it
    /// accepts another).
    pub last_nonce: Option<String>,
    last_version: Option<String>,
    nacked_version: Option<String>,
    /// Responses not yet acknowledged (or refused), by nonce.
    outstanding: BTreeMap<String, Outstanding>,
    /// The latest refusal, until a later response is accepted.
    refused: Option<Refused>,
    /// Names reported at connect (`initial_resource_versions`) not yet matched to what the
    /// subscriptions want: a locator's may be a variant. Empty after the first refresh.
    reported_names: BTreeSet<Arc<str>>,
    /// Removals due, each with the sequence number of the last response sent when it became
    /// due: it may go once every response up to that one is accepted.
    removal_stamps: BTreeMap<ItemKey, u64>,

    /// What the client accepted (held = ACKed, not sent): heartbeats renew these, at these
    /// versions, and the NACK scope reads their references. See `accepted`.
    accepted: BTreeMap<ItemKey, Item>,
    /// The version of the last response the client accepted (SotW heartbeats carry it).
    accepted_version: Option<String>,
    /// The changes each unanswered response carried (Delta: by sequence number; SotW: the one
    /// outstanding response's whole state), applied to `accepted` when it is acknowledged.
    unacked: BTreeMap<u64, accepted::Carried>,
    /// Responses sent since the client last answered one of this type.
    pub unanswered: usize,
    /// When each accepted TTL'd item was last renewed by a heartbeat.
    renewed: BTreeMap<ItemKey, std::time::Instant>,
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
    pub fn references(&self, type_url: &str, name: &str) -> bool {
        self.referenced
            .get(type_url)
            .is_some_and(|names| names.contains(name))
    }
}

/// A response awaiting the client's answer.
#[derive(Clone, Debug)]
struct Outstanding {
    version: String,
    /// Its sequence number (the nonce).
    seq: u64,
    /// The earliest response it answers for: itself, or (SotW) the oldest it superseded.
    since: u64,
}

/// A refused response: what was computed after `since` may depend on it.
#[derive(Clone, Copy, Debug)]
struct Refused {
    seq: u64,
    since: u64,
}

impl TypeState {
    pub fn new(type_url: String, default_params: ParamSet) -> Self {
        Self {
            type_url,
            default_params: crate::intern::params(default_params),
            seen_request: false,
            legacy_wildcard: false,
            explicit_wildcard: false,
            names: BTreeMap::new(),
            names_by_normal: BTreeMap::new(),
            locators: BTreeMap::new(),
            locators_by_normal: BTreeMap::new(),
            globs: BTreeMap::new(),
            lists: BTreeMap::new(),
            inline_lists: false,
            desired: BTreeMap::new(),
            by_normal: BTreeMap::new(),
            missing: BTreeSet::new(),
            glob_members: BTreeMap::new(),
            stale_normals: BTreeSet::new(),
            full_refresh: true,
            dirty: BTreeSet::new(),
            force_send: false,
            sent: BTreeMap::new(),
            reported_missing: BTreeSet::new(),
            held_changes: HeldChanges::All,
            last_nonce: None,
            last_version: None,
            nacked_version: None,
            outstanding: BTreeMap::new(),
            refused: None,
            reported_names: BTreeSet::new(),
            removal_stamps: BTreeMap::new(),
            accepted: BTreeMap::new(),
            accepted_version: None,
            unacked: BTreeMap::new(),
            unanswered: 0,
            renewed: BTreeMap::new(),
        }
    }

    /// Frees the bookkeeping that emptied: an emptied B-tree keeps its first node (up to
    /// 700 bytes), and an idle stream would keep several, all empty. Called once per poll.
    pub fn free_emptied(&mut self) {
        fn map<K, V>(map: &mut BTreeMap<K, V>) {
            if map.is_empty() {
                *map = BTreeMap::new();
            }
        }
        fn set<K>(set: &mut BTreeSet<K>) {
            if set.is_empty() {
                *set = BTreeSet::new();
            }
        }
        map(&mut self.outstanding);
        map(&mut self.unacked);
        map(&mut self.renewed);
        map(&mut self.removal_stamps);
        map(&mut self.by_normal);
        map(&mut self.glob_members);
        set(&mut self.dirty);
        set(&mut self.missing);
        set(&mut self.reported_missing);
        set(&mut self.reported_names);
        set(&mut self.stale_normals);
    }

    // ---- subscriptions -------------------------------------------------------------------

    pub fn subscription_count(&self) -> usize {
        let locators: usize = self.locators.values().map(|l| l.params.len()).sum();
        self.names.len() + locators + self.globs.len()
    }

    /// The locator subscriptions, as (spelling, parameters).
    fn locator_subscriptions(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<ParamSet>)> {
        self.locators
            .iter()
            .flat_map(|(spelling, l)| l.params.iter().map(move |p| (spelling, p)))
    }

    /// The locator subscriptions of the resource `normal`: (spelling, parameters).
    fn locators_of<'a>(
        &'a self,
        normal: &'a str,
    ) -> impl Iterator<Item = (&'a Arc<str>, &'a Arc<ParamSet>)> + 'a {
        let in_normal_form = self.locators.get_key_value(normal);
        let others = self
            .locators_by_normal
            .get(normal)
            .into_iter()
            .flatten()
            .filter_map(|s| self.locators.get_key_value(&**s));
        in_normal_form
            .into_iter()
            .chain(others)
            .flat_map(|(spelling, l)| l.params.iter().map(move |p| (spelling, p)))
    }

    pub fn wildcard(&self) -> bool {
        self.legacy_wildcard || self.explicit_wildcard
    }

    pub fn set_legacy_wildcard(&mut self, on: bool) {
        if self.legacy_wildcard != on {
            self.legacy_wildcard = on;
            self.full_refresh = true;
        }
    }

    pub fn set_explicit_wildcard(&mut self, on: bool) {
        if self.explicit_wildcard != on {
            self.explicit_wildcard = on;
            self.full_refresh = true;
        }
    }

    /// The stream's parameters for this type changed (the node sent new dynamic parameters):
    /// every plain-name, wildcard and glob subscription resolves again. Returns whether they
    /// changed.
    pub fn set_default_params(&mut self, params: ParamSet) -> bool {
        if *self.default_params == params {
            return false;
        }
        let params = crate::intern::params(params);
        self.default_params = params.clone();
        for glob in self.globs.values_mut().filter(|g| !g.constrained) {
            glob.params = params.clone();
        }
        self.full_refresh = true;
        true
    }

    /// Delta: the client subscribed again to what it already subscribes to. It may have
    /// dropped what it had (discovery.proto: the server must answer every name in
    /// `resource_names_subscribe`), so it is sent again, or reported missing again.
    pub fn resend(&mut self, name: &str, params: Option<&ParamSet>) {
        let shared: Arc<str> = Arc::from(name);
        if let Some(members) = self.glob_members.get(name).cloned() {
            for member in members {
                self.unsend_to_resend(&ItemKey::Name(member.clone()));
                let held: Vec<ItemKey> = self.sent_variants(&member).cloned().collect();
                held.iter().for_each(|k| self.unsend_to_resend(k));
            }
            self.reported_missing
                .remove(&Missing::Glob(name.to_owned()));
            self.full_refresh = true;
            return;
        }
        match params {
            None => {
                let Some(normal) = self.names.get(name).map(|n| n.to_string()) else {
                    return;
                };
                let key = ItemKey::Name(shared);
                self.unsend_to_resend(&key);
                if !self.sent.contains_key(&key) {
                    self.reported_missing
                        .remove(&Missing::Name(name.to_owned()));
                }
                self.stale_normals.insert(normal);
            }
            Some(params) => {
                let Some((spelling, locators)) = self.locators.get_key_value(name) else {
                    return;
                };
                let Some(params) = locators.params.iter().find(|p| ***p == *params) else {
                    return;
                };
                let missing = Missing::Locator(spelling.clone(), params.clone());
                let normal = locators.normal.to_string();
                let held: Vec<ItemKey> = self.sent_variants(&shared).cloned().collect();
                held.iter().for_each(|k| self.unsend_to_resend(k));
                self.reported_missing.remove(&missing);
                self.stale_normals.insert(normal);
            }
        }
    }

    /// Forgets that the client holds `key`, so that it is sent again — unless its removal is
    /// due: that removal is the answer, and it keeps waiting for its turn.
    fn unsend_to_resend(&mut self, key: &ItemKey) {
        if self.desired.contains_key(key) {
            self.unsend(key);
        }
    }

    /// Whether `name` (as spelled) is subscribed to, plainly or, with `params`, by locator.
    pub fn is_subscribed(&self, name: &str, params: Option<&ParamSet>) -> bool {
        match params {
            None => self.names.contains_key(name) || self.globs.contains_key(name),
            Some(params) => self
                .locators
                .get(name)
                .is_some_and(|l| l.params.iter().any(|p| **p == *params)),
        }
    }

    /// Subscribes to `name` (a resource, or a glob collection) with `params`, or the stream's
    /// parameters for the type when `params` is `None` (a plain-name subscription).
    pub fn subscribe(&mut self, name: &str, params: Option<ParamSet>) {
        let constrained = params.is_some();
        let params = params.map(crate::intern::params);
        let params_or_default = params
            .clone()
            .unwrap_or_else(|| self.default_params.clone());
        match SubscriptionName::parse(name) {
            Ok(SubscriptionName::Glob(url)) => {
                self.globs.insert(
                    name.to_owned(),
                    Glob {
                        url,
                        params: params_or_default,
                        constrained,
                    },
                );
                self.full_refresh = true;
            }
            Ok(SubscriptionName::Urn(urn)) => {
                self.track_list(name);
                self.add_named(name, urn.to_string(), params)
            }
            // An opaque name is its own normal form; a malformed xdstp name matches nothing.
            Ok(SubscriptionName::Opaque(_)) | Err(_) => {
                self.add_named(name, name.to_owned(), params)
            }
        }
    }

    fn add_named(&mut self, spelling: &str, normal: String, params: Option<Arc<ParamSet>>) {
        match params {
            None => {
                let spelling = crate::intern::name(spelling);
                let shared_normal = if *spelling == *normal {
                    spelling.clone()
                } else {
                    crate::intern::name(&normal)
                };
                if self.names.insert(spelling.clone(), shared_normal).is_none()
                    && *spelling != *normal
                {
                    self.names_by_normal
                        .entry(normal.clone())
                        .or_default()
                        .insert(spelling);
                }
            }
            Some(params) => {
                let spelling = crate::intern::name(spelling);
                let locators = self
                    .locators
                    .entry(spelling.clone())
                    .or_insert_with(|| Locators {
                        normal: crate::intern::name(&normal),
                        params: SmallVec::new(),
                    });
                if !locators.params.contains(&params) {
                    locators.params.push(params);
                }
                if *spelling != *normal {
                    self.locators_by_normal
                        .entry(locators.normal.clone())
                        .or_default()
                        .insert(spelling);
                }
            }
        }
        self.stale_normals.insert(normal);
    }

    /// Unsubscribes. What the client had through this subscription it drops itself: it is
    /// forgotten, not removed.
    pub fn unsubscribe(&mut self, name: &str, params: Option<ParamSet>) {
        if self.globs.remove(name).is_some() {
            let members = self.glob_members.remove(name).unwrap_or_default();
            self.reported_missing
                .remove(&Missing::Glob(name.to_owned()));
            for member in members {
                self.stale_normals.insert(member.to_string());
                // By name, or (a glob subscribed by locator) as variants.
                let variants: Vec<ItemKey> = self.sent_variants(&member).cloned().collect();
                variants.iter().for_each(|k| self.forget(k));
                self.forget(&ItemKey::Name(member));
            }
            return;
        }
        match params {
            None => {
                if let Some(normal) = self.names.remove(name).map(|n| n.to_string()) {
                    remove_from(&mut self.names_by_normal, &normal, name);
                    self.forget(&ItemKey::Name(Arc::from(name)));
                    self.missing.remove(&Missing::Name(name.to_owned()));
                    self.reported_missing
                        .remove(&Missing::Name(name.to_owned()));
                    self.untrack_list(&normal);
                    self.stale_normals.insert(normal);
                }
            }
            Some(params) => {
                let Some((spelling, locators)) = self.locators.get_key_value(name) else {
                    return;
                };
                let Some(at) = locators.params.iter().position(|p| **p == params) else {
                    return;
                };
                let spelling = spelling.clone();
                let normal = locators.normal.clone();
                let params = match self.locators.get_mut(name) {
                    Some(locators) => locators.params.remove(at),
                    None => return,
                };
                if self.locators.get(name).is_some_and(|l| l.params.is_empty()) {
                    self.locators.remove(name);
                    remove_from(&mut self.locators_by_normal, &normal, name);
                }
                let variants: Vec<ItemKey> = self.sent_variants(&spelling).cloned().collect();
                variants.iter().for_each(|k| self.forget(k));
                let missing = Missing::Locator(spelling, params);
                self.missing.remove(&missing);
                self.reported_missing.remove(&missing);
                self.untrack_list(&normal);
                self.stale_normals.insert(normal.to_string());
            }
        }
    }

    fn forget(&mut self, key: &ItemKey) {
        self.unsend(key);
        self.dirty.remove(key);
        // The client dropped it itself (it unsubscribed): nothing to renew.
        self.accepted.remove(key);
    }

    /// The variants of `name` the client holds (locator subscriptions), found by range.
    fn sent_variants(&self, name: &Arc<str>) -> impl Iterator<Item = &ItemKey> {
        let first = ItemKey::Variant(name.clone(), ConstraintsId::MIN);
        let last = ItemKey::Variant(name.clone(), ConstraintsId::MAX);
        self.sent.range(first..=last).map(|(key, _)| key)
    }

    /// Records that the client holds `sent` under `key`.
    fn send(&mut self, key: ItemKey, sent: Sent) {
        self.log_held(&key, Some(sent.clone()));
        self.sent.insert(key, sent);
    }

    /// Records that the client no longer holds `key`.
    fn unsend(&mut self, key: &ItemKey) -> Option<Sent> {
        let sent = self.sent.remove(key)?;
        self.log_held(key, None);
        Some(sent)
    }

    fn log_held(&mut self, key: &ItemKey, held: Option<Sent>) {
        if let HeldChanges::Some(changes) = &mut self.held_changes {
            changes.push((key.held_key(), held));
            // A status nobody reads must not grow past what it describes.
            if changes.len() > self.sent.len() + 16 {
                self.held_changes = HeldChanges::All;
            }
        }
    }

    pub fn take_held_changes(&mut self) -> HeldChanges {
        std::mem::replace(&mut self.held_changes, HeldChanges::Some(Vec::new()))
    }

    /// SotW: the subscriptions become exactly these. Returns whether they changed.
    pub fn replace_subscriptions(
        &mut self,
        names: &[String],
        locators: &[(String, ParamSet)],
    ) -> bool {
        let wanted_names: BTreeSet<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| *n != "*")
            .collect();
        let current_names: BTreeSet<&str> = self
            .names
            .keys()
            .map(|n| &**n)
            .chain(self.globs.keys().map(String::as_str))
            .collect();
        let wanted_locators: BTreeSet<(&str, &ParamSet)> =
            locators.iter().map(|(n, p)| (n.as_str(), p)).collect();
        let current_locators: BTreeSet<(&str, &ParamSet)> = self
            .locator_subscriptions()
            .map(|(n, p)| (&**n, &**p))
            .collect();
        if wanted_names == current_names && wanted_locators == current_locators {
            return false;
        }
        let drop_names: Vec<String> = current_names
            .difference(&wanted_names)
            .map(|n| (*n).to_owned())
            .collect();
        let add_names: Vec<String> = wanted_names
            .difference(&current_names)
            .map(|n| (*n).to_owned())
            .collect();
        let drop_locators: Vec<(String, ParamSet)> = current_locators
            .difference(&wanted_locators)
            .map(|(n, p)| ((*n).to_owned(), (*p).clone()))
            .collect();
        let add_locators: Vec<(String, ParamSet)> = wanted_locators
            .difference(&current_locators)
            .map(|(n, p)| ((*n).to_owned(), (*p).clone()))
            .collect();
        for name in drop_names {
            self.unsubscribe(&name, None);
        }
        for (name, params) in drop_locators {
            self.unsubscribe(&name, Some(params));
        }
        for name in add_names {
            self.subscribe(&name, None);
        }
        for (name, params) in add_locators {
            self.subscribe(&name, Some(params));
        }
        true
    }

    /// Delta: what the client says it already has, at connect.
    pub fn client_has(&mut self, name: &str, version: &str) {
        self.reported_names.insert(Arc::from(name));
        let key = ItemKey::Name(Arc::from(name));
        self.send(key.clone(), Sent::Reported(Arc::from(version)));
        self.dirty.insert(key);
    }

    pub fn interest(&self) -> Interest {
        Interest {
            names: self
                .names
                .values()
                .cloned()
                .chain(self.locators.values().map(|l| l.normal.clone()))
                .collect(),
            wildcard: self.wildcard(),
            collections: self.globs.values().map(|g| g.url.to_string()).collect(),
        }
    }

    /// The subscriptions with the type and parameters each resolves with, for the client
    /// summary (impact preview). What the client would hold twice under one key is listed
    /// once: a plain name a wildcard or an unconstrained glob also covers, an unconstrained glob
    /// under a wildcard (they resolve with the same parameters, as one item). A list
    /// collection stands for the stored collection of its name and for its members (the glob
    /// it is built from), each under its own type.
    pub fn summary_subscriptions<'s>(&'s self) -> Vec<SubscriptionGroup> {
        let wildcard = self.wildcard();
        let mut out: BTreeSet<(String, &'s Arc<ParamSet>, Subscription)> = BTreeSet::new();
        let mut add = |normal: &str, params: &'s Arc<ParamSet>| match self.lists.get(normal) {
            Some(list) => {
                out.insert((
                    list.collection_type_url.clone(),
                    params,
                    Subscription::Name(normal.to_owned()),
                ));
                out.insert((
                    list.member_type_url.clone(),
                    params,
                    Subscription::Collection(list.members.to_string()),
                ));
            }
            None => {
                out.insert((
                    self.type_url.clone(),
                    params,
                    Subscription::Name(normal.to_owned()),
                ));
            }
        };
        let unconstrained_globs: Vec<&Glob> =
            self.globs.values().filter(|g| !g.constrained).collect();
        for normal in self.names.values() {
            if wildcard && !self.lists.contains_key(&**normal) {
                continue;
            }
            let in_glob = !unconstrained_globs.is_empty()
                && vxds_core::xdstp::XdstpUrn::parse(normal)
                    .is_ok_and(|urn| unconstrained_globs.iter().any(|g| g.url.glob_matches(&urn)));
            if !in_glob {
                add(normal, &self.default_params);
            }
        }
        for locators in self.locators.values() {
            for params in &locators.params {
                add(&locators.normal, params);
            }
        }
        if wildcard {
            out.insert((
                self.type_url.clone(),
                &self.default_params,
                Subscription::Wildcard,
            ));
        }
        for glob in self.globs.values() {
            if !glob.constrained && wildcard {
                continue;
            }
            out.insert((
                self.type_url.clone(),
                &glob.params,
                Subscription::Collection(glob.url.to_string()),
            ));
        }
        let mut groups: Vec<SubscriptionGroup> = Vec::new();
        for (type_url, params, subscription) in out {
            match groups.last_mut() {
                Some(g) if g.type_url == type_url && &g.params == params => {
                    g.subscriptions.push(subscription)
                }
                // The stream's own shared parameter set, not a copy.
                _ => groups.push(SubscriptionGroup {
                    type_url,
                    params: Arc::clone(params),
                    subscriptions: vec![subscription],
                }),
            }
        }
        groups
    }

    /// Human-readable subscriptions, for `/v1/clients`.
    pub fn describe_subscriptions(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.legacy_wildcard {
            out.push("* (legacy wildcard)".to_owned());
        } else if self.explicit_wildcard {
            out.push("*".to_owned());
        }
        out.extend(self.names.keys().map(|n| n.to_string()));
        out.extend(self.globs.keys().cloned());
        out.extend(
            self.locator_subscriptions()
                .map(|(name, params)| format!("{name} {params}")),
        );
        out
    }

    // ---- desired state -------------------------------------------------------------------

    /// A resource changed: look at it again at the next poll.
    pub fn resource_changed(&mut self, normal: &str) {
        self.stale_normals.insert(normal.to_owned());
    }

    pub fn everything_changed(&mut self) {
        self.full_refresh = true;
    }

    /// Brings the desired state up to `snapshot` for what changed.
    pub fn refresh(&mut self, snapshot: &Snapshot) {
        if self.full_refresh {
            self.full_refresh = false;
            let mut normals: BTreeSet<String> = std::mem::take(&mut self.stale_normals);
            normals.extend(self.by_normal.keys().cloned());
            normals.extend(self.desired.values().map(|i| i.resource.key.name.clone()));
            normals.extend(self.names.values().map(|n| n.to_string()));
            normals.extend(self.locators.values().map(|l| l.normal.to_string()));
            if self.wildcard() {
                normals.extend(snapshot.of_type(&self.type_url).map(|r| r.key.name.clone()));
            }
            for glob in self.globs.values() {
                let text = glob.url.to_string();
                let prefix = text
                    .split('?')
                    .next()
                    .unwrap_or(&text)
                    .trim_end_matches('*');
                normals.extend(
                    snapshot
                        .with_prefix(&self.type_url, prefix)
                        .map(|r| r.key.name.clone()),
                );
            }
            self.missing.clear();
            self.glob_members = self
                .globs
                .keys()
                .map(|g| (g.clone(), BTreeSet::new()))
                .collect();
            for normal in normals {
                self.refresh_resource(&normal, snapshot);
            }
        } else {
            for normal in std::mem::take(&mut self.stale_normals) {
                self.refresh_resource(&normal, snapshot);
            }
        }
        // What was reported and matched nothing is held by name: its removal is by name.
        self.reported_names.clear();
        self.accept_reported();
    }

    fn refresh_resource(&mut self, normal: &str, snapshot: &Snapshot) {
        let list = self.lists.get(normal).cloned();
        let stored_type = list
            .as_ref()
            .map_or(self.type_url.as_str(), |l| l.collection_type_url.as_str());
        let resource = snapshot.get(stored_type, normal).cloned();
        let mut previous = self.by_normal.remove(normal).unwrap_or_default();
        // The index's shared name serves as the lookup key, if the resource still exists.
        let shared = resource
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_else(|| Arc::from(normal));
        // The variants held under the normal name itself (locators spelled in normal form,
        // globs by locator) are found by range: they need no `by_normal` entry.
        let first = ItemKey::Variant(shared.clone(), ConstraintsId::MIN);
        let last = ItemKey::Variant(shared.clone(), ConstraintsId::MAX);
        previous.extend(self.desired.range(first..=last).map(|(k, _)| k.clone()));
        previous.push(ItemKey::Name(shared));
        for key in previous {
            // The stored key, not the lookup's: keys stay shared.
            if let Some((key, _)) = self.desired.remove_entry(&key) {
                self.dirty.insert(key);
            }
        }
        for members in self.glob_members.values_mut() {
            members.remove(normal);
        }
        let mut found: Vec<(ItemKey, Item)> = Vec::new();
        let mut missing: Vec<Missing> = Vec::new();
        let inline = self.inline_lists;
        let resolve = |spelling: &str, params: &ParamSet| match &list {
            None => resource
                .as_ref()
                .and_then(|r| r.matcher.resolve(params).map(|i| (r.clone(), i))),
            Some(list) => {
                lists::resolve_list(list, spelling, resource.as_ref(), params, inline, snapshot)
            }
        };
        let item = |resource: Arc<IndexedResource>, variant: usize, constrained: bool| Item {
            resource,
            variant,
            constrained,
        };

        let in_normal_form = self
            .names
            .get_key_value(normal)
            .map(|(spelling, _)| spelling);
        let spellings = in_normal_form
            .into_iter()
            .chain(self.names_by_normal.get(normal).into_iter().flatten());
        for spelling in spellings {
            let m = Missing::Name(spelling.to_string());
            self.missing.remove(&m);
            match resolve(spelling, &self.default_params) {
                Some((r, v)) => found.push((ItemKey::Name(spelling.clone()), item(r, v, false))),
                None => missing.push(m),
            }
        }
        let locators: Vec<(Arc<str>, Arc<ParamSet>)> = self
            .locators_of(normal)
            .map(|(s, p)| (s.clone(), p.clone()))
            .collect();
        for (spelling, params) in locators {
            match resolve(&spelling, &params) {
                Some((r, v)) => {
                    let id = r.variants[v].id;
                    found.push((ItemKey::Variant(spelling.clone(), id), item(r, v, true)));
                    self.missing.remove(&Missing::Locator(spelling, params));
                }
                None => {
                    let m = Missing::Locator(spelling, params);
                    self.missing.remove(&m);
                    missing.push(m);
                }
            }
        }
        if self.wildcard()
            && list.is_none()
            && let Some((r, v)) = resolve(normal, &self.default_params)
        {
            found.push((ItemKey::Name(r.name.clone()), item(r, v, false)));
        }
        if resource.is_some()
            && let Ok(urn) = vxds_core::xdstp::XdstpUrn::parse(normal)
        {
            for (spelling, glob) in &self.globs {
                if !glob.url.glob_matches(&urn) {
                    continue;
                }
                if let Some((r, v)) = resolve(normal, &glob.params) {
                    let key = if glob.constrained {
                        ItemKey::Variant(r.name.clone(), r.variants[v].id)
                    } else {
                        ItemKey::Name(r.name.clone())
                    };
                    self.glob_members
                        .entry(spelling.clone())
                        .or_default()
                        .insert(r.name.clone());
                    found.push((key, item(r, v, glob.constrained)));
                }
            }
        }
        // One item per key: a name subscription wins over the wildcard and globs it overlaps.
        let mut others: Vec<ItemKey> = Vec::new();
        for (key, item) in found {
            if self.desired.contains_key(&key) {
                continue;
            }
            if **key.name() != *normal {
                others.push(key.clone());
            }
            self.dirty.insert(key.clone());
            self.desired.insert(key, item);
        }
        if !others.is_empty() {
            self.by_normal.insert(normal.to_owned(), others);
        }
        self.missing.extend(missing);
        if !self.reported_names.is_empty() {
            self.adopt_reported(normal, resource.as_ref());
        }
    }

    /// A reconnecting client reports what it holds by name (`initial_resource_versions`), but
    /// what a locator (or a glob subscribed by locator) holds is a variant. The report is taken
    /// as the variant with that version: the one desired (nothing is sent again), or another of
    /// the resource's variants, which the desired one then replaces atomically, removed with
    /// its constraints. A report is never removed by bare name: that would delete what the
    /// client uses.
    fn adopt_reported(&mut self, normal: &str, resource: Option<&Arc<IndexedResource>>) {
        // The names the client may hold as variants of this resource: its locator spellings,
        // and its own name (glob members, wildcard-free).
        let mut spellings: BTreeSet<Arc<str>> =
            self.locators_of(normal).map(|(s, _)| s.clone()).collect();
        if let Some(resource) = resource {
            spellings.insert(resource.name.clone());
        }
        for spelling in spellings {
            if !self.reported_names.contains(&spelling) {
                continue;
            }
            let by_name = ItemKey::Name(spelling.clone());
            let first = ItemKey::Variant(spelling.clone(), ConstraintsId::MIN);
            let last = ItemKey::Variant(spelling.clone(), ConstraintsId::MAX);
            let desired_variants: Vec<(ItemKey, Item)> = self
                .desired
                .range(first..=last)
                .map(|(k, item)| (k.clone(), item.clone()))
                .collect();
            let is_locator = self.locators_of(normal).any(|(s, _)| **s == *spelling);
            if self.desired.contains_key(&by_name) || (desired_variants.is_empty() && !is_locator) {
                continue; // held by name (a plain subscription): the report is that one's
            }
            let Some(Sent::Reported(version)) = self.sent.get(&by_name).cloned() else {
                self.reported_names.remove(&spelling);
                continue;
            };
            self.unsend(&by_name);
            self.dirty.remove(&by_name);
            self.reported_names.remove(&spelling);
            if let Some((key, item)) = desired_variants
                .iter()
                .find(|(_, item)| *item.version() == version)
            {
                self.send(key.clone(), Sent::Delivered(item.clone()));
                continue;
            }
            // Another variant of the resource (the client's parameters changed meanwhile).
            let held = resource.and_then(|r| {
                let index = r.variants.iter().position(|v| v.version == version)?;
                Some((
                    ItemKey::Variant(spelling.clone(), r.variants[index].id),
                    Item {
                        resource: r.clone(),
                        variant: index,
                        constrained: true,
                    },
                ))
            });
            if let Some((key, item)) = held {
                self.dirty.insert(key.clone());
                self.send(key, Sent::Delivered(item));
            }
        }
    }
}

/// Removes `value` from the set under `key`, and the set once empty.
fn remove_from<K, V, Q>(map: &mut BTreeMap<K, BTreeSet<V>>, key: &str, value: &Q)
where
    K: Ord + std::borrow::Borrow<str>,
    V: Ord + std::borrow::Borrow<Q>,
    Q: Ord + ?Sized,
{
    if let Some(set) = map.get_mut(key) {
        set.remove(value);
        if set.is_empty() {
            map.remove(key);
        }
    }
}
