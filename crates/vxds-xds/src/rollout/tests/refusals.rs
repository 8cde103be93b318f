//! How refusals count and settle: against the revisions that changed the refused type or
//! wait for what the response carried; on SotW until a later response of the type is accepted,
//! on Delta until what was refused is carried again and accepted (or unsubscribed from).

use super::*;

/// Review finding 1: on Delta, a refusal releases the removals it no longer holds back;
/// they go as a response computed from the refused revision, and the client's ACK of
/// them accepts the removals, not the refused update.
#[test]
fn delta_an_ack_of_the_removals_a_refusal_released_does_not_undo_it() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::delta(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.sent(1, &[1], &[(CDS, &["a", "b"], &[])]);
    a.acked(CDS);
    // Revision 2 updates one cluster and deletes another: the update goes, the removal
    // waits for its answer.
    dispatch(&r, 2, 1);
    a.step(
        2,
        Step {
            marked: &[2],
            sent: &[(CDS, &["a"], &[])],
            held: &[(CDS, "b", true)],
            ..Step::default()
        },
    );
    let update = a.latest[CDS];
    // The NACK releases the removal, sent by the computation that follows it; the refusal
    // is recorded after that computation (see `service::record_refusals`).
    a.sent(2, &[], &[(CDS, &[], &["b"])]);
    a.rollout.nacked(CDS, Some(update), "n", "bad");
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 1, 0, 0));
    // The client takes the removal.
    a.acked(CDS);
    let two = record(&r, 2);
    assert_eq!(counts(&two), (0, 1, 0, 1, 0, 0));
    assert_eq!(two.nacks.len(), 1);
    assert_eq!(a.versions(CDS), Some((1, 2)));
    // A later revision that carries the refused cluster again, accepted, settles it.
    dispatch(&r, 3, 1);
    a.sent(3, &[3], &[(CDS, &["a"], &[])]);
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
}

/// On SotW the response after a refusal carries the type's whole state, so accepting it
/// accepts what the refused revision left in place.
#[test]
fn sotw_an_ack_of_a_later_whole_state_at_the_refused_revision_accepts_it() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    let refused = a.latest[CDS];
    a.rollout.nacked(CDS, Some(refused), "n", "bad");
    assert_eq!(record(&r, 1).nacked, 1);
    a.computed(1, &[], &[CDS]);
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 1)), (0, 1, 1, 0, 0, 0));
}

/// Review A (i): on Delta a later revision the client accepts settles a refusal only if its
/// response carried the refused resources again: one that carried others leaves the client
/// on the old version of what it refused.
#[test]
fn delta_a_later_revision_that_does_not_carry_the_refused_resources_leaves_the_refusal() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::delta(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.sent(1, &[1], &[(CDS, &["a", "b"], &[])]);
    a.acked(CDS);
    dispatch(&r, 2, 1);
    a.sent(2, &[2], &[(CDS, &["a"], &[])]);
    a.nacked(CDS, "n", "bad a");
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 1, 0, 0));
    // Revision 3 updates b only: accepted, and a is still the refused one's old version.
    dispatch(&r, 3, 1);
    a.sent(3, &[3], &[(CDS, &["b"], &[])]);
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 3)), (0, 1, 1, 0, 0, 0));
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 1, 0, 0));
    // Revision 4 fixes a: accepted, it settles the refusal.
    dispatch(&r, 4, 1);
    a.sent(4, &[4], &[(CDS, &["a"], &[])]);
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
    assert!(record(&r, 2).nacks.is_empty());
}

/// Review A (ii): revision 2 updates a (refused) and deletes b (held back until the update
/// is answered); revision 3, unrelated, is dispatched meanwhile. The removal of b, released
/// by the refusal and computed from snapshot 3, is accepted: that accepts nothing revision 2
/// refused.
#[test]
fn delta_an_ack_of_removals_computed_after_an_unrelated_revision_leaves_the_refusal() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::delta(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.sent(1, &[1], &[(CDS, &["a", "b"], &[])]);
    a.acked(CDS);
    dispatch(&r, 2, 1);
    a.step(
        2,
        Step {
            marked: &[2],
            sent: &[(CDS, &["a"], &[])],
            held: &[(CDS, "b", true)],
            ..Step::default()
        },
    );
    let update = a.latest[CDS];
    dispatch(&r, 3, 1);
    // The NACK of the update; the computation after it (from snapshot 3) sends revision 3's
    // route and the removal of b it released; the refusal is recorded after it.
    a.step(
        3,
        Step {
            marked: &[3],
            sent: &[(RDS, &["x"], &[]), (CDS, &[], &["b"])],
            ..Step::default()
        },
    );
    a.rollout.nacked(CDS, Some(update), "n", "bad a");
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 1, 0, 0));
    a.acked(CDS);
    a.acked(RDS);
    assert_eq!(counts(&record(&r, 3)), (0, 1, 1, 0, 0, 0));
    let two = record(&r, 2);
    assert_eq!(counts(&two), (0, 1, 0, 1, 0, 0));
    assert_eq!(two.nacks.len(), 1);
}

/// On Delta a refused resource the client unsubscribes from is no longer refused: the next
/// acceptance of its type settles the refusal.
#[test]
fn delta_unsubscribing_from_a_refused_resource_clears_the_refusal() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::delta(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.sent(1, &[1], &[(CDS, &["a", "b"], &[])]);
    a.acked(CDS);
    dispatch(&r, 2, 1);
    a.sent(2, &[2], &[(CDS, &["a"], &[])]);
    a.nacked(CDS, "n", "bad a");
    a.unsubscribed(CDS, &["a"]);
    dispatch(&r, 3, 1);
    a.sent(3, &[3], &[(CDS, &["b"], &[])]);
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
}

/// Review B: a refusal counts against the revisions that changed its type, not against
/// every revision the same computation was told of.
#[test]
fn a_refusal_counts_only_against_revisions_that_changed_its_type() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 4, 1);
    dispatch(&r, 5, 1);
    // 4 changed a route, 5 a cluster; the stream computes both at once.
    a.step(
        5,
        Step {
            marked: &[4, 5],
            changed: &[(4, &[RDS]), (5, &[CDS])],
            sent: &[(CDS, &[], &[]), (RDS, &[], &[])],
            ..Step::default()
        },
    );
    a.nacked(RDS, "n", "bad route");
    assert_eq!(counts(&record(&r, 4)), (0, 1, 0, 1, 0, 0));
    assert_eq!(counts(&record(&r, 5)), (0, 1, 0, 0, 1, 0));
    // And 5 waits for nothing but its clusters.
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 5)), (0, 1, 1, 0, 0, 0));
}
