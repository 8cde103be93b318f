//! Impact preview: which connected clients a changeset would move, before it is committed.
//!
//! A dry run (`POST /v1/changesets` with `dry_run`, and `POST /v1/impact`, which is always
//! one) reads each changed resource's variants before and after under the writers' lock
//! ([`vxds_store::Preview`]), gathers the fleet's client summary ([`fleet`]: every replica's
//! published summary, this replica's own computed afresh) and runs the pure computation
//! ([`vxds_core::impact::resource_impact`]) per resource, off the runtime.
//! [`publish_summaries`] is the loop that publishes this replica's summary.

mod fleet;

use axum::Extension;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;
use vxds_core::impact::{ClientSummary, MoveKind, Population, resource_impact};
use vxds_envoy::changeset::ChangesetRequest;
use vxds_envoy::resource::ResourceType;
use vxds_store::{Applied, ChangeKind, Preview};

pub use fleet::{DEFAULT_SUMMARY_PERIOD, STALE_PERIODS, publish_summaries};

use crate::AdminState;
use crate::auth::Caller;
use crate::body::Payload;
use crate::problem::{ApiError, ProblemBody, ProblemItem, WriteProblems};
use crate::repr::{WithChanges, WriteResult};

/// What a dry run would do to the connected clients.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ImpactReport {
    /// Streams connected over the replicas counted.
    pub streams: u64,
    /// The replicas whose clients are counted: this one, and every other that published its
    /// summary recently (`--client-summary-period`; one that stops publishing drops out after
    /// three periods).
    pub replicas: Vec<ReplicaRepr>,
    /// Per changed resource, in the order of `changed`.
    pub resources: Vec<ResourceImpactRepr>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ReplicaRepr {
    pub replica_id: String,
    /// Streams connected to it.
    pub streams: u64,
    /// When its summary was taken (now, for this replica).
    pub published_at: String,
    /// Whether this is the replica that answered.
    pub local: bool,
}

/// What a change to one resource does to the clients that subscribe to it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ResourceImpactRepr {
    pub type_url: String,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub alias: Option<&'static str>,
    pub name: String,
    #[schema(value_type = String, example = "updated")]
    pub change: ChangeKind,
    /// Streams that subscribe to it (by name, wildcard or glob), whether or not a variant
    /// matches them.
    pub streams: u64,
    /// Streams that would receive something different: the sum over `moves`.
    pub affected: u64,
    /// Streams whose variant and body stay as they are.
    pub unchanged: u64,
    /// Streams that match no variant, before or after.
    pub unmatched: u64,
    pub moves: Vec<MoveRepr>,
}

/// Streams that move the same way between the same variants.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct MoveRepr {
    /// `switch`: to another variant; `update`: same variant, new body (or TTL); `lose`: no
    /// variant matches any more (or the resource is deleted); `gain`: a variant matches now.
    #[schema(value_type = String, example = "switch")]
    pub kind: MoveKind,
    /// The variant they hold now, in the constraint syntax (`*`: unconstrained); null for
    /// `gain`.
    pub from: Option<String>,
    /// The variant they would hold; null for `lose`.
    pub to: Option<String>,
    pub streams: u64,
    /// A few of their node ids (the smallest).
    pub sample_nodes: Vec<String>,
}

/// The impact of `previews` on the fleet's clients.
pub(crate) async fn report(
    state: &AdminState,
    previews: Vec<Preview>,
) -> Result<ImpactReport, ApiError> {
    let fleet = fleet::gather(state).await?;
    let replicas = fleet.replicas;
    let summary = fleet.summary;
    // Matchers are built per resource: CPU work, off the runtime threads.
    let resources = tokio::task::spawn_blocking(move || compute(&summary, &previews))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "impact computation panicked");
            ApiError::Internal
        })?;
    Ok(ImpactReport {
        streams: replicas.iter().map(|r| r.streams).sum(),
        replicas,
        resources,
    })
}

/// The type whose subscribers a resource reaches: its own, except for a list collection's
/// options (named by the collection's URN), which reach the collection's subscribers.
fn subscribed_as(key: &vxds_store::ResourceKey) -> std::borrow::Cow<'_, str> {
    use vxds_envoy::collections::LIST_COLLECTION_OPTIONS_TYPE_URL;
    if key.type_url == LIST_COLLECTION_OPTIONS_TYPE_URL
        && let Ok(urn) = vxds_core::xdstp::XdstpUrn::parse(&key.name)
    {
        return format!(
            "{}{}",
            vxds_envoy::resource::TYPE_URL_PREFIX,
            urn.resource_type()
        )
        .into();
    }
    key.type_url.as_str().into()
}

fn compute(summary: &ClientSummary, previews: &[Preview]) -> Vec<ResourceImpactRepr> {
    let population = Population::new(summary);
    previews
        .iter()
        .map(|p| {
            let groups = population.groups(&subscribed_as(&p.key), &p.key.name);
            let impact = resource_impact(&p.before, &p.after, &groups);
            let change = match (p.before.is_empty(), p.after.is_empty()) {
                (true, _) => ChangeKind::Created,
                (false, true) => ChangeKind::Deleted,
                (false, false) => ChangeKind::Updated,
            };
            ResourceImpactRepr {
                type_url: p.key.type_url.to_string(),
                alias: ResourceType::alias_of(&p.key.type_url),
                name: p.key.name.clone(),
                change,
                streams: impact.streams,
                affected: impact.affected(),
                unchanged: impact.unchanged,
                unmatched: impact.unmatched,
                moves: impact
                    .moves
                    .into_iter()
                    .map(|m| MoveRepr {
                        kind: m.kind,
                        from: m.from,
                        to: m.to,
                        streams: m.streams,
                        sample_nodes: m.sample_nodes,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The answer to a write, with the impact report for a dry run.
pub(crate) async fn write_result(
    state: &AdminState,
    applied: Applied,
) -> Result<WithChanges<WriteResult>, ApiError> {
    let impact = if applied.dry_run {
        Some(report(state, applied.previews).await?)
    } else {
        None
    };
    let result = WriteResult {
        revision: applied.revision,
        dry_run: applied.dry_run,
        changed: Vec::new(),
        warnings: applied
            .warnings
            .into_iter()
            .map(|p| ProblemItem::from_problem(p, None))
            .collect(),
        impact,
        rollout: None,
    };
    Ok(WithChanges {
        result,
        changes: applied.changes,
    })
}

/// Preview a changeset's impact on the connected clients: a dry run (whatever `dry_run`
/// says), validated like any changeset, whose answer carries the impact report. Needs only
/// read scope: it writes nothing and shows what `/v1/clients` shows.
#[utoipa::path(
    post,
    path = "/v1/impact",
    operation_id = "previewImpact",
    tag = "changesets",
    request_body(content(
        (ChangesetRequest = "application/json"),
        (ChangesetRequest = "application/yaml"),
    )),
    responses(
        (status = 200, description = "Validated, nothing written; `impact` says which clients each changed resource would move", body = WriteResult),
        (status = 409, description = "`expected_revision` or an `expected_version` did not hold", body = ProblemBody, content_type = "application/problem+json"),
        (status = 422, description = "Rules refused it; every problem is listed, each with a JSON pointer", body = ProblemBody, content_type = "application/problem+json"),
        WriteProblems,
    ),
    security(("bearer" = []), ())
)]
pub async fn preview(
    State(state): State<AdminState>,
    caller: Option<Extension<Caller>>,
    Payload(mut request): Payload<ChangesetRequest>,
) -> Result<WithChanges<WriteResult>, ApiError> {
    request.dry_run = true;
    let author = caller.and_then(|Extension(c)| c.name);
    let applied = crate::changesets::apply(&state, request, author, None).await?;
    write_result(&state, applied).await
}
