//! The store: one implementation over sqlx's `Any` driver for Postgres and SQLite.
//!
//! Store methods own their transactions. Writers serialise on the single head row, which makes
//! revisions gap-free and lets validation that needs stored state run under the lock
//! ([`write`]). Reads that feed the index see one consistent snapshot ([`read`]). After every
//! commit the head revision is published on a watch channel; with Postgres, `LISTEN/NOTIFY`
//! tells every replica too ([`notify`]). A poller reads the head now and then ([`follow`]):
//! the only way to learn of another process's commits on SQLite, and on Postgres the fallback
//! when the LISTEN connection went half-open; it also notices a head that went backwards. The
//! index checks that the revision it holds is still the database's (a commit id recorded per
//! revision) whenever it reads changes, and when asked to after a reconnection, a poll or a
//! head that went back: a failover to a lagging standby is found and the index reloaded.
//! While the database cannot be reached, requests are refused at once ([`health`]).
//! Replicas publish their client summaries for impact preview here too ([`summaries`]).
//! History beyond the retention is pruned in the background, a batch at a time ([`prune`]).

mod bulk;
mod follow;
mod health;
mod history;
mod notify;
mod prune;
mod read;
mod restore;
mod summaries;
mod write;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use sqlx::any::{AnyPoolOptions, install_default_drivers};
use sqlx::migrate::Migrator;
use sqlx::{AnyPool, Row};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use vxds_envoy::changeset::ValidationConfig;

use crate::error::StoreError;

pub use health::{DownReason, PROBE_PERIOD, StoreState};
pub use prune::PruneStep;
pub use read::ResourceSink;

static MIGRATIONS: Migrator = sqlx::migrate!("../../migrations");

/// Which database a store runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    Sqlite,
}

impl Backend {
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else {
            Err(StoreError::UnsupportedUrl(redact(url)))
        }
    }
}

#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Apply pending migrations on connect.
    pub migrate: bool,
    pub max_connections: u32,
    pub validation: ValidationConfig,
    /// How often the head is read to catch commits nobody announced: `None` for the
    /// backend's default (SQLite 500 ms: other processes' commits; Postgres 10 s: a fallback
    /// for a LISTEN connection gone half-open).
    pub head_poll: Option<Duration>,
    /// How long a request waits for a connection (and a probe for an answer) before the store
    /// counts as unreachable. sqlx's default, 30 s, would hang every request that long.
    pub acquire_timeout: Duration,
    /// Longest a statement may run (Postgres `statement_timeout`; on SQLite how long it waits
    /// for another writer, `busy_timeout`). Zero: no limit on Postgres.
    pub statement_timeout: Duration,
}

/// The default [`StoreOptions::acquire_timeout`].
pub const DEFAULT_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(2);
/// The default [`StoreOptions::statement_timeout`].
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            migrate: true,
            max_connections: 8,
            validation: ValidationConfig::default(),
            head_poll: None,
            acquire_timeout: DEFAULT_ACQUIRE_TIMEOUT,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
        }
    }
}

/// How the store follows the database, for Prometheus.
#[derive(Clone, Debug, Default)]
pub struct StoreMetrics {
    /// Polls that found a revision LISTEN had not announced (Postgres).
    pub missed_notifications: Counter,
    /// Times the database was found to no longer hold the revision the index held (its head
    /// went below it, or the number was committed again with other content: a restore or a
    /// failover to a lagging replica); the index was then reloaded.
    pub head_resets: Counter,
    /// Reconnections of the LISTEN connection.
    pub listen_reconnects: Counter,
    /// 1 while the store answers, 0 while it is found unreachable.
    pub up: Gauge,
    /// Times the store was found unreachable.
    pub outages: Counter,
}

impl StoreMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "vxds_store_missed_notifications",
            "Head polls that found a revision LISTEN had not announced",
            self.missed_notifications.clone(),
        );
        registry.register(
            "vxds_store_head_resets",
            "Times the database no longer held the indexed revision (head went back or diverged: restore, failover); the index was reloaded",
            self.head_resets.clone(),
        );
        registry.register(
            "vxds_store_listen_reconnects",
            "Reconnections of the Postgres LISTEN connection",
            self.listen_reconnects.clone(),
        );
        registry.register(
            "vxds_store_up",
            "1 while the store answers, 0 while it is unreachable (writes and store reads get 503)",
            self.up.clone(),
        );
        registry.register(
            "vxds_store_outages",
            "Times the store was found unreachable",
            self.outages.clone(),
        );
    }
}

/// The variant database. Cheap to clone; clones share the pool and the head watch.
#[derive(Clone, Debug)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    pool: AnyPool,
    backend: Backend,
    validation: ValidationConfig,
    head: watch::Sender<u64>,
    /// Ticks when the index should check that the database still holds its revision: after
    /// a (re)connection of LISTEN, a head found below what was seen, and each Postgres poll.
    checks: watch::Sender<u64>,
    /// What LISTEN has delivered.
    notified: Arc<follow::Notified>,
    /// Writers of this process queue here before they take a connection, so that waiting
    /// for the head lock never ties up the pool that reads and readiness need.
    write_queue: tokio::sync::Semaphore,
    health: Arc<health::Health>,
    metrics: StoreMetrics,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(tasks) = self.tasks.get_mut() {
            tasks.drain(..).for_each(|t| t.abort());
        }
    }
}

/// What SQLite should hold of the process's memory — page caches, statements, schemas of every
/// connection together (SQLite's `soft_heap_limit`, one limit for the process). A soft limit:
/// nothing fails at it; past it SQLite recycles clean cached pages and spills dirty ones to the
/// WAL instead of allocating more. Without it each connection may keep its own 2 MiB page cache,
/// up to 16 MiB for the default 8 connections, held after a big write (docs/benchmarks.md: the
/// 100,000-resource restore on SQLite). The operating system's file cache still holds the
/// database's pages.
pub const SQLITE_SOFT_HEAP_LIMIT: u64 = 8 << 20;

impl Store {
    /// Connects to `postgres://...` or `sqlite://...` (the SQLite file is created if missing).
    pub async fn connect(url: &str, options: StoreOptions) -> Result<Self, StoreError> {
        install_default_drivers();
        let backend = Backend::from_url(url)?;
        let mut pool_options = AnyPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout);
        let statement_ms = options.statement_timeout.as_millis();
        let mut url = url.to_owned();
        if backend == Backend::Sqlite {
            if is_sqlite_memory(&url) {
                // Every connection to `:memory:` is a database of its own: keep exactly one.
                pool_options = pool_options
                    .max_connections(1)
                    .idle_timeout(None)
                    .max_lifetime(None);
            } else {
                url = sqlite_create_if_missing(&url)?;
            }
            pool_options = pool_options.after_connect(move |conn, _| {
                Box::pin(async move {
                    // Writers wait for each other instead of failing with SQLITE_BUSY.
                    let busy = format!("PRAGMA busy_timeout = {statement_ms}");
                    sqlx::query(sqlx::AssertSqlSafe(busy))
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("PRAGMA foreign_keys = ON")
                        .execute(&mut *conn)
                        .await?;
                    // Takes effect only on a new database (before its first table): pruned
                    // history then gives its pages back to the file system.
                    sqlx::query("PRAGMA auto_vacuum = INCREMENTAL")
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            });
        } else {
            pool_options = pool_options.after_connect(move |conn, _| {
                Box::pin(async move {
                    // A statement that runs away (or waits for a lock too long) is cancelled.
                    let timeout = format!("SET statement_timeout = {statement_ms}");
                    sqlx::query(sqlx::AssertSqlSafe(timeout))
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            });
        }
        // Set-up (the first switch to WAL, which needs an exclusive lock SQLite will not wait
        // for, and migrations) runs under a cross-process lock on SQLite files.
        let setup_lock = match (backend, sqlite_path(&url)) {
            (Backend::Sqlite, Some(path)) => Some(lock_file(path).await?),
            _ => None,
        };
        let pool = pool_options.connect(&url).await?;
        if backend == Backend::Sqlite && !is_sqlite_memory(&url) {
            // Readers never block the writer, nor the writer readers.
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await?;
        }
        if backend == Backend::Sqlite {
            let limit = format!("PRAGMA soft_heap_limit = {SQLITE_SOFT_HEAP_LIMIT}");
            sqlx::query(sqlx::AssertSqlSafe(limit))
                .execute(&pool)
                .await?;
        }
        if options.migrate {
            // Postgres serialises concurrent migrations itself (sqlx takes an advisory lock).
            MIGRATIONS.run(&pool).await.map_err(StoreError::Migrate)?;
        }
        drop(setup_lock);
        let head = read_head(&pool).await?;
        let (head_tx, _) = watch::channel(head);
        let notified = Arc::new(follow::Notified::new(head));
        let metrics = StoreMetrics::default();
        let health = Arc::new(health::Health::new(
            metrics.up.clone(),
            metrics.outages.clone(),
        ));
        let store = Store {
            inner: Arc::new(Inner {
                pool,
                backend,
                validation: options.validation,
                head: head_tx,
                checks: watch::channel(0).0,
                notified: notified.clone(),
                write_queue: tokio::sync::Semaphore::new(1),
                health: health.clone(),
                metrics,
                tasks: Mutex::new(Vec::new()),
            }),
        };
        // An in-memory SQLite database has no other writer to learn of.
        let pollable = !is_sqlite_memory(&url);
        let mut tasks = Vec::new();
        if pollable {
            // An in-memory database cannot become unreachable (and a fresh connection to one
            // would be another database).
            tasks.push(health::spawn_prober(
                health.clone(),
                url.clone(),
                options.acquire_timeout,
            ));
        }
        if backend == Backend::Postgres {
            tasks.push(notify::spawn_listener(notify::Listener {
                url,
                acquire_timeout: options.acquire_timeout,
                pool: store.inner.pool.clone(),
                head: store.inner.head.clone(),
                checks: store.inner.checks.clone(),
                notified: notified.clone(),
                health: health.clone(),
                metrics: store.inner.metrics.clone(),
            }));
        }
        if pollable {
            let period = options.head_poll.unwrap_or(match backend {
                Backend::Sqlite => Duration::from_millis(500),
                Backend::Postgres => Duration::from_secs(10),
            });
            tasks.push(follow::spawn_head_poller(follow::Poller {
                pool: store.inner.pool.clone(),
                backend,
                head: store.inner.head.clone(),
                checks: store.inner.checks.clone(),
                notified,
                health,
                metrics: store.inner.metrics.clone(),
                period,
            }));
        }
        if let Ok(mut slot) = store.inner.tasks.lock() {
            *slot = tasks;
        }
        Ok(store)
    }

    /// How this store follows the database, for Prometheus.
    pub fn metrics(&self) -> &StoreMetrics {
        &self.inner.metrics
    }

    /// Ticks when the index should check the database still holds the revision it indexed
    /// (see [`Store::changes_after`]).
    pub(crate) fn watch_checks(&self) -> watch::Receiver<u64> {
        self.inner.checks.subscribe()
    }

    /// Sets the head this process knows of to `revision`, read from the database just now
    /// (below what was seen when the database went back in time, or ahead of what it holds),
    /// then reads the head again so that a commit published meanwhile is not lost.
    pub(crate) async fn correct_head(&self, revision: u64) {
        self.inner.head.send_replace(revision);
        self.inner
            .notified
            .revision
            .store(revision, std::sync::atomic::Ordering::Relaxed);
        if let Ok(database) = self.head_revision().await {
            self.inner.notified.record(database);
            self.publish_head(database);
        }
    }

    pub fn backend(&self) -> Backend {
        self.inner.backend
    }

    pub fn validation(&self) -> &ValidationConfig {
        &self.inner.validation
    }

    /// The newest revision this process knows of; it changes as commits happen, here or (with
    /// Postgres) on any replica.
    pub fn watch_head(&self) -> watch::Receiver<u64> {
        self.inner.head.subscribe()
    }

    /// Whether the store answers, as this process last found it. Never touches the database.
    pub fn state(&self) -> StoreState {
        self.inner.health.state()
    }

    /// The store's state as it changes.
    pub fn watch_state(&self) -> watch::Receiver<StoreState> {
        self.inner.health.watch()
    }

    /// Checks the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.head_revision().await.map(drop)
    }

    /// The head revision, read from the database.
    pub async fn head_revision(&self) -> Result<u64, StoreError> {
        self.guarded(read_head(&self.inner.pool)).await
    }

    /// Stops following the database and closes the pool.
    pub async fn close(&self) {
        if let Ok(mut tasks) = self.inner.tasks.lock() {
            tasks.drain(..).for_each(|t| t.abort());
        }
        self.inner.health.down(DownReason::Closed);
        self.inner.pool.close().await;
    }

    /// Runs an operation on the database: refused at once while the store is down, and an
    /// outage it runs into asks for a probe.
    async fn guarded<T>(
        &self,
        operation: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.inner.health.check()?;
        let result = operation.await;
        if let Err(e) = &result {
            self.inner.health.observe(e);
        }
        result
    }

    fn pool(&self) -> &AnyPool {
        &self.inner.pool
    }

    /// Publishes a revision this process committed or heard of; the head only moves forward.
    fn publish_head(&self, revision: u64) {
        publish(&self.inner.head, revision);
    }
}

fn publish(head: &watch::Sender<u64>, revision: u64) {
    head.send_if_modified(|current| {
        let newer = revision > *current;
        if newer {
            *current = revision;
        }
        newer
    });
}

/// Applies pending migrations. Concurrent start-ups do not race: Postgres takes an advisory
/// lock (sqlx does), SQLite a lock file beside the database (`<file>.setup-lock`).
pub async fn migrate_url(url: &str) -> Result<(), StoreError> {
    let store = Store::connect(
        url,
        StoreOptions {
            migrate: true,
            max_connections: 1,
            ..Default::default()
        },
    )
    .await?;
    store.close().await;
    Ok(())
}

async fn read_head<'c>(
    executor: impl sqlx::Executor<'c, Database = sqlx::Any>,
) -> Result<u64, StoreError> {
    let row = sqlx::query("SELECT revision FROM vxds_head WHERE id = 1")
        .fetch_optional(executor)
        .await;
    match row {
        Ok(Some(row)) => Ok(row.try_get::<i64, _>(0)? as u64),
        Ok(None) => Err(StoreError::NotMigrated),
        // A missing table reads as "not migrated" rather than "unavailable".
        Err(sqlx::Error::Database(e)) if e.message().contains("vxds_head") => {
            Err(StoreError::NotMigrated)
        }
        Err(e) => Err(e.into()),
    }
}

fn is_sqlite_memory(url: &str) -> bool {
    url.contains(":memory:") || url.contains("mode=memory")
}

/// The SQLite file a URL names, if it names one.
fn sqlite_path(url: &str) -> Option<PathBuf> {
    if is_sqlite_memory(url) {
        return None;
    }
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty()).then(|| PathBuf::from(path))
}

/// The URL with `mode=rwc`, so that a new file is created, and its folder made.
fn sqlite_create_if_missing(url: &str) -> Result<String, StoreError> {
    if let Some(parent) = sqlite_path(url).as_deref().and_then(|p| p.parent())
        && !parent.as_os_str().is_empty()
    {
        std::fs::create_dir_all(parent).map_err(StoreError::Io)?;
    }
    if url.contains("mode=") {
        return Ok(url.to_owned());
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{separator}mode=rwc"))
}

/// Holds an exclusive lock on `<database>.setup-lock` until dropped.
async fn lock_file(database: PathBuf) -> Result<std::fs::File, StoreError> {
    let mut path = database.into_os_string();
    path.push(".setup-lock");
    tokio::task::spawn_blocking(move || {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)?;
        file.lock()?;
        Ok(file)
    })
    .await
    .map_err(|e| StoreError::Io(std::io::Error::other(e)))?
    .map_err(StoreError::Io)
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// How long to wait between attempts when the database is away.
pub(crate) fn retry_policy() -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .without_max_times()
        .with_jitter()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            Backend::from_url("postgres://u@h/db").unwrap(),
            Backend::Postgres
        );
        assert_eq!(
            Backend::from_url("sqlite://vxds.db").unwrap(),
            Backend::Sqlite
        );
        assert!(matches!(
            Backend::from_url("mysql://x"),
            Err(StoreError::UnsupportedUrl(_))
        ));
        assert_eq!(
            sqlite_path("sqlite://data/vxds.db?mode=rwc"),
            Some(PathBuf::from("data/vxds.db"))
        );
        assert_eq!(sqlite_path("sqlite::memory:"), None);
        assert_eq!(
            sqlite_create_if_missing("sqlite://x.db").unwrap(),
            "sqlite://x.db?mode=rwc"
        );
        assert_eq!(
            redact("postgres://vxds:secret@db:5432/vxds"),
            "postgres://vxds:***@db:5432/vxds"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1/postgres"),
            "postgres://postgres@127.0.0.1/postgres"
        );
    }

    /// SQLite's memory has one soft limit for the process, set by every SQLite store it connects.
    #[tokio::test]
    async fn sqlite_memory_has_one_soft_limit_for_the_process() {
        let store = Store::connect("sqlite::memory:", StoreOptions::default())
            .await
            .unwrap();
        let limit: i64 = sqlx::query_scalar("PRAGMA soft_heap_limit")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(u64::try_from(limit).ok(), Some(SQLITE_SOFT_HEAP_LIMIT));
    }
}
