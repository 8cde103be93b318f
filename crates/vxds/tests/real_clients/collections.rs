//! TP1 list collections with real clients. Envoy 1.40 subscribes to glob collections over xDS
//! but reads list collections only from files (its `filesystem_collection` subscription: a
//! `Resource` wrapping a `<T>Collection` of inline entries). So a gRPC client (tonic, Delta ADS)
//! fetches a `ListenerCollection` from vxds with inline entries, resolved to its parameters,
//! and hands the `Resource` exactly as received to an Envoy through `lds_resources_locator:
//! file://...` — the TP1 "handcrafted configuration on a filesystem" use, fed by vxds. Envoy
//! then serves each inline listener.

use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::xds::core::v3::ContextParams;

use super::*;

const LISTENER_COLLECTION: &str = "type.googleapis.com/envoy.config.listener.v3.ListenerCollection";
const COLLECTION: &str = "xdstp://vxds/envoy.config.listener.v3.ListenerCollection/edge";

fn edge_listener(id: &str, port: u16, says: &str) -> Value {
    json!({
        "@type": LISTENER,
        "name": format!("xdstp://vxds/envoy.config.listener.v3.Listener/edge/{id}"),
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": id,
            "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                {"match": {"prefix": "/"}, "direct_response": {"status": 200, "body": {"inline_string": says}}},
            ]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }}]}],
    })
}

/// The collection as a Delta ADS client with `env` and the inline-entries feature gets it: the
/// `Resource` of the first response, encoded.
async fn fetch_collection(xds_port: u16, env: &str) -> Vec<u8> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{xds_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (requests, rx) = mpsc::channel(4);
    let mut node = Node {
        id: format!("relay-{env}"),
        client_features: vec![vxds_envoy::collections::INLINE_ENTRIES_FEATURE.into()],
        ..Default::default()
    };
    node.dynamic_parameters.insert(
        LISTENER_COLLECTION.into(),
        ContextParams {
            params: [("env".to_owned(), env.to_owned())].into(),
        },
    );
    requests
        .send(DeltaDiscoveryRequest {
            node: Some(node),
            type_url: LISTENER_COLLECTION.into(),
            resource_names_subscribe: vec![COLLECTION.into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // The server may answer from a revision before the write (its index follows the commit):
    // "does not exist" first, then the collection, as any Delta client takes it.
    let deadline = Instant::now() + WAIT;
    loop {
        let response = tokio::time::timeout_at(deadline.into(), responses.message())
            .await
            .expect("the collection arrives")
            .unwrap()
            .unwrap();
        requests
            .send(DeltaDiscoveryRequest {
                type_url: LISTENER_COLLECTION.into(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        if let Some(resource) = response.resources.iter().find(|r| r.name == COLLECTION) {
            return resource.encode_to_vec();
        }
        assert_eq!(response.removed_resources, [COLLECTION], "{response:?}");
    }
}

async fn body_on(client: &reqwest::Client, port: u16, expected: &str) {
    let deadline = Instant::now() + WAIT;
    let mut last = String::from("no answer yet");
    while Instant::now() < deadline {
        if let Ok(response) = client.get(format!("http://127.0.0.1:{port}/")).send().await {
            last = response.text().await.unwrap_or_default();
            if last == expected {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("Envoy on :{port} never said {expected:?}; last: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_applies_an_inline_listener_collection_fetched_from_vxds() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let client = reqwest::Client::new();
    let (port_a, port_b) = (free_port(), free_port());
    let a = "xdstp://vxds/envoy.config.listener.v3.Listener/edge/a";
    let b = "xdstp://vxds/envoy.config.listener.v3.Listener/edge/b";
    apply(
        &client,
        &admin,
        vec![
            json!({"op": "put", "type": "listener", "name": a, "variants": [
                {"constraints": r#"env = "prod""#, "resource": edge_listener("a", port_a, "a for prod")},
                {"constraints": r#"env = "test""#, "resource": edge_listener("a", port_a, "a for test")},
            ]}),
            json!({"op": "put", "type": "listener", "name": b, "variants": [
                {"resource": edge_listener("b", port_b, "b for all")},
            ]}),
        ],
    )
    .await;

    let collection = fetch_collection(xds_port, "test").await;
    let file = dir.path().join("edge.pb");
    std::fs::write(&file, collection).unwrap();
    let admin_port = free_port();
    let bootstrap = json!({
        "node": {"id": "file-envoy", "cluster": "e2e"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "dynamic_resources": {"lds_resources_locator": format!("file://{}", file.display())},
    });
    let _envoy = spawn_envoy(dir.path(), "envoy-collection", &bootstrap);
    // Both inline listeners are applied, `a` as the test variant the relay's parameters chose.
    body_on(&client, port_a, "a for test").await;
    body_on(&client, port_b, "b for all").await;
}
