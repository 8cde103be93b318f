//! Prometheus metrics of the admin side, registered in the process-wide registry that
//! `GET /metrics` encodes (the ADS server registers its own in the same one).

use std::sync::atomic::AtomicU64;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::AdminState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Debug, Default)]
pub struct AdminMetrics {
    pub http_requests: Family<HttpLabels, Counter>,
    pub changesets: Family<OutcomeLabels, Counter>,
    pub head_revision: Gauge<u64, AtomicU64>,
    pub index_revision: Gauge<u64, AtomicU64>,
    pub index_resources: Gauge<u64, AtomicU64>,
    pub event_readers: Gauge,
    pub event_readers_dropped: Counter,
}

impl AdminMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        registry.register(
            "vxds_http_requests",
            "Admin API requests by method, route and status",
            metrics.http_requests.clone(),
        );
        registry.register(
            "vxds_changesets",
            "Changesets by outcome: committed, unchanged, dry_run, invalid, conflict, error",
            metrics.changesets.clone(),
        );
        registry.register(
            "vxds_store_head_revision",
            "The newest revision the store has committed",
            metrics.head_revision.clone(),
        );
        registry.register(
            "vxds_index_revision",
            "The revision the in-memory index holds",
            metrics.index_revision.clone(),
        );
        registry.register(
            "vxds_index_resources",
            "Resources in the in-memory index",
            metrics.index_resources.clone(),
        );
        registry.register(
            "vxds_event_readers",
            "Open GET /v1/events streams",
            metrics.event_readers.clone(),
        );
        registry.register(
            "vxds_event_readers_reset",
            "Event-stream readers that fell further behind than their queue holds and were reset",
            metrics.event_readers_dropped.clone(),
        );
        metrics
    }

    pub fn changeset(&self, outcome: &'static str) {
        self.changesets
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }
}

/// Counts every request by its route template, not its raw path (names are unbounded).
pub async fn track(State(state): State<AdminState>, request: Request, next: Next) -> Response {
    // Label values come from a fixed set: an unauthenticated client must not mint series.
    let method = match request.method().as_str() {
        m @ ("GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS") => m.to_owned(),
        _ => "other".to_owned(),
    };
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let response = next.run(request).await;
    state
        .metrics
        .http_requests
        .get_or_create(&HttpLabels {
            method,
            route,
            status: response.status().as_u16(),
        })
        .inc();
    response
}
