//! What a Delta refusal of a large response, and what the client sends after it, cost: in
//! proportion to the names, never to their product (a client controls both).
use super::*;
use crate::rollout::stream::NAMES_HASHED;

struct Nothing;
impl Subscriptions for Nothing {
    fn subscribes(&self, _: &str, _: &str) -> bool {
        false
    }
    fn still_names(&self, _: &str, _: &Arc<str>, _: &str, _: &str) -> bool {
        false
    }
    fn in_sync(&self, _: &str) -> bool {
        false
    }
}

fn big(n: usize, nonce: u64) -> Response {
    Response::Delta(crate::wire::DeltaResponse {
        type_url: CDS.into(),
        nonce: nonce.to_string(),
        resources: (0..n)
            .map(|i| crate::wire::Wrapped {
                name: format!("cluster-{i:06}").into(),
                naming: crate::wire::Naming::Legacy,
                version: "v".into(),
                body: None,
                ttl: None,
            })
            .collect(),
        ..Default::default()
    })
}

fn hashed() -> u64 {
    NAMES_HASHED.with(std::cell::Cell::get)
}

/// A stream whose 8,000-name response, for `revisions` coalesced revisions, was refused.
fn refused(n: usize, revisions: u64) -> (Arc<Rollouts>, StreamRollout) {
    let r = Arc::new(Rollouts::default());
    let mut s = StreamRollout::new(r.clone(), 1).delta();
    let marks: Vec<Mark> = (1..=revisions)
        .map(|rev| {
            r.dispatching(rev - 1, rev, None);
            r.marked(rev);
            Mark {
                epoch: 0,
                revision: rev,
                types: TypeMask::ALL,
            }
        })
        .collect();
    let responses = [big(n, 1)];
    s.computed(
        Computation {
            epoch: 0,
            revision: revisions,
            marked: &marks,
            responses: &responses,
            held: &[],
            dependencies: &[],
        },
        &Nothing,
    );
    s.nacked(CDS, Some(1), "node", "bad");
    assert_eq!(s.refused_names(), n * revisions as usize);
    (r, s)
}

#[test]
fn a_delta_refusal_of_a_large_response_and_its_repair_are_linear() {
    let n = 8_000;
    let (r, mut s) = refused(n, 8);
    for rev in 1..=8 {
        assert_eq!(record(&r, rev).nacked, 1);
    }
    // The next response carries them all again, and is accepted.
    let responses = [big(n, 2)];
    let before = hashed();
    s.computed(
        Computation {
            epoch: 0,
            revision: 8,
            marked: &[],
            responses: &responses,
            held: &[],
            dependencies: &[],
        },
        &Nothing,
    );
    s.acked(CDS, Some(2));
    assert_eq!(hashed() - before, n as u64, "each name hashed once");
    assert_eq!(s.refused_names(), 0);
}

#[test]
fn a_large_delta_unsubscription_after_a_large_refusal_is_linear() {
    let (_, mut s) = refused(8_000, 1);
    // One request unsubscribing from 100,000 names it never held (a few MB).
    let names: Vec<String> = (0..100_000).map(|i| format!("junk-{i:08}")).collect();
    let before = hashed();
    s.unsubscribed(CDS, &names);
    assert_eq!(hashed() - before, 100_000, "each name hashed once");
    assert_eq!(s.refused_names(), 8_000);
    // And from what it refused: nothing of the revision is left refused.
    let names: Vec<String> = (0..8_000).map(|i| format!("cluster-{i:06}")).collect();
    s.unsubscribed(CDS, &names);
    assert_eq!(s.refused_names(), 0);
}
