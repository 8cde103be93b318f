//! Held-back removals (make-before-break): a revision waits, by name, for the removals it
//! made due, and for the responses that carry them to be accepted.

use super::*;

#[test]
fn a_revision_of_held_back_removals_waits_for_them() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    // Revision 2 deletes a listener while the CDS response is unanswered: nothing sent.
    dispatch(&r, 2, 1);
    a.computed_holding(2, &[2], &[], &[(LDS, "l", true)]);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 0, 1, 0));
    // The CDS ACK releases the removal (sent from the request path), still pending.
    a.acked(CDS);
    assert_eq!(record(&r, 1).acked, 1);
    assert_eq!(record(&r, 2).pending, 1);
    a.computed_holding(2, &[], &[LDS], &[]);
    assert_eq!(record(&r, 2).pending, 1);
    a.acked(LDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
}

/// Review finding 5: removals held back stop being due without anything going (the
/// resource came back, the client unsubscribed): the revision waited for nothing more
/// than what its client already accepted.
#[test]
fn a_revision_whose_held_back_removals_are_no_longer_due_completes() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    dispatch(&r, 2, 1);
    a.computed_holding(2, &[2], &[LDS], &[(CDS, "c", true)]);
    a.acked(LDS);
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 0, 1, 0));
    // Revision 3 puts the deleted resource back as the client holds it: nothing to send,
    // nothing to remove.
    dispatch(&r, 3, 1);
    a.computed_holding(3, &[3], &[], &[]);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
}

/// Review finding 5: held-back removals are their type's and their revision's: a later
/// revision that removes nothing does not wait for them, what else goes meanwhile is not
/// theirs, and an ACK of the type at their revision is not the ACK of their response.
#[test]
fn held_back_removals_belong_to_their_revision_and_type() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    // Revision 2 deletes a listener while the CDS response is unanswered.
    dispatch(&r, 2, 1);
    a.computed_holding(2, &[2], &[], &[(LDS, "l", true)]);
    // Revision 3 updates a route; the listener's removal still waits.
    dispatch(&r, 3, 1);
    a.computed_holding(3, &[3], &[RDS], &[(LDS, "l", false)]);
    a.acked(RDS);
    assert_eq!(counts(&record(&r, 3)), (0, 1, 1, 0, 0, 0));
    assert_eq!(record(&r, 2).pending, 1);
    // Revision 4 updates a listener, accepted before the removal goes.
    dispatch(&r, 4, 1);
    a.computed_holding(4, &[4], &[LDS], &[(LDS, "l", false)]);
    a.acked(CDS);
    // The removal goes (with a route update of revision 4's, which is not revision 2's).
    a.computed_holding(4, &[], &[RDS, LDS], &[]);
    let removal = a.latest[LDS];
    a.acked(RDS);
    assert_eq!(record(&r, 2).pending, 1);
    // The listener update's ACK (revision 4 is later than 2) does not accept the removal.
    a.rollout.acked(LDS, Some(removal - 2));
    assert_eq!(record(&r, 4).acked, 1);
    assert_eq!(record(&r, 2).pending, 1);
    a.acked(LDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
}

/// Review D: a revision waits for the removals it made due, not for those a later revision
/// made due of the same type.
#[test]
fn a_revision_waits_only_for_the_removals_it_made_due() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    // Revisions 2 and 3 delete a listener each while the CDS response is unanswered.
    dispatch(&r, 2, 1);
    a.computed_holding(2, &[2], &[], &[(LDS, "l1", true)]);
    dispatch(&r, 3, 1);
    a.computed_holding(3, &[3], &[], &[(LDS, "l1", false), (LDS, "l2", true)]);
    a.acked(CDS);
    // l1 goes; l2 stays held back (what the client accepted still names it, say).
    a.computed_holding(3, &[], &[LDS], &[(LDS, "l2", false)]);
    a.acked(LDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
    assert_eq!(counts(&record(&r, 3)), (0, 1, 0, 0, 1, 0));
}
