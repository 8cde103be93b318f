//! Pruning history beyond the retention, a small batch at a time, off the write path.
//!
//! Each step is one short transaction of its own. It first moves `pruned_through` (table
//! `vxds_retention`) to the newest revision outside the retention — from then on readers
//! answer [`StoreError::HistoryPruned`] for it and older ones — then sweeps the next window of
//! revisions up to it: per resource the window changed, every change and variant set older
//! than its last change at or before the window's end goes, as does that last change if it
//! was a deletion; then the window's revision rows nobody refers to any more. What is left
//! below `pruned_through` is exactly the state the oldest kept revision starts from, so a diff
//! or restore of a kept revision reads what it always did, at every step. The head's state
//! (`vxds_resources`, `vxds_variants`) is never touched, nor the head revision.
//!
//! Steps take the retention row's lock, so replicas that prune at once take turns. On SQLite
//! a step also gives freed pages back to the file system when it has incremental auto-vacuum
//! (new databases do); otherwise the freed pages are reused.

use std::collections::BTreeSet;
use std::time::Duration;

use sqlx::{Any, Row, Transaction};
use tracing::{debug, info, warn};

use super::write::now_ms;
use super::{Backend, Store};
use crate::error::StoreError;
use crate::retention::Retention;

/// Revisions swept per step at most.
const STEP_REVISIONS: u64 = 1000;
/// Change rows per step, roughly: a window ends early at a revision past this many.
const STEP_ROWS: i64 = 2000;
/// Pages SQLite gives back after a step.
const VACUUM_PAGES: u32 = 2000;
/// Between the steps of one sweep: room for writers.
const STEP_PAUSE: Duration = Duration::from_millis(5);

/// What one prune step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PruneStep {
    /// The oldest revision kept (1 when none was pruned).
    pub oldest_kept: u64,
    /// Revisions swept by this step.
    pub swept: u64,
    /// Nothing is left to sweep for now.
    pub done: bool,
}

impl Store {
    /// The oldest revision the retention keeps: older ones answer
    /// [`StoreError::HistoryPruned`]; 1 when nothing was pruned.
    pub async fn oldest_kept_revision(&self) -> Result<u64, StoreError> {
        self.guarded(async {
            let row = sqlx::query("SELECT pruned_through FROM vxds_retention WHERE id = 1")
                .fetch_one(self.pool())
                .await?;
            Ok(row.try_get::<i64, _>(0)? as u64 + 1)
        })
        .await
    }

    /// One step of pruning by `retention` as of now.
    pub async fn prune_step(&self, retention: &Retention) -> Result<PruneStep, StoreError> {
        self.prune_step_at(retention, now_ms()).await
    }

    /// One step of pruning by `retention` as of `now_ms` (Unix milliseconds): the age limit
    /// counts back from it.
    pub async fn prune_step_at(
        &self,
        retention: &Retention,
        now_ms: i64,
    ) -> Result<PruneStep, StoreError> {
        let step = self.guarded(self.sweep(retention, now_ms)).await?;
        if step.swept > 0 && self.backend() == Backend::Sqlite {
            let vacuum = format!("PRAGMA incremental_vacuum({VACUUM_PAGES})");
            self.guarded(async {
                sqlx::query(sqlx::AssertSqlSafe(vacuum))
                    .execute(self.pool())
                    .await?;
                Ok(())
            })
            .await?;
        }
        Ok(step)
    }

    /// Prunes by `retention` as of `now_ms` until nothing is left to sweep; the oldest kept
    /// revision.
    pub async fn prune_all_at(
        &self,
        retention: &Retention,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        loop {
            let step = self.prune_step_at(retention, now_ms).await?;
            if step.done {
                return Ok(step.oldest_kept);
            }
        }
    }

    /// Prunes by `retention` in the background: a sweep every `period` (and one at once),
    /// each a series of short steps. Stops with the store.
    pub fn spawn_pruner(&self, retention: Retention, period: Duration) {
        if !retention.prunes() {
            return;
        }
        let store = self.clone();
        let task = tokio::spawn(async move {
            loop {
                let mut swept = 0;
                let result = loop {
                    match store.prune_step(&retention).await {
                        Ok(step) if step.done => break Ok(step.oldest_kept),
                        Ok(step) => {
                            swept += step.swept;
                            tokio::time::sleep(STEP_PAUSE).await;
                        }
                        Err(e) => break Err(e),
                    }
                };
                match result {
                    Ok(oldest_kept) if swept > 0 => {
                        info!(swept, oldest_kept, %retention, "history pruned")
                    }
                    Ok(oldest_kept) => debug!(oldest_kept, "nothing to prune"),
                    // Down: the health prober says so; the next sweep tries again.
                    Err(e) => warn!(error = %e, "pruning history failed; trying again later"),
                }
                tokio::time::sleep(period).await;
            }
        });
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            tasks.push(task);
        }
    }

    async fn sweep(&self, retention: &Retention, now_ms: i64) -> Result<PruneStep, StoreError> {
        let mut tx = self.pool().begin().await?;
        let lock = match self.backend() {
            Backend::Postgres => {
                sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .execute(&mut *tx)
                    .await?;
                "SELECT pruned_through, swept_through FROM vxds_retention WHERE id = 1 FOR UPDATE"
            }
            // A write first takes SQLite's write lock at once.
            Backend::Sqlite => {
                "UPDATE vxds_retention SET id = id WHERE id = 1 \
                 RETURNING pruned_through, swept_through"
            }
        };
        let row = sqlx::query(lock).fetch_one(&mut *tx).await?;
        let mut pruned: i64 = row.try_get(0)?;
        let swept: i64 = row.try_get(1)?;
        let head: i64 = sqlx::query("SELECT revision FROM vxds_head WHERE id = 1")
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?;

        let cutoff = cutoff(&mut tx, retention, head, now_ms).await?;
        if cutoff > pruned {
            sqlx::query("UPDATE vxds_retention SET pruned_through = $1 WHERE id = 1")
                .bind(cutoff)
                .execute(&mut *tx)
                .await?;
            pruned = cutoff;
        }
        if swept >= pruned {
            tx.commit().await?;
            return Ok(PruneStep {
                oldest_kept: pruned as u64 + 1,
                swept: 0,
                done: true,
            });
        }
        let lo = swept + 1;
        // The window: up to STEP_REVISIONS revisions, fewer if they changed many resources.
        let by_rows = sqlx::query(
            "SELECT revision FROM vxds_revision_changes WHERE revision >= $1 \
             ORDER BY revision LIMIT 1 OFFSET $2",
        )
        .bind(lo)
        .bind(STEP_ROWS)
        .fetch_optional(&mut *tx)
        .await?
        .map(|row| row.try_get::<i64, _>(0))
        .transpose()?;
        let hi = pruned
            .min(lo + STEP_REVISIONS as i64 - 1)
            .min(by_rows.unwrap_or(i64::MAX))
            .max(lo);

        let keys = sqlx::query(
            "SELECT DISTINCT type_url, name FROM vxds_revision_changes \
             WHERE revision >= $1 AND revision <= $2",
        )
        .bind(lo)
        .bind(hi)
        .fetch_all(&mut *tx)
        .await?;
        // Revisions below the window whose last rows may go here.
        let mut older = BTreeSet::new();
        for key in keys {
            let (type_url, name): (String, String) = (key.try_get(0)?, key.try_get(1)?);
            let last = sqlx::query(
                "SELECT revision, change FROM vxds_revision_changes \
                 WHERE type_url = $1 AND name = $2 AND revision <= $3 \
                 ORDER BY revision DESC LIMIT 1",
            )
            .bind(&type_url)
            .bind(&name)
            .bind(hi)
            .fetch_one(&mut *tx)
            .await?;
            let last_revision: i64 = last.try_get(0)?;
            let deleted = last.try_get::<String, _>(1)? == "deleted";
            sqlx::query(
                "DELETE FROM vxds_variant_history \
                 WHERE type_url = $1 AND name = $2 AND revision < $3",
            )
            .bind(&type_url)
            .bind(&name)
            .bind(last_revision)
            .execute(&mut *tx)
            .await?;
            // A deletion as the last change says no more than no change at all.
            let bound = if deleted { "<=" } else { "<" };
            let sql = sqlx::AssertSqlSafe(format!(
                "DELETE FROM vxds_revision_changes \
                 WHERE type_url = $1 AND name = $2 AND revision {bound} $3 RETURNING revision"
            ));
            let gone = sqlx::query(sql)
                .bind(&type_url)
                .bind(&name)
                .bind(last_revision)
                .fetch_all(&mut *tx)
                .await?;
            for row in gone {
                let revision: i64 = row.try_get(0)?;
                if revision < lo {
                    older.insert(revision);
                }
            }
        }
        let orphan = "NOT EXISTS (SELECT 1 FROM vxds_revision_changes c \
                      WHERE c.revision = vxds_revisions.revision)";
        let sql = sqlx::AssertSqlSafe(format!(
            "DELETE FROM vxds_revisions WHERE revision >= $1 AND revision <= $2 AND {orphan}"
        ));
        sqlx::query(sql).bind(lo).bind(hi).execute(&mut *tx).await?;
        for revision in older {
            let sql = sqlx::AssertSqlSafe(format!(
                "DELETE FROM vxds_revisions WHERE revision = $1 AND {orphan}"
            ));
            sqlx::query(sql).bind(revision).execute(&mut *tx).await?;
        }
        sqlx::query("UPDATE vxds_retention SET swept_through = $1 WHERE id = 1")
            .bind(hi)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(PruneStep {
            oldest_kept: pruned as u64 + 1,
            swept: (hi - lo + 1) as u64,
            done: hi >= pruned,
        })
    }
}

/// The newest revision outside `retention`: further than the count behind the head, or
/// committed before the age; never the head.
async fn cutoff(
    tx: &mut Transaction<'_, Any>,
    retention: &Retention,
    head: i64,
    now_ms: i64,
) -> Result<i64, StoreError> {
    let mut cutoff = 0;
    if let Some(count) = retention.revisions {
        cutoff = cutoff.max(head.saturating_sub(count.min(i64::MAX as u64) as i64));
    }
    if let Some(age) = retention.age {
        let before = now_ms.saturating_sub(age.as_millis().min(i64::MAX as u128) as i64);
        let row = sqlx::query(
            "SELECT revision FROM vxds_revisions WHERE created_at_ms < $1 \
             ORDER BY created_at_ms DESC, revision DESC LIMIT 1",
        )
        .bind(before)
        .fetch_optional(&mut **tx)
        .await?;
        if let Some(row) = row {
            cutoff = cutoff.max(row.try_get::<i64, _>(0)?);
        }
    }
    Ok(cutoff.min(head - 1).max(0))
}

impl Store {
    /// Benchmarks only (`examples/month.rs`): appends `count` revisions that each rewrite
    /// `key` with the variants it has, committed `step_ms` apart from `first_ms` on, as
    /// [`Store::apply`] would record them (revision, change, variant history), in one
    /// transaction without validation. The resource must exist. Returns the new head.
    #[doc(hidden)]
    pub async fn synthesize_history(
        &self,
        key: &vxds_envoy::changeset::ResourceKey,
        count: u64,
        first_ms: i64,
        step_ms: i64,
    ) -> Result<u64, StoreError> {
        let _turn = self.inner.write_queue.acquire().await.ok();
        let mut tx = self.pool().begin().await?;
        let lock = match self.backend() {
            Backend::Postgres => "SELECT revision FROM vxds_head WHERE id = 1 FOR UPDATE",
            Backend::Sqlite => {
                "UPDATE vxds_head SET revision = revision WHERE id = 1 RETURNING revision"
            }
        };
        let head: i64 = sqlx::query(lock).fetch_one(&mut *tx).await?.try_get(0)?;
        let (first, last) = (head + 1, head + count.min(i64::MAX as u64) as i64);
        let seq = "WITH RECURSIVE seq(n) AS (SELECT CAST($1 AS BIGINT) UNION ALL \
                   SELECT n + 1 FROM seq WHERE n < $2)";
        let statements = [
            format!(
                "{seq} INSERT INTO vxds_revisions (revision, created_at_ms, author, message) \
                 SELECT n, $3 + (n - $1) * $4, NULL, 'synthetic' FROM seq \
                 WHERE $5 = $5 AND $6 = $6"
            ),
            format!(
                "{seq} INSERT INTO vxds_revision_changes (revision, type_url, name, change, version, shared) \
                 SELECT n, r.type_url, r.name, 'updated', r.version, r.shared FROM seq, vxds_resources r \
                 WHERE $3 = $3 AND $4 = $4 AND r.type_url = $5 AND r.name = $6"
            ),
            format!(
                "{seq} INSERT INTO vxds_variant_history \
                 (revision, type_url, name, position, variant_id, constraints, body, version, ttl_ms) \
                 SELECT n, v.type_url, v.name, v.position, v.variant_id, v.constraints, v.body, \
                        v.version, v.ttl_ms FROM seq, vxds_variants v \
                 WHERE $3 = $3 AND $4 = $4 AND v.type_url = $5 AND v.name = $6"
            ),
        ];
        for sql in statements {
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(first)
                .bind(last)
                .bind(first_ms)
                .bind(step_ms)
                .bind(key.type_url.as_str())
                .bind(&key.name)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("UPDATE vxds_resources SET revision = $1 WHERE type_url = $2 AND name = $3")
            .bind(last)
            .bind(key.type_url.as_str())
            .bind(&key.name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE vxds_head SET revision = $1 WHERE id = 1")
            .bind(last)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.publish_head(last as u64);
        Ok(last as u64)
    }
}
