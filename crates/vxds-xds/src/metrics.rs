//! Prometheus metrics of the xDS server.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    pub service: &'static str,
    pub protocol: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub type_url: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClosedLabels {
    /// `client` (it closed), `keepalive` (a ping went unanswered), `silent` (it sent nothing),
    /// `error` (a reset, a protocol error), `max_age`, `drain`.
    pub reason: &'static str,
}

#[derive(Debug)]
pub struct XdsMetrics {
    /// Open HTTP/2 connections.
    pub connections: Gauge<i64, AtomicI64>,
    pub connections_closed: Family<ClosedLabels, Counter>,
    /// 1 while the server drains.
    pub draining: Gauge<i64, AtomicI64>,
    /// Streams ended for sending requests faster than the per-stream limit.
    pub rate_limited: Counter,
    /// Unary `Fetch*` calls refused for exceeding their connection's allowance.
    pub rate_limited_fetches: Counter,
    /// Streams ended for leaving too many responses unanswered.
    pub unanswered_ended: Counter,
    pub streams: Family<StreamLabels, Gauge<i64, AtomicI64>>,
    pub responses: Family<TypeLabels, Counter>,
    pub acks: Family<TypeLabels, Counter>,
    pub nacks: Family<TypeLabels, Counter>,
    /// Heartbeat responses (TTL'd resources kept alive), by type.
    pub heartbeats: Family<TypeLabels, Counter>,
    /// Seconds from a revision's commit to a response carrying it.
    pub push_latency: Histogram,
    /// Seconds from a revision's commit to each concerned stream's ACK of it (or of a later
    /// revision), per stream and revision.
    pub convergence: Histogram,
    /// Requests ignored for naming a type URL the server does not know. Not labelled by type:
    /// the client chooses it.
    pub unknown_type_requests: Counter,
}

impl XdsMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self {
            connections: Gauge::default(),
            connections_closed: Family::default(),
            draining: Gauge::default(),
            rate_limited: Counter::default(),
            rate_limited_fetches: Counter::default(),
            unanswered_ended: Counter::default(),
            streams: Family::default(),
            responses: Family::default(),
            acks: Family::default(),
            nacks: Family::default(),
            heartbeats: Family::default(),
            push_latency: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            convergence: Histogram::new(exponential_buckets(0.001, 2.0, 20)),
            unknown_type_requests: Counter::default(),
        };
        registry.register(
            "vxds_xds_connections",
            "Open xDS connections",
            metrics.connections.clone(),
        );
        registry.register(
            "vxds_xds_connections_closed",
            "xDS connections closed, by reason: client, keepalive, silent, error, max_age, drain",
            metrics.connections_closed.clone(),
        );
        registry.register(
            "vxds_xds_draining",
            "1 while the xDS server drains its connections before exiting",
            metrics.draining.clone(),
        );
        registry.register(
            "vxds_xds_heartbeats",
            "Heartbeat responses that keep clients' TTL'd resources alive, by type",
            metrics.heartbeats.clone(),
        );
        registry.register(
            "vxds_xds_rate_limited_streams",
            "Streams ended for sending requests faster than the per-stream limit",
            metrics.rate_limited.clone(),
        );
        registry.register(
            "vxds_xds_rate_limited_fetches",
            "Unary Fetch calls refused for exceeding their connection's request rate",
            metrics.rate_limited_fetches.clone(),
        );
        registry.register(
            "vxds_xds_unanswered_streams",
            "Streams ended for leaving more responses unanswered than --xds-max-unanswered",
            metrics.unanswered_ended.clone(),
        );
        registry.register(
            "vxds_xds_streams",
            "Connected xDS streams",
            metrics.streams.clone(),
        );
        registry.register(
            "vxds_xds_responses",
            "xDS responses sent, by type",
            metrics.responses.clone(),
        );
        registry.register(
            "vxds_xds_acks",
            "Responses clients acknowledged, by type",
            metrics.acks.clone(),
        );
        registry.register(
            "vxds_xds_nacks",
            "Responses clients refused, by type",
            metrics.nacks.clone(),
        );
        registry.register(
            "vxds_xds_push_latency_seconds",
            "From a revision's commit to the response that carries it",
            metrics.push_latency.clone(),
        );
        registry.register(
            "vxds_xds_convergence_seconds",
            "From a revision's commit to each stream it changed accepting it (or a later revision)",
            metrics.convergence.clone(),
        );
        registry.register(
            "vxds_xds_unknown_type_requests",
            "Requests ignored for naming a type URL that is no message of the Envoy API",
            metrics.unknown_type_requests.clone(),
        );
        metrics
    }

    /// Metrics that go nowhere, for tests and tools.
    pub fn unregistered() -> Self {
        Self::register(&mut Registry::default())
    }
}

/// A family of per-type counters of [`XdsMetrics`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PerType {
    Responses,
    Acks,
    Nacks,
    Heartbeats,
}

/// One stream's handles on the per-type counters, each looked up in its family once: a
/// lookup hashes a freshly allocated label and takes the family's lock, and it came once per
/// response and once per ACK on every stream. Created on first use, as the families do, so a
/// series appears only once it counts something. A stream speaks a few types: a short list.
#[derive(Debug, Default)]
pub(crate) struct TypeCounters {
    /// By interned type URL (`crate::types::intern`): the search compares bytes every stream
    /// shares, in cache, not a copy of the stream's own.
    handles: Vec<(PerType, &'static str, Counter)>,
}

impl TypeCounters {
    pub(crate) fn get(&mut self, metrics: &XdsMetrics, which: PerType, type_url: &str) -> &Counter {
        let found = self
            .handles
            .iter()
            .position(|(w, t, _)| *w == which && *t == type_url);
        let i = match found {
            Some(i) => i,
            None => {
                let family = match which {
                    PerType::Responses => &metrics.responses,
                    PerType::Acks => &metrics.acks,
                    PerType::Nacks => &metrics.nacks,
                    PerType::Heartbeats => &metrics.heartbeats,
                };
                let labels = TypeLabels {
                    type_url: type_url.to_owned(),
                };
                let counter = family.get_or_create(&labels).clone();
                self.handles
                    .push((which, crate::types::intern(type_url), counter));
                self.handles.len() - 1
            }
        };
        &self.handles[i].2
    }
}
