//! Heartbeats: what renews the TTL of the TTL'd resources a client holds, without a body
//! where Envoy allows it, and without touching the snapshot.
//!
//! Delta: one `Resource { name, version, ttl }` per TTL'd resource held, no body; Envoy's
//! `DeltaSubscriptionState::isHeartbeatResource` takes a bodiless resource at the version it
//! holds as a TTL renewal only.
//!
//! SotW: the type's whole state as last sent, at the same `version_info`, TTL'd resources
//! with their bodies. Envoy's SotW muxes (`GrpcMuxImpl`, `SotwSubscriptionState`) hand only
//! non-heartbeat resources on as the new state of the world, so a bodiless heartbeat would
//! remove a wildcard (LDS, CDS) resource, and the legacy mux does not renew the TTL of one
//! either. A resend renews every TTL, removes nothing, and costs no encoding: the bodies are
//! the index's shared bytes.

use std::time::Duration;

use super::respond::sotw_entry;
use super::*;
use crate::wire::{DeltaResponse, SotwResponse};

impl TypeState {
    /// The shortest TTL among what the client holds of this type; `None` when it holds
    /// nothing with a TTL (no heartbeats).
    pub fn shortest_ttl(&self) -> Option<Duration> {
        self.sent
            .values()
            .filter_map(|sent| match sent {
                Sent::Delivered(item) => item.ttl(),
                Sent::Reported(_) => None,
            })
            .min()
    }

    /// Delta heartbeat: name, version and TTL of every TTL'd resource the client holds.
    pub fn delta_heartbeat(&mut self, seq: u64, system_version: &str) -> Option<DeltaResponse> {
        let mut response = DeltaResponse::default();
        for (key, sent) in &self.sent {
            if let Sent::Delivered(item) = sent
                && item.ttl().is_some()
            {
                let mut heartbeat = item.wrapped(key.name());
                heartbeat.body = None;
                response.resources.push(heartbeat);
            }
        }
        self.finish_delta(response, seq, system_version)
    }

    /// SotW heartbeat: the state last sent, again, when it holds a TTL'd resource. Not after
    /// a refusal: the client would refuse the same state again.
    pub fn sotw_heartbeat(&mut self, seq: u64, wrap_all: bool) -> Option<SotwResponse> {
        self.shortest_ttl()?;
        let version = self.last_version.clone()?;
        if self.nacked_version.as_deref() == Some(version.as_str()) {
            return None;
        }
        let resources: Vec<_> = self
            .sent
            .iter()
            .filter_map(|(key, sent)| match sent {
                Sent::Delivered(item) => Some(sotw_entry(key, item, wrap_all)),
                Sent::Reported(_) => None,
            })
            .collect();
        let nonce = self.sotw_outstanding(seq, &version);
        Some(SotwResponse {
            version_info: version,
            resources,
            type_url: self.type_url.clone(),
            nonce,
        })
    }
}
