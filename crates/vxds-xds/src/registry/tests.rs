//! The registry without streams: marks, coalescing, dispatch and publication.

use super::*;

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

fn snapshot(revision: u64) -> Arc<Snapshot> {
    let mut snapshot = Snapshot::default();
    snapshot.revision = revision;
    Arc::new(snapshot)
}

fn interest(type_url: &str, names: &[&str], wildcard: bool) -> StreamInterest {
    let mut interest = StreamInterest::new();
    interest.insert(
        type_url.to_owned(),
        crate::machine::Interest {
            names: names.iter().map(|n| Arc::from(*n)).collect(),
            wildcard,
            collections: BTreeSet::new(),
        },
    );
    interest
}

fn key(type_url: &str, name: &str) -> ChangedKey {
    Arc::new(vxds_store::ResourceKey {
        type_url: type_url.into(),
        name: name.to_owned(),
    })
}

fn names(marked: &Marked) -> Vec<&str> {
    let keys = marked.keys.as_ref().expect("keys, not everything");
    keys.iter().map(|k| k.name.as_str()).collect()
}

/// A revision marks every stream it concerns once, with the changed keys it subscribes
/// to (once each, however many of its subscriptions name them), shared between the
/// inboxes; the rollout record counts each marked stream once.
#[test]
fn a_dispatch_marks_each_stream_once_with_shared_keys() {
    let registry = Arc::new(Registry::new(snapshot(1)));
    let both = registry.register(1, Arc::default());
    let named = registry.register(2, Arc::default());
    let other = registry.register(3, Arc::default());
    registry.set_interest(1, interest(CDS, &["c0"], true));
    registry.set_interest(2, interest(CDS, &["c1"], false));
    registry.set_interest(3, interest(LDS, &[], true));
    let changed: BTreeSet<ChangedKey> = [key(CDS, "c0"), key(CDS, "c1")].into();
    registry.dispatch(snapshot(2), Some(changed));

    let (both, named, other) = (both.inbox.take(), named.inbox.take(), other.inbox.take());
    assert_eq!(names(&both), ["c0", "c1"]);
    assert_eq!(names(&named), ["c1"]);
    assert!(names(&other).is_empty());
    let revisions = |m: &Marked| m.revisions.iter().map(|&(r, _)| r).collect::<Vec<_>>();
    assert_eq!((revisions(&both), revisions(&named)), (vec![2], vec![2]));
    assert!(other.revisions.is_empty());
    let c1 = |m: &Marked| {
        m.keys
            .as_ref()
            .and_then(|k| k.iter().find(|k| k.name == "c1").cloned())
            .expect("c1")
    };
    assert!(Arc::ptr_eq(&c1(&both), &c1(&named)));
    match registry.rollouts.get(2) {
        crate::rollout::Known::Record(record) => assert_eq!(record.undecided, 2),
        known => panic!("{known:?}"),
    }
}

/// Marks that coalesce in a busy stream's inbox keep each key once, in order, whatever
/// order they come in.
#[test]
fn coalesced_marks_hold_each_key_once_in_order() {
    let registry = Arc::new(Registry::new(snapshot(1)));
    let stream = registry.register(1, Arc::default());
    let (c0, c1, c2, c3) = (
        key(CDS, "c0"),
        key(CDS, "c1"),
        key(CDS, "c2"),
        key(CDS, "c3"),
    );
    stream.inbox.mark([&c1, &c3], 2, 0);
    stream.inbox.mark([&c0, &c1, &c2], 3, 0);
    stream.inbox.mark([&c3], 4, 0);
    let marked = stream.inbox.take();
    assert_eq!(names(&marked), ["c0", "c1", "c2", "c3"]);
    assert_eq!(
        marked.revisions.iter().map(|&(r, _)| r).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    // Taken: a new mark starts afresh.
    stream.inbox.mark([&c2], 5, 0);
    assert_eq!(names(&stream.inbox.take()), ["c2"]);
}

/// Stream ids are sequential: their hashes differ, in the low bits too (a table's
/// buckets), and in the high bits (its tags).
#[test]
fn stream_ids_hash_apart() {
    let hash = |id: u64| {
        let mut hasher = IdHasher::default();
        hasher.write_u64(id);
        hasher.finish()
    };
    let low: HashSet<u64> = (0..4096).map(|id| hash(id) & 4095).collect();
    assert_eq!(low.len(), 4096);
    let high: HashSet<u64> = (0..4096).map(|id| hash(id) >> 57).collect();
    assert_eq!(high.len(), 128);
}
