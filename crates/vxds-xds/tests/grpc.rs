//! The ADS server over real gRPC (127.0.0.1, ephemeral port), with clients that send resource
//! locators, SotW and Delta, on both store backends.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use vxds_envoy::changeset::ChangesetRequest;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::config::route::v3::RouteConfiguration;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
    ResourceLocator,
};
use vxds_envoy::pb::envoy::service::status::v3::ClientStatusRequest;
use vxds_envoy::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use vxds_envoy::pb::xds::core::v3::ContextParams;
use vxds_store::{Store, index};
use vxds_testkit::{TestDb, on_both_backends};
use vxds_xds::{XdsConfig, XdsMetrics, XdsServer};

// A test crate's root resolves modules beside it, not in a folder named after it.
#[path = "grpc/clients.rs"]
mod clients;
#[path = "grpc/connections.rs"]
mod connections;
#[path = "grpc/events.rs"]
mod events;
#[path = "grpc/failover.rs"]
mod failover;
#[path = "grpc/memory.rs"]
mod memory;
#[path = "grpc/protocol.rs"]
mod protocol;

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const WRAPPER: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";
const WAIT: Duration = Duration::from_secs(10);

struct Server {
    store: Store,
    xds: Arc<XdsServer>,
    channel: Channel,
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    _follower: tokio::task::JoinHandle<()>,
}

impl Server {
    async fn start(db: &TestDb, config: XdsConfig) -> Server {
        Server::start_on(db.store().await, config).await
    }

    /// A server on `store`.
    async fn start_on(store: Store, config: XdsConfig) -> Server {
        let (index, follower) = index::start(store.clone()).await.unwrap();
        let xds = Arc::new(XdsServer::new(
            index.clone(),
            config,
            Arc::new(XdsMetrics::unregistered()),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = xds.clone();
        let task = tokio::spawn(async move {
            serving
                .serve(listener, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        Server {
            store,
            xds,
            channel,
            addr,
            stop: Some(stop),
            task,
            _follower: follower,
        }
    }

    /// Commits `ops` and waits until the revision is published to the streams.
    async fn apply(&self, ops: Value) -> u64 {
        let request: ChangesetRequest = serde_json::from_value(json!({"operations": ops})).unwrap();
        let revision = self.store.apply(request, None).await.unwrap().revision;
        tokio::time::timeout(WAIT, self.xds.registry().wait_published(revision))
            .await
            .unwrap();
        revision
    }

    fn ads(&self) -> AggregatedDiscoveryServiceClient<Channel> {
        AggregatedDiscoveryServiceClient::new(self.channel.clone())
    }
}

fn route(name: &str, tag: &str) -> Value {
    json!({"@type": ROUTE, "name": name, "virtual_hosts": [{"name": tag, "domains": ["*"]}]})
}

fn put_route(name: &str, variants: &[(&str, &str)]) -> Value {
    let variants: Vec<Value> = variants
        .iter()
        .map(|(c, t)| json!({"constraints": c, "resource": route(name, t)}))
        .collect();
    json!({"op": "put", "type": "route", "name": name, "variants": variants})
}

fn tag(any_value: &[u8]) -> String {
    RouteConfiguration::decode(any_value).unwrap().virtual_hosts[0]
        .name
        .clone()
}

fn node(id: &str, params: &[(&str, &str)]) -> Node {
    let mut node = Node {
        id: id.into(),
        user_agent_name: "vxds-test".into(),
        ..Default::default()
    };
    if !params.is_empty() {
        node.dynamic_parameters.insert(
            ROUTE.into(),
            ContextParams {
                params: params
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            },
        );
    }
    node
}

fn locator(name: &str, params: &[(&str, &str)]) -> ResourceLocator {
    ResourceLocator {
        name: name.into(),
        dynamic_parameters: params
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect(),
    }
}

/// A SotW stream: requests in through a channel, responses out.
struct SotwStream {
    requests: mpsc::Sender<DiscoveryRequest>,
    responses: tonic::Streaming<DiscoveryResponse>,
    /// The subscription, repeated in every request as SotW requires.
    names: Vec<String>,
    locators: Vec<ResourceLocator>,
}

impl SotwStream {
    async fn open(server: &Server, first: DiscoveryRequest) -> SotwStream {
        let (names, locators) = (
            first.resource_names.clone(),
            first.resource_locators.clone(),
        );
        let (requests, rx) = mpsc::channel(16);
        requests.send(first).await.unwrap();
        let responses = server
            .ads()
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        SotwStream {
            requests,
            responses,
            names,
            locators,
        }
    }

    async fn next(&mut self) -> DiscoveryResponse {
        tokio::time::timeout(WAIT, self.responses.message())
            .await
            .expect("a response in time")
            .unwrap()
            .unwrap()
    }

    async fn ack(&self, response: &DiscoveryResponse) {
        let request = DiscoveryRequest {
            type_url: response.type_url.clone(),
            version_info: response.version_info.clone(),
            response_nonce: response.nonce.clone(),
            resource_names: self.names.clone(),
            resource_locators: self.locators.clone(),
            ..Default::default()
        };
        self.requests.send(request).await.unwrap();
    }
}

struct DeltaStream {
    requests: mpsc::Sender<DeltaDiscoveryRequest>,
    responses: tonic::Streaming<DeltaDiscoveryResponse>,
}

impl DeltaStream {
    async fn open(server: &Server, first: DeltaDiscoveryRequest) -> DeltaStream {
        let (requests, rx) = mpsc::channel(16);
        requests.send(first).await.unwrap();
        let responses = server
            .ads()
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        DeltaStream {
            requests,
            responses,
        }
    }

    async fn next(&mut self) -> DeltaDiscoveryResponse {
        tokio::time::timeout(WAIT, self.responses.message())
            .await
            .expect("a response in time")
            .unwrap()
            .unwrap()
    }

    async fn ack(&self, response: &DeltaDiscoveryResponse) {
        let request = DeltaDiscoveryRequest {
            type_url: response.type_url.clone(),
            response_nonce: response.nonce.clone(),
            ..Default::default()
        };
        self.requests.send(request).await.unwrap();
    }
}

on_both_backends!(
    sotw_locators_get_their_variant_and_updates_follow,
    delta_locators_swap_variants_in_one_response,
    node_parameters_pick_variants_for_plain_names,
    csds_and_the_registry_show_acks_and_nacks,
    shutdown_ends_streams_with_unavailable,
    heartbeats_renew_ttls_only_where_there_are_ttls,
);

/// Over real gRPC: a TTL'd resource arrives with its TTL, heartbeats follow at half the TTL
/// (name, version, ttl, no body), and a stream that holds nothing with a TTL hears nothing.
async fn heartbeats_renew_ttls_only_where_there_are_ttls(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([
            {"op": "put", "type": "route", "name": "web", "variants": [
                {"resource": route("web", "timed"), "ttl": "1s"}
            ]},
            put_route("plain", &[("*", "plain")]),
        ]))
        .await;
    let subscribe = |names: &[&str]| DeltaDiscoveryRequest {
        type_url: ROUTE.into(),
        node: Some(node("proxy-ttl", &[])),
        resource_names_subscribe: names.iter().map(|n| (*n).into()).collect(),
        ..Default::default()
    };
    let mut timed = DeltaStream::open(&server, subscribe(&["web"])).await;
    let first = timed.next().await;
    let web = &first.resources[0];
    assert_eq!(web.ttl.unwrap().seconds, 1);
    assert!(web.resource.is_some());
    timed.ack(&first).await;
    let mut plain = DeltaStream::open(&server, subscribe(&["plain"])).await;
    let first_plain = plain.next().await;
    assert_eq!(first_plain.resources[0].ttl, None);
    plain.ack(&first_plain).await;
    let mut last = tokio::time::Instant::now();
    for _ in 0..3 {
        let beat = timed.next().await;
        // Half the TTL, give or take the heartbeat task's tick.
        let gap = last.elapsed();
        last = tokio::time::Instant::now();
        assert!(gap < Duration::from_millis(900), "{gap:?}");
        let h = &beat.resources[0];
        assert_eq!(
            (h.name.as_str(), h.version.as_str()),
            ("web", web.version.as_str())
        );
        assert!(h.resource.is_none());
        assert_eq!(h.ttl.unwrap().seconds, 1);
        timed.ack(&beat).await;
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), plain.responses.message())
            .await
            .is_err(),
        "no heartbeat for a stream without TTL'd resources"
    );
}

async fn sotw_locators_get_their_variant_and_updates_follow(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")]
        )]))
        .await;
    let locators = vec![locator("web", &[("env", "prod")])];
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("proxy-a", &[])),
            resource_locators: locators.clone(),
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    assert_eq!(first.resources.len(), 1);
    assert_eq!(first.resources[0].type_url, WRAPPER);
    let resource = Resource::decode(first.resources[0].value.as_slice()).unwrap();
    let name = resource.resource_name.unwrap();
    assert_eq!(name.name, "web");
    assert!(
        name.dynamic_parameter_constraints.is_some(),
        "constraints are never omitted"
    );
    assert_eq!(tag(&resource.resource.unwrap().value), "prod");
    stream.ack(&first).await;

    // An update through the store reaches the stream, from the new revision.
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod-2"), (r#"env != "prod""#, "other")]
        )]))
        .await;
    let update = stream.next().await;
    let resource = Resource::decode(update.resources[0].value.as_slice()).unwrap();
    assert_eq!(tag(&resource.resource.unwrap().value), "prod-2");
    assert_ne!(update.version_info, first.version_info);
    assert_ne!(update.nonce, first.nonce);
}

async fn delta_locators_swap_variants_in_one_response(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")]
        )]))
        .await;
    let mut stream = DeltaStream::open(
        &server,
        DeltaDiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("proxy-b", &[])),
            resource_locators_subscribe: vec![locator(
                "web",
                &[("env", "prod"), ("version", "v1")],
            )],
            resource_names_subscribe: vec!["missing".into()],
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    assert_eq!(first.resources.len(), 1);
    assert_eq!(
        first.removed_resources,
        ["missing"],
        "what does not exist is reported at once"
    );
    let old = first.resources[0].resource_name.clone().unwrap();
    stream.ack(&first).await;

    // TP2's transition, committed as one revision: one response removes and replaces.
    server
        .apply(json!([put_route(
            "web",
            &[
                (r#"env = "prod" && version = "v1""#, "prod-v1"),
                (r#"env = "prod" && version != "v1""#, "prod-other"),
                (
                    r#"env != "prod" && (exists(version) || !exists(version))"#,
                    "other"
                ),
            ]
        )]))
        .await;
    let swap = stream.next().await;
    assert_eq!(swap.removed_resource_names, [old]);
    assert_eq!(swap.resources.len(), 1);
    assert_eq!(
        tag(&swap.resources[0].resource.as_ref().unwrap().value),
        "prod-v1"
    );
    assert_eq!(
        swap.resources[0].resource_name.as_ref().unwrap().name,
        "web"
    );
}

async fn node_parameters_pick_variants_for_plain_names(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod"), (r#"env = "test""#, "test")]
        )]))
        .await;
    for (env, expected) in [("prod", "prod"), ("test", "test")] {
        let mut stream = SotwStream::open(
            &server,
            DiscoveryRequest {
                type_url: ROUTE.into(),
                node: Some(node(&format!("envoy-{env}"), &[("env", env)])),
                resource_names: vec!["web".into()],
                ..Default::default()
            },
        )
        .await;
        let response = stream.next().await;
        // Plain names, legacy SotW: the bare resource.
        assert_eq!(response.resources[0].type_url, ROUTE);
        assert_eq!(tag(&response.resources[0].value), expected);
    }
}

async fn csds_and_the_registry_show_acks_and_nacks(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("envoy-1", &[])),
            resource_names: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    stream
        .requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["web".into()],
            version_info: first.version_info.clone(),
            response_nonce: first.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut csds = ClientStatusDiscoveryServiceClient::new(server.channel.clone());
    let deadline = tokio::time::Instant::now() + WAIT;
    let config = loop {
        let status = csds
            .fetch_client_status(ClientStatusRequest::default())
            .await
            .unwrap()
            .into_inner();
        let synced = status
            .config
            .first()
            .and_then(|c| c.generic_xds_configs.first())
            .is_some_and(|g| g.config_status == 1);
        if synced {
            break status.config[0].clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never synced: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(config.node.unwrap().id, "envoy-1");
    let generic = &config.generic_xds_configs[0];
    assert_eq!(
        (generic.type_url.as_str(), generic.name.as_str()),
        (ROUTE, "web")
    );
    assert!(generic.xds_config.is_some());

    // A refused update: recorded with the client's message.
    server
        .apply(json!([put_route("web", &[("*", "v1")])]))
        .await;
    let update = stream.next().await;
    stream
        .requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["web".into()],
            version_info: first.version_info.clone(),
            response_nonce: update.nonce.clone(),
            error_detail: Some(vxds_envoy::pb::google::rpc::Status {
                code: 3,
                message: "route v1 refused".into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let registry = server.xds.registry();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let clients = registry.clients();
        let nacked = clients
            .first()
            .and_then(|c| c.types.first())
            .and_then(|t| t.last_nacked.clone());
        if let Some(nack) = nacked {
            assert_eq!(nack.message, "route v1 refused");
            assert_eq!(nack.version, update.version_info);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the NACK was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = csds
        .fetch_client_status(ClientStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    let generic = &status.config[0].generic_xds_configs[0];
    assert_eq!(generic.config_status, 4, "ERROR");
    assert_eq!(
        generic.error_state.as_ref().unwrap().details,
        "route v1 refused"
    );
}

async fn shutdown_ends_streams_with_unavailable(db: TestDb) {
    let mut server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    stream.next().await;
    let _ = server.stop.take().unwrap().send(());
    let end = tokio::time::timeout(WAIT, stream.responses.message())
        .await
        .expect("the stream ends");
    assert_eq!(end.unwrap_err().code(), tonic::Code::Unavailable);
    tokio::time::timeout(WAIT, &mut server.task)
        .await
        .expect("the server finishes")
        .unwrap();
}
