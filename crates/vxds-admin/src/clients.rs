//! `GET /v1/clients`: every connected xDS stream — node, user agent, parameters,
//! subscriptions, and per type the last version sent, acknowledged and refused (with the
//! client's message). The first thing to look at when a proxy rejects configuration.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use vxds_xds::ClientStatus;

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody};
use crate::query::Query;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ClientParams {
    /// Streams with ids above this one (default 0: from the first).
    #[param(minimum = 0)]
    after: Option<u64>,
    /// At most this many, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClientList {
    /// By stream id.
    pub clients: Vec<ClientStatus>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<u64>,
}

/// Connected xDS streams and what they hold, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/clients",
    operation_id = "listClients",
    tag = "clients",
    params(ClientParams),
    responses(
        (status = 200, description = "Connected streams, by stream id: at most `limit` (100 by default) after `after`; `next_after` gives the next page", body = ClientList),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "No valid token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 421, description = "`Host` is not a name this server answers to (`--admin-allowed-hosts`)", body = ProblemBody, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn list(
    State(state): State<AdminState>,
    Query(params): Query<ClientParams>,
) -> Result<Json<ClientList>, ApiError> {
    let limit = crate::query::page_limit(params.limit, 100)?;
    let (clients, more) = state
        .clients
        .as_ref()
        .map(|r| r.clients_page(params.after.unwrap_or(0), limit as usize))
        .unwrap_or_default();
    let next_after = more.then(|| clients.last().map(|c| c.stream_id)).flatten();
    Ok(Json(ClientList {
        clients,
        next_after,
    }))
}
