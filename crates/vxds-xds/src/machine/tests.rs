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
mod delta;
mod identity;
mod references;
mod removals;
mod sotw;
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
