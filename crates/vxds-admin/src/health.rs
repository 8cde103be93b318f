//! Health, readiness, metrics and the OpenAPI document.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody};

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub status: &'static str,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Readiness {
    pub status: &'static str,
    /// The store's head revision.
    pub revision: u64,
    /// The revision the in-memory index serves.
    pub index_revision: u64,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "operations", responses((status = 200, description = "Up", body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The store answers and the index is loaded.
#[utoipa::path(
    get,
    path = "/readyz",
    operation_id = "readyz",
    tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "The store does not answer", body = ProblemBody, content_type = "application/problem+json"),
    )
)]
pub async fn readyz(State(state): State<AdminState>) -> Result<Json<Readiness>, ApiError> {
    let revision = state.store.head_revision().await.map_err(|e| {
        tracing::warn!(error = %e, "readiness: the store does not answer");
        ApiError::Unavailable
    })?;
    Ok(Json(Readiness {
        status: "ready",
        revision,
        index_revision: state.index.snapshot().revision,
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
