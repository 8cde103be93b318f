//! Changesets, the unit of write, and their validation.
//!
//! The request model ([`ChangesetRequest`], [`PutRequest`], ...) is what the REST API, the CLI
//! and fixture files all speak. [`validate`] runs every rule that needs no stored state — types,
//! names, constraints, the variant-set rules, bodies, type-specific rules — and reports every
//! problem, each with a JSON pointer into the request. The store adds the rules that need its
//! state (expected versions, the aggregate-cluster graph across the store) under its write lock,
//! through [`ValidatedChangeset::graph_problems`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use vxds_core::variants::{self, VariantLimits, VariantSetError};
use vxds_core::xdstp::{self, ResourceName};
use vxds_core::{CanonicalConstraints, Constraints, Limits, ParamSet};

use crate::constraints::constraints_from_json;
use crate::pointer::Pointer;
use crate::resource::{Body, CLUSTER, ResourceType, SECRET, content_hash};
use crate::rules::{self, GraphProblem};

mod key;
mod precondition;
mod raw;
mod ttl;
mod validator;

use validator::Validator;

pub use key::{ResourceKey, TypeUrl};
pub use precondition::{ANY_VERSION, ExpectedVersion, Precondition};
pub use raw::RawJson;
pub use ttl::{MAX_TTL, MIN_TTL};

/// A write of any number of operations, applied all or nothing as one revision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ChangesetRequest {
    /// Refuse (conflict) unless the store's head revision is this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_revision: Option<u64>,
    /// Validate and report, commit nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub operations: Vec<OperationRequest>,
}

// Read through the flat `OperationFields` rather than as an internally tagged enum, which
// would buffer each operation in a tree of its own first (and cannot hold `RawJson`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", try_from = "OperationFields")]
pub enum OperationRequest {
    /// Replace the resource's whole variant set (creating the resource if needed).
    Put(PutRequest),
    Delete(DeleteRequest),
}

impl OperationRequest {
    /// The resource's name as written.
    pub fn name(&self) -> &str {
        match self {
            OperationRequest::Put(put) => &put.name,
            OperationRequest::Delete(delete) => &delete.name,
        }
    }
}

/// An operation as written: the fields of every kind, checked against `op` afterwards.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OperationFields {
    op: OperationKind,
    #[serde(rename = "type")]
    resource_type: String,
    name: String,
    #[serde(default)]
    expected_version: Option<ExpectedVersion>,
    #[serde(default)]
    must_not_exist: Option<bool>,
    #[serde(default)]
    variants: Option<Vec<VariantRequest>>,
    #[serde(default)]
    shared: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum OperationKind {
    Put,
    Delete,
}

impl TryFrom<OperationFields> for OperationRequest {
    type Error = String;

    fn try_from(fields: OperationFields) -> Result<Self, String> {
        match fields.op {
            OperationKind::Put => Ok(OperationRequest::Put(PutRequest {
                resource_type: fields.resource_type,
                name: fields.name,
                expected_version: fields.expected_version,
                must_not_exist: fields.must_not_exist.unwrap_or(false),
                shared: fields.shared.unwrap_or(false),
                variants: fields.variants.ok_or("missing field `variants`")?,
            })),
            OperationKind::Delete => {
                for (present, field) in [
                    (fields.variants.is_some(), "variants"),
                    (fields.must_not_exist.is_some(), "must_not_exist"),
                    (fields.shared.is_some(), "shared"),
                ] {
                    if present {
                        return Err(format!(
                            "unknown field `{field}` (a delete takes `type`, `name` and \
                             `expected_version`)"
                        ));
                    }
                }
                Ok(OperationRequest::Delete(DeleteRequest {
                    resource_type: fields.resource_type,
                    name: fields.name,
                    expected_version: fields.expected_version,
                }))
            }
        }
    }
}

/// A resource and its whole variant set: a put operation, a fixture document, a PUT body.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutRequest {
    /// An alias (`cluster`), a message name or a type URL.
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    /// Refuse (conflict) unless the resource's current version is this one (or one of these;
    /// `*` for any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_version: Option<ExpectedVersion>,
    /// Refuse (conflict) if the resource exists: create only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub must_not_exist: bool,
    /// Secrets only: serve this secret's variants to any client they match, trusted
    /// constraints or not. Without it, when client identities are trusted (an identity
    /// template), a secret is served only through variants that hold for the identities they
    /// name. Recorded with the resource; a put without it un-shares.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    pub variants: Vec<VariantRequest>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeleteRequest {
    #[serde(rename = "type")]
    pub resource_type: String,
    pub name: String,
    /// As for a put.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_version: Option<ExpectedVersion>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct VariantRequest {
    /// Compact text (`env = "prod"`), proto3 JSON of `DynamicParameterConstraints`, or null
    /// (or absent) for an unconstrained variant.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<serde_json::Value>))]
    pub constraints: Value,
    /// The body: proto3 JSON with `@type` (the resource's type, or
    /// `xds.core.v3.ResourceLocator` for a redirect). Absent when `redirect` is given.
    // Kept as text until it is validated: see `RawJson`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub resource: RawJson,
    /// A TP1 redirect instead of a body: the `xdstp://` URL of another resource of the same
    /// type, which subscribers receive as an `xds.core.v3.ResourceLocator`. One hop only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(example = "xdstp://vxds/envoy.config.listener.v3.Listener/canonical")
    )]
    pub redirect: Option<String>,
    /// How long a client keeps this variant without an update or a heartbeat (`30s`,
    /// humantime, 1s to 24h). Absent: forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(example = "30s"))]
    pub ttl: Option<String>,
}

/// The OpenAPI schema of an operation, written by hand: each kind is one closed object that
/// lists `op` with its own fields (a derived schema would put `op` beside a closed object in an
/// `allOf`, which no request could satisfy).
#[cfg(feature = "openapi")]
mod operation_schema {
    use utoipa::openapi::schema::{
        AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
    };
    use utoipa::openapi::{Ref, RefOr};
    use utoipa::{PartialSchema, ToSchema};

    use super::{OperationRequest, VariantRequest};

    /// The shapes of a type: one of the aliases, or a dotted message name (or its type URL).
    pub(crate) const TYPE_PATTERN: &str = r"^(listener|route|cluster|endpoint|secret|runtime|virtual_host|scoped_route|extension_config|(type\.googleapis\.com/)?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+)$";

    fn string(description: &str) -> ObjectBuilder {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(description))
    }

    fn operation(op: &str, description: &str, variants: bool) -> ObjectBuilder {
        let mut object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(description))
            .property(
                "op",
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .enum_values(Some([op])),
            )
            .required("op")
            .property(
                "type",
                string("An alias (`cluster`), a message name or a type URL")
                    .pattern(Some(TYPE_PATTERN)),
            )
            .required("type")
            .property("name", string("The resource name").min_length(Some(1)))
            .required("name")
            .property(
                "expected_version",
                OneOfBuilder::new()
                    .item(ObjectBuilder::new().schema_type(Type::String))
                    .item(
                        ArrayBuilder::new()
                            .items(ObjectBuilder::new().schema_type(Type::String))
                            .min_items(Some(1)),
                    )
                    .item(ObjectBuilder::new().schema_type(Type::Null))
                    .description(Some(
                        "Refuse (409) unless the resource is at this version, or one of these; \
                         `*` for any version (it must exist)",
                    )),
            );
        if variants {
            object = object
                .property(
                    "must_not_exist",
                    ObjectBuilder::new()
                        .schema_type(Type::Boolean)
                        .description(Some(
                            "Refuse (409) if the resource exists: create only. Not with \
                             `expected_version`",
                        )),
                )
                .property(
                    "shared",
                    ObjectBuilder::new()
                        .schema_type(Type::Boolean)
                        .description(Some(
                            "Secrets only: served to any client its variants match, trusted \
                             constraints or not (default false: with an identity template, \
                             only variants bound to the identities they name are served)",
                        )),
                )
                .property(
                    "variants",
                    ArrayBuilder::new()
                        .items(Ref::from_schema_name("VariantRequest"))
                        .min_items(Some(1))
                        .description(Some("The whole new variant set")),
                )
                .required("variants");
        }
        object.additional_properties(Some(AdditionalProperties::FreeForm(false)))
    }

    impl PartialSchema for OperationRequest {
        fn schema() -> RefOr<Schema> {
            OneOfBuilder::new()
                .item(operation(
                    "put",
                    "Replace a resource's whole variant set (creating it if needed)",
                    true,
                ))
                .item(operation("delete", "Delete a resource", false))
                .into()
        }
    }

    impl ToSchema for OperationRequest {
        fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
            schemas.push(("VariantRequest".into(), VariantRequest::schema()));
            <VariantRequest as ToSchema>::schemas(schemas);
        }
    }
}

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

/// Everything the stateless rules found: the operations that passed (so that rules needing
/// stored state can still run on them, and every error be reported at once), every error, and
/// every warning.
#[derive(Clone, Debug)]
pub struct Checked {
    pub changeset: ValidatedChangeset,
    pub errors: Vec<Problem>,
    pub warnings: Vec<Problem>,
}

impl Checked {
    pub fn into_result(self) -> Result<Validated, Invalid> {
        if self.errors.is_empty() {
            Ok(Validated {
                changeset: self.changeset,
                warnings: self.warnings,
            })
        } else {
            Err(Invalid {
                errors: self.errors,
                warnings: self.warnings,
            })
        }
    }
}

/// Runs every stateless rule on `request`, keeping what passed. Each operation's request is
/// dropped once it is validated, so the request and its validated form are not both held whole.
pub fn check(request: ChangesetRequest, config: &ValidationConfig) -> Checked {
    let mut checker = Checker::new(config);
    for op in request.operations {
        checker.push(op);
    }
    checker.finish(ChangesetHeader {
        expected_revision: request.expected_revision,
        dry_run: request.dry_run,
        message: request.message,
    })
}

/// A changeset's fields other than its operations.
#[derive(Clone, Debug, Default)]
pub struct ChangesetHeader {
    pub expected_revision: Option<u64>,
    pub dry_run: bool,
    pub message: Option<String>,
}

/// [`check`] one operation at a time, as they are read: a request body is validated while it is
/// decoded, so that only the validated form of a large changeset (its bodies encoded once) is
/// ever held whole, never the request.
pub struct Checker<'a> {
    validator: Validator<'a>,
    operations: Vec<ValidatedOperation>,
    /// Every operation with a valid key so far, by its key's hash: duplicates are found by key
    /// alone, so that one is reported even when the other operation has problems of its own.
    /// It holds operation indices, not keys (a changeset of 100,000 operations would hold a
    /// second copy of every key): a kept operation's key is in `operations`, a refused one's
    /// in `refused_keys`.
    first_for_key: hashbrown::HashTable<(u64, usize)>,
    refused_keys: HashMap<usize, ResourceKey>,
    hasher: std::hash::RandomState,
    /// Operations pushed, counted past the limit too.
    count: usize,
}

impl std::fmt::Debug for Checker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checker")
            .field("operations", &self.operations.len())
            .field("errors", &self.validator.errors.len())
            .field("count", &self.count)
            .finish()
    }
}

impl<'a> Checker<'a> {
    pub fn new(config: &'a ValidationConfig) -> Self {
        Self::with_capacity(config, 0)
    }

    /// A checker for about `operations` operations, known beforehand (a restore's plan): its
    /// lists are sized once instead of grown by doubling (up to the operation limit).
    pub fn with_capacity(config: &'a ValidationConfig, operations: usize) -> Self {
        let operations = operations.min(config.max_operations);
        Self {
            validator: Validator {
                config,
                errors: Vec::new(),
                warnings: Vec::new(),
            },
            operations: Vec::with_capacity(operations),
            first_for_key: hashbrown::HashTable::with_capacity(operations),
            refused_keys: HashMap::new(),
            hasher: std::hash::RandomState::new(),
            count: 0,
        }
    }

    /// The key of operation `i`, pushed before and holding a valid key.
    fn key_at<'s>(
        operations: &'s [ValidatedOperation],
        refused_keys: &'s HashMap<usize, ResourceKey>,
        i: usize,
    ) -> Option<&'s ResourceKey> {
        match operations.binary_search_by_key(&i, |op| op.index) {
            Ok(at) => Some(&operations[at].key),
            Err(_) => refused_keys.get(&i),
        }
    }

    /// Validates the next operation and keeps what passed. Past the operation limit, only
    /// counts.
    pub fn push(&mut self, op: OperationRequest) {
        let i = self.count;
        self.count += 1;
        let config = self.validator.config;
        if self.count > config.max_operations {
            // Nothing of a refused changeset is needed any more.
            if self.count == config.max_operations + 1 {
                self.operations = Vec::new();
                self.first_for_key = hashbrown::HashTable::new();
                self.refused_keys = HashMap::new();
            }
            return;
        }
        let at = Pointer::root().push("operations").push(i);
        let key = key_of(&op, config);
        let hash = key.as_ref().map(|key| self.hasher.hash_one(key));
        if let (Some(key), Some(hash)) = (&key, hash) {
            let (operations, refused_keys) = (&self.operations, &self.refused_keys);
            let found = self.first_for_key.find(hash, |&(h, j)| {
                h == hash && Self::key_at(operations, refused_keys, j) == Some(key)
            });
            if let Some(&(_, first)) = found {
                self.validator.errors.push(
                    Problem::new(
                        at,
                        "duplicate_operation",
                        format!(
                            "operation {i} repeats the resource of operation {first}; one \
                             operation per resource"
                        ),
                    )
                    .at(i, None),
                );
                return;
            }
        }
        let validated = match &op {
            OperationRequest::Put(put) => self.validator.put(i, put, &at),
            OperationRequest::Delete(delete) => self.validator.delete(i, delete, &at),
        };
        if let (Some(key), Some(hash)) = (key, hash) {
            match &validated {
                // The operation's key is the same rule's answer for the same type and name.
                Some(kept) => debug_assert_eq!(kept.key, key),
                None => {
                    self.refused_keys.insert(i, key);
                }
            }
            self.first_for_key
                .insert_unique(hash, (hash, i), |&(h, _)| h);
        }
        self.operations.extend(validated);
    }

    /// Operations pushed so far.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Problems (errors and warnings) found so far: a caller that wants to name the resource of
    /// each refused operation can tell which pushes found some.
    pub fn problems(&self) -> usize {
        self.validator.errors.len() + self.validator.warnings.len()
    }

    /// Everything found, with the changeset's other fields.
    pub fn finish(self, header: ChangesetHeader) -> Checked {
        let Checker {
            validator: mut v,
            mut operations,
            count,
            ..
        } = self;
        let max = v.config.max_operations;
        if count > max {
            // The same answer however far validation got: only the limit.
            operations = Vec::new();
            v.errors = vec![Problem::new(
                Pointer::root().push("operations"),
                "too_many_operations",
                format!("{count} operations exceed the limit of {max} per changeset"),
            )];
            v.warnings = Vec::new();
        }
        operations.shrink_to_fit();
        Checked {
            changeset: ValidatedChangeset {
                expected_revision: header.expected_revision,
                dry_run: header.dry_run,
                message: header.message,
                operations,
            },
            errors: v.errors,
            warnings: v.warnings,
        }
    }
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

/// The key an operation addresses, if its type and name are valid.
fn key_of(op: &OperationRequest, config: &ValidationConfig) -> Option<ResourceKey> {
    let (spelling, name) = match op {
        OperationRequest::Put(p) => (&p.resource_type, &p.name),
        OperationRequest::Delete(d) => (&d.resource_type, &d.name),
    };
    let ty = ResourceType::resolve(spelling).ok()?;
    let mut scratch = Validator {
        config,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let name = scratch.name(name, &ty, 0, &Pointer::root())?;
    Some(ResourceKey {
        type_url: ty.type_url().into(),
        name,
    })
}

/// The clusters an operation's cluster points to as an aggregate after it; `None` when it has
/// none (deleted, not an aggregate, or not a cluster).
fn aggregate_edges(op: &ValidatedOperation) -> Option<&BTreeSet<String>> {
    match &op.action {
        Action::Put(resource) if op.key.type_url.ends_with(CLUSTER) => resource
            .aggregate_children
            .as_ref()
            .filter(|children| !children.is_empty()),
        _ => None,
    }
}

impl ValidatedChangeset {
    /// Whether this changeset gives some cluster aggregate edges. Only an edge can close a
    /// cycle or deepen a chain: a changeset that adds none (removing edges, deleting clusters,
    /// leaf clusters) cannot break the aggregate graph's rules, and need not load the graph.
    pub fn adds_aggregate_edges(&self) -> bool {
        self.operations
            .iter()
            .any(|op| aggregate_edges(op).is_some())
    }

    /// Takes `edges` (aggregate cluster → the clusters it points to) to what they are after
    /// this changeset: the clusters it touches get their new edges, or none (deleted, or not an
    /// aggregate). Names are copied only for the edges it adds.
    pub fn update_aggregate_edges(&self, edges: &mut BTreeMap<String, BTreeSet<String>>) {
        for op in &self.operations {
            if !op.key.type_url.ends_with(CLUSTER) {
                continue;
            }
            match aggregate_edges(op) {
                Some(children) => edges.insert(op.key.name.clone(), children.clone()),
                None => edges.remove(&op.key.name),
            };
        }
    }

    /// Resources this changeset touches, with the targets of their redirect variants (empty:
    /// none, or deleted).
    pub fn redirect_updates(&self) -> BTreeMap<(String, String), BTreeSet<String>> {
        self.operations
            .iter()
            .map(|op| {
                let targets = match &op.action {
                    Action::Put(resource) => resource.redirects.clone(),
                    Action::Delete => BTreeSet::new(),
                };
                ((op.key.type_url.to_string(), op.key.name.clone()), targets)
            })
            .collect()
    }

    /// The one-hop redirect rule over `edges` (every redirect after this changeset), as
    /// problems pointing at this changeset's operations.
    pub fn redirect_problems(
        &self,
        edges: &BTreeMap<(String, String), BTreeSet<String>>,
    ) -> Vec<Problem> {
        let changed: BTreeSet<(String, String)> = self.redirect_updates().into_keys().collect();
        crate::collections::check_redirect_graph(edges, &changed)
            .into_iter()
            .map(|p| {
                let op = self
                    .operations
                    .iter()
                    .find(|op| op.key.type_url == p.source.0 && op.key.name == p.source.1)
                    .map_or(0, |op| op.index);
                Problem::new(
                    Pointer::root().push("operations").push(op),
                    p.code,
                    p.message,
                )
                .at(op, None)
            })
            .collect()
    }

    /// The aggregate-graph rules over `edges` (the whole graph after this changeset), as
    /// problems pointing at this changeset's cluster operations.
    pub fn graph_problems(&self, edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Problem> {
        // A problem lies on the graph: of the clusters this changeset touches, only those in
        // it are copied (a changeset of 100,000 clusters would otherwise copy every name).
        let nodes: BTreeSet<&str> = edges
            .iter()
            .flat_map(|(parent, children)| std::iter::once(parent).chain(children))
            .map(String::as_str)
            .collect();
        let changed: BTreeSet<String> = self
            .operations
            .iter()
            .filter(|op| op.key.type_url.ends_with(CLUSTER) && nodes.contains(op.key.name.as_str()))
            .map(|op| op.key.name.clone())
            .collect();
        drop(nodes);
        rules::check_aggregate_graph(edges, &changed)
            .into_iter()
            .map(
                |GraphProblem {
                     cluster,
                     code,
                     message,
                 }| {
                    let op = self
                        .operations
                        .iter()
                        .find(|op| op.key.type_url.ends_with(CLUSTER) && op.key.name == cluster)
                        .map_or(0, |op| op.index);
                    Problem::new(Pointer::root().push("operations").push(op), code, message)
                        .at(op, None)
                },
            )
            .collect()
    }
}

#[cfg(test)]
mod tests;
