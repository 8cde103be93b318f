//! The responses vxds sends, encoded by hand around shared bytes.
//!
//! A variant's body is encoded once, as a `google.protobuf.Any`, when the index loads it (and
//! its constraints likewise). These messages hold those bytes by reference (`Bytes`) and write
//! them straight into the response: every stream shares one copy, and nothing is decoded and
//! re-encoded per send. Field numbers are those of `envoy.service.discovery.v3`; the tests
//! decode what is encoded here with the generated types.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{
    DecodeContext, WireType, encode_key, encode_varint, encoded_len_varint, key_len, skip_field,
};
use prost::{DecodeError, Message};

use crate::types::RESOURCE_WRAPPER;

fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn put_delimited_header(tag: u32, len: usize, buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        delimited_len(tag, s.len())
    }
}

fn put_string(tag: u32, s: &str, buf: &mut impl BufMut) {
    if !s.is_empty() {
        put_delimited_header(tag, s.len(), buf);
        buf.put_slice(s.as_bytes());
    }
}

fn put_bytes(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    put_delimited_header(tag, bytes.len(), buf);
    buf.put_slice(bytes);
}

/// How a resource is named in a `Resource` wrapper.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Naming {
    /// `Resource.name`: the legacy way, for plain-name subscriptions.
    Legacy,
    /// `Resource.resource_name { name, dynamic_parameter_constraints }`, for locator
    /// subscriptions (TP2): the encoded constraints, or `None` when unconstrained.
    Constrained(Option<Bytes>),
}

/// A `envoy.service.discovery.v3.Resource`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wrapped {
    pub name: Arc<str>,
    pub naming: Naming,
    pub version: Arc<str>,
    /// The body: an encoded `google.protobuf.Any`; `None` in a heartbeat, which only renews
    /// the TTL of what the client holds at `version`.
    pub body: Option<Bytes>,
    /// `Resource.ttl`: the client drops the resource when it runs out without an update or
    /// a heartbeat.
    pub ttl: Option<std::time::Duration>,
}

/// `google.protobuf.Duration { seconds = 1, nanos = 2 }`, as `Resource.ttl` (field 6).
fn duration_len(d: std::time::Duration) -> usize {
    let seconds = d.as_secs();
    let nanos = u64::from(d.subsec_nanos());
    (if seconds == 0 {
        0
    } else {
        key_len(1) + encoded_len_varint(seconds)
    }) + (if nanos == 0 {
        0
    } else {
        key_len(2) + encoded_len_varint(nanos)
    })
}

fn put_duration(tag: u32, d: std::time::Duration, buf: &mut impl BufMut) {
    put_delimited_header(tag, duration_len(d), buf);
    if d.as_secs() != 0 {
        encode_key(1, WireType::Varint, buf);
        encode_varint(d.as_secs(), buf);
    }
    if d.subsec_nanos() != 0 {
        encode_key(2, WireType::Varint, buf);
        encode_varint(u64::from(d.subsec_nanos()), buf);
    }
}

impl Wrapped {
    fn resource_name_len(&self, constraints: &Option<Bytes>) -> usize {
        string_len(1, &self.name)
            + constraints
                .as_ref()
                .map_or(0, |c| delimited_len(2, c.len()))
    }

    fn encoded_len(&self) -> usize {
        let naming = match &self.naming {
            Naming::Legacy => string_len(3, &self.name),
            Naming::Constrained(c) => delimited_len(8, self.resource_name_len(c)),
        };
        string_len(1, &self.version)
            + self.body.as_ref().map_or(0, |b| delimited_len(2, b.len()))
            + naming
            + self.ttl.map_or(0, |t| delimited_len(6, duration_len(t)))
    }

    fn encode(&self, buf: &mut impl BufMut) {
        put_string(1, &self.version, buf);
        if let Some(body) = &self.body {
            put_bytes(2, body, buf);
        }
        if let Some(ttl) = self.ttl {
            put_duration(6, ttl, buf);
        }
        match &self.naming {
            Naming::Legacy => put_string(3, &self.name, buf),
            Naming::Constrained(constraints) => {
                put_delimited_header(8, self.resource_name_len(constraints), buf);
                put_string(1, &self.name, buf);
                if let Some(c) = constraints {
                    put_bytes(2, c, buf);
                }
            }
        }
    }

    /// As an `Any` holding the `Resource`: how wrapped resources go in SotW responses.
    fn any_len(&self) -> usize {
        string_len(1, RESOURCE_WRAPPER) + delimited_len(2, self.encoded_len())
    }

    fn encode_any(&self, buf: &mut impl BufMut) {
        put_string(1, RESOURCE_WRAPPER, buf);
        put_delimited_header(2, self.encoded_len(), buf);
        self.encode(buf);
    }
}

/// One entry of a SotW response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SotwEntry {
    /// The body itself.
    Bare(Bytes),
    /// Wrapped in `Resource` (locator subscriptions, and clients that ask for it).
    Wrapped(Wrapped),
}

impl SotwEntry {
    fn encoded_len(&self) -> usize {
        match self {
            SotwEntry::Bare(body) => body.len(),
            SotwEntry::Wrapped(w) => w.any_len(),
        }
    }
}

/// A `DiscoveryResponse`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SotwResponse {
    pub version_info: String,
    pub resources: Vec<SotwEntry>,
    pub type_url: String,
    pub nonce: String,
}

/// A removed variant: `ResourceName { name, dynamic_parameter_constraints }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemovedName {
    pub name: String,
    pub constraints: Option<Bytes>,
}

impl RemovedName {
    fn encoded_len(&self) -> usize {
        string_len(1, &self.name)
            + self
                .constraints
                .as_ref()
                .map_or(0, |c| delimited_len(2, c.len()))
    }
}

/// A `DeltaDiscoveryResponse`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeltaResponse {
    pub system_version_info: String,
    pub resources: Vec<Wrapped>,
    pub type_url: String,
    pub removed_resources: Vec<String>,
    pub removed_resource_names: Vec<RemovedName>,
    pub nonce: String,
}

impl Message for SotwResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, &self.version_info, buf);
        for entry in &self.resources {
            put_delimited_header(2, entry.encoded_len(), buf);
            match entry {
                SotwEntry::Bare(body) => buf.put_slice(body),
                SotwEntry::Wrapped(w) => w.encode_any(buf),
            }
        }
        put_string(4, &self.type_url, buf);
        put_string(5, &self.nonce, buf);
    }

    /// Responses are only ever encoded; a decoder would skip every field.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        string_len(1, &self.version_info)
            + self
                .resources
                .iter()
                .map(|e| delimited_len(2, e.encoded_len()))
                .sum::<usize>()
            + string_len(4, &self.type_url)
            + string_len(5, &self.nonce)
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

impl Message for DeltaResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, &self.system_version_info, buf);
        for resource in &self.resources {
            put_delimited_header(2, resource.encoded_len(), buf);
            resource.encode(buf);
        }
        put_string(4, &self.type_url, buf);
        put_string(5, &self.nonce, buf);
        for name in &self.removed_resources {
            // Empty strings are meaningful in a repeated field: write them too.
            put_bytes(6, name.as_bytes(), buf);
        }
        for removed in &self.removed_resource_names {
            put_delimited_header(8, removed.encoded_len(), buf);
            put_string(1, &removed.name, buf);
            if let Some(c) = &removed.constraints {
                put_bytes(2, c, buf);
            }
        }
    }

    /// Responses are only ever encoded; a decoder would skip every field.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        string_len(1, &self.system_version_info)
            + self
                .resources
                .iter()
                .map(|r| delimited_len(2, r.encoded_len()))
                .sum::<usize>()
            + string_len(4, &self.type_url)
            + string_len(5, &self.nonce)
            + self
                .removed_resources
                .iter()
                .map(|n| delimited_len(6, n.len()))
                .sum::<usize>()
            + self
                .removed_resource_names
                .iter()
                .map(|r| delimited_len(8, r.encoded_len()))
                .sum::<usize>()
    }

    fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vxds_envoy::pb::envoy::service::discovery::v3::dynamic_parameter_constraints::{
        SingleConstraint, Type, single_constraint,
    };
    use vxds_envoy::pb::envoy::service::discovery::v3::{
        DeltaDiscoveryResponse, DiscoveryResponse, DynamicParameterConstraints, Resource,
    };

    fn body(name: &str) -> Bytes {
        let any = prost_types::Any {
            type_url: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration".into(),
            value: vxds_envoy::pb::envoy::config::route::v3::RouteConfiguration {
                name: name.into(),
                ..Default::default()
            }
            .encode_to_vec(),
        };
        Bytes::from(any.encode_to_vec())
    }

    fn constraints() -> DynamicParameterConstraints {
        DynamicParameterConstraints {
            r#type: Some(Type::Constraint(SingleConstraint {
                key: "env".into(),
                constraint_type: Some(single_constraint::ConstraintType::Value("prod".into())),
            })),
        }
    }

    #[test]
    fn sotw_responses_decode_as_discovery_responses() {
        let c = Bytes::from(constraints().encode_to_vec());
        let response = SotwResponse {
            version_info: "v1".into(),
            type_url: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration".into(),
            nonce: "7".into(),
            resources: vec![
                SotwEntry::Bare(body("a")),
                SotwEntry::Wrapped(Wrapped {
                    name: "b".into(),
                    naming: Naming::Legacy,
                    version: "vb".into(),
                    body: Some(body("b")),
                    ttl: Some(std::time::Duration::from_millis(2500)),
                }),
                SotwEntry::Wrapped(Wrapped {
                    name: "c".into(),
                    naming: Naming::Constrained(Some(c)),
                    version: "vc".into(),
                    body: Some(body("c")),
                    ttl: None,
                }),
            ],
        };
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let decoded = DiscoveryResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(
            (decoded.version_info.as_str(), decoded.nonce.as_str()),
            ("v1", "7")
        );
        assert_eq!(
            decoded.resources[0].value,
            prost_types::Any::decode(body("a")).unwrap().value
        );
        assert_eq!(decoded.resources[1].type_url, RESOURCE_WRAPPER);
        let b = Resource::decode(decoded.resources[1].value.as_slice()).unwrap();
        assert_eq!((b.name.as_str(), b.version.as_str()), ("b", "vb"));
        assert_eq!(b.resource.unwrap().encode_to_vec(), body("b").to_vec());
        let ttl = b.ttl.unwrap();
        assert_eq!((ttl.seconds, ttl.nanos), (2, 500_000_000));
        let c = Resource::decode(decoded.resources[2].value.as_slice()).unwrap();
        let name = c.resource_name.unwrap();
        assert_eq!(name.name, "c");
        assert_eq!(name.dynamic_parameter_constraints, Some(constraints()));
        assert!(c.name.is_empty());
    }

    #[test]
    fn delta_responses_decode_as_delta_discovery_responses() {
        let response = DeltaResponse {
            system_version_info: "12".into(),
            type_url: "t".into(),
            nonce: "n".into(),
            resources: vec![
                Wrapped {
                    name: "r".into(),
                    naming: Naming::Constrained(None),
                    version: "v".into(),
                    body: Some(body("r")),
                    ttl: None,
                },
                // A heartbeat: no body, a TTL.
                Wrapped {
                    name: "h".into(),
                    naming: Naming::Legacy,
                    version: "vh".into(),
                    body: None,
                    ttl: Some(std::time::Duration::from_secs(30)),
                },
            ],
            removed_resources: vec!["gone".into(), String::new()],
            removed_resource_names: vec![
                RemovedName {
                    name: "old".into(),
                    constraints: Some(Bytes::from(constraints().encode_to_vec())),
                },
                RemovedName {
                    name: "missing".into(),
                    constraints: None,
                },
            ],
        };
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let decoded = DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.system_version_info, "12");
        assert_eq!(
            decoded.removed_resources,
            vec!["gone".to_owned(), String::new()]
        );
        assert_eq!(
            decoded.removed_resource_names[0].dynamic_parameter_constraints,
            Some(constraints())
        );
        assert_eq!(
            decoded.removed_resource_names[1].dynamic_parameter_constraints,
            None
        );
        let r = &decoded.resources[0];
        assert_eq!(r.resource_name.as_ref().unwrap().name, "r");
        assert_eq!(
            r.resource_name
                .as_ref()
                .unwrap()
                .dynamic_parameter_constraints,
            None
        );
        assert_eq!(r.version, "v");
        let h = &decoded.resources[1];
        assert_eq!((h.name.as_str(), h.version.as_str()), ("h", "vh"));
        assert!(h.resource.is_none());
        assert_eq!(h.ttl.unwrap().seconds, 30);
    }
}
