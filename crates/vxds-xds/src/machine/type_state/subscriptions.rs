//! What a client subscribed to, for one type: plain names, locators (TP2), globs, list
//! collections and the wildcards; the subscription changes of SotW and Delta requests; the
//! registry's interest and the descriptions `/v1/clients` shows. Also the record of what the
//! client was sent (`send`, `unsend`), which subscription changes edit.

use super::*;

impl TypeState {
    /// Whether anything is subscribed to by name, locator or glob (the wildcard aside): asked
    /// on every request, so it stops at the first, where counting visits every locator.
    pub fn has_subscriptions(&self) -> bool {
        !self.names.is_empty()
            || !self.globs.is_empty()
            || self.locators.values().any(|l| !l.params.is_empty())
    }

    pub fn subscription_count(&self) -> usize {
        let locators: usize = self.locators.values().map(|l| l.params.len()).sum();
        self.names.len() + locators + self.globs.len()
    }

    /// The locator subscriptions, as (spelling, parameters).
    pub(super) fn locator_subscriptions(
        &self,
    ) -> impl Iterator<Item = (&Arc<str>, &Arc<ParamSet>)> {
        self.locators
            .iter()
            .flat_map(|(spelling, l)| l.params.iter().map(move |p| (spelling, p)))
    }

    /// The locator subscriptions of the resource `normal`: (spelling, parameters).
    pub(super) fn locators_of<'a>(
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
            let before = self.wildcard();
            self.legacy_wildcard = on;
            self.wildcard_changed(before);
        }
    }

    pub fn set_explicit_wildcard(&mut self, on: bool) {
        if self.explicit_wildcard != on {
            let before = self.wildcard();
            self.explicit_wildcard = on;
            self.wildcard_changed(before);
        }
    }

    fn wildcard_changed(&mut self, before: bool) {
        self.full_refresh = true;
        if before && !self.wildcard() {
            self.left_wildcard = true;
        } else if self.wildcard() {
            self.left_wildcard = false;
        }
    }

    /// After the client left the wildcard (called once a request's subscription changes are
    /// in): forgets what it held only through it. What a name or glob subscription still
    /// covers stays, and its removal (if it is gone) is sent.
    pub fn forget_left_wildcard(&mut self) {
        if !std::mem::take(&mut self.left_wildcard) {
            return;
        }
        let globs: Vec<&XdstpUrl> = self
            .globs
            .values()
            .filter(|g| !g.constrained)
            .map(|g| &g.url)
            .collect();
        let covered = |name: &str| {
            !globs.is_empty()
                && vxds_core::xdstp::XdstpUrn::parse(name)
                    .is_ok_and(|urn| globs.iter().any(|g| g.glob_matches(&urn)))
        };
        let dropped: Vec<ItemKey> = self
            .sent
            .keys()
            .filter(|k| matches!(k, ItemKey::Name(_)))
            .filter(|k| !self.names.contains_key(k.name()) && !covered(k.name()))
            .cloned()
            .collect();
        for key in dropped {
            self.forget(&key);
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
    pub(super) fn unsend_to_resend(&mut self, key: &ItemKey) {
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

    pub(super) fn add_named(
        &mut self,
        spelling: &str,
        normal: String,
        params: Option<Arc<ParamSet>>,
    ) {
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

    pub(super) fn forget(&mut self, key: &ItemKey) {
        self.unsend(key);
        self.dirty.remove(key);
        // The client dropped it itself (it unsubscribed): nothing to renew.
        self.accepted.remove(key);
        self.renewed.remove(key);
        self.fresh.remove(key);
        self.renew_with_body.remove(key);
    }

    /// The variants of `name` the client holds (locator subscriptions), found by range.
    pub(super) fn sent_variants(&self, name: &Arc<str>) -> impl Iterator<Item = &ItemKey> {
        let first = ItemKey::Variant(name.clone(), ConstraintsId::MIN);
        let last = ItemKey::Variant(name.clone(), ConstraintsId::MAX);
        self.sent.range(first..=last).map(|(key, _)| key)
    }

    /// Records that the client holds `sent` under `key`.
    pub(super) fn send(&mut self, key: ItemKey, sent: Sent) {
        self.log_held(&key, Some(sent.clone()));
        self.sent.insert(key, sent);
    }

    /// Records that the client no longer holds `key`.
    pub(super) fn unsend(&mut self, key: &ItemKey) -> Option<Sent> {
        let sent = self.sent.remove(key)?;
        self.log_held(key, None);
        Some(sent)
    }

    pub(super) fn log_held(&mut self, key: &ItemKey, held: Option<Sent>) {
        if let HeldChanges::Some(changes) = &mut self.held_changes {
            changes.push((key.held_key(), held));
            // A status nobody reads must not grow past what it describes.
            if changes.len() > self.sent.len() + 16 {
                self.held_changes = HeldChanges::All;
            }
        }
    }

    /// Whether what the client holds changed since the status last looked.
    pub fn held_changed(&self) -> bool {
        !matches!(&self.held_changes, HeldChanges::Some(changes) if changes.is_empty())
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
        // Nearly every request of a wildcard stream (its ACKs): nothing named, before or now.
        if self.names.is_empty()
            && self.globs.is_empty()
            && self.locators.is_empty()
            && locators.is_empty()
            && names.iter().all(|n| n == "*")
        {
            return false;
        }
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
        self.reported_pending = true;
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
                    self.type_url.to_string(),
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
                self.type_url.to_string(),
                &self.default_params,
                Subscription::Wildcard,
            ));
        }
        for glob in self.globs.values() {
            if !glob.constrained && wildcard {
                continue;
            }
            out.insert((
                self.type_url.to_string(),
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
