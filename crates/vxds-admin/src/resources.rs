//! `/v1/resources`: list, read, replace and delete single resources. Writes are one-operation
//! changesets, so they go through the same validation and the same transaction as any other.

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use vxds_envoy::changeset::{
    ChangesetRequest, DeleteRequest, ExpectedVersion, OperationRequest, PutRequest, VariantRequest,
    resource_name,
};
use vxds_envoy::resource::ResourceType;
use vxds_store::{ApplyError, ChangeKind, Conflict, ListQuery, ResourceKey};

use crate::AdminState;
use crate::auth::Caller;
use crate::body::Payload;
use crate::conditional::{self, Tags};
use crate::problem::{ApiError, ProblemBody, ReadProblems, WriteProblems};
use crate::query::Query;
use crate::repr::{ChangeRepr, ResourceRepr, WriteResult, resource_repr, timestamp};

/// `{type}` and `{name}` from the path, percent-decoded.
pub struct ResourcePath {
    pub ty: ResourceType,
    /// The name as given, decoded.
    pub raw_name: String,
    pub key: ResourceKey,
}

impl FromRequestParts<AdminState> for ResourcePath {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AdminState,
    ) -> Result<Self, Self::Rejection> {
        let raw = crate::query::PathParams::from_request_parts(parts, state).await?;
        let ty = type_param(raw.get("type")?)?;
        let raw_name = raw.get("name")?.to_owned();
        let name = name_param(&raw_name, &ty, state)?;
        Ok(Self {
            key: ResourceKey {
                type_url: ty.type_url().into(),
                name,
            },
            ty,
            raw_name,
        })
    }
}

pub fn type_param(spelling: &str) -> Result<ResourceType, ApiError> {
    ResourceType::resolve(spelling)
        .map_err(|e| ApiError::bad_parameter("type", "unknown_type", e.to_string()))
}

/// The name in the form the store keys it by, checked by the same rule as changesets.
pub fn name_param(name: &str, ty: &ResourceType, state: &AdminState) -> Result<String, ApiError> {
    resource_name(name, ty, state.store.validation())
        .map_err(|p| ApiError::bad_parameter("name", &p.code, p.message))
}

#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // documentation only: the values come through `ResourcePath`
pub struct ResourcePathDoc {
    /// An alias (`route`, `cluster`, ...) or a message name of the Envoy API.
    #[param(
        rename = "type",
        pattern = "^(listener|route|cluster|endpoint|secret|runtime|virtual_host|scoped_route|extension_config|(type\\.googleapis\\.com/)?[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)+)$"
    )]
    resource_type: String,
    /// The name, percent-encoded (`/`, `?`, `#` and xdstp names fit in the one segment).
    #[param(min_length = 1)]
    name: String,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Only resources of this type: an alias (`cluster`) or a message name.
    #[serde(rename = "type")]
    #[param(
        rename = "type",
        pattern = "^(listener|route|cluster|endpoint|secret|runtime|virtual_host|scoped_route|extension_config|(type\\.googleapis\\.com/)?[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)+)$"
    )]
    resource_type: Option<String>,
    /// Only names starting with this.
    prefix: Option<String>,
    /// Page size, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    cursor: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ResourceSummaryRepr {
    pub type_url: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub alias: Option<&'static str>,
    pub name: String,
    pub version: String,
    pub revision: u64,
    pub variant_count: u64,
    pub updated_at: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ResourceList {
    pub resources: Vec<ResourceSummaryRepr>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

fn encode_cursor(key: &ResourceKey) -> String {
    let json = serde_json::to_vec(&(&key.type_url, &key.name)).unwrap_or_default();
    URL_SAFE_NO_PAD.encode(json)
}

fn decode_cursor(cursor: &str) -> Result<ResourceKey, ApiError> {
    let bad = || {
        ApiError::bad_parameter(
            "cursor",
            "invalid_cursor",
            "not a cursor this server issued",
        )
    };
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let (type_url, name): (String, String) = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    Ok(ResourceKey {
        type_url: type_url.into(),
        name,
    })
}

/// List resources, a page at a time, in (type, name) order.
#[utoipa::path(
    get,
    path = "/v1/resources",
    operation_id = "listResources",
    tag = "resources",
    params(ListParams),
    responses(
        (status = 200, description = "A page of resources", body = ResourceList),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn list(
    State(state): State<AdminState>,
    Query(params): Query<ListParams>,
) -> Result<Json<ResourceList>, ApiError> {
    let type_url = params
        .resource_type
        .as_deref()
        .map(type_param)
        .transpose()?
        .map(|t| t.type_url().to_owned());
    let limit = crate::query::page_limit(params.limit, 100)?;
    let after = params
        .cursor
        .as_deref()
        .filter(|c| !c.is_empty())
        .map(decode_cursor)
        .transpose()?;
    let page = state
        .store
        .list(&ListQuery {
            type_url,
            prefix: params.prefix,
            limit: limit as usize,
            after,
        })
        .await?;
    let resources = page
        .resources
        .into_iter()
        .map(|r| ResourceSummaryRepr {
            alias: ResourceType::alias_of(&r.key.type_url),
            type_url: r.key.type_url.into(),
            name: r.key.name,
            version: r.version,
            revision: r.revision,
            variant_count: r.variant_count,
            updated_at: timestamp(r.updated_at_ms),
        })
        .collect();
    Ok(Json(ResourceList {
        resources,
        next_cursor: page.next.as_ref().map(encode_cursor),
    }))
}

fn etag(opaque: &str) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{opaque}\"")).unwrap_or(HeaderValue::from_static("\"\""))
}

/// The opaque part of the entity-tag of `repr` as `caller` is shown it: the version, or, when
/// the caller's answer has key material redacted, the version with
/// [`conditional::REDACTED_TAG_SUFFIX`] — two representations of one version are two entity-tags
/// (RFC 9110 §8.8.3). Writes take either (see [`conditional::if_match_expectation`]).
fn representation_tag(repr: &ResourceRepr, caller: Option<&Caller>) -> String {
    let sees_secrets = caller.is_some_and(|c| c.sees_secrets);
    if !sees_secrets
        && let Ok(mut value) = serde_json::to_value(repr)
        && crate::redact::redact_secrets(&mut value)
    {
        return format!("{}{}", repr.version, conditional::REDACTED_TAG_SUFFIX);
    }
    repr.version.clone()
}

/// Read one resource with all its variants.
#[utoipa::path(
    get,
    path = "/v1/resources/{type}/{name}",
    operation_id = "getResource",
    tag = "resources",
    params(ResourcePathDoc),
    responses(
        (status = 200, description = "The resource", body = ResourceRepr, headers(("ETag" = String, description = "The resource version; `\"<version>;redacted\"` when key material was redacted for this token (another representation, another tag)"))),
        (status = 304, description = "Unchanged since the `If-None-Match` tag"),
        (status = 412, description = "`If-Match` does not hold: the resource is at another version (strong comparison) or, with `*`, does not exist", body = ProblemBody, content_type = "application/problem+json"),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such resource", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn get(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    path: ResourcePath,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let if_match = conditional::parse(&headers, &header::IF_MATCH)?;
    let stored = state.store.get(&path.key).await?;
    let shown = stored
        .as_ref()
        .map(|s| {
            resource_repr(s).map(|repr| {
                let tag = representation_tag(&repr, caller.as_deref());
                (repr, tag)
            })
        })
        .transpose()?;
    // If-Match first (RFC 9110 §13.2.2): a read of another version than asked is 412.
    if let Some(tags) = &if_match
        && !conditional::match_holds(tags, shown.as_ref().map(|(_, tag)| tag.as_str()))
    {
        let message = match &shown {
            Some((_, tag)) => {
                format!("the resource's entity-tag is \"{tag}\", which `If-Match` does not list")
            }
            None => "the resource does not exist, so `If-Match` cannot hold".to_owned(),
        };
        return Err(conditional::read_precondition_failed(message));
    }
    let Some((repr, tag)) = shown else {
        return Err(not_found(&path));
    };
    if let Some(tags) = conditional::parse(&headers, &header::IF_NONE_MATCH)?
        && conditional::none_match_hits(&tags, &tag)
    {
        return Ok((StatusCode::NOT_MODIFIED, [(header::ETAG, etag(&tag))]).into_response());
    }
    Ok(([(header::ETAG, etag(&tag))], Json(repr)).into_response())
}

fn not_found(path: &ResourcePath) -> ApiError {
    ApiError::NotFound(format!(
        "there is no {} named `{}`",
        path.ty.alias().unwrap_or(path.ty.message_name()),
        path.key.name
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WriteParams {
    /// Validate and report, commit nothing.
    #[serde(default)]
    dry_run: bool,
    /// Recorded with the revision.
    message: Option<String>,
}

/// The body of a PUT: the resource's whole new variant set.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutBody {
    #[schema(min_items = 1)]
    pub variants: Vec<VariantRequest>,
    /// Secrets only: serve it to any client its variants match, trusted constraints or not.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PutResult {
    pub revision: u64,
    pub dry_run: bool,
    pub changed: Vec<ChangeRepr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<crate::problem::ProblemItem>,
    /// The resource as stored now (absent for a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceRepr>,
    /// Dry runs: which connected clients the change would move.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impact: Option<crate::impact::ImpactReport>,
}

/// The preconditions of a write from `If-Match` and `If-None-Match`, for the store to check
/// under its write lock: `(expected_version, must_not_exist)`.
fn preconditions(
    headers: &HeaderMap,
    method: &str,
) -> Result<(Option<ExpectedVersion>, bool), ApiError> {
    let if_match = conditional::parse(headers, &header::IF_MATCH)?;
    let if_none_match = conditional::parse(headers, &header::IF_NONE_MATCH)?;
    let must_not_exist = match if_none_match {
        None => false,
        Some(Tags::Any) if method == "PUT" => true,
        Some(Tags::Any) => {
            return Err(ApiError::bad_header(
                "If-None-Match",
                "unsupported_condition",
                format!("`If-None-Match: *` has no meaning on {method}"),
            ));
        }
        Some(Tags::List(_)) => {
            return Err(ApiError::bad_header(
                "If-None-Match",
                "unsupported_condition",
                "writes take `If-None-Match: *` (create only), not entity-tags",
            ));
        }
    };
    if must_not_exist && if_match.is_some() {
        // `If-Match` needs the resource to exist and `If-None-Match: *` needs it not to.
        return Err(conditional::precondition_failed(
            "If-None-Match",
            "`If-Match` and `If-None-Match: *` cannot both hold".into(),
        ));
    }
    Ok((conditional::if_match_expectation(if_match)?, must_not_exist))
}

/// A store conflict on the one operation of a PUT or DELETE: the header's condition failed.
fn condition_failed(state: &AdminState, conflict: &Conflict) -> ApiError {
    state.metrics.changeset("conflict");
    let header = if conflict.pointer.as_str().ends_with("/must_not_exist") {
        "If-None-Match"
    } else {
        "If-Match"
    };
    conditional::precondition_failed(header, conflict.message.clone())
}

/// Replace a resource's whole variant set, atomically (creating the resource if needed).
#[utoipa::path(
    put,
    path = "/v1/resources/{type}/{name}",
    operation_id = "putResource",
    tag = "resources",
    params(
        ResourcePathDoc,
        ("If-Match" = Option<String>, Header, description = "Write only if the resource is at one of these versions (strong `ETag`s, redacted or not), or exists (`*`)"),
        ("If-None-Match" = Option<String>, Header, description = "`*`: write only if the resource does not exist (create only)"),
        WriteParams,
    ),
    request_body(content(
        (PutBody = "application/json"),
        (PutBody = "application/yaml"),
    )),
    responses(
        (status = 200, description = "Replaced (or unchanged)", body = PutResult, headers(("ETag" = String))),
        (status = 201, description = "Created", body = PutResult, headers(("ETag" = String))),
        (status = 412, description = "`If-Match` or `If-None-Match` did not hold; nothing was written", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A rule refused it; every problem is listed", body = ProblemBody, content_type = "application/problem+json"),
        WriteProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn put(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    path: ResourcePath,
    headers: HeaderMap,
    Query(params): Query<WriteParams>,
    Payload(body): Payload<PutBody>,
) -> Result<Response, ApiError> {
    let (expected_version, must_not_exist) = preconditions(&headers, "PUT")?;
    let request = ChangesetRequest {
        expected_revision: None,
        dry_run: params.dry_run,
        message: params.message,
        operations: vec![OperationRequest::Put(PutRequest {
            resource_type: path.ty.type_url().to_owned(),
            name: path.raw_name.clone(),
            expected_version,
            must_not_exist,
            shared: body.shared,
            variants: body.variants,
        })],
    };
    let author = caller.as_ref().and_then(|Extension(c)| c.name.clone());
    let applied = match state.store.apply(request, author).await {
        Err(ApplyError::Conflict(conflict)) => return Err(condition_failed(&state, &conflict)),
        other => crate::changesets::record(&state, other, Some("/operations/0"))?,
    };
    let created = applied
        .changes
        .iter()
        .any(|c| c.change == ChangeKind::Created);
    let resource = if applied.dry_run {
        None
    } else {
        state
            .store
            .get(&path.key)
            .await?
            .as_ref()
            .map(resource_repr)
            .transpose()?
    };
    let status = if created && !applied.dry_run {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let tag = resource
        .as_ref()
        .map(|r| etag(&representation_tag(r, caller.as_deref())));
    let impact = if applied.dry_run {
        Some(crate::impact::report(&state, applied.previews).await?)
    } else {
        None
    };
    let result = PutResult {
        revision: applied.revision,
        dry_run: applied.dry_run,
        changed: applied.changes.into_iter().map(ChangeRepr::from).collect(),
        warnings: applied
            .warnings
            .into_iter()
            .map(|p| crate::problem::ProblemItem::from_problem(p, Some("/operations/0")))
            .collect(),
        resource,
        impact,
    };
    let mut response = (status, Json(result)).into_response();
    if let Some(tag) = tag {
        response.headers_mut().insert(header::ETAG, tag);
    }
    Ok(response)
}

/// Delete a resource with all its variants.
#[utoipa::path(
    delete,
    path = "/v1/resources/{type}/{name}",
    operation_id = "deleteResource",
    tag = "resources",
    params(
        ResourcePathDoc,
        ("If-Match" = Option<String>, Header, description = "Delete only if the resource is at one of these versions (strong `ETag`s, redacted or not), or exists (`*`)"),
        WriteParams,
    ),
    responses(
        (status = 200, description = "Deleted", body = WriteResult),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A read-only token, or a page of another origin (`Origin`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such resource", body = ProblemBody, content_type = "application/problem+json"),
        (status = 412, description = "`If-Match` did not hold; nothing was written", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "A rule refused it (e.g. the aggregate graph)", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn delete(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    path: ResourcePath,
    headers: HeaderMap,
    Query(params): Query<WriteParams>,
) -> Result<crate::repr::WithChanges<WriteResult>, ApiError> {
    let (expected_version, _) = preconditions(&headers, "DELETE")?;
    let request = ChangesetRequest {
        expected_revision: None,
        dry_run: params.dry_run,
        message: params.message,
        operations: vec![OperationRequest::Delete(DeleteRequest {
            resource_type: path.ty.type_url().to_owned(),
            name: path.raw_name.clone(),
            expected_version,
        })],
    };
    let author = caller.as_ref().and_then(|Extension(c)| c.name.clone());
    let applied = match state.store.apply(request, author).await {
        Err(ApplyError::Invalid(invalid))
            if invalid.errors.iter().all(|e| e.code == "not_found") =>
        {
            state.metrics.changeset("invalid");
            return Err(not_found(&path));
        }
        Err(ApplyError::Conflict(conflict)) => return Err(condition_failed(&state, &conflict)),
        other => crate::changesets::record(&state, other, Some("/operations/0"))?,
    };
    crate::impact::write_result(&state, applied).await
}
