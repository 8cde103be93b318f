//! Changesets, the unit of write, and their validation.
//!
//! The request model ([`ChangesetRequest`], [`PutRequest`], ...) is what the REST API, the CLI
//! and fixture files all speak. [`validate`] runs every rule that needs no stored state — types,
//! names, constraints, the variant-set rules, bodies, type-specific rules — and reports every
//! problem, each with a JSON pointer into the request. The store adds the rules that need its
//! state (expected versions, the aggregate-cluster graph across the store) under its write lock,
//! through [`ValidatedChangeset::graph_problems`].
//!
//! Here: the configuration, the problems, and the validated forms. The request model is in
//! `request`, the operation-at-a-time [`Checker`] in `checker`, the rules of one operation in
//! `validator`, and the aggregate and redirect graph rules in `graph`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;
use vxds_core::variants::{self, VariantLimits, VariantSetError};
use vxds_core::xdstp::{self, ResourceName};
use vxds_core::{CanonicalConstraints, Constraints, Limits, ParamSet};

use crate::constraints::constraints_from_json;
use crate::pointer::Pointer;
use crate::resource::{Body, CLUSTER, ResourceType, SECRET, content_hash};
use crate::rules;

mod checker;
mod graph;
mod key;
mod precondition;
mod raw;
mod request;
mod ttl;
mod validator;

use validator::Validator;

pub use checker::{ChangesetHeader, Checked, Checker, check};
pub use key::{ResourceKey, TypeUrl};
pub use precondition::{ANY_VERSION, ExpectedVersion, Precondition};
pub use raw::RawJson;
pub use request::{ChangesetRequest, DeleteRequest, OperationRequest, PutRequest, VariantRequest};
pub use ttl::{MAX_TTL, MIN_TTL};

/// The default [`ValidationConfig::max_operations`]: an export of a million resources applies
/// as one changeset. What bounds a write's memory is the request body limit; this bounds the
/// work a single revision may hold the writers' lock for.
pub const DEFAULT_MAX_OPERATIONS: usize = 1_000_000;

/// Rules that are configuration rather than protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationConfig {
    pub limits: Limits,
    pub variant_limits: VariantLimits,
    /// xdstp authorities this server serves; empty allows any.
    pub authorities: Vec<String>,
    /// Operations per changeset ([`DEFAULT_MAX_OPERATIONS`]). A restore is a changeset too: a
    /// store with more resources than this cannot be restored to the empty state in one go.
    pub max_operations: usize,
    /// Parameter keys the xDS server takes from client certificates (the identity template's
    /// placeholders). A secret with a variant that constrains none of them reaches any client
    /// whatever its identity: a warning.
    pub trusted_keys: Vec<String>,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            limits: Limits::DEFAULT,
            variant_limits: VariantLimits::DEFAULT,
            authorities: Vec::new(),
            max_operations: DEFAULT_MAX_OPERATIONS,
            trusted_keys: Vec::new(),
        }
    }
}

/// One problem with a request: where (a JSON pointer into the request, and the operation and
/// variant), what (a stable code) and why (a message), and for overlaps a witness.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub pointer: Pointer,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<usize>,
    pub code: String,
    pub message: String,
    /// A parameter set that matches two variants, for overlaps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub witness: Option<ParamSet>,
}

impl Problem {
    pub fn new(pointer: Pointer, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            pointer,
            operation: None,
            variant: None,
            code: code.into(),
            message: message.into(),
            witness: None,
        }
    }

    /// The same problem, attributed to an operation (and a variant of it).
    pub fn at(mut self, operation: usize, variant: Option<usize>) -> Self {
        self.operation = Some(operation);
        self.variant = variant;
        self
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.as_str().is_empty() {
            "/"
        } else {
            self.pointer.as_str()
        };
        write!(f, "{at}: {} ({})", self.message, self.code)
    }
}

/// A changeset every stateless rule accepted.
#[derive(Clone, Debug)]
pub struct ValidatedChangeset {
    pub expected_revision: Option<u64>,
    pub dry_run: bool,
    pub message: Option<String>,
    pub operations: Vec<ValidatedOperation>,
}

#[derive(Clone, Debug)]
pub struct ValidatedOperation {
    /// Position in the request, for pointers.
    pub index: usize,
    pub key: ResourceKey,
    /// Checked by the store under its write lock.
    pub precondition: Precondition,
    pub action: Action,
}

#[derive(Clone, Debug)]
pub enum Action {
    /// Boxed: a delete is then a fifth of the size (a restore of 100,000 deletions holds them
    /// all while it commits).
    Put(Box<ValidatedResource>),
    Delete,
}

/// A resource's new variant set, with versions computed.
#[derive(Clone, Debug)]
pub struct ValidatedResource {
    pub variants: Vec<ValidatedVariant>,
    /// A secret marked shared (see [`PutRequest::shared`]).
    pub shared: bool,
    /// Hash of the variants' ids and versions, in order.
    pub version: String,
    /// For clusters: the clusters its aggregate variants point to (empty for other kinds).
    pub aggregate_children: Option<BTreeSet<String>>,
    /// The resources (names in normal form, same type) its redirect variants point to; empty
    /// when no variant is a redirect.
    pub redirects: BTreeSet<String>,
}

#[derive(Clone, Debug)]
pub struct ValidatedVariant {
    pub constraints: CanonicalConstraints,
    /// The body, an encoded `google.protobuf.Any`: all the store needs of it. The decoded
    /// message and its canonical JSON are dropped once validated, so that a large changeset
    /// does not hold them all until it commits.
    pub body: Vec<u8>,
    /// Hash of the type, the canonical constraints, the canonical body and the TTL.
    pub version: String,
    /// How long a client keeps the variant without an update or a heartbeat.
    pub ttl: Option<std::time::Duration>,
}

/// The request was refused; every problem is listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub errors: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

#[derive(Clone, Debug)]
pub struct Validated {
    pub changeset: ValidatedChangeset,
    pub warnings: Vec<Problem>,
}

/// Runs every stateless rule on `request`.
pub fn validate(
    request: &ChangesetRequest,
    config: &ValidationConfig,
) -> Result<Validated, Invalid> {
    check(request.clone(), config).into_result()
}

/// [`check`] for a request that stands for a whole store (fixture files checked offline): the
/// aggregate-cluster graph is checked over the request's own clusters as well.
pub fn validate_standalone(
    request: &ChangesetRequest,
    config: &ValidationConfig,
) -> Result<Validated, Invalid> {
    let mut checked = check(request.clone(), config);
    let mut edges = BTreeMap::new();
    checked.changeset.update_aggregate_edges(&mut edges);
    let graph = checked.changeset.graph_problems(&edges);
    checked.errors.extend(graph);
    checked.errors.sort_by_key(|p| p.operation);
    checked.into_result()
}

/// A resource name as the store keys it (xdstp names in normal form), or why it is not one:
/// non-empty, within the length limit, no control characters, and for xdstp names a well-formed
/// URN whose type segment is `ty` and whose authority is served. The one rule for names, used
/// for changesets and for names in URL paths alike.
pub fn resource_name(
    name: &str,
    ty: &ResourceType,
    config: &ValidationConfig,
) -> Result<String, Box<Problem>> {
    let mut validator = Validator {
        config,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let at = Pointer::root();
    match validator.name(name, ty, 0, &at) {
        Some(name) => Ok(name),
        None => Err(Box::new(validator.errors.pop().unwrap_or_else(|| {
            Problem::new(at.push("name"), "invalid_name", "invalid name")
        }))),
    }
}

#[cfg(test)]
mod tests;
