//! What real Envoys do that the server once got wrong, over real gRPC: on-demand names on top
//! of the Delta legacy wildcard, reconnects with locators, new dynamic parameters mid-stream,
//! SotW variant switches, a SotW client that stops watching a type, Delta re-subscribes, CSDS
//! and secrets, unknown types.

use super::*;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

on_both_backends!(
    delta_on_demand_names_keep_the_legacy_wildcard,
    delta_reconnect_with_locators_sends_nothing_again,
    delta_resubscribes_are_answered,
    new_node_parameters_switch_variants_mid_stream,
    sotw_variant_switch_names_the_resource_once,
    sotw_a_type_no_longer_watched_does_not_hold_back_removals,
    csds_never_returns_secret_bodies_and_can_be_turned_off,
    unknown_types_are_ignored_and_the_stream_lives,
    globs_with_envoys_node_context_are_served_and_woken,
);

fn put_cluster(name: &str) -> Value {
    json!({"op": "put", "type": "cluster", "name": name, "variants": [{"resource":
        {"@type": CLUSTER, "name": name, "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}}}]})
}

fn delete(ty: &str, name: &str) -> Value {
    json!({"op": "delete", "type": ty, "name": name})
}

fn delta_names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    let mut names: Vec<String> = r
        .resources
        .iter()
        .map(|r| {
            r.resource_name
                .as_ref()
                .map_or(r.name.clone(), |n| n.name.clone())
        })
        .collect();
    names.sort();
    names
}

/// No response arrives within a short while.
async fn silent<T: prost::Message + Default + std::fmt::Debug>(
    responses: &mut tonic::Streaming<T>,
) {
    let next = tokio::time::timeout(Duration::from_millis(500), responses.message()).await;
    assert!(next.is_err(), "unexpected response: {next:?}");
}

async fn delta_on_demand_names_keep_the_legacy_wildcard(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_cluster("a"), put_cluster("b")]))
        .await;
    let mut stream = DeltaStream::open(
        &server,
        DeltaDiscoveryRequest {
            type_url: CLUSTER.into(),
            node: Some(node("envoy", &[])),
            ..Default::default()
        },
    )
    .await;
    let all = stream.next().await;
    assert_eq!(delta_names(&all), ["a", "b"]);
    stream.ack(&all).await;
    // Envoy's on-demand CDS subscribes to one name on the same stream.
    stream
        .requests
        .send(DeltaDiscoveryRequest {
            type_url: CLUSTER.into(),
            resource_names_subscribe: vec!["od".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let missing = stream.next().await;
    assert_eq!(missing.removed_resources, ["od"]);
    assert!(missing.resources.is_empty());
    stream.ack(&missing).await;
    server.apply(json!([put_cluster("od")])).await;
    let od = stream.next().await;
    assert_eq!(delta_names(&od), ["od"]);
    assert!(
        od.removed_resources.is_empty(),
        "the wildcard clusters stay"
    );
    stream.ack(&od).await;
    server.apply(json!([put_cluster("c")])).await;
    let c = stream.next().await;
    assert_eq!(delta_names(&c), ["c"], "still a wildcard subscriber");
}

async fn delta_reconnect_with_locators_sends_nothing_again(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "rest")]
        )]))
        .await;
    let subscribe = || DeltaDiscoveryRequest {
        type_url: ROUTE.into(),
        node: Some(node("envoy", &[])),
        resource_locators_subscribe: vec![locator("web", &[("env", "prod")])],
        ..Default::default()
    };
    let mut first = DeltaStream::open(&server, subscribe()).await;
    let held = first.next().await;
    let version = held.resources[0].version.clone();
    first.ack(&held).await;
    drop(first);

    let mut request = subscribe();
    request.initial_resource_versions = [("web".to_owned(), version)].into();
    let mut again = DeltaStream::open(&server, request).await;
    silent(&mut again.responses).await;
    // The held variant is known: a replacement removes it by its constraints.
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod-2"), (r#"env != "prod""#, "rest")]
        )]))
        .await;
    let update = again.next().await;
    assert!(update.removed_resources.is_empty());
    assert_eq!(delta_names(&update), ["web"]);
    assert_eq!(
        tag(&update.resources[0].resource.as_ref().unwrap().value),
        "prod-2"
    );
}

async fn delta_resubscribes_are_answered(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let mut stream = DeltaStream::open(
        &server,
        DeltaDiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names_subscribe: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    stream.ack(&first).await;
    stream
        .requests
        .send(DeltaDiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names_subscribe: vec!["web".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let again = stream.next().await;
    assert_eq!(delta_names(&again), ["web"]);
    assert_eq!(again.resources[0].version, first.resources[0].version);
}

async fn new_node_parameters_switch_variants_mid_stream(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod"), (r#"env = "test""#, "test")]
        )]))
        .await;
    // SotW: the ACK carries the node with new parameters.
    let mut sotw = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("sotw", &[("env", "prod")])),
            resource_names: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    let prod = sotw.next().await;
    assert_eq!(tag(&prod.resources[0].value), "prod");
    sotw.requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("sotw", &[("env", "test")])),
            resource_names: vec!["web".into()],
            version_info: prod.version_info.clone(),
            response_nonce: prod.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let test = sotw.next().await;
    assert_eq!(tag(&test.resources[0].value), "test");

    // Delta: the same, as an update of the name.
    let mut delta = DeltaStream::open(
        &server,
        DeltaDiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("delta", &[("env", "prod")])),
            resource_names_subscribe: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    let prod = delta.next().await;
    delta
        .requests
        .send(DeltaDiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("delta", &[("env", "test")])),
            response_nonce: prod.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let test = delta.next().await;
    assert!(test.removed_resources.is_empty());
    assert_eq!(
        tag(&test.resources[0].resource.as_ref().unwrap().value),
        "test"
    );
    // The operator view follows.
    let clients = server.xds.registry().clients();
    let delta_client = clients.iter().find(|c| c.node_id == "delta").unwrap();
    assert_eq!(delta_client.types[0].params.0["env"], "test");
}

async fn sotw_variant_switch_names_the_resource_once(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route(
            "web",
            &[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "rest")]
        )]))
        .await;
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_locators: vec![locator("web", &[("env", "prod"), ("v", "1")])],
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    stream.ack(&first).await;
    server
        .apply(json!([put_route(
            "web",
            &[
                (r#"env = "prod" && v = "1""#, "prod-v1"),
                (r#"env = "prod" && v != "1""#, "prod-other"),
                (r#"env != "prod" && (exists(v) || !exists(v))"#, "rest")
            ]
        )]))
        .await;
    let switched = stream.next().await;
    assert_eq!(switched.resources.len(), 1, "the name once");
    let wrapped = Resource::decode(switched.resources[0].value.as_slice()).unwrap();
    assert_eq!(tag(&wrapped.resource.unwrap().value), "prod-v1");
}

async fn sotw_a_type_no_longer_watched_does_not_hold_back_removals(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([
            put_cluster("a"),
            put_cluster("b"),
            put_route("web", &[("*", "v0")])
        ]))
        .await;
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: CLUSTER.into(),
            ..Default::default()
        },
    )
    .await;
    let clusters = stream.next().await;
    stream.ack(&clusters).await;
    stream
        .requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["web".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let routes = stream.next().await;
    // Envoy drops its last route watch: the request names nothing, and it will answer no
    // route response again.
    stream
        .requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            version_info: routes.version_info.clone(),
            response_nonce: routes.nonce.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    server.apply(json!([delete("cluster", "a")])).await;
    let removal = stream.next().await;
    assert_eq!(removal.type_url, CLUSTER, "no route response in between");
    assert_eq!(removal.resources.len(), 1);
}

async fn csds_never_returns_secret_bodies_and_can_be_turned_off(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([{"op": "put", "type": "secret", "name": "key", "variants": [{"resource":
            {"@type": SECRET, "name": "key", "generic_secret": {"secret": {"inline_string": "hunter2"}}}}]}]))
        .await;
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: SECRET.into(),
            node: Some(node("envoy", &[])),
            resource_names: vec!["key".into()],
            ..Default::default()
        },
    )
    .await;
    let secret = stream.next().await;
    assert_eq!(secret.resources.len(), 1);
    stream.ack(&secret).await;
    let mut csds = ClientStatusDiscoveryServiceClient::new(server.channel.clone());
    let status = csds
        .fetch_client_status(ClientStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    let generic = &status.config[0].generic_xds_configs[0];
    assert_eq!(generic.name, "key");
    assert!(!generic.version_info.is_empty());
    assert!(generic.xds_config.is_none(), "no secret body over CSDS");
    assert!(!format!("{status:?}").contains("hunter2"));

    let off = Server::start(
        &db,
        XdsConfig {
            csds: false,
            ..Default::default()
        },
    )
    .await;
    let error = ClientStatusDiscoveryServiceClient::new(off.channel.clone())
        .fetch_client_status(ClientStatusRequest::default())
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::Unimplemented);
}

/// grpc-go's rule: a type the server does not know is ignored, not the end of the stream (which
/// would make the client reconnect at once, in a loop).
async fn unknown_types_are_ignored_and_the_stream_lives(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server.apply(json!([put_cluster("a")])).await;
    let (requests, rx) = mpsc::channel(2);
    for type_url in ["type.googleapis.com/no.such.Type", CLUSTER] {
        requests
            .send(DiscoveryRequest {
                type_url: type_url.into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let mut responses = server
        .ads()
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let response = tokio::time::timeout(WAIT, responses.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(response.type_url, CLUSTER);
    assert_eq!(response.resources.len(), 1);
    let clients = server.xds.registry().clients();
    assert_eq!(
        clients[0].unknown_types,
        ["type.googleapis.com/no.such.Type"]
    );
    silent(&mut responses).await;
}

/// Envoy adds its node context to every collection name (`xds.node.id`, …): such globs are
/// served, and members woken, whatever follows the glob (`#alt=` is the client's business).
async fn globs_with_envoys_node_context_are_served_and_woken(db: TestDb) {
    const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
    let server = Server::start(&db, XdsConfig::default()).await;
    let member = |id: &str, port: u16| {
        let name =
            format!("xdstp://auth/envoy.config.listener.v3.Listener/edge/{id}?xds.node.id=n1");
        json!({"op": "put", "type": "listener", "name": name, "variants": [{"resource": {
            "@type": LISTENER, "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]})
    };
    server.apply(json!([member("a", 1001)])).await;
    let mut stream = DeltaStream::open(
        &server,
        DeltaDiscoveryRequest {
            type_url: LISTENER.into(),
            resource_names_subscribe: vec![
                "xdstp://auth/envoy.config.listener.v3.Listener/edge/*?xds.node.id=n1#alt=xdstp://backup/envoy.config.listener.v3.Listener/edge/*"
                    .into(),
            ],
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    assert_eq!(
        delta_names(&first),
        ["xdstp://auth/envoy.config.listener.v3.Listener/edge/a?xds.node.id=n1"]
    );
    stream.ack(&first).await;
    server.apply(json!([member("b", 1002)])).await;
    let woken = stream.next().await;
    assert_eq!(
        delta_names(&woken),
        ["xdstp://auth/envoy.config.listener.v3.Listener/edge/b?xds.node.id=n1"]
    );
}
