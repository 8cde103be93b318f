//! The store's errors. Database error text stays in the `source` chain, for logs; what the
//! errors display is safe to show a client.

use vxds_envoy::changeset::Invalid;
use vxds_envoy::pointer::Pointer;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is refusing work for now: worth retrying (503).
    #[error("the store is unavailable")]
    Unavailable(#[source] sqlx::Error),
    /// The store is known to be unreachable (the change feed or a probe found it so): the
    /// request was not tried, so that it fails at once instead of after the acquire timeout
    /// (503).
    #[error("the store is unreachable; not trying until it answers again")]
    Down,
    /// The database answered with an error that retrying will not fix (500; logged).
    #[error("the store failed")]
    Database(#[source] sqlx::Error),
    #[error("migrating the store failed")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error(
        "the store is not migrated; run `vxds migrate` or start the server without --no-migrate"
    )]
    NotMigrated,
    #[error("the store holds data this version cannot read: {0}")]
    Corrupt(String),
    #[error("unsupported database URL `{0}`: use postgres://... or sqlite://...")]
    UnsupportedUrl(String),
    #[error("preparing the SQLite database failed")]
    Io(#[source] std::io::Error),
    /// The history retention pruned the revision asked for (410).
    #[error(
        "revision {revision} was pruned by the history retention; the oldest kept revision is {oldest_kept}"
    )]
    HistoryPruned { revision: u64, oldest_kept: u64 },
}

impl StoreError {
    /// Whether this says the database cannot be reached at all (not that it is busy): what
    /// makes the store probe it and, if it does not answer, declare it down.
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Unavailable(e) => is_outage(e),
            StoreError::Down => true,
            _ => false,
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if is_connection_class(&e) {
            StoreError::Unavailable(e)
        } else {
            StoreError::Database(e)
        }
    }
}

/// Errors worth retrying, of reaching the database rather than of the statement: an outage
/// ([`is_outage`]), a closed pool, too many connections (53300), a statement cancelled by
/// `statement_timeout` (57014); SQLite busy or locked.
fn is_connection_class(e: &sqlx::Error) -> bool {
    is_outage(e)
        || match e {
            sqlx::Error::PoolClosed => true,
            sqlx::Error::Database(db) => db.code().is_some_and(|code| {
                matches!(&*code, "53300" | "57014" | "5" | "6" | "261" | "517")
            }),
            _ => false,
        }
}

/// The database cannot be reached: the connection failed or broke, no connection came within
/// the acquire timeout, Postgres' connection-exception class (08), or it is shutting down or
/// starting up (57P0x).
pub(crate) fn is_outage(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|code| {
            code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
        }),
        _ => false,
    }
}

/// Why a changeset was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A rule refused it; every problem is listed.
    #[error("the changeset breaks {} rule(s)", .0.errors.len())]
    Invalid(Invalid),
    /// An expected revision or version did not hold; nothing was written.
    #[error("{}", .0.message)]
    Conflict(Conflict),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub pointer: Pointer,
    pub operation: Option<usize>,
    pub message: String,
}

/// Why a past revision was not restored.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("there is no revision {0}")]
    NoSuchRevision(u64),
    /// The store was written before it kept variant history, and the resource's state at
    /// that revision is one of the states it did not keep.
    #[error(
        "the variants `{}` had right after revision {revision} were not kept (written before this store kept variant history); it cannot be restored",
        .key.name
    )]
    HistoryNotKept {
        key: vxds_envoy::changeset::ResourceKey,
        revision: u64,
    },
    /// The restore, as a changeset, was refused or conflicted.
    #[error(transparent)]
    Apply(#[from] ApplyError),
}

impl From<StoreError> for RestoreError {
    fn from(e: StoreError) -> Self {
        RestoreError::Apply(ApplyError::Store(e))
    }
}
