//! A SotW response's state — the items it carries in key order, its version, its entries and
//! their encoding — shared by every stream whose response carries the same items (issue 24: at
//! fan-out every SotW stream of a type that resolves alike sends the same state, and its
//! version's hash, its entries and their encoding were most of a SotW stream's own cost per
//! revision). A memo per runtime thread, by the items' pointers: the index's `Arc`s, so equal
//! pointers are equal contents, and a different pointer with equal contents only misses.
//!
//! Bounded: a memo keeps the states computed from one revision's snapshot (the last its
//! thread computed from), at most [`MEMO_MAX_ENTRIES`] of them carrying at most
//! [`MEMO_MAX_BYTES`] of bodies, none of more than [`MEMO_MAX_ITEMS`] items or a quarter of
//! those bytes, and no secrets. A state is encoded once only when a second response carries
//! it. A state outlives the memo
//! only in the responses that carry it, until their clients answer.

use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use vxds_envoy::resource::content_hash;

use super::{Item, ItemKey};
use crate::wire::{SotwEntry, SotwResources};

/// What a SotW response carries, whole.
#[derive(Debug)]
pub(crate) struct SotwState {
    type_url: Arc<str>,
    items: Vec<(ItemKey, Item)>,
    version: Arc<str>,
    /// Kept in the memo, so that other streams' responses may carry it.
    memoized: bool,
    /// Responses built of it, bare where they may be and all wrapped (`RESOURCE_IN_SOTW`).
    uses: [AtomicU32; 2],
    /// The entries of each form, encoded once from the second response of the form on: a
    /// state sent once is encoded into its stream's buffer only, never held twice.
    entries: [OnceLock<SotwResources>; 2],
}

impl SotwState {
    /// The state of `items`, in key order, computed for one response.
    pub(super) fn new(type_url: &Arc<str>, items: Vec<(ItemKey, Item)>) -> Self {
        Self::computed(type_url, items, false)
    }

    fn computed(type_url: &Arc<str>, items: Vec<(ItemKey, Item)>, memoized: bool) -> Self {
        let version = Arc::from(sotw_version(
            type_url,
            items.iter().map(|(k, item)| (k, item.version())),
        ));
        Self {
            type_url: type_url.clone(),
            items,
            version,
            memoized,
            uses: Default::default(),
            entries: Default::default(),
        }
    }

    /// The items, in key order.
    pub(super) fn items(&self) -> &[(ItemKey, Item)] {
        &self.items
    }

    pub(super) fn version(&self) -> &Arc<str> {
        &self.version
    }

    /// The response's entries, all wrapped when the client asks for it.
    pub(super) fn resources(&self, wrap_all: bool) -> SotwResources {
        let build = || -> Vec<SotwEntry> {
            (self.items.iter())
                .map(|(key, item)| sotw_entry(key, item, wrap_all))
                .collect()
        };
        let form = usize::from(wrap_all);
        if let Some(shared) = self.entries[form].get() {
            return shared.clone();
        }
        if !self.memoized || self.uses[form].fetch_add(1, Ordering::Relaxed) == 0 {
            return build().into();
        }
        self.entries[form]
            .get_or_init(|| SotwResources::encoded(build()))
            .clone()
    }

    /// Its chosen variants' bodies, as the memo counts them.
    fn body_bytes(&self) -> usize {
        (self.items.iter())
            .map(|(_, item)| item.variant().body.len())
            .sum()
    }

    /// Whether it carries exactly `items` of `type_url`: the same indexed variants, named alike.
    fn carries<'a>(
        &self,
        type_url: &str,
        mut items: impl Iterator<Item = (&'a ItemKey, &'a Item)>,
    ) -> bool {
        *self.type_url == *type_url
            && self.items.iter().all(|(key, item)| {
                items
                    .next()
                    .is_some_and(|(k, i)| same_key(key, k) && item.same(i))
            })
            && items.next().is_none()
    }
}

/// The same key by pointer: the index's and the subscriptions' shared names.
fn same_key(a: &ItemKey, b: &ItemKey) -> bool {
    match (a, b) {
        (ItemKey::Name(a), ItemKey::Name(b)) => Arc::ptr_eq(a, b),
        (ItemKey::Variant(a, x), ItemKey::Variant(b, y)) => Arc::ptr_eq(a, b) && x == y,
        _ => false,
    }
}

/// The state of `items` (in key order) of `type_url`, computed from the snapshot of
/// `revision`: another stream's, when its response carried the same items, else computed now
/// and kept for the others.
pub(super) fn shared_state<'a>(
    type_url: &Arc<str>,
    revision: u64,
    items: impl ExactSizeIterator<Item = (&'a ItemKey, &'a Item)> + Clone,
) -> Arc<SotwState> {
    let owned = || items.clone().map(|(k, i)| (k.clone(), i.clone())).collect();
    // Secrets are not kept: an old key stays in memory no longer than a response carries it.
    if items.len() > MEMO_MAX_ITEMS || **type_url == *crate::types::SECRET {
        return Arc::new(SotwState::new(type_url, owned()));
    }
    let mut hasher = Fingerprint::default();
    type_url.hash(&mut hasher);
    for (key, item) in items.clone() {
        let (name, id) = match key {
            ItemKey::Name(n) => (n, None),
            ItemKey::Variant(n, id) => (n, Some(id)),
        };
        Arc::as_ptr(name).cast::<u8>().hash(&mut hasher);
        id.hash(&mut hasher);
        Arc::as_ptr(&item.resource).hash(&mut hasher);
        item.variant.hash(&mut hasher);
        item.constrained.hash(&mut hasher);
    }
    let fingerprint = hasher.finish();
    MEMO.with_borrow_mut(|memo| {
        if memo.revision != revision {
            // Another revision: what the memo holds is of no use to the streams any more.
            memo.clear();
            memo.revision = revision;
        }
        if let Some(state) = memo.states.get(&fingerprint)
            && state.carries(type_url, items.clone())
        {
            return state.clone();
        }
        let mut state = SotwState::computed(type_url, owned(), true);
        let bytes = state.body_bytes();
        // A state too large for the memo goes alone: the memo's bound holds.
        if bytes > MEMO_MAX_BYTES / 4 {
            state.memoized = false;
            return Arc::new(state);
        }
        let state = Arc::new(state);
        if memo.states.len() >= MEMO_MAX_ENTRIES || memo.bytes + bytes > MEMO_MAX_BYTES {
            memo.clear();
        }
        if let Some(replaced) = memo.states.insert(fingerprint, state.clone()) {
            memo.bytes = memo.bytes.saturating_sub(replaced.body_bytes());
        }
        memo.bytes += bytes;
        state
    })
}

/// The states of one revision, by their items' fingerprint.
#[derive(Default)]
struct Memo {
    revision: u64,
    states: std::collections::HashMap<u64, Arc<SotwState>, BuildHasherDefault<Fingerprint>>,
    /// The bodies the states carry (their chosen variants').
    bytes: usize,
}

impl Memo {
    fn clear(&mut self) {
        self.states.clear();
        self.bytes = 0;
    }
}

thread_local! {
    /// One per thread: the runtime's workers fan out side by side, never waiting for one
    /// another's lock, each computing a state once.
    static MEMO: std::cell::RefCell<Memo> = Default::default();
}

/// States kept per revision: one per distinct subscription and parameters that resolve
/// differently (a few for wildcard LDS and CDS; EDS and RDS by name may have one per
/// client); emptied when full.
const MEMO_MAX_ENTRIES: usize = 4096;
/// The bodies the kept states may carry, per thread (a quarter of it at most for one). Their
/// encodings, of the forms several responses carry, add about as much again per form; the
/// states also keep the other variants of their resources until the thread computes from
/// another revision.
const MEMO_MAX_BYTES: usize = 16 << 20;
/// States of more items are computed per response: their fingerprint and comparison cost about
/// what they save, and the memo would hold their encoding.
const MEMO_MAX_ITEMS: usize = 1024;

/// A SotW response's version: a hash of the type and of each entry's key and version (the
/// label `{key:?}={version}`). Computed by every SotW stream for every response: the labels are
/// written into one buffer, and a plain name's label without the formatting machinery.
fn sotw_version<'a>(
    type_url: &str,
    entries: impl Iterator<Item = (&'a ItemKey, &'a Arc<str>)>,
) -> String {
    use std::fmt::Write;
    let mut labels = String::new();
    let mut ends = Vec::new();
    for (key, version) in entries {
        match key {
            // `{key:?}` spelled out: the same bytes when nothing in the name needs escaping.
            ItemKey::Name(name) if !name.chars().any(|c| c.escape_debug().len() != 1) => {
                labels.push_str("Name(\"");
                labels.push_str(name);
                labels.push_str("\")=");
                labels.push_str(version);
            }
            _ => {
                let _ = write!(labels, "{key:?}={version}");
            }
        }
        ends.push(labels.len());
    }
    let mut parts: Vec<&[u8]> = Vec::with_capacity(ends.len() + 1);
    parts.push(type_url.as_bytes());
    let mut start = 0;
    for end in ends {
        parts.push(&labels.as_bytes()[start..end]);
        start = end;
    }
    content_hash("vxds.sotw.v1", &parts)
}

/// The memo's hash of a state's items (pointers and ids), a word at a time: every SotW stream
/// computes one per response, and SipHash made it most of the memo's cost. Only a key: a
/// collision is caught by [`SotwState::carries`]; the version itself is SHA-256.
#[derive(Clone, Copy, Default)]
struct Fingerprint(u64);

impl std::hash::Hasher for Fingerprint {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.write_u64(u64::from_le_bytes(word.try_into().unwrap_or_default()));
        }
        let mut tail = [0u8; 8];
        tail[..words.remainder().len()].copy_from_slice(words.remainder());
        self.write_u64(u64::from_le_bytes(tail) ^ (bytes.len() as u64) << 56);
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}
/// A SotW entry: wrapped in `Resource` when named with constraints, when it carries a TTL,
/// when it is a redirect (TP1: a `ResourceLocator` in a `Resource`), or when the client asks
/// for every resource wrapped; bare otherwise.
pub(super) fn sotw_entry(key: &ItemKey, item: &Item, wrap_all: bool) -> SotwEntry {
    if item.constrained || wrap_all || item.ttl().is_some() || item.variant().redirect {
        SotwEntry::Wrapped(item.wrapped(key.name()))
    } else {
        SotwEntry::Bare(item.variant().body.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version is the hash of `{key:?}={version}` labels, however they are written.
    #[test]
    fn sotw_version_hashes_the_debug_labels() {
        let keys = [
            ItemKey::Name("c0".into()),
            ItemKey::Name("xdstp://a/envoy.config.cluster.v3.Cluster/x?k=v".into()),
            ItemKey::Name("quote\"tab\tend".into()),
            ItemKey::Name("ünï".into()),
            ItemKey::Variant("v".into(), vxds_core::ConstraintsId::MIN),
        ];
        let versions: Vec<Arc<str>> = (0..keys.len()).map(|i| format!("h{i}").into()).collect();
        let labels: Vec<String> = keys
            .iter()
            .zip(&versions)
            .map(|(k, v)| format!("{k:?}={v}"))
            .collect();
        let mut parts: Vec<&[u8]> = vec![b"t"];
        parts.extend(labels.iter().map(|l| l.as_bytes()));
        assert_eq!(
            sotw_version("t", keys.iter().zip(&versions)),
            content_hash("vxds.sotw.v1", &parts)
        );
        assert_ne!(
            sotw_version("t", keys.iter().zip(&versions).take(4)),
            content_hash("vxds.sotw.v1", &parts)
        );
    }
}
