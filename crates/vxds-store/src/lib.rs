//! The variant database: the source of truth, and the in-memory index the ADS server reads.
//!
//! - [`Store`] (module `store`): Postgres or embedded SQLite behind one implementation.
//!   Changesets are validated and applied all or nothing as one gap-free revision; revisions
//!   are kept as history (for as long as the [`retention`] says) and are the change feed.
//! - [`index`]: the state at one revision in memory, kept current from the change feed by one
//!   writer task; streams read snapshots and never the database.
//! - [`model`]: what the store holds and answers with; [`error`]: its errors.
#![forbid(unsafe_code)]

pub mod error;
pub mod index;
pub mod model;
pub mod retention;
mod store;

pub use error::{ApplyError, Conflict, RestoreError, StoreError};
pub use index::{
    ChangedKey, DEFAULT_INDEX_HISTORY_BYTES, Derivation, DerivedKey, Index, IndexOptions,
    IndexedResource, IndexedVariant, Snapshot, SnapshotBuilder,
};
pub use model::*;
pub use retention::{DEFAULT_RETENTION, Retention};
pub use store::{
    Backend, DEFAULT_ACQUIRE_TIMEOUT, DEFAULT_STATEMENT_TIMEOUT, DownReason, PROBE_PERIOD,
    PruneStep, ResourceSink, Store, StoreMetrics, StoreOptions, StoreState, migrate_url, redact,
};
pub use vxds_envoy::changeset::ResourceKey;
