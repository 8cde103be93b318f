//! Applying a changeset: all or nothing, as one revision.
//!
//! 1. Every stateless rule runs first, off the async runtime ([`changeset::check`]).
//! 2. One transaction takes the head row's lock, which serialises writers: what it reads next
//!    is the latest committed state, and nobody commits until it is done.
//! 3. Under the lock: expected revision and each operation's precondition (expected versions,
//!    `must_not_exist`: conflicts, which come first), deletes of missing resources, and the
//!    aggregate-cluster graph across the whole store after the changeset (when the changeset
//!    adds aggregate edges: removing one cannot break the graph's rules), on the operations
//!    that passed step 1. All errors of steps 1 and 3 are reported together.
//! 4. Operations that change nothing are dropped; if nothing is left, no revision is made.
//! 5. The writes (multi-row statements, a batch at a time: [`bulk`]), the revision and its
//!    change list, the head; with Postgres a NOTIFY that is
//!    delivered at commit. Then the head watch moves.
//!
//! Dry runs do everything but commit.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Any, Row, Transaction};
use vxds_envoy::changeset::{
    self, Action, ChangesetRequest, Checked, Invalid, Problem, ResourceKey, ValidatedResource,
};
use vxds_envoy::pointer::Pointer;
use vxds_envoy::resource::CLUSTER;

use super::{Backend, Store, bulk, notify};
use crate::error::{ApplyError, Conflict, StoreError};
use crate::model::{Applied, Change, ChangeKind, Preview};
use vxds_core::impact::VariantState;

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// What a touched resource looks like before the changeset.
struct Current {
    version: String,
    created_revision: i64,
    created_at_ms: i64,
}

impl Store {
    /// Applies `request` as one revision, or refuses it whole. `author` is recorded with the
    /// revision.
    pub async fn apply(
        &self,
        request: ChangesetRequest,
        author: Option<String>,
    ) -> Result<Applied, ApplyError> {
        // While the store is down, not even validation: the answer is 503 either way.
        self.inner.health.check()?;
        let config = self.inner.validation.clone();
        // Validation is CPU work (the exclusivity analysis): keep it off the runtime threads.
        let checked = tokio::task::spawn_blocking(move || changeset::check(request, &config))
            .await
            .map_err(|e| StoreError::Corrupt(format!("validation panicked: {e}")))?;
        self.apply_checked(checked, author).await
    }

    /// [`Store::apply`] of a changeset the stateless rules already checked, with this store's
    /// [`Store::validation`] (e.g. while its request body was decoded,
    /// [`changeset::Checker`]): the rules that need stored state, then the commit.
    pub async fn apply_checked(
        &self,
        checked: Checked,
        author: Option<String>,
    ) -> Result<Applied, ApplyError> {
        let Checked {
            changeset,
            errors,
            warnings,
        } = checked;
        self.apply_validated(&changeset, errors, warnings, author)
            .await
    }

    /// [`Store::apply_checked`] of a changeset the caller keeps: a restore names the resource
    /// of each problem from it, instead of holding a list of every operation's key.
    pub(crate) async fn apply_validated(
        &self,
        changeset: &changeset::ValidatedChangeset,
        stateless_errors: Vec<Problem>,
        warnings: Vec<Problem>,
        author: Option<String>,
    ) -> Result<Applied, ApplyError> {
        self.inner.health.check()?;
        let written = self
            .write(changeset, stateless_errors, warnings, author)
            .await;
        if let Err(ApplyError::Store(e)) = &written {
            self.inner.health.observe(e);
        }
        let (applied, committed) = written?;
        if committed {
            self.publish_head(applied.revision);
        }
        Ok(applied)
    }

    /// Everything under the lock. `stateless_errors` are the problems already found: the rules
    /// that need state still run on the operations that passed, so every error is reported at
    /// once.
    async fn write(
        &self,
        changeset: &changeset::ValidatedChangeset,
        stateless_errors: Vec<Problem>,
        warnings: Vec<Problem>,
        author: Option<String>,
    ) -> Result<(Applied, bool), ApplyError> {
        // Queue behind this process's other writers before taking a connection.
        let _turn = self.inner.write_queue.acquire().await.ok();
        // Found down while this writer queued: refuse now rather than wait out the pool.
        self.inner.health.check()?;
        let mut tx = self.pool().begin().await.map_err(StoreError::from)?;
        if self.backend() == Backend::Postgres {
            // Stated, not assumed from the server's default: the head row lock serialises
            // writers, and READ COMMITTED never fails a transaction for serialisation.
            sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?;
        }
        let head = lock_head(&mut tx, self.backend()).await?;
        // Under the lock no commit is in flight, so a head below what this process has seen
        // means the database went back (a failover to a lagging standby, a restore): the index
        // checks at once instead of at the next poll or LISTEN reconnection, as this write is
        // about to reuse revision numbers it may hold with other content.
        super::follow::observed(
            &self.inner.head,
            &self.inner.notified,
            &self.inner.checks,
            head,
            false,
        );

        if let Some(expected) = changeset.expected_revision
            && expected != head
        {
            return Err(ApplyError::Conflict(Conflict {
                pointer: Pointer::root().push("expected_revision"),
                operation: None,
                message: format!("the store is at revision {head}, not {expected}"),
            }));
        }

        let keys: Vec<&ResourceKey> = changeset.operations.iter().map(|op| &op.key).collect();
        let mut current = load_current(&mut tx, &keys).await?;
        drop(keys);

        let mut errors = stateless_errors;
        // At most one change per operation; sized once, not grown by doubling.
        let mut changes = Vec::with_capacity(changeset.operations.len());
        for op in &changeset.operations {
            let existing = current.get(&op.key);
            if let Err((field, message)) = op
                .precondition
                .check(&op.key.name, existing.map(|c| c.version.as_str()))
            {
                return Err(ApplyError::Conflict(Conflict {
                    pointer: Pointer::root()
                        .push("operations")
                        .push(op.index)
                        .push(field),
                    operation: Some(op.index),
                    message,
                }));
            }
            match (&op.action, existing) {
                (Action::Delete, None) => errors.push(
                    Problem::new(
                        Pointer::root().push("operations").push(op.index),
                        "not_found",
                        format!(
                            "there is no {} named `{}` to delete",
                            short_type(&op.key.type_url),
                            op.key.name
                        ),
                    )
                    .at(op.index, None),
                ),
                (Action::Delete, Some(_)) => changes.push(Change {
                    key: op.key.clone(),
                    change: ChangeKind::Deleted,
                    version: None,
                }),
                (Action::Put(resource), Some(c)) if c.version == resource.version => {} // unchanged
                (Action::Put(resource), existing) => changes.push(Change {
                    key: op.key.clone(),
                    change: if existing.is_some() {
                        ChangeKind::Updated
                    } else {
                        ChangeKind::Created
                    },
                    version: Some(resource.version.clone()),
                }),
            }
        }

        // A re-applied file changes little: the answer keeps only the list's length.
        changes.shrink_to_fit();
        errors.extend(graph_problems(&mut tx, changeset).await?);
        if !errors.is_empty() {
            errors.sort_by_key(|p| p.operation);
            return Err(ApplyError::Invalid(Invalid { errors, warnings }));
        }

        let dry_run = changeset.dry_run;
        if changes.is_empty() || dry_run {
            let revision = if changes.is_empty() { head } else { head + 1 };
            let previews = if dry_run {
                previews(&mut tx, changeset, &changes).await?
            } else {
                Vec::new()
            };
            tx.rollback().await.map_err(StoreError::from)?;
            return Ok((
                Applied {
                    revision,
                    dry_run,
                    changes,
                    warnings,
                    previews,
                },
                false,
            ));
        }

        let revision = head + 1;
        let now = now_ms();
        let changed: BTreeSet<&ResourceKey> = changes.iter().map(|c| &c.key).collect();
        let changed_ops: Vec<&changeset::ValidatedOperation> = changeset
            .operations
            .iter()
            .filter(|op| changed.contains(&op.key))
            .collect();
        drop(changed);
        let deleted: Vec<&ResourceKey> = changed_ops
            .iter()
            .filter(|op| matches!(op.action, Action::Delete))
            .map(|op| &op.key)
            .collect();
        // Only puts read what they replace: a changeset of deletions (a restore to an empty
        // store) frees the current versions before its deletes run.
        if deleted.len() == changed_ops.len() {
            current = HashMap::new();
        }
        delete_resources(&mut tx, &deleted).await?;
        drop(deleted);
        let puts: Vec<(&ResourceKey, &ValidatedResource)> = changed_ops
            .iter()
            .filter_map(|op| match &op.action {
                Action::Put(resource) => Some((&op.key, &**resource)),
                Action::Delete => None,
            })
            .collect();
        put_resources(&mut tx, &puts, &current, revision, now).await?;
        drop((puts, changed_ops, current));
        // Kept with each put's change, so that a restore brings the sharing back too.
        let shared: BTreeSet<&ResourceKey> = changeset
            .operations
            .iter()
            .filter(|op| matches!(&op.action, Action::Put(r) if r.shared))
            .map(|op| &op.key)
            .collect();
        insert_revision(
            &mut tx,
            revision,
            now,
            author.as_deref(),
            changeset.message.as_deref(),
            &changes,
            &shared,
        )
        .await?;
        sqlx::query("UPDATE vxds_head SET revision = $1 WHERE id = 1")
            .bind(revision as i64)
            .execute(&mut *tx)
            .await
            .map_err(StoreError::from)?;
        if self.backend() == Backend::Postgres {
            // Transactional: delivered to every listener when, and only if, this commits.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(notify::CHANNEL)
                .bind(revision.to_string())
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?;
        }
        tx.commit().await.map_err(StoreError::from)?;
        Ok((
            Applied {
                revision,
                dry_run: false,
                changes,
                warnings,
                previews: Vec::new(),
            },
            true,
        ))
    }
}

/// The aggregate-cluster graph and the redirect rule across the store as the changeset would
/// leave it. What it builds is dropped on return: a write of 100,000 clusters would otherwise
/// hold a copy of every name while it commits.
async fn graph_problems(
    tx: &mut Transaction<'_, Any>,
    changeset: &changeset::ValidatedChangeset,
) -> Result<Vec<Problem>, StoreError> {
    let mut problems = Vec::new();
    // Only an aggregate edge can break the aggregate rules; removing one cannot.
    if changeset.adds_aggregate_edges() {
        let mut edges = load_edges(tx).await?;
        changeset.update_aggregate_edges(&mut edges);
        problems.extend(changeset.graph_problems(&edges));
    }
    // Only a redirect can break the redirect rule; removing one cannot.
    if changeset
        .operations
        .iter()
        .any(|op| matches!(&op.action, Action::Put(resource) if !resource.redirects.is_empty()))
    {
        let mut edges = load_redirects(tx).await?;
        for (key, targets) in changeset.redirect_updates() {
            if targets.is_empty() {
                edges.remove(&key);
            } else {
                edges.insert(key, targets);
            }
        }
        problems.extend(changeset.redirect_problems(&edges));
    }
    Ok(problems)
}

/// Each changed resource's variants now (read under the lock, as the changeset's checks were)
/// and as the changeset would leave them.
async fn previews(
    tx: &mut Transaction<'_, Any>,
    changeset: &changeset::ValidatedChangeset,
    changes: &[Change],
) -> Result<Vec<Preview>, StoreError> {
    let mut previews = Vec::with_capacity(changes.len());
    for change in changes {
        let rows = sqlx::query(
            "SELECT variant_id, constraints, version FROM vxds_variants \
             WHERE type_url = $1 AND name = $2 ORDER BY position",
        )
        .bind(change.key.type_url.as_str())
        .bind(&change.key.name)
        .fetch_all(&mut **tx)
        .await?;
        let mut before = Vec::with_capacity(rows.len());
        for row in rows {
            let (_, constraints) =
                super::read::stored_constraints(row.try_get(0)?, row.try_get(1)?)?;
            before.push(VariantState {
                constraints,
                version: row.try_get(2)?,
            });
        }
        // The last operation on a key decides its state.
        let after = match changeset
            .operations
            .iter()
            .rev()
            .find(|op| op.key == change.key)
            .map(|op| &op.action)
        {
            Some(Action::Put(resource)) => resource
                .variants
                .iter()
                .map(|v| VariantState {
                    constraints: v.constraints.clone(),
                    version: v.version.clone(),
                })
                .collect(),
            Some(Action::Delete) | None => Vec::new(),
        };
        previews.push(Preview {
            key: change.key.clone(),
            before,
            after,
        });
    }
    Ok(previews)
}

fn short_type(type_url: &str) -> &str {
    type_url.rsplit('.').next().unwrap_or(type_url)
}

/// Takes the writers' lock and returns the head revision.
async fn lock_head(tx: &mut Transaction<'_, Any>, backend: Backend) -> Result<u64, StoreError> {
    let sql = match backend {
        Backend::Postgres => "SELECT revision FROM vxds_head WHERE id = 1 FOR UPDATE",
        // A write as the transaction's first statement takes SQLite's write lock at once.
        Backend::Sqlite => {
            "UPDATE vxds_head SET revision = revision WHERE id = 1 RETURNING revision"
        }
    };
    let row = sqlx::query(sql).fetch_one(&mut **tx).await?;
    Ok(row.try_get::<i64, _>(0)? as u64)
}

/// What each of `keys` that exists looks like now, keyed by the caller's keys (a write of
/// 100,000 resources would otherwise hold a third copy of every key while it commits).
async fn load_current<'k>(
    tx: &mut Transaction<'_, Any>,
    keys: &[&'k ResourceKey],
) -> Result<HashMap<&'k ResourceKey, Current>, StoreError> {
    let wanted: HashSet<&'k ResourceKey> = keys.iter().copied().collect();
    let mut current = HashMap::new();
    bulk::load_many(
        tx,
        "vxds_resources",
        "version, created_revision, created_at_ms",
        keys,
        |key, row| {
            let Some(&key) = wanted.get(&key) else {
                return Ok(()); // not asked for (it cannot be: the query names each)
            };
            current.insert(
                key,
                Current {
                    version: row.try_get(1)?,
                    created_revision: row.try_get(2)?,
                    created_at_ms: row.try_get(3)?,
                },
            );
            Ok(())
        },
    )
    .await?;
    Ok(current)
}

async fn load_edges(
    tx: &mut Transaction<'_, Any>,
) -> Result<BTreeMap<String, BTreeSet<String>>, StoreError> {
    let rows = sqlx::query("SELECT parent, child FROM vxds_cluster_edges")
        .fetch_all(&mut **tx)
        .await?;
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for row in rows {
        edges
            .entry(row.try_get(0)?)
            .or_default()
            .insert(row.try_get(1)?);
    }
    Ok(edges)
}

async fn load_redirects(
    tx: &mut Transaction<'_, Any>,
) -> Result<BTreeMap<(String, String), BTreeSet<String>>, StoreError> {
    let rows = sqlx::query("SELECT type_url, name, target FROM vxds_redirects")
        .fetch_all(&mut **tx)
        .await?;
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for row in rows {
        edges
            .entry((row.try_get(0)?, row.try_get(1)?))
            .or_default()
            .insert(row.try_get(2)?);
    }
    Ok(edges)
}

/// Deletes `keys` (their variants go with them), their redirects and aggregate edges.
async fn delete_resources(
    tx: &mut Transaction<'_, Any>,
    keys: &[&ResourceKey],
) -> Result<(), StoreError> {
    bulk::delete_many(tx, "vxds_resources", keys, false).await?;
    bulk::delete_many(tx, "vxds_redirects", keys, false).await?;
    let clusters: Vec<&ResourceKey> = keys
        .iter()
        .copied()
        .filter(|key| key.type_url.ends_with(CLUSTER))
        .collect();
    bulk::delete_many(tx, "vxds_cluster_edges", &clusters, true).await
}

/// Ops a batch of puts covers: their previous variants are read, and their rows written, a
/// batch at a time.
const PUT_BATCH: usize = 1000;

/// Writes `puts` (each resource's row, variants, history, redirects and aggregate edges),
/// replacing what the ones in `current` had, with multi-row statements.
async fn put_resources(
    tx: &mut Transaction<'_, Any>,
    puts: &[(&ResourceKey, &ValidatedResource)],
    current: &HashMap<&ResourceKey, Current>,
    revision: u64,
    now: i64,
) -> Result<(), StoreError> {
    let mut resources = bulk::Rows::new(
        "INSERT INTO vxds_resources \
             (type_url, name, version, revision, created_revision, created_at_ms, updated_at_ms, shared)",
        8,
        "ON CONFLICT (type_url, name) DO UPDATE SET \
             version = excluded.version, revision = excluded.revision, \
             updated_at_ms = excluded.updated_at_ms, shared = excluded.shared",
    );
    let mut variants = bulk::Rows::new(
        "INSERT INTO vxds_variants \
             (type_url, name, position, variant_id, constraints, body, version, created_at_ms, updated_at_ms, ttl_ms)",
        10,
        "",
    );
    // Kept per revision, so that any past state can be read back and restored.
    let mut history = bulk::Rows::new(
        "INSERT INTO vxds_variant_history \
             (revision, type_url, name, position, variant_id, constraints, body, version, ttl_ms)",
        9,
        "",
    );
    let mut redirects =
        bulk::Rows::new("INSERT INTO vxds_redirects (type_url, name, target)", 3, "");
    let mut edges = bulk::Rows::new("INSERT INTO vxds_cluster_edges (parent, child)", 2, "");
    use bulk::Value::{Bytes, Int, OptInt, Text};
    for batch in puts.chunks(PUT_BATCH) {
        // Variants that keep their identity keep their creation time (and, unchanged, their
        // update time): key -> id -> (created, updated, version).
        let existing: Vec<&ResourceKey> = batch
            .iter()
            .map(|(key, _)| *key)
            .filter(|key| current.contains_key(*key))
            .collect();
        let mut previous: HashMap<ResourceKey, HashMap<String, (i64, i64, String)>> =
            HashMap::new();
        bulk::load_many(
            tx,
            "vxds_variants",
            "variant_id, created_at_ms, updated_at_ms, version",
            &existing,
            |key, row| {
                previous.entry(key).or_default().insert(
                    row.try_get(1)?,
                    (row.try_get(2)?, row.try_get(3)?, row.try_get(4)?),
                );
                Ok(())
            },
        )
        .await?;
        // What the existing ones had goes; their resource rows are updated in place.
        bulk::delete_many(tx, "vxds_variants", &existing, false).await?;
        bulk::delete_many(tx, "vxds_redirects", &existing, false).await?;
        let clusters: Vec<&ResourceKey> = existing
            .iter()
            .copied()
            .filter(|key| key.type_url.ends_with(CLUSTER))
            .collect();
        bulk::delete_many(tx, "vxds_cluster_edges", &clusters, true).await?;
        for (key, resource) in batch {
            let (created_revision, created_at) =
                current.get(*key).map_or((revision as i64, now), |c| {
                    (c.created_revision, c.created_at_ms)
                });
            resources
                .push(
                    tx,
                    [
                        Text(key.type_url.to_string()),
                        Text(key.name.clone()),
                        Text(resource.version.clone()),
                        Int(revision as i64),
                        Int(created_revision),
                        Int(created_at),
                        Int(now),
                        Int(i64::from(resource.shared)),
                    ],
                )
                .await?;
        }
        resources.flush(tx).await?;
        for (key, resource) in batch {
            let previous = previous.get(*key);
            for (position, variant) in resource.variants.iter().enumerate() {
                let id = variant.constraints.id().to_string();
                let (created_at_ms, updated_at_ms) = match previous.and_then(|p| p.get(&id)) {
                    Some((created_at, updated_at, version)) if *version == variant.version => {
                        (*created_at, *updated_at)
                    }
                    Some((created_at, _, _)) => (*created_at, now),
                    None => (now, now),
                };
                let constraints = variant.constraints.to_string();
                // Bounded by validation (at most a day), so it fits.
                let ttl = variant.ttl.map(|t| t.as_millis() as i64);
                variants
                    .push(
                        tx,
                        [
                            Text(key.type_url.to_string()),
                            Text(key.name.clone()),
                            Int(position as i64),
                            Text(id.clone()),
                            Text(constraints.clone()),
                            Bytes(variant.body.clone()),
                            Text(variant.version.clone()),
                            Int(created_at_ms),
                            Int(updated_at_ms),
                            OptInt(ttl),
                        ],
                    )
                    .await?;
                history
                    .push(
                        tx,
                        [
                            Int(revision as i64),
                            Text(key.type_url.to_string()),
                            Text(key.name.clone()),
                            Int(position as i64),
                            Text(id),
                            Text(constraints),
                            Bytes(variant.body.clone()),
                            Text(variant.version.clone()),
                            OptInt(ttl),
                        ],
                    )
                    .await?;
            }
            for target in &resource.redirects {
                redirects
                    .push(
                        tx,
                        [
                            Text(key.type_url.to_string()),
                            Text(key.name.clone()),
                            Text(target.clone()),
                        ],
                    )
                    .await?;
            }
            if key.type_url.ends_with(CLUSTER) {
                for child in resource.aggregate_children.iter().flatten() {
                    edges
                        .push(tx, [Text(key.name.clone()), Text(child.clone())])
                        .await?;
                }
            }
        }
        variants.flush(tx).await?;
        history.flush(tx).await?;
        redirects.flush(tx).await?;
        edges.flush(tx).await?;
    }
    Ok(())
}

/// A random id for a new revision: another commit with the same revision number (after a
/// failover to a lagging standby, or a restore) gets another id. Never 0, which revisions from
/// before ids were recorded read.
fn new_commit_id(revision: u64, now_ms: i64) -> i64 {
    use std::hash::{BuildHasher, Hasher};
    // The standard library's per-process random keys (each `RandomState` differs), mixed
    // with the time and the revision: random enough to tell two histories apart.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(revision);
    hasher.write_i64(now_ms);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    hasher.write_u32(nanos);
    match hasher.finish() as i64 {
        0 => 1,
        id => id,
    }
}

async fn insert_revision(
    tx: &mut Transaction<'_, Any>,
    revision: u64,
    now: i64,
    author: Option<&str>,
    message: Option<&str>,
    changes: &[Change],
    shared: &BTreeSet<&ResourceKey>,
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO vxds_revisions (revision, created_at_ms, author, message, commit_id) VALUES ($1, $2, $3, $4, $5)")
        .bind(revision as i64)
        .bind(now)
        .bind(author.map(str::to_owned))
        .bind(message.map(str::to_owned))
        .bind(new_commit_id(revision, now))
        .execute(&mut **tx)
        .await?;
    let mut rows = bulk::Rows::new(
        "INSERT INTO vxds_revision_changes (revision, type_url, name, change, version, shared)",
        6,
        "",
    );
    for change in changes {
        use bulk::Value::{Int, OptInt, OptText, Text};
        rows.push(
            tx,
            [
                Int(revision as i64),
                Text(change.key.type_url.to_string()),
                Text(change.key.name.clone()),
                Text(change.change.as_str().to_owned()),
                OptText(change.version.clone()),
                OptInt(
                    (change.change != ChangeKind::Deleted)
                        .then(|| i64::from(shared.contains(&change.key))),
                ),
            ],
        )
        .await?;
    }
    rows.flush(tx).await
}
