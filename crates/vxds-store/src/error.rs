//! The store's errors. Database error text stays in the `source` chain, for logs; what the
//! errors display is safe to show a client.

use vxds_envoy::changeset::Invalid;
use vxds_envoy::pointer::Pointer;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the store is unavailable")]
    Unavailable(#[source] sqlx::Error),
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
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        StoreError::Unavailable(e)
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
