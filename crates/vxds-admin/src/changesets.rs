//! `POST /v1/changesets`: any number of puts and deletes, all or nothing, as one revision.

use axum::extract::State;
use axum::{Extension, Json};
use vxds_envoy::changeset::ChangesetRequest;
use vxds_store::{Applied, ApplyError};

use crate::AdminState;
use crate::auth::Caller;
use crate::body::Payload;
use crate::problem::{ApiError, ProblemBody, WriteProblems};
use crate::query::Query;
use crate::repr::WriteResult;

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
    Payload(request): Payload<ChangesetRequest>,
) -> Result<Json<WriteResult>, ApiError> {
    let author = caller.and_then(|Extension(c)| c.name);
    let waiting = wait.wait()?;
    if wait.revert_on_nack == Some(true) && waiting.is_none() {
        return Err(ApiError::bad_parameter(
            "revert_on_nack",
            "revert_without_wait",
            "`revert_on_nack` needs `wait`: a refusal is only seen while waiting",
        ));
    }
    let applied = apply(&state, request, author.clone(), None).await?;
    let committed = !applied.dry_run && !applied.changes.is_empty();
    let revision = applied.revision;
    let mut result = crate::impact::write_result(&state, applied).await?;
    if let Some(waiting) = waiting.filter(|_| committed) {
        let revert = wait.revert_on_nack == Some(true);
        result.rollout =
            Some(crate::rollout::follow(&state, revision, waiting, revert, author).await?);
    }
    Ok(Json(result))
}
