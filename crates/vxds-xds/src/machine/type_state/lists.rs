//! TP1 list collections on one stream. A subscription to `xdstp://A/<T>Collection/path?ctx`
//! is answered with the stored collection of that name, if an operator stored one, else with a
//! collection built from exactly the members the glob `xdstp://A/<T>/path/*?ctx` would deliver,
//! each resolved to the subscriber's variant (a member none of whose variants matches is left
//! out; no member at all: the collection does not exist). Entries are locators, or inline when
//! the client advertises [`INLINE_ENTRIES_FEATURE`] or the operator stored a
//! `vxds.config.v1.ListCollectionOptions` of the collection's name that asks for them (for this
//! subscriber's variant of it). `#entry=name` answers with one entry.
//!
//! A collection is a resource made per subscriber, so it is made here, where the subscriber's
//! parameters are known; its version is a hash of what it lists, so it is sent again exactly
//! when a member's variant, the membership or (inline) a body changes.
//!
//! [`INLINE_ENTRIES_FEATURE`]: vxds_envoy::collections::INLINE_ENTRIES_FEATURE

use vxds_envoy::changeset::ResourceKey;
use vxds_envoy::collections::{self, Entry, ListCollection};
use vxds_envoy::resource::content_hash;

use super::*;

impl TypeState {
    /// Notes `spelling` as a list collection, if it names one.
    pub(super) fn track_list(&mut self, spelling: &str) {
        // A collection is answered on its own type's stream, or on its members' (TP1's example
        // asks for a ListenerCollection on the LDS stream); on any other type's stream it does
        // not exist.
        if let Some(list) = ListCollection::parse(spelling).filter(|l| {
            *l.collection_type_url == *self.type_url || *l.member_type_url == *self.type_url
        }) {
            self.lists.insert(
                list.urn.to_string(),
                ListCollection {
                    entry: None,
                    ..list
                },
            );
        }
    }

    /// Forgets the list collection `normal` once nothing subscribes to it any more.
    pub(super) fn untrack_list(&mut self, normal: &str) {
        if self.lists.contains_key(normal)
            && !self.names.contains_key(normal)
            && !self.names_by_normal.contains_key(normal)
            && self.locators_of(normal).next().is_none()
        {
            self.lists.remove(normal);
        }
    }

    /// What the list collections subscribed to watch in other types: their members (as the
    /// glob collection of the member type) and a stored collection of their own name.
    pub fn list_interest(&self) -> Vec<(String, Interest)> {
        let mut out = Vec::new();
        for (normal, list) in &self.lists {
            out.push((
                list.member_type_url.clone(),
                Interest {
                    collections: BTreeSet::from([list.members.to_string()]),
                    ..Interest::default()
                },
            ));
            for type_url in [
                list.collection_type_url.as_str(),
                collections::LIST_COLLECTION_OPTIONS_TYPE_URL,
            ] {
                out.push((
                    type_url.to_owned(),
                    Interest {
                        names: BTreeSet::from([crate::intern::name(normal)]),
                        ..Interest::default()
                    },
                ));
            }
        }
        out
    }

    /// A resource changed: the list collections it is a member of (or that it is, stored)
    /// are looked at again.
    pub fn list_member_changed(&mut self, key: &ResourceKey) {
        if self.lists.is_empty() {
            return;
        }
        let member = vxds_core::xdstp::XdstpUrn::parse(&key.name).ok();
        let stale: Vec<String> = self
            .lists
            .iter()
            .filter(|(normal, list)| {
                ((key.type_url == list.collection_type_url
                    || key.type_url == collections::LIST_COLLECTION_OPTIONS_TYPE_URL)
                    && key.name == **normal)
                    || (key.type_url == list.member_type_url
                        && member
                            .as_ref()
                            .is_some_and(|m| list.members.glob_matches(m)))
            })
            .map(|(normal, _)| normal.clone())
            .collect();
        self.stale_normals.extend(stale);
    }
}

/// Whether `spelling` names one entry of a list collection (`#entry=`).
pub(super) fn names_entry(spelling: &str) -> bool {
    spelling.contains('#') && entry_of(spelling).is_some()
}

fn entry_of(spelling: &str) -> Option<String> {
    XdstpUrl::parse(spelling)
        .ok()
        .and_then(|u| u.entry().map(str::to_owned))
}

/// What a subscriber with `params` gets for the list collection `list` subscribed to as
/// `spelling` (which may carry `#entry=`): a resource and the variant of it, or `None` when
/// the collection (or the entry) does not exist for it.
pub(super) fn resolve_list(
    list: &ListCollection,
    spelling: &str,
    stored: Option<&Arc<IndexedResource>>,
    params: &ParamSet,
    inline: bool,
    snapshot: &Snapshot,
) -> Option<(Arc<IndexedResource>, usize)> {
    let entry = spelling.contains('#').then(|| entry_of(spelling)).flatten();
    let normal = list.urn.to_string();
    // Streams with equal parameters share what is made: built once per snapshot.
    let key = vxds_store::DerivedKey {
        name: normal.clone(),
        entry: entry.clone(),
        params: params.clone(),
        inline,
    };
    snapshot.derive(key, || {
        build_list(list, normal, entry, stored, params, inline, snapshot)
    })
}

fn build_list(
    list: &ListCollection,
    normal: String,
    entry: Option<String>,
    stored: Option<&Arc<IndexedResource>>,
    params: &ParamSet,
    inline: bool,
    snapshot: &Snapshot,
) -> vxds_store::Derivation {
    let made = |type_url: &str, body: Bytes, version: Arc<str>| {
        let key = ResourceKey {
            type_url: type_url.into(),
            name: normal.clone(),
        };
        Some((
            Arc::new(IndexedResource::synthesized(
                key,
                snapshot.revision,
                body,
                version,
            )),
            0,
        ))
    };

    if let Some(stored) = stored {
        let variant = stored.matcher.resolve(params)?;
        let Some(entry) = entry else {
            return Some((stored.clone(), variant));
        };
        let chosen = &stored.variants[variant];
        let (version, body) = collections::find_inline_entry(&chosen.body, &entry)?;
        // The hand-written entry version alone may stay put while its body changes.
        let version = content_hash(
            "vxds.collection.entry.v1",
            &[
                chosen.version.as_bytes(),
                entry.as_bytes(),
                version.as_bytes(),
            ],
        );
        return made(&list.member_type_url, Bytes::from(body), Arc::from(version));
    }

    // The operator's setting for this subscriber (options have variants like any resource).
    let inline = inline
        || snapshot
            .get(collections::LIST_COLLECTION_OPTIONS_TYPE_URL, &normal)
            .and_then(|options| options.resolve(params))
            .is_some_and(|options| collections::options_inline(&options.body));
    let prefix = super::glob_scan_prefix(&list.members);
    let mut members: Vec<(&Arc<IndexedResource>, usize)> = Vec::new();
    for resource in snapshot.with_prefix(&list.member_type_url, &prefix) {
        let Ok(urn) = vxds_core::xdstp::XdstpUrn::parse(&resource.name) else {
            continue;
        };
        if !list.members.glob_matches(&urn) {
            continue;
        }
        if entry
            .as_deref()
            .is_some_and(|e| ListCollection::entry_name(&urn) != e)
        {
            continue;
        }
        if let Some(variant) = resource.matcher.resolve(params) {
            members.push((resource, variant));
        }
    }
    if entry.is_some() {
        let (resource, variant) = members.pop()?;
        let variant = &resource.variants[variant];
        return made(
            &list.member_type_url,
            variant.body.clone(),
            variant.version.clone(),
        );
    }
    if members.is_empty() {
        return None;
    }

    let redirects: Vec<Option<String>> = members
        .iter()
        .map(|(r, v)| {
            let variant = &r.variants[*v];
            variant
                .redirect
                .then(|| collections::redirect_target(&variant.body))
                .flatten()
        })
        .collect();
    // A member id's last segment that TP1's entry-name pattern refuses makes an anonymous entry.
    let names: Vec<String> = members
        .iter()
        .map(|(r, _)| {
            vxds_core::xdstp::XdstpUrn::parse(&r.name)
                .map(|u| ListCollection::entry_name(&u).to_owned())
                .ok()
                .filter(|n| collections::is_entry_name(n))
                .unwrap_or_default()
        })
        .collect();
    let entries: Vec<Entry<'_>> = members
        .iter()
        .zip(&redirects)
        .zip(&names)
        .map(|(((resource, variant), redirect), name)| {
            let variant = &resource.variants[*variant];
            match redirect {
                // A redirected member is listed where it points.
                Some(target) => Entry::Locator(target),
                None if inline => Entry::Inline {
                    name,
                    version: &variant.version,
                    body: &variant.body,
                },
                None => Entry::Locator(&resource.name),
            }
        })
        .collect();
    let body = collections::encode_collection(&list.collection_type_url, &entries);
    let mut parts: Vec<&[u8]> = vec![
        list.collection_type_url.as_bytes(),
        if inline { b"inline" } else { b"locators" },
    ];
    // What the client is told: inline, each member's variant and body (its version); as
    // locators, which variant each member is (a body change within it is the member's own
    // update, not the collection's) and where a redirect points.
    let ids: Vec<String> = members
        .iter()
        .map(|(r, v)| r.variants[*v].id.to_string())
        .collect();
    for (((resource, variant), id), redirect) in members.iter().zip(&ids).zip(&redirects) {
        parts.push(resource.name.as_bytes());
        if inline {
            parts.push(resource.variants[*variant].version.as_bytes());
        } else {
            parts.push(id.as_bytes());
            parts.push(redirect.as_deref().unwrap_or_default().as_bytes());
        }
    }
    let version = content_hash("vxds.collection.v1", &parts);
    made(
        &list.collection_type_url,
        Bytes::from(body),
        Arc::from(version),
    )
}
