//! The JSON the API answers with, and the conversions into it.

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use utoipa::ToSchema;
use vxds_envoy::constraints::constraints_to_json;
use vxds_envoy::resource::{Body, ResourceType};
use vxds_store::{Change, ChangeKind, Revision, StoredResource, StoredVariant};

use crate::problem::{ApiError, ProblemItem};

/// RFC 3339 in UTC, from Unix milliseconds.
pub fn timestamp(ms: i64) -> String {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// A resource with all its variants.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ResourceRepr {
    /// e.g. `type.googleapis.com/envoy.config.route.v3.RouteConfiguration`
    pub type_url: String,
    /// The short alias (`route`), if the type has one.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub alias: Option<&'static str>,
    /// The name, xdstp names in normal form.
    pub name: String,
    /// Hash of the variants' ids and versions; also the `ETag`.
    pub version: String,
    /// The revision that last changed the resource.
    pub revision: u64,
    pub created_revision: u64,
    pub created_at: String,
    pub updated_at: String,
    /// Secrets only: served to any client its variants match, trusted constraints or not
    /// (see `shared` on a put). False for every other resource.
    pub shared: bool,
    pub variants: Vec<VariantRepr>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct VariantRepr {
    /// The variant's identity: a hash of its canonical constraints.
    pub id: String,
    /// Proto3 JSON of `DynamicParameterConstraints`; null when unconstrained.
    #[schema(value_type = Option<Object>)]
    pub constraints: Value,
    /// The constraints in the compact syntax, `*` when unconstrained.
    pub constraints_text: String,
    /// Content hash: the version clients see for this variant.
    pub version: String,
    pub created_at: String,
    pub updated_at: String,
    /// The body: proto3 JSON with `@type`.
    #[schema(value_type = Object)]
    pub resource: Value,
    /// How long a client keeps the variant without an update or a heartbeat (humantime,
    /// `30s`); absent: forever.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

pub fn resource_type(type_url: &str) -> Result<ResourceType, ApiError> {
    ResourceType::resolve(type_url).map_err(|_| ApiError::Internal)
}

pub fn variant_repr(variant: &StoredVariant, ty: &ResourceType) -> Result<VariantRepr, ApiError> {
    let body = Body::from_any_bytes(variant.body.clone(), ty).map_err(|e| {
        tracing::error!(error = %e.message, "a stored body does not decode");
        ApiError::Internal
    })?;
    Ok(VariantRepr {
        id: variant.id.to_string(),
        constraints: constraints_to_json(variant.constraints.constraints()),
        constraints_text: variant.constraints.to_string(),
        version: variant.version.clone(),
        created_at: timestamp(variant.created_at_ms),
        updated_at: timestamp(variant.updated_at_ms),
        resource: body.to_json(ty),
        ttl: variant
            .ttl
            .map(|t| humantime::format_duration(t).to_string()),
    })
}

pub fn resource_repr(stored: &StoredResource) -> Result<ResourceRepr, ApiError> {
    let ty = resource_type(&stored.key.type_url)?;
    Ok(ResourceRepr {
        type_url: stored.key.type_url.to_string(),
        alias: ty.alias(),
        name: stored.key.name.clone(),
        version: stored.version.clone(),
        revision: stored.revision,
        created_revision: stored.created_revision,
        created_at: timestamp(stored.created_at_ms),
        updated_at: timestamp(stored.updated_at_ms),
        shared: stored.shared,
        variants: stored
            .variants
            .iter()
            .map(|v| variant_repr(v, &ty))
            .collect::<Result<_, _>>()?,
    })
}

/// One resource a revision changed.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ChangeRepr {
    pub type_url: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub alias: Option<&'static str>,
    pub name: String,
    #[schema(value_type = String, example = "updated")]
    pub change: ChangeKind,
    /// The version after the change; null when deleted.
    pub version: Option<String>,
}

pub fn change_repr(change: &Change) -> ChangeRepr {
    ChangeRepr::from(change.clone())
}

/// Moves the strings: a write's answer of 100,000 changes holds them once, not twice.
impl From<Change> for ChangeRepr {
    fn from(change: Change) -> Self {
        ChangeRepr {
            alias: ResourceType::alias_of(&change.key.type_url),
            type_url: change.key.type_url.into(),
            name: change.key.name,
            change: change.change,
            version: change.version,
        }
    }
}

/// What a write did.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct WriteResult {
    /// The revision committed (for a dry run, the one it would commit); the current head when
    /// nothing changed.
    pub revision: u64,
    pub dry_run: bool,
    /// The resources whose state changed.
    pub changed: Vec<ChangeRepr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<ProblemItem>,
    /// Dry runs of changesets: which connected clients each changed resource would move.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impact: Option<crate::impact::ImpactReport>,
    /// With `?wait=`: how the revision's rollout went (and, with `revert_on_nack`, its undoing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<crate::rollout::RolloutOutcome>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RevisionRepr {
    pub revision: u64,
    pub created_at: String,
    pub author: Option<String>,
    pub message: Option<String>,
    /// How many resources the revision changed.
    pub change_count: usize,
    /// The first of them (at most 10; `GET /v1/revisions/{revision}/changes` has them all).
    pub changes: Vec<ChangeRepr>,
}

/// Changes a revision in a list shows.
pub const CHANGES_SHOWN: usize = 10;

/// A revision with its first `shown` changes and how many there are.
pub fn revision_repr(revision: &Revision, shown: usize) -> RevisionRepr {
    RevisionRepr {
        revision: revision.revision,
        created_at: timestamp(revision.created_at_ms),
        author: revision.author.clone(),
        message: revision.message.clone(),
        change_count: revision.changes.len(),
        changes: revision
            .changes
            .iter()
            .take(shown)
            .map(change_repr)
            .collect(),
    }
}

/// A write's answer (`result`, serialised with its `changed` list empty) with `changes` as that
/// list, serialised a chunk at a time as the body is sent: an answer of 100,000 changes is
/// never held whole, as text nor as representations.
#[derive(Debug)]
pub struct WithChanges<T> {
    pub result: T,
    pub changes: Vec<Change>,
}

/// Changes serialised per body chunk.
const CHANGES_PER_CHUNK: usize = 1_000;

impl<T: Serialize> axum::response::IntoResponse for WithChanges<T> {
    fn into_response(self) -> axum::response::Response {
        use axum::http::{StatusCode, header};
        const SLOT: &[u8] = b"\"changed\":[]";
        let whole = match serde_json::to_vec(&self.result) {
            Ok(whole) => whole,
            Err(e) => {
                tracing::error!(error = %e, "serialising a write's answer");
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            }
        };
        // The answer's own key comes before any nested object's; inside a string the quotes
        // would be escaped, so the first match is the key.
        let Some(at) = whole.windows(SLOT.len()).position(|w| w == SLOT) else {
            tracing::error!("a write's answer without its `changed` list");
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        };
        let split = at + SLOT.len() - 1;
        let tail = axum::body::Bytes::copy_from_slice(&whole[split..]);
        let mut whole = whole;
        whole.truncate(split);
        let head = axum::body::Bytes::from(whole);
        let mut changes = self.changes.into_iter().peekable();
        let chunks = std::iter::from_fn(move || {
            changes.peek()?;
            let mut chunk = Vec::with_capacity(CHANGES_PER_CHUNK * 160);
            for (i, change) in changes.by_ref().take(CHANGES_PER_CHUNK).enumerate() {
                if i > 0 {
                    chunk.push(b',');
                }
                if let Err(e) = serde_json::to_writer(&mut chunk, &ChangeRepr::from(change)) {
                    tracing::error!(error = %e, "serialising a change");
                    return Some(Err(std::io::Error::other(e)));
                }
            }
            if changes.peek().is_some() {
                chunk.push(b',');
            }
            Some(Ok(axum::body::Bytes::from(chunk)))
        });
        let body = std::iter::once(Ok(head))
            .chain(chunks)
            .chain(std::iter::once(Ok(tail)));
        // Names, versions and problem texts only: redaction has nothing to do, and would
        // collect the whole answer to find that out.
        let mut response = (
            [(header::CONTENT_TYPE, "application/json")],
            axum::body::Body::from_stream(futures::stream::iter(body)),
        )
            .into_response();
        response
            .extensions_mut()
            .insert(crate::redact::HoldsNoKeyMaterial);
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::response::IntoResponse;
    use vxds_store::ResourceKey;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_795_000_000_123), "2026-11-18T11:06:40.123Z");
    }

    #[derive(Serialize)]
    struct Answer {
        revision: u64,
        dry_run: bool,
        changed: Vec<ChangeRepr>,
        summary: String,
    }

    fn change(i: usize) -> Change {
        Change {
            key: ResourceKey {
                type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
                name: format!("c{i}"),
            },
            change: ChangeKind::Created,
            version: Some(format!("v{i}")),
        }
    }

    /// Streamed chunk by chunk, the answer is the same JSON as serialised whole.
    #[tokio::test]
    async fn an_answer_with_its_changes_streamed_is_the_whole_answer() {
        for count in [0, 1, 2, CHANGES_PER_CHUNK, CHANGES_PER_CHUNK + 1, 2_500] {
            let answer = || Answer {
                revision: 7,
                dry_run: false,
                changed: Vec::new(),
                summary: r#"text with "changed":[] in it"#.into(),
            };
            let changes: Vec<Change> = (0..count).map(change).collect();
            let whole = serde_json::to_value(Answer {
                changed: changes.iter().map(change_repr).collect(),
                ..answer()
            })
            .unwrap();
            let response = WithChanges {
                result: answer(),
                changes,
            }
            .into_response();
            assert_eq!(
                response.headers()["content-type"],
                "application/json",
                "{count}"
            );
            let body = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .unwrap();
            let streamed: Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(streamed, whole, "{count} changes");
        }
    }
}
