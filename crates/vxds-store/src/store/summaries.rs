//! Replicas' client summaries, for impact preview: each replica replaces its own row every
//! few seconds, and any replica reads every row that has not expired, so that a dry run on one
//! replica sees the clients of the whole fleet. A replica that stops publishing (crashed,
//! partitioned) drops out once its row expires; the next publish deletes expired rows. Every
//! time here is the database's clock, so replicas whose clocks disagree still agree on expiry.

use std::time::Duration;

use sqlx::Row;
use vxds_core::impact::ClientSummary;

use super::{Backend, Store};
use crate::error::StoreError;
use crate::model::ReplicaSummary;

impl Store {
    /// The database's clock, in Unix milliseconds.
    async fn database_now_ms(&self) -> Result<i64, StoreError> {
        let query = match self.backend() {
            Backend::Postgres => {
                "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)"
            }
            Backend::Sqlite => "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        };
        self.guarded(async {
            let row = sqlx::query(query).fetch_one(self.pool()).await?;
            Ok(row.try_get::<i64, _>(0)?)
        })
        .await
    }

    /// Replaces `replica_id`'s summary; it counts for `valid_for` from now unless replaced.
    pub async fn publish_client_summary(
        &self,
        replica_id: &str,
        summary: &ClientSummary,
        valid_for: Duration,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(summary)
            .map_err(|e| StoreError::Corrupt(format!("encoding a client summary: {e}")))?;
        let now = self.database_now_ms().await?;
        let expires = now.saturating_add(i64::try_from(valid_for.as_millis()).unwrap_or(i64::MAX));
        self.guarded(async {
            sqlx::query(
                "INSERT INTO vxds_client_summaries (replica_id, published_at_ms, expires_at_ms, summary) \
                 VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (replica_id) DO UPDATE SET published_at_ms = excluded.published_at_ms, \
                 expires_at_ms = excluded.expires_at_ms, summary = excluded.summary",
            )
            .bind(replica_id)
            .bind(now)
            .bind(expires)
            .bind(json)
            .execute(self.pool())
            .await?;
            sqlx::query("DELETE FROM vxds_client_summaries WHERE expires_at_ms < $1")
                .bind(now)
                .execute(self.pool())
                .await?;
            Ok(())
        })
        .await
    }

    /// Extends `replica_id`'s summary, unchanged, for `valid_for` from now: a fleet whose
    /// clients stay put costs the database a timestamp per period, not the summary. `false`
    /// when the replica has no summary (it expired and was deleted): publish it again.
    pub async fn renew_client_summary(
        &self,
        replica_id: &str,
        valid_for: Duration,
    ) -> Result<bool, StoreError> {
        let now = self.database_now_ms().await?;
        let expires = now.saturating_add(i64::try_from(valid_for.as_millis()).unwrap_or(i64::MAX));
        self.guarded(async {
            let renewed = sqlx::query(
                "UPDATE vxds_client_summaries SET published_at_ms = $2, expires_at_ms = $3 \
                 WHERE replica_id = $1 AND expires_at_ms >= $2",
            )
            .bind(replica_id)
            .bind(now)
            .bind(expires)
            .execute(self.pool())
            .await?
            .rows_affected();
            sqlx::query("DELETE FROM vxds_client_summaries WHERE expires_at_ms < $1")
                .bind(now)
                .execute(self.pool())
                .await?;
            Ok(renewed == 1)
        })
        .await
    }

    /// Removes `replica_id`'s summary (the replica is shutting down).
    pub async fn withdraw_client_summary(&self, replica_id: &str) -> Result<(), StoreError> {
        self.guarded(async {
            sqlx::query("DELETE FROM vxds_client_summaries WHERE replica_id = $1")
                .bind(replica_id)
                .execute(self.pool())
                .await?;
            Ok(())
        })
        .await
    }

    /// Every replica's summary that has not expired, by replica id. A row this version cannot
    /// read (written by a newer one) is skipped and logged: the others still count.
    pub async fn client_summaries(&self) -> Result<Vec<ReplicaSummary>, StoreError> {
        let now = self.database_now_ms().await?;
        let rows = self
            .guarded(async {
                Ok(sqlx::query(
                    "SELECT replica_id, published_at_ms, expires_at_ms, summary \
                     FROM vxds_client_summaries WHERE expires_at_ms >= $1 ORDER BY replica_id",
                )
                .bind(now)
                .fetch_all(self.pool())
                .await?)
            })
            .await?;
        let mut summaries = Vec::with_capacity(rows.len());
        for row in rows {
            let replica_id: String = row.try_get(0).map_err(StoreError::from)?;
            let text: String = row.try_get(3).map_err(StoreError::from)?;
            match serde_json::from_str(&text) {
                Ok(summary) => summaries.push(ReplicaSummary {
                    replica_id,
                    published_at_ms: row.try_get(1).map_err(StoreError::from)?,
                    expires_at_ms: row.try_get(2).map_err(StoreError::from)?,
                    summary,
                }),
                Err(e) => tracing::warn!(
                    replica = %replica_id,
                    error = %e,
                    "skipping a client summary this version cannot read"
                ),
            }
        }
        Ok(summaries)
    }
}
