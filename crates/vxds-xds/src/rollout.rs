//! Rollout tracking: for each recent revision, which of this replica's streams it changed,
//! and which of them accepted or refused it.
//!
//! Per stream ([`StreamRollout`], in `stream`, owned by the stream's task beside its machine):
//! the recent revisions that changed something the stream resolves (*concerns*) and what each
//! still waits for, until the client has accepted all of it (acked) — or refused some (nacked;
//! acked after all once what it refused is accepted again). See `stream` for the rules.
//! What a stream of a known node leaves open waits for the node to reconnect (`reconnect`).
//!
//! Per replica ([`Rollouts`]): a [`RolloutRecord`] of counts per revision, for the last
//! [`ROLLOUT_WINDOW`] revisions; older revisions are forgotten. A stream follows at most
//! [`MAX_CONCERNS`] open revisions; beyond, the oldest is counted `gone`. Memory: a record is a
//! few hundred bytes plus up to [`vxds_core::rollout::MAX_NACKS`] NACK texts; a stream's part
//! is a few words per type, per unanswered response and per open revision.

mod reconnect;
mod stream;

pub use reconnect::{MAX_PARKED_NODES, NodeKey, RECONNECT_GRACE};
pub use stream::{
    Computation, Dependency, HeldRemoval, Mark, NEED_GRACE, StreamRollout, Subscriptions,
};

use std::collections::BTreeMap;
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
    /// Notified when a revision's outcome may have changed here: a stream refused it, or
    /// nothing of it is pending or undecided any more (as [`Self::settled`]). Waiters
    /// look again at the merged status ([`vxds_core::rollout::RolloutStatus`], whose
    /// state changes only then).
    pub changed: Notify,
    /// Notified when a revision settles on this replica (nothing pending or undecided) or a
    /// stream refuses one: the client summary is published early (debounced) so that other
    /// replicas see it.
    pub settled: Notify,
    /// Observes commit → ACK, in seconds (the convergence histogram). Set once, at start:
    /// read without a lock by every stream's every accepted revision.
    observer: std::sync::OnceLock<Observer>,
    /// The index's epoch of the records: a reload (the database's head went back or
    /// diverged, as after a failover) reuses revision numbers for other content, so the
    /// records and what streams accepted start over.
    epoch: std::sync::atomic::AtomicU64,
    /// Revisions streams left open, waiting for their node to reconnect (`reconnect`).
    parked: Mutex<reconnect::Parked>,
    /// How long they wait; none by default.
    reconnect_grace: std::time::Duration,
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

    /// Sets what every commit → ACK time is reported to (the metric); the first one set
    /// stays.
    pub fn observe_with(&self, observer: Observer) {
        let _ = self.observer.set(observer);
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
        // Only what can end a wait for the revision's outcome (a refusal, the last answer):
        // waking the waiters' list on every stream's every answer took its lock each time.
        if settled {
            self.changed.notify_waiters();
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
                self.forget_parked();
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
            && let Some(observe) = self.observer.get()
        {
            observe(ms as f64 / 1000.0);
        }
    }

    fn nacked(&self, revision: u64, nack: RolloutNack) {
        self.update(revision, |r| {
            r.pending = r.pending.saturating_sub(1);
            r.nacked += 1;
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
        self.expire_parked();
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
        self.expire_parked();
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

/// The types a revision changed for one stream, as bits by push order ([`crate::types::PUSH_ORDER`];
/// one bit for every other type): a refusal of another type is not a refusal of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TypeMask(u32);

impl TypeMask {
    /// Every type: the stream was told that everything changed.
    pub const ALL: Self = Self(u32::MAX);
    pub const NONE: Self = Self(0);

    fn bit(type_url: &str) -> u32 {
        1 << crate::types::push_rank(type_url)
    }

    /// With `type_url` too.
    #[must_use]
    pub fn with(self, type_url: &str) -> Self {
        Self(self.0 | Self::bit(type_url))
    }

    #[must_use]
    pub fn union(self, other: Self) -> Self {
        Self(self.0 | other.0)
    }

    /// Whether a response of `type_url` may carry what these types changed: one of their
    /// own; or any response of a type outside the push order (a list collection follows its
    /// members, of another type).
    pub fn reaches(self, type_url: &str) -> bool {
        let rank = crate::types::push_rank(type_url);
        rank == crate::types::PUSH_ORDER.len() || self.0 & (1 << rank) != 0
    }
}

#[cfg(test)]
mod tests;
