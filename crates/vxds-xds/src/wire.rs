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

mod decode;

pub use decode::{FastDecode, decode_request};

#[cfg(test)]
mod tests;
