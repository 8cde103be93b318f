//! `/v1/revisions`: the history — who changed what, when, and why.

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::AdminState;
use crate::problem::{ApiError, ProblemBody, ReadProblems};
use crate::query::{PathParams, Query};
use crate::repr::{RevisionRepr, revision_repr};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RevisionParams {
    /// Revisions after this one (default 0: from the first).
    #[param(minimum = 0, maximum = 9223372036854775807_i64)]
    after: Option<u64>,
    /// At most this many, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RevisionList {
    /// Oldest first.
    pub revisions: Vec<RevisionRepr>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<u64>,
}

/// List revisions, oldest first.
#[utoipa::path(
    get,
    path = "/v1/revisions",
    operation_id = "listRevisions",
    tag = "revisions",
    params(RevisionParams),
    responses(
        (status = 200, description = "Revisions", body = RevisionList),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn list(
    State(state): State<AdminState>,
    Query(params): Query<RevisionParams>,
) -> Result<Json<RevisionList>, ApiError> {
    let limit = params.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_parameter(
            "limit",
            "invalid_limit",
            "limit must be between 1 and 1000",
        ));
    }
    let after = params.after.unwrap_or(0);
    if after > i64::MAX as u64 {
        return Err(ApiError::bad_parameter(
            "after",
            "invalid_revision",
            "revisions are at most 2^63 - 1",
        ));
    }
    let revisions = state.store.revisions(after, limit as usize).await?;
    let next_after = (revisions.len() == limit as usize)
        .then(|| revisions.last().map(|r| r.revision))
        .flatten();
    Ok(Json(RevisionList {
        revisions: revisions.iter().map(revision_repr).collect(),
        next_after,
    }))
}

/// One revision with what it changed.
#[utoipa::path(
    get,
    path = "/v1/revisions/{revision}",
    operation_id = "getRevision",
    tag = "revisions",
    params(("revision" = u64, Path, description = "The revision number", minimum = 1, maximum = 9223372036854775807_i64)),
    responses(
        (status = 200, description = "The revision", body = RevisionRepr),
        (status = 400, description = "Not a revision number", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such revision", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn get(
    State(state): State<AdminState>,
    path: PathParams,
) -> Result<Json<RevisionRepr>, ApiError> {
    let raw = path.get("revision")?;
    let n: u64 = raw.parse().map_err(|_| {
        ApiError::bad_parameter(
            "revision",
            "invalid_revision",
            format!("`{raw}` is not a revision number"),
        )
    })?;
    match state.store.revision(n).await? {
        Some(revision) => Ok(Json(revision_repr(&revision))),
        None => Err(ApiError::NotFound(format!("there is no revision {n}"))),
    }
}
