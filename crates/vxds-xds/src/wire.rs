//! The responses vxds sends, encoded by hand around shared bytes.
//!
//! A variant's body is encoded once, as a `google.protobuf.Any`, when the index loads it (and
//! its constraints likewise). These messages hold those bytes by reference (`Bytes`) and write
//! them straight into the response: every stream shares one copy, and nothing is decoded and
//! re-encoded per send. Field numbers are those of `envoy.service.discovery.v3`; the tests
//! decode what is encoded here with the generated types.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType, encoded_len_varint, key_len, skip_field};
use prost::{DecodeError, Message};

use vxds_envoy::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};

use crate::types::RESOURCE_WRAPPER;

fn delimited_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

/// A varint into `out` (room for ten bytes); how many bytes it took.
#[inline]
fn varint_into(mut value: u64, out: &mut [u8]) -> usize {
    let mut at = 0;
    while value >= 0x80 {
        out[at] = (value as u8) | 0x80;
        value >>= 7;
        at += 1;
    }
    out[at] = value as u8;
    at + 1
}

/// A length-delimited field's key and length into `out` (room for fifteen bytes).
#[inline]
fn header_into(tag: u32, len: usize, out: &mut [u8]) -> usize {
    let at = varint_into(u64::from(tag << 3 | WireType::LengthDelimited as u32), out);
    at + varint_into(len as u64, &mut out[at..])
}

/// Headers and short fields are put whole, each with one `put_slice`: prost's `encode_varint`
/// puts a byte at a time, and every `put_u8` into tonic's buffer costs as much as a
/// `put_slice` (its room checked, its length moved).
fn put_delimited_header(tag: u32, len: usize, buf: &mut impl BufMut) {
    let mut head = [0u8; 15];
    let at = header_into(tag, len, &mut head);
    buf.put_slice(&head[..at]);
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
        put_bytes(tag, s.as_bytes(), buf);
    }
}

/// The longest field put with its header in one piece (type URLs, versions, nonces, names).
const SHORT_FIELD: usize = 112;

fn put_bytes(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    if bytes.len() <= SHORT_FIELD {
        let mut field = [0u8; 15 + SHORT_FIELD];
        let at = header_into(tag, bytes.len(), &mut field);
        field[at..at + bytes.len()].copy_from_slice(bytes);
        buf.put_slice(&field[..at + bytes.len()]);
    } else {
        put_delimited_header(tag, bytes.len(), buf);
        buf.put_slice(bytes);
    }
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
    let mut field = [0u8; 15 + 11 + 6];
    let mut at = header_into(tag, duration_len(d), &mut field);
    if d.as_secs() != 0 {
        field[at] = 1 << 3; // seconds, a varint
        at += 1 + varint_into(d.as_secs(), &mut field[at + 1..]);
    }
    if d.subsec_nanos() != 0 {
        field[at] = 2 << 3; // nanos, a varint
        at += 1 + varint_into(u64::from(d.subsec_nanos()), &mut field[at + 1..]);
    }
    buf.put_slice(&field[..at]);
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

    /// As `DiscoveryResponse.resources` (field 2).
    fn encode_field(&self, buf: &mut impl BufMut) {
        put_delimited_header(2, self.encoded_len(), buf);
        match self {
            SotwEntry::Bare(body) => buf.put_slice(body),
            SotwEntry::Wrapped(w) => w.encode_any(buf),
        }
    }
}

/// A `DiscoveryResponse`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SotwResponse {
    pub version_info: Arc<str>,
    pub resources: SotwResources,
    pub type_url: Arc<str>,
    pub nonce: String,
}

/// A SotW response's resources, shared by reference: at fan-out every stream of a type that
/// resolves alike sends the same ones, and those built for many streams are encoded once
/// ([`SotwResources::encoded`]) and copied whole into each response, not entry by entry.
#[derive(Clone, Debug, Default)]
pub struct SotwResources(Arc<EntriesAndEncoding>);

#[derive(Debug, Default)]
struct EntriesAndEncoding {
    entries: Vec<SotwEntry>,
    /// The entries as `DiscoveryResponse.resources` fields, one after the other.
    encoded: Option<Bytes>,
}

impl SotwResources {
    /// Entries encoded now, once, for many responses. A response of its own is better
    /// built with `from` (encoded straight into the stream's buffer, never held twice).
    pub fn encoded(entries: Vec<SotwEntry>) -> Self {
        let mut encoded = bytes::BytesMut::with_capacity(fields_len(&entries));
        for entry in &entries {
            entry.encode_field(&mut encoded);
        }
        Self(Arc::new(EntriesAndEncoding {
            entries,
            encoded: Some(encoded.freeze()),
        }))
    }

    fn encode_fields(&self, buf: &mut impl BufMut) {
        match &self.0.encoded {
            Some(encoded) => buf.put_slice(encoded),
            None => self.0.entries.iter().for_each(|e| e.encode_field(buf)),
        }
    }

    fn fields_len(&self) -> usize {
        match &self.0.encoded {
            Some(encoded) => encoded.len(),
            None => fields_len(&self.0.entries),
        }
    }
}

/// The length of `entries` as `DiscoveryResponse.resources` fields.
fn fields_len(entries: &[SotwEntry]) -> usize {
    (entries.iter())
        .map(|e| delimited_len(2, e.encoded_len()))
        .sum()
}

impl From<Vec<SotwEntry>> for SotwResources {
    fn from(entries: Vec<SotwEntry>) -> Self {
        Self(Arc::new(EntriesAndEncoding {
            entries,
            encoded: None,
        }))
    }
}

impl std::ops::Deref for SotwResources {
    type Target = [SotwEntry];

    fn deref(&self) -> &[SotwEntry] {
        &self.0.entries
    }
}

impl PartialEq for SotwResources {
    fn eq(&self, other: &Self) -> bool {
        self.0.entries == other.0.entries
    }
}

impl Eq for SotwResources {}

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
    pub system_version_info: Arc<str>,
    pub resources: Vec<Wrapped>,
    pub type_url: Arc<str>,
    pub removed_resources: Vec<String>,
    pub removed_resource_names: Vec<RemovedName>,
    pub nonce: String,
}

impl Message for SotwResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        put_string(1, &self.version_info, buf);
        self.resources.encode_fields(buf);
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
            + self.resources.fields_len()
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

/// Requests read by hand when they have the shape of an answer (an ACK or a NACK without its
/// detail): the type, the nonce and, on SotW, the version and names. Prost's generated decoder
/// builds the whole message field by field through `Buf` (every string cleared, reserved, copied
/// chunk by chunk and checked), which cost about as much per ACK as the rest of reading it.
/// Anything else — another field, a wire type or length that does not fit, text that is not
/// UTF-8 — is decoded by prost from the start, so what is accepted and every error are prost's.
pub trait FastDecode: Message + Default + Sized {
    /// The message in `bytes` when every field is one this reads; `None` otherwise.
    fn decode_answer(bytes: &[u8]) -> Option<Self>;
}

/// A varint of at most five bytes (every key and length of a request this reads); `None` for
/// a longer or truncated one, which prost then reads.
#[inline]
fn small_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in 0..5 {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << (7 * shift);
        if b < 0x80 {
            return Some(value);
        }
    }
    None
}

/// The fields of `bytes`, each `(key, text)` of a length-delimited field holding UTF-8, to
/// `take`, which says whether it reads that key; `None` as soon as one is not.
#[inline]
fn answer_fields<'a>(bytes: &'a [u8], mut take: impl FnMut(u64, &'a str) -> bool) -> Option<()> {
    let mut at = 0;
    while at < bytes.len() {
        let key = small_varint(bytes, &mut at)?;
        if key & 7 != WireType::LengthDelimited as u64 {
            return None;
        }
        let len = usize::try_from(small_varint(bytes, &mut at)?).ok()?;
        let end = at.checked_add(len).filter(|&end| end <= bytes.len())?;
        let text = std::str::from_utf8(&bytes[at..end]).ok()?;
        if !take(key >> 3, text) {
            return None;
        }
        at = end;
    }
    Some(())
}

/// Prost's string merge: a repeated occurrence replaces the value (allocated to size: no
/// reserve and growth, as a `clear` and `push_str` would take).
fn set(field: &mut String, text: &str) {
    *field = text.to_owned();
}

impl FastDecode for DeltaDiscoveryRequest {
    fn decode_answer(bytes: &[u8]) -> Option<Self> {
        let mut request = DeltaDiscoveryRequest::default();
        answer_fields(bytes, |tag, text| {
            match tag {
                2 => set(&mut request.type_url, text),
                6 => set(&mut request.response_nonce, text),
                _ => return false,
            }
            true
        })?;
        Some(request)
    }
}

impl FastDecode for DiscoveryRequest {
    fn decode_answer(bytes: &[u8]) -> Option<Self> {
        let mut request = DiscoveryRequest::default();
        answer_fields(bytes, |tag, text| {
            match tag {
                1 => set(&mut request.version_info, text),
                3 => request.resource_names.push(text.to_owned()),
                4 => set(&mut request.type_url, text),
                5 => set(&mut request.response_nonce, text),
                _ => return false,
            }
            true
        })?;
        Some(request)
    }
}

/// Decodes a request from `buf` (all of it): by hand when it is an answer, else by prost.
pub fn decode_request<T: FastDecode>(buf: &mut impl Buf) -> Result<T, DecodeError> {
    let whole = buf.chunk();
    if whole.len() == buf.remaining()
        && let Some(request) = T::decode_answer(whole)
    {
        buf.advance(whole.len());
        return Ok(request);
    }
    T::decode(buf)
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
            ]
            .into(),
        };
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        // Encoded once for many responses: the same bytes.
        let shared = SotwResponse {
            resources: SotwResources::encoded(response.resources.to_vec()),
            ..response.clone()
        };
        assert_eq!(shared, response);
        assert_eq!(shared.encoded_len(), response.encoded_len());
        assert_eq!(shared.encode_to_vec(), bytes);
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

    #[test]
    fn long_fields_and_lengths_encode_as_prost_reads_them() {
        // Fields on either side of the one-piece limit, lengths of one to three bytes.
        for n in [0, 1, 111, 112, 113, 127, 128, 300, 20_000] {
            let long = "x".repeat(n);
            let response = DeltaResponse {
                system_version_info: long.as_str().into(),
                resources: vec![Wrapped {
                    name: long.as_str().into(),
                    naming: Naming::Legacy,
                    version: long.as_str().into(),
                    body: Some(body(&long)),
                    ttl: Some(std::time::Duration::new(
                        u64::from(u32::MAX) + 5,
                        999_999_999,
                    )),
                }],
                type_url: long.as_str().into(),
                nonce: long.clone(),
                removed_resources: vec![long.clone(), String::new()],
                removed_resource_names: vec![RemovedName {
                    name: long.clone(),
                    constraints: Some(Bytes::from(constraints().encode_to_vec())),
                }],
            };
            let bytes = response.encode_to_vec();
            assert_eq!(bytes.len(), response.encoded_len());
            let decoded = DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap();
            assert_eq!(decoded.system_version_info, long);
            assert_eq!(
                (decoded.type_url.as_str(), decoded.nonce.as_str()),
                (long.as_str(), long.as_str())
            );
            assert_eq!(decoded.removed_resources, vec![long.clone(), String::new()]);
            assert_eq!(decoded.removed_resource_names[0].name, long);
            let r = &decoded.resources[0];
            assert_eq!(
                (r.name.as_str(), r.version.as_str()),
                (long.as_str(), long.as_str())
            );
            assert_eq!(
                r.resource.as_ref().unwrap().encode_to_vec(),
                body(&long).to_vec()
            );
            let ttl = r.ttl.unwrap();
            assert_eq!(
                (ttl.seconds, ttl.nanos),
                (i64::from(u32::MAX) + 5, 999_999_999)
            );
        }
    }

    mod requests {
        use super::*;
        use prost::encoding::{encode_key, encode_varint};
        use vxds_envoy::pb::envoy::config::core::v3::Node;
        use vxds_envoy::pb::envoy::service::discovery::v3::{
            DeltaDiscoveryRequest, DiscoveryRequest, ResourceLocator,
        };

        /// What prost's generated decoder makes of `bytes`, and what `decode_request` does:
        /// the same message, or the same error text.
        fn same<T: FastDecode + std::fmt::Debug + PartialEq>(bytes: &[u8]) -> Option<T> {
            let by_prost = T::decode(bytes).map_err(|e| e.to_string());
            let mut buf = bytes;
            let by_hand = decode_request::<T>(&mut buf).map_err(|e| e.to_string());
            assert_eq!(by_hand, by_prost, "{bytes:?}");
            if by_hand.is_ok() {
                assert!(buf.is_empty(), "all of it read");
            }
            by_hand.ok()
        }

        fn key(tag: u32, wire: WireType) -> Vec<u8> {
            let mut b = Vec::new();
            encode_key(tag, wire, &mut b);
            b
        }

        fn field(tag: u32, bytes: &[u8]) -> Vec<u8> {
            let mut b = key(tag, WireType::LengthDelimited);
            encode_varint(bytes.len() as u64, &mut b);
            b.extend_from_slice(bytes);
            b
        }

        const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

        #[test]
        fn answers_are_read_by_hand_as_prost_reads_them() {
            let delta = DeltaDiscoveryRequest {
                type_url: CDS.into(),
                response_nonce: "42".into(),
                ..Default::default()
            };
            let bytes = delta.encode_to_vec();
            assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_some());
            assert_eq!(same::<DeltaDiscoveryRequest>(&bytes), Some(delta));
            let sotw = DiscoveryRequest {
                version_info: "7".into(),
                resource_names: vec!["a".into(), String::new(), "c".into()],
                type_url: CDS.into(),
                response_nonce: "43".into(),
                ..Default::default()
            };
            let bytes = sotw.encode_to_vec();
            assert!(DiscoveryRequest::decode_answer(&bytes).is_some());
            assert_eq!(same::<DiscoveryRequest>(&bytes), Some(sotw));
            // Empty, and fields written with their default (prost skips them; a client may not).
            assert_eq!(same::<DiscoveryRequest>(&[]), Some(Default::default()));
            let mut bytes = field(2, b"");
            bytes.extend(field(6, b""));
            assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_some());
            assert_eq!(
                same::<DeltaDiscoveryRequest>(&bytes),
                Some(Default::default())
            );
        }

        #[test]
        fn a_repeated_field_replaces_and_names_accumulate() {
            let mut bytes = field(2, b"first");
            bytes.extend(field(6, b"1"));
            bytes.extend(field(2, CDS.as_bytes()));
            bytes.extend(field(6, b"2"));
            let request = same::<DeltaDiscoveryRequest>(&bytes).unwrap();
            assert_eq!(
                (request.type_url.as_str(), request.response_nonce.as_str()),
                (CDS, "2")
            );
            let mut bytes = field(3, b"x");
            bytes.extend(field(1, b"v1"));
            bytes.extend(field(3, b"y"));
            bytes.extend(field(1, b"v2"));
            let request = same::<DiscoveryRequest>(&bytes).unwrap();
            assert_eq!(request.resource_names, vec!["x".to_owned(), "y".to_owned()]);
            assert_eq!(request.version_info, "v2");
        }

        #[test]
        fn a_non_minimal_varint_reads_the_same() {
            // Key 18 (field 2, length-delimited) and length 3, each in two bytes.
            let bytes = [0x92, 0x00, 0x83, 0x00, b'a', b'b', b'c'];
            assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_some());
            assert_eq!(
                same::<DeltaDiscoveryRequest>(&bytes).unwrap().type_url,
                "abc"
            );
        }

        #[test]
        fn other_fields_and_unknown_ones_go_to_prost() {
            let full = DeltaDiscoveryRequest {
                node: Some(Node {
                    id: "n".into(),
                    ..Default::default()
                }),
                type_url: CDS.into(),
                resource_names_subscribe: vec!["a".into()],
                resource_names_unsubscribe: vec!["b".into()],
                initial_resource_versions: [("a".to_owned(), "1".to_owned())].into(),
                response_nonce: "3".into(),
                error_detail: Some(vxds_envoy::pb::google::rpc::Status {
                    code: 3,
                    message: "no".into(),
                    details: vec![],
                }),
                resource_locators_subscribe: vec![ResourceLocator {
                    name: "c".into(),
                    dynamic_parameters: [("k".to_owned(), "v".to_owned())].into(),
                }],
                resource_locators_unsubscribe: vec![],
            };
            let bytes = full.encode_to_vec();
            assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_none());
            assert_eq!(same::<DeltaDiscoveryRequest>(&bytes), Some(full));
            let full = DiscoveryRequest {
                version_info: "1".into(),
                node: Some(Node {
                    id: "n".into(),
                    ..Default::default()
                }),
                resource_names: vec!["a".into()],
                resource_locators: vec![ResourceLocator {
                    name: "c".into(),
                    ..Default::default()
                }],
                type_url: CDS.into(),
                response_nonce: "2".into(),
                error_detail: None,
            };
            let bytes = full.encode_to_vec();
            assert!(DiscoveryRequest::decode_answer(&bytes).is_none());
            assert_eq!(same::<DiscoveryRequest>(&bytes), Some(full));
            // Unknown fields of every wire type, before and after the ones read: skipped.
            let mut bytes = field(2, CDS.as_bytes());
            bytes.extend(key(100, WireType::Varint));
            encode_varint(300, &mut bytes);
            bytes.extend(field(101, b"unknown"));
            bytes.extend(key(102, WireType::ThirtyTwoBit));
            bytes.extend([1, 2, 3, 4]);
            bytes.extend(key(103, WireType::SixtyFourBit));
            bytes.extend([1, 2, 3, 4, 5, 6, 7, 8]);
            bytes.extend(field(6, b"9"));
            assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_none());
            let request = same::<DeltaDiscoveryRequest>(&bytes).unwrap();
            assert_eq!(
                (request.type_url.as_str(), request.response_nonce.as_str()),
                (CDS, "9")
            );
            // A field read by hand, with another wire type: prost's error.
            let mut bytes = key(2, WireType::Varint);
            encode_varint(1, &mut bytes);
            assert!(same::<DeltaDiscoveryRequest>(&bytes).is_none());
            // A packed-looking repeated string (one length-delimited run): a single name.
            let bytes = field(3, b"\x01a\x01b");
            assert_eq!(
                same::<DiscoveryRequest>(&bytes).unwrap().resource_names,
                vec!["\u{1}a\u{1}b".to_owned()]
            );
        }

        #[test]
        fn malformed_input_fails_as_prost_fails() {
            let good = DeltaDiscoveryRequest {
                type_url: CDS.into(),
                response_nonce: "12345".into(),
                ..Default::default()
            }
            .encode_to_vec();
            // Every truncation: a length past the end, a varint cut short.
            for end in 0..good.len() {
                same::<DeltaDiscoveryRequest>(&good[..end]);
                same::<DiscoveryRequest>(&good[..end]);
            }
            let cases: Vec<Vec<u8>> = vec![
                field(2, b"\xff\xfe"), // not UTF-8
                field(4, b"\xc3"),     // not UTF-8, SotW's type
                vec![
                    0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
                ], // bad varint
                vec![0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], // a six-byte length
                vec![0x02, 0x00],      // field 0
                vec![0x12, 0x05, b'a'], // length past the end
                vec![0x0f],            // wire type 7
                vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80], // endless key
            ];
            for bytes in &cases {
                assert!(same::<DeltaDiscoveryRequest>(bytes).is_none(), "{bytes:?}");
                same::<DiscoveryRequest>(bytes);
            }
        }

        #[test]
        fn random_bytes_decode_as_prost_decodes_them() {
            // A fixed pseudo-random walk over short messages of the fields read by hand and a
            // few others, mutated byte by byte.
            let mut state = 0x9e37_79b9_7f4a_7c15_u64;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let pieces: Vec<Vec<u8>> = vec![
                field(1, b"v"),
                field(2, CDS.as_bytes()),
                field(3, b"name"),
                field(4, b"t"),
                field(5, b"5"),
                field(6, b"6"),
                field(7, b""),
                field(9, b"\xc3\xa9"),
            ];
            for _ in 0..20_000 {
                let mut bytes = Vec::new();
                for _ in 0..(next() % 4) {
                    bytes.extend(&pieces[(next() % pieces.len() as u64) as usize]);
                }
                for _ in 0..(next() % 3) {
                    if !bytes.is_empty() {
                        let at = (next() % bytes.len() as u64) as usize;
                        bytes[at] = next() as u8;
                    }
                }
                same::<DeltaDiscoveryRequest>(&bytes);
                same::<DiscoveryRequest>(&bytes);
            }
        }
    }
}
