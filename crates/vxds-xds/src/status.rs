//! What each stream is doing, for operators: `GET /v1/clients` and CSDS read it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};

use bytes::Bytes;
use serde::Serialize;
use vxds_core::impact::Subscription;
use vxds_core::{ConstraintsId, ParamSet};

use crate::held::Sent;
use crate::intern::{Interner, small};

/// One connected stream.
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClientStatus {
    pub stream_id: u64,
    /// `ads`, or the per-type service (`lds`, `cds`, ...).
    pub service: &'static str,
    /// `sotw` or `delta`.
    pub protocol: &'static str,
    pub node_id: String,
    pub node_cluster: String,
    /// e.g. `envoy 1.40.0`.
    pub user_agent: String,
    pub client_features: Vec<String>,
    pub connected_at: String,
    /// The client certificate's names, on a mutual-TLS connection.
    pub peer: Option<crate::identity::PeerIdentity>,
    /// The identity taken from them: the first URI SAN (a SPIFFE ID), else the first DNS SAN.
    pub identity: Option<String>,
    /// The parameters the identity template derived from it; they override what the client
    /// sends for the same keys, in every source.
    pub trusted_params: BTreeMap<String, String>,
    pub types: Vec<TypeStatus>,
    /// Type URLs the client asked for that name no message of the Envoy API: not answered
    /// (the stream lives, as grpc-go ignores types it does not know). The first 16, each cut to
    /// 256 bytes; the metric `vxds_xds_unknown_type_requests` counts them all.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknown_types: Vec<String>,
}

/// Unknown type URLs recorded per stream: a client may invent any number of them.
pub const MAX_UNKNOWN_TYPES: usize = 16;
/// Longest unknown type URL recorded (and logged), in bytes.
pub const MAX_UNKNOWN_TYPE_LEN: usize = 256;

/// Where each parameter came from, by key.
pub type ParamSources = BTreeMap<String, &'static str>;

/// One resource type on a stream.
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TypeStatus {
    // Interned (`crate::types::intern`): shared by every stream's status.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub type_url: &'static str,
    /// The dynamic parameters plain-name subscriptions resolve with.
    // Shared with the stream's state and every stream with equal parameters (`intern`).
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub params: Arc<vxds_core::ParamSet>,
    /// Where each of `params` came from: `identity` (trusted), `node.dynamic_parameters` or
    /// `node.metadata`.
    // Shared with every stream whose parameters came from the same places (`crate::intern`).
    #[cfg_attr(feature = "openapi", schema(value_type = BTreeMap<String, String>))]
    pub param_sources: Arc<ParamSources>,
    /// What the client subscribes to, as operators read it.
    // Shared with every stream that subscribes alike (`crate::intern`).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub subscriptions: Arc<[String]>,
    pub last_sent: Option<SentVersion>,
    pub last_acked: Option<Acked>,
    /// The revision of the configuration the client accepted last (ACKed) of this type: what
    /// it runs. `None` until it accepts a response computed from a revision.
    pub accepted_revision: Option<u64>,
    /// The revision of a response sent since and not accepted (unanswered, or refused):
    /// `None` when the client runs the latest it was sent.
    pub pending_revision: Option<u64>,
    /// The last response the client refused, and why.
    pub last_nacked: Option<Nacked>,
    /// The subscriptions by the type (a list collection's may be another) and parameters they
    /// resolve with, for the client summary; shared with every stream that subscribes alike
    /// (`crate::intern`).
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub summary: Arc<[SubscriptionGroup]>,
    /// What the client holds, as far as the server knows.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<HeldResource>))]
    pub resources: HeldResources,
}

/// Subscriptions of one type that resolve with one parameter set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SubscriptionGroup {
    pub type_url: String,
    pub params: Arc<ParamSet>,
    pub subscriptions: Vec<Subscription>,
}

/// A held resource's identity: its name, and its variant when it was subscribed by locator.
pub type HeldKey = (Arc<str>, Option<ConstraintsId>);

/// What a client holds of one type. Kept up to date change by change, so that a response
/// costs the stream work for what it carries, not for everything the client holds; and held
/// as references into the index, made readable only when someone reads it.
#[derive(Clone, Debug, Default)]
pub struct HeldResources(BTreeMap<HeldKey, Sent>);

impl HeldResources {
    pub fn iter(&self) -> impl Iterator<Item = HeldResource> + '_ {
        self.0
            .iter()
            .map(|((name, _), sent)| held_resource(sent, name))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Records that the client now holds `held` under `key`, or (`None`) no longer holds it.
    pub(crate) fn apply(&mut self, key: HeldKey, held: Option<Sent>) {
        match held {
            Some(held) => self.0.insert(key, held),
            None => self.0.remove(&key),
        };
    }
}

impl FromIterator<(HeldKey, Sent)> for HeldResources {
    fn from_iter<I: IntoIterator<Item = (HeldKey, Sent)>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

/// A list of resources, as operators read it.
impl Serialize for HeldResources {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

/// The last response sent of the type: its version, its nonce and when.
// Written on every stream for every response, so nothing in it is the stream's own text: the
// version is the response's (shared by every stream sent the same), the nonce a number.
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SentVersion {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub version: Arc<str>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub nonce: Nonce,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub at: Stamp,
}

/// The last response the client accepted (ACKed) of the type: its version, its nonce and when.
// As `SentVersion`, written on every stream for every ACK.
#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Acked {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub version: Arc<str>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub nonce: Nonce,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub at: Stamp,
}

/// A nonce, read as text. The server's nonces are sequence numbers, held as numbers; any other
/// text (a client may echo anything) is kept as it came. Equal texts are equal nonces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Nonce {
    Seq(u64),
    Text(Box<str>),
}

impl Nonce {
    pub fn new(text: &str) -> Self {
        // Only the number's own spelling: "007" or "+7" stay text, so that they read back as
        // sent and differ from "7".
        match nonce_seq(text) {
            Some(seq) => Nonce::Seq(seq),
            None => Nonce::Text(text.into()),
        }
    }

    /// The sequence number it carries; 0 for other text.
    pub fn seq(&self) -> u64 {
        match self {
            Nonce::Seq(seq) => *seq,
            Nonce::Text(text) => text.parse().unwrap_or(0),
        }
    }
}

/// The sequence number a nonce names: a response's nonce is its sequence number in decimal,
/// so only that spelling names it (not `007`, `+7` or ` 7`).
pub(crate) fn nonce_seq(nonce: &str) -> Option<u64> {
    let digits = nonce.as_bytes();
    let canonical = !digits.is_empty()
        && digits.iter().all(u8::is_ascii_digit)
        && (digits[0] != b'0' || digits.len() == 1);
    canonical.then(|| nonce.parse().ok()).flatten()
}

impl Default for Nonce {
    fn default() -> Self {
        Nonce::Text(Box::from(""))
    }
}

impl std::fmt::Display for Nonce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Nonce::Seq(seq) => write!(f, "{seq}"),
            Nonce::Text(text) => f.write_str(text),
        }
    }
}

impl Serialize for Nonce {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A moment, as RFC 3339 text when read (empty when unset). Every stream stamps every response
/// and every ACK: the clock is read then, and formatted only by whoever reads the status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp(Option<std::time::SystemTime>);

impl Stamp {
    /// Now.
    pub fn now() -> Self {
        Self(Some(std::time::SystemTime::now()))
    }

    /// As `OffsetDateTime::now_utc().format(&Rfc3339)` would have written it then.
    pub fn rfc3339(&self) -> String {
        self.0
            .and_then(|t| {
                time::OffsetDateTime::from(t)
                    .format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default()
    }
}

impl std::fmt::Display for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.rfc3339())
    }
}

impl Serialize for Stamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.rfc3339())
    }
}

#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Nacked {
    pub version: String,
    pub nonce: String,
    pub message: String,
    pub at: String,
}

#[derive(Clone, Debug, Default, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HeldResource {
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub name: Arc<str>,
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub version: Arc<str>,
    /// The variant's constraints, for locator subscriptions.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub constraints: Option<Arc<str>>,
    /// The body as sent (an encoded `Any`), for CSDS.
    #[serde(skip)]
    #[cfg_attr(feature = "openapi", schema(ignore))]
    pub body: Option<Bytes>,
}

impl TypeStatus {
    /// Whether the last response sent has been refused and nothing later accepted.
    pub fn in_error(&self) -> bool {
        match (&self.last_nacked, &self.last_acked) {
            (Some(n), Some(a)) => nonce_order(&n.nonce) > a.nonce.seq(),
            (Some(_), None) => true,
            _ => false,
        }
    }

    /// Whether the client acknowledged the last response sent.
    pub fn synced(&self) -> bool {
        match (&self.last_sent, &self.last_acked) {
            (Some(s), Some(a)) => s.nonce == a.nonce,
            (None, _) => true,
            _ => false,
        }
    }
}

fn nonce_order(nonce: &str) -> u64 {
    nonce.parse().unwrap_or(0)
}

/// What the client has, as operators see it, under `name`. Every field is shared, not copied.
fn held_resource(sent: &Sent, name: &Arc<str>) -> HeldResource {
    let delivered = match sent {
        Sent::Delivered(item) => Some(item),
        Sent::Reported(_) => None,
    };
    HeldResource {
        name: name.clone(),
        version: sent.version().clone(),
        constraints: delivered
            .filter(|item| item.constrained)
            .and_then(|item| item.variant().constraints_text.clone()),
        body: delivered.map(|item| item.variant().body.clone()),
    }
}

/// Counts changes to what the client summary reads (`crate::summary`): which streams are
/// connected, their node ids, their types' grouped subscriptions. Bumped after each change,
/// so that a summary built from a walk begun at one count is still true while the count
/// stays. Process-wide: a change seen by another registry (tests run several) only costs
/// one walk more.
static SUMMARY_INPUTS: AtomicU64 = AtomicU64::new(0);

/// What the client summary reads changed (see [`SUMMARY_INPUTS`]); called after the change.
pub(crate) fn summary_inputs_changed() {
    SUMMARY_INPUTS.fetch_add(1, Ordering::SeqCst);
}

/// The count of changes to what the client summary reads, read before a walk.
pub(crate) fn summary_inputs() -> u64 {
    SUMMARY_INPUTS.load(Ordering::SeqCst)
}

static SUMMARIES: LazyLock<Interner<[SubscriptionGroup]>> = LazyLock::new(Interner::new);
static SOURCES: LazyLock<Interner<ParamSources>> = LazyLock::new(Interner::new);

/// The shared copy of a type's subscriptions grouped for the client summary (`crate::intern`).
pub(crate) fn shared_summary(groups: Vec<SubscriptionGroup>) -> Arc<[SubscriptionGroup]> {
    let entries = groups.iter().map(|g| g.subscriptions.len()).sum();
    small(&SUMMARIES, entries, groups)
}

/// The shared copy of where a stream's parameters came from (`crate::intern`).
pub(crate) fn shared_param_sources(sources: ParamSources) -> Arc<ParamSources> {
    small(&SOURCES, sources.len(), sources)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stamp reads as the RFC 3339 text the status used to keep, and as nothing when unset.
    #[test]
    fn stamps_read_as_rfc3339() {
        use time::format_description::well_known::Rfc3339;
        let at = std::time::SystemTime::UNIX_EPOCH
            + std::time::Duration::new(1_795_000_000, 123_456_789);
        let stamp = Stamp(Some(at));
        let expected = time::OffsetDateTime::from(at).format(&Rfc3339).unwrap();
        assert_eq!(stamp.rfc3339(), expected);
        assert_eq!(stamp.to_string(), expected);
        assert_eq!(
            serde_json::to_value(stamp).unwrap(),
            serde_json::json!(expected)
        );
        assert_eq!(Stamp::default().rfc3339(), "");
        let acked = Acked {
            at: stamp,
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&acked).unwrap()["at"],
            serde_json::json!(expected)
        );
        let now = Stamp::now().rfc3339();
        assert!(time::OffsetDateTime::parse(&now, &Rfc3339).is_ok(), "{now}");
    }
}
