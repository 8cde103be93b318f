//! Unit tests of rollout tracking: per-stream attribution of ACKs and NACKs to revisions,
//! and the per-replica records they update.

use super::*;

const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// A client's stream: numbers its responses as the machine does, and answers the latest
/// of a type unless told which.
struct Client {
    rollout: StreamRollout,
    nonce: u64,
    latest: BTreeMap<&'static str, u64>,
}

impl Client {
    fn new(r: Arc<Rollouts>, id: u64) -> Self {
        Self {
            rollout: StreamRollout::new(r, id),
            nonce: 0,
            latest: BTreeMap::new(),
        }
    }

    /// A Delta stream's.
    fn delta(r: Arc<Rollouts>, id: u64) -> Self {
        Self {
            rollout: StreamRollout::new(r, id).delta(),
            ..Self::new(Arc::new(Rollouts::default()), id)
        }
    }

    fn computed(&mut self, revision: u64, marked: &[u64], types: &[&'static str]) {
        self.computed_holding(revision, marked, types, &[]);
    }

    /// A computation that sent `types` while removals of the types `held` stay held back
    /// (each with whether one became due in this computation).
    fn computed_holding(
        &mut self,
        revision: u64,
        marked: &[u64],
        types: &[&'static str],
        held: &[(&'static str, bool)],
    ) {
        let sent: Vec<(&str, String)> = types
            .iter()
            .map(|&t| {
                self.nonce += 1;
                self.latest.insert(t, self.nonce);
                (t, self.nonce.to_string())
            })
            .collect();
        self.rollout.computed(
            revision,
            marked,
            sent.iter().map(|(t, n)| (*t, n.as_str())),
            held,
        );
    }

    /// A heartbeat: sent, never computed.
    fn heartbeat(&mut self) -> u64 {
        self.nonce += 1;
        self.nonce
    }

    fn acked(&mut self, type_url: &'static str) {
        let nonce = self.latest.get(type_url).copied();
        self.rollout.acked(type_url, nonce);
    }

    fn nacked(&mut self, type_url: &'static str, node: &str, error: &str) {
        let nonce = self.latest.get(type_url).copied();
        self.rollout.nacked(type_url, nonce, node, error);
    }
}

impl std::ops::Deref for Client {
    type Target = StreamRollout;
    fn deref(&self) -> &StreamRollout {
        &self.rollout
    }
}

fn record(r: &Rollouts, revision: u64) -> RolloutRecord {
    match r.get(revision) {
        Known::Record(r) => *r,
        other => panic!("{other:?}"),
    }
}

fn counts(r: &RolloutRecord) -> (u64, u64, u64, u64, u64, u64) {
    (r.undecided, r.streams, r.acked, r.nacked, r.pending, r.gone)
}

/// Revision `n` dispatched to `streams`, published.
fn dispatch(r: &Rollouts, n: u64, streams: usize) {
    r.dispatching(n - 1, n, Some(now_ms()));
    for _ in 0..streams {
        r.marked(n);
    }
    r.published(n);
}

#[test]
fn a_revision_counts_the_streams_it_changed_and_their_answers() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    let mut b = Client::new(r.clone(), 2);
    let mut c = Client::new(r.clone(), 3);
    dispatch(&r, 5, 3);
    assert_eq!(counts(&record(&r, 5)), (3, 0, 0, 0, 0, 0));
    a.computed(5, &[5], &[LDS, CDS]);
    b.computed(5, &[5], &[LDS]);
    // Marked, but nothing it resolves changed: not concerned.
    c.computed(5, &[5], &[]);
    assert_eq!(counts(&record(&r, 5)), (0, 2, 0, 0, 2, 0));
    // Half of a's types accepted: still pending.
    a.acked(LDS);
    assert_eq!(record(&r, 5).pending, 2);
    a.acked(CDS);
    b.nacked(LDS, "node-b", "cannot bind");
    let rec = record(&r, 5);
    assert_eq!(counts(&rec), (0, 2, 1, 1, 0, 0));
    assert_eq!(rec.nacks.len(), 1);
    assert_eq!(rec.nacks[0].node, "node-b");
    assert_eq!(rec.nacks[0].error, "cannot bind");
    assert_eq!(rec.ack_times.count(), 1);
    assert_eq!(a.versions(CDS), Some((5, 5)));
    assert_eq!(b.versions(LDS), Some((0, 5)));

    // A later revision fixes it: b accepts 6, and so counts as having accepted 5.
    dispatch(&r, 6, 1);
    b.computed(6, &[6], &[LDS]);
    assert_eq!(record(&r, 6).pending, 1);
    b.acked(LDS);
    assert_eq!(counts(&record(&r, 6)), (0, 1, 1, 0, 0, 0));
    let rec = record(&r, 5);
    assert_eq!(counts(&rec), (0, 2, 2, 0, 0, 0));
    assert!(rec.nacks.is_empty());
}

#[test]
fn coalesced_revisions_all_concern_the_stream_and_leaving_counts_as_gone() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    dispatch(&r, 2, 1);
    a.computed(2, &[1, 2], &[CDS]);
    assert_eq!(record(&r, 1).pending, 1);
    assert_eq!(record(&r, 2).pending, 1);
    a.acked(CDS);
    assert_eq!(record(&r, 1).acked, 1);
    dispatch(&r, 3, 1);
    a.computed(3, &[3], &[CDS]);
    drop(a);
    assert_eq!(counts(&record(&r, 3)), (0, 1, 0, 0, 0, 1));
    // Told, left before computing.
    dispatch(&r, 4, 1);
    r.undecided_gone(&[4]);
    assert_eq!(counts(&record(&r, 4)), (0, 0, 0, 0, 0, 0));
    // Revisions 5 to 7 reach the streams together: 5 and 6 share 7's record.
    r.dispatching(4, 7, Some(now_ms()));
    r.marked(7);
    r.published(7);
    let mut b = Client::new(r.clone(), 2);
    b.computed(7, &[7], &[CDS]);
    b.acked(CDS);
    let five = record(&r, 5);
    assert_eq!((five.revision, five.streams, five.acked), (5, 1, 1));
}

#[test]
fn a_refusal_of_an_older_response_type_does_not_touch_other_types() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    a.acked(CDS);
    dispatch(&r, 2, 1);
    a.computed(2, &[2], &[LDS]);
    // A NACK of CDS (an unrelated, older response) is no refusal of revision 2.
    a.nacked(CDS, "n", "x");
    assert_eq!(record(&r, 2).nacked, 0);
    a.nacked(LDS, "n", "y");
    assert_eq!(record(&r, 2).nacked, 1);
    // Refused twice (another type): counted once.
    assert_eq!(record(&r, 2).pending, 0);
}

#[test]
fn memory_is_bounded() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    for n in 1..=(ROLLOUT_WINDOW as u64 + 10) {
        dispatch(&r, n, 1);
        a.computed(n, &[n], &[CDS]);
    }
    assert!(a.concerns.len() <= MAX_CONCERNS);
    assert_eq!(r.get(1), Known::Forgotten { oldest: 11 });
    assert_eq!(r.get(5000), Known::NotYet);
    // The oldest followed revisions were given up, counted as gone.
    let oldest_followed = ROLLOUT_WINDOW as u64 + 10 - MAX_CONCERNS as u64;
    assert_eq!(record(&r, oldest_followed).gone, 1);
    assert_eq!(r.recent("r").len(), PUBLISHED_WINDOW);
}

#[test]
fn an_ack_of_an_older_delta_response_accepts_only_its_revision() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 5, 1);
    a.computed(5, &[5], &[CDS]);
    let five = a.latest[CDS];
    dispatch(&r, 6, 1);
    a.computed(6, &[6], &[CDS]);
    // Both in flight: the client ACKs the first, then NACKs the second.
    a.rollout.acked(CDS, Some(five));
    assert_eq!(counts(&record(&r, 5)), (0, 1, 1, 0, 0, 0));
    assert_eq!(counts(&record(&r, 6)), (0, 1, 0, 0, 1, 0));
    a.nacked(CDS, "n", "bad");
    assert_eq!(counts(&record(&r, 6)), (0, 1, 0, 1, 0, 0));
    assert_eq!(a.versions(CDS), Some((5, 6)));
}

#[test]
fn a_revision_of_held_back_removals_waits_for_them() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    // Revision 2 deletes a listener while the CDS response is unanswered: nothing sent.
    dispatch(&r, 2, 1);
    a.computed_holding(2, &[2], &[], &[(LDS, true)]);
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

#[test]
fn a_reload_starts_records_and_acceptance_over() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    for n in 1..=10 {
        dispatch(&r, n, 1);
        a.computed(n, &[n], &[CDS]);
    }
    a.acked(CDS);
    assert_eq!(record(&r, 10).acked, 1);
    // The database went back to 7 (failover); 8 is written again with other content.
    r.dispatching_in(1, 10, 7, Some(now_ms()));
    r.marked(7);
    r.published(7);
    a.computed(7, &[7], &[CDS]);
    r.dispatching_in(1, 7, 8, Some(now_ms()));
    r.marked(8);
    r.published(8);
    a.computed(8, &[8], &[CDS]);
    assert_eq!(counts(&record(&r, 8)), (0, 1, 0, 0, 1, 0));
    a.nacked(CDS, "n", "bad");
    assert_eq!(record(&r, 8).nacked, 1);
    assert_eq!(a.versions(CDS), Some((0, 8)));
    assert_eq!(r.get(9), Known::NotYet);
}

#[test]
fn an_ack_of_a_heartbeat_accepts_nothing_new() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 5, 1);
    a.computed(5, &[5], &[CDS]);
    a.acked(CDS);
    dispatch(&r, 6, 1);
    a.computed(6, &[6], &[CDS]);
    a.nacked(CDS, "n", "bad");
    assert_eq!(record(&r, 6).nacked, 1);
    // The accepted state renewed by a heartbeat, which the client takes.
    let beat = a.heartbeat();
    a.rollout.acked(CDS, Some(beat));
    let six = record(&r, 6);
    assert_eq!(counts(&six), (0, 1, 0, 1, 0, 0));
    assert_eq!(six.nacks.len(), 1);
    assert_eq!(a.versions(CDS), Some((5, 6)));
}

#[test]
fn a_stream_refusing_every_revision_leaves_one_text_per_revision() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 6, 1);
    a.computed(6, &[6], &[LDS]);
    a.nacked(LDS, "n", "cannot bind");
    dispatch(&r, 7, 1);
    a.computed(7, &[7], &[LDS]);
    a.nacked(LDS, "n", "cannot bind");
    assert_eq!(record(&r, 6).nacks.len(), 1);
    assert_eq!(record(&r, 7).nacks.len(), 1);
    assert_eq!(record(&r, 6).nacked, 1);
}

/// Review finding 1: on Delta, a refusal releases the removals it no longer holds back;
/// they go as a response computed from the refused revision, and the client's ACK of
/// them accepts the removals, not the refused update.
#[test]
fn delta_an_ack_of_the_removals_a_refusal_released_does_not_undo_it() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::delta(r.clone(), 1);
    dispatch(&r, 1, 1);
    a.computed(1, &[1], &[CDS]);
    a.acked(CDS);
    // Revision 2 updates one cluster and deletes another: the update goes, the removal
    // waits for its answer.
    dispatch(&r, 2, 1);
    a.computed_holding(2, &[2], &[CDS], &[(CDS, true)]);
    let update = a.latest[CDS];
    // The NACK releases the removal, sent by the computation that follows it; the refusal
    // is recorded after that computation (see `service::record_refusals`).
    a.computed(2, &[], &[CDS]);
    a.rollout.nacked(CDS, Some(update), "n", "bad");
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 1, 0, 0));
    // The client takes the removal.
    a.acked(CDS);
    let two = record(&r, 2);
    assert_eq!(counts(&two), (0, 1, 0, 1, 0, 0));
    assert_eq!(two.nacks.len(), 1);
    assert_eq!(a.versions(CDS), Some((1, 2)));
    // A later revision the client accepts settles it, as ever.
    dispatch(&r, 3, 1);
    a.computed(3, &[3], &[CDS]);
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
    a.computed_holding(2, &[2], &[LDS], &[(CDS, true)]);
    a.acked(LDS);
    a.acked(CDS);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 0, 0, 1, 0));
    // Revision 3 puts the deleted resource back as the client holds it: nothing to send,
    // nothing to remove.
    dispatch(&r, 3, 1);
    a.computed_holding(3, &[3], &[], &[]);
    assert_eq!(counts(&record(&r, 2)), (0, 1, 1, 0, 0, 0));
}

const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

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
    a.computed_holding(2, &[2], &[], &[(LDS, true)]);
    // Revision 3 updates a route; the listener's removal still waits.
    dispatch(&r, 3, 1);
    a.computed_holding(3, &[3], &[RDS], &[(LDS, false)]);
    a.acked(RDS);
    assert_eq!(counts(&record(&r, 3)), (0, 1, 1, 0, 0, 0));
    assert_eq!(record(&r, 2).pending, 1);
    // Revision 4 updates a listener, accepted before the removal goes.
    dispatch(&r, 4, 1);
    a.computed_holding(4, &[4], &[LDS], &[(LDS, false)]);
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

fn snapshot(epoch: u64, revision: u64) -> Arc<vxds_store::Snapshot> {
    let mut snapshot = vxds_store::Snapshot::default();
    snapshot.epoch = epoch;
    snapshot.revision = revision;
    Arc::new(snapshot)
}

fn client_status() -> Arc<Mutex<crate::status::ClientStatus>> {
    Arc::new(Mutex::new(crate::status::ClientStatus::default()))
}

/// Review finding 2: a replica restarted after revision 7 starts its streams from it: 7
/// is not still to come there, and it says so to the other replicas.
#[test]
fn a_replica_knows_the_revision_it_started_from() {
    let registry = Arc::new(crate::Registry::new(snapshot(0, 7)));
    let _stream = registry.register(1, client_status());
    assert_eq!(registry.rollouts.head(), Some(7));
    assert_eq!(registry.summary().rollout_head, Some(7));
    assert_eq!(registry.rollouts.get(7), Known::BeforeStart);
    assert_eq!(registry.rollouts.get(8), Known::NotYet);
    registry.dispatch(snapshot(0, 8), None);
    assert_eq!(registry.rollouts.head(), Some(8));
    assert_eq!(counts(&record(&registry.rollouts, 8)), (1, 0, 0, 0, 0, 0));
    // Still unknown here (not "forgotten", not "concerned none"), and published as such.
    assert_eq!(registry.rollouts.get(7), Known::BeforeStart);
    assert_eq!(registry.summary().rollout_loaded, Some(7));
    // A reload (a failover that lost revisions) forgets it with the records.
    registry.dispatch(snapshot(1, 5), None);
    assert_eq!(registry.rollouts.head(), Some(5));
    assert_eq!(registry.rollouts.get(6), Known::NotYet);
}

/// Review finding 3: revisions of the epoch before a reload, still in a stream's inbox,
/// are not the new epoch's revisions of the same numbers.
#[test]
fn marks_of_an_epoch_before_a_reload_do_not_count_in_the_next() {
    let registry = Arc::new(crate::Registry::new(snapshot(0, 8)));
    let a = registry.register(1, client_status());
    let b = registry.register(2, client_status());
    // Revision 9 is told to both streams; neither has looked yet.
    registry.dispatch(snapshot(0, 9), None);
    // Failover: the database went back to 8, and 9 is written again (other content).
    registry.dispatch(snapshot(1, 8), None);
    registry.dispatch(snapshot(1, 9), None);
    // The new 9 is still to come for both.
    let nine = record(&registry.rollouts, 9);
    assert_eq!(counts(&nine), (2, 0, 0, 0, 0, 0));
    // One leaves without looking: it was told of the new epoch's 8 and 9 only.
    drop(a);
    assert_eq!(counts(&record(&registry.rollouts, 9)), (1, 0, 0, 0, 0, 0));
    assert_eq!(counts(&record(&registry.rollouts, 8)), (1, 0, 0, 0, 0, 0));
    // The other computes, from the new epoch, with what its inbox held.
    let marked = b.inbox.take();
    assert_eq!(
        (marked.revisions_epoch, &marked.revisions[..]),
        (1, &[8, 9][..])
    );
    drop(b);
}

/// Review finding 3, the stream's side: a computation from before a reload, told of the
/// old epoch's revisions, decides nothing of the new epoch's revisions of those numbers.
#[test]
fn a_computation_told_of_an_old_epoch_decides_nothing_in_the_new() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 9, 1);
    // Reload (epoch 1) and 9 again, told to another stream.
    r.dispatching_in(1, 9, 8, None);
    r.dispatching_in(1, 8, 9, None);
    r.marked(9);
    r.published(9);
    // `a` took its old mark of 9 before the reload and computes from the old snapshot.
    a.rollout
        .computed_in(0, 9, &[(0, 9)], std::iter::empty::<(&str, &str)>(), &[]);
    assert_eq!(counts(&record(&r, 9)), (1, 0, 0, 0, 0, 0));
    // Or from the new one.
    a.rollout
        .computed_in(1, 9, &[(0, 9)], std::iter::empty::<(&str, &str)>(), &[]);
    assert_eq!(counts(&record(&r, 9)), (1, 0, 0, 0, 0, 0));
}

/// Review finding 7: revisions applied together share one record, published with the
/// revisions it counts, so that other replicas answer for each of them alike.
#[test]
fn a_shared_record_says_which_revisions_it_counts() {
    let r = Arc::new(Rollouts::default());
    dispatch(&r, 4, 1);
    r.dispatching(4, 7, Some(now_ms()));
    r.marked(7);
    r.published(7);
    let recent = r.recent("r");
    let seven = recent.iter().find(|rec| rec.revision == 7).unwrap();
    assert_eq!(seven.first, Some(5));
    assert!(seven.covers(5) && seven.covers(6) && seven.covers(7));
    assert!(!seven.covers(4) && !seven.covers(8));
    let four = recent.iter().find(|rec| rec.revision == 4).unwrap();
    assert_eq!(four.first, None);
    for n in 5..=7 {
        assert_eq!(counts(&record(&r, n)), counts(seven));
    }
}

/// Review C: after a reload, a stream of the old epoch that leaves counts nothing as gone in
/// the new epoch's record of the same number.
#[test]
fn a_stream_leaving_after_a_reload_counts_nothing_in_the_new_epoch() {
    let r = Arc::new(Rollouts::default());
    let mut a = Client::new(r.clone(), 1);
    dispatch(&r, 8, 1);
    a.computed(8, &[8], &[CDS]);
    // Failover: the database went back to 7, and 8 is written again.
    r.dispatching_in(1, 8, 7, Some(now_ms()));
    r.dispatching_in(1, 7, 8, Some(now_ms()));
    r.marked(8);
    r.published(8);
    let mut b = Client::new(r.clone(), 2);
    b.computed(8, &[8], &[CDS]);
    assert_eq!(counts(&record(&r, 8)), (0, 1, 0, 0, 1, 0));
    drop(a);
    assert_eq!(counts(&record(&r, 8)), (0, 1, 0, 0, 1, 0));
}
