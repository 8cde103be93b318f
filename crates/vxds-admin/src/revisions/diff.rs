//! What a revision did, per resource and variant: `GET /v1/revisions/{n}`.
//!
//! Variants are matched by id (the hash of their constraints), so a variant whose constraints
//! changed shows as one deleted and one created; one that kept its constraints is `updated`
//! when its body changed and `unchanged` otherwise.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use vxds_envoy::resource::{Body, ResourceType};
use vxds_store::{ChangeKind, PastState, PastVariant, ResourceDiff, RevisionDiff};

use crate::problem::ApiError;
use crate::repr::{ChangeRepr, change_repr, resource_type, timestamp};

/// A revision with the diff it made.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RevisionDetail {
    pub revision: u64,
    pub created_at: String,
    pub author: Option<String>,
    pub message: Option<String>,
    /// How many resources the revision changed.
    pub change_count: usize,
    /// This page of the revision's changes (at most `limit`, after the first `after`).
    pub changes: Vec<ChangeRepr>,
    /// Per changed resource of this page, in the order of `changes`: its variants before and
    /// after.
    pub resources: Vec<ResourceDiffRepr>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<u64>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ResourceDiffRepr {
    #[serde(flatten)]
    pub change: ChangeRepr,
    /// False when a side of the diff was written before the store kept variant history
    /// (`variants` is then empty).
    pub history_kept: bool,
    /// Variants in their order after the revision, then the ones it deleted.
    pub variants: Vec<VariantDiffRepr>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct VariantDiffRepr {
    /// The variant's identity: a hash of its canonical constraints.
    pub id: String,
    /// The constraints in the compact syntax, `*` when unconstrained (the same before and
    /// after: they are the variant's identity).
    pub constraints_text: String,
    /// `created`, `updated` (its body), `deleted` or `unchanged`.
    #[schema(example = "updated")]
    pub change: &'static str,
    /// The variant before the revision; null when it did not exist.
    pub before: Option<VariantStateRepr>,
    /// The variant after the revision; null when it no longer exists.
    pub after: Option<VariantStateRepr>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct VariantStateRepr {
    /// Its place among the resource's variants, from 0.
    pub position: usize,
    /// Content hash: the version clients see for this variant.
    pub version: String,
    /// The body, proto3 JSON with `@type`: only with `?bodies=true`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub resource: Option<Value>,
}

/// The page of `diff` that starts after its first `after` changes (`diff.resources` holds that
/// page's resources, as [`vxds_store::Store::revision_diff_page`] reads them).
pub fn detail(diff: &RevisionDiff, after: usize, bodies: bool) -> Result<RevisionDetail, ApiError> {
    let r = &diff.revision;
    let count = r.changes.len();
    let start = after.min(count);
    let end = start + diff.resources.len();
    Ok(RevisionDetail {
        revision: r.revision,
        created_at: timestamp(r.created_at_ms),
        author: r.author.clone(),
        message: r.message.clone(),
        change_count: count,
        changes: r.changes[start..end].iter().map(change_repr).collect(),
        resources: diff
            .resources
            .iter()
            .map(|d| resource_diff(d, bodies))
            .collect::<Result<_, _>>()?,
        next_after: (end < count).then_some(end as u64),
    })
}

fn resource_diff(diff: &ResourceDiff, bodies: bool) -> Result<ResourceDiffRepr, ApiError> {
    let change = change_repr(&diff.change);
    let (before, after) = match (&diff.before, &diff.after) {
        (PastState::NotKept, _) | (_, PastState::NotKept) => {
            return Ok(ResourceDiffRepr {
                change,
                history_kept: false,
                variants: Vec::new(),
            });
        }
        (before, after) => (variants(before), variants(after)),
    };
    let ty = resource_type(&diff.change.key.type_url)?;
    let state = |(position, v): (usize, &PastVariant)| -> Result<VariantStateRepr, ApiError> {
        Ok(VariantStateRepr {
            position,
            version: v.version.clone(),
            resource: bodies.then(|| body_json(v, &ty)).transpose()?,
        })
    };
    let mut out = Vec::new();
    for (position, v) in after.iter().enumerate() {
        let old = before.iter().enumerate().find(|(_, b)| b.id == v.id);
        let kind = match old {
            None => ChangeKind::Created.as_str(),
            Some((_, b)) if b.version != v.version => ChangeKind::Updated.as_str(),
            Some(_) => "unchanged",
        };
        out.push(VariantDiffRepr {
            id: v.id.to_string(),
            constraints_text: v.constraints.to_string(),
            change: kind,
            before: old.map(state).transpose()?,
            after: Some(state((position, v))?),
        });
    }
    for (position, b) in before.iter().enumerate() {
        if !after.iter().any(|v| v.id == b.id) {
            out.push(VariantDiffRepr {
                id: b.id.to_string(),
                constraints_text: b.constraints.to_string(),
                change: ChangeKind::Deleted.as_str(),
                before: Some(state((position, b))?),
                after: None,
            });
        }
    }
    Ok(ResourceDiffRepr {
        change,
        history_kept: true,
        variants: out,
    })
}

fn variants(state: &PastState) -> &[PastVariant] {
    match state {
        PastState::Present(v) => v,
        PastState::Absent | PastState::NotKept => &[],
    }
}

fn body_json(v: &PastVariant, ty: &ResourceType) -> Result<Value, ApiError> {
    let body = Body::from_any_bytes(v.body.clone(), ty).map_err(|e| {
        tracing::error!(error = %e.message, "a stored body does not decode");
        ApiError::Internal
    })?;
    Ok(body.to_json(ty))
}
