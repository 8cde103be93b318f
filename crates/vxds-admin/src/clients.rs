//! `GET /v1/clients`: every connected xDS stream — node, user agent, parameters,
//! subscriptions, and per type the last version sent, acknowledged and refused (with the
//! client's message). The first thing to look at when a proxy rejects configuration.

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use vxds_xds::ClientStatus;

use crate::AdminState;
use crate::problem::ProblemBody;

#[derive(Debug, Serialize, ToSchema)]
pub struct ClientList {
    pub clients: Vec<ClientStatus>,
}

/// Every connected xDS stream and what it holds.
#[utoipa::path(
    get,
    path = "/v1/clients",
    operation_id = "listClients",
    tag = "clients",
    responses(
        (status = 200, description = "Connected streams, by stream id", body = ClientList),
        (status = 401, description = "No valid token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 421, description = "`Host` is not a name this server answers to (`--admin-allowed-hosts`)", body = ProblemBody, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn list(State(state): State<AdminState>) -> Json<ClientList> {
    let clients = state
        .clients
        .as_ref()
        .map(|r| r.clients())
        .unwrap_or_default();
    Json(ClientList { clients })
}
