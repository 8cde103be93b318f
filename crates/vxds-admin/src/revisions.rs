//! `/v1/revisions`: the history — who changed what, when, and why; what each revision did to
//! each resource's variants (`revisions/diff`); and restoring the state right after a past
//! revision as a new revision.

use axum::extract::State;
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use vxds_store::{RestoreError, RestoreOptions};

use crate::AdminState;
use crate::auth::Caller;
use crate::body::Payload;
use crate::changesets;
use crate::problem::{ApiError, ProblemBody, ProblemItem, ReadProblems, WriteProblems};
use crate::query::{PathParams, Query};
use crate::repr::{
    CHANGES_SHOWN, ChangeRepr, RevisionRepr, WithChanges, change_repr, revision_repr,
};

mod diff;

use diff::RevisionDetail;

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
    /// Oldest first, each with its `change_count` and first 10 `changes`.
    pub revisions: Vec<RevisionRepr>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<u64>,
}

/// List revisions, oldest first: each with how many resources it changed and the first 10
/// (`GET /v1/revisions/{revision}/changes` pages through all of them).
#[utoipa::path(
    get,
    path = "/v1/revisions",
    operation_id = "listRevisions",
    tag = "revisions",
    params(RevisionParams),
    responses(
        (status = 200, description = "Revisions, each summarised: `change_count` and the first 10 `changes`", body = RevisionList),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn list(
    State(state): State<AdminState>,
    Query(params): Query<RevisionParams>,
) -> Result<Json<RevisionList>, ApiError> {
    let limit = crate::query::page_limit(params.limit, 100)?;
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
        revisions: revisions
            .iter()
            .map(|r| revision_repr(r, CHANGES_SHOWN))
            .collect(),
        next_after,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ChangeParams {
    /// Changes after this many (default 0: from the first); `next_after` of the page before.
    #[param(minimum = 0)]
    after: Option<u64>,
    /// At most this many, 1 to 1000 (default 1000).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChangeList {
    pub revision: u64,
    /// How many resources the revision changed.
    pub change_count: usize,
    /// In the revision's order.
    pub changes: Vec<ChangeRepr>,
    /// Pass as `after` for the next page; null on the last page.
    pub next_after: Option<u64>,
}

/// Every resource one revision changed, a page at a time.
#[utoipa::path(
    get,
    path = "/v1/revisions/{revision}/changes",
    operation_id = "listRevisionChanges",
    tag = "revisions",
    params(
        ("revision" = u64, Path, description = "The revision number", minimum = 1, maximum = 9223372036854775807_i64),
        ChangeParams,
    ),
    responses(
        (status = 200, description = "At most `limit` of the revision's changes after the first `after`", body = ChangeList),
        (status = 400, description = "A bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such revision", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn changes(
    State(state): State<AdminState>,
    path: PathParams,
    Query(params): Query<ChangeParams>,
) -> Result<Json<ChangeList>, ApiError> {
    let n = revision_number(&path)?;
    let limit = crate::query::page_limit(params.limit, 1000)?;
    let after = params.after.unwrap_or(0);
    let found = match n {
        0 => Vec::new(),
        n => state.store.revisions(n - 1, 1).await?,
    };
    let Some(revision) = found.into_iter().find(|r| r.revision == n) else {
        return Err(ApiError::NotFound(format!("there is no revision {n}")));
    };
    let count = revision.changes.len();
    let start = usize::try_from(after).unwrap_or(usize::MAX).min(count);
    let end = start.saturating_add(limit as usize).min(count);
    Ok(Json(ChangeList {
        revision: n,
        change_count: count,
        changes: revision.changes[start..end]
            .iter()
            .map(change_repr)
            .collect(),
        next_after: (end < count).then_some(end as u64),
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DetailParams {
    /// Include each variant's body before and after (default false: constraints and versions
    /// only).
    bodies: Option<bool>,
    /// Changed resources after this many (default 0: from the first); `next_after` of the page
    /// before.
    #[param(minimum = 0)]
    after: Option<u64>,
    /// At most this many changed resources, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
}

pub(crate) fn revision_number(path: &PathParams) -> Result<u64, ApiError> {
    let raw = path.get("revision")?;
    raw.parse::<u64>()
        .ok()
        .filter(|n| *n <= i64::MAX as u64)
        .ok_or_else(|| {
            ApiError::bad_parameter(
                "revision",
                "invalid_revision",
                format!("`{raw}` is not a revision number"),
            )
        })
}

/// One revision: what it changed and, per resource, each variant before and after, a page of
/// changed resources at a time (`limit`, `after`; `change_count` says how many there are).
#[utoipa::path(
    get,
    path = "/v1/revisions/{revision}",
    operation_id = "getRevision",
    tag = "revisions",
    params(
        ("revision" = u64, Path, description = "The revision number", minimum = 1, maximum = 9223372036854775807_i64),
        DetailParams,
    ),
    responses(
        (status = 200, description = "The revision and the diff it made to at most `limit` of its changed resources after the first `after`", body = RevisionDetail),
        (status = 400, description = "Not a revision number, or a bad parameter", body = ProblemBody, content_type = "application/problem+json"),
        (status = 404, description = "No such revision", body = ProblemBody, content_type = "application/problem+json"),
        (status = 410, description = "The history retention pruned it (`history_pruned`; the detail names the oldest kept revision)", body = ProblemBody, content_type = "application/problem+json"),
        ReadProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn get(
    State(state): State<AdminState>,
    path: PathParams,
    Query(params): Query<DetailParams>,
) -> Result<Json<RevisionDetail>, ApiError> {
    let n = revision_number(&path)?;
    let limit = crate::query::page_limit(params.limit, 100)?;
    let after = usize::try_from(params.after.unwrap_or(0)).unwrap_or(usize::MAX);
    match state
        .store
        .revision_diff_page(n, after, limit as usize)
        .await?
    {
        Some(found) => Ok(Json(diff::detail(
            &found,
            after,
            params.bodies.unwrap_or(false),
        )?)),
        None => Err(ApiError::NotFound(format!("there is no revision {n}"))),
    }
}

/// A restore's options. Every field may be left out (`{}`).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreRequest {
    /// Refuse (409) unless the store's head revision is this one.
    #[serde(default)]
    pub expected_revision: Option<u64>,
    /// Validate and report, commit nothing.
    #[serde(default)]
    pub dry_run: bool,
    /// Added to the revision's message, after `restore to revision N`.
    #[serde(default)]
    pub message: Option<String>,
}

/// What a restore did.
#[derive(Debug, Serialize, ToSchema)]
pub struct RestoreResult {
    /// The revision whose state was restored.
    pub restored_to: u64,
    /// The revision committed (for a dry run, the one it would commit); the current head when
    /// the store already was in that state.
    pub revision: u64,
    pub dry_run: bool,
    /// What happened, in words: `restored revision 3 as revision 7`, or that the store
    /// already is in revision 3's state.
    pub summary: String,
    /// The resources the restore changed (would change); empty when nothing differs.
    pub changed: Vec<ChangeRepr>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<ProblemItem>,
    /// Dry runs: which connected clients each changed resource would move.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub impact: Option<crate::impact::ImpactReport>,
}

/// Restore the state right after a past revision, as a new revision.
///
/// Resources created after it are deleted, changed ones get their variants back, deleted ones
/// are recreated. The old state is validated like any changeset (422 if today's rules refuse
/// it). The revision's author is the token's name; its message `restore to revision N`.
#[utoipa::path(
    post,
    path = "/v1/revisions/{revision}/restore",
    operation_id = "restoreRevision",
    tag = "revisions",
    params(("revision" = u64, Path, description = "The revision whose state to restore; 0 is the empty store", minimum = 0, maximum = 9223372036854775807_i64)),
    request_body(content(
        (RestoreRequest = "application/json"),
        (RestoreRequest = "application/yaml"),
    )),
    responses(
        (status = 200, description = "Restored (or, with `dry_run`, validated, with the `impact` on connected clients); `changed` is empty when the store already was in that state", body = RestoreResult),
        (status = 404, description = "No such revision", body = ProblemBody, content_type = "application/problem+json"),
        (status = 410, description = "The history retention pruned the state to restore (`history_pruned`; the detail names the oldest kept revision); nothing was written", body = ProblemBody, content_type = "application/problem+json"),
        (status = 409, description = "`expected_revision` did not hold; nothing was written", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Today's rules refuse the old state (each problem names its resource), or its variants were written before the store kept variant history (`history_not_kept`)", body = ProblemBody, content_type = "application/problem+json"),
        WriteProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn restore(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    path: PathParams,
    Payload(request): Payload<RestoreRequest>,
) -> Result<WithChanges<RestoreResult>, ApiError> {
    let n = revision_number(&path)?;
    let author = caller.and_then(|Extension(c)| c.name);
    let options = RestoreOptions {
        expected_revision: request.expected_revision,
        dry_run: request.dry_run,
        message: request.message,
    };
    // Counted with the changesets: a restore is one.
    let applied = match state.store.restore(n, options, author).await {
        Ok(restored) => changesets::record(&state, Ok(restored.applied), None)?,
        Err(RestoreError::Apply(e)) => changesets::record(&state, Err(e), None)?,
        Err(e) => return Err(e.into()),
    };
    let summary = match (applied.changes.is_empty(), applied.dry_run) {
        (true, _) => format!("the store already is in revision {n}'s state; no revision was made"),
        (false, true) => format!(
            "restoring revision {n} would make revision {}",
            applied.revision
        ),
        (false, false) => format!("restored revision {n} as revision {}", applied.revision),
    };
    let impact = if applied.dry_run && !applied.changes.is_empty() {
        Some(crate::impact::report(&state, applied.previews).await?)
    } else {
        None
    };
    let result = RestoreResult {
        restored_to: n,
        revision: applied.revision,
        dry_run: applied.dry_run,
        summary,
        changed: Vec::new(),
        warnings: applied
            .warnings
            .into_iter()
            .map(|p| ProblemItem::from_problem(p, None))
            .collect(),
        impact,
    };
    Ok(WithChanges {
        result,
        changes: applied.changes,
    })
}
