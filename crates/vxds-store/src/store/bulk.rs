//! Multi-row statements for large writes: rows gathered per table and written a batch at a
//! time (one `INSERT ... VALUES (...), (...)` per batch instead of a statement per row), and
//! the current state of many resources read with one query per type instead of one per
//! resource. A changeset of 100,000 resources is then a few hundred statements, not a million.

use std::collections::BTreeMap;

use futures::TryStreamExt;
use sqlx::{Any, Row, Transaction};
use vxds_envoy::changeset::ResourceKey;

use crate::error::StoreError;

/// Bound parameters per statement: under SQLite's limit (32,766) and Postgres' (65,535).
const PARAMETERS: usize = 30_000;

/// Names per query of [`load_many`].
const NAMES_PER_READ: usize = 1000;

/// One bound value.
pub(super) enum Value {
    Int(i64),
    OptInt(Option<i64>),
    Text(String),
    OptText(Option<String>),
    Bytes(Vec<u8>),
}

/// Rows for one table, written a batch at a time.
pub(super) struct Rows {
    /// `INSERT INTO t (a, b, c)`.
    head: &'static str,
    /// After the values: `ON CONFLICT ...`, or empty.
    tail: &'static str,
    columns: usize,
    values: Vec<Value>,
}

impl Rows {
    pub(super) fn new(head: &'static str, columns: usize, tail: &'static str) -> Self {
        Self {
            head,
            tail,
            columns,
            values: Vec::new(),
        }
    }

    /// Adds a row of `columns` values; writes the batch when it is full.
    pub(super) async fn push(
        &mut self,
        tx: &mut Transaction<'_, Any>,
        row: impl IntoIterator<Item = Value>,
    ) -> Result<(), StoreError> {
        let before = self.values.len();
        self.values.extend(row);
        debug_assert_eq!(self.values.len() - before, self.columns);
        if self.values.len() + self.columns > PARAMETERS {
            self.flush(tx).await?;
        }
        Ok(())
    }

    /// Writes what is gathered.
    pub(super) async fn flush(&mut self, tx: &mut Transaction<'_, Any>) -> Result<(), StoreError> {
        if self.values.is_empty() {
            return Ok(());
        }
        let rows = self.values.len() / self.columns;
        let mut sql = String::with_capacity(self.head.len() + rows * self.columns * 6 + 32);
        sql.push_str(self.head);
        sql.push_str(" VALUES ");
        let mut n = 0;
        for row in 0..rows {
            if row > 0 {
                sql.push(',');
            }
            sql.push('(');
            for column in 0..self.columns {
                if column > 0 {
                    sql.push(',');
                }
                n += 1;
                sql.push('$');
                sql.push_str(&n.to_string());
            }
            sql.push(')');
        }
        if !self.tail.is_empty() {
            sql.push(' ');
            sql.push_str(self.tail);
        }
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for value in self.values.drain(..) {
            query = match value {
                Value::Int(v) => query.bind(v),
                Value::OptInt(v) => query.bind(v),
                Value::Text(v) => query.bind(v),
                Value::OptText(v) => query.bind(v),
                Value::Bytes(v) => query.bind(v),
            };
        }
        query.execute(&mut **tx).await?;
        Ok(())
    }
}

/// The rows of `keys` in a table keyed by `(type_url, name)`: `columns` (after `name`, which
/// is column 0) of `table`, read with one query per type and [`NAMES_PER_READ`] names, handing
/// each row to `each` with its key.
pub(super) async fn load_many(
    tx: &mut Transaction<'_, Any>,
    table: &str,
    columns: &str,
    keys: &[&ResourceKey],
    mut each: impl FnMut(ResourceKey, &sqlx::any::AnyRow) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut by_type: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for key in keys {
        by_type
            .entry(key.type_url.as_str())
            .or_default()
            .push(key.name.as_str());
    }
    let postgres = is_postgres(tx);
    for (type_url, mut names) in by_type {
        // Each read then covers a narrow range of names (see `one_of`).
        names.sort_unstable();
        for names in names.chunks(NAMES_PER_READ) {
            let sql = format!(
                "SELECT name, {columns} FROM {table} WHERE type_url = $1 AND {}",
                one_of("name", 2, names.len(), postgres)
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(type_url);
            for name in names {
                query = query.bind(*name);
            }
            let mut rows = query.fetch(&mut **tx);
            while let Some(row) = rows.try_next().await? {
                let key = ResourceKey {
                    type_url: type_url.into(),
                    name: row.try_get(0)?,
                };
                each(key, &row)?;
            }
        }
    }
    Ok(())
}

/// Whether `tx` is on Postgres (whose planner [`one_of`] works around).
pub(super) fn is_postgres(tx: &Transaction<'_, Any>) -> bool {
    tx.backend_name() == "PostgreSQL"
}

/// `column IN ($first, ...)` for `count` bound values — on Postgres also bounded by the least
/// and greatest of them. After five runs of a prepared statement Postgres may switch to a
/// generic plan, which for a list of parameters scans the index on the leading key columns
/// only and filters every row of the type through the list: seconds per statement at 100,000
/// resources, and always so when the table has never been analysed (autovacuum off, or a
/// table filled by one transaction). The bounds make it a range scan of the values' span.
/// `LEAST` and `GREATEST` compare the parameters in the database's default collation, which is
/// the columns' (none of them names another: one that did could put a listed value outside
/// the bounds). Callers sort the values bytewise; where the collation orders otherwise (mixed
/// case under a linguistic collation) the span is wider, still right. SQLite (whose planner
/// looks up each value) gets the list alone.
pub(super) fn one_of(column: &str, first: usize, count: usize, postgres: bool) -> String {
    let values = placeholders(first, count);
    if postgres {
        format!(
            "{column} IN ({values}) AND {column} >= LEAST({values}) AND {column} <= GREATEST({values})"
        )
    } else {
        format!("{column} IN ({values})")
    }
}

/// `$first, $first+1, ...` for `count` values.
pub(super) fn placeholders(first: usize, count: usize) -> String {
    let mut out = String::with_capacity(count * 6);
    for n in 0..count {
        if n > 0 {
            out.push(',');
        }
        out.push('$');
        out.push_str(&(first + n).to_string());
    }
    out
}

/// Deletes the rows of `keys` from `table`, keyed by `(type_url, name)` — or, with
/// `by_parent`, the cluster edges whose parent is one of the keys' names.
pub(super) async fn delete_many(
    tx: &mut Transaction<'_, Any>,
    table: &str,
    keys: &[&ResourceKey],
    by_parent: bool,
) -> Result<(), StoreError> {
    let mut by_type: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for key in keys {
        by_type
            .entry(key.type_url.as_str())
            .or_default()
            .push(key.name.as_str());
    }
    let postgres = is_postgres(tx);
    for (type_url, mut names) in by_type {
        names.sort_unstable();
        for names in names.chunks(NAMES_PER_READ) {
            let query = if by_parent {
                let sql = format!(
                    "DELETE FROM {table} WHERE {}",
                    one_of("parent", 1, names.len(), postgres)
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
            } else {
                let sql = format!(
                    "DELETE FROM {table} WHERE type_url = $1 AND {}",
                    one_of("name", 2, names.len(), postgres)
                );
                sqlx::query(sqlx::AssertSqlSafe(sql)).bind(type_url)
            };
            let mut query = query;
            for name in names {
                query = query.bind(*name);
            }
            query.execute(&mut **tx).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests fail loudly on purpose

    use super::*;
    use vxds_testkit::{Db, TestDb};

    /// The plan Postgres uses for a prepared read of `count` names once it has switched to a
    /// generic plan (forced here; it does so by itself after five runs), on tables that were
    /// never analysed, as a fresh database's are.
    async fn generic_plan(store: &crate::Store, count: usize, postgres_bounds: bool) -> String {
        let mut tx = store.inner.pool.begin().await.unwrap();
        sqlx::query("SET LOCAL plan_cache_mode = force_generic_plan")
            .execute(&mut *tx)
            .await
            .unwrap();
        let types = vec!["text"; count + 1].join(", ");
        let prepare = format!(
            "PREPARE read_names_{postgres_bounds} ({types}) AS SELECT name \
             FROM vxds_resources WHERE type_url = $1 AND {}",
            one_of("name", 2, count, postgres_bounds)
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
            .execute(&mut *tx)
            .await
            .unwrap();
        let values: Vec<String> = (0..count).map(|i| format!("'c-{i:04}'")).collect();
        let explain = format!(
            "EXPLAIN EXECUTE read_names_{postgres_bounds} ('t', {})",
            values.join(", ")
        );
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(explain))
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        let lines: Vec<String> = rows.iter().map(|r| r.try_get(0).unwrap()).collect();
        lines.join("\n")
    }

    /// A generic plan for a list of bound names scanned every row of the type and filtered it
    /// through the list (3.8 s a read of 1,000 at 100,000 resources); with the bounds it is a
    /// range scan of the names' span.
    #[tokio::test]
    async fn postgres_generic_plans_scan_only_the_names_span() {
        let db = TestDb::fresh(Db::Postgres).await;
        let store = crate::Store::connect(&db.url, crate::StoreOptions::default())
            .await
            .unwrap();
        let without = generic_plan(&store, 50, false).await;
        let bounded = |plan: &str| {
            plan.lines()
                .any(|l| l.contains("Index Cond") && l.contains("name >="))
        };
        assert!(!bounded(&without), "{without}");
        let with = generic_plan(&store, 50, true).await;
        assert!(bounded(&with), "{with}");
        drop(store);
        db.remove().await;
    }

    #[test]
    fn sqlite_reads_take_the_list_alone() {
        assert_eq!(one_of("name", 2, 3, false), "name IN ($2,$3,$4)");
        assert_eq!(
            one_of("parent", 1, 2, true),
            "parent IN ($1,$2) AND parent >= LEAST($1,$2) AND parent <= GREATEST($1,$2)"
        );
    }
}
