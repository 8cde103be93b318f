//! Restoring the state right after a past revision as a new revision, a page at a time.
//!
//! A restore is an ordinary changeset — a put or delete for each resource changed after the
//! revision, each guarded by the resource's current version, the whole guarded by the head it
//! was computed at — checked by today's rules ([`Checker`]) and committed by
//! [`Store::apply_validated`]. It is never held whole as a request: one snapshot lists the
//! resources to restore (key, current version, which change of theirs to go back to); their
//! past variants are then read with one query per type and page of [`PAGE`] resources, made
//! into operations, and sent over a bounded channel to a blocking thread that validates them
//! as they come, keeping only the validated form. A restore of 100,000 resources is then a few
//! hundred queries (it was two per resource) and holds one page of requests at a time.

use std::collections::{BTreeMap, HashMap};

use futures::TryStreamExt;
use sqlx::{Any, Row, Transaction};
use tokio::sync::mpsc;
use vxds_envoy::changeset::{
    ChangesetHeader, Checked, Checker, DeleteRequest, ExpectedVersion, OperationRequest,
    PutRequest, ResourceKey, VariantRequest,
};
use vxds_envoy::constraints::constraints_to_json;
use vxds_envoy::pointer::Pointer;
use vxds_envoy::resource::{Body, ResourceType};

use super::history::{Past, refuse_pruned};
use super::read::{stored_constraints, ttl_from_ms};
use super::{Store, bulk};
use crate::error::{ApplyError, Conflict, RestoreError, StoreError};
use crate::model::{Applied, ChangeKind, PastState, PastVariant, RestoreOptions, Restored};

/// Attempts of a restore without an expected revision that another writer overtook.
const RESTORE_ATTEMPTS: usize = 3;

/// Resources whose past variants are read with one query (per type) and validated together.
const PAGE: usize = 1000;

/// Pages on their way to validation: reading runs at most this far ahead of it.
const PAGES_IN_FLIGHT: usize = 2;

/// A resource changed after the revision to restore.
struct Planned {
    key: ResourceKey,
    /// Its version now, if it exists.
    current: Option<String>,
    /// Its latest change at or before the revision, if any: the state to go back to.
    last: Option<Last>,
}

/// A resource's latest change at or before the revision to restore.
struct Last {
    revision: i64,
    deleted: bool,
    shared: bool,
}

/// A restore made into a checked changeset, from one snapshot.
enum Made {
    /// The store is in the state to restore: nothing to do, no revision.
    Nothing { head: u64 },
    /// The changeset, and the name of each operation the stateless rules found problems with
    /// (by index; the others are in the changeset), for error messages.
    Changeset {
        checked: Checked,
        refused: HashMap<usize, String>,
    },
}

impl Store {
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
            self.inner.health.check()?;
            let made = self.make_restore(to, &options, &message).await;
            if let Err(RestoreError::Apply(ApplyError::Store(e))) = &made {
                self.inner.health.observe(e);
            }
            let (checked, refused) = match made? {
                Made::Nothing { head } => {
                    return Ok(Restored {
                        restored_to: to,
                        applied: Applied {
                            revision: head,
                            dry_run: options.dry_run,
                            changes: Vec::new(),
                            warnings: Vec::new(),
                            previews: Vec::new(),
                        },
                    });
                }
                Made::Changeset { checked, refused } => (checked, refused),
            };
            let Checked {
                changeset,
                errors,
                warnings,
            } = checked;
            match self
                .apply_validated(&changeset, errors, warnings, author.clone())
                .await
            {
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
                    let name_of = |i: usize| {
                        let ops = &changeset.operations;
                        match ops.binary_search_by_key(&i, |op| op.index) {
                            Ok(at) => Some(ops[at].key.name.as_str()),
                            Err(_) => refused.get(&i).map(String::as_str),
                        }
                    };
                    for problem in invalid.errors.iter_mut().chain(&mut invalid.warnings) {
                        if let Some(name) = problem.operation.and_then(name_of) {
                            problem.message = format!("`{name}`: {}", problem.message);
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

    /// From one snapshot: the head and, checked by the stateless rules, the changeset that
    /// takes every resource changed after `to` back to its state then.
    async fn make_restore(
        &self,
        to: u64,
        options: &RestoreOptions,
        message: &str,
    ) -> Result<Made, RestoreError> {
        let to_row = to.min(i64::MAX as u64) as i64;
        let mut tx = self.begin_snapshot().await?;
        let head = sqlx::query("SELECT revision FROM vxds_head WHERE id = 1")
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        let head = head.try_get::<i64, _>(0).map_err(StoreError::from)? as u64;
        // The state right after the newest pruned revision is still known: the oldest kept
        // one starts from it.
        refuse_pruned(&mut tx, to, to.saturating_add(1)).await?;
        if to > head {
            return Err(RestoreError::NoSuchRevision(to));
        }
        if let Some(expected) = options.expected_revision
            && expected != head
        {
            return Err(ApplyError::Conflict(Conflict {
                pointer: Pointer::root().push("expected_revision"),
                operation: None,
                message: format!("the store is at revision {head}, not {expected}"),
            })
            .into());
        }
        let planned = planned(&mut tx, to_row).await?;
        if planned.is_empty() {
            tx.commit().await.map_err(StoreError::from)?;
            return Ok(Made::Nothing { head });
        }

        let config = self.inner.validation.clone();
        let header = ChangesetHeader {
            // The changeset is only right at the head it was computed at.
            expected_revision: Some(head),
            dry_run: options.dry_run,
            message: Some(message.to_owned()),
        };
        let operations = planned.iter().map(Vec::len).sum();
        let (pages, mut rx) = mpsc::channel::<Vec<OperationRequest>>(PAGES_IN_FLIGHT);
        // Validation is CPU work (the exclusivity analysis): off the runtime threads, while
        // the next page is read.
        let checker = tokio::task::spawn_blocking(move || {
            let mut checker = Checker::with_capacity(&config, operations);
            let mut refused = HashMap::new();
            while let Some(page) = rx.blocking_recv() {
                for op in page {
                    let (index, found) = (checker.count(), checker.problems());
                    let name = op.name().to_owned();
                    checker.push(op);
                    if checker.problems() > found {
                        refused.insert(index, name);
                    }
                }
            }
            (checker.finish(header), refused)
        });
        let mut read = Ok(());
        // The plan is consumed a page at a time, each page freed as its keys move into the
        // operations.
        for page in planned {
            let ops = match page_operations(&mut tx, page, to).await {
                Ok(ops) => ops,
                Err(e) => {
                    read = Err(e);
                    break;
                }
            };
            if pages.send(ops).await.is_err() {
                break; // the checker panicked: its join says so
            }
        }
        drop(pages);
        let (checked, refused) = checker
            .await
            .map_err(|e| StoreError::Corrupt(format!("validation panicked: {e}")))?;
        read?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(Made::Changeset { checked, refused })
    }
}

/// Every resource changed after `to` (in key order), its current version and its latest
/// change at or before `to`, in pages of [`PAGE`]: one query, no bodies.
async fn planned(tx: &mut Transaction<'_, Any>, to: i64) -> Result<Vec<Vec<Planned>>, StoreError> {
    let mut rows = sqlx::query(
        "SELECT k.type_url, k.name, r.version, l.revision, l.change, l.shared \
         FROM (SELECT DISTINCT type_url, name FROM vxds_revision_changes WHERE revision > $1) k \
         LEFT JOIN vxds_resources r ON r.type_url = k.type_url AND r.name = k.name \
         LEFT JOIN vxds_revision_changes l ON l.type_url = k.type_url AND l.name = k.name \
             AND l.revision = (SELECT MAX(m.revision) FROM vxds_revision_changes m \
                 WHERE m.type_url = k.type_url AND m.name = k.name AND m.revision <= $2) \
         ORDER BY k.type_url, k.name",
    )
    .bind(to)
    .bind(to)
    .fetch(&mut **tx);
    let mut planned: Vec<Vec<Planned>> = Vec::new();
    while let Some(row) = rows.try_next().await? {
        let current: Option<String> = row.try_get(2)?;
        let last = match row.try_get::<Option<i64>, _>(3)? {
            Some(revision) => {
                let change: String = row.try_get(4)?;
                Some(Last {
                    revision,
                    deleted: change == ChangeKind::Deleted.as_str(),
                    shared: row.try_get::<Option<i64>, _>(5)? == Some(1),
                })
            }
            None => None,
        };
        let absent = last.as_ref().is_none_or(|l| l.deleted);
        if absent && current.is_none() {
            continue; // created and deleted again since
        }
        if planned.last().is_none_or(|page| page.len() == PAGE) {
            planned.push(Vec::with_capacity(PAGE));
        }
        if let Some(page) = planned.last_mut() {
            page.push(Planned {
                key: ResourceKey {
                    type_url: row.try_get::<String, _>(0)?.into(),
                    name: row.try_get(1)?,
                },
                current,
                last,
            });
        }
    }
    Ok(planned)
}

/// The operations that take `page`'s resources back to their state right after `to`, their
/// past variants read with one query per type.
async fn page_operations(
    tx: &mut Transaction<'_, Any>,
    page: Vec<Planned>,
    to: u64,
) -> Result<Vec<OperationRequest>, RestoreError> {
    let mut variants = past_variants(tx, &page).await?;
    let mut ops = Vec::with_capacity(page.len());
    for planned in page {
        let state = match &planned.last {
            None => PastState::Absent,
            Some(last) if last.deleted => PastState::Absent,
            // Every resource has a variant: an empty set is one the history never saw.
            Some(_) => match variants.remove(&planned.key) {
                Some(found) if !found.is_empty() => PastState::Present(found),
                _ => PastState::NotKept,
            },
        };
        let past = Past {
            state,
            shared: planned.last.as_ref().is_some_and(|l| l.shared),
        };
        ops.push(operation(planned.key, past, planned.current, to)?);
    }
    Ok(ops)
}

/// The variants (in order) each resource of `page` had after its latest change at or before
/// the revision to restore, with one query per type: the names and revisions are matched as
/// two lists, and rows of another resource's revision dropped here.
async fn past_variants(
    tx: &mut Transaction<'_, Any>,
    page: &[Planned],
) -> Result<HashMap<ResourceKey, Vec<PastVariant>>, StoreError> {
    // Per type: each name's revision, and the page's first and last name in the database's
    // order (the page is in that order).
    let mut by_type: BTreeMap<&str, (HashMap<&str, i64>, &str, &str)> = BTreeMap::new();
    for planned in page {
        if let Some(last) = planned.last.as_ref().filter(|l| !l.deleted) {
            let name = planned.key.name.as_str();
            let entry = by_type
                .entry(planned.key.type_url.as_str())
                .or_insert_with(|| (HashMap::new(), name, name));
            entry.0.insert(name, last.revision);
            entry.2 = name;
        }
    }
    let mut out: HashMap<ResourceKey, Vec<PastVariant>> = HashMap::new();
    for (type_url, (names, first, last)) in by_type {
        let mut revisions: Vec<i64> = names.values().copied().collect();
        revisions.sort_unstable();
        revisions.dedup();
        // The name range makes the index scan cover the page only: Postgres' generic plan for
        // a list of bound parameters scans the whole type and filters each row through the
        // list (seconds per page at 100,000 resources).
        let sql = format!(
            "SELECT name, revision, variant_id, constraints, body, version, ttl_ms \
             FROM vxds_variant_history WHERE type_url = $1 AND name >= $2 AND name <= $3 \
             AND name IN ({}) AND revision IN ({}) ORDER BY name, revision, position",
            bulk::placeholders(4, names.len()),
            bulk::placeholders(4 + names.len(), revisions.len()),
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(type_url)
            .bind(first)
            .bind(last);
        for name in names.keys() {
            query = query.bind(*name);
        }
        for revision in &revisions {
            query = query.bind(*revision);
        }
        let mut rows = query.fetch(&mut **tx);
        while let Some(row) = rows.try_next().await? {
            let name: String = row.try_get(0)?;
            let revision: i64 = row.try_get(1)?;
            if names.get(name.as_str()) != Some(&revision) {
                continue;
            }
            let (id, constraints) = stored_constraints(row.try_get(2)?, row.try_get(3)?)?;
            out.entry(ResourceKey {
                type_url: type_url.into(),
                name,
            })
            .or_default()
            .push(PastVariant {
                id,
                constraints,
                body: row.try_get(4)?,
                version: row.try_get(5)?,
                ttl: ttl_from_ms(row.try_get(6)?)?,
            });
        }
    }
    Ok(out)
}

/// The operation that takes one resource from `current` (its version, if it exists) back to
/// `past`.
fn operation(
    key: ResourceKey,
    past: Past,
    current: Option<String>,
    to: u64,
) -> Result<OperationRequest, RestoreError> {
    let expected_version = current.clone().map(ExpectedVersion::One);
    match past.state {
        PastState::Absent => Ok(OperationRequest::Delete(DeleteRequest {
            resource_type: key.type_url.into(),
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
                resource_type: key.type_url.into(),
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
