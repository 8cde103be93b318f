//! `POST /v1/changesets`: any number of puts and deletes, all or nothing, as one revision.

use axum::Extension;
use axum::extract::{FromRequest, Request, State};
use vxds_envoy::changeset::{ChangesetRequest, Checked};
use vxds_store::{Applied, ApplyError};

use crate::AdminState;
use crate::auth::Caller;
use crate::problem::{ApiError, ProblemBody, WriteProblems};
use crate::query::Query;
use crate::repr::{WithChanges, WriteResult};

/// Applies through the store and counts the outcome.
pub async fn apply(
    state: &AdminState,
    request: ChangesetRequest,
    author: Option<String>,
    strip: Option<&str>,
) -> Result<Applied, ApiError> {
    let result = state.store.apply(request, author).await;
    record(state, result, strip)
}

/// A changeset body, checked by the stateless rules while it was read
/// ([`crate::body::changeset`]), within the changeset body limit.
pub struct CheckedBody(pub Checked);

impl FromRequest<AdminState> for CheckedBody {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AdminState) -> Result<Self, ApiError> {
        crate::body::changeset::checked(request, state)
            .await
            .map(CheckedBody)
    }
}

/// Counts the outcome of an apply and maps its error.
pub fn record(
    state: &AdminState,
    result: Result<Applied, ApplyError>,
    strip: Option<&str>,
) -> Result<Applied, ApiError> {
    let outcome = match &result {
        Ok(a) if a.dry_run => "dry_run",
        Ok(a) if a.changes.is_empty() => "unchanged",
        Ok(_) => "committed",
        Err(ApplyError::Invalid(_)) => "invalid",
        Err(ApplyError::Conflict(_)) => "conflict",
        Err(ApplyError::Store(_)) => "error",
    };
    state.metrics.changeset(outcome);
    result.map_err(|e| ApiError::from_apply(e, strip))
}

/// Apply a changeset: puts and deletes, all or nothing, as one revision.
///
/// A JSON body is validated while it arrives, one operation at a time, and never held whole.
/// Its limit is the server's `--admin-changeset-body-limit` (256 MiB by default; 413 beyond),
/// larger than other bodies', and it holds at most `--max-changeset-operations` operations
/// (1,000,000 by default; 422 `too_many_operations` beyond).
///
/// With `?wait=30s`, the answer comes once every client stream the revision changed accepted
/// it, or one refused it, or the wait ended (`rollout`). With `&revert_on_nack=true` as well, a
/// refusal restores the state before the revision as a new revision — unless something was
/// committed since — and waits for that one too.
#[utoipa::path(
    post,
    path = "/v1/changesets",
    operation_id = "applyChangeset",
    tag = "changesets",
    params(crate::rollout::WaitParams),
    request_body(content(
        (ChangesetRequest = "application/json"),
        (ChangesetRequest = "application/yaml"),
    )),
    responses(
        (status = 200, description = "Applied (or, with `dry_run`, validated, with the `impact` on connected clients); `changed` is empty when nothing changed", body = WriteResult),
        (status = 409, description = "`expected_revision` or an `expected_version` did not hold; nothing was written", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Rules refused it; every problem is listed, each with a JSON pointer", body = ProblemBody, content_type = "application/problem+json"),
        WriteProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn post(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    Query(wait): Query<crate::rollout::WaitParams>,
    CheckedBody(checked): CheckedBody,
) -> Result<WithChanges<WriteResult>, ApiError> {
    let author = caller.and_then(|Extension(c)| c.name);
    let waiting = wait.wait()?;
    if wait.revert_on_nack == Some(true) && waiting.is_none() {
        return Err(ApiError::bad_parameter(
            "revert_on_nack",
            "revert_without_wait",
            "`revert_on_nack` needs `wait`: a refusal is only seen while waiting",
        ));
    }
    let result = state.store.apply_checked(checked, author.clone()).await;
    let applied = record(&state, result, None)?;
    let committed = !applied.dry_run && !applied.changes.is_empty();
    let revision = applied.revision;
    let mut answer = crate::impact::write_result(&state, applied).await?;
    if let Some(waiting) = waiting.filter(|_| committed) {
        let revert = wait.revert_on_nack == Some(true);
        answer.result.rollout =
            Some(crate::rollout::follow(&state, revision, waiting, revert, author).await?);
    }
    Ok(answer)
}
