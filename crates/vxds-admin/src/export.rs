//! `GET /v1/export`: every resource with its variants, as the fixture documents `vxds apply`
//! takes back unchanged. The store is read in one snapshot (one transaction), so the export is
//! exactly one revision's state; the documents are written off the runtime and streamed as they
//! are made, so neither side holds the whole text.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;
use utoipa::IntoParams;
use vxds_envoy::resource::{Body as ResourceBody, ResourceType};
use vxds_store::StoredResource;

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody, ReadProblems};
use crate::query::Query;
use crate::resources::type_param;

/// The header that carries the revision an export is of.
pub const REVISION_HEADER: &str = "vxds-revision";

/// Documents are sent in pieces of about this size.
const CHUNK: usize = 64 << 10;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportParams {
    /// Only resources of this type: an alias (`cluster`) or a message name.
    #[serde(rename = "type")]
    #[param(
        rename = "type",
        pattern = "^(listener|route|cluster|endpoint|secret|runtime|virtual_host|scoped_route|extension_config|(type\\.googleapis\\.com/)?[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)+)$"
    )]
    resource_type: Option<String>,
}

/// One fixture document: what `vxds apply` reads.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(rename = "type")]
    resource_type: &'a str,
    name: &'a str,
    /// A shared secret stays shared when the export is applied.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    shared: bool,
    variants: Vec<Variant>,
}

#[derive(Serialize)]
struct Variant {
    #[serde(skip_serializing_if = "Option::is_none")]
    constraints: Option<String>,
    resource: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    ttl: Option<String>,
}

/// Export every resource (or those of one type) with its variants, as YAML fixture documents.
#[utoipa::path(
    get,
    path = "/v1/export",
    operation_id = "exportResources",
    tag = "resources",
    params(ExportParams),
    responses(
        (status = 200, description = "Every resource, in (type, name) order, each a YAML document (`---`) with its variants as `vxds apply` reads them; read from one snapshot of the store and streamed", body = String, content_type = "application/yaml",
            headers(("Vxds-Revision" = u64, description = "The revision the export is of"))),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn export(
    State(state): State<AdminState>,
    caller: Option<axum::Extension<crate::auth::Caller>>,
    Query(params): Query<ExportParams>,
) -> Result<Response, ApiError> {
    let redact = caller.is_none_or(|c| !c.sees_secrets);
    let type_url = params
        .resource_type
        .as_deref()
        .map(type_param)
        .transpose()?
        .map(|t| t.type_url().to_owned());
    let (revision, resources) = state.store.export(type_url.as_deref()).await?;
    // A few pieces ahead of the client, no more.
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tokio::task::spawn_blocking(move || write_documents(resources, redact, &tx));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|piece| (piece, rx))
    });
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/yaml"),
    );
    headers.insert(REVISION_HEADER, HeaderValue::from(revision));
    Ok(response)
}

/// Writes the documents into `tx` in pieces. A body that does not decode ends the response
/// with an error, so that the client sees a failed export rather than a short one.
fn write_documents(
    resources: Vec<StoredResource>,
    redact: bool,
    tx: &mpsc::Sender<Result<Bytes, std::io::Error>>,
) {
    let mut piece = String::new();
    for resource in &resources {
        match document(resource, redact) {
            Ok(text) => {
                piece.push_str("---\n");
                piece.push_str(&text);
            }
            Err(message) => {
                tracing::error!(type_url = %resource.key.type_url, name = %resource.key.name, %message, "export: a stored resource does not decode");
                let _ = tx.blocking_send(Err(std::io::Error::other(message)));
                return;
            }
        }
        if piece.len() >= CHUNK
            && tx
                .blocking_send(Ok(Bytes::from(std::mem::take(&mut piece))))
                .is_err()
        {
            return; // the client went away
        }
    }
    if !piece.is_empty() {
        let _ = tx.blocking_send(Ok(Bytes::from(piece)));
    }
}

/// One resource as a YAML document (without the `---` line).
fn document(resource: &StoredResource, redact: bool) -> Result<String, String> {
    let ty = ResourceType::resolve(&resource.key.type_url).map_err(|e| e.to_string())?;
    let variants = resource
        .variants
        .iter()
        .map(|v| {
            let text = v.constraints.to_string();
            let mut resource = ResourceBody::json_of_any(&v.body, &ty).map_err(|e| e.message)?;
            if redact {
                crate::redact::redact_secrets(&mut resource);
            }
            Ok(Variant {
                constraints: (text != "*").then_some(text),
                resource,
                ttl: v.ttl.map(|t| humantime::format_duration(t).to_string()),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let document = Document {
        resource_type: ty.alias().unwrap_or(&resource.key.type_url),
        name: &resource.key.name,
        shared: resource.shared,
        variants,
    };
    serde_norway::to_string(&document).map_err(|e| e.to_string())
}
