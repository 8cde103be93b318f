//! What a client should have of one type, from a snapshot: each subscription resolved to the
//! variant its parameters match, per resource, so a change to one resource costs work for that
//! resource only; and what a reconnecting client reported holding, matched to it.

use super::*;

impl TypeState {
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
            let mut normals: BTreeSet<String> = self.stale_normals.take();
            normals.extend(self.by_normal.keys().cloned());
            normals.extend(self.desired.values().map(|i| i.resource.name.to_string()));
            normals.extend(self.names.values().map(|n| n.to_string()));
            normals.extend(self.locators.values().map(|l| l.normal.to_string()));
            if self.wildcard() {
                normals.extend(snapshot.of_type(&self.type_url).map(|r| r.name.to_string()));
            }
            for glob in self.globs.values() {
                normals.extend(
                    snapshot
                        .with_prefix(&self.type_url, &glob_scan_prefix(&glob.url))
                        .map(|r| r.name.to_string()),
                );
            }
            self.missing.clear();
            *self.glob_members = self
                .globs
                .keys()
                .map(|g| (g.clone(), BTreeSet::new()))
                .collect();
            for normal in normals {
                self.refresh_resource(&normal, snapshot);
            }
        } else {
            for normal in self.stale_normals.take() {
                self.refresh_resource(&normal, snapshot);
            }
        }
        // What was reported and matched nothing is held by name: its removal is by name.
        self.reported_names.clear();
        self.accept_reported();
    }

    pub(super) fn refresh_resource(&mut self, normal: &str, snapshot: &Snapshot) {
        let list = self.lists.get(normal).cloned();
        let stored_type = list
            .as_ref()
            .map_or(&*self.type_url, |l| l.collection_type_url.as_str());
        let resource = snapshot.get(stored_type, normal).cloned();
        // Held inline: a refresh usually finds one item before and one after.
        let mut previous: SmallVec<[ItemKey; 2]> = self
            .by_normal
            .remove(normal)
            .map(SmallVec::from_vec)
            .unwrap_or_default();
        // The index's shared name serves as the lookup key, if the resource still exists.
        let shared = resource
            .as_ref()
            .map(|r| r.name.clone())
            .unwrap_or_else(|| Arc::from(normal));
        // The variants held under the normal name itself (locators spelled in normal form,
        // globs by locator) are found by range: they need no `by_normal` entry. Variants sort
        // after names: with none last, there is none.
        if matches!(
            self.desired.last_key_value(),
            Some((ItemKey::Variant(..), _))
        ) {
            // From the first variant on, while the name lasts: one search of the tree, not
            // one per bound.
            let first = ItemKey::Variant(shared.clone(), ConstraintsId::MIN);
            previous.extend(
                (self.desired.range(first..))
                    .map(|(k, _)| k)
                    .take_while(|k| matches!(k, ItemKey::Variant(name, _) if *name == shared))
                    .cloned(),
            );
        }
        previous.push(ItemKey::Name(shared));
        // What the resource had in the desired state stays there until its items are found
        // again: one found under the same key is replaced in place (nearly every refresh: a
        // new version of what was there), the rest is removed below. The same outcome as
        // removing them all first, without a removal and an insertion per item.
        previous.retain(|key| self.desired.contains_key(key));
        // Looked through only when there are globs: a mutable borrow marks the map for
        // freeing (`touched`).
        if !self.glob_members.is_empty() {
            for members in self.glob_members.values_mut() {
                members.remove(normal);
            }
        }
        let mut found: SmallVec<[(ItemKey, Item); 2]> = SmallVec::new();
        let mut missing: SmallVec<[Missing; 1]> = SmallVec::new();
        let inline = self.inline_lists;
        // An entry (`#entry=`) is a member: it exists on the member type's stream only, whose
        // `Any` it is; on the collection type's stream it would be the wrong type.
        let entries_here = list
            .as_ref()
            .is_some_and(|l| *l.member_type_url == *self.type_url);
        let secrets = self.secrets.as_ref();
        let revision = snapshot.revision;
        let resolve = |spelling: &str, params: &Arc<ParamSet>| match &list {
            None => resource.as_ref().and_then(|r| {
                resolve_shared(revision, r, params)
                    .filter(|&i| secrets.is_none_or(|access| access.serves(r, i)))
                    .map(|i| (r.clone(), i))
            }),
            Some(_) if !entries_here && lists::names_entry(spelling) => None,
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
        // Inline: a stream subscribes to a name by one locator or a few.
        let locators: SmallVec<[(Arc<str>, Arc<ParamSet>); 2]> = self
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
        // Parsed only for globs to match: most streams have none, and every refresh of every
        // stream passes here.
        if resource.is_some()
            && !self.globs.is_empty()
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
            if let Some(at) = previous.iter().position(|p| *p == key) {
                previous.swap_remove(at);
                if let std::collections::btree_map::Entry::Occupied(mut held) =
                    self.desired.entry(key)
                {
                    // The stored key, not the lookup's: keys stay shared.
                    let key = held.key().clone();
                    held.insert(item);
                    if **key.name() != *normal {
                        others.push(key.clone());
                    }
                    self.dirty.insert(key);
                }
                continue;
            }
            if self.desired.contains_key(&key) {
                continue;
            }
            if **key.name() != *normal {
                others.push(key.clone());
            }
            self.dirty.insert(key.clone());
            self.desired.insert(key, item);
        }
        for key in previous {
            // The stored key, not the lookup's: keys stay shared.
            if let Some((key, _)) = self.desired.remove_entry(&key) {
                self.dirty.insert(key);
            }
        }
        if !others.is_empty() {
            self.by_normal.insert(normal.to_owned(), others);
        }
        if !missing.is_empty() {
            self.missing.extend(missing);
        }
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
    pub(super) fn adopt_reported(&mut self, normal: &str, resource: Option<&Arc<IndexedResource>>) {
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

/// The name prefix every member of the glob `url` starts with, for a scan of the index (which
/// `glob_matches` then filters). A root glob's members include the resource with an empty id
/// (`xdstp://A/T?ctx`, as Envoy's `WatchMap` and `XdstpUrn::collection` count it), which has
/// no `/` after the type.
pub(in crate::machine) fn glob_scan_prefix(url: &XdstpUrl) -> String {
    let text = url.to_string();
    let path = text
        .split('?')
        .next()
        .unwrap_or(&text)
        .trim_end_matches('*');
    match url.id() {
        "*" => path.trim_end_matches('/').to_owned(),
        _ => path.to_owned(),
    }
}

/// The variant of `resource` a subscriber with `params` receives (`VariantMatcher::resolve`),
/// remembered per thread for the last few pairs of the snapshot at `revision`: the streams a
/// revision reaches resolve the changed resource one after another on a worker thread, and
/// those with equal parameters share one `Arc` (`crate::intern`), so most find the answer of
/// the stream before. Keyed by the two `Arc`s, which it holds (equal pointers are then equal
/// contents); emptied by the thread's first resolution at another revision, so it keeps at
/// most eight resources a snapshot no longer has, until the thread computes again.
fn resolve_shared(
    revision: u64,
    resource: &Arc<IndexedResource>,
    params: &Arc<ParamSet>,
) -> Option<usize> {
    const SLOTS: usize = 8;
    type Slot = (Arc<IndexedResource>, Arc<ParamSet>, Option<usize>);
    #[derive(Default)]
    struct Memo {
        revision: u64,
        next: usize,
        slots: [Option<Slot>; SLOTS],
    }
    thread_local! {
        static MEMO: std::cell::RefCell<Memo> = Default::default();
    }
    MEMO.with_borrow_mut(|memo| {
        if memo.revision != revision {
            *memo = Memo {
                revision,
                ..Default::default()
            };
        }
        let found = memo
            .slots
            .iter()
            .flatten()
            .find(|(r, p, _)| Arc::ptr_eq(r, resource) && Arc::ptr_eq(p, params));
        if let Some(&(_, _, variant)) = found {
            return variant;
        }
        let variant = resource.matcher.resolve(&**params);
        let at = memo.next;
        memo.slots[at] = Some((resource.clone(), params.clone(), variant));
        memo.next = (at + 1) % SLOTS;
        variant
    })
}
