//! Unit tests of rollout tracking: per-stream attribution of ACKs and NACKs to revisions,
//! and the per-replica records they update.

use super::*;
use crate::machine::Response;

mod reconnect;
mod references;
mod refusal_cost;
mod refusals;
mod removals;

const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// A client's stream: numbers its responses as the machine does, and answers the latest
/// of a type unless told which.
struct Client {
    rollout: StreamRollout,
    rollouts: Arc<Rollouts>,
    delta: bool,
    nonce: u64,
    latest: BTreeMap<&'static str, u64>,
    machine: Machine,
}

/// What the rollout asks the machine: subscriptions, and what the sent resources name.
#[derive(Default)]
struct Machine {
    subscribed: std::collections::BTreeSet<(String, String)>,
    /// `(type, name, named type, named name)`.
    names: std::collections::BTreeSet<(String, String, String, String)>,
    /// Types the client holds in sync (nothing to send, nothing in flight).
    in_sync: std::collections::BTreeSet<String>,
}

impl Subscriptions for Machine {
    fn in_sync(&self, type_url: &str) -> bool {
        self.in_sync.contains(type_url)
    }

    fn subscribes(&self, type_url: &str, name: &str) -> bool {
        self.subscribed
            .contains(&(type_url.to_owned(), name.to_owned()))
    }

    fn still_names(
        &self,
        from_type: &str,
        from_name: &Arc<str>,
        type_url: &str,
        name: &str,
    ) -> bool {
        self.names.contains(&(
            from_type.to_owned(),
            from_name.to_string(),
            type_url.to_owned(),
            name.to_owned(),
        ))
    }
}

impl Client {
    fn new(r: Arc<Rollouts>, id: u64) -> Self {
        Self {
            rollout: StreamRollout::new(r.clone(), id),
            rollouts: r,
            delta: false,
            nonce: 0,
            latest: BTreeMap::new(),
            machine: Machine::default(),
        }
    }

    /// A Delta stream's.
    fn delta(r: Arc<Rollouts>, id: u64) -> Self {
        let mut client = Self::new(r, id);
        client.rollout = StreamRollout::new(client.rollouts.clone(), id).delta();
        client.delta = true;
        client
    }

    fn computed(&mut self, revision: u64, marked: &[u64], types: &[&'static str]) {
        self.computed_holding(revision, marked, types, &[]);
    }

    /// A computation that sent `types` while the removals `held` stay held back, each
    /// `(type, name, whether it became due in this computation)`.
    fn computed_holding(
        &mut self,
        revision: u64,
        marked: &[u64],
        types: &[&'static str],
        held: &[(&'static str, &'static str, bool)],
    ) {
        let sent: Vec<(&'static str, &[&str], &[&str])> =
            types.iter().map(|&t| (t, &[][..], &[][..])).collect();
        self.step(
            revision,
            Step {
                marked,
                sent: &sent,
                held,
                ..Step::default()
            },
        );
    }

    /// One computation (see [`Step`]).
    fn step(&mut self, revision: u64, step: Step<'_>) {
        let responses: Vec<Response> = step
            .sent
            .iter()
            .map(|&(type_url, updated, removed)| {
                self.nonce += 1;
                self.latest.insert(type_url, self.nonce);
                if !self.delta {
                    return Response::Sotw(crate::wire::SotwResponse {
                        type_url: type_url.into(),
                        nonce: self.nonce.to_string(),
                        ..Default::default()
                    });
                }
                Response::Delta(crate::wire::DeltaResponse {
                    type_url: type_url.into(),
                    nonce: self.nonce.to_string(),
                    resources: updated
                        .iter()
                        .map(|&name| crate::wire::Wrapped {
                            name: name.into(),
                            naming: crate::wire::Naming::Legacy,
                            version: "v".into(),
                            body: None,
                            ttl: None,
                        })
                        .collect(),
                    removed_resources: removed.iter().map(|&n| n.to_owned()).collect(),
                    ..Default::default()
                })
            })
            .collect();
        let epoch = self.rollouts.epoch();
        let marked: Vec<Mark> = step
            .marked
            .iter()
            .map(|&revision| Mark {
                epoch,
                revision,
                types: match step.changed.iter().find(|(r, _)| *r == revision) {
                    Some((_, types)) => types.iter().fold(TypeMask::NONE, |m, t| m.with(t)),
                    None => TypeMask::ALL,
                },
            })
            .collect();
        let names: Vec<Arc<str>> = step.held.iter().map(|&(_, n, _)| n.into()).collect();
        let held: Vec<HeldRemoval<'_>> = step
            .held
            .iter()
            .zip(&names)
            .map(|(&(type_url, _, due_now), name)| HeldRemoval {
                type_url,
                name,
                due_now,
            })
            .collect();
        let dependencies: Vec<Dependency> = step
            .needs
            .iter()
            .map(|&(from_type, from_name, type_url, name)| {
                // What was sent names it, until told otherwise.
                self.machine.names.insert((
                    from_type.to_owned(),
                    from_name.to_owned(),
                    type_url.to_owned(),
                    name.to_owned(),
                ));
                Dependency {
                    from_type: from_type.to_owned(),
                    from_name: from_name.into(),
                    type_url,
                    name: name.into(),
                    nonce: None,
                }
            })
            .collect();
        self.rollout.computed(
            Computation {
                epoch,
                revision,
                marked: &marked,
                responses: &responses,
                held: &held,
                dependencies: &dependencies,
            },
            &self.machine,
        );
    }

    /// A computation that sent `sent`: `(type, names updated, names removed)`.
    fn sent(&mut self, revision: u64, marked: &[u64], sent: &[(&'static str, &[&str], &[&str])]) {
        self.step(
            revision,
            Step {
                marked,
                sent,
                ..Step::default()
            },
        );
    }

    /// The client subscribes to `name` (it had not).
    fn subscribe(&mut self, type_url: &'static str, name: &str) {
        self.machine
            .subscribed
            .insert((type_url.to_owned(), name.to_owned()));
    }

    /// What the client was sent of `(type_url, name)` no longer names `(named_type, named)`.
    fn unname(&mut self, type_url: &str, name: &str, named_type: &str, named: &str) {
        self.machine.names.remove(&(
            type_url.to_owned(),
            name.to_owned(),
            named_type.to_owned(),
            named.to_owned(),
        ));
    }

    /// The client unsubscribes from `names` (Delta).
    fn unsubscribed(&mut self, type_url: &'static str, names: &[&str]) {
        let names: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
        self.rollout.unsubscribed(type_url, &names);
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

/// One computation of a stream, for [`Client::step`].
#[derive(Default)]
struct Step<'a> {
    /// The revisions it was told of.
    marked: &'a [u64],
    /// The types some of them changed for the stream, `(revision, types)`; every type for
    /// a revision not listed.
    changed: &'a [(u64, &'a [&'static str])],
    /// Its responses, in order: `(type, names updated, names removed)` (the names count on
    /// Delta; a SotW response carries the type's whole state).
    sent: &'a [(&'static str, &'a [&'a str], &'a [&'a str])],
    /// Removals held back: `(type, name, whether it became due in this computation)`.
    held: &'a [(&'static str, &'a str, bool)],
    /// What its responses' resources name that the client does not hold:
    /// `(type, name, named type, named name)`.
    needs: &'a [(&'static str, &'a str, &'static str, &'a str)],
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
    assert!(a.open_revisions() <= MAX_CONCERNS);
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
        (
            marked.revisions_epoch,
            marked.revisions.iter().map(|(r, _)| *r).collect::<Vec<_>>()
        ),
        (1, vec![8, 9])
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
    let old_mark = [Mark {
        epoch: 0,
        revision: 9,
        types: TypeMask::ALL,
    }];
    let computation = |epoch| Computation {
        epoch,
        revision: 9,
        marked: &old_mark,
        responses: &[],
        held: &[],
        dependencies: &[],
    };
    a.rollout.computed(computation(0), &Machine::default());
    assert_eq!(counts(&record(&r, 9)), (1, 0, 0, 0, 0, 0));
    // Or from the new one.
    a.rollout.computed(computation(1), &Machine::default());
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
