//! Applying a changeset: all or nothing, as one revision.
//!
//! 1. Every stateless rule runs first, off the async runtime ([`changeset::check`]).
//! 2. One transaction takes the head row's lock, which serialises writers: what it reads next
//!    is the latest committed state, and nobody commits until it is done.
//! 3. Under the lock: expected revision and each operation's precondition (expected versions,
//!    `must_not_exist`: conflicts, which come first), deletes of missing resources, and the
//!    aggregate-cluster graph across the whole store after the changeset, on the operations
//!    that passed step 1. All errors of steps 1 and 3 are
//!    reported together.
//! 4. Operations that change nothing are dropped; if nothing is left, no revision is made.
//! 5. The writes, the revision and its change list, the head; with Postgres a NOTIFY that is
//!    delivered at commit. Then the head watch moves.
//!
//! Dry runs do everything but commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::{Any, Row, Transaction};
use vxds_envoy::changeset::{
    self, Action, ChangesetRequest, Checked, Invalid, Problem, ResourceKey, ValidatedResource,
};
use vxds_envoy::pointer::Pointer;
use vxds_envoy::resource::CLUSTER;

use super::{Backend, Store, notify};
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
        let written = self.write(checked, author).await;
        if let Err(ApplyError::Store(e)) = &written {
            self.inner.health.observe(e);
        }
        let (applied, committed) = written?;
        if committed {
            self.publish_head(applied.revision);
        }
        Ok(applied)
    }

    /// Everything under the lock. `checked` carries the stateless errors too: the rules that
    /// need state still run on the operations that passed, so every error is reported at once.
    async fn write(
        &self,
        checked: Checked,
        author: Option<String>,
    ) -> Result<(Applied, bool), ApplyError> {
        let Checked {
            changeset,
            errors: stateless_errors,
            warnings,
        } = checked;
        let changeset = &changeset;
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

        if let Some(expected) = changeset.expected_revision
            && expected != head
        {
            return Err(ApplyError::Conflict(Conflict {
                pointer: Pointer::root().push("expected_revision"),
                operation: None,
                message: format!("the store is at revision {head}, not {expected}"),
            }));
        }

        let mut current: HashMap<ResourceKey, Current> = HashMap::new();
        for op in &changeset.operations {
            if let Some(found) = load_current(&mut tx, &op.key).await? {
                current.insert(op.key.clone(), found);
            }
        }

        let mut errors = stateless_errors;
        let mut changes = Vec::new();
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

        let cluster_updates = changeset.aggregate_updates();
        if !cluster_updates.is_empty() {
            let mut edges = load_edges(&mut tx).await?;
            for (cluster, children) in &cluster_updates {
                match children {
                    Some(children) => edges.insert(cluster.clone(), children.clone()),
                    None => edges.remove(cluster),
                };
            }
            errors.extend(changeset.graph_problems(&edges));
        }
        let redirect_updates = changeset.redirect_updates();
        if redirect_updates.values().any(|targets| !targets.is_empty()) {
            let mut edges = load_redirects(&mut tx).await?;
            for (key, targets) in redirect_updates {
                if targets.is_empty() {
                    edges.remove(&key);
                } else {
                    edges.insert(key, targets);
                }
            }
            errors.extend(changeset.redirect_problems(&edges));
        }
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
        for op in changeset
            .operations
            .iter()
            .filter(|op| changed.contains(&op.key))
        {
            match &op.action {
                Action::Delete => delete_resource(&mut tx, &op.key).await?,
                Action::Put(resource) => {
                    put_resource(
                        &mut tx,
                        &op.key,
                        resource,
                        current.get(&op.key),
                        revision,
                        now,
                    )
                    .await?
                }
            }
        }
        insert_revision(
            &mut tx,
            revision,
            now,
            author.as_deref(),
            changeset.message.as_deref(),
            &changes,
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
        .bind(&change.key.type_url)
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

async fn load_current(
    tx: &mut Transaction<'_, Any>,
    key: &ResourceKey,
) -> Result<Option<Current>, StoreError> {
    let row = sqlx::query(
        "SELECT version, created_revision, created_at_ms FROM vxds_resources WHERE type_url = $1 AND name = $2",
    )
    .bind(&key.type_url)
    .bind(&key.name)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(|row| {
        Ok(Current {
            version: row.try_get(0)?,
            created_revision: row.try_get(1)?,
            created_at_ms: row.try_get(2)?,
        })
    })
    .transpose()
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

async fn delete_redirects(
    tx: &mut Transaction<'_, Any>,
    key: &ResourceKey,
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM vxds_redirects WHERE type_url = $1 AND name = $2")
        .bind(&key.type_url)
        .bind(&key.name)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn delete_resource(
    tx: &mut Transaction<'_, Any>,
    key: &ResourceKey,
) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM vxds_resources WHERE type_url = $1 AND name = $2")
        .bind(&key.type_url)
        .bind(&key.name)
        .execute(&mut **tx)
        .await?;
    delete_redirects(tx, key).await?;
    if key.type_url.ends_with(CLUSTER) {
        delete_edges(tx, &key.name).await?;
    }
    Ok(())
}

async fn delete_edges(tx: &mut Transaction<'_, Any>, cluster: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM vxds_cluster_edges WHERE parent = $1")
        .bind(cluster)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn put_resource(
    tx: &mut Transaction<'_, Any>,
    key: &ResourceKey,
    resource: &ValidatedResource,
    current: Option<&Current>,
    revision: u64,
    now: i64,
) -> Result<(), StoreError> {
    // Variants that keep their identity keep their creation time (and, unchanged, their update
    // time): id -> (created, updated, version).
    let mut previous: HashMap<String, (i64, i64, String)> = HashMap::new();
    if current.is_some() {
        let rows = sqlx::query(
            "SELECT variant_id, created_at_ms, updated_at_ms, version FROM vxds_variants \
             WHERE type_url = $1 AND name = $2",
        )
        .bind(&key.type_url)
        .bind(&key.name)
        .fetch_all(&mut **tx)
        .await?;
        for row in rows {
            previous.insert(
                row.try_get(0)?,
                (row.try_get(1)?, row.try_get(2)?, row.try_get(3)?),
            );
        }
        sqlx::query("DELETE FROM vxds_variants WHERE type_url = $1 AND name = $2")
            .bind(&key.type_url)
            .bind(&key.name)
            .execute(&mut **tx)
            .await?;
    }
    let (created_revision, created_at) = current.map_or((revision as i64, now), |c| {
        (c.created_revision, c.created_at_ms)
    });
    sqlx::query(
        "INSERT INTO vxds_resources \
             (type_url, name, version, revision, created_revision, created_at_ms, updated_at_ms, shared) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (type_url, name) DO UPDATE SET \
             version = excluded.version, revision = excluded.revision, updated_at_ms = excluded.updated_at_ms, \
             shared = excluded.shared",
    )
    .bind(&key.type_url)
    .bind(&key.name)
    .bind(&resource.version)
    .bind(revision as i64)
    .bind(created_revision)
    .bind(created_at)
    .bind(now)
    .bind(i64::from(resource.shared))
    .execute(&mut **tx)
    .await?;
    for (position, variant) in resource.variants.iter().enumerate() {
        let id = variant.constraints.id().to_string();
        let (created_at_ms, updated_at_ms) = match previous.get(&id) {
            Some((created_at, updated_at, version)) if *version == variant.version => {
                (*created_at, *updated_at)
            }
            Some((created_at, _, _)) => (*created_at, now),
            None => (now, now),
        };
        sqlx::query(
            "INSERT INTO vxds_variants \
                 (type_url, name, position, variant_id, constraints, body, version, created_at_ms, updated_at_ms, ttl_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&key.type_url)
        .bind(&key.name)
        .bind(position as i64)
        .bind(&id)
        .bind(variant.constraints.to_string())
        .bind(variant.body.clone())
        .bind(&variant.version)
        .bind(created_at_ms)
        .bind(updated_at_ms)
        // Bounded by validation (at most a day), so it fits.
        .bind(variant.ttl.map(|t| t.as_millis() as i64))
        .execute(&mut **tx)
        .await?;
        // Kept per revision, so that any past state can be read back and restored.
        sqlx::query(
            "INSERT INTO vxds_variant_history \
                 (revision, type_url, name, position, variant_id, constraints, body, version, ttl_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(revision as i64)
        .bind(&key.type_url)
        .bind(&key.name)
        .bind(position as i64)
        .bind(&id)
        .bind(variant.constraints.to_string())
        .bind(variant.body.clone())
        .bind(&variant.version)
        .bind(variant.ttl.map(|t| t.as_millis() as i64))
        .execute(&mut **tx)
        .await?;
    }
    delete_redirects(tx, key).await?;
    for target in &resource.redirects {
        sqlx::query("INSERT INTO vxds_redirects (type_url, name, target) VALUES ($1, $2, $3)")
            .bind(&key.type_url)
            .bind(&key.name)
            .bind(target)
            .execute(&mut **tx)
            .await?;
    }
    if key.type_url.ends_with(CLUSTER) {
        delete_edges(tx, &key.name).await?;
        for child in resource.aggregate_children.iter().flatten() {
            sqlx::query("INSERT INTO vxds_cluster_edges (parent, child) VALUES ($1, $2)")
                .bind(&key.name)
                .bind(child)
                .execute(&mut **tx)
                .await?;
        }
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
) -> Result<(), StoreError> {
    sqlx::query("INSERT INTO vxds_revisions (revision, created_at_ms, author, message, commit_id) VALUES ($1, $2, $3, $4, $5)")
        .bind(revision as i64)
        .bind(now)
        .bind(author.map(str::to_owned))
        .bind(message.map(str::to_owned))
        .bind(new_commit_id(revision, now))
        .execute(&mut **tx)
        .await?;
    for change in changes {
        sqlx::query(
            "INSERT INTO vxds_revision_changes (revision, type_url, name, change, version) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(revision as i64)
        .bind(&change.key.type_url)
        .bind(&change.key.name)
        .bind(change.change.as_str())
        .bind(change.version.clone())
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
