//! One stream's part of rollout tracking ([`StreamRollout`]): which recent revisions changed
//! something the stream resolves, and whether its client accepted or refused each.
//!
//! Per type: the revision of the snapshot the last response was computed from (*sent*), the
//! revision of the last response the client ACKed (*accepted*) and of the last it NACKed, and
//! the responses in flight (nonce, revision, and on Delta the names each carried). Per open
//! revision (*concern*), what it waits for:
//! - the types the revision changed for the stream, accepted at its revision or later;
//! - the removals it made due and that are held back (make-before-break), by name, until the
//!   responses that carry them are accepted;
//! - what the resources it sent name and the client fetches next (a listener's RDS route, a
//!   cluster's EDS endpoints, a secret, gRPC's LDS → RDS → CDS → EDS; on ADS streams only, a
//!   cluster only when the client subscribes to it by name), until sent and accepted: Envoy
//!   ACKs a listener while it warms, and serves it only once its route is in. What the client
//!   does not ask for within [`NEED_GRACE`] it fetches elsewhere: no longer waited for;
//! - once refused, on Delta: the refused names (a Delta response carries only what changed),
//!   until a response carrying each of them again (as an update or a removal) is accepted or
//!   the client unsubscribes from it. On SotW every response carries the type's whole state,
//!   so a later accepted response of the type settles the refusal.
//!
//! A revision concerns a stream when the dispatcher marked the stream for it (a subscription
//! of the stream names a changed resource) *and* the stream, computing from a snapshot at that
//! revision or later, had something of the types the revision changed to send: a revision that
//! changes nothing the stream resolves (another variant, say) does not concern it. Marks
//! coalesce while a stream is busy: each marked revision takes, of what one computation sent,
//! the types it changed ([`TypeMask`]), and a refusal counts against the revisions whose types
//! it refused.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use smallvec::SmallVec;

use super::{MAX_CONCERNS, NodeKey, Rollouts, TypeMask};
use crate::machine::Response;
use crate::types;

mod answers;

/// How long a revision waits for the client to ask for something its resources name: a name
/// it has not subscribed to by then it fetches elsewhere (a static secret in Envoy's
/// bootstrap, another SDS server) or on demand (SRDS scopes), and is no longer waited for.
/// Once asked for, the wait goes on to the client's answer.
pub const NEED_GRACE: Duration = Duration::from_secs(10);

/// A revision the stream was told of: its index epoch, and the types it changed for the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub epoch: u64,
    pub revision: u64,
    pub types: TypeMask,
}

/// A removal due and held back until earlier responses are answered (make-before-break).
#[derive(Clone, Copy, Debug)]
pub struct HeldRemoval<'a> {
    pub type_url: &'a str,
    pub name: &'a Arc<str>,
    /// It became due in the last computation: it is the marked revisions'.
    pub due_now: bool,
}

/// Something a resource just sent names that the client does not hold accepted and fetches
/// next (see the module's documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dependency {
    /// The resource that names it: its type and name.
    pub from_type: String,
    pub from_name: Arc<str>,
    pub type_url: &'static str,
    pub name: Arc<str>,
    /// The response in flight that carries it (sent, not yet answered), if one does; else it
    /// is still to be sent (the client has not asked for it yet).
    pub nonce: Option<u64>,
}

/// What rollout tracking asks of the stream's machine.
pub trait Subscriptions {
    /// Whether the client subscribes to `name` of `type_url`: a SotW response of the type
    /// answers for it (carries it, or says it does not exist).
    fn subscribes(&self, type_url: &str, name: &str) -> bool;
    /// Whether what the client was last sent of `from_name` (of `from_type`) still names
    /// `(type_url, name)`.
    fn still_names(
        &self,
        from_type: &str,
        from_name: &Arc<str>,
        type_url: &str,
        name: &str,
    ) -> bool;
    /// Whether the client subscribes to `type_url` and holds what it should of it, nothing
    /// in flight, refused or held back: after a computation from a snapshot, it holds that
    /// snapshot's state (a Delta client that reconnects reporting what it holds is sent
    /// nothing it already has).
    fn in_sync(&self, type_url: &str) -> bool;
}

/// One computation of the stream, after it ran.
#[derive(Clone, Copy, Debug)]
pub struct Computation<'a> {
    /// The snapshot's index epoch and revision.
    pub epoch: u64,
    pub revision: u64,
    /// The revisions the stream was told of since its last computation.
    pub marked: &'a [Mark],
    /// What it sent (heartbeats excepted; a nonce that is no number is never matched by an
    /// answer).
    pub responses: &'a [Response],
    /// The removals due and held back after it.
    pub held: &'a [HeldRemoval<'a>],
    /// What the resources it sent name and the client does not hold (only looked for when
    /// [`StreamRollout::follows_references`] says so).
    pub dependencies: &'a [Dependency],
}

/// A name, as a Delta response carried it, kept as a hash: kept for every Delta response in
/// flight, so inline for a few and never a copy of the string. A collision (2^-64) would
/// only settle a refusal early.
type NameHash = u64;

#[cfg(test)]
thread_local! {
    /// Names hashed on this thread: what a client's input costs, counted.
    pub(super) static NAMES_HASHED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// FNV-1a: deterministic and cheap for short names.
fn name_hash(name: &str) -> NameHash {
    #[cfg(test)]
    NAMES_HASHED.with(|n| n.set(n.get() + 1));
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The names a Delta response carried, updated or removed; none for SotW (a SotW response
/// carries the whole state).
fn carried_names(response: &Response) -> SmallVec<[NameHash; 4]> {
    match response {
        Response::Sotw(_) => SmallVec::new(),
        Response::Delta(r) => (r.resources.iter().map(|w| name_hash(&w.name)))
            .chain(r.removed_resources.iter().map(|n| name_hash(n)))
            .chain(r.removed_resource_names.iter().map(|n| name_hash(&n.name)))
            .collect(),
    }
}

/// Whether `response` answers for `name`: a Delta response carrying it (updated, removed,
/// or reported missing), a SotW response while the client subscribes to it.
fn answers_for(response: &Response, name: &str, stream: &dyn Subscriptions) -> bool {
    match response {
        Response::Sotw(r) => stream.subscribes(&r.type_url, name),
        Response::Delta(r) => {
            r.resources.iter().any(|w| &*w.name == name)
                || r.removed_resources.iter().any(|n| n == name)
                || r.removed_resource_names.iter().any(|n| n.name == name)
        }
    }
}

#[derive(Debug)]
struct InFlight {
    nonce: u64,
    /// The revision it was computed from.
    revision: u64,
    /// Delta: the names it carried.
    names: SmallVec<[NameHash; 4]>,
}

#[derive(Debug)]
struct TypeRollout {
    type_url: &'static str,
    /// The revision the last response was computed from.
    sent: u64,
    /// The revision of the last response the client accepted.
    accepted: u64,
    /// The revision of the last response the client refused.
    refused: u64,
    /// The nonce of the last response the client accepted.
    accepted_nonce: u64,
    /// Responses sent and not yet answered, oldest first. An answer decides by the response
    /// it names: an ACK of an older Delta response accepts that response's revision, not the
    /// newest sent; an answer to a heartbeat (never listed) decides nothing.
    in_flight: VecDeque<InFlight>,
}

/// Unanswered responses remembered per type; beyond, the oldest are forgotten (an answer to
/// one of them then decides nothing).
const MAX_IN_FLIGHT: usize = 64;

/// Something a resource sent for a revision names, which the client is to fetch next.
#[derive(Debug)]
struct Need {
    /// Its type (an index into `StreamRollout::types`) and name.
    ty: usize,
    name: Arc<str>,
    /// The resource that names it.
    from: (usize, Arc<str>),
    /// The response that answers for it, once sent.
    nonce: Option<u64>,
    /// Until when it waits for the client to ask for it ([`NEED_GRACE`] after it was
    /// recorded), while no response answers for it.
    until: Instant,
}

#[derive(Debug)]
struct Concern {
    revision: u64,
    /// The types it changed for the stream (indexes into `StreamRollout::types`): inline,
    /// a revision changes one or two types for most streams.
    types: SmallVec<[usize; 2]>,
    nacked: bool,
    /// The removals it made due that are held back, `(type, name)`: it is not accepted
    /// before they go. Removals others made due are not its.
    awaiting: Vec<(usize, Arc<str>)>,
    /// The responses that carried its held-back removals, `(type, nonce)`: it is not accepted
    /// before the client accepts each (accepting the type at its revision is not enough: an
    /// update of the type at that revision may have gone first).
    removals: Vec<(usize, u64)>,
    /// What its resources name that the client fetches next.
    needs: Vec<Need>,
    /// Delta: the names refused, `(type, name)`, not yet accepted again. A set: a refusal
    /// of a large response, and what the client answers after it, cost in proportion to the
    /// names, not to their product.
    refused: HashSet<(usize, NameHash)>,
    /// Taken over from a previous stream of the node (`reconnect`): this stream's state of
    /// its types decides it, whatever was or was not sent on this stream.
    adopted: bool,
}

impl Concern {
    /// Whether the response `nonce` of type `ty` carries something it waits for and the
    /// client has not accepted (`accepted_nonce`): its removals, or what its resources name.
    /// On SotW a response answers for every one before it; on Delta only for itself.
    fn waits_on(&self, ty: usize, nonce: u64, accepted_nonce: u64, delta: bool) -> bool {
        let carried = |m: u64| accepted_nonce < m && (m == nonce || (!delta && m < nonce));
        self.removals.iter().any(|&(i, m)| i == ty && carried(m))
            || self
                .needs
                .iter()
                .any(|n| n.ty == ty && n.nonce.is_some_and(carried))
    }
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
    /// A Delta stream: a response carries only what changed.
    delta: bool,
    /// Its client, once known: what it leaves open waits for the node to reconnect.
    node: Option<NodeKey>,
}

impl Drop for StreamRollout {
    fn drop(&mut self) {
        // Concerns of an epoch before a reload are not the new epoch's revisions of the
        // same numbers: their records went with the reload.
        if self.epoch != self.rollouts.epoch() {
            return;
        }
        for c in std::mem::take(&mut self.concerns) {
            // A refusal stands whoever answers next; what is unanswered waits for the node.
            let parked = !c.nacked
                && self.node.as_ref().is_some_and(|node| {
                    let types = self.waited_types(&c);
                    self.rollouts.park(node, c.revision, types)
                });
            if !parked {
                self.rollouts.gone(c.revision, c.nacked);
            }
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
            node: None,
        }
    }

    /// The stream's client is `node` on `service` (its first request says so): it takes over
    /// what a previous stream of the node left open within the reconnect grace.
    pub fn identify(&mut self, service: &'static str, node: &str) {
        if node.is_empty() || self.node.is_some() {
            return;
        }
        self.sync_epoch();
        let key: NodeKey = (service, node.to_owned());
        for (revision, types) in self.rollouts.adopt(&key) {
            let types = types.into_iter().map(|t| self.type_index(t)).collect();
            if self.concerns.len() >= MAX_CONCERNS
                && let Some(oldest) = self.concerns.pop_front()
            {
                self.rollouts.gone(oldest.revision, oldest.nacked);
            }
            self.concerns.push_back(Concern {
                revision,
                types,
                nacked: false,
                awaiting: Vec::new(),
                removals: Vec::new(),
                needs: Vec::new(),
                refused: HashSet::new(),
                adopted: true,
            });
        }
        self.node = Some(key);
    }

    /// Every type `c` waits for something of, as type URLs.
    fn waited_types(&self, c: &Concern) -> Vec<&'static str> {
        let mut types: Vec<usize> = c.types.to_vec();
        types.extend(c.awaiting.iter().map(|(i, _)| *i));
        types.extend(c.removals.iter().map(|(i, _)| *i));
        types.extend(c.needs.iter().map(|n| n.ty));
        types.sort_unstable();
        types.dedup();
        types.into_iter().map(|i| self.types[i].type_url).collect()
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

    fn type_index(&mut self, type_url: &str) -> usize {
        if let Some(i) = self.find_type(type_url) {
            return i;
        }
        self.types.push(TypeRollout {
            type_url: types::intern(type_url),
            sent: 0,
            accepted: 0,
            refused: 0,
            accepted_nonce: 0,
            in_flight: VecDeque::new(),
        });
        self.types.len() - 1
    }

    /// The index of `type_url` if something of it was sent (a client's answer for a type
    /// never sent decides nothing).
    fn find_type(&self, type_url: &str) -> Option<usize> {
        self.types.iter().position(|t| t.type_url == type_url)
    }

    /// The names refused and not accepted again, over its open revisions.
    #[cfg(test)]
    pub(super) fn refused_names(&self) -> usize {
        self.concerns.iter().map(|c| c.refused.len()).sum()
    }

    /// The revisions it follows.
    #[cfg(test)]
    pub(super) fn open_revisions(&self) -> usize {
        self.concerns.len()
    }

    /// The revision of what the client accepted of `type_url`, and of what was sent since and
    /// is still unanswered (or refused).
    pub fn versions(&self, type_url: &str) -> Option<(u64, u64)> {
        self.types
            .iter()
            .find(|t| t.type_url == type_url)
            .map(|t| (t.accepted, t.sent))
    }

    /// Whether a computation that sends nothing and was told of nothing can still decide
    /// something: a revision waits for a held-back removal to go, for something named to be
    /// sent, or for a reconnected client to be found in sync. Otherwise such a computation
    /// may be skipped ([`Self::computed`] would change nothing).
    pub fn waits_on_computation(&self) -> bool {
        self.concerns
            .iter()
            .any(|c| !c.awaiting.is_empty() || !c.needs.is_empty() || c.adopted)
    }

    /// Whether the next computation should report what the resources it sends name
    /// ([`Computation::dependencies`]): when it was told of revisions, or a revision waits
    /// for something named to be sent (what is sent for it may name more). Otherwise no one
    /// would wait for them, and the machine does not look.
    pub fn follows_references(&self, marked: &[Mark]) -> bool {
        !marked.is_empty() || self.concerns.iter().any(|c| !c.needs.is_empty())
    }

    /// The stream computed (see [`Computation`]). A computation from a snapshot of another
    /// index epoch than the records' decides nothing of their revisions, and revisions of an
    /// epoch before a reload are no longer followed (their records went with it; their numbers
    /// may name other revisions now).
    pub fn computed(&mut self, c: Computation<'_>, stream: &dyn Subscriptions) {
        self.sync_epoch();
        let epoch = self.epoch;
        if c.epoch != epoch {
            for m in c.marked.iter().filter(|m| m.epoch == epoch) {
                self.rollouts.decided(m.revision, false);
            }
            return;
        }
        // What went, by type: `(type, nonce)`, in order.
        let mut responses: SmallVec<[(usize, Option<u64>); 4]> = SmallVec::new();
        for response in c.responses {
            let i = self.type_index(response.type_url());
            let nonce = response.nonce().parse::<u64>().ok();
            let delta = self.delta;
            let t = &mut self.types[i];
            t.sent = c.revision;
            if let Some(nonce) = nonce {
                if t.in_flight.len() >= MAX_IN_FLIGHT {
                    t.in_flight.pop_front();
                }
                t.in_flight.push_back(InFlight {
                    nonce,
                    revision: c.revision,
                    names: if delta {
                        carried_names(response)
                    } else {
                        SmallVec::new()
                    },
                });
            }
            responses.push((i, nonce));
        }
        let held: SmallVec<[(usize, &Arc<str>, bool); 4]> = c
            .held
            .iter()
            .map(|h| (self.type_index(h.type_url), h.name, h.due_now))
            .collect();
        let mut settle = self.removals_went(&held, &responses);
        for m in c.marked.iter().filter(|m| m.epoch == epoch) {
            self.concern(m, &responses, &held, c.dependencies);
        }
        settle |= self.follow_needs(&c, &responses, stream);
        settle |= self.adopted_in_sync(c.revision, stream);
        if settle {
            self.settle();
        }
    }

    /// Types of revisions taken over from a previous stream that the client holds in sync
    /// after computing from the snapshot at `revision`: it holds that revision's state of
    /// them (a reconnecting Delta client is sent nothing it already has, so no answer would
    /// come). Whether one became so.
    fn adopted_in_sync(&mut self, revision: u64, stream: &dyn Subscriptions) -> bool {
        let mut synced = false;
        for k in 0..self.concerns.len() {
            if !self.concerns[k].adopted {
                continue;
            }
            for j in 0..self.concerns[k].types.len() {
                let t = &mut self.types[self.concerns[k].types[j]];
                if t.accepted < revision && stream.in_sync(t.type_url) {
                    t.accepted = revision;
                    synced = true;
                }
            }
        }
        synced
    }

    /// Removals concerns waited for that are no longer held back: they went, with the last
    /// response of their type in this computation, or stopped being due (the resource came
    /// back, the client unsubscribed). Whether a concern stopped waiting.
    fn removals_went(
        &mut self,
        held: &[(usize, &Arc<str>, bool)],
        responses: &[(usize, Option<u64>)],
    ) -> bool {
        let mut stopped = false;
        for c in self.concerns.iter_mut().filter(|c| !c.awaiting.is_empty()) {
            let Concern {
                awaiting, removals, ..
            } = c;
            awaiting.retain(|(ty, name)| {
                if held.iter().any(|(i, n, _)| i == ty && *n == name) {
                    return true;
                }
                let carrier = responses.iter().rev().find(|(i, _)| i == ty);
                if let Some(&(i, Some(nonce))) = carrier
                    && !removals.contains(&(i, nonce))
                {
                    removals.push((i, nonce));
                }
                false
            });
            stopped |= awaiting.is_empty();
        }
        stopped
    }

    /// Whether marked revision `m` concerns the stream, counted; if so it is followed with
    /// what of this computation is its: the types it changed that went, the removals of those
    /// types that became due, and what the resources of those types name.
    fn concern(
        &mut self,
        m: &Mark,
        responses: &[(usize, Option<u64>)],
        held: &[(usize, &Arc<str>, bool)],
        dependencies: &[Dependency],
    ) {
        let mut types: SmallVec<[usize; 2]> = SmallVec::new();
        for &(i, _) in responses {
            if !types.contains(&i) && m.types.reaches(self.types[i].type_url) {
                types.push(i);
            }
        }
        let awaiting: Vec<(usize, Arc<str>)> = held
            .iter()
            .filter(|(i, _, due_now)| *due_now && m.types.reaches(self.types[*i].type_url))
            .map(|&(i, name, _)| (i, name.clone()))
            .collect();
        let concerned = !types.is_empty() || !awaiting.is_empty();
        self.rollouts.decided(m.revision, concerned);
        if !concerned {
            return;
        }
        let mut needs = Vec::new();
        // The clock read only when something is named (most revisions name nothing).
        let mut until = None;
        for d in dependencies {
            let from = self.type_index(&d.from_type);
            if types.contains(&from) {
                let ty = self.type_index(d.type_url);
                needs.push(Need {
                    ty,
                    name: d.name.clone(),
                    from: (from, d.from_name.clone()),
                    nonce: d.nonce,
                    until: *until.get_or_insert_with(|| Instant::now() + NEED_GRACE),
                });
            }
        }
        if self.concerns.len() >= MAX_CONCERNS
            && let Some(oldest) = self.concerns.pop_front()
        {
            self.rollouts.gone(oldest.revision, oldest.nacked);
        }
        self.concerns.push_back(Concern {
            revision: m.revision,
            types,
            nacked: false,
            awaiting,
            removals: Vec::new(),
            needs,
            refused: HashSet::new(),
            adopted: false,
        });
    }

    /// What concerns wait to be sent: answered for by a response of this computation, it
    /// waits for that response's answer, and for what the resource sent names in turn. What
    /// the client's resources no longer name is no longer waited for. Whether some stopped.
    fn follow_needs(
        &mut self,
        c: &Computation<'_>,
        responses: &[(usize, Option<u64>)],
        stream: &dyn Subscriptions,
    ) -> bool {
        if self.concerns.iter().all(|c| c.needs.is_empty()) {
            return false;
        }
        let mut dropped = false;
        let until = Instant::now() + NEED_GRACE;
        for k in 0..self.concerns.len() {
            // Answered now: the response's nonce, and what the resource names in turn (which
            // may be answered for in this computation too).
            let mut at = 0;
            while at < self.concerns[k].needs.len() {
                let need = &self.concerns[k].needs[at];
                at += 1;
                if need.nonce.is_some() {
                    continue;
                }
                let type_url = self.types[need.ty].type_url;
                let answered =
                    c.responses.iter().zip(responses).rev().find(|(r, _)| {
                        r.type_url() == type_url && answers_for(r, &need.name, stream)
                    });
                let Some((_, &(_, Some(nonce)))) = answered else {
                    continue;
                };
                let (ty, name) = (need.ty, need.name.clone());
                self.concerns[k].needs[at - 1].nonce = Some(nonce);
                let named: Vec<&Dependency> = c
                    .dependencies
                    .iter()
                    .filter(|d| d.from_type == self.types[ty].type_url && d.from_name == name)
                    .collect();
                for d in named {
                    let named_ty = self.type_index(d.type_url);
                    let needs = &mut self.concerns[k].needs;
                    if !needs.iter().any(|n| n.ty == named_ty && n.name == d.name) {
                        needs.push(Need {
                            ty: named_ty,
                            name: d.name.clone(),
                            from: (ty, name.clone()),
                            nonce: d.nonce,
                            until,
                        });
                    }
                }
            }
            // Named no more (a later revision removed or changed what named it): nothing
            // will be fetched for it. Not asked for within the grace: fetched elsewhere.
            let types = &self.types;
            let now = Instant::now();
            self.concerns[k].needs.retain(|n| {
                let accepted = n.nonce.is_some_and(|m| types[n.ty].accepted_nonce >= m);
                let keep = accepted
                    || (n.nonce.is_some() || now < n.until)
                        && stream.still_names(
                            types[n.from.0].type_url,
                            &n.from.1,
                            types[n.ty].type_url,
                            &n.name,
                        );
                dropped |= !keep;
                keep
            });
        }
        dropped
    }

    /// When the first of what revisions wait for and the client has not asked for stops
    /// being waited for ([`NEED_GRACE`]): the stream's task wakes then ([`Self::needs_expired`])
    /// so that a revision on an idle stream settles. `None` when nothing waits so.
    pub fn need_deadline(&self) -> Option<Instant> {
        (self.concerns.iter())
            .flat_map(|c| &c.needs)
            .filter(|n| n.nonce.is_none())
            .map(|n| n.until)
            .min()
    }

    /// What the client did not ask for within [`NEED_GRACE`] is no longer waited for: the
    /// revisions that waited only for it count as accepted.
    pub fn needs_expired(&mut self) {
        self.sync_epoch();
        let now = Instant::now();
        let mut dropped = false;
        for c in &mut self.concerns {
            let before = c.needs.len();
            c.needs.retain(|n| n.nonce.is_some() || now < n.until);
            dropped |= c.needs.len() != before;
        }
        if dropped {
            self.settle();
        }
    }
}
