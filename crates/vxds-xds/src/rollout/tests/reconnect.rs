//! A node that reconnects (a drain, a connection's maximum age) answers for what its previous
//! stream left open: until it does, or the grace passes, the revision is not complete.

use std::time::Duration;

use super::*;

fn with_grace(grace: Duration) -> Arc<Rollouts> {
    Arc::new(Rollouts::default().with_reconnect_grace(grace))
}

/// Review F: the only stream a revision concerned reconnects before answering; the new
/// stream refuses it. Counted gone at once, the revision was complete meanwhile, and stayed
/// so.
#[test]
fn a_reconnecting_node_answers_for_what_its_previous_stream_left_open() {
    let r = with_grace(RECONNECT_GRACE);
    let mut a = Client::new(r.clone(), 1);
    a.rollout.identify("ads", "node-a");
    dispatch(&r, 5, 1);
    a.computed(5, &[5], &[LDS]);
    drop(a);
    // Still to answer: not complete.
    assert_eq!(counts(&record(&r, 5)), (0, 1, 0, 0, 1, 0));
    // Another node's stream does not take it over.
    let mut other = Client::new(r.clone(), 2);
    other.rollout.identify("ads", "node-b");
    assert_eq!(other.open_revisions(), 0);
    // The node's new stream gets its state (from snapshot 5) and refuses it.
    let mut b = Client::new(r.clone(), 3);
    b.rollout.identify("ads", "node-a");
    b.computed(5, &[], &[LDS]);
    b.nacked(LDS, "node-a", "cannot bind");
    let five = record(&r, 5);
    assert_eq!(counts(&five), (0, 1, 0, 1, 0, 0));
    assert_eq!(five.nacks[0].error, "cannot bind");
}

#[test]
fn a_reconnecting_node_that_accepts_completes_the_revision() {
    let r = with_grace(RECONNECT_GRACE);
    let mut a = Client::new(r.clone(), 1);
    a.rollout.identify("ads", "node-a");
    dispatch(&r, 5, 1);
    a.computed(5, &[5], &[CDS, LDS]);
    a.acked(CDS);
    drop(a);
    let mut b = Client::new(r.clone(), 2);
    b.rollout.identify("ads", "node-a");
    // Its first computation sends clusters; listeners come once it asks for them.
    b.computed(5, &[], &[CDS]);
    b.acked(CDS);
    assert_eq!(record(&r, 5).pending, 1);
    b.computed(5, &[], &[LDS]);
    b.acked(LDS);
    assert_eq!(counts(&record(&r, 5)), (0, 1, 1, 0, 0, 0));
}

/// A Delta client reconnects reporting what it holds: what it already has is not sent
/// again, so no answer comes; holding it in sync is accepting it.
#[test]
fn a_reconnecting_delta_node_holding_the_revision_already_completes_it() {
    let r = with_grace(RECONNECT_GRACE);
    let mut a = Client::delta(r.clone(), 1);
    a.rollout.identify("ads", "node-a");
    dispatch(&r, 5, 1);
    a.sent(5, &[5], &[(CDS, &["c"], &[])]);
    drop(a);
    let mut b = Client::delta(r.clone(), 2);
    b.rollout.identify("ads", "node-a");
    b.sent(5, &[], &[]);
    assert_eq!(record(&r, 5).pending, 1);
    b.machine.in_sync.insert(CDS.to_owned());
    b.sent(5, &[], &[]);
    assert_eq!(counts(&record(&r, 5)), (0, 1, 1, 0, 0, 0));
}

/// A node that does not come back within the grace is gone; a refused revision stays
/// refused whoever comes next.
#[test]
fn what_no_new_stream_takes_over_within_the_grace_is_gone() {
    let r = with_grace(Duration::from_millis(1));
    let mut a = Client::new(r.clone(), 1);
    a.rollout.identify("ads", "node-a");
    dispatch(&r, 5, 1);
    a.computed(5, &[5], &[LDS]);
    dispatch(&r, 6, 1);
    a.computed(6, &[6], &[CDS]);
    a.nacked(CDS, "node-a", "bad");
    drop(a);
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(counts(&record(&r, 5)), (0, 1, 0, 0, 0, 1));
    assert_eq!(counts(&record(&r, 6)), (0, 1, 0, 1, 0, 0));
    let mut b = Client::new(r.clone(), 2);
    b.rollout.identify("ads", "node-a");
    assert_eq!(b.open_revisions(), 0);
}
