//! Changesets, the unit of write, and their validation.
//!
//! The request model ([`ChangesetRequest`], [`PutRequest`], ...) is what the REST API, the CLI
//! and fixture files all speak. [`validate`] runs every rule that needs no stored state — types,
//! names, constraints, the variant-set rules, bodies, type-specific rules — and reports every
//! problem, each with a JSON pointer into the request. The store adds the rules that need its
//! state (expected versions, the aggregate-cluster graph across the store) under its write lock,
//! through [`ValidatedChangeset::graph_problems`].

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use vxds_core::variants::{self, VariantLimits, VariantSetError};
use vxds_core::xdstp::{self, ResourceName};
use vxds_core::{CanonicalConstraints, Constraints, Limits, ParamSet};

use crate::constraints::constraints_from_json;
use crate::pointer::Pointer;
use crate::resource::{Body, CLUSTER, ResourceType, SECRET, content_hash};
use crate::rules::{self, GraphProblem};

mod precondition;
mod raw;
mod ttl;

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
                variants: fields.variants.ok_or("missing field `variants`")?,
            })),
            OperationKind::Delete => {
                for (present, field) in [
                    (fields.variants.is_some(), "variants"),
                    (fields.must_not_exist.is_some(), "must_not_exist"),
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
    /// The body: proto3 JSON with `@type`.
    // Kept as text until it is validated: see `RawJson`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub resource: RawJson,
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

/// What identifies a resource: its type URL and its name (xdstp names in normal form).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ResourceKey {
    pub type_url: String,
    pub name: String,
}

/// Rules that are configuration rather than protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationConfig {
    pub limits: Limits,
    pub variant_limits: VariantLimits,
    /// xdstp authorities this server serves; empty allows any.
    pub authorities: Vec<String>,
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
            max_operations: 10_000,
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
    Put(ValidatedResource),
    Delete,
}

/// A resource's new variant set, with versions computed.
#[derive(Clone, Debug)]
pub struct ValidatedResource {
    pub variants: Vec<ValidatedVariant>,
    /// Hash of the variants' ids and versions, in order.
    pub version: String,
    /// For clusters: the clusters its aggregate variants point to (empty for other kinds).
    pub aggregate_children: Option<BTreeSet<String>>,
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
    let mut v = Validator {
        config,
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    let ops_at = Pointer::root().push("operations");
    let mut operations = Vec::with_capacity(request.operations.len().min(config.max_operations));
    if request.operations.len() > config.max_operations {
        v.errors.push(Problem::new(
            ops_at,
            "too_many_operations",
            format!(
                "{} operations exceed the limit of {} per changeset",
                request.operations.len(),
                config.max_operations
            ),
        ));
    } else {
        // Duplicates are found by key alone, so that one is reported even when the other
        // operation has problems of its own.
        let mut first_for_key: HashMap<ResourceKey, usize> = HashMap::new();
        for (i, op) in request.operations.into_iter().enumerate() {
            let at = ops_at.push(i);
            if let Some(key) = key_of(&op, config) {
                if let Some(&first) = first_for_key.get(&key) {
                    v.errors.push(
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
                    continue;
                }
                first_for_key.insert(key, i);
            }
            let validated = match &op {
                OperationRequest::Put(put) => v.put(i, put, &at),
                OperationRequest::Delete(delete) => v.delete(i, delete, &at),
            };
            operations.extend(validated);
        }
    }
    let changeset = ValidatedChangeset {
        expected_revision: request.expected_revision,
        dry_run: request.dry_run,
        message: request.message,
        operations,
    };
    Checked {
        changeset,
        errors: v.errors,
        warnings: v.warnings,
    }
}

/// [`check`] for a request that stands for a whole store (fixture files checked offline): the
/// aggregate-cluster graph is checked over the request's own clusters as well.
pub fn validate_standalone(
    request: &ChangesetRequest,
    config: &ValidationConfig,
) -> Result<Validated, Invalid> {
    let mut checked = check(request.clone(), config);
    let edges: BTreeMap<String, BTreeSet<String>> = checked
        .changeset
        .aggregate_updates()
        .into_iter()
        .filter_map(|(name, children)| children.map(|c| (name, c)))
        .collect();
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
        type_url: ty.type_url().to_owned(),
        name,
    })
}

impl ValidatedChangeset {
    /// Clusters this changeset touches, with their new aggregate edges (`None`: no edges, the
    /// cluster is deleted or not an aggregate).
    pub fn aggregate_updates(&self) -> BTreeMap<String, Option<BTreeSet<String>>> {
        self.operations
            .iter()
            .filter(|op| op.key.type_url.ends_with(CLUSTER))
            .map(|op| {
                let children = match &op.action {
                    Action::Put(resource) => resource
                        .aggregate_children
                        .clone()
                        .filter(|c| !c.is_empty()),
                    Action::Delete => None,
                };
                (op.key.name.clone(), children)
            })
            .collect()
    }

    /// The aggregate-graph rules over `edges` (the whole graph after this changeset), as
    /// problems pointing at this changeset's cluster operations.
    pub fn graph_problems(&self, edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Problem> {
        let changed: BTreeSet<String> = self.aggregate_updates().into_keys().collect();
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

struct Validator<'a> {
    config: &'a ValidationConfig,
    errors: Vec<Problem>,
    warnings: Vec<Problem>,
}

impl Validator<'_> {
    fn error(&mut self, problem: Problem) {
        self.errors.push(problem);
    }

    fn resource_type(&mut self, spelling: &str, i: usize, at: &Pointer) -> Option<ResourceType> {
        match ResourceType::resolve(spelling) {
            Ok(ty) => Some(ty),
            Err(e) => {
                self.error(
                    Problem::new(at.push("type"), "unknown_type", e.to_string()).at(i, None),
                );
                None
            }
        }
    }

    fn precondition(
        &mut self,
        expected: Option<&ExpectedVersion>,
        must_not_exist: bool,
        i: usize,
        at: &Pointer,
    ) -> Option<Precondition> {
        match Precondition::from_request(expected, must_not_exist, at) {
            Ok(p) => Some(p),
            Err(problem) => {
                self.error((*problem).at(i, None));
                None
            }
        }
    }

    /// The resource name in normal form.
    fn name(&mut self, name: &str, ty: &ResourceType, i: usize, at: &Pointer) -> Option<String> {
        let at = at.push("name");
        let fail =
            |code: &str, message: String| Problem::new(at.clone(), code, message).at(i, None);
        if name.is_empty() {
            self.error(fail(
                "empty_name",
                "a resource name must not be empty".into(),
            ));
            return None;
        }
        if name.len() > xdstp::MAX_NAME_LEN {
            self.error(fail(
                "name_too_long",
                format!(
                    "the name is {} bytes long; the limit is {}",
                    name.len(),
                    xdstp::MAX_NAME_LEN
                ),
            ));
            return None;
        }
        if let Some(c) = name.chars().find(|c| c.is_control()) {
            self.error(fail(
                "invalid_name",
                format!("the name contains the control character U+{:04X}", c as u32),
            ));
            return None;
        }
        match ResourceName::parse(name) {
            Ok(ResourceName::Opaque(name)) => Some(name),
            Ok(ResourceName::Xdstp(urn)) => {
                let checked = urn
                    .check_type(ty.type_url())
                    .and_then(|()| urn.check_authority(&self.config.authorities));
                match checked {
                    Ok(()) => Some(urn.to_string()),
                    Err(e) => {
                        self.error(fail(e.code(), e.to_string()));
                        None
                    }
                }
            }
            Err(e) => {
                self.error(fail(e.code(), e.to_string()));
                None
            }
        }
    }

    fn delete(
        &mut self,
        i: usize,
        delete: &DeleteRequest,
        at: &Pointer,
    ) -> Option<ValidatedOperation> {
        let ty = self.resource_type(&delete.resource_type, i, at);
        let name = ty
            .as_ref()
            .and_then(|ty| self.name(&delete.name, ty, i, at));
        let precondition = self.precondition(delete.expected_version.as_ref(), false, i, at);
        Some(ValidatedOperation {
            index: i,
            key: ResourceKey {
                type_url: ty?.type_url().to_owned(),
                name: name?,
            },
            precondition: precondition?,
            action: Action::Delete,
        })
    }

    fn put(&mut self, i: usize, put: &PutRequest, at: &Pointer) -> Option<ValidatedOperation> {
        let errors_before = self.errors.len();
        let ty = self.resource_type(&put.resource_type, i, at)?;
        let name = self.name(&put.name, &ty, i, at);
        let precondition =
            self.precondition(put.expected_version.as_ref(), put.must_not_exist, i, at);
        let variants_at = at.push("variants");
        let max = self.config.variant_limits.max_variants;
        if put.variants.is_empty() {
            self.error(
                Problem::new(
                    variants_at,
                    "no_variants",
                    "a resource needs at least one variant; delete it instead",
                )
                .at(i, None),
            );
            return None;
        }
        if put.variants.len() > max {
            self.error(
                Problem::new(
                    variants_at,
                    "too_many_variants",
                    format!(
                        "{} variants exceed the limit of {max} per resource",
                        put.variants.len()
                    ),
                )
                .at(i, None),
            );
            return None;
        }
        let mut parsed = Vec::with_capacity(put.variants.len());
        for (j, variant) in put.variants.iter().enumerate() {
            let at = variants_at.push(j);
            let constraints = self.constraints(&variant.constraints, i, j, &at.push("constraints"));
            let body = self.body(
                &variant.resource,
                &ty,
                name.as_deref(),
                i,
                j,
                &at.push("resource"),
            );
            let ttl = variant.ttl.as_deref().and_then(|text| {
                ttl::parse(text)
                    .map_err(|message| {
                        let problem = Problem::new(at.push("ttl"), "invalid_ttl", message);
                        self.error(problem.at(i, Some(j)));
                    })
                    .ok()
            });
            parsed.push((constraints, (body, ttl)));
        }
        // The set rules need every variant's constraints.
        let canonical: Option<Vec<CanonicalConstraints>> = parsed
            .iter()
            .map(|(c, _)| c.as_ref().map(Constraints::canonical))
            .collect();
        if let Some(canonical) = &canonical {
            self.variant_set(canonical, i, &variants_at);
            if ty.message_name() == SECRET {
                self.secret_access(canonical, i, &variants_at);
            }
        }
        if self.errors.len() > errors_before {
            return None;
        }
        let name = name?;
        let canonical = canonical?;
        let mut variants = Vec::with_capacity(parsed.len());
        let mut children: Option<BTreeSet<String>> = None;
        for (constraints, (_, (body, ttl))) in canonical.into_iter().zip(parsed) {
            let (body, aggregate) = body?;
            if ty.message_name() == CLUSTER {
                children
                    .get_or_insert_default()
                    .extend(aggregate.into_iter().flatten());
            }
            let constraints_text = constraints.to_string();
            let mut parts: Vec<&[u8]> = vec![
                ty.type_url().as_bytes(),
                constraints_text.as_bytes(),
                body.canonical_json.as_bytes(),
            ];
            // A TTL is part of what the client is sent, so a new TTL is a new version; a
            // variant without one keeps the version it always had.
            let ttl_ms = ttl.map(|t| t.as_millis().to_string());
            if let Some(ttl_ms) = &ttl_ms {
                parts.push(b"ttl");
                parts.push(ttl_ms.as_bytes());
            }
            let version = content_hash("vxds.variant.v1", &parts);
            variants.push(ValidatedVariant {
                constraints,
                body: body.any_bytes,
                version,
                ttl,
            });
        }
        let mut parts: Vec<&[u8]> = vec![ty.type_url().as_bytes(), name.as_bytes()];
        let ids: Vec<String> = variants
            .iter()
            .map(|v| v.constraints.id().to_string())
            .collect();
        for (id, variant) in ids.iter().zip(&variants) {
            parts.push(id.as_bytes());
            parts.push(variant.version.as_bytes());
        }
        let version = content_hash("vxds.resource.v1", &parts);
        Some(ValidatedOperation {
            index: i,
            key: ResourceKey {
                type_url: ty.type_url().to_owned(),
                name,
            },
            precondition: precondition?,
            action: Action::Put(ValidatedResource {
                variants,
                version,
                aggregate_children: children,
            }),
        })
    }

    fn constraints(
        &mut self,
        json: &Value,
        i: usize,
        j: usize,
        at: &Pointer,
    ) -> Option<Constraints> {
        let limits = &self.config.limits;
        let result = match json {
            Value::Null => Ok(Constraints::unconstrained()),
            Value::String(text) => Constraints::parse(text, limits)
                .map_err(|e| Problem::new(at.clone(), "invalid_constraints", e.to_string())),
            Value::Object(_) => constraints_from_json(json, limits).map_err(|e| {
                // Limit errors carry a pointer inside the constraints message.
                let pointer = match &e {
                    crate::constraints::ConstraintsJsonError::Invalid(inner) => {
                        Pointer::parse(&inner.path).map_or(at.clone(), |p| at.join(&p))
                    }
                    crate::constraints::ConstraintsJsonError::Json(_) => at.clone(),
                };
                let message = match &e {
                    crate::constraints::ConstraintsJsonError::Invalid(inner) => {
                        inner.kind.to_string()
                    }
                    other => other.to_string(),
                };
                Problem::new(pointer, e.code(), message)
            }),
            _ => Err(Problem::new(
                at.clone(),
                "invalid_constraints",
                "constraints are compact text, a DynamicParameterConstraints object, or null",
            )),
        };
        match result {
            Ok(c) => Some(c),
            Err(problem) => {
                self.error(problem.at(i, Some(j)));
                None
            }
        }
    }

    /// The body and, for aggregate clusters, the clusters it points to.
    fn body(
        &mut self,
        json: &RawJson,
        ty: &ResourceType,
        name: Option<&str>,
        i: usize,
        j: usize,
        at: &Pointer,
    ) -> Option<(Body, Option<Vec<String>>)> {
        let body = match Body::from_json(json.get(), ty) {
            Ok(body) => body,
            Err(e) => {
                self.error(Problem::new(at.join(&e.pointer), e.code, e.message).at(i, Some(j)));
                return None;
            }
        };
        let mut ok = true;
        if let (Some(field), Some(name)) = (ty.name_field(), name) {
            let own = body.name(ty).unwrap_or_default();
            let own_normal = xdstp::normalize(&own)
                .map(|n| n.into_owned())
                .unwrap_or(own.clone());
            if own_normal != name {
                let message = if own.is_empty() {
                    format!(
                        "the body's `{}` is empty; it must be the resource name `{name}`",
                        field.name()
                    )
                } else {
                    format!(
                        "the body's `{}` is `{own}` but the resource is named `{name}`",
                        field.name()
                    )
                };
                self.error(
                    Problem::new(at.push(field.name()), "name_mismatch", message).at(i, Some(j)),
                );
                ok = false;
            }
        }
        let mut aggregate = None;
        if ty.message_name() == CLUSTER {
            let report = rules::check_cluster(&body);
            for e in report.errors {
                self.error(Problem::new(at.join(&e.pointer), e.code, e.message).at(i, Some(j)));
                ok = false;
            }
            for w in report.warnings {
                self.warnings
                    .push(Problem::new(at.join(&w.pointer), w.code, w.message).at(i, Some(j)));
            }
            aggregate = report.aggregate_children;
        }
        ok.then_some((body, aggregate))
    }

    /// With trusted keys configured, a secret's variants should each hold only for the
    /// identities they name: one that a client of any other identity can match, with the
    /// untrusted parameters it claims, is served to clients it was not meant for.
    fn secret_access(&mut self, variants: &[CanonicalConstraints], i: usize, at: &Pointer) {
        let trusted = &self.config.trusted_keys;
        for (j, constraints) in variants.iter().enumerate() {
            let Some(witness) = vxds_core::identity::open_to_any_identity(
                constraints,
                trusted,
                &self.config.variant_limits,
            ) else {
                continue;
            };
            let mut problem = Problem::new(
                at.push(j).push("constraints"),
                "untrusted_secret_variant",
                format!(
                    "variant {j} of this secret matches clients whose certificates vouch for \
                     none of the values it names ({}), so any client can obtain it",
                    trusted.join(", ")
                ),
            )
            .at(i, Some(j));
            problem.witness = Some(witness);
            self.warnings.push(problem);
        }
    }

    fn variant_set(&mut self, variants: &[CanonicalConstraints], i: usize, at: &Pointer) {
        let limits = &self.config.variant_limits;
        if let Err(errors) = variants::validate_variant_set(variants, limits) {
            for e in errors {
                let pointer = match e.variant() {
                    Some(j) => at.push(j).push("constraints"),
                    None => at.clone(),
                };
                let witness = e.witness().cloned();
                let mut problem = Problem::new(pointer, e.code(), e.to_string()).at(i, e.variant());
                problem.witness = witness;
                self.error(problem);
            }
        }
        // A variant no client can match is legal, and almost certainly a mistake.
        match variants::never_matching(variants, limits) {
            Ok(dead) => {
                for j in dead {
                    self.warnings.push(
                        Problem::new(
                            at.push(j).push("constraints"),
                            "never_matches",
                            format!(
                                "variant {j}'s constraints `{}` match no parameter set",
                                variants[j]
                            ),
                        )
                        .at(i, Some(j)),
                    );
                }
            }
            Err(VariantSetError::TooComplex { .. } | VariantSetError::TooManyKeys { .. }) => {}
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn route(name: &str) -> Value {
        json!({"@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", "name": name})
    }

    fn put(ty: &str, name: &str, variants: Vec<(Value, Value)>) -> OperationRequest {
        OperationRequest::Put(PutRequest {
            resource_type: ty.into(),
            name: name.into(),
            expected_version: None,
            must_not_exist: false,
            variants: variants
                .into_iter()
                .map(|(constraints, resource)| VariantRequest {
                    constraints,
                    resource: resource.into(),
                    ttl: None,
                })
                .collect(),
        })
    }

    fn run(ops: Vec<OperationRequest>) -> Result<Validated, Invalid> {
        validate(
            &ChangesetRequest {
                operations: ops,
                ..Default::default()
            },
            &ValidationConfig::default(),
        )
    }

    fn problems(ops: Vec<OperationRequest>) -> Vec<(String, String)> {
        run(ops)
            .unwrap_err()
            .errors
            .into_iter()
            .map(|p| (p.pointer.to_string(), p.code))
            .collect()
    }

    #[test]
    fn accepts_variants_in_text_json_and_null() {
        let ok = run(vec![put(
            "route",
            "r",
            vec![
                (json!(r#"env = "prod""#), route("r")),
                (
                    json!({"constraint": {"key": "env", "value": "test"}}),
                    route("r"),
                ),
            ],
        )])
        .unwrap();
        let Action::Put(resource) = &ok.changeset.operations[0].action else {
            panic!()
        };
        assert_eq!(resource.variants.len(), 2);
        assert_eq!(resource.version.len(), 16);
        assert_ne!(resource.variants[0].version, resource.variants[1].version);
        assert_eq!(
            ok.changeset.operations[0].key.type_url,
            "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
        );
        assert!(run(vec![put("route", "r", vec![(json!(null), route("r"))])]).is_ok());
    }

    #[test]
    fn versions_are_content_hashes() {
        let a = run(vec![put(
            "route",
            "r",
            vec![(json!("env = a"), route("r"))],
        )])
        .unwrap();
        let b = run(vec![put(
            "route",
            "r",
            vec![(json!(r#"env == "a""#), route("r"))],
        )])
        .unwrap();
        let version = |v: &Validated| match &v.changeset.operations[0].action {
            Action::Put(r) => r.version.clone(),
            Action::Delete => unreachable!(),
        };
        assert_eq!(version(&a), version(&b));
        let c = run(vec![put(
            "route",
            "r",
            vec![(json!("env = b"), route("r"))],
        )])
        .unwrap();
        assert_ne!(version(&a), version(&c));
    }

    #[test]
    fn ttl_is_validated_and_versioned() {
        let with_ttl = |ttl: &str| {
            let mut op = put("route", "r", vec![(json!(null), route("r"))]);
            if let OperationRequest::Put(put) = &mut op {
                put.variants[0].ttl = Some(ttl.into());
            }
            op
        };
        let variant = |v: &Validated| match &v.changeset.operations[0].action {
            Action::Put(r) => r.variants[0].clone(),
            Action::Delete => unreachable!(),
        };
        let plain =
            variant(&run(vec![put("route", "r", vec![(json!(null), route("r"))])]).unwrap());
        let thirty = variant(&run(vec![with_ttl("30s")]).unwrap());
        assert_eq!(plain.ttl, None);
        assert_eq!(thirty.ttl, Some(std::time::Duration::from_secs(30)));
        assert_ne!(plain.version, thirty.version);
        assert_ne!(
            thirty.version,
            variant(&run(vec![with_ttl("31s")]).unwrap()).version
        );
        let errors = run(vec![with_ttl("0s")]).unwrap_err().errors;
        assert_eq!(errors[0].code, "invalid_ttl");
        assert_eq!(
            errors[0].pointer.to_string(),
            "/operations/0/variants/0/ttl"
        );
    }

    #[test]
    fn reports_every_problem_with_its_pointer() {
        let errors = problems(vec![
            put("nope", "x", vec![(json!(null), route("x"))]),
            put("route", "", vec![(json!("env = "), json!({"name": "y"}))]),
            put(
                "route",
                "r",
                vec![
                    (json!("env in (a, b)"), route("r")),
                    (json!("env in (b, c)"), route("r")),
                ],
            ),
            put("route", "r2", vec![(json!(null), route("other"))]),
            put("route", "r3", vec![]),
            OperationRequest::Delete(DeleteRequest {
                resource_type: "route".into(),
                name: "r".into(),
                expected_version: None,
            }),
        ]);
        assert_eq!(
            errors,
            vec![
                ("/operations/0/type".into(), "unknown_type".into()),
                ("/operations/1/name".into(), "empty_name".into()),
                (
                    "/operations/1/variants/0/constraints".into(),
                    "invalid_constraints".into()
                ),
                (
                    "/operations/1/variants/0/resource/@type".into(),
                    "missing_type".into()
                ),
                (
                    "/operations/2/variants/1/constraints".into(),
                    "overlapping_variants".into()
                ),
                (
                    "/operations/3/variants/0/resource/name".into(),
                    "name_mismatch".into()
                ),
                ("/operations/4/variants".into(), "no_variants".into()),
                ("/operations/5".into(), "duplicate_operation".into()),
            ]
        );
        let overlap = run(vec![put(
            "route",
            "r",
            vec![
                (json!("env in (a, b)"), route("r")),
                (json!("env in (b, c)"), route("r")),
            ],
        )])
        .unwrap_err();
        assert_eq!(
            overlap.errors[0].witness,
            Some([("env", "b")].into_iter().collect())
        );
        assert_eq!(
            (overlap.errors[0].operation, overlap.errors[0].variant),
            (Some(0), Some(1))
        );
    }

    #[test]
    fn json_constraint_errors_point_inside_the_constraints() {
        let errors = problems(vec![put(
            "route",
            "r",
            vec![(
                json!({"and_constraints": {"constraints": [{"constraint": {"key": "", "value": "x"}}]}}),
                route("r"),
            )],
        )]);
        assert_eq!(
            errors,
            vec![(
                "/operations/0/variants/0/constraints/and_constraints/constraints/0/constraint/key"
                    .into(),
                "empty_key".into()
            )]
        );
    }

    #[test]
    fn xdstp_names_are_normalised_and_checked() {
        let name = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?b=2&a=1";
        let ok = run(vec![put("route", name, vec![(json!(null), route(name))])]).unwrap();
        assert_eq!(
            ok.changeset.operations[0].key.name,
            "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?a=1&b=2"
        );
        let wrong_type = "xdstp://auth/envoy.config.cluster.v3.Cluster/r";
        assert_eq!(
            problems(vec![put(
                "route",
                wrong_type,
                vec![(json!(null), route(wrong_type))]
            )]),
            vec![("/operations/0/name".into(), "xdstp_type_mismatch".into())]
        );
        let config = ValidationConfig {
            authorities: vec!["auth".into()],
            ..Default::default()
        };
        let other = "xdstp://elsewhere/envoy.config.route.v3.RouteConfiguration/r";
        let request = ChangesetRequest {
            operations: vec![put("route", other, vec![(json!(null), route(other))])],
            ..Default::default()
        };
        assert_eq!(
            validate(&request, &config).unwrap_err().errors[0].code,
            "unknown_authority"
        );
    }

    #[test]
    fn standalone_validation_checks_the_aggregate_graph() {
        let agg = |name: &str, children: &[&str]| {
            put(
                "cluster",
                name,
                vec![(
                    json!(null),
                    json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": name,
                           "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
                               "@type": rules::AGGREGATE_CONFIG_TYPE_URL, "clusters": children}}}),
                )],
            )
        };
        let request = ChangesetRequest {
            operations: vec![agg("a", &["b"]), agg("b", &["a"])],
            ..Default::default()
        };
        assert!(validate(&request, &ValidationConfig::default()).is_ok());
        let invalid = validate_standalone(&request, &ValidationConfig::default()).unwrap_err();
        assert_eq!(invalid.errors.len(), 1);
        assert_eq!(invalid.errors[0].code, "aggregate_cycle");
        assert_eq!(invalid.errors[0].pointer.to_string(), "/operations/0");
    }

    #[test]
    fn warnings_do_not_refuse() {
        let ok = run(vec![put(
            "cluster",
            "s",
            vec![(json!(null), json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "s", "type": "STATIC"}))],
        )])
        .unwrap();
        assert_eq!(ok.warnings[0].code, "not_for_grpc");
        let dead = run(vec![put(
            "route",
            "r",
            vec![(json!("env = a && env = b"), route("r"))],
        )])
        .unwrap();
        assert_eq!(dead.warnings[0].code, "never_matches");
    }

    #[test]
    fn secrets_not_keyed_on_a_trusted_key_are_flagged() {
        let secret = |name: &str| json!({"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", "name": name});
        let request = ChangesetRequest {
            operations: vec![
                put(
                    "secret",
                    "tls",
                    vec![
                        (json!(r#"namespace = "shop""#), secret("tls")),
                        (json!(r#"namespace != "shop""#), secret("tls")),
                    ],
                ),
                put("secret", "open", vec![(json!(null), secret("open"))]),
            ],
            ..Default::default()
        };
        let config = ValidationConfig {
            trusted_keys: vec!["namespace".into()],
            ..Default::default()
        };
        let validated = validate(&request, &config).unwrap();
        let flagged: Vec<&str> = validated
            .warnings
            .iter()
            .map(|w| w.pointer.as_str())
            .collect();
        // `namespace != "shop"` reaches every other namespace, and the unconstrained one all.
        assert_eq!(
            flagged,
            [
                "/operations/0/variants/1/constraints",
                "/operations/1/variants/0/constraints"
            ]
        );
        assert_eq!(validated.warnings[0].code, "untrusted_secret_variant");
        assert!(validated.warnings[0].witness.is_some());
        // Without a template nothing is trusted, and nothing is flagged.
        let plain = validate(&request, &ValidationConfig::default()).unwrap();
        assert!(plain.warnings.is_empty(), "{:?}", plain.warnings);
    }

    #[test]
    fn request_model_reads_the_documented_shape() {
        let request: ChangesetRequest = serde_json::from_value(json!({
            "expected_revision": 3,
            "message": "split prod",
            "operations": [
                {"op": "put", "type": "route", "name": "r", "variants": [{"constraints": "env = prod", "resource": route("r")}]},
                {"op": "delete", "type": "cluster", "name": "old"}
            ]
        }))
        .unwrap();
        assert_eq!(request.expected_revision, Some(3));
        assert!(matches!(request.operations[1], OperationRequest::Delete(_)));
        let bad: Result<ChangesetRequest, _> = serde_json::from_value(
            json!({"operations": [{"op": "put", "type": "r", "name": "r", "variants": [], "extra": 1}]}),
        );
        assert!(bad.is_err());
    }
}
