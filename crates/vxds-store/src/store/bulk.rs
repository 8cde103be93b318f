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
    for (type_url, names) in by_type {
        for names in names.chunks(NAMES_PER_READ) {
            let sql = format!(
                "SELECT name, {columns} FROM {table} WHERE type_url = $1 AND name IN ({})",
                placeholders(2, names.len())
            );
            let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(type_url);
            for name in names {
                query = query.bind(*name);
            }
            let mut rows = query.fetch(&mut **tx);
            while let Some(row) = rows.try_next().await? {
                let key = ResourceKey {
                    type_url: type_url.to_owned(),
                    name: row.try_get(0)?,
                };
                each(key, &row)?;
            }
        }
    }
    Ok(())
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
    for (type_url, names) in by_type {
        for names in names.chunks(NAMES_PER_READ) {
            let query = if by_parent {
                let sql = format!(
                    "DELETE FROM {table} WHERE parent IN ({})",
                    placeholders(1, names.len())
                );
                sqlx::query(sqlx::AssertSqlSafe(sql))
            } else {
                let sql = format!(
                    "DELETE FROM {table} WHERE type_url = $1 AND name IN ({})",
                    placeholders(2, names.len())
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
