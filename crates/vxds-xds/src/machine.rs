//! One xDS stream's state machine, for SotW and Delta alike, for ADS and every per-type
//! service: requests and changed resources go in, responses come out. No sockets, no async:
//! the service ([`crate::service`]) drives it, and tests drive it directly.
//!
//! The protocol rules it keeps (Envoy's `xds_protocol`, TP1, TP2, A74):
//! - a unique nonce per response; the node is remembered from the first request;
//! - SotW: a request with a stale nonce is neither ACK nor NACK, but its subscription counts;
//!   an ACK stops re-sending; a NACK is recorded
//!   and the refused version is not sent again (the next change is); newly added names are
//!   answered even when nothing changed; responses carry the whole subscribed state;
//! - Delta: subscription changes count even with a stale nonce; `initial_resource_versions`
//!   spares re-sending what the client has; versions are content hashes; what is subscribed but
//!   does not exist is reported in `removed_resources` (or `removed_resource_names`);
//! - parameters come from the locator, else `node.dynamic_parameters[type_url]`, else the node
//!   metadata fields configured; trusted parameters (the client certificate's identity)
//!   override every source; each subscription gets the one matching variant; locator
//!   subscriptions get it wrapped with its constraints, and a variant replaced by another is
//!   removed and added in one response;
//! - every poll works from one snapshot; additions and updates go out in make-before-break
//!   order (clusters, endpoints, listeners, routes); removals only once every response in
//!   flight has been answered, in the reverse order.

mod config;
mod requests;
mod status_mirror;
#[cfg(test)]
pub(crate) mod tests;
mod tracking;
mod type_state;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use smallvec::SmallVec;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tonic::Status;
use vxds_envoy::changeset::ResourceKey;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_store::Snapshot;

pub use config::{DEFAULT_HEARTBEAT_FRACTION, DEFAULT_MAX_UNANSWERED, MachineConfig, SecretAccess};
pub use type_state::Interest;

/// What a stream subscribes to, per type URL.
pub type StreamInterest = BTreeMap<String, Interest>;

static INTERESTS: std::sync::LazyLock<crate::intern::Interner<StreamInterest>> =
    std::sync::LazyLock::new(crate::intern::Interner::new);

/// The shared copy of a stream's interest, as the registry keeps it (`crate::intern`).
pub(crate) fn shared_interest(interest: StreamInterest) -> Arc<StreamInterest> {
    let entries = interest
        .values()
        .map(|i| i.names.len() + i.collections.len() + 1)
        .sum();
    crate::intern::small(&INTERESTS, entries, interest)
}
use status_mirror::user_agent;
use type_state::{Settled, TypeState};

use crate::params::{ParamSource, locator_params, node_params_from};
use crate::rollout::Dependency;
use crate::status::ClientStatus;
use crate::types::{self, ServiceSpec, push_rank};
use crate::wire::{DeltaResponse, SotwResponse};

/// The client feature that asks for `Resource`-wrapped resources in SotW.
pub const RESOURCE_IN_SOTW: &str = "xds.config.resource-in-sotw";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Sotw,
    Delta,
}

#[derive(Clone, Debug)]
pub enum Response {
    Sotw(SotwResponse),
    Delta(DeltaResponse),
}

impl Response {
    pub fn type_url(&self) -> &str {
        match self {
            Response::Sotw(r) => &r.type_url,
            Response::Delta(r) => &r.type_url,
        }
    }

    pub fn nonce(&self) -> &str {
        match self {
            Response::Sotw(r) => &r.nonce,
            Response::Delta(r) => &r.nonce,
        }
    }
}

/// What a request did, for the service: ACKs and NACKs, for the metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestOutcome {
    /// The types answered (each of a response the server sent, so interned: no copy of the
    /// name per ACK).
    pub acks: AnsweredTypes,
    pub nacks: AnsweredTypes,
    /// SotW: types whose response a later one superseded, and which the client accepted all
    /// the same (a stale nonce): it holds that response's state (rollout tracking).
    pub superseded_acks: AnsweredTypes,
    /// The subscriptions changed: the registry needs the new interest.
    pub interest_changed: bool,
    /// The request named a type URL that is no message of the Envoy API: it was ignored.
    /// `first` when this stream had not asked for it before (it is logged once).
    pub unknown_type: Option<UnknownType>,
    /// Delta: the type and the names the client unsubscribed from (rollout tracking: what it
    /// refused of them, or was to fetch of them, is behind it).
    pub unsubscribed: Option<(&'static str, Vec<String>)>,
}

/// Type URLs a request answered: one, nearly always.
pub type AnsweredTypes = SmallVec<[&'static str; 1]>;

/// A request for a type the server does not know (see [`RequestOutcome::unknown_type`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownType {
    /// As the client sent it, cut to [`crate::status::MAX_UNKNOWN_TYPE_LEN`] bytes.
    pub type_url: String,
    pub first: bool,
}

#[derive(Debug)]
pub struct StreamMachine {
    protocol: Protocol,
    service: &'static ServiceSpec,
    config: Arc<MachineConfig>,
    node: Option<Node>,
    wrap_all: bool,
    /// Boxed: a map node holds eleven values inline, and a `TypeState` is large. Keyed by the
    /// interned type URL (`types::intern`): a lookup compares the request's text with bytes
    /// every stream shares, in cache, not with a copy of the stream's own.
    types: BTreeMap<&'static str, Box<TypeState>>,
    nonce: u64,
    status: Arc<Mutex<ClientStatus>>,
    /// What the client's identity says; no source the client controls overrides these.
    trusted: vxds_core::ParamSet,
    /// Rollout tracking follows what the resources sent name in the next poll.
    follow_references: bool,
    /// What the resources sent in the last poll name that the client does not hold (when
    /// followed).
    dependencies: Vec<Dependency>,
}

fn now() -> String {
    OffsetDateTime::now_utc()
        .format(&Rfc3339)
        .unwrap_or_default()
}

impl StreamMachine {
    pub fn new(
        id: u64,
        protocol: Protocol,
        service: &'static ServiceSpec,
        config: Arc<MachineConfig>,
    ) -> Self {
        let status = ClientStatus {
            stream_id: id,
            service: service.label,
            protocol: match protocol {
                Protocol::Sotw => "sotw",
                Protocol::Delta => "delta",
            },
            connected_at: now(),
            ..Default::default()
        };
        Self {
            protocol,
            service,
            config,
            node: None,
            wrap_all: false,
            types: BTreeMap::new(),
            nonce: 0,
            status: Arc::new(Mutex::new(status)),
            trusted: vxds_core::ParamSet::new(),
            follow_references: false,
            dependencies: Vec::new(),
        }
    }

    /// Records who the transport says the client is (its certificate, on mutual TLS) and the
    /// parameters its identity fixes. Called before the first request.
    pub fn set_peer(
        &mut self,
        peer: Option<crate::identity::PeerIdentity>,
        trusted: vxds_core::ParamSet,
    ) {
        if let Ok(mut status) = self.status.lock() {
            status.identity = peer.as_ref().and_then(|p| p.identity()).map(str::to_owned);
            status.peer = peer;
            status.trusted_params = trusted.0.clone();
        }
        self.trusted = trusted;
    }

    /// The parameters plain-name subscriptions of `type_url` resolve with.
    fn default_params(&self, type_url: &str) -> vxds_core::ParamSet {
        let (params, _) = node_params_from(
            self.node.as_ref(),
            type_url,
            &self.config.node_metadata_params,
        );
        vxds_core::overlay_trusted(params, &self.trusted)
    }

    /// A locator's parameters, trusted ones imposed.
    fn locator_params(
        &self,
        parameters: &std::collections::HashMap<String, String>,
    ) -> vxds_core::ParamSet {
        vxds_core::overlay_trusted(locator_params(parameters), &self.trusted)
    }

    /// Where each of `type_url`'s default parameters came from.
    fn param_sources(&self, type_url: &str) -> BTreeMap<String, &'static str> {
        let (params, source) = node_params_from(
            self.node.as_ref(),
            type_url,
            &self.config.node_metadata_params,
        );
        let mut sources: BTreeMap<String, &'static str> =
            params.0.into_keys().map(|k| (k, source.label())).collect();
        for (key, _) in self.trusted.iter() {
            sources.insert(key.to_owned(), ParamSource::Identity.label());
        }
        sources
    }

    /// The stream's status, shared with the registry for `/v1/clients` and CSDS.
    pub fn status(&self) -> Arc<Mutex<ClientStatus>> {
        self.status.clone()
    }

    pub fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }

    /// What the stream subscribes to, per type.
    pub fn interest(&self) -> StreamInterest {
        let mut interest: StreamInterest = self
            .types
            .iter()
            .map(|(t, s)| ((*t).to_owned(), s.interest()))
            .collect();
        // List collections watch their members (and stored collections) in other types.
        for state in self.types.values() {
            for (type_url, extra) in state.list_interest() {
                let into = interest.entry(type_url).or_default();
                into.names.extend(extra.names);
                into.collections.extend(extra.collections);
            }
        }
        interest
    }

    /// Remembers the node from the first request that carries one. Later requests may carry
    /// it again with new dynamic parameters (Envoy's `setDynamicContextParam`): the variants
    /// follow, for every type whose parameters changed.
    fn update_node(&mut self, node: Option<&Node>) {
        let Some(node) = node else { return };
        let Some(known) = &self.node else {
            self.node = Some(node.clone());
            self.wrap_all = node.client_features.iter().any(|f| f == RESOURCE_IN_SOTW);
            if let Ok(mut status) = self.status.lock() {
                status.node_id = node.id.clone();
                status.node_cluster = node.cluster.clone();
                status.client_features = node.client_features.clone();
                status.user_agent = user_agent(node);
                crate::status::summary_inputs_changed();
            }
            return;
        };
        let metadata_matters = !self.config.node_metadata_params.is_empty();
        if known.dynamic_parameters == node.dynamic_parameters
            && (!metadata_matters || known.metadata == node.metadata)
        {
            return;
        }
        if let Some(known) = &mut self.node {
            known.dynamic_parameters = node.dynamic_parameters.clone();
            known.metadata = node.metadata.clone();
        }
        let type_urls: Vec<&'static str> = self.types.keys().copied().collect();
        for type_url in type_urls {
            let params = self.default_params(type_url);
            let changed = self
                .types
                .get_mut(type_url)
                .is_some_and(|ty| ty.set_default_params(params));
            if changed {
                self.refresh_status(type_url, true);
            }
        }
    }

    /// The type a request is for; `None` for a type URL that names no message of the Envoy
    /// API on ADS: such a request is ignored and the stream lives (grpc-go's rule; ending the
    /// stream would make the client reconnect at once, in a loop, with a full push each time).
    /// Interned (`types::intern`): known types are few, and every stream shares their text.
    fn type_url(&self, requested: &str) -> Result<Option<&'static str>, Status> {
        match self.service.type_url {
            None if requested.is_empty() => {
                Err(Status::invalid_argument("type_url is required on ADS"))
            }
            None => {
                if let Some((&known, _)) = self.types.get_key_value(requested) {
                    return Ok(Some(known));
                }
                let known = requested
                    .strip_prefix(vxds_envoy::resource::TYPE_URL_PREFIX)
                    .is_some_and(|name| vxds_envoy::descriptors::message(name).is_some());
                Ok(known.then(|| types::intern(requested)))
            }
            Some(fixed) if requested.is_empty() || requested == fixed => Ok(Some(fixed)),
            Some(fixed) => Err(Status::invalid_argument(format!(
                "this service serves {fixed}, not {requested}"
            ))),
        }
    }

    /// A request for a type the server does not know: recorded in the stream's status (the
    /// first few), never answered.
    fn unknown_type(&mut self, requested: &str) -> RequestOutcome {
        use crate::status::{MAX_UNKNOWN_TYPE_LEN, MAX_UNKNOWN_TYPES};
        let mut end = requested.len().min(MAX_UNKNOWN_TYPE_LEN);
        while !requested.is_char_boundary(end) {
            end -= 1;
        }
        let type_url = requested[..end].to_owned();
        let first = match self.status.lock() {
            Ok(mut status) if !status.unknown_types.contains(&type_url) => {
                let room = status.unknown_types.len() < MAX_UNKNOWN_TYPES;
                if room {
                    status.unknown_types.push(type_url.clone());
                }
                room
            }
            _ => false,
        };
        RequestOutcome {
            unknown_type: Some(UnknownType { type_url, first }),
            ..Default::default()
        }
    }

    fn type_state(&mut self, type_url: &'static str) -> Result<&mut TypeState, Status> {
        if !self.types.contains_key(type_url) {
            if self.types.len() >= self.config.max_types {
                return Err(Status::resource_exhausted(format!(
                    "a stream may subscribe to at most {} resource types",
                    self.config.max_types
                )));
            }
            let params = self.default_params(type_url);
            let mut state = TypeState::new(type_url, params);
            if type_url == types::SECRET {
                state.secrets = Some(self.config.secrets.clone());
            }
            state.inline_lists = self.node.as_ref().is_some_and(|n| {
                n.client_features
                    .iter()
                    .any(|f| f == vxds_envoy::collections::INLINE_ENTRIES_FEATURE)
            });
            self.types.insert(type_url, Box::new(state));
        }
        Ok(self.types.get_mut(type_url).expect("just inserted"))
    }

    /// After a request of `type_url`: the limits and the status, for what it changed. An ACK
    /// changes neither the subscriptions (counted against the limits when they change) nor
    /// what the client holds (which moves when a response is sent), so it costs neither.
    fn settle_request(&mut self, type_url: &str, interest_changed: bool) -> Result<(), Status> {
        if interest_changed {
            self.check_limits()?;
        }
        if interest_changed || self.types.get(type_url).is_some_and(|ty| ty.held_changed()) {
            self.refresh_status(type_url, interest_changed);
        }
        Ok(())
    }

    fn check_limits(&self) -> Result<(), Status> {
        let count: usize = self.types.values().map(|t| t.subscription_count()).sum();
        if count > self.config.max_subscriptions {
            return Err(Status::resource_exhausted(format!(
                "the stream subscribes to {count} resources; the limit is {}",
                self.config.max_subscriptions
            )));
        }
        Ok(())
    }

    /// These resources changed (the registry says they concern this stream).
    pub fn on_changes<'a>(&mut self, changed: impl IntoIterator<Item = &'a ResourceKey>) {
        for key in changed {
            if let Some(ty) = self.types.get_mut(key.type_url.as_str()) {
                ty.resource_changed(&key.name);
            }
            for ty in self.types.values_mut() {
                ty.list_member_changed(key);
            }
        }
    }

    /// Everything may have changed (the change history did not reach back far enough).
    pub fn on_everything_changed(&mut self) {
        self.types.values_mut().for_each(|t| t.everything_changed());
    }

    /// The responses to send now, all computed from `snapshot`.
    ///
    /// Make, then break (A74): additions and updates go out at once, in push order; a removal
    /// waits until every response sent up to the moment it became due is accepted — the
    /// updates computed with it and any still in flight then — whatever is sent after. So
    /// churn on one type never starves another's removals, and a refused update holds back
    /// only the removals the client's accepted configuration still names (`Settled`), until
    /// a later update is accepted.
    pub fn poll(&mut self, snapshot: &Snapshot) -> Vec<Response> {
        let follow = std::mem::take(&mut self.follow_references);
        if self.rest_if_quiet() {
            return Vec::new();
        }
        self.dependencies.clear();
        for ty in self.types.values_mut() {
            ty.removals_due_now.clear();
            ty.follow_references = follow;
        }
        for ty in self.types.values_mut() {
            ty.refresh(snapshot);
        }
        // The types in push order, as references: no name copied, no allocation for a few.
        let mut order: SmallVec<[&mut TypeState; 4]> =
            self.types.values_mut().map(|ty| &mut **ty).collect();
        order.sort_by(|a, b| {
            (push_rank(&a.type_url), &a.type_url).cmp(&(push_rank(&b.type_url), &b.type_url))
        });
        // Shared by the responses and what they leave in flight.
        let system_version = revision_text(snapshot.revision);
        let mut responses = Vec::new();

        // Make: additions and updates, in make-before-break order. A SotW response leaves out
        // the removals already eligible, so that no second response of the type follows.
        let settled = Settled::of(order.iter().map(|ty| &**ty));
        for ty in order.iter_mut() {
            let seq = self.nonce + 1;
            let wrap_all = self.wrap_all;
            let response = match self.protocol {
                Protocol::Sotw => ty
                    .sotw_make(seq, snapshot.revision, wrap_all, &settled)
                    .map(Response::Sotw),
                Protocol::Delta => ty.delta_make(seq, &system_version).map(Response::Delta),
            };
            if let Some(response) = response {
                self.nonce = seq;
                responses.push(response);
            }
        }
        let last_sent = self.nonce;
        for ty in order.iter_mut() {
            ty.stamp_removals(last_sent);
        }
        // Break: the removals every earlier response has cleared, in the reverse order.
        let settled = Settled::of(order.iter().map(|ty| &**ty));
        for ty in order.iter_mut().rev() {
            let seq = self.nonce + 1;
            let wrap_all = self.wrap_all;
            let response = match self.protocol {
                Protocol::Sotw => ty
                    .sotw_break(seq, snapshot.revision, wrap_all, &settled)
                    .map(Response::Sotw),
                Protocol::Delta => ty
                    .delta_break(seq, &system_version, &settled)
                    .map(Response::Delta),
            };
            if let Some(response) = response {
                self.nonce = seq;
                responses.push(response);
            }
        }
        drop(order);
        for response in &responses {
            self.record_sent(response);
        }
        if follow {
            self.follow(snapshot);
        }
        // What emptied is freed by a poll that sends nothing (the one after the client's
        // answer, usually): one that sends leaves the responses' bookkeeping to answer.
        if responses.is_empty() {
            for ty in self.types.values_mut() {
                ty.free_emptied();
            }
        }
        responses
    }

    /// When no type has anything to compute or send (nothing dirty, stale, forced, missing
    /// or waiting for removal — after an ACK, nearly always), what a poll does then, without
    /// a snapshot: the last computation's removals and references are forgotten, what
    /// emptied is freed. Whether it was so; if not, nothing changed.
    pub fn rest_if_quiet(&mut self) -> bool {
        if !self.types.values().all(|ty| ty.quiet()) {
            return false;
        }
        self.dependencies.clear();
        for ty in self.types.values_mut() {
            ty.removals_due_now.clear();
            ty.free_emptied();
        }
        true
    }

    /// The shortest TTL among the resources heartbeats renew on this stream (what the client
    /// accepted): the stream is woken at a fraction of it. `None` when there is none: no
    /// heartbeat ever wakes it.
    pub fn shortest_ttl(&self) -> Option<std::time::Duration> {
        let delta = self.protocol == Protocol::Delta;
        self.types
            .values()
            .filter_map(|t| t.shortest_ttl(delta))
            .min()
    }

    /// Heartbeats, at most one response per type, for the TTL'd resources the client accepted
    /// whose renewal is due at `now` (each at its own TTL's pace): they renew the TTLs and
    /// change nothing the client has. From the stream's own state, not the snapshot;
    /// `revision` is the Delta `system_version_info`.
    pub fn heartbeat(&mut self, revision: u64, now: std::time::Instant) -> Vec<Response> {
        let Some(shortest) = self.shortest_ttl() else {
            return Vec::new();
        };
        let fraction = self.config.heartbeat_fraction;
        let beat = type_state::heartbeat::Beat {
            now,
            period: shortest.mul_f64(fraction),
            fraction,
        };
        let system_version = revision_text(revision);
        let mut responses = Vec::new();
        for ty in self.types.values_mut() {
            let seq = self.nonce + 1;
            let response = match self.protocol {
                Protocol::Sotw => ty
                    .sotw_heartbeat(seq, self.wrap_all, beat)
                    .map(Response::Sotw),
                Protocol::Delta => ty
                    .delta_heartbeat(seq, &system_version, beat)
                    .map(Response::Delta),
            };
            if let Some(response) = response {
                self.nonce = seq;
                responses.push(response);
            }
        }
        for response in &responses {
            self.record_sent(response);
        }
        responses
    }

    /// A client that leaves more than `max_unanswered` responses unanswered is ended: what
    /// they carried is kept until answered, so the server's memory would follow its silence.
    pub fn check_backlog(&self) -> Result<(), Status> {
        let unanswered: usize = self.types.values().map(|t| t.unanswered).sum();
        if unanswered > self.config.max_unanswered {
            return Err(Status::resource_exhausted(format!(
                "{unanswered} responses unanswered on this stream; the limit is {}",
                self.config.max_unanswered
            )));
        }
        Ok(())
    }
}

/// A revision as Delta's `system_version_info`, shared by the responses of one computation
/// and what they leave in flight.
///
/// The last one made on this thread is kept: every stream computing from one snapshot shares
/// it, not a string formatted and allocated each.
fn revision_text(revision: u64) -> Arc<str> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(u64, Arc<str>)>> = const { std::cell::RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((at, text)) if *at == revision => text.clone(),
        _ => {
            let text: Arc<str> = Arc::from(revision.to_string());
            *last = Some((revision, text.clone()));
            text
        }
    })
}

/// The type URL of a per-type service, or the one a request names.
pub fn known_types() -> &'static [&'static str] {
    &types::PUSH_ORDER
}

#[cfg(test)]
mod revision_text_tests {
    use super::*;

    #[test]
    fn revisions_are_written_as_decimal_text() {
        for revision in [0, 7, 7, 10, 12_345, 7, u64::MAX, u64::MAX] {
            assert_eq!(&*revision_text(revision), revision.to_string());
        }
        // The same revision twice in a row is one shared text.
        assert!(Arc::ptr_eq(&revision_text(41), &revision_text(41)));
    }
}
