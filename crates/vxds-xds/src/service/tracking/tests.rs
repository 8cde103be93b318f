#![allow(clippy::unwrap_used)]
//! A whole stream (machine, rollout tracking, registry) driven by client messages: what a
//! revision waits for is what the client really fetches on the stream.

use std::sync::Arc;

use serde_json::{Value, json};
use vxds_core::rollout::RolloutRecord;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use vxds_envoy::pb::google::rpc::Status as RpcStatus;

use super::*;
use crate::machine::{MachineConfig, Protocol};
use crate::registry::{Registration, Registry};
use crate::rollout::{Known, NEED_GRACE};
use crate::types::{ADS, CLUSTER, ENDPOINT, LISTENER, ROUTE, SECRET, SERVICES};

pub(super) use crate::machine::tests::World;

pub(super) fn put(ty: &str, name: &str, resource: Value) -> Value {
    json!({"type": ty, "name": name, "variants": [{"constraints": "*", "resource": resource}]})
}

pub(super) fn listener(name: &str, route_name: &str) -> Value {
    json!({"@type": LISTENER, "name": name, "address": {"socket_address": {"address": "0.0.0.0", "port_value": 1}},
           "filter_chains": [{"filters": [{"name": "hcm", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
               "stat_prefix": "x", "rds": {"route_config_name": route_name, "config_source": {"ads": {}}}}}]}]})
}

pub(super) fn cluster(name: &str) -> Value {
    json!({"@type": CLUSTER, "name": name, "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}})
}

pub(super) fn cla(name: &str) -> Value {
    json!({"@type": ENDPOINT, "cluster_name": name})
}

/// Two virtual hosts: `a.example` → `ca`, `b.example` → `cb`.
pub(super) fn route2(name: &str, ca: &str, cb: &str) -> Value {
    json!({"@type": ROUTE, "name": name, "virtual_hosts": [
        {"name": "a", "domains": ["a.example"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": ca}}]},
        {"name": "b", "domains": ["b.example"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cb}}]}]})
}

pub(super) struct Stream {
    pub registry: Arc<Registry>,
    pub machine: StreamMachine,
    pub rollout: StreamRollout,
    pub reg: Registration,
    pub label: &'static str,
    pub id: u64,
}

impl Stream {
    pub fn new(
        registry: &Arc<Registry>,
        id: u64,
        protocol: Protocol,
        spec: &'static crate::types::ServiceSpec,
    ) -> Self {
        let machine = StreamMachine::new(id, protocol, spec, Arc::new(MachineConfig::default()));
        let reg = registry.register(id, machine.status());
        let mut rollout = StreamRollout::new(registry.rollouts.clone(), id);
        if protocol == Protocol::Delta {
            rollout = rollout.delta();
        }
        Self {
            registry: registry.clone(),
            machine,
            rollout,
            reg,
            label: spec.label,
            id,
        }
    }

    async fn after(
        &mut self,
        outcome: crate::machine::RequestOutcome,
        nonce: Option<u64>,
    ) -> Vec<Response> {
        if let Some(node) = self.machine.node() {
            let id = node.id.clone();
            self.rollout.identify(self.label, &id);
        }
        let refusals = record_answers(&mut self.rollout, &self.machine, &outcome, nonce);
        // The stream task's own path after a request.
        if !computes_after_request(
            (&self.registry, self.id),
            &self.rollout,
            &mut self.machine,
            &outcome,
        ) {
            return Vec::new();
        }
        after_request(
            &self.registry,
            &self.reg.inbox,
            &mut self.rollout,
            &mut self.machine,
            refusals,
        )
        .await
    }

    pub async fn sotw(
        &mut self,
        type_url: &str,
        names: &[&str],
        nonce: &str,
        nack: Option<&str>,
    ) -> Vec<Response> {
        let request = DiscoveryRequest {
            type_url: type_url.into(),
            resource_names: names.iter().map(|n| (*n).into()).collect(),
            response_nonce: nonce.into(),
            node: Some(Node {
                id: "node-1".into(),
                ..Default::default()
            }),
            error_detail: nack.map(|m| RpcStatus {
                code: 3,
                message: m.into(),
                details: vec![],
            }),
            ..Default::default()
        };
        let outcome = self.machine.on_sotw_request(request).unwrap();
        self.after(outcome, nonce.parse().ok()).await
    }

    pub async fn delta(
        &mut self,
        type_url: &str,
        sub: &[&str],
        unsub: &[&str],
        nonce: &str,
        nack: Option<&str>,
    ) -> Vec<Response> {
        let request = DeltaDiscoveryRequest {
            type_url: type_url.into(),
            resource_names_subscribe: sub.iter().map(|n| (*n).into()).collect(),
            resource_names_unsubscribe: unsub.iter().map(|n| (*n).into()).collect(),
            response_nonce: nonce.into(),
            node: Some(Node {
                id: "node-1".into(),
                ..Default::default()
            }),
            error_detail: nack.map(|m| RpcStatus {
                code: 3,
                message: m.into(),
                details: vec![],
            }),
            ..Default::default()
        };
        let outcome = self.machine.on_delta_request(request).unwrap();
        self.after(outcome, nonce.parse().ok()).await
    }

    /// Woken by the inbox: the stream task's own path then.
    pub async fn wake(&mut self) -> Vec<Response> {
        catch_up_and_compute(
            &self.registry,
            &self.reg.inbox,
            &mut self.rollout,
            &mut self.machine,
        )
        .await
        .0
    }
}

pub(super) fn commit(registry: &Registry, world: &mut World, ops: Value) -> u64 {
    let changed = world.apply(ops);
    let snapshot = Arc::new(world.snapshot.clone());
    registry.dispatch(
        snapshot.clone(),
        Some(changed.into_iter().map(Arc::new).collect()),
    );
    snapshot.revision
}

pub(super) fn record(registry: &Registry, revision: u64) -> RolloutRecord {
    match registry.rollouts.get(revision) {
        Known::Record(r) => *r,
        other => panic!("{other:?}"),
    }
}

/// Envoy with per-type gRPC config sources (no ADS): LDS on its own stream, RDS on another.
/// A revision adding a listener whose route Envoy fetches on the RDS stream never completes
/// on the LDS stream.
#[tokio::test]
async fn a_per_type_lds_stream_does_not_wait_for_the_routes_fetched_on_rds() {
    let mut world = World::new();
    let registry = Arc::new(Registry::new(Arc::new(world.snapshot.clone())));
    let mut lds = Stream::new(&registry, 1, Protocol::Sotw, &SERVICES[1]);
    let mut rds = Stream::new(&registry, 2, Protocol::Sotw, &SERVICES[2]);
    let sent = lds.sotw(LISTENER, &[], "", None).await;
    let n = sent[0].nonce().to_owned();
    lds.sotw(LISTENER, &[], &n, None).await;
    let rev = commit(
        &registry,
        &mut world,
        json!([
            put("listener", "l", listener("l", "r1")),
            put("route", "r1", json!({"@type": ROUTE, "name": "r1"})),
        ]),
    );
    let sent = lds.wake().await;
    let n = sent[0].nonce().to_owned();
    lds.sotw(LISTENER, &[], &n, None).await;
    // Envoy's RDS stream fetches r1 and accepts it.
    let sent = rds.sotw(ROUTE, &["r1"], "", None).await;
    let n = sent[0].nonce().to_owned();
    rds.sotw(ROUTE, &["r1"], &n, None).await;
    lds.wake().await;
    assert_eq!(
        record(&registry, rev).pending,
        0,
        "the LDS stream's revision stays pending"
    );
}

/// gRPC (ADS Delta, everything by name) for target a.example: it subscribes only to the
/// clusters of the virtual host its target matches. A revision that changes b.example's
/// cluster in the shared route configuration never completes on it.
#[tokio::test]
async fn grpc_delta_does_not_wait_for_another_virtual_hosts_cluster() {
    let mut world = World::new();
    world.apply(json!([
        put("listener", "svc", listener("svc", "r")),
        put("route", "r", route2("r", "ca", "cb")),
        put("cluster", "ca", cluster("ca")),
        put("cluster", "cb", cluster("cb")),
        put("cluster", "cb2", cluster("cb2")),
        put("endpoint", "ca", cla("ca")),
    ]));
    let registry = Arc::new(Registry::new(Arc::new(world.snapshot.clone())));
    let mut g = Stream::new(&registry, 1, Protocol::Delta, &ADS);
    for (ty, name) in [
        (LISTENER, "svc"),
        (ROUTE, "r"),
        (CLUSTER, "ca"),
        (ENDPOINT, "ca"),
    ] {
        let sent = g.delta(ty, &[name], &[], "", None).await;
        for r in sent {
            let n = r.nonce().to_owned();
            g.delta(r.type_url(), &[], &[], &n, None).await;
        }
    }
    let rev = commit(
        &registry,
        &mut world,
        json!([put("route", "r", route2("r", "ca", "cb2"))]),
    );
    let sent = g.wake().await;
    for r in sent {
        let n = r.nonce().to_owned();
        g.delta(r.type_url(), &[], &[], &n, None).await;
    }
    g.wake().await;
    assert_eq!(
        record(&registry, rev).pending,
        0,
        "gRPC never fetches cb2 (b.example's)"
    );
}

/// Envoy (ADS SotW) whose SDS comes from elsewhere (another SDS server, or a static secret in
/// its bootstrap) under a name vxds also stores (for other nodes): the secret is waited for
/// only [`NEED_GRACE`], and an idle stream's revision then settles at the deadline it reports.
#[tokio::test(start_paused = true)]
async fn a_secret_never_asked_for_stops_being_waited_for_after_the_grace() {
    let mut world = World::new();
    world.apply(json!([put("secret", "cert", secret("cert"))]));
    let registry = Arc::new(Registry::new(Arc::new(world.snapshot.clone())));
    let mut e = Stream::new(&registry, 1, Protocol::Sotw, &ADS);
    let sent = e.sotw(LISTENER, &[], "", None).await;
    let n = sent[0].nonce().to_owned();
    e.sotw(LISTENER, &[], &n, None).await;
    assert_eq!(e.rollout.need_deadline(), None);
    let rev = commit(
        &registry,
        &mut world,
        json!([put("listener", "l", tls_listener("cert"))]),
    );
    let sent = e.wake().await;
    let n = sent[0].nonce().to_owned();
    e.sotw(LISTENER, &[], &n, None).await;
    e.wake().await;
    assert_eq!(
        record(&registry, rev).pending,
        1,
        "the secret is waited for"
    );
    let deadline = e.rollout.need_deadline().unwrap();
    assert_eq!(deadline, tokio::time::Instant::now() + NEED_GRACE);
    // The stream's task sleeps until the deadline, and no message comes.
    tokio::time::sleep_until(deadline).await;
    e.rollout.needs_expired();
    assert_eq!(
        record(&registry, rev).pending,
        0,
        "a secret Envoy holds statically"
    );
    assert_eq!(record(&registry, rev).acked, 1);
    assert_eq!(e.rollout.need_deadline(), None);
}

/// Once the client asks for what a revision's resources name, the grace is over: the revision
/// waits for its answer, however long it takes, and a refusal refuses it.
#[tokio::test(start_paused = true)]
async fn a_secret_asked_for_is_waited_for_to_the_answer() {
    let mut world = World::new();
    world.apply(json!([put("secret", "cert", secret("cert"))]));
    let registry = Arc::new(Registry::new(Arc::new(world.snapshot.clone())));
    let mut e = Stream::new(&registry, 1, Protocol::Sotw, &ADS);
    let sent = e.sotw(LISTENER, &[], "", None).await;
    let n = sent[0].nonce().to_owned();
    e.sotw(LISTENER, &[], &n, None).await;
    let rev = commit(
        &registry,
        &mut world,
        json!([put("listener", "l", tls_listener("cert"))]),
    );
    let sent = e.wake().await;
    let n = sent[0].nonce().to_owned();
    e.sotw(LISTENER, &[], &n, None).await;
    let sds = e.sotw(SECRET, &["cert"], "", None).await;
    assert_eq!(sds[0].type_url(), SECRET);
    assert_eq!(e.rollout.need_deadline(), None, "asked for: no grace runs");
    tokio::time::advance(NEED_GRACE * 3).await;
    e.rollout.needs_expired();
    assert_eq!(record(&registry, rev).pending, 1);
    let n = sds[0].nonce().to_owned();
    e.sotw(SECRET, &["cert"], &n, Some("bad key")).await;
    assert_eq!(record(&registry, rev).nacked, 1);
}

fn secret(name: &str) -> Value {
    json!({"@type": SECRET, "name": name,
        "tls_certificate": {"certificate_chain": {"inline_string": "x"}, "private_key": {"inline_string": "y"}}})
}

fn tls_listener(secret: &str) -> Value {
    json!({"@type": LISTENER, "name": "l", "address": {"socket_address": {"address": "0.0.0.0", "port_value": 1}},
        "filter_chains": [{"transport_socket": {"name": "tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"tls_certificate_sds_secret_configs": [{"name": secret}]}}},
          "filters": [{"name": "tcp", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "t", "cluster": "static_c"}}]}]})
}

/// Envoy with on-demand CDS only (no CDS wildcard; Delta ADS): a route change naming a
/// cluster it has not asked for yet waits until traffic asks for it.
#[tokio::test]
async fn on_demand_cds_does_not_wait_for_a_cluster_not_asked_for() {
    let mut world = World::new();
    world.apply(json!([
        put("route", "r", route2("r", "ca", "cb")),
        put("cluster", "ca", cluster("ca")),
        put("cluster", "cc", cluster("cc")),
    ]));
    let registry = Arc::new(Registry::new(Arc::new(world.snapshot.clone())));
    let mut e = Stream::new(&registry, 1, Protocol::Delta, &ADS);
    for (ty, name) in [(ROUTE, "r"), (CLUSTER, "ca")] {
        for r in e.delta(ty, &[name], &[], "", None).await {
            let n = r.nonce().to_owned();
            e.delta(r.type_url(), &[], &[], &n, None).await;
        }
    }
    let rev = commit(
        &registry,
        &mut world,
        json!([put("route", "r", route2("r", "ca", "cc"))]),
    );
    for r in e.wake().await {
        let n = r.nonce().to_owned();
        e.delta(r.type_url(), &[], &[], &n, None).await;
    }
    e.wake().await;
    assert_eq!(
        record(&registry, rev).pending,
        0,
        "ODCDS fetches cc at the first request for it"
    );
}

/// gRPC-go (SotW ADS, by name) for a.example; and the control: Envoy ADS SotW completes.
#[tokio::test]
async fn grpc_sotw_does_not_wait_for_another_virtual_hosts_cluster() {
    let mut world = World::new();
    world.apply(json!([
        put("listener", "svc", listener("svc", "r")),
        put("route", "r", route1("r", "ca")),
        put("cluster", "ca", cluster("ca")),
        put("cluster", "cb", cluster("cb")),
        put("cluster", "cb2", cluster("cb2")),
        put("cluster", "ca2", cluster("ca2")),
        put("endpoint", "ca", cla("ca")),
    ]));
    let registry = Arc::new(Registry::new(Arc::new(world.snapshot.clone())));
    let mut g = Stream::new(&registry, 1, Protocol::Sotw, &ADS);
    for (ty, name) in [
        (LISTENER, "svc"),
        (ROUTE, "r"),
        (CLUSTER, "ca"),
        (ENDPOINT, "ca"),
    ] {
        for r in g.sotw(ty, &[name], "", None).await {
            let n = r.nonce().to_owned();
            g.sotw(r.type_url(), &[name], &n, None).await;
        }
    }
    // Control: a.example's cluster changes to ca2; gRPC fetches it (and its endpoints).
    commit(
        &registry,
        &mut world,
        json!([put("route", "r", route1("r", "ca2"))]),
    );
    for r in g.wake().await {
        let n = r.nonce().to_owned();
        g.sotw(r.type_url(), &["r"], &n, None).await;
    }
    for r in g.sotw(CLUSTER, &["ca", "ca2"], "", None).await {
        let n = r.nonce().to_owned();
        g.sotw(r.type_url(), &["ca", "ca2"], &n, None).await;
    }
    // b.example's cluster changes: gRPC for a.example never asks for cb2.
    let rev = commit(
        &registry,
        &mut world,
        json!([put("route", "r", route2("r", "ca2", "cb2"))]),
    );
    for r in g.wake().await {
        let n = r.nonce().to_owned();
        g.sotw(r.type_url(), &["r"], &n, None).await;
    }
    g.wake().await;
    assert_eq!(record(&registry, rev).pending, 0);
}

fn route1(name: &str, ca: &str) -> Value {
    json!({"@type": ROUTE, "name": name, "virtual_hosts": [
        {"name": "a", "domains": ["a.example"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": ca}}]}]})
}

/// A cluster that names nothing the client fetches next (its endpoints inline).
fn static_cluster(name: &str, connect_timeout: &str) -> Value {
    json!({"@type": CLUSTER, "name": name, "type": "STATIC", "connect_timeout": connect_timeout,
           "load_assignment": {"cluster_name": name}})
}

/// Review of 3ac2103: an answer with nothing else to do skips the catch-up and the
/// computation, but a SotW refusal does not: a later revision waiting in the inbox is sent
/// at once, as the type's whole state, and that answers for the refusal (it counts against
/// no revision).
#[tokio::test]
async fn a_sotw_refusal_followed_at_once_by_a_later_state_refuses_no_revision() {
    let mut world = World::new();
    world.apply(json!([put("cluster", "c", static_cluster("c", "1s"))]));
    let registry = Arc::new(Registry::new(Arc::new(world.snapshot.clone())));
    let mut s = Stream::new(&registry, 1, Protocol::Sotw, &ADS);
    for r in s.sotw(CLUSTER, &["c"], "", None).await {
        let n = r.nonce().to_owned();
        assert!(s.sotw(CLUSTER, &["c"], &n, None).await.is_empty());
    }
    let r1 = commit(
        &registry,
        &mut world,
        json!([put("cluster", "c", static_cluster("c", "2s"))]),
    );
    let sent = s.wake().await;
    assert_eq!(sent.len(), 1);
    let n1 = sent[0].nonce().to_owned();
    let r2 = commit(
        &registry,
        &mut world,
        json!([put("cluster", "c", static_cluster("c", "3s"))]),
    );
    // The refusal of r1's response, r2 marked and not yet computed.
    let after = s.sotw(CLUSTER, &["c"], &n1, Some("bad")).await;
    assert_eq!(after.len(), 1, "r2's state follows the refusal at once");
    assert_eq!(record(&registry, r1).nacked, 0);
    let n2 = after[0].nonce().to_owned();
    assert!(s.sotw(CLUSTER, &["c"], &n2, None).await.is_empty());
    let (one, two) = (record(&registry, r1), record(&registry, r2));
    assert_eq!((one.acked, one.nacked, one.pending), (1, 0, 0));
    assert_eq!((two.acked, two.nacked, two.pending), (1, 0, 0));
}
