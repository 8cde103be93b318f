//! The request model: a changeset as REST, the CLI and fixture files write it
//! ([`ChangesetRequest`], its put and delete operations, their variants), and the hand-written
//! OpenAPI schema of an operation.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ExpectedVersion, RawJson};

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
