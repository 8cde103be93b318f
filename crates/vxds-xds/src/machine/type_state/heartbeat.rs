//! Heartbeats: what renews the TTLs of what a client *accepted*, at the accepted versions,
//! without touching the snapshot. Each resource is renewed at its own TTL's pace.
//!
//! Delta: `Resource { name, version, ttl }` without a body, only for what Envoy takes as a
//! heartbeat (`DeltaSubscriptionState::isHeartbeatResource`): a bodiless resource at the version
//! it holds of a name it subscribed to by name, or under the wildcard. A member of a glob
//! collection is neither: Envoy would check the missing body's type URL and refuse the whole
//! response, and it never registers a TTL for such a member anyway, so it gets no heartbeat.
//! VHDS gets none (Envoy does not support heartbeats there). What a reconnecting client
//! reported holding is first renewed *with* its body: its TTL kept running while it was away,
//! and may have run out. A refused Delta heartbeat means a TTL ran out before it arrived
//! (Envoy dropped the resource and takes no bodiless renewal of it): what it renewed is sent
//! again in full, and nothing is held back as for a refused update.
//!
//! SotW: bodies, at the accepted `version_info`. Envoy's legacy mux (`GrpcMuxImpl`) leaves a
//! bodiless resource out of the update *and* out of its TTL renewal, so only a resource with
//! its body renews a TTL with both muxes. Only EDS and RDS take a partial response as it is
//! (Envoy's unified mux gives a watch that got nothing an empty update, a no-op for those two),
//! so only their heartbeat carries the due TTL'd resources alone. For every other type an
//! empty update means "remove all" or is refused (SDS "Missing SDS resources", RTDS and ECDS
//! count checks, SRDS drops every scope missing; LDS and CDS remove what is missing), so the
//! heartbeat is the whole accepted state. A heartbeat never overtakes an unanswered response
//! of its type.

use std::time::{Duration, Instant};

use super::sotw_state::sotw_entry;
use super::*;
use crate::types::{ENDPOINT, ROUTE, VIRTUAL_HOST};
use crate::wire::{DeltaResponse, SotwEntry, SotwResponse};

/// A type with this many responses unanswered gets no heartbeats: the client is behind (or
/// gone), and heartbeats would only queue behind the rest.
pub const HEARTBEAT_BACKLOG: usize = 4;

/// When a heartbeat round runs, and how it paces each resource.
#[derive(Clone, Copy, Debug)]
pub struct Beat {
    pub now: Instant,
    /// How often the stream is woken: a resource is renewed now if waiting one more period
    /// would take it past its own renewal point.
    pub period: Duration,
    /// Renewal at this fraction of each resource's TTL.
    pub fraction: f64,
}

impl TypeState {
    /// Whether the client renews `key`'s TTL from a bodiless Delta heartbeat.
    fn delta_heartbeats(&self, key: &ItemKey) -> bool {
        if *self.type_url == *VIRTUAL_HOST {
            return false;
        }
        match key {
            ItemKey::Name(name) => self.wildcard() || self.names.contains_key(name),
            ItemKey::Variant(name, _) => self.locators.contains_key(name),
        }
    }

    /// The shortest TTL among what heartbeats renew on this type; `None` when nothing. From
    /// the accepted items in TTL order: the first one heartbeats renew (Delta passes over glob
    /// members, which get none), never a walk of the items without a TTL.
    pub fn shortest_ttl(&self, delta: bool) -> Option<Duration> {
        self.accepted
            .by_ttl()
            .find(|(_, key)| !delta || self.delta_heartbeats(key))
            .map(|(ttl, _)| ttl)
    }

    /// What was accepted with its body since the last round counts as renewed now.
    fn settle_fresh(&mut self, beat: Beat) {
        for key in self.fresh.take() {
            self.renewed.insert(key, beat.now);
        }
    }

    fn due(&self, key: &ItemKey, ttl: Duration, beat: Beat) -> bool {
        self.renewed
            .get(key)
            .is_none_or(|last| beat.now + beat.period >= *last + ttl.mul_f64(beat.fraction))
    }

    /// Delta heartbeat: name, accepted version and TTL of each due TTL'd item.
    pub fn delta_heartbeat(
        &mut self,
        seq: u64,
        system_version: &Arc<str>,
        beat: Beat,
    ) -> Option<DeltaResponse> {
        self.settle_fresh(beat);
        if self.unanswered >= HEARTBEAT_BACKLOG {
            return None;
        }
        let in_flight = self.in_flight();
        let mut response = DeltaResponse::default();
        let mut renewed = Vec::new();
        for (key, item) in &self.accepted {
            let Some(ttl) = item.ttl() else { continue };
            if in_flight.contains(key) || !self.delta_heartbeats(key) || !self.due(key, ttl, beat) {
                continue;
            }
            let mut heartbeat = item.wrapped(key.name());
            if !self.renew_with_body.contains(key) {
                heartbeat.body = None;
            }
            response.resources.push(heartbeat);
            renewed.push(key.clone());
        }
        for key in &renewed {
            self.renew_with_body.remove(key);
            self.renewed.insert(key.clone(), beat.now);
        }
        let response = self.finish_delta(
            response,
            seq,
            system_version,
            accepted::Carried::Changes(Vec::new()),
        )?;
        self.mark_heartbeat(&response.nonce, renewed);
        Some(response)
    }

    /// The client refused a Delta heartbeat: Envoy takes a bodiless renewal only of what it
    /// holds at that version, so its TTL for some of `renewed` ran out before the heartbeat
    /// came (a reconnect, a stalled stream). It no longer holds them: each is sent again in
    /// full by the next poll — at the server's version now, like any missing resource — and
    /// renewed from then on as any delivery. One with a change in flight gets that change.
    pub(super) fn lapsed(&mut self, renewed: &[ItemKey]) {
        let in_flight: BTreeSet<ItemKey> = self.in_flight().into_iter().cloned().collect();
        for key in renewed {
            if !self.accepted.contains_key(key) {
                continue;
            }
            self.accepted.remove(key);
            self.renewed.remove(key);
            self.fresh.remove(key);
            self.renew_with_body.remove(key);
            if in_flight.contains(key) {
                continue;
            }
            // Not held any more, wanted or not: a removal still pending is moot, and what is
            // put back later with the same content must be sent.
            self.unsend(key);
            self.dirty.insert(key.clone());
        }
    }

    /// SotW heartbeat: the due TTL'd resources (EDS, RDS) or the whole accepted state (every
    /// other type), with bodies, at the accepted version.
    pub fn sotw_heartbeat(&mut self, seq: u64, wrap_all: bool, beat: Beat) -> Option<SotwResponse> {
        self.settle_fresh(beat);
        if !self.outstanding.is_empty() || self.unanswered >= HEARTBEAT_BACKLOG {
            return None;
        }
        let version = self.accepted_version.clone()?;
        let due: Vec<ItemKey> = self
            .accepted
            .iter()
            .filter(|(key, item)| item.ttl().is_some_and(|ttl| self.due(key, ttl, beat)))
            .map(|(key, _)| key.clone())
            .collect();
        if due.is_empty() {
            return None;
        }
        // Only EDS and RDS take a partial response without removing or refusing anything.
        let complete = *self.type_url != *ENDPOINT && *self.type_url != *ROUTE;
        let resources: Vec<SotwEntry> = self
            .accepted
            .iter()
            .filter(|(key, item)| {
                if complete {
                    return true;
                }
                item.ttl().is_some() && due.contains(key)
            })
            .map(|(key, item)| sotw_entry(key, item, wrap_all))
            .collect();
        // Every TTL'd resource sent is renewed, due or not.
        let sent: Vec<ItemKey> = self
            .accepted
            .iter()
            .filter(|(key, item)| item.ttl().is_some() && (complete || due.contains(key)))
            .map(|(key, _)| key.clone())
            .collect();
        for key in sent {
            self.renewed.insert(key, beat.now);
        }
        let version: Arc<str> = Arc::from(version);
        let nonce = self.sotw_outstanding(seq, &version);
        self.mark_heartbeat(&nonce, Vec::new());
        Some(SotwResponse {
            version_info: version,
            resources: resources.into(),
            type_url: self.type_url.clone(),
            nonce,
        })
    }
}
