//! What a resource is: its type (any message of the Envoy API, by alias or full name), its body
//! in proto3 JSON with `@type` and in binary `google.protobuf.Any`, and the name its body carries.

use std::fmt;

use prost_reflect::ReflectMessage as _;

use crate::collections::{RESOURCE_LOCATOR, RESOURCE_LOCATOR_TYPE_URL};

use prost::Message;
use prost_reflect::{
    DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor, SerializeOptions,
    Value as ReflectValue,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::descriptors;
use crate::pointer::{Pointer, pointer_from_serde_path};

pub const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

/// Short names for the types xDS serves, as the REST API and fixtures accept them.
pub const ALIASES: [(&str, &str); 9] = [
    ("listener", "envoy.config.listener.v3.Listener"),
    ("route", "envoy.config.route.v3.RouteConfiguration"),
    ("cluster", "envoy.config.cluster.v3.Cluster"),
    ("endpoint", "envoy.config.endpoint.v3.ClusterLoadAssignment"),
    ("secret", "envoy.extensions.transport_sockets.tls.v3.Secret"),
    ("runtime", "envoy.service.runtime.v3.Runtime"),
    ("virtual_host", "envoy.config.route.v3.VirtualHost"),
    (
        "scoped_route",
        "envoy.config.route.v3.ScopedRouteConfiguration",
    ),
    (
        "extension_config",
        "envoy.config.core.v3.TypedExtensionConfig",
    ),
];

pub const CLUSTER: &str = "envoy.config.cluster.v3.Cluster";
pub const SECRET: &str = "envoy.extensions.transport_sockets.tls.v3.Secret";
pub const LISTENER: &str = "envoy.config.listener.v3.Listener";
pub const ROUTE_CONFIGURATION: &str = "envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER_LOAD_ASSIGNMENT: &str = "envoy.config.endpoint.v3.ClusterLoadAssignment";

/// A resource type vxds can store and serve: a message of the Envoy API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceType {
    descriptor: MessageDescriptor,
    type_url: String,
}

impl ResourceType {
    /// From an alias (`cluster`), a message name (`envoy.config.cluster.v3.Cluster`) or a
    /// type URL (`type.googleapis.com/envoy.config.cluster.v3.Cluster`).
    pub fn resolve(spelling: &str) -> Result<Self, UnknownType> {
        let name = ALIASES
            .iter()
            .find(|(alias, _)| *alias == spelling)
            .map(|(_, name)| *name)
            .unwrap_or_else(|| spelling.strip_prefix(TYPE_URL_PREFIX).unwrap_or(spelling));
        let descriptor =
            descriptors::message(name).ok_or_else(|| UnknownType(spelling.to_owned()))?;
        Ok(Self {
            type_url: format!("{TYPE_URL_PREFIX}{}", descriptor.full_name()),
            descriptor,
        })
    }

    pub fn type_url(&self) -> &str {
        &self.type_url
    }

    /// The protobuf message name, e.g. `envoy.config.cluster.v3.Cluster`.
    pub fn message_name(&self) -> &str {
        self.descriptor.full_name()
    }

    /// The short alias of a type URL (or of an alias), for the types that have one: a table
    /// lookup, without resolving the descriptor (an answer of 100,000 changes asks it of each).
    pub fn alias_of(spelling: &str) -> Option<&'static str> {
        let name = spelling.strip_prefix(TYPE_URL_PREFIX).unwrap_or(spelling);
        ALIASES
            .iter()
            .find(|(alias, message)| *message == name || *alias == spelling)
            .map(|(alias, _)| *alias)
    }

    /// The short alias, for the types that have one.
    pub fn alias(&self) -> Option<&'static str> {
        ALIASES
            .iter()
            .find(|(_, name)| *name == self.message_name())
            .map(|(alias, _)| *alias)
    }

    pub fn descriptor(&self) -> &MessageDescriptor {
        &self.descriptor
    }

    /// The body field that must equal the resource name: `name`, or `cluster_name` for
    /// endpoints; `None` for types without one.
    pub fn name_field(&self) -> Option<FieldDescriptor> {
        let field = if self.message_name() == CLUSTER_LOAD_ASSIGNMENT {
            "cluster_name"
        } else {
            "name"
        };
        self.descriptor
            .get_field_by_name(field)
            .filter(|f| matches!(f.kind(), Kind::String) && !f.is_list() && !f.is_map())
    }
}

impl fmt::Display for ResourceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.type_url)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown resource type `{0}`: use an alias (listener, route, cluster, endpoint, secret, \
     runtime, virtual_host, scoped_route, extension_config) or a message name of the Envoy API"
)]
pub struct UnknownType(pub String);

/// A resource body: a `google.protobuf.Any` holding a message of the resource's type.
#[derive(Clone, Debug)]
pub struct Body {
    /// The inner message, decoded.
    pub message: DynamicMessage,
    /// The encoded `google.protobuf.Any`, as stored and served.
    pub any_bytes: Vec<u8>,
    /// The encoded inner message (the Any's `value`).
    pub value_bytes: Vec<u8>,
    /// Proto3 JSON with sorted keys: the bytes the content version is computed over, identical
    /// on every replica whatever order map fields were encoded in.
    pub canonical_json: String,
}

/// A body that does not parse; `pointer` is relative to the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BodyError {
    pub pointer: Pointer,
    pub code: &'static str,
    pub message: String,
}

impl Body {
    /// Parses proto3 JSON text (or YAML turned into JSON) with `@type`, which must be `ty`.
    /// Straight from the text into the message: no JSON tree is built.
    pub fn from_json(text: &str, ty: &ResourceType) -> Result<Self, BodyError> {
        /// The `@type` alone; every other field is skipped without being kept.
        #[derive(serde::Deserialize)]
        struct Head<'a> {
            #[serde(rename = "@type", borrow, default)]
            at_type: Option<std::borrow::Cow<'a, str>>,
        }
        let head = serde_json::from_str::<Head>(text).ok();
        let at_type = head
            .as_ref()
            .and_then(|h| h.at_type.as_deref())
            .ok_or_else(|| BodyError {
                pointer: Pointer::root().push("@type"),
                code: "missing_type",
                message: format!("a resource body needs `\"@type\": \"{}\"`", ty.type_url()),
            })?;
        if at_type != ty.type_url() && at_type != RESOURCE_LOCATOR_TYPE_URL {
            return Err(BodyError {
                pointer: Pointer::root().push("@type"),
                code: "type_mismatch",
                message: format!(
                    "`@type` is `{at_type}` but the resource's type is `{}`",
                    ty.type_url()
                ),
            });
        }
        let any_descriptor =
            descriptors::message("google.protobuf.Any").expect("Any is in the pool");
        let mut track = serde_path_to_error::Track::new();
        let mut json = serde_json::Deserializer::from_str(text);
        let parsed = DynamicMessage::deserialize_with_options(
            any_descriptor,
            serde_path_to_error::Deserializer::new(&mut json, &mut track),
            &DeserializeOptions::new().deny_unknown_fields(true),
        )
        .and_then(|any| json.end().map(|()| any));
        let any = parsed.map_err(|e| BodyError {
            pointer: pointer_from_serde_path(&track.path()),
            code: "invalid_body",
            message: e.to_string(),
        })?;
        let any_bytes = any.encode_to_vec();
        Self::from_any_bytes(any_bytes, ty)
    }

    /// [`Self::from_json`] for a JSON tree.
    pub fn from_value(json: &Value, ty: &ResourceType) -> Result<Self, BodyError> {
        Self::from_json(&json.to_string(), ty)
    }

    /// Decodes a stored `google.protobuf.Any`.
    pub fn from_any_bytes(any_bytes: Vec<u8>, ty: &ResourceType) -> Result<Self, BodyError> {
        let invalid = |message: String| BodyError {
            pointer: Pointer::root(),
            code: "invalid_body",
            message,
        };
        let any =
            prost_types::Any::decode(any_bytes.as_slice()).map_err(|e| invalid(e.to_string()))?;
        let ty = &body_type(ty, &any.type_url)
            .ok_or_else(|| invalid(format!("holds `{}`, not `{}`", any.type_url, ty.type_url())))?;
        let message = DynamicMessage::decode(ty.descriptor().clone(), any.value.as_slice())
            .map_err(|e| invalid(e.to_string()))?;
        let canonical_json = canonical_json(&to_json(&message, Some(ty.type_url())));
        Ok(Self {
            message,
            any_bytes,
            value_bytes: any.value,
            canonical_json,
        })
    }

    /// A stored `google.protobuf.Any` as [`Self::to_json`] prints it, without the rest of
    /// [`Self::from_any_bytes`]'s work (the canonical JSON), for reads of many bodies.
    pub fn json_of_any(any_bytes: &[u8], ty: &ResourceType) -> Result<Value, BodyError> {
        let invalid = |message: String| BodyError {
            pointer: Pointer::root(),
            code: "invalid_body",
            message,
        };
        let any = prost_types::Any::decode(any_bytes).map_err(|e| invalid(e.to_string()))?;
        let ty = &body_type(ty, &any.type_url)
            .ok_or_else(|| invalid(format!("holds `{}`, not `{}`", any.type_url, ty.type_url())))?;
        let message = DynamicMessage::decode(ty.descriptor().clone(), any.value.as_slice())
            .map_err(|e| invalid(e.to_string()))?;
        Ok(to_json(&message, Some(ty.type_url())))
    }

    /// The body as proto3 JSON with `@type` and protobuf field names, as Envoy's config dumps
    /// print it.
    pub fn to_json(&self, ty: &ResourceType) -> Value {
        let own = format!("{TYPE_URL_PREFIX}{}", self.message.descriptor().full_name());
        let type_url = if self.is_redirect() {
            own.as_str()
        } else {
            ty.type_url()
        };
        to_json(&self.message, Some(type_url))
    }

    /// Whether the body is a TP1 redirect (an `xds.core.v3.ResourceLocator`), not the resource.
    pub fn is_redirect(&self) -> bool {
        self.message.descriptor().full_name() == RESOURCE_LOCATOR
    }

    /// The decoded message.
    pub fn message(&self) -> &DynamicMessage {
        &self.message
    }

    /// The value of the body's name field, if the type has one.
    pub fn name(&self, ty: &ResourceType) -> Option<String> {
        let field = ty.name_field()?;
        match self.message.get_field(&field).as_ref() {
            ReflectValue::String(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// The inner message as a generated type, for type-specific rules.
    pub fn decode_as<M: Message + Default>(&self) -> Result<M, prost::DecodeError> {
        M::decode(self.value_bytes.as_slice())
    }
}

/// The type a body of a resource of type `ty` holds: the resource's own, or a redirect.
fn body_type(ty: &ResourceType, at_type: &str) -> Option<ResourceType> {
    if at_type == ty.type_url() {
        Some(ty.clone())
    } else if at_type == RESOURCE_LOCATOR_TYPE_URL {
        ResourceType::resolve(RESOURCE_LOCATOR).ok()
    } else {
        None
    }
}

fn to_json(message: &DynamicMessage, type_url: Option<&str>) -> Value {
    let options = SerializeOptions::new().use_proto_field_name(true);
    let mut json = message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a decoded message serializes to JSON");
    if let (Some(type_url), Value::Object(map)) = (type_url, &mut json) {
        map.insert("@type".to_owned(), Value::String(type_url.to_owned()));
    }
    json
}

/// JSON text with object keys sorted at every level, independent of serde_json's map features.
pub fn canonical_json(value: &Value) -> String {
    fn write(value: &Value, out: &mut String) {
        match value {
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.cmp(b.0));
                out.push('{');
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(v, out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(v, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(value, &mut out);
    out
}

/// 16 hex digits of SHA-256 over length-prefixed parts: a content version.
pub fn content_hash(domain: &str, parts: &[&[u8]]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(domain.as_bytes());
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part);
    }
    hasher.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resolves_aliases_names_and_type_urls() {
        for spelling in [
            "cluster",
            CLUSTER,
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        ] {
            let ty = ResourceType::resolve(spelling).unwrap();
            assert_eq!(
                ty.type_url(),
                "type.googleapis.com/envoy.config.cluster.v3.Cluster"
            );
            assert_eq!(ty.alias(), Some("cluster"));
        }
        for (alias, name) in ALIASES {
            assert_eq!(ResourceType::resolve(alias).unwrap().message_name(), name);
            // The table lookup agrees with the resolved type's alias, for every spelling.
            let url = format!("{TYPE_URL_PREFIX}{name}");
            for spelling in [alias, name, url.as_str()] {
                assert_eq!(ResourceType::alias_of(spelling), Some(alias), "{spelling}");
            }
        }
        let no_alias = "type.googleapis.com/envoy.config.core.v3.Address";
        assert_eq!(ResourceType::resolve(no_alias).unwrap().alias(), None);
        assert_eq!(ResourceType::alias_of(no_alias), None);
        assert_eq!(ResourceType::alias_of("clusters"), None);
        assert!(
            ResourceType::resolve("clusters")
                .unwrap_err()
                .to_string()
                .contains("unknown resource type `clusters`")
        );
        assert_eq!(
            ResourceType::resolve("endpoint")
                .unwrap()
                .name_field()
                .unwrap()
                .name(),
            "cluster_name"
        );
        assert!(
            ResourceType::resolve("runtime")
                .unwrap()
                .name_field()
                .is_some()
        );
    }

    #[test]
    fn bodies_round_trip_through_binary() {
        let ty = ResourceType::resolve("cluster").unwrap();
        let json = json!({
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": "c1",
            "type": "EDS",
            "connect_timeout": "0.250s",
            "eds_cluster_config": {"eds_config": {"ads": {}}}
        });
        let body = Body::from_value(&json, &ty).unwrap();
        assert_eq!(body.name(&ty).as_deref(), Some("c1"));
        let again = Body::from_any_bytes(body.any_bytes.clone(), &ty).unwrap();
        assert_eq!(again.to_json(&ty), json);
        assert_eq!(Body::json_of_any(&body.any_bytes, &ty).unwrap(), json);
        assert_eq!(again.canonical_json, body.canonical_json);
    }

    #[test]
    fn body_errors_point_at_the_field() {
        let ty = ResourceType::resolve("cluster").unwrap();
        let e = Body::from_value(&json!({"name": "c"}), &ty).unwrap_err();
        assert_eq!(
            (e.pointer.to_string().as_str(), e.code),
            ("/@type", "missing_type")
        );
        let e = Body::from_value(
            &json!({"@type": "type.googleapis.com/envoy.config.listener.v3.Listener"}),
            &ty,
        )
        .unwrap_err();
        assert_eq!(e.code, "type_mismatch");
        let e = Body::from_value(
            &json!({
                "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "load_assignment": {"endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                    "socket_address": {"address": "a", "port_value": "x"}}}}]}]}
            }),
            &ty,
        )
        .unwrap_err();
        assert_eq!(
            e.pointer.to_string(),
            "/load_assignment/endpoints/0/lb_endpoints/0/endpoint/address/socket_address/port_value"
        );
        let e = Body::from_value(
            &json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "nmae": "x"}),
            &ty,
        )
        .unwrap_err();
        assert!(e.message.contains("nmae"), "{}", e.message);
    }

    #[test]
    fn canonical_json_sorts_keys_everywhere() {
        let v = json!({"b": [{"z": 1, "a": 2}], "a": "x"});
        assert_eq!(canonical_json(&v), r#"{"a":"x","b":[{"a":2,"z":1}]}"#);
        assert_ne!(
            content_hash("d", &[b"ab", b"c"]),
            content_hash("d", &[b"a", b"bc"])
        );
    }
}
