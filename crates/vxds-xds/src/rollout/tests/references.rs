//! What the resources a revision sent name and the client fetches next (RDS, EDS, SDS, gRPC's
//! chain): the revision waits for it to be sent and accepted, and its refusal refuses it.

use super::*;

/// Review E: Envoy ACKs a listener while it warms, then fetches the route it names: the
/// revision is not rolled out before the route is sent and accepted, and a refusal of the
/// route is a refusal of the revision.
#[test]
fn a_revision_waits_for_what_its_resources_name_and_the_client_fetches_next() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 5, 1);
    a.step(
        5,
        Step {
            marked: &[5],
            sent: &[(LDS, &["l"], &[])],
            needs: &[(LDS, "l", RDS, "r1")],
            ..Step::default()
        },
    );
    a.acked(LDS);
    assert_eq!(counts(&record(&r, 5)), (0, 1, 0, 0, 1, 0));
    // Envoy subscribes to r1; it is sent, and refused (duplicate domains).
    a.subscribe(RDS, "r1");
    a.computed(5, &[], &[RDS]);
    a.nacked(RDS, "n", "duplicate domains");
    let five = record(&r, 5);
    assert_eq!(counts(&five), (0, 1, 0, 1, 0, 0));
    assert_eq!(five.nacks[0].error, "duplicate domains");
}

/// Review E, accepted: the revision completes once the route is accepted, not before.
#[test]
fn a_revision_completes_once_what_its_resources_name_is_accepted() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 5, 1);
    a.step(
        5,
        Step {
            marked: &[5],
            sent: &[(LDS, &["l"], &[])],
            needs: &[(LDS, "l", RDS, "r1")],
            ..Step::default()
        },
    );
    a.acked(LDS);
    // An RDS response before the client asked for r1 does not carry it.
    a.computed(5, &[], &[RDS]);
    a.acked(RDS);
    assert_eq!(record(&r, 5).pending, 1);
    a.subscribe(RDS, "r1");
    a.computed(5, &[], &[RDS]);
    assert_eq!(record(&r, 5).pending, 1);
    a.acked(RDS);
    assert_eq!(counts(&record(&r, 5)), (0, 1, 1, 0, 0, 0));
}

/// Review E on Delta, down gRPC's chain (LDS → RDS → CDS → EDS): each resource fetched next
/// is the revision's until accepted, and what it names in turn too.
#[test]
fn delta_a_revision_follows_the_chain_of_what_its_resources_name() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::delta(r.clone(), 1);
    dispatch(&r, 5, 1);
    a.step(
        5,
        Step {
            marked: &[5],
            sent: &[(LDS, &["l"], &[])],
            needs: &[(LDS, "l", RDS, "r")],
            ..Step::default()
        },
    );
    a.acked(LDS);
    // An RDS response carrying another route does not carry r.
    a.sent(5, &[], &[(RDS, &["other"], &[])]);
    a.acked(RDS);
    assert_eq!(record(&r, 5).pending, 1);
    a.step(
        5,
        Step {
            sent: &[(RDS, &["r"], &[])],
            needs: &[(RDS, "r", CDS, "c")],
            ..Step::default()
        },
    );
    a.acked(RDS);
    assert_eq!(record(&r, 5).pending, 1);
    a.step(
        5,
        Step {
            sent: &[(CDS, &["c"], &[])],
            needs: &[(CDS, "c", EDS, "c")],
            ..Step::default()
        },
    );
    a.acked(CDS);
    assert_eq!(record(&r, 5).pending, 1);
    a.sent(5, &[], &[(EDS, &["c"], &[])]);
    a.nacked(EDS, "n", "bad endpoints");
    assert_eq!(counts(&record(&r, 5)), (0, 1, 0, 1, 0, 0));
    // The endpoints fixed by revision 6: both accepted.
    dispatch(&r, 6, 1);
    a.sent(6, &[6], &[(EDS, &["c"], &[])]);
    a.acked(EDS);
    assert_eq!(counts(&record(&r, 6)), (0, 1, 1, 0, 0, 0));
    assert_eq!(counts(&record(&r, 5)), (0, 1, 1, 0, 0, 0));
}

/// Review E: what a resource named stops being the revision's when what the client was sent
/// of that resource no longer names it (a later revision removed the listener before the
/// client fetched its route), or when the client unsubscribes from it.
#[test]
fn a_revision_stops_waiting_for_what_is_no_longer_named() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::delta(r.clone(), 1);
    dispatch(&r, 5, 1);
    a.step(
        5,
        Step {
            marked: &[5],
            sent: &[(LDS, &["l", "m"], &[])],
            needs: &[(LDS, "l", RDS, "r1"), (LDS, "m", RDS, "r2")],
            ..Step::default()
        },
    );
    a.acked(LDS);
    assert_eq!(record(&r, 5).pending, 1);
    // Revision 6 removes l.
    dispatch(&r, 6, 1);
    a.unname(LDS, "l", RDS, "r1");
    a.sent(6, &[6], &[(LDS, &[], &["l"])]);
    a.acked(LDS);
    assert_eq!(counts(&record(&r, 6)), (0, 1, 1, 0, 0, 0));
    assert_eq!(record(&r, 5).pending, 1);
    // r2 is sent and the client unsubscribes before answering (it refuses nothing).
    a.subscribe(RDS, "r2");
    a.sent(6, &[], &[(RDS, &["r2"], &[])]);
    a.unsubscribed(RDS, &["r2"]);
    assert_eq!(counts(&record(&r, 5)), (0, 1, 1, 0, 0, 0));
}
