//! The stream state machine without sockets: one test per protocol rule.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use prost::Message;
use serde_json::{Value, json};
use vxds_envoy::changeset::{Action, ChangesetRequest, validate};
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    DynamicParameterConstraints, Resource, ResourceLocator,
};
use vxds_envoy::pb::google::rpc::Status as RpcStatus;
use vxds_envoy::pb::xds::core::v3::ContextParams;
use vxds_store::{ChangeBatch, ResourceKey, RevisionChangeList, Snapshot, StoredResource};

use super::*;
use crate::types::{ADS, CLUSTER, ENDPOINT, LISTENER, ROUTE, SERVICES};

mod collections;
mod identity;
mod references;
mod removals;
mod subscriptions;
mod summary;
mod ttl;

/// A store in memory: changesets in, snapshots out (the stream tests of `service` use it too).
pub(crate) struct World {
    pub(crate) snapshot: Snapshot,
}

impl World {
    pub(crate) fn new() -> Self {
        Self {
            snapshot: Snapshot::default(),
        }
    }

    /// Applies put (`{"type", "name", "variants"}`) and delete (`{"op": "delete", ...}`)
    /// operations as one revision; returns the changed keys.
    pub(crate) fn apply(&mut self, ops: Value) -> Vec<ResourceKey> {
        let ops: Vec<Value> = ops
            .as_array()
            .unwrap()
            .iter()
            .map(|op| {
                let mut op = op.clone();
                op.as_object_mut()
                    .unwrap()
                    .entry("op")
                    .or_insert(json!("put"));
                op
            })
            .collect();
        let request: ChangesetRequest = serde_json::from_value(json!({"operations": ops})).unwrap();
        let validated = validate(&request, &Default::default()).unwrap_or_else(|e| panic!("{e:?}"));
        let revision = self.snapshot.revision + 1;
        let mut batch = ChangeBatch {
            revision,
            commit_id: 0,
            revisions: vec![RevisionChangeList {
                revision,
                committed_at_ms: 1,
                changed: vec![],
                ..Default::default()
            }],
            resources: vec![],
            deleted: vec![],
            complete: false,
        };
        for op in validated.changeset.operations {
            batch.revisions[0].changed.push(op.key.clone());
            match op.action {
                Action::Put(resource) => batch.resources.push(StoredResource::from_validated(
                    op.key, &resource, revision, 1,
                )),
                Action::Delete => batch.deleted.push(op.key),
            }
        }
        let changed = batch.revisions[0].changed.clone();
        self.snapshot = self.snapshot.apply(batch);
        changed
    }
}

fn route(name: &str, tag: &str) -> Value {
    json!({"@type": ROUTE, "name": name, "virtual_hosts": [{"name": tag, "domains": ["*"]}]})
}

fn cluster(name: &str) -> Value {
    json!({"@type": CLUSTER, "name": name, "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}})
}

fn listener(name: &str, route_name: &str) -> Value {
    json!({"@type": LISTENER, "name": name, "address": {"socket_address": {"address": "0.0.0.0", "port_value": 1}},
           "filter_chains": [{"filters": [{"name": "hcm", "typed_config": {
               "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
               "stat_prefix": "x", "rds": {"route_config_name": route_name, "config_source": {"ads": {}}}}}]}]})
}

fn put(ty: &str, name: &str, variants: &[(&str, Value)]) -> Value {
    let variants: Vec<Value> = variants
        .iter()
        .map(|(c, r)| json!({"constraints": c, "resource": r}))
        .collect();
    json!({"type": ty, "name": name, "variants": variants})
}

fn delete(ty: &str, name: &str) -> Value {
    json!({"op": "delete", "type": ty, "name": name})
}

/// The env/version route table: `web` has a variant per env.
fn env_routes(world: &mut World) {
    world.apply(json!([put(
        "route",
        "web",
        &[
            (r#"env = "prod""#, route("web", "prod")),
            (r#"env = "test""#, route("web", "test"))
        ]
    )]));
}

/// TP2's transition of `web`: the env=prod variant splits by version, in one revision.
fn split_prod_by_version(world: &mut World) -> Vec<ResourceKey> {
    world.apply(json!([put(
        "route",
        "web",
        &[
            (r#"env = "prod" && version = "v1""#, route("web", "prod-v1")),
            (
                r#"env = "prod" && version != "v1""#,
                route("web", "prod-rest")
            ),
            (
                r#"env != "prod" && (exists(version) || !exists(version))"#,
                route("web", "rest")
            ),
        ]
    )]))
}

fn node_with(type_url: &str, params: &[(&str, &str)]) -> Node {
    let mut node = Node {
        id: "node-1".into(),
        cluster: "c".into(),
        user_agent_name: "envoy".into(),
        ..Default::default()
    };
    node.dynamic_parameters.insert(
        type_url.into(),
        ContextParams {
            params: params
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        },
    );
    node
}

fn sotw_machine() -> StreamMachine {
    StreamMachine::new(1, Protocol::Sotw, &ADS, Arc::new(MachineConfig::default()))
}

fn delta_machine() -> StreamMachine {
    StreamMachine::new(1, Protocol::Delta, &ADS, Arc::new(MachineConfig::default()))
}

fn sotw_request(type_url: &str, names: &[&str], nonce: &str, version: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.iter().map(|n| (*n).into()).collect(),
        response_nonce: nonce.into(),
        version_info: version.into(),
        ..Default::default()
    }
}

fn delta_request(
    type_url: &str,
    subscribe: &[&str],
    unsubscribe: &[&str],
    nonce: &str,
) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.into(),
        resource_names_subscribe: subscribe.iter().map(|n| (*n).into()).collect(),
        resource_names_unsubscribe: unsubscribe.iter().map(|n| (*n).into()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

/// Encodes and decodes with the generated types, as a client would see the response.
fn sotw(response: &Response) -> DiscoveryResponse {
    match response {
        Response::Sotw(r) => DiscoveryResponse::decode(r.encode_to_vec().as_slice()).unwrap(),
        Response::Delta(_) => panic!("expected SotW"),
    }
}

fn delta(response: &Response) -> DeltaDiscoveryResponse {
    match response {
        Response::Delta(r) => DeltaDiscoveryResponse::decode(r.encode_to_vec().as_slice()).unwrap(),
        Response::Sotw(_) => panic!("expected Delta"),
    }
}

/// The virtual host name in a RouteConfiguration body: which variant it is.
fn route_tag(any_value: &[u8]) -> String {
    let rc =
        vxds_envoy::pb::envoy::config::route::v3::RouteConfiguration::decode(any_value).unwrap();
    rc.virtual_hosts
        .first()
        .map(|v| v.name.clone())
        .unwrap_or_default()
}

fn sotw_names(response: &DiscoveryResponse) -> Vec<String> {
    response
        .resources
        .iter()
        .map(|any| {
            if any.type_url == crate::types::RESOURCE_WRAPPER {
                let r = Resource::decode(any.value.as_slice()).unwrap();
                r.resource_name.map_or(r.name, |n| n.name)
            } else if any.type_url == ROUTE {
                vxds_envoy::pb::envoy::config::route::v3::RouteConfiguration::decode(
                    any.value.as_slice(),
                )
                .unwrap()
                .name
            } else if any.type_url == CLUSTER {
                vxds_envoy::pb::envoy::config::cluster::v3::Cluster::decode(any.value.as_slice())
                    .unwrap()
                    .name
            } else if any.type_url == crate::types::SECRET {
                vxds_envoy::pb::envoy::extensions::transport_sockets::tls::v3::Secret::decode(
                    any.value.as_slice(),
                )
                .unwrap()
                .name
            } else if any.type_url == crate::types::RUNTIME {
                vxds_envoy::pb::envoy::service::runtime::v3::Runtime::decode(any.value.as_slice())
                    .unwrap()
                    .name
            } else {
                vxds_envoy::pb::envoy::config::listener::v3::Listener::decode(any.value.as_slice())
                    .unwrap()
                    .name
            }
        })
        .collect()
}

// ---- SotW -------------------------------------------------------------------------------

#[test]
fn sotw_nonces_are_unique_and_the_node_is_remembered() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put("cluster", "c1", &[("*", cluster("c1"))])]));
    let mut m = sotw_machine();
    let mut first = sotw_request(ROUTE, &["web"], "", "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_sotw_request(first).unwrap();
    let r1 = m.poll(&world.snapshot);
    // Later requests carry no node: the first one's is kept (and its parameters).
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    let r2 = m.poll(&world.snapshot);
    assert_eq!(m.node().unwrap().id, "node-1");
    let nonces: Vec<&str> = r1.iter().chain(&r2).map(Response::nonce).collect();
    assert_eq!(nonces, ["1", "2"]);
    assert_eq!(route_tag(&sotw(&r1[0]).resources[0].value), "prod");
    assert_eq!(m.status().lock().unwrap().node_id, "node-1");
}

#[test]
fn sotw_answers_first_requests_even_when_nothing_exists() {
    let world = World::new();
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(LISTENER, &[], "", ""))
        .unwrap();
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    assert!(sotw(&responses[0]).resources.is_empty());
}

/// Review of 58376dd: the status's acked version is rewritten in place, but a client's
/// version text of a megabyte is not kept for the stream's life by the ACKs after it.
#[test]
fn a_huge_acked_version_text_is_let_go_by_the_next_ack() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    let huge = "x".repeat(1 << 20);
    m.on_sotw_request(sotw_request(ROUTE, &["web"], &first.nonce, &huge))
        .unwrap();
    let acked = |m: &StreamMachine| {
        let status = m.status();
        let status = status.lock().unwrap();
        let version = &status.types[0].last_acked.as_ref().unwrap().version;
        (version.len(), version.capacity())
    };
    assert_eq!(acked(&m).0, 1 << 20);
    let changed = world.apply(json!([put("route", "web", &[("*", route("web", "all"))])]));
    m.on_changes(&changed);
    let second = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web"],
        &second.nonce,
        &second.version_info,
    ))
    .unwrap();
    let (len, capacity) = acked(&m);
    assert_eq!(len, second.version_info.len());
    assert!(capacity < 1 << 16, "{capacity}");
}

#[test]
fn sotw_stale_nonces_are_no_answer_but_their_subscription_counts() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put(
        "route",
        "other",
        &[("*", route("other", "o"))]
    )]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    // A change goes out as nonce 2 before the client answered nonce 1.
    let changed = world.apply(json!([put("route", "web", &[("*", route("web", "all"))])]));
    m.on_changes(&changed);
    let second = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(second.nonce, "2");
    // The client's answer to nonce 1 is stale: no ACK, but its new subscription counts.
    let outcome = m
        .on_sotw_request(sotw_request(
            ROUTE,
            &["web", "other"],
            "1",
            &first.version_info,
        ))
        .unwrap();
    assert!(outcome.acks.is_empty() && outcome.nacks.is_empty());
    assert!(outcome.interest_changed);
    assert_eq!(
        *m.status().lock().unwrap().types[0].subscriptions,
        ["other", "web"]
    );
    let third = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(sotw_names(&third), ["other", "web"]);
    // A stale request that changes nothing is not answered.
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web", "other"],
        "2",
        &second.version_info,
    ))
    .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    // The ACK of the latest: nothing more to send.
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web", "other"],
        &third.nonce,
        &third.version_info,
    ))
    .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    assert_eq!(
        m.status().lock().unwrap().types[0]
            .last_acked
            .as_ref()
            .unwrap()
            .version,
        third.version_info
    );
}

/// Envoy's unified mux: after a NACK, its next request (a new name) carries the nonce it last
/// *accepted*. The name is answered; the request settles nothing and refuses nothing.
#[test]
fn sotw_a_new_name_after_a_nack_is_answered_under_the_last_accepted_nonce() {
    let mut world = World::new();
    let cla = |name: &str, port: u32| {
        put(
            "endpoint",
            name,
            &[(
                "*",
                json!({"@type": ENDPOINT, "cluster_name": name, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}),
            )],
        )
    };
    world.apply(json!([cla("c1", 1), cla("c2", 2)]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ENDPOINT, &["c1"], "", ""))
        .unwrap();
    let accepted = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ENDPOINT,
        &["c1"],
        &accepted.nonce,
        &accepted.version_info,
    ))
    .unwrap();
    let changed = world.apply(json!([cla("c1", 3)]));
    m.on_changes(&changed);
    let refused = sotw(&m.poll(&world.snapshot)[0]);
    let mut nack = sotw_request(ENDPOINT, &["c1"], &refused.nonce, &accepted.version_info);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "bad endpoints".into(),
        details: vec![],
    });
    assert_eq!(
        m.on_sotw_request(nack).unwrap().nacks.as_slice(),
        [ENDPOINT]
    );
    assert!(m.poll(&world.snapshot).is_empty());
    // Cluster c2 arrives; Envoy asks for its endpoints, stamped with the last good nonce.
    let outcome = m
        .on_sotw_request(sotw_request(
            ENDPOINT,
            &["c1", "c2"],
            &accepted.nonce,
            &accepted.version_info,
        ))
        .unwrap();
    assert!(outcome.acks.is_empty() && outcome.nacks.is_empty());
    let answer = m.poll(&world.snapshot);
    assert_eq!(answer.len(), 1, "c2's endpoints are sent");
    let answer = sotw(&answer[0]);
    let names: Vec<String> = answer
        .resources
        .iter()
        .map(|any| {
            vxds_envoy::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
                any.value.as_slice(),
            )
            .unwrap()
            .cluster_name
        })
        .collect();
    assert_eq!(names, ["c1", "c2"]);
    // The refusal is still on record.
    let status = m.status().lock().unwrap().types[0].clone();
    assert_eq!(status.last_nacked.unwrap().message, "bad endpoints");
}

#[test]
fn sotw_nacks_are_recorded_and_not_resent_until_the_next_change() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    let mut nack = sotw_request(ROUTE, &["web"], &first.nonce, "");
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "bad route".into(),
        details: vec![],
    });
    let outcome = m.on_sotw_request(nack).unwrap();
    assert_eq!(outcome.nacks.as_slice(), [ROUTE]);
    // The refused version is not sent again, however often the client asks.
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_changes(&[ResourceKey {
        type_url: ROUTE.into(),
        name: "web".into(),
    }]);
    assert!(m.poll(&world.snapshot).is_empty());
    let status = m.status().lock().unwrap().types[0].clone();
    assert_eq!(status.last_nacked.as_ref().unwrap().message, "bad route");
    assert!(status.in_error());
    // The next change is sent.
    let changed = world.apply(json!([put(
        "route",
        "web",
        &[("*", route("web", "fixed"))]
    )]));
    m.on_changes(&changed);
    let next = m.poll(&world.snapshot);
    assert_eq!(next.len(), 1);
    assert_ne!(sotw(&next[0]).version_info, first.version_info);
}

#[test]
fn sotw_answers_new_names_even_when_the_version_is_unchanged() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web"],
        &first.nonce,
        &first.version_info,
    ))
    .unwrap();
    // `missing` does not exist, so the state (and its version) is the same; it is answered.
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web", "missing"],
        &first.nonce,
        &first.version_info,
    ))
    .unwrap();
    let again = m.poll(&world.snapshot);
    assert_eq!(again.len(), 1);
    assert_eq!(sotw(&again[0]).version_info, first.version_info);
}

#[test]
fn sotw_lds_and_cds_responses_are_complete() {
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "a", &[("*", cluster("a"))]),
        put("cluster", "b", &[("*", cluster("b"))]),
    ]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(sotw_names(&first), ["a", "b"]);
    m.on_sotw_request(sotw_request(
        CLUSTER,
        &[],
        &first.nonce,
        &first.version_info,
    ))
    .unwrap();
    // One cluster changes: the response still holds both.
    let changed = world.apply(json!([put(
        "cluster",
        "b",
        &[(
            "*",
            json!({"@type": CLUSTER, "name": "b", "type": "EDS",
        "connect_timeout": "2s", "eds_cluster_config": {"eds_config": {"ads": {}}}})
        )]
    )]));
    m.on_changes(&changed);
    assert_eq!(sotw_names(&sotw(&m.poll(&world.snapshot)[0])), ["a", "b"]);
}

#[test]
fn sotw_wraps_for_locators_and_for_clients_that_ask() {
    let mut world = World::new();
    env_routes(&mut world);
    // Plain names, legacy client: bare.
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    request.node = Some(node_with(ROUTE, &[("env", "test")]));
    m.on_sotw_request(request).unwrap();
    let bare = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(bare.resources[0].type_url, ROUTE);
    assert_eq!(route_tag(&bare.resources[0].value), "test");
    // Plain names, a client with xds.config.resource-in-sotw: wrapped, named the legacy way.
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    let mut node = node_with(ROUTE, &[("env", "test")]);
    node.client_features.push(RESOURCE_IN_SOTW.into());
    request.node = Some(node);
    m.on_sotw_request(request).unwrap();
    let wrapped = Resource::decode(
        sotw(&m.poll(&world.snapshot)[0]).resources[0]
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(wrapped.name, "web");
    assert!(wrapped.resource_name.is_none());
    // Locators: wrapped with the constraints, never omitted.
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &[], "", "");
    request.resource_locators = vec![ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [("env".to_owned(), "prod".to_owned())].into(),
    }];
    m.on_sotw_request(request).unwrap();
    let response = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        response.resources[0].type_url,
        crate::types::RESOURCE_WRAPPER
    );
    let r = Resource::decode(response.resources[0].value.as_slice()).unwrap();
    let name = r.resource_name.unwrap();
    assert_eq!(name.name, "web");
    assert_eq!(
        name.dynamic_parameter_constraints.unwrap(),
        vxds_envoy::constraints::constraints_to_proto(&"env = prod".parse().unwrap()).unwrap()
    );
    assert_eq!(route_tag(&r.resource.unwrap().value), "prod");
}

/// SotW streams whose responses carry the same items share one state and its encoding (issue
/// 24), and what each holds and accepted still follows its own answers: here when a variant
/// swap changes the second key of a state as long as the last.
#[test]
fn sotw_streams_that_resolve_alike_share_one_state() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put("route", "api", &[("*", route("api", "all"))])]));
    let request = |nonce: &str, version: &str| {
        let mut request = sotw_request(ROUTE, &[], nonce, version);
        request.resource_locators = ["api", "web"]
            .map(|name| ResourceLocator {
                name: name.into(),
                dynamic_parameters: [("env", "prod"), ("version", "v1")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
            })
            .into();
        request
    };
    let held = |m: &StreamMachine| -> Vec<(String, Option<String>)> {
        let status = m.status();
        let status = status.lock().unwrap();
        (status.types[0].resources.iter())
            .map(|r| {
                (
                    r.name.to_string(),
                    r.constraints.as_ref().map(|c| c.to_string()),
                )
            })
            .collect()
    };
    let accepted = |m: &StreamMachine| -> Vec<String> {
        (m.types[ROUTE].accepted_items())
            .map(|item| {
                route_tag(
                    &prost_types::Any::decode(item.variant().body.clone())
                        .unwrap()
                        .value,
                )
            })
            .collect()
    };
    let sotw_of = |response: &Response| match response {
        Response::Sotw(r) => r.clone(),
        Response::Delta(_) => panic!("expected SotW"),
    };
    let mut machines = [sotw_machine(), sotw_machine(), sotw_machine()];
    let mut sent = Vec::new();
    for m in &mut machines {
        m.on_sotw_request(request("", "")).unwrap();
        let responses = m.poll(&world.snapshot);
        assert_eq!(responses.len(), 1);
        sent.push(sotw_of(&responses[0]));
    }
    // The first response of a state is its stream's own; from the second on, it is shared.
    assert_eq!(sent[0], sent[1]);
    assert_eq!(sent[1], sent[2]);
    assert!(std::ptr::eq(
        sent[1].resources.as_ptr(),
        sent[2].resources.as_ptr()
    ));
    for (m, r) in machines.iter_mut().zip(&sent) {
        m.on_sotw_request(request(&r.nonce, &r.version_info))
            .unwrap();
        assert_eq!(accepted(m), ["all", "prod"]);
    }

    // web's env=prod variant splits by version: another key in the second place.
    let changed = split_prod_by_version(&mut world);
    let mut swapped = Vec::new();
    for m in &mut machines {
        m.on_changes(&changed);
        let responses = m.poll(&world.snapshot);
        assert_eq!(responses.len(), 1, "the swap goes in one response");
        swapped.push(sotw_of(&responses[0]));
        let decoded = sotw(&responses[0]);
        let tags: Vec<String> = (decoded.resources.iter())
            .map(|any| {
                route_tag(
                    &Resource::decode(any.value.as_slice())
                        .unwrap()
                        .resource
                        .unwrap()
                        .value,
                )
            })
            .collect();
        assert_eq!(tags, ["all", "prod-v1"]);
        assert_eq!(
            held(m),
            [
                ("api".to_owned(), None),
                (
                    "web".to_owned(),
                    Some(r#"env = "prod" && version = "v1""#.to_owned())
                )
            ]
        );
        // Not accepted before the client says so.
        assert_eq!(accepted(m), ["all", "prod"]);
    }
    assert!(std::ptr::eq(
        swapped[1].resources.as_ptr(),
        swapped[2].resources.as_ptr()
    ));
    // One accepts, the other refuses: each keeps its own.
    let [first, second, _] = &mut machines;
    first
        .on_sotw_request(request(&swapped[0].nonce, &swapped[0].version_info))
        .unwrap();
    assert_eq!(accepted(first), ["all", "prod-v1"]);
    let mut refusal = request(&swapped[1].nonce, &sent[1].version_info);
    refusal.error_detail = Some(RpcStatus {
        message: "no".into(),
        ..Default::default()
    });
    second.on_sotw_request(refusal).unwrap();
    assert_eq!(accepted(second), ["all", "prod"]);
}

#[test]
fn sotw_clients_matching_no_variant_see_the_resource_as_absent() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([
        put(
            "cluster",
            "only-prod",
            &[(r#"env = "prod""#, cluster("only-prod"))]
        ),
        put("cluster", "all", &[("*", cluster("all"))])
    ]));
    let mut m = sotw_machine();
    let mut request = sotw_request(CLUSTER, &[], "", "");
    request.node = Some(node_with(CLUSTER, &[("env", "qa")]));
    m.on_sotw_request(request).unwrap();
    assert_eq!(sotw_names(&sotw(&m.poll(&world.snapshot)[0])), ["all"]);
}

// ---- parameters --------------------------------------------------------------------------

#[test]
fn parameters_come_from_locators_then_node_then_metadata() {
    let mut world = World::new();
    env_routes(&mut world);
    let config = MachineConfig {
        node_metadata_params: vec!["env".into()],
        ..Default::default()
    };
    let mut m = StreamMachine::new(1, Protocol::Sotw, &ADS, Arc::new(config));
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    let node = Node {
        metadata: Some(vxds_envoy::pb::google::protobuf::Struct {
            fields: [(
                "env".to_owned(),
                vxds_envoy::pb::google::protobuf::Value {
                    kind: Some(vxds_envoy::pb::google::protobuf::value::Kind::StringValue(
                        "test".into(),
                    )),
                },
            )]
            .into(),
        }),
        ..Default::default()
    };
    request.node = Some(node);
    m.on_sotw_request(request).unwrap();
    let from_metadata = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(route_tag(&from_metadata.resources[0].value), "test");
    assert_eq!(
        m.status().lock().unwrap().types[0].params.0,
        BTreeMap::from([("env".to_owned(), "test".to_owned())])
    );
}

// ---- Delta --------------------------------------------------------------------------------

#[test]
fn delta_honours_subscription_changes_with_a_stale_nonce() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put(
        "route",
        "other",
        &[("*", route("other", "x"))]
    )]));
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let r1 = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r1.resources[0].name, "web");
    m.on_delta_request(delta_request(ROUTE, &["other"], &[], "999"))
        .unwrap();
    let r2 = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        r2.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["other"]
    );
    assert_ne!(r1.nonce, r2.nonce);
}

#[test]
fn delta_initial_versions_spare_what_the_client_has() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put("route", "b", &[("*", route("b", "b"))])]));
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web", "b"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let sent = delta(&m.poll(&world.snapshot)[0]);
    let versions: BTreeMap<String, String> = sent
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();

    // Reconnect: the client already has web (current) and an outdated b.
    let mut again = delta_machine();
    let mut request = delta_request(ROUTE, &["web", "b"], &[], "");
    request.node = Some(node_with(ROUTE, &[("env", "prod")]));
    request.initial_resource_versions = [
        ("web".to_owned(), versions["web"].clone()),
        ("b".to_owned(), "stale".to_owned()),
    ]
    .into();
    again.on_delta_request(request).unwrap();
    let response = delta(&again.poll(&world.snapshot)[0]);
    assert_eq!(
        response
            .resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    // Versions are content hashes: the same on any stream, any replica.
    assert_eq!(response.resources[0].version, versions["b"]);
}

#[test]
fn delta_reports_missing_resources_then_sends_them_when_they_appear() {
    let mut world = World::new();
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ROUTE, &["later"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.removed_resources, ["later"]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "reported once, not in a loop"
    );
    let changed = world.apply(json!([put(
        "route",
        "later",
        &[("*", route("later", "x"))]
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, "later");
    assert!(r.removed_resources.is_empty());
}

#[test]
fn delta_wraps_locators_with_constraints_and_replaces_variants_atomically() {
    let mut world = World::new();
    world.apply(json!([put(
        "route",
        "web",
        &[
            (r#"env = "prod""#, route("web", "prod")),
            (r#"env != "prod""#, route("web", "rest"))
        ]
    )]));
    let mut m = delta_machine();
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.resource_locators_subscribe = vec![ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [
            ("env".to_owned(), "prod".to_owned()),
            ("version".to_owned(), "v1".to_owned()),
        ]
        .into(),
    }];
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    let name = r.resources[0].resource_name.clone().unwrap();
    assert_eq!(name.name, "web");
    assert!(r.resources[0].name.is_empty());
    let old_constraints = name.dynamic_parameter_constraints.clone().unwrap();
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();

    // TP2's transition: env=prod splits by version. One revision...
    let changed = split_prod_by_version(&mut world);
    m.on_changes(&changed);
    let responses = m.poll(&world.snapshot);
    // ... one response: the old variant's removal and the new variant together.
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    assert_eq!(r.removed_resource_names.len(), 1);
    assert_eq!(r.removed_resource_names[0].name, "web");
    assert_eq!(
        r.removed_resource_names[0].dynamic_parameter_constraints,
        Some(old_constraints)
    );
    assert_eq!(r.resources.len(), 1);
    assert_eq!(
        route_tag(&r.resources[0].resource.as_ref().unwrap().value),
        "prod-v1"
    );
    let new: DynamicParameterConstraints = r.resources[0]
        .resource_name
        .clone()
        .unwrap()
        .dynamic_parameter_constraints
        .unwrap();
    assert_eq!(
        new,
        vxds_envoy::constraints::constraints_to_proto(
            &r#"env = "prod" && version = "v1""#.parse().unwrap()
        )
        .unwrap()
    );
}

#[test]
fn delta_variant_changes_of_plain_name_subscriptions_are_plain_updates() {
    let mut world = World::new();
    world.apply(json!([put("route", "web", &[("*", route("web", "all"))])]));
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    let changed = world.apply(json!([put(
        "route",
        "web",
        &[
            (r#"env = "prod""#, route("web", "prod")),
            (r#"env != "prod""#, route("web", "rest"))
        ]
    )]));
    m.on_changes(&changed);
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    // Never the same name twice in one response: an update, not a removal plus an addition.
    assert!(r.removed_resources.is_empty());
    assert_eq!(r.resources.len(), 1);
    assert_eq!(
        (
            r.resources[0].name.as_str(),
            route_tag(&r.resources[0].resource.as_ref().unwrap().value).as_str()
        ),
        ("web", "prod")
    );
}

#[test]
fn delta_wildcards_legacy_and_explicit() {
    let mut world = World::new();
    world.apply(json!([put("cluster", "a", &[("*", cluster("a"))])]));
    // Legacy: a first CDS request with no names.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, "a");
    m.on_delta_request(delta_request(CLUSTER, &[], &[], &r.nonce))
        .unwrap();
    let changed = world.apply(json!([
        put("cluster", "b", &[("*", cluster("b"))]),
        delete("cluster", "a")
    ]));
    m.on_changes(&changed);
    let add = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        add.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    // The removal of `a` waits for the client to acknowledge the addition.
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_delta_request(delta_request(CLUSTER, &[], &[], &add.nonce))
        .unwrap();
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["a"]);

    // Explicit: `*`, and not for routes unless asked.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ROUTE, &[], &[], ""))
        .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_delta_request(delta_request(CLUSTER, &["*"], &[], ""))
        .unwrap();
    assert_eq!(delta(&m.poll(&world.snapshot)[0]).resources[0].name, "b");
}

#[test]
fn delta_glob_collections() {
    let mut world = World::new();
    let l = |name: &str| json!({"type": "listener", "name": name, "variants": [{"resource": listener(name, "r")}]});
    world.apply(json!([
        l("xdstp://auth/envoy.config.listener.v3.Listener/edge/a?zone=eu"),
        l("xdstp://auth/envoy.config.listener.v3.Listener/edge/deep/b?zone=eu"),
        l("xdstp://auth/envoy.config.listener.v3.Listener/edge/c?zone=us"),
    ]));
    let glob = "xdstp://auth/envoy.config.listener.v3.Listener/edge/*?zone=eu";
    let mut m = delta_machine();
    m.on_delta_request(delta_request(LISTENER, &[glob], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        r.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["xdstp://auth/envoy.config.listener.v3.Listener/edge/a?zone=eu"]
    );
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    // An addition to the collection is sent as it happens.
    let changed = world.apply(json!([l(
        "xdstp://auth/envoy.config.listener.v3.Listener/edge/d?zone=eu"
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        r.resources[0].name,
        "xdstp://auth/envoy.config.listener.v3.Listener/edge/d?zone=eu"
    );
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    // Removing every member: the members go, then the collection is reported empty by its name.
    let changed = world.apply(json!([
        delete(
            "listener",
            "xdstp://auth/envoy.config.listener.v3.Listener/edge/a?zone=eu"
        ),
        delete(
            "listener",
            "xdstp://auth/envoy.config.listener.v3.Listener/edge/d?zone=eu"
        ),
    ]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    let mut removed = r.removed_resources.clone();
    removed.sort();
    assert_eq!(removed.len(), 2);
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.removed_resources, [glob]);
    // A glob over nothing is reported at once.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(
        LISTENER,
        &["xdstp://auth/envoy.config.listener.v3.Listener/none/*"],
        &[],
        "",
    ))
    .unwrap();
    assert_eq!(
        delta(&m.poll(&world.snapshot)[0]).removed_resources,
        ["xdstp://auth/envoy.config.listener.v3.Listener/none/*"]
    );
}

/// TP1: a glob collection with no members is answered with its URL in `removed_resources` —
/// also when members exist but none has a variant for this subscriber, and again when the
/// client subscribes to it again.
#[test]
fn delta_empty_glob_collections() {
    let mut world = World::new();
    let member = "xdstp://auth/envoy.config.listener.v3.Listener/edge/a";
    world.apply(json!([put(
        "listener",
        member,
        &[(r#"env = "prod""#, listener(member, "r"))]
    )]));
    let glob = "xdstp://auth/envoy.config.listener.v3.Listener/edge/*";
    let mut m = delta_machine();
    let mut request = delta_request(LISTENER, &[glob], &[], "");
    request.node = Some(node_with(LISTENER, &[("env", "test")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, [glob]);
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    // Subscribed again: answered again.
    m.on_delta_request(delta_request(LISTENER, &[glob], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.removed_resources, [glob]);
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    // A member for this subscriber's variant arrives: sent, and the glob is no longer empty.
    let changed = world.apply(json!([put(
        "listener",
        member,
        &[
            (r#"env = "prod""#, listener(member, "r")),
            (r#"env = "test""#, listener(member, "t"))
        ]
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, member);
    assert!(r.removed_resources.is_empty());
}

#[test]
fn never_the_same_name_twice_in_one_response() {
    let mut world = World::new();
    world.apply(json!([put("cluster", "a", &[("*", cluster("a"))])]));
    let mut m = delta_machine();
    // Subscribed by name and by wildcard at once.
    m.on_delta_request(delta_request(CLUSTER, &["a", "*", "a"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources.len(), 1);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &["a", "*", "a"], "", ""))
        .unwrap();
    assert_eq!(sotw(&m.poll(&world.snapshot)[0]).resources.len(), 1);
}

// ---- make before break (A74) --------------------------------------------------------------

#[test]
fn one_revision_over_several_types_goes_out_make_before_break() {
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "old", &[("*", cluster("old"))]),
        put("listener", "l", &[("*", listener("l", "r"))]),
        put("route", "r", &[("*", route("r", "to-old"))]),
    ]));
    let mut m = sotw_machine();
    for ty in [CLUSTER, LISTENER] {
        m.on_sotw_request(sotw_request(ty, &[], "", "")).unwrap();
    }
    m.on_sotw_request(sotw_request(ROUTE, &["r"], "", ""))
        .unwrap();
    m.on_sotw_request(sotw_request(ENDPOINT, &["new"], "", ""))
        .unwrap();
    let initial = m.poll(&world.snapshot);
    assert_eq!(
        initial.iter().map(Response::type_url).collect::<Vec<_>>(),
        [CLUSTER, ENDPOINT, LISTENER, ROUTE]
    );
    for r in &initial {
        let r = sotw(r);
        let names: Vec<&str> = vec![];
        let _ = names;
        m.on_sotw_request(DiscoveryRequest {
            type_url: r.type_url.clone(),
            resource_names: if r.type_url == ROUTE {
                vec!["r".into()]
            } else if r.type_url == ENDPOINT {
                vec!["new".into()]
            } else {
                vec![]
            },
            response_nonce: r.nonce.clone(),
            version_info: r.version_info.clone(),
            ..Default::default()
        })
        .unwrap();
    }

    // One revision: a new cluster with endpoints, the route moved to it, the old cluster gone.
    let changed = world.apply(json!([
        put("cluster", "new", &[("*", cluster("new"))]),
        put(
            "endpoint",
            "new",
            &[("*", json!({"@type": ENDPOINT, "cluster_name": "new"}))]
        ),
        put("route", "r", &[("*", route("r", "to-new"))]),
        delete("cluster", "old"),
    ]));
    m.on_changes(&changed);
    let make = m.poll(&world.snapshot);
    // Make: clusters, endpoints, then routes; the old cluster is still in the CDS state.
    assert_eq!(
        make.iter().map(Response::type_url).collect::<Vec<_>>(),
        [CLUSTER, ENDPOINT, ROUTE]
    );
    assert_eq!(sotw_names(&sotw(&make[0])), ["new", "old"]);
    // Nothing is removed while the route update is unanswered.
    assert!(m.poll(&world.snapshot).is_empty());
    for r in &make {
        let r = sotw(r);
        let names = if r.type_url == ROUTE {
            vec!["r".to_owned()]
        } else if r.type_url == ENDPOINT {
            vec!["new".to_owned()]
        } else {
            vec![]
        };
        m.on_sotw_request(DiscoveryRequest {
            type_url: r.type_url.clone(),
            resource_names: names,
            response_nonce: r.nonce.clone(),
            version_info: r.version_info.clone(),
            ..Default::default()
        })
        .unwrap();
    }
    // Break: now the old cluster goes.
    let take_down = m.poll(&world.snapshot);
    assert_eq!(
        take_down.iter().map(Response::type_url).collect::<Vec<_>>(),
        [CLUSTER]
    );
    assert_eq!(sotw_names(&sotw(&take_down[0])), ["new"]);
}

// ---- limits and services -------------------------------------------------------------------

#[test]
fn limits_refuse_with_clear_errors() {
    let config = MachineConfig {
        max_subscriptions: 2,
        max_types: 2,
        ..Default::default()
    };
    let mut m = StreamMachine::new(1, Protocol::Delta, &ADS, Arc::new(config));
    let error = m
        .on_delta_request(delta_request(ROUTE, &["a", "b", "c"], &[], ""))
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::ResourceExhausted);
    assert!(
        error.message().contains("the limit is 2"),
        "{}",
        error.message()
    );
    let mut m = StreamMachine::new(
        1,
        Protocol::Delta,
        &ADS,
        Arc::new(MachineConfig {
            max_types: 1,
            ..Default::default()
        }),
    );
    m.on_delta_request(delta_request(ROUTE, &[], &[], ""))
        .unwrap();
    assert_eq!(
        m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
            .unwrap_err()
            .code(),
        tonic::Code::ResourceExhausted
    );
    // ADS needs a type; a per-type service takes only its own.
    let mut m = sotw_machine();
    assert_eq!(
        m.on_sotw_request(sotw_request("", &[], "", ""))
            .unwrap_err()
            .code(),
        tonic::Code::InvalidArgument
    );
    let mut m = StreamMachine::new(
        1,
        Protocol::Sotw,
        &SERVICES[3],
        Arc::new(MachineConfig::default()),
    );
    assert_eq!(
        m.on_sotw_request(sotw_request(ROUTE, &[], "", ""))
            .unwrap_err()
            .code(),
        tonic::Code::InvalidArgument
    );
    assert!(m.on_sotw_request(sotw_request("", &[], "", "")).is_ok());
}

#[test]
fn the_status_mirrors_what_the_client_holds() {
    let held = |m: &StreamMachine| -> Vec<(String, String, Option<String>)> {
        let status = m.status();
        let status = status.lock().unwrap();
        status.types[0]
            .resources
            .iter()
            .map(|r| {
                let constraints = r.constraints.as_ref().map(|c| c.to_string());
                (r.name.to_string(), r.version.to_string(), constraints)
            })
            .collect()
    };
    let versions = |r: &DeltaDiscoveryResponse| -> Vec<(String, String, Option<String>)> {
        r.resources
            .iter()
            .map(|r| (r.name.clone(), r.version.clone(), None))
            .collect()
    };
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "a", &[("*", cluster("a"))]),
        put("cluster", "b", &[("*", cluster("b"))])
    ]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let first = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(held(&m), versions(&first));
    m.on_delta_request(delta_request(CLUSTER, &[], &[], &first.nonce))
        .unwrap();

    // a goes, c comes: c is held at once, a until the break phase has removed it.
    let changed = world.apply(json!([
        delete("cluster", "a"),
        put("cluster", "c", &[("*", cluster("c"))])
    ]));
    m.on_changes(&changed);
    let make = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(make.resources[0].name, "c");
    let names = |m: &StreamMachine| held(m).into_iter().map(|h| h.0).collect::<Vec<_>>();
    assert_eq!(names(&m), ["a", "b", "c"]);
    m.on_delta_request(delta_request(CLUSTER, &[], &[], &make.nonce))
        .unwrap();
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["a"]);
    assert_eq!(names(&m), ["b", "c"]);
    assert_eq!(held(&m)[1], versions(&make)[0]);
}

/// Envoy's legacy SotW mux NACKs a superseded response, then stamps its next request of that
/// type (a subscription change) with the same nonce and no error: that request accepts nothing.
#[test]
fn sotw_a_refused_superseded_response_is_not_accepted_by_a_later_request_with_its_nonce() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put(
        "route",
        "other",
        &[("*", route("other", "o"))]
    )]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    let changed = world.apply(json!([put("route", "web", &[("*", route("web", "all"))])]));
    m.on_changes(&changed);
    let second = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(second.nonce, "2");
    // The client refuses nonce 1, which nonce 2 superseded.
    let mut nack = sotw_request(ROUTE, &["web"], &first.nonce, "");
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "refused".into(),
        ..Default::default()
    });
    let outcome = m.on_sotw_request(nack).unwrap();
    assert!(outcome.superseded_acks.is_empty());
    // Then a subscription change stamped with the refused nonce and no error.
    let outcome = m
        .on_sotw_request(sotw_request(ROUTE, &["web", "other"], &first.nonce, ""))
        .unwrap();
    assert!(
        outcome.superseded_acks.is_empty(),
        "a refused response is not accepted by a later request carrying its nonce"
    );
    assert!(outcome.interest_changed);
}
