//! The past: what each revision did (the state before and after, per resource) and restoring
//! the state right after a past revision as a new revision.
//!
//! Every put keeps its variant set in `vxds_variant_history` under its revision, so a
//! resource's state right after revision N is the variant set of its latest change at or
//! before N, or nothing when that change deleted it. A restore is an ordinary changeset built
//! from that state — a put or delete for each resource changed after N, each guarded by the
//! resource's current version, the whole guarded by the head it was computed at — and goes
//! through [`Store::apply`]: today's rules decide whether the old state may come back
//! (`restore`, which reads that state a page at a time).

use sqlx::{Any, Row, Transaction};
use vxds_envoy::changeset::ResourceKey;

use super::Store;
use super::read::{pruned_through, stored_constraints, ttl_from_ms};
use crate::error::StoreError;
use crate::model::{ChangeKind, PastState, PastVariant, ResourceDiff, RevisionDiff};

/// A resource's state right after a revision, with whether it was marked shared then.
pub(super) struct Past {
    pub(super) state: PastState,
    pub(super) shared: bool,
}

impl Store {
    /// One revision with, per resource it changed, the state before and after it.
    pub async fn revision_diff(&self, revision: u64) -> Result<Option<RevisionDiff>, StoreError> {
        self.revision_diff_page(revision, 0, usize::MAX).await
    }

    /// [`Store::revision_diff`] of at most `limit` of the revision's changes after the first
    /// `after` (in the revision's order): `resources` holds those, `revision.changes` all of
    /// them (their count pages the rest).
    pub async fn revision_diff_page(
        &self,
        revision: u64,
        after: usize,
        limit: usize,
    ) -> Result<Option<RevisionDiff>, StoreError> {
        let Some(found) = self.revision(revision).await? else {
            return Ok(None);
        };
        let start = after.min(found.changes.len());
        let end = start.saturating_add(limit).min(found.changes.len());
        self.guarded(async {
            let mut tx = self.begin_snapshot().await?;
            refuse_pruned(&mut tx, revision, revision).await?;
            let mut resources = Vec::with_capacity(end - start);
            for change in &found.changes[start..end] {
                let before = state_at(&mut tx, &change.key, revision - 1).await?.state;
                let after = state_at(&mut tx, &change.key, revision).await?.state;
                resources.push(ResourceDiff {
                    change: change.clone(),
                    before,
                    after,
                });
            }
            tx.commit().await?;
            Ok(Some(RevisionDiff {
                revision: found,
                resources,
            }))
        })
        .await
    }
}

/// [`StoreError::HistoryPruned`] for `revision` if `needs` (the oldest revision whose rows it
/// reads) was pruned.
pub(super) async fn refuse_pruned(
    tx: &mut Transaction<'_, Any>,
    revision: u64,
    needs: u64,
) -> Result<(), StoreError> {
    let pruned_through = pruned_through(tx).await?;
    if needs <= pruned_through {
        return Err(StoreError::HistoryPruned {
            revision,
            oldest_kept: pruned_through + 1,
        });
    }
    Ok(())
}

/// A resource's state right after revision `at`, and whether it was shared then (not known
/// of revisions recorded before migration 0008 at another version than today's: unshared).
async fn state_at(
    tx: &mut Transaction<'_, Any>,
    key: &ResourceKey,
    at: u64,
) -> Result<Past, StoreError> {
    let absent = |state| Past {
        state,
        shared: false,
    };
    let last = sqlx::query(
        "SELECT revision, change, shared FROM vxds_revision_changes \
         WHERE type_url = $1 AND name = $2 AND revision <= $3 ORDER BY revision DESC LIMIT 1",
    )
    .bind(key.type_url.as_str())
    .bind(&key.name)
    .bind(at.min(i64::MAX as u64) as i64)
    .fetch_optional(&mut **tx)
    .await?;
    let Some(last) = last else {
        return Ok(absent(PastState::Absent));
    };
    let revision: i64 = last.try_get(0)?;
    let change: String = last.try_get(1)?;
    if change == ChangeKind::Deleted.as_str() {
        return Ok(absent(PastState::Absent));
    }
    let shared = last.try_get::<Option<i64>, _>(2)? == Some(1);
    let rows = sqlx::query(
        "SELECT variant_id, constraints, body, version, ttl_ms FROM vxds_variant_history \
         WHERE type_url = $1 AND name = $2 AND revision = $3 ORDER BY position",
    )
    .bind(key.type_url.as_str())
    .bind(&key.name)
    .bind(revision)
    .fetch_all(&mut **tx)
    .await?;
    if rows.is_empty() {
        // Every resource has a variant: an empty set is one the history never saw.
        return Ok(absent(PastState::NotKept));
    }
    let variants = rows
        .iter()
        .map(|row| {
            let (id, constraints) = stored_constraints(row.try_get(0)?, row.try_get(1)?)?;
            Ok(PastVariant {
                id,
                constraints,
                body: row.try_get(2)?,
                version: row.try_get(3)?,
                ttl: ttl_from_ms(row.try_get(4)?)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Past {
        state: PastState::Present(variants),
        shared,
    })
}
