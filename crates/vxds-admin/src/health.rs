//! Health, readiness, metrics and the OpenAPI document.
//!
//! Readiness means "can serve xDS": the index is loaded (it is before the server listens), and
//! it stays so whatever the store does, since streams only read the index. A store outage
//! shows in `/readyz`'s `store`, in `/healthz/store` (503 while it is down) and in
//! `vxds_store_up`, for an admin-only Service or an alert to probe separately.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use vxds_store::StoreState;

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody};
use crate::repr::timestamp;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    pub status: &'static str,
    /// The newest revision this server knows the store to have (from its change feed; the
    /// store is not asked).
    pub revision: u64,
    /// The revision the in-memory index serves.
    pub index_revision: u64,
    /// The store as this server last found it. Readiness does not depend on it.
    pub store: StoreStatus,
}

/// Whether the store answers.
#[derive(Debug, Serialize, ToSchema)]
pub struct StoreStatus {
    /// `up`, or `down`: writes and reads that need the store get 503 with `Retry-After`.
    #[schema(example = "up")]
    pub status: &'static str,
    /// When it was found down (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<String>,
    /// Why it counts as down.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

impl From<StoreState> for StoreStatus {
    fn from(state: StoreState) -> Self {
        match state {
            StoreState::Up => StoreStatus {
                status: "up",
                since: None,
                reason: None,
            },
            StoreState::Down { since_ms, reason } => StoreStatus {
                status: "down",
                since: Some(timestamp(since_ms)),
                reason: Some(reason.as_str()),
            },
        }
    }
}

/// The store answered.
#[derive(Debug, Serialize, ToSchema)]
pub struct StoreHealth {
    #[schema(example = "up")]
    pub status: &'static str,
    /// The store's head revision, read from it now.
    pub revision: u64,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "operations", responses((status = 200, description = "Up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The server can serve xDS: its index is loaded. Stays ready while the store is down (the
/// streams are served from memory); `store` says how the store is. 503 with status
/// `draining` once the server is shutting down, so that load balancers send no new proxies.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Draining: shutting down, its proxies moving to other replicas", body = Readiness),
    )
)]
pub async fn readyz(State(state): State<AdminState>) -> (StatusCode, Json<Readiness>) {
    let draining = state.is_draining();
    let status = if draining {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let readiness = Readiness {
        status: if draining { "draining" } else { "ready" },
        revision: *state.store.watch_head().borrow(),
        index_revision: state.index.snapshot().revision,
        store: state.store.state().into(),
    };
    (status, Json(readiness))
}

/// The store answers: its head is read now (at once 503 while it is known to be down).
#[utoipa::path(
    get,
    path = "/healthz/store",
    operation_id = "storeHealth",
    tag = "operations",
    responses(
        (status = 200, description = "The store answers", body = StoreHealth),
        (status = 503, description = "The store is unavailable; `Retry-After` says when to ask again", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub async fn store(State(state): State<AdminState>) -> Result<Json<StoreHealth>, ApiError> {
    let revision = state.store.head_revision().await?;
    Ok(Json(StoreHealth {
        status: "up",
        revision,
    }))
}

/// Prometheus metrics, in the text exposition format.
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "metrics",
    tag = "operations",
    responses(
        (status = 200, description = "Metrics", body = String, content_type = "text/plain"),
        (status = 401, description = "No valid token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 421, description = "`Host` is not a name this server answers to (`--admin-allowed-hosts`)", body = ProblemBody, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn metrics(State(state): State<AdminState>) -> Result<Response, ApiError> {
    let snapshot = state.index.snapshot();
    state
        .metrics
        .head_revision
        .set(*state.store.watch_head().borrow());
    state.metrics.index_revision.set(snapshot.revision);
    state.metrics.index_resources.set(snapshot.len() as u64);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &state.registry)
        .map_err(|_| ApiError::Internal)?;
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    Ok(response)
}

/// This API's OpenAPI document (the same as `api/openapi.yaml`).
#[utoipa::path(get, path = "/v1/openapi.json", operation_id = "openapi", tag = "operations", responses((status = 200, description = "The document", body = Object)))]
pub async fn openapi(State(state): State<AdminState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        state.openapi_json.to_string(),
    )
        .into_response()
}
