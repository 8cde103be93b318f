//! What the store holds and answers with.

use serde::Serialize;
use vxds_core::impact::{ClientSummary, VariantState};
use vxds_core::{CanonicalConstraints, ConstraintsId};
use vxds_envoy::changeset::{Problem, ResourceKey};

/// A resource as stored, with all its variants in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResource {
    pub key: ResourceKey,
    /// Hash of the variants' ids and versions.
    pub version: String,
    /// The revision that last changed it.
    pub revision: u64,
    pub created_revision: u64,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// A secret marked shared: served to any client its variants match (issue 22).
    pub shared: bool,
    pub variants: Vec<StoredVariant>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredVariant {
    pub id: ConstraintsId,
    pub constraints: CanonicalConstraints,
    /// The body: an encoded `google.protobuf.Any`.
    pub body: Vec<u8>,
    /// Content hash of type, constraints and body.
    pub version: String,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// How long a client keeps it without an update or a heartbeat; `None`: forever.
    pub ttl: Option<std::time::Duration>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    Created,
    Updated,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Created => "created",
            ChangeKind::Updated => "updated",
            ChangeKind::Deleted => "deleted",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Self> {
        match s {
            "created" => Some(ChangeKind::Created),
            "updated" => Some(ChangeKind::Updated),
            "deleted" => Some(ChangeKind::Deleted),
            _ => None,
        }
    }
}

/// One resource a revision changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Change {
    #[serde(flatten)]
    pub key: ResourceKey,
    pub change: ChangeKind,
    /// The resource's version after the change; `None` when deleted.
    pub version: Option<String>,
}

/// A committed changeset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Revision {
    pub revision: u64,
    /// Its commit id (see [`ChangeBatch::commit_id`]): tells this revision from another
    /// commit with the same number (event-stream ids carry it). Not part of its JSON.
    #[serde(skip)]
    pub commit_id: i64,
    pub created_at_ms: i64,
    pub author: Option<String>,
    pub message: Option<String>,
    pub changes: Vec<Change>,
}

/// What applying a changeset did (or, for a dry run, would do).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The new revision; the current head when nothing changed.
    pub revision: u64,
    pub dry_run: bool,
    /// Resources whose state changed; operations that changed nothing are left out.
    pub changes: Vec<Change>,
    pub warnings: Vec<Problem>,
    /// Dry runs only: each changed resource's variants before and after, read under the
    /// writers' lock, for impact preview.
    pub previews: Vec<Preview>,
}

/// A changed resource's variants as they are and as a dry run would leave them (in stored
/// order; empty when it does not exist before, or after).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Preview {
    pub key: ResourceKey,
    pub before: Vec<VariantState>,
    pub after: Vec<VariantState>,
}

/// One replica's client summary as published in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSummary {
    pub replica_id: String,
    pub published_at_ms: i64,
    pub expires_at_ms: i64,
    pub summary: ClientSummary,
}

/// One row of a resource listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceSummary {
    pub key: ResourceKey,
    pub version: String,
    pub revision: u64,
    pub variant_count: u64,
    pub updated_at_ms: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only this type URL.
    pub type_url: Option<String>,
    /// Only names starting with this.
    pub prefix: Option<String>,
    pub limit: usize,
    /// Resume after this key (the previous page's `next`).
    pub after: Option<ResourceKey>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListPage {
    pub resources: Vec<ResourceSummary>,
    /// Where the next page starts, if there is one.
    pub next: Option<ResourceKey>,
}

/// One revision in the change feed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevisionChangeList {
    pub revision: u64,
    /// Its commit id (see [`ChangeBatch::commit_id`]; 0 for revisions from before ids).
    pub commit_id: i64,
    pub committed_at_ms: i64,
    pub changed: Vec<ResourceKey>,
    /// Who committed it and why, carried into the index for the event stream.
    pub author: Option<String>,
    pub message: Option<String>,
}

impl StoredResource {
    /// A resource as the store would hold it after committing `resource` at `revision`
    /// (timestamps `now_ms`): for building snapshots without a database.
    pub fn from_validated(
        key: ResourceKey,
        resource: &vxds_envoy::changeset::ValidatedResource,
        revision: u64,
        now_ms: i64,
    ) -> Self {
        Self {
            key,
            version: resource.version.clone(),
            revision,
            created_revision: revision,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            shared: resource.shared,
            variants: resource
                .variants
                .iter()
                .map(|v| StoredVariant {
                    id: v.constraints.id(),
                    constraints: v.constraints.clone(),
                    body: v.body.clone(),
                    version: v.version.clone(),
                    created_at_ms: now_ms,
                    updated_at_ms: now_ms,
                    ttl: v.ttl,
                })
                .collect(),
        }
    }
}

/// Everything committed after a revision, read from one consistent snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChangeBatch {
    /// The snapshot's head revision: the state below is exactly this revision's.
    pub revision: u64,
    /// The head revision's commit id (random, recorded with it; 0 for revision 0 and for
    /// revisions from before ids were recorded): another commit with the same number is
    /// another history.
    pub commit_id: i64,
    /// Each revision after the one asked for, with the resources it changed.
    pub revisions: Vec<RevisionChangeList>,
    /// The current state of every changed resource that still exists (all resources when
    /// asked for everything after revision 0).
    pub resources: Vec<StoredResource>,
    /// Changed resources that no longer exist.
    pub deleted: Vec<ResourceKey>,
    /// `resources` is the whole state, not what changed: whatever was held before is
    /// replaced (the first load, or a reader from before revisions the retention pruned).
    pub complete: bool,
}

/// What [`crate::Store::changes_after`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Followed {
    /// The revisions after the one asked for, which the database still has.
    Changes(ChangeBatch),
    /// The database no longer has the revision asked for with that commit id: its head is
    /// below it, or that number is another commit (a failover to a lagging standby, a
    /// restore). Nothing read before counts; reload the whole state.
    Diverged {
        /// The database's head revision now.
        head: u64,
    },
}

/// A variant as a revision left it (from the variant history).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PastVariant {
    pub id: ConstraintsId,
    pub constraints: CanonicalConstraints,
    /// The body: an encoded `google.protobuf.Any`.
    pub body: Vec<u8>,
    pub version: String,
    pub ttl: Option<std::time::Duration>,
}

/// A resource's state right after some revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PastState {
    /// It did not exist.
    Absent,
    /// It existed with these variants, in order.
    Present(Vec<PastVariant>),
    /// It existed, but its variants were written before the store kept variant history.
    NotKept,
}

/// What one revision did to one resource: its state before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceDiff {
    pub change: Change,
    pub before: PastState,
    pub after: PastState,
}

/// A revision with, per resource it changed, the state before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionDiff {
    pub revision: Revision,
    pub resources: Vec<ResourceDiff>,
}

/// How to restore a past revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreOptions {
    /// Refuse (conflict) unless the store's head revision is this one.
    pub expected_revision: Option<u64>,
    /// Validate and report, commit nothing.
    pub dry_run: bool,
    /// Added to the revision's message, after `restore to revision N`.
    pub message: Option<String>,
}

/// What a restore did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The revision whose state was restored.
    pub restored_to: u64,
    /// The new revision (none when the state already was that one: `changes` is empty and
    /// `revision` the head).
    pub applied: Applied,
}
