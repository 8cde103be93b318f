//! Reading the store: resources, listings, history, and the change feed the index follows.
//!
//! [`Store::changes_since`] reads inside one snapshot (Postgres REPEATABLE READ, SQLite's
//! read transaction), so the state it returns is exactly one revision's: the index never holds a
//! mix of two.

use std::collections::{BTreeMap, HashMap};

use futures::TryStreamExt;
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};
use vxds_core::{CanonicalConstraints, Constraints, ConstraintsId, Limits};
use vxds_envoy::changeset::ResourceKey;

use super::{Backend, Store};
use crate::error::StoreError;
use crate::model::{
    Change, ChangeBatch, ChangeKind, Followed, ListPage, ListQuery, ResourceSummary, Revision,
    RevisionChangeList, StoredResource, StoredVariant,
};

/// Stored constraints were validated on write; reading them back must not fail because a
/// later release tightened the limits.
const STORED_LIMITS: Limits = Limits {
    max_depth: 256,
    max_nodes: 1 << 16,
    max_key_len: 1 << 16,
    max_value_len: 1 << 20,
};

const RESOURCE_COLUMNS: &str = "r.type_url, r.name, r.version, r.revision, r.created_revision, r.created_at_ms, r.updated_at_ms, r.shared";
const VARIANT_COLUMNS: &str = "v.type_url, v.name, v.variant_id, v.constraints, v.body, v.version, v.created_at_ms, v.updated_at_ms, v.ttl_ms";
/// A resource's columns, then its variant's (NULL for a resource without any), one row per
/// variant: the change feed reads each resource whole as it comes.
const RESOURCE_VARIANT_COLUMNS: &str = "r.type_url, r.name, r.version, r.revision, r.created_revision, r.created_at_ms, r.updated_at_ms, r.shared, \
     v.variant_id, v.constraints, v.body, v.version, v.created_at_ms, v.updated_at_ms, v.ttl_ms";

/// Where the change feed puts the resources it reads, one at a time, so that a reader that
/// builds something from them (the index) never holds them all as read.
pub trait ResourceSink: Send {
    /// Called before the first resource of every attempt: `complete` says that the resources
    /// that follow are the whole state, not what changed. Whatever an earlier attempt put is
    /// to be forgotten.
    fn begin(&mut self, complete: bool);
    fn put(&mut self, resource: StoredResource);
}

/// Collects them, for [`ChangeBatch::resources`].
impl ResourceSink for Vec<StoredResource> {
    fn begin(&mut self, _complete: bool) {
        self.clear();
    }
    fn put(&mut self, resource: StoredResource) {
        self.push(resource);
    }
}

impl Store {
    /// One resource with its variants.
    pub async fn get(&self, key: &ResourceKey) -> Result<Option<StoredResource>, StoreError> {
        self.guarded(self.fetch_resource(key)).await
    }

    /// A page of resources in (type, name) order.
    pub async fn list(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        self.guarded(self.fetch_page(query)).await
    }

    /// One revision with what it changed; [`StoreError::HistoryPruned`] if the retention
    /// pruned it.
    pub async fn revision(&self, revision: u64) -> Result<Option<Revision>, StoreError> {
        let (pruned_through, mut found) = self
            .guarded(self.fetch_revisions(revision.saturating_sub(1), revision, 1))
            .await?;
        if revision >= 1 && revision <= pruned_through {
            return Err(StoreError::HistoryPruned {
                revision,
                oldest_kept: pruned_through + 1,
            });
        }
        Ok(found.pop())
    }

    /// Up to `limit` revisions after `after`, oldest first; pruned revisions are not listed
    /// (the first may come after a gap: [`Store::oldest_kept_revision`]).
    pub async fn revisions(&self, after: u64, limit: usize) -> Result<Vec<Revision>, StoreError> {
        Ok(self
            .guarded(self.fetch_revisions(after, i64::MAX as u64, limit.clamp(1, 1000)))
            .await?
            .1)
    }

    /// Everything committed after `revision`, from one snapshot. For 0, or a revision the
    /// retention has since pruned, the batch is `complete`: every resource, the whole state.
    pub async fn changes_since(&self, revision: u64) -> Result<ChangeBatch, StoreError> {
        let mut resources = Vec::new();
        match self
            .guarded(self.fetch_changes(revision, false, None, &mut resources))
            .await?
        {
            Followed::Changes(batch) => Ok(ChangeBatch { resources, ..batch }),
            Followed::Diverged { .. } => Err(StoreError::Corrupt(
                "a change feed read without a commit id diverged".into(),
            )),
        }
    }

    /// [`Store::changes_since`] for a reader that holds `revision` as commit `commit_id` left
    /// it: [`Followed::Diverged`] if the database no longer has that commit (its head went
    /// below it, or the number was committed again with other content after a failover or a
    /// restore). Checked in the same snapshot as the changes are read.
    pub async fn changes_after(
        &self,
        revision: u64,
        commit_id: i64,
    ) -> Result<Followed, StoreError> {
        let mut resources = Vec::new();
        Ok(
            match self
                .guarded(self.fetch_changes(revision, false, Some(commit_id), &mut resources))
                .await?
            {
                Followed::Changes(batch) => {
                    self.publish_head(batch.revision);
                    Followed::Changes(ChangeBatch { resources, ..batch })
                }
                diverged => diverged,
            },
        )
    }

    /// [`Store::changes_after`] with the resources given to `sink` as they are read rather
    /// than collected: the batch returned has none.
    pub async fn changes_after_into(
        &self,
        revision: u64,
        commit_id: i64,
        sink: &mut dyn ResourceSink,
    ) -> Result<Followed, StoreError> {
        let followed = self
            .guarded(self.fetch_changes(revision, false, Some(commit_id), sink))
            .await?;
        // A head read with the changes is one this process has seen: the index is never
        // ahead of `watch_head` (a check may read a commit before the head poll does).
        if let Followed::Changes(batch) = &followed {
            self.publish_head(batch.revision);
        }
        Ok(followed)
    }

    /// The head's state: every resource, and the head revision's change list — what the index
    /// starts from. Its cost is the state's size, not the history's length.
    pub async fn current_state(&self) -> Result<ChangeBatch, StoreError> {
        let mut resources = Vec::new();
        let batch = self.current_state_into(&mut resources).await?;
        Ok(ChangeBatch { resources, ..batch })
    }

    /// [`Store::current_state`] with the resources given to `sink` as they are read: the
    /// batch returned has none.
    pub async fn current_state_into(
        &self,
        sink: &mut dyn ResourceSink,
    ) -> Result<ChangeBatch, StoreError> {
        match self
            .guarded(self.fetch_changes(0, true, None, sink))
            .await?
        {
            Followed::Changes(batch) => Ok(batch),
            Followed::Diverged { .. } => Err(StoreError::Corrupt(
                "reading the whole state diverged".into(),
            )),
        }
    }

    /// Every resource (of one type, if given) with its variants, in the order `list` pages
    /// through them, and the revision they are at: one snapshot, for `GET /v1/export`.
    pub async fn export(
        &self,
        type_url: Option<&str>,
    ) -> Result<(u64, Vec<StoredResource>), StoreError> {
        self.guarded(self.fetch_export(type_url.unwrap_or_default()))
            .await
    }

    async fn fetch_export(&self, type_url: &str) -> Result<(u64, Vec<StoredResource>), StoreError> {
        let mut tx = self.begin_snapshot().await?;
        let head = sqlx::query("SELECT revision FROM vxds_head WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?
            .try_get::<i64, _>(0)? as u64;
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {RESOURCE_COLUMNS} FROM vxds_resources r \
             WHERE ($1 = '' OR r.type_url = $1) ORDER BY r.type_url, r.name"
        ));
        let mut resources = Vec::new();
        let mut at: HashMap<ResourceKey, usize> = HashMap::new();
        let mut rows = sqlx::query(sql).bind(type_url).fetch(&mut *tx);
        while let Some(row) = rows.try_next().await? {
            let resource = resource_from_row(&row)?;
            at.insert(resource.key.clone(), resources.len());
            resources.push(resource);
        }
        drop(rows);
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {VARIANT_COLUMNS} FROM vxds_variants v \
             WHERE ($1 = '' OR v.type_url = $1) ORDER BY v.type_url, v.name, v.position"
        ));
        let mut rows = sqlx::query(sql).bind(type_url).fetch(&mut *tx);
        while let Some(row) = rows.try_next().await? {
            let key = ResourceKey {
                type_url: row.try_get::<String, _>(0)?.into(),
                name: row.try_get(1)?,
            };
            if let Some(&i) = at.get(&key) {
                resources[i].variants.push(variant_from_row(&row)?);
            }
        }
        drop(rows);
        tx.commit().await?;
        Ok((head, resources))
    }

    async fn fetch_resource(
        &self,
        key: &ResourceKey,
    ) -> Result<Option<StoredResource>, StoreError> {
        let mut tx = self.begin_snapshot().await?;
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {RESOURCE_COLUMNS} FROM vxds_resources r WHERE r.type_url = $1 AND r.name = $2"
        ));
        let Some(row) = sqlx::query(sql)
            .bind(key.type_url.as_str())
            .bind(&key.name)
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {VARIANT_COLUMNS} FROM vxds_variants v WHERE v.type_url = $1 AND v.name = $2 ORDER BY v.position"
        ));
        let variants = sqlx::query(sql)
            .bind(key.type_url.as_str())
            .bind(&key.name)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        let mut resource = resource_from_row(&row)?;
        resource.variants = variants
            .iter()
            .map(variant_from_row)
            .collect::<Result<_, _>>()?;
        Ok(Some(resource))
    }

    async fn fetch_page(&self, query: &ListQuery) -> Result<ListPage, StoreError> {
        let limit = query.limit.clamp(1, 1000);
        let (after_type, after_name) = query
            .after
            .as_ref()
            .map_or((String::new(), String::new()), |k| {
                (k.type_url.to_string(), k.name.clone())
            });
        let rows = sqlx::query(
            "SELECT r.type_url, r.name, r.version, r.revision, r.updated_at_ms, \
                 (SELECT COUNT(*) FROM vxds_variants v WHERE v.type_url = r.type_url AND v.name = r.name) \
             FROM vxds_resources r \
             WHERE ($1 = '' OR r.type_url = $1) \
               AND substr(r.name, 1, length($2)) = $2 \
               AND (r.type_url > $3 OR (r.type_url = $3 AND r.name > $4)) \
             ORDER BY r.type_url, r.name \
             LIMIT $5",
        )
        .bind(query.type_url.clone().unwrap_or_default())
        .bind(query.prefix.clone().unwrap_or_default())
        .bind(after_type)
        .bind(after_name)
        .bind(limit as i64 + 1)
        .fetch_all(self.pool())
        .await?;
        let mut resources = rows
            .iter()
            .map(|row| {
                Ok(ResourceSummary {
                    key: ResourceKey {
                        type_url: row.try_get::<String, _>(0)?.into(),
                        name: row.try_get(1)?,
                    },
                    version: row.try_get(2)?,
                    revision: row.try_get::<i64, _>(3)? as u64,
                    updated_at_ms: row.try_get(4)?,
                    variant_count: row.try_get::<i64, _>(5)? as u64,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next = (resources.len() > limit).then(|| {
            resources.truncate(limit);
            resources[limit - 1].key.clone()
        });
        Ok(ListPage { resources, next })
    }

    async fn fetch_revisions(
        &self,
        after: u64,
        up_to: u64,
        limit: usize,
    ) -> Result<(u64, Vec<Revision>), StoreError> {
        // Revisions are BIGINTs: nothing lies beyond i64::MAX.
        let (after, up_to) = (after.min(i64::MAX as u64), up_to.min(i64::MAX as u64));
        let mut tx = self.begin_snapshot().await?;
        let pruned_through = pruned_through(&mut tx).await?;
        // Below the pruned revision only rows that hold a resource's starting state are kept:
        // they are not revisions any more.
        let after = after.max(pruned_through);
        let rows = sqlx::query(
            "SELECT revision, created_at_ms, author, message, commit_id FROM vxds_revisions \
             WHERE revision > $1 AND revision <= $2 ORDER BY revision LIMIT $3",
        )
        .bind(after as i64)
        .bind(up_to as i64)
        .bind(limit as i64)
        .fetch_all(&mut *tx)
        .await?;
        let mut revisions = rows
            .iter()
            .map(|row| {
                Ok(Revision {
                    revision: row.try_get::<i64, _>(0)? as u64,
                    created_at_ms: row.try_get(1)?,
                    author: row.try_get(2)?,
                    message: row.try_get(3)?,
                    commit_id: row.try_get(4)?,
                    changes: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        if let (Some(first), Some(last)) = (revisions.first(), revisions.last()) {
            let rows = sqlx::query(
                "SELECT revision, type_url, name, change, version FROM vxds_revision_changes \
                 WHERE revision >= $1 AND revision <= $2 ORDER BY revision, type_url, name",
            )
            .bind(first.revision as i64)
            .bind(last.revision as i64)
            .fetch_all(&mut *tx)
            .await?;
            let mut by_revision: BTreeMap<u64, Vec<Change>> = BTreeMap::new();
            for row in rows {
                let kind: String = row.try_get(3)?;
                by_revision
                    .entry(row.try_get::<i64, _>(0)? as u64)
                    .or_default()
                    .push(Change {
                        key: ResourceKey {
                            type_url: row.try_get::<String, _>(1)?.into(),
                            name: row.try_get(2)?,
                        },
                        change: ChangeKind::parse(&kind).ok_or_else(|| {
                            StoreError::Corrupt(format!("unknown change kind `{kind}`"))
                        })?,
                        version: row.try_get(4)?,
                    });
            }
            for revision in &mut revisions {
                revision.changes = by_revision.remove(&revision.revision).unwrap_or_default();
            }
        }
        tx.commit().await?;
        Ok((pruned_through, revisions))
    }

    /// What changed after `revision`; with `state_only`, the whole state and only the head
    /// revision's change list. With `commit_id`, first checks that `revision` is still that
    /// commit. The resources go to `sink`, not into the batch.
    async fn fetch_changes(
        &self,
        revision: u64,
        state_only: bool,
        commit_id: Option<i64>,
        sink: &mut dyn ResourceSink,
    ) -> Result<Followed, StoreError> {
        let (mut revision, mut state_only) = (revision.min(i64::MAX as u64), state_only);
        let mut tx = self.begin_snapshot().await?;
        let head = sqlx::query(
            "SELECT h.revision, COALESCE(r.commit_id, 0) FROM vxds_head h \
             LEFT JOIN vxds_revisions r ON r.revision = h.revision WHERE h.id = 1",
        )
        .fetch_one(&mut *tx)
        .await?;
        let (head, head_commit) = (
            head.try_get::<i64, _>(0)? as u64,
            head.try_get::<i64, _>(1)?,
        );
        let pruned = pruned_through(&mut tx).await?;
        // Set when the reader's commit cannot be checked: it gets the whole state.
        let mut unchecked = false;
        if let Some(expected) = commit_id
            && revision > 0
            && !state_only
        {
            if head < revision {
                tx.commit().await?;
                return Ok(Followed::Diverged { head });
            }
            // Revisions before the newest pruned one cannot be checked; the whole state is read
            // below anyway. The newest pruned one still has its row while a kept revision
            // starts from a change it made; once its row is gone, it cannot be checked either,
            // and only the changes after it would leave a diverged reader's state standing.
            if revision >= pruned {
                let found = sqlx::query("SELECT commit_id FROM vxds_revisions WHERE revision = $1")
                    .bind(revision as i64)
                    .fetch_optional(&mut *tx)
                    .await?
                    .map(|row| row.try_get::<i64, _>(0))
                    .transpose()?;
                match found {
                    Some(found) if found == expected => {}
                    None if revision == pruned => unchecked = true,
                    _ => {
                        tx.commit().await?;
                        return Ok(Followed::Diverged { head });
                    }
                }
            }
        }
        if head <= revision && !state_only {
            tx.commit().await?;
            sink.begin(false);
            return Ok(Followed::Changes(ChangeBatch {
                revision: head,
                commit_id: head_commit,
                revisions: Vec::new(),
                resources: Vec::new(),
                deleted: Vec::new(),
                complete: false,
            }));
        }
        // Deletions in pruned revisions are gone: from before them only the whole state says
        // what is.
        if revision < pruned || unchecked {
            (revision, state_only) = (0, true);
        }
        let complete = revision == 0 || state_only;
        // Rows are taken one at a time as they arrive (here and below), never all at once: after a
        // large changeset they would hold the whole change a second time.
        let mut revisions: Vec<RevisionChangeList> = Vec::new();
        let (condition, from) = if state_only {
            ("c.revision = $1", head)
        } else {
            ("c.revision > $1", revision)
        };
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT c.revision, r.created_at_ms, c.type_url, c.name, r.author, r.message, \
             r.commit_id FROM vxds_revision_changes c JOIN vxds_revisions r ON r.revision = c.revision \
             WHERE {condition} ORDER BY c.revision, c.type_url, c.name"
        ));
        let mut rows = sqlx::query(sql).bind(from as i64).fetch(&mut *tx);
        while let Some(row) = rows.try_next().await? {
            let n = row.try_get::<i64, _>(0)? as u64;
            let key = ResourceKey {
                type_url: row.try_get::<String, _>(2)?.into(),
                name: row.try_get(3)?,
            };
            match revisions.last_mut() {
                Some(last) if last.revision == n => last.changed.push(key),
                _ => revisions.push(RevisionChangeList {
                    revision: n,
                    commit_id: row.try_get(6)?,
                    committed_at_ms: row.try_get(1)?,
                    changed: vec![key],
                    author: row.try_get(4)?,
                    message: row.try_get(5)?,
                }),
            }
        }
        drop(rows);
        // Everything at 0; otherwise the resources the revisions touched.
        let filter = if complete {
            "$1 = $1"
        } else {
            "EXISTS (SELECT 1 FROM vxds_revision_changes c \
                     WHERE c.revision > $1 AND c.type_url = r.type_url AND c.name = r.name)"
        };
        let sql = sqlx::AssertSqlSafe(format!(
            "SELECT {RESOURCE_VARIANT_COLUMNS} FROM vxds_resources r LEFT JOIN vxds_variants v \
                 ON v.type_url = r.type_url AND v.name = r.name \
             WHERE {filter} ORDER BY r.type_url, r.name, v.position"
        ));
        // A touched key that no resource row matches was deleted. Marked, not copied.
        let mut touched: HashMap<&ResourceKey, bool> = revisions
            .iter()
            .flat_map(|r| &r.changed)
            .map(|k| (k, false))
            .collect();
        sink.begin(complete);
        // Each resource is whole once the rows move on to the next: its variants are
        // consecutive (ordered by key, then position).
        let mut reading: Option<StoredResource> = None;
        let mut rows = sqlx::query(sql).bind(revision as i64).fetch(&mut *tx);
        while let Some(row) = rows.try_next().await? {
            let (type_url, name): (&str, &str) = (row.try_get(0)?, row.try_get(1)?);
            let same = reading
                .as_ref()
                .is_some_and(|r| r.key.type_url == type_url && r.key.name == name);
            if !same {
                if let Some(done) = reading.take() {
                    if let Some(seen) = touched.get_mut(&done.key) {
                        *seen = true;
                    }
                    sink.put(done);
                }
                reading = Some(resource_from_row(&row)?);
            }
            if let (Some(resource), Some(variant)) = (reading.as_mut(), variant_at(&row, 8)?) {
                resource.variants.push(variant);
            }
        }
        drop(rows);
        if let Some(done) = reading.take() {
            if let Some(seen) = touched.get_mut(&done.key) {
                *seen = true;
            }
            sink.put(done);
        }
        tx.commit().await?;
        let mut deleted: Vec<ResourceKey> = touched
            .into_iter()
            .filter(|(_, seen)| !seen)
            .map(|(k, _)| k.clone())
            .collect();
        deleted.sort_unstable();
        Ok(Followed::Changes(ChangeBatch {
            revision: head,
            commit_id: head_commit,
            revisions,
            resources: Vec::new(),
            deleted,
            complete,
        }))
    }

    /// A read transaction that sees one consistent state.
    pub(super) async fn begin_snapshot(&self) -> Result<Transaction<'static, Any>, StoreError> {
        let mut tx = self.pool().begin().await?;
        if self.backend() == Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        Ok(tx)
    }
}

/// The newest revision the retention pruned (0: none), in the reader's snapshot.
pub(super) async fn pruned_through(tx: &mut Transaction<'_, Any>) -> Result<u64, StoreError> {
    let row = sqlx::query("SELECT pruned_through FROM vxds_retention WHERE id = 1")
        .fetch_one(&mut **tx)
        .await?;
    Ok(row.try_get::<i64, _>(0)? as u64)
}

fn resource_from_row(row: &AnyRow) -> Result<StoredResource, StoreError> {
    Ok(StoredResource {
        key: ResourceKey {
            type_url: row.try_get::<String, _>(0)?.into(),
            name: row.try_get(1)?,
        },
        version: row.try_get(2)?,
        revision: row.try_get::<i64, _>(3)? as u64,
        created_revision: row.try_get::<i64, _>(4)? as u64,
        created_at_ms: row.try_get(5)?,
        updated_at_ms: row.try_get(6)?,
        shared: row.try_get::<i64, _>(7)? != 0,
        variants: Vec::new(),
    })
}

fn variant_from_row(row: &AnyRow) -> Result<StoredVariant, StoreError> {
    let (id, constraints) = stored_constraints(row.try_get(2)?, row.try_get(3)?)?;
    Ok(StoredVariant {
        id,
        constraints,
        body: row.try_get(4)?,
        version: row.try_get(5)?,
        created_at_ms: row.try_get(6)?,
        updated_at_ms: row.try_get(7)?,
        ttl: ttl_from_ms(row.try_get(8)?)?,
    })
}

/// The variant whose columns start at `at` (id, constraints, body, version, created,
/// updated, TTL), or `None` where an outer join found none.
fn variant_at(row: &AnyRow, at: usize) -> Result<Option<StoredVariant>, StoreError> {
    let Some(id) = row.try_get::<Option<String>, _>(at)? else {
        return Ok(None);
    };
    let (id, constraints) = stored_constraints(id, row.try_get(at + 1)?)?;
    Ok(Some(StoredVariant {
        id,
        constraints,
        body: row.try_get(at + 2)?,
        version: row.try_get(at + 3)?,
        created_at_ms: row.try_get(at + 4)?,
        updated_at_ms: row.try_get(at + 5)?,
        ttl: ttl_from_ms(row.try_get(at + 6)?)?,
    }))
}

/// A stored variant id and constraint text, read back and checked against each other.
pub(super) fn stored_constraints(
    id: String,
    text: String,
) -> Result<(ConstraintsId, CanonicalConstraints), StoreError> {
    let constraints = Constraints::parse(&text, &STORED_LIMITS)
        .map_err(|e| StoreError::Corrupt(format!("stored constraints `{text}`: {e}")))?
        .canonical();
    let id: ConstraintsId = id
        .parse()
        .map_err(|e| StoreError::Corrupt(format!("{e}")))?;
    if constraints.id() != id {
        return Err(StoreError::Corrupt(format!(
            "variant {id} has constraints `{text}`, whose id is {}",
            constraints.id()
        )));
    }
    Ok((id, constraints))
}

pub(super) fn ttl_from_ms(ms: Option<i64>) -> Result<Option<std::time::Duration>, StoreError> {
    ms.map(|ms| {
        u64::try_from(ms)
            .map(std::time::Duration::from_millis)
            .map_err(|_| StoreError::Corrupt(format!("variant ttl_ms {ms} is negative")))
    })
    .transpose()
}
