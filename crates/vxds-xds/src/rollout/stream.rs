//! One stream's part of rollout tracking ([`StreamRollout`]): which recent revisions changed
//! something the stream resolves, and whether its client accepted or refused each (see the
//! parent module's documentation).

use std::collections::VecDeque;
use std::sync::Arc;

use vxds_core::rollout::RolloutNack;

use super::{MAX_CONCERNS, Rollouts};

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
pub(super) struct Concern {
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
    pub(super) concerns: VecDeque<Concern>,
    /// The records' epoch this stream's part belongs to (see [`Rollouts::epoch`]).
    epoch: u64,
    /// A Delta stream: a response carries only what changed, so accepting one computed from
    /// a refused revision (the removals the refusal released) accepts nothing it refused.
    delta: bool,
}

impl Drop for StreamRollout {
    fn drop(&mut self) {
        // Concerns of an epoch before a reload are not the new epoch's revisions of the
        // same numbers: their records went with the reload.
        if self.epoch != self.rollouts.epoch() {
            return;
        }
        for c in std::mem::take(&mut self.concerns) {
            self.rollouts.gone(c.revision, c.nacked);
        }
    }
}

impl StreamRollout {
    pub fn new(rollouts: Arc<Rollouts>, stream_id: u64) -> Self {
        let epoch = rollouts.epoch();
        Self {
            rollouts,
            stream_id,
            types: Vec::new(),
            concerns: VecDeque::new(),
            epoch,
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
