//! Fresh databases for tests, one per test, on both store backends; and `vxds serve` as a
//! child process ([`serve`]).
//!
//! Postgres databases are created on the server at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`) and dropped afterwards, even when the test
//! fails. A missing Postgres fails the test loudly: these tests are never skipped. [`proxy`]
//! stands between a store and Postgres for tests of a database that goes away; [`cluster`]
//! makes a test's own primary and streaming standby, for failovers. [`bench`] holds what the
//! benchmark examples share.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cluster;
pub mod ports;
pub mod proxy;
pub mod serve;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::FutureExt;
use sqlx::Connection;
use vxds_store::{Store, StoreOptions};

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// A fresh, empty database.
#[derive(Debug)]
pub struct TestDb {
    pub backend: Db,
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    postgres: Option<(String, String)>,
}

/// The Postgres server the tests use.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = base.rfind('/').map_or(base, |i| &base[..i]);
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

impl TestDb {
    pub async fn fresh(backend: Db) -> TestDb {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        match backend {
            Db::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary folder");
                let url = format!("sqlite://{}", dir.path().join("vxds.db").display());
                TestDb {
                    backend,
                    url,
                    _dir: Some(dir),
                    postgres: None,
                }
            }
            Db::Postgres => {
                let admin = admin_url();
                let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap_or_else(|e| {
                    panic!(
                        "these tests need Postgres at {admin} ({e}); start it (.ci/run does) or set \
                         DATABASE_URL"
                    )
                });
                let name = format!(
                    "vxds_test_{}_{}",
                    std::process::id(),
                    COUNTER.fetch_add(1, Ordering::Relaxed)
                );
                for sql in [
                    format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                    format!("CREATE DATABASE {name}"),
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .execute(&mut conn)
                        .await
                        .expect("creating a test database");
                }
                TestDb {
                    backend,
                    url: with_database(&admin, &name),
                    _dir: None,
                    postgres: Some((admin, name)),
                }
            }
        }
    }

    /// The Postgres server's address (for [`proxy::TcpProxy`]); panics on SQLite.
    pub fn postgres_addr(&self) -> std::net::SocketAddr {
        use std::net::ToSocketAddrs;
        assert_eq!(self.backend, Db::Postgres, "only Postgres has an address");
        let rest = self.url.split_once("://").map_or("", |(_, r)| r);
        let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let host = host.split(['/', '?']).next().unwrap_or(host);
        let host = if host.contains(':') {
            host.to_owned()
        } else {
            format!("{host}:5432")
        };
        host.to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("resolving the Postgres address `{host}`"))
    }

    /// A store on this database, migrated.
    pub async fn store(&self) -> Store {
        Store::connect(&self.url, StoreOptions::default())
            .await
            .expect("connecting to the test database")
    }

    /// Drops the database now (a Postgres database; a SQLite folder goes with the value).
    pub async fn remove(self) {
        if let Some((admin, name)) = &self.postgres {
            Self::drop_database(admin, name).await;
        }
    }

    async fn drop_database(admin: &str, name: &str) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(admin).await {
            let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
            let _ = sqlx::query(sqlx::AssertSqlSafe(sql))
                .execute(&mut conn)
                .await;
        }
    }
}

/// Runs `test` on a fresh database of `backend`, and drops the database afterwards even when
/// the test fails.
pub async fn with_db<F, Fut>(backend: Db, test: F)
where
    F: FnOnce(TestDb) -> Fut,
    Fut: Future<Output = ()>,
{
    let db = TestDb::fresh(backend).await;
    let postgres = db.postgres.clone();
    let result = AssertUnwindSafe(test(db)).catch_unwind().await;
    if let Some((admin, name)) = postgres {
        TestDb::drop_database(&admin, &name).await;
    }
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Declares each listed `async fn(TestDb)` as a test on SQLite and on Postgres.
#[macro_export]
macro_rules! on_both_backends {
    ($($test:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    $crate::with_db($crate::Db::Sqlite, super::$test).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    $crate::with_db($crate::Db::Postgres, super::$test).await
                }
            )*
        }
    };
}
