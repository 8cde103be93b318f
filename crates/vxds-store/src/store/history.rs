//! The past: what each revision did (the state before and after, per resource) and restoring
//! the state right after a past revision as a new revision.
//!
//! Every put keeps its variant set in `vxds_variant_history` under its revision, so a
//! resource's state right after revision N is the variant set of its latest change at or
//! before N, or nothing when that change deleted it. A restore is an ordinary changeset built
//! from that state — a put or delete for each resource changed after N, each guarded by the
//! resource's current version, the whole guarded by the head it was computed at — and goes
//! through [`Store::apply`]: today's rules decide whether the old state may come back.

use sqlx::{Any, Row, Transaction};
use vxds_envoy::changeset::{
    ChangesetRequest, DeleteRequest, ExpectedVersion, OperationRequest, PutRequest, ResourceKey,
    VariantRequest,
};
use vxds_envoy::constraints::constraints_to_json;
use vxds_envoy::pointer::Pointer;
use vxds_envoy::resource::{Body, ResourceType};

use super::Store;
use super::read::{pruned_through, stored_constraints, ttl_from_ms};
use crate::error::{ApplyError, Conflict, RestoreError, StoreError};
use crate::model::{
    Applied, ChangeKind, PastState, PastVariant, ResourceDiff, RestoreOptions, Restored,
    RevisionDiff,
};

/// Attempts of a restore without an expected revision that another writer overtook.
const RESTORE_ATTEMPTS: usize = 3;

/// A restore computed from one snapshot: the head it was computed at and, per resource that
/// differs from the state to restore, that state and the resource's current version.
struct Plan {
    head: u64,
    resources: Vec<(ResourceKey, Past, Option<String>)>,
}

/// A resource's state right after a revision, with whether it was marked shared then.
struct Past {
    state: PastState,
    shared: bool,
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

    /// Makes the store equal to its state right after revision `to` with a new revision
    /// (resources created since deleted, changed ones put back, deleted ones recreated), or
    /// refuses it whole. Restoring the state the store is in changes nothing and makes no
    /// revision.
    pub async fn restore(
        &self,
        to: u64,
        options: RestoreOptions,
        author: Option<String>,
    ) -> Result<Restored, RestoreError> {
        let message = match &options.message {
            Some(m) => format!("restore to revision {to}: {m}"),
            None => format!("restore to revision {to}"),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let plan = self.guarded(self.restore_plan(to)).await?;
            if to > plan.head {
                return Err(RestoreError::NoSuchRevision(to));
            }
            if let Some(expected) = options.expected_revision
                && expected != plan.head
            {
                return Err(ApplyError::Conflict(Conflict {
                    pointer: Pointer::root().push("expected_revision"),
                    operation: None,
                    message: format!("the store is at revision {}, not {expected}", plan.head),
                })
                .into());
            }
            if plan.resources.is_empty() {
                return Ok(Restored {
                    restored_to: to,
                    applied: Applied {
                        revision: plan.head,
                        dry_run: options.dry_run,
                        changes: Vec::new(),
                        warnings: Vec::new(),
                        previews: Vec::new(),
                    },
                });
            }
            let keys: Vec<ResourceKey> = plan.resources.iter().map(|r| r.0.clone()).collect();
            let request = ChangesetRequest {
                // The plan is only right at the head it was computed at.
                expected_revision: Some(plan.head),
                dry_run: options.dry_run,
                message: Some(message.clone()),
                operations: plan
                    .resources
                    .into_iter()
                    .map(|(key, state, current)| operation(key, state, current, to))
                    .collect::<Result<_, _>>()?,
            };
            match self.apply(request, author.clone()).await {
                Ok(applied) => {
                    return Ok(Restored {
                        restored_to: to,
                        applied,
                    });
                }
                // Another writer came first: plan again from the new head, unless the caller
                // said which head the restore is for.
                Err(ApplyError::Conflict(_))
                    if options.expected_revision.is_none() && attempt < RESTORE_ATTEMPTS => {}
                Err(ApplyError::Invalid(mut invalid)) => {
                    // The changeset was made here, not sent: name the resource instead of
                    // pointing into it.
                    for problem in invalid.errors.iter_mut().chain(&mut invalid.warnings) {
                        if let Some(key) = problem.operation.and_then(|i| keys.get(i)) {
                            problem.message = format!("`{}`: {}", key.name, problem.message);
                        }
                        problem.pointer = Pointer::root();
                        problem.operation = None;
                    }
                    return Err(ApplyError::Invalid(invalid).into());
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The head and, from the same snapshot, every resource changed after `to` whose state
    /// at `to` differs from its current one.
    async fn restore_plan(&self, to: u64) -> Result<Plan, StoreError> {
        let to = to.min(i64::MAX as u64);
        let mut tx = self.begin_snapshot().await?;
        let head = sqlx::query("SELECT revision FROM vxds_head WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?;
        let head = head.try_get::<i64, _>(0)? as u64;
        // The state right after the newest pruned revision is still known: the oldest kept
        // one starts from it.
        refuse_pruned(&mut tx, to, to.saturating_add(1)).await?;
        let rows = sqlx::query(
            "SELECT DISTINCT c.type_url, c.name, r.version FROM vxds_revision_changes c \
             LEFT JOIN vxds_resources r ON r.type_url = c.type_url AND r.name = c.name \
             WHERE c.revision > $1 ORDER BY c.type_url, c.name",
        )
        .bind(to as i64)
        .fetch_all(&mut *tx)
        .await?;
        let mut resources = Vec::with_capacity(rows.len());
        for row in rows {
            let key = ResourceKey {
                type_url: row.try_get(0)?,
                name: row.try_get(1)?,
            };
            let current: Option<String> = row.try_get(2)?;
            let state = state_at(&mut tx, &key, to).await?;
            if matches!(state.state, PastState::Absent) && current.is_none() {
                continue; // created and deleted again since
            }
            resources.push((key, state, current));
        }
        tx.commit().await?;
        Ok(Plan { head, resources })
    }
}

/// [`StoreError::HistoryPruned`] for `revision` if `needs` (the oldest revision whose rows it
/// reads) was pruned.
async fn refuse_pruned(
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
    .bind(&key.type_url)
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
    .bind(&key.type_url)
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

/// The operation that takes one resource from `current` (its version, if it exists) back to
/// `state`.
fn operation(
    key: ResourceKey,
    past: Past,
    current: Option<String>,
    to: u64,
) -> Result<OperationRequest, RestoreError> {
    let expected_version = current.clone().map(ExpectedVersion::One);
    match past.state {
        PastState::Absent => Ok(OperationRequest::Delete(DeleteRequest {
            resource_type: key.type_url,
            name: key.name,
            expected_version,
        })),
        PastState::NotKept => Err(RestoreError::HistoryNotKept { key, revision: to }),
        PastState::Present(variants) => {
            let ty = ResourceType::resolve(&key.type_url)
                .map_err(|e| StoreError::Corrupt(format!("stored type: {}", e.0)))?;
            let variants = variants
                .into_iter()
                .map(|v| {
                    let body = Body::from_any_bytes(v.body, &ty)
                        .map_err(|e| StoreError::Corrupt(format!("stored body: {}", e.message)))?;
                    Ok(VariantRequest {
                        constraints: constraints_to_json(v.constraints.constraints()),
                        resource: body.to_json(&ty).into(),
                        ttl: v.ttl.map(|t| format!("{}ms", t.as_millis())),
                        redirect: None,
                    })
                })
                .collect::<Result<_, StoreError>>()?;
            Ok(OperationRequest::Put(PutRequest {
                resource_type: key.type_url,
                name: key.name,
                must_not_exist: current.is_none(),
                expected_version,
                // As it was: restoring neither shares nor unshares a secret by itself.
                shared: past.shared,
                variants,
            }))
        }
    }
}
