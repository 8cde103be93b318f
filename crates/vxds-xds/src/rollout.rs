//! Rollout tracking: for each recent revision, which of this replica's streams it changed,
//! and which of them accepted or refused it.
//!
//! The data model, per stream ([`StreamRollout`], owned by the stream's task beside its
//! machine): per type, the revision of the snapshot the last response was computed from
//! (*sent*), the revision of the last response the client ACKed (*accepted*), and the last it
//! NACKed; and the recent revisions that changed something the stream resolves (*concerns*),
//! each with the types it changed, until the stream has accepted all of them at that
//! revision or later (acked) — or refused one (nacked; acked after all if a later revision
//! is accepted).
//!
//! A revision concerns a stream when the dispatcher marked the stream for it (a subscription
//! of the stream names a changed resource) *and* the stream, computing from a snapshot at that
//! revision or later, had something to send: a revision that changes nothing the stream
//! resolves (another variant, say) does not concern it. Marks coalesce while a stream is busy:
//! revisions seen in one computation all concern it, with the types that computation sent.
//!
//! Per replica ([`Rollouts`]): a [`RolloutRecord`] of counts per revision, for the last
//! [`ROLLOUT_WINDOW`] revisions; older revisions are forgotten. A stream follows at most
//! [`MAX_CONCERNS`] open revisions; beyond, the oldest is counted `gone`. Memory: a record is a
//! few hundred bytes plus up to [`vxds_core::rollout::MAX_NACKS`] NACK texts; a stream's part
//! is a few words per type and per open revision.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use vxds_core::rollout::{MAX_NACKS, RolloutNack, RolloutRecord};

use crate::events::RolloutProgress;

/// Revisions whose rollout each replica remembers.
pub const ROLLOUT_WINDOW: usize = 1024;
/// Open revisions one stream follows.
pub const MAX_CONCERNS: usize = 64;
/// Revisions a replica publishes with its client summary (the newest).
pub const PUBLISHED_WINDOW: usize = 64;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What commit → ACK times are reported to.
pub type Observer = Arc<dyn Fn(f64) + Send + Sync>;

/// This replica's rollout records, shared by the dispatcher, every stream and the admin API.
#[derive(Default)]
pub struct Rollouts {
    /// Where `rollout` events go (`GET /v1/events`).
    events: crate::events::ClientEvents,
    records: Mutex<Records>,
    /// Notified when a record changes: a stream answered, a revision was published.
    pub changed: Notify,
    /// Notified when a revision settles on this replica (nothing pending or undecided) or a
    /// stream refuses one: the client summary is published early (debounced) so that other
    /// replicas see it.
    pub settled: Notify,
    /// Observes commit → ACK, in seconds (the convergence histogram).
    observer: Mutex<Option<Observer>>,
    /// The index's epoch of the records: a reload (the database's head went back or
    /// diverged, as after a failover) reuses revision numbers for other content, so the
    /// records and what streams accepted start over.
    epoch: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Records {
    /// The revision the replica's streams started from (the index loaded at start): every
    /// stream connected after it, so no revision up to it changed anything they resolve.
    /// Forgotten at a reload.
    loaded: u64,
    by_revision: BTreeMap<u64, RolloutRecord>,
    /// Revisions the index applied together with a later one (a burst while the dispatcher was
    /// busy): they share that one's record, as the streams got them together.
    with: BTreeMap<u64, u64>,
}

/// What the admin API can say of a revision from this replica's records.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Known {
    Record(Box<RolloutRecord>),
    /// Older than the oldest record kept.
    Forgotten {
        oldest: u64,
    },
    /// In place before this replica started (or before its index reloaded): it changed
    /// nothing its streams resolve.
    BeforeStart,
    /// Not dispatched here yet.
    NotYet,
}

impl std::fmt::Debug for Rollouts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rollouts")
            .field("records", &self.records)
            .finish_non_exhaustive()
    }
}

impl Rollouts {
    /// Records that announce their changes on `events`.
    pub fn new(events: crate::events::ClientEvents) -> Self {
        Self {
            events,
            ..Default::default()
        }
    }
    /// The replica's streams start from `revision` of index epoch `epoch` (the snapshot the
    /// registry starts with): it and every revision before it are in place before any stream
    /// connects, so they are not still to come here (see [`Self::head`]).
    pub fn loaded(&self, epoch: u64, revision: u64) {
        if let Ok(mut records) = self.records.lock() {
            self.epoch
                .store(epoch, std::sync::atomic::Ordering::Release);
            records.loaded = revision;
        }
    }

    /// Sets what every commit → ACK time is reported to (the metric).
    pub fn observe_with(&self, observer: Observer) {
        if let Ok(mut o) = self.observer.lock() {
            *o = Some(observer);
        }
    }

    fn update(&self, revision: u64, f: impl FnOnce(&mut RolloutRecord)) {
        let (settled, progress) = {
            let Ok(mut records) = self.records.lock() else {
                return;
            };
            let Some(record) = records.by_revision.get_mut(&revision) else {
                return;
            };
            let before = (record.nacked, open(record));
            f(record);
            let progress = self.events.is_watched().then_some(RolloutProgress {
                revision,
                streams: record.streams,
                acked: record.acked,
                nacked: record.nacked,
                pending: record.pending,
                gone: record.gone,
                undecided: record.undecided,
            });
            (
                (record.nacked > before.0) || (before.1 && !open(record)),
                progress,
            )
        };
        if let Some(progress) = progress {
            self.events
                .send(crate::events::ClientEvent::Rollout(progress));
        }
        self.changed.notify_waiters();
        if settled {
            self.settled.notify_one();
        }
    }

    /// The dispatcher starts telling streams of `revision`, and of the revisions after
    /// `previous` before it, which reach the streams together with it.
    pub fn dispatching(&self, previous: u64, revision: u64, committed_at_ms: Option<i64>) {
        self.dispatching_in(self.epoch(), previous, revision, committed_at_ms);
    }

    /// [`Self::dispatching`] in the index's `epoch`: a new epoch forgets every record.
    pub fn dispatching_in(
        &self,
        epoch: u64,
        previous: u64,
        revision: u64,
        committed_at_ms: Option<i64>,
    ) {
        if let Ok(mut records) = self.records.lock() {
            let records = &mut *records;
            if epoch != self.epoch() {
                records.by_revision.clear();
                records.with.clear();
                records.loaded = 0;
                self.epoch
                    .store(epoch, std::sync::atomic::Ordering::Release);
            }
            let first = previous
                .saturating_add(1)
                .max(revision.saturating_sub(ROLLOUT_WINDOW as u64));
            let record = records
                .by_revision
                .entry(revision)
                .or_insert_with(|| RolloutRecord::new(revision, committed_at_ms));
            if first < revision {
                // Published with the record: other replicas answer for these revisions too.
                record.first = Some(record.first.map_or(first, |f| f.min(first)));
            }
            for earlier in first..revision {
                records.with.insert(earlier, revision);
            }
            while records.by_revision.len() > ROLLOUT_WINDOW {
                records.by_revision.pop_first();
            }
            if let Some((&oldest, _)) = records.by_revision.first_key_value() {
                records.with.retain(|_, target| *target >= oldest);
            }
        }
    }

    /// Every stream `revision` concerns has been told.
    pub fn published(&self, revision: u64) {
        self.update(revision, |r| r.published = true);
    }

    /// A stream was told of `revision`; it is undecided until it computes.
    pub fn marked(&self, revision: u64) {
        self.update(revision, |r| r.undecided += 1);
    }

    /// `count` streams were told of `revision` (one dispatch): one update of the records.
    pub fn marked_by(&self, revision: u64, count: u64) {
        if count > 0 {
            self.update(revision, |r| r.undecided += count);
        }
    }

    fn decided(&self, revision: u64, concerned: bool) {
        self.update(revision, |r| {
            r.undecided = r.undecided.saturating_sub(1);
            if concerned {
                r.streams += 1;
                r.pending += 1;
            }
        });
    }

    /// A stream told of these revisions left before computing.
    pub fn undecided_gone(&self, revisions: &[u64]) {
        for &revision in revisions {
            self.decided(revision, false);
        }
    }

    /// [`Self::undecided_gone`] for revisions of index epoch `epoch`: those of an epoch
    /// before a reload have no records any more (their numbers may name other revisions).
    pub fn undecided_gone_in(&self, epoch: u64, revisions: &[u64]) {
        if epoch == self.epoch() {
            self.undecided_gone(revisions);
        }
    }

    fn acked(&self, revision: u64, stream_id: u64, was_nacked: bool) {
        let mut latency = None;
        self.update(revision, |r| {
            if was_nacked {
                r.nacked = r.nacked.saturating_sub(1);
                r.nacks.retain(|n| n.stream_id != stream_id);
            } else {
                r.pending = r.pending.saturating_sub(1);
            }
            r.acked += 1;
            if let Some(committed) = r.committed_at_ms {
                let ms = (now_ms() - committed).max(0) as u64;
                r.ack_times.record(ms);
                latency = Some(ms);
            }
        });
        if let Some(ms) = latency
            && let Ok(observer) = self.observer.lock()
            && let Some(observe) = observer.as_ref()
        {
            observe(ms as f64 / 1000.0);
        }
    }

    fn nacked(&self, revision: u64, nack: RolloutNack, first: bool) {
        self.update(revision, |r| {
            if first {
                r.pending = r.pending.saturating_sub(1);
                r.nacked += 1;
            }
            if r.nacks.len() < MAX_NACKS {
                r.nacks.push(nack);
            }
        });
    }

    fn gone(&self, revision: u64, was_nacked: bool) {
        if was_nacked {
            return;
        }
        self.update(revision, |r| {
            r.pending = r.pending.saturating_sub(1);
            r.gone += 1;
        });
    }

    /// What this replica knows of `revision`.
    pub fn get(&self, revision: u64) -> Known {
        let Ok(records) = self.records.lock() else {
            return Known::NotYet;
        };
        if let Some(record) = records.by_revision.get(&revision) {
            return Known::Record(Box::new(record.clone()));
        }
        if let Some(record) = records
            .with
            .get(&revision)
            .and_then(|t| records.by_revision.get(t))
        {
            let mut record = record.clone();
            record.revision = revision;
            return Known::Record(Box::new(record));
        }
        // Before the forgotten check: a revision in place at start stays unknown here however
        // many revisions were dispatched since.
        if revision <= records.loaded {
            return Known::BeforeStart;
        }
        match records.by_revision.first_key_value() {
            Some((&oldest, _)) if revision < oldest => Known::Forgotten { oldest },
            _ => Known::NotYet,
        }
    }

    /// The index epoch of the records.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The newest revision dispatched here, or the one loaded at start if none was since:
    /// a revision after it is still to come here.
    pub fn head(&self) -> Option<u64> {
        let records = self.records.lock().ok()?;
        let dispatched = records.by_revision.last_key_value().map(|(&k, _)| k);
        dispatched.max((records.loaded > 0).then_some(records.loaded))
    }

    /// The revision the index loaded at start or at its last reload, if any: revisions up to
    /// it are unknown here ([`Known::BeforeStart`]).
    pub fn loaded_revision(&self) -> Option<u64> {
        let records = self.records.lock().ok()?;
        (records.loaded > 0).then_some(records.loaded)
    }

    /// The newest records, for the client summary.
    pub fn recent(&self, replica: &str) -> Vec<RolloutRecord> {
        let Ok(records) = self.records.lock() else {
            return Vec::new();
        };
        records
            .by_revision
            .values()
            .rev()
            .filter(|r| r.streams > 0 || open(r))
            .take(PUBLISHED_WINDOW)
            .map(|r| r.published_copy(replica))
            .collect()
    }
}

fn open(r: &RolloutRecord) -> bool {
    !r.published || r.undecided > 0 || r.pending > 0
}

#[derive(Debug)]
struct TypeRollout {
    type_url: String,
    /// The revision the last response was computed from.
    sent: u64,
    /// The revision of the last response the client accepted.
    accepted: u64,
    /// The revision of the last response the client refused.
    refused: u64,
    /// The nonce of the last response the client accepted.
    accepted_nonce: u64,
    /// Responses sent and not yet answered, oldest first: `(nonce, revision computed from)`.
    /// An answer decides by the response it names: an ACK of an older Delta response accepts
    /// that response's revision, not the newest sent; an answer to a heartbeat (never listed)
    /// decides nothing.
    in_flight: VecDeque<(u64, u64)>,
}

/// Unanswered responses remembered per type; beyond, the oldest are forgotten (an answer to
/// one of them then decides nothing).
const MAX_IN_FLIGHT: usize = 64;

impl TypeRollout {
    /// The revision of the response `nonce` names, dropping it and every older response from
    /// what is in flight (a client answers in order).
    fn answered(&mut self, nonce: Option<u64>) -> Option<u64> {
        let nonce = nonce?;
        let at = self.in_flight.iter().position(|&(n, _)| n == nonce)?;
        let revision = self.in_flight[at].1;
        self.in_flight.drain(..=at);
        Some(revision)
    }
}

#[derive(Debug)]
struct Concern {
    revision: u64,
    /// Indexes into `StreamRollout::types`.
    types: Vec<usize>,
    nacked: bool,
    /// Types whose removals became due when it was computed and are held back
    /// (make-before-break): what goes of them until they go is its too, and it is not
    /// accepted before that is. Removals of other types, or due before, are not its.
    awaiting: Vec<usize>,
    /// The responses that carried its held-back removals, `(type, nonce)`: it is not accepted
    /// before the client accepts each (accepting the type at its revision is not enough: an
    /// update of the type at that revision may have gone first).
    removals: Vec<(usize, u64)>,
}

/// One stream's part (see the module's documentation). Dropping it (the stream ended) counts
/// its open revisions as gone.
#[derive(Debug)]
pub struct StreamRollout {
    rollouts: Arc<Rollouts>,
    stream_id: u64,
    types: Vec<TypeRollout>,
    concerns: VecDeque<Concern>,
    /// The records' epoch this stream's part belongs to (see [`Rollouts::epoch`]).
    epoch: u64,
    /// A Delta stream: a response carries only what changed, so accepting one computed from
    /// a refused revision (the removals the refusal released) accepts nothing it refused.
    delta: bool,
}

impl Drop for StreamRollout {
    fn drop(&mut self) {
        for c in std::mem::take(&mut self.concerns) {
            self.rollouts.gone(c.revision, c.nacked);
        }
    }
}

impl StreamRollout {
    pub fn new(rollouts: Arc<Rollouts>, stream_id: u64) -> Self {
        Self {
            rollouts,
            stream_id,
            types: Vec::new(),
            concerns: VecDeque::new(),
            epoch: 0,
            delta: false,
        }
    }

    /// The part of a Delta stream.
    pub fn delta(mut self) -> Self {
        self.delta = true;
        self
    }

    /// After a reload (a new epoch), what was accepted and followed refers to revision
    /// numbers that now name other content: it starts over (the records did too).
    fn sync_epoch(&mut self) {
        let current = self.rollouts.epoch();
        if current != self.epoch {
            self.types.clear();
            self.concerns.clear();
            self.epoch = current;
        }
    }

    /// [`Self::computed`] from a snapshot of index epoch `epoch`, told of the revisions
    /// `marked` as `(epoch, revision)`: one from before a reload decides nothing of the new
    /// epoch's revisions, and revisions of an epoch before a reload are no longer followed
    /// (their records went with it; their numbers may name other revisions now).
    pub fn computed_in<'a>(
        &mut self,
        epoch: u64,
        revision: u64,
        marked: &[(u64, u64)],
        sent: impl IntoIterator<Item = (&'a str, &'a str)>,
        held: &[(&str, bool)],
    ) {
        self.sync_epoch();
        let marked: Vec<u64> = marked
            .iter()
            .filter(|(e, _)| *e == self.epoch)
            .map(|&(_, r)| r)
            .collect();
        if epoch != self.epoch {
            for m in marked {
                self.rollouts.decided(m, false);
            }
            return;
        }
        self.computed(revision, &marked, sent, held);
    }

    fn type_index(&mut self, type_url: &str) -> usize {
        if let Some(i) = self.types.iter().position(|t| t.type_url == type_url) {
            return i;
        }
        self.types.push(TypeRollout {
            type_url: type_url.to_owned(),
            sent: 0,
            accepted: 0,
            refused: 0,
            accepted_nonce: 0,
            in_flight: VecDeque::new(),
        });
        self.types.len() - 1
    }

    /// The revision of what the client accepted of `type_url`, and of what was sent since and
    /// is still unanswered (or refused).
    pub fn versions(&self, type_url: &str) -> Option<(u64, u64)> {
        self.types
            .iter()
            .find(|t| t.type_url == type_url)
            .map(|t| (t.accepted, t.sent))
    }

    /// The stream computed from the snapshot at `revision`, told of the revisions `marked`
    /// since its last computation, and sent responses `(type URL, nonce)` (heartbeats
    /// excepted; a nonce that is no number is never matched by an answer); `held`: the types
    /// whose removals are due and held back until earlier responses are answered, each with
    /// whether some became due in this computation (those are the marked revisions').
    pub fn computed<'a>(
        &mut self,
        revision: u64,
        marked: &[u64],
        sent: impl IntoIterator<Item = (&'a str, &'a str)>,
        held: &[(&str, bool)],
    ) {
        self.sync_epoch();
        let mut types = Vec::new();
        let mut responses = Vec::new();
        for (type_url, nonce) in sent {
            let i = self.type_index(type_url);
            let t = &mut self.types[i];
            t.sent = revision;
            let nonce = nonce.parse::<u64>().ok();
            if let Some(nonce) = nonce {
                if t.in_flight.len() >= MAX_IN_FLIGHT {
                    t.in_flight.pop_front();
                }
                t.in_flight.push_back((nonce, revision));
            }
            types.push(i);
            responses.push((i, nonce));
        }
        types.sort_unstable();
        types.dedup();
        let held: Vec<(usize, bool)> = held
            .iter()
            .map(|&(type_url, due_now)| (self.type_index(type_url), due_now))
            .collect();
        // Revisions waiting for their removals: what goes now of those types is theirs.
        let mut stopped_waiting = false;
        for c in self.concerns.iter_mut().filter(|c| !c.awaiting.is_empty()) {
            for &(i, nonce) in &responses {
                if !c.awaiting.contains(&i) {
                    continue;
                }
                if !c.types.contains(&i) {
                    c.types.push(i);
                }
                if let Some(nonce) = nonce {
                    c.removals.push((i, nonce));
                }
            }
            c.awaiting.retain(|i| held.iter().any(|(h, _)| h == i));
            stopped_waiting |= c.awaiting.is_empty();
        }
        let due_now: Vec<usize> = held
            .iter()
            .filter(|(_, due_now)| *due_now)
            .map(|(i, _)| *i)
            .collect();
        for &m in marked {
            let concerned = !types.is_empty() || !due_now.is_empty();
            self.rollouts.decided(m, concerned);
            if !concerned {
                continue;
            }
            if self.concerns.len() >= MAX_CONCERNS
                && let Some(oldest) = self.concerns.pop_front()
            {
                self.rollouts.gone(oldest.revision, oldest.nacked);
            }
            self.concerns.push_back(Concern {
                revision: m,
                types: types.clone(),
                nacked: false,
                awaiting: due_now.clone(),
                removals: Vec::new(),
            });
        }
        // Removals held back may have stopped being due without anything going (the
        // resource came back, the client unsubscribed): what waited only for them is done.
        if stopped_waiting {
            self.settle();
        }
    }

    /// The client accepted the response of `type_url` with `nonce` (and so every earlier one).
    pub fn acked(&mut self, type_url: &str, nonce: Option<u64>) {
        self.sync_epoch();
        let i = self.type_index(type_url);
        let t = &mut self.types[i];
        let Some(revision) = t.answered(nonce) else {
            return; // a heartbeat's, or one too old to remember: nothing newer was accepted
        };
        if let Some(nonce) = nonce {
            t.accepted_nonce = t.accepted_nonce.max(nonce);
        }
        // A Delta response computed from a revision the client refused of this type (the
        // removals the refusal released) never carries the refused resources again:
        // accepting it accepts nothing the refusal was about.
        if !(self.delta && revision <= t.refused) {
            t.accepted = t.accepted.max(revision);
        }
        self.settle();
    }

    /// Counts as accepted the revisions whose types the client all accepted at them or later
    /// (and whose held-back removals went).
    fn settle(&mut self) {
        let types = &self.types;
        let rollouts = &self.rollouts;
        let stream_id = self.stream_id;
        self.concerns.retain(|c| {
            let done = c.awaiting.is_empty()
                && c.types.iter().all(|&i| types[i].accepted >= c.revision)
                && c.removals
                    .iter()
                    .all(|&(i, n)| types[i].accepted_nonce >= n);
            if done {
                rollouts.acked(c.revision, stream_id, c.nacked);
            }
            !done
        });
    }

    /// The client refused the response of `type_url` with `nonce`, saying `error`: the
    /// revisions up to the one that response was computed from, not yet accepted, are refused.
    pub fn nacked(&mut self, type_url: &str, nonce: Option<u64>, node: &str, error: &str) {
        self.sync_epoch();
        let i = self.type_index(type_url);
        let t = &mut self.types[i];
        let Some(refused) = t.answered(nonce) else {
            return;
        };
        t.refused = t.refused.max(refused);
        let accepted = t.accepted;
        for c in &mut self.concerns {
            if c.revision <= refused && accepted < c.revision && c.types.contains(&i) {
                let first = !c.nacked;
                if !first {
                    continue; // one refusal per stream and revision, one text
                }
                c.nacked = true;
                self.rollouts.nacked(
                    c.revision,
                    RolloutNack {
                        node: node.to_owned(),
                        type_url: type_url.to_owned(),
                        error: error.to_owned(),
                        replica: String::new(),
                        stream_id: self.stream_id,
                    },
                    first,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
