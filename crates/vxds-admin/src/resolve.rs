//! `POST /v1/resolve`: which variant a client with given parameters receives, and why. It asks
//! the in-memory index, the same one the ADS server serves from, after letting it catch up
//! with the store's head so that it answers for the latest write.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use vxds_core::ParamSet;
use vxds_envoy::constraints::constraints_to_json;
use vxds_envoy::resource::Body;

use crate::AdminState;
use crate::body::Payload;
use crate::problem::{ApiError, ProblemBody, ProblemItem};
use crate::resources::{name_param, type_param};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// An alias (`route`) or a message name.
    #[serde(rename = "type")]
    #[schema(
        pattern = "^(listener|route|cluster|endpoint|secret|runtime|virtual_host|scoped_route|extension_config|(type\\.googleapis\\.com/)?[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)+)$"
    )]
    pub resource_type: String,
    #[schema(min_length = 1)]
    pub name: String,
    /// The client's dynamic parameters.
    #[serde(default)]
    pub params: BTreeMap<String, String>,
    /// The client certificate's identity (a SPIFFE ID, or a DNS name). With an identity
    /// template (`--xds-identity-template`), the parameters it gives override `params`, as
    /// the xDS server does.
    #[serde(default)]
    pub identity: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ResolvedVariant {
    pub id: String,
    #[schema(value_type = Option<Object>)]
    pub constraints: Value,
    pub constraints_text: String,
    pub version: String,
    #[schema(value_type = Object)]
    pub resource: Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ConsideredVariant {
    pub id: String,
    pub constraints_text: String,
    pub matches: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ResolveResponse {
    pub type_url: String,
    pub name: String,
    /// The index revision the answer comes from.
    pub revision: u64,
    /// The variant the client receives; null when none matches (the client sees the resource
    /// as absent).
    pub variant: Option<ResolvedVariant>,
    /// Why, in a sentence.
    pub reason: String,
    /// The keys the variants constrain, with the client's value (null: not sent).
    pub decisive_params: BTreeMap<String, Option<String>>,
    /// Parameters no variant constrains: they do not affect the choice.
    pub ignored_params: Vec<String>,
    /// Every variant and whether it matches.
    pub variants: Vec<ConsideredVariant>,
    /// The parameters the answer used: the request's, with the identity's trusted ones imposed.
    pub params: BTreeMap<String, String>,
    /// Where each parameter came from: `request`, or `identity` (trusted).
    pub param_sources: BTreeMap<String, &'static str>,
}

/// The request's parameters with the identity's trusted ones imposed, and where each came
/// from; the same rule the xDS server applies.
fn effective_params(
    request: &ResolveRequest,
    template: Option<&vxds_core::IdentityTemplate>,
) -> Result<(ParamSet, BTreeMap<String, &'static str>), ApiError> {
    let mut sources: BTreeMap<String, &'static str> = request
        .params
        .keys()
        .map(|k| (k.clone(), "request"))
        .collect();
    let Some(identity) = &request.identity else {
        return Ok((request.params.clone().into(), sources));
    };
    let refuse = |code: &str, message: String| ApiError::BadRequest {
        detail: message.clone(),
        errors: vec![ProblemItem::new("/identity", code, message)],
    };
    let Some(template) = template else {
        return Err(refuse(
            "no_identity_template",
            "this server has no identity template (--xds-identity-template): identities give \
             no parameters"
                .into(),
        ));
    };
    let trusted = template.trusted_params(Some(identity)).map_err(|e| {
        refuse(
            "identity_refused",
            format!("{e}: the xDS server refuses such a client (PERMISSION_DENIED)"),
        )
    })?;
    for (key, _) in trusted.iter() {
        sources.insert(key.to_owned(), "identity");
    }
    Ok((
        vxds_core::overlay_trusted(request.params.clone().into(), &trusted),
        sources,
    ))
}

/// Which variant a client with these dynamic parameters receives, and why.
#[utoipa::path(
    post,
    path = "/v1/resolve",
    operation_id = "resolve",
    tag = "resolve",
    request_body(content(
        (ResolveRequest = "application/json"),
        (ResolveRequest = "application/yaml"),
    )),
    responses(
        (status = 200, description = "The variant (or none) and why", body = ResolveResponse),
        (status = 400, description = "Malformed", body = ProblemBody, content_type = "application/problem+json"),
        (status = 401, description = "No valid token", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such resource: every client sees it as absent", body = ProblemBody, content_type = "application/problem+json"),
        (status = 413, description = "The body is too large", body = ProblemBody, content_type = "application/problem+json"),
        (status = 403, description = "A page of another origin (`Origin`)", body = ProblemBody, content_type = "application/problem+json"),
        (status = 415, description = "No `Content-Type`, or neither JSON nor YAML", body = ProblemBody, content_type = "application/problem+json"),
        (status = 421, description = "`Host` is not a name this server answers to (`--admin-allowed-hosts`)", body = ProblemBody, content_type = "application/problem+json"),
    ),
    security(("bearer" = []), ())
)]
pub async fn resolve(
    State(state): State<AdminState>,
    Payload(request): Payload<ResolveRequest>,
) -> Result<Json<ResolveResponse>, ApiError> {
    let ty = type_param(&request.resource_type)?;
    let name = name_param(&request.name, &ty, &state)?;
    // Read your writes: wait (briefly) for the index to reach what the store has committed.
    let head = *state.store.watch_head().borrow();
    let snapshot = tokio::time::timeout(Duration::from_secs(5), state.index.wait_for(head))
        .await
        .unwrap_or_else(|_| state.index.snapshot());
    let Some(resource) = snapshot.get(ty.type_url(), &name) else {
        return Err(ApiError::NotFound(format!(
            "there is no {} named `{name}`; every client sees it as absent",
            ty.alias().unwrap_or(ty.message_name())
        )));
    };
    let (params, param_sources) = effective_params(&request, state.identity_template.as_deref())?;
    let constrained = resource.matcher.keys();
    let decisive: BTreeMap<String, Option<String>> = constrained
        .iter()
        .map(|k| (k.clone(), params.0.get(k).cloned()))
        .collect();
    let ignored: Vec<String> = params
        .0
        .keys()
        .filter(|k| !constrained.contains(k))
        .cloned()
        .collect();
    let considered = resource
        .variants
        .iter()
        .map(|v| ConsideredVariant {
            id: v.id.to_string(),
            constraints_text: v.constraints.to_string(),
            matches: v.constraints.matches(&params),
        })
        .collect();
    let shown = decisive
        .iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => format!("{k} not sent"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let variant = resource.resolve(&params);
    let reason = match variant {
        Some(v) if constrained.is_empty() => format!(
            "variant {} is unconstrained: every client receives it",
            v.id
        ),
        Some(v) => format!("variant {} (`{}`) matches {shown}", v.id, v.constraints),
        None => format!(
            "no variant matches {shown}: a client sending these parameters sees the resource as absent"
        ),
    };
    let variant = variant
        .map(|v| {
            let body =
                Body::from_any_bytes(v.body.to_vec(), &ty).map_err(|_| ApiError::Internal)?;
            Ok::<_, ApiError>(ResolvedVariant {
                id: v.id.to_string(),
                constraints: constraints_to_json(v.constraints.constraints()),
                constraints_text: v.constraints.to_string(),
                version: v.version.to_string(),
                resource: body.to_json(&ty),
            })
        })
        .transpose()?;
    Ok(Json(ResolveResponse {
        type_url: ty.type_url().to_owned(),
        name,
        revision: snapshot.revision,
        variant,
        reason,
        decisive_params: decisive,
        ignored_params: ignored,
        variants: considered,
        params: params.0,
        param_sources,
    }))
}
