//! Client events over real gRPC: a stream's first request announces it, its ACKs and NACKs
//! (with the client's error text) follow, and its end says goodbye — while a reader that never
//! reads holds nothing up.

use tokio::sync::broadcast;
use vxds_xds::ClientEvent;

use super::*;

on_both_backends!(
    connects_answers_and_leaves_are_broadcast,
    a_sotw_ack_of_a_superseded_response_counts_for_rollout,
    an_idle_stream_stops_waiting_for_a_secret_it_never_asks_for,
);

async fn connects_answers_and_leaves_are_broadcast(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let registry = server.xds.registry();
    let mut events = registry.events.subscribe();
    let mut rollouts = registry.events.subscribe();
    // A reader that never reads: the channel drops its oldest events for it, and streams go on.
    let _stalled = registry.events.subscribe();

    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("envoy-events", &[])),
            resource_names: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    let ClientEvent::ClientConnected(info) = &*next_event(&mut events).await else {
        panic!("expected client_connected")
    };
    assert_eq!(
        (info.node_id.as_str(), info.service, info.protocol),
        ("envoy-events", "ads", "sotw")
    );
    let stream_id = info.stream_id;

    let first = stream.next().await;
    stream.ack(&first).await;
    let ClientEvent::Ack(ack) = &*next_event(&mut events).await else {
        panic!("expected an ack")
    };
    assert_eq!(
        (ack.stream_id, ack.type_url.as_str(), ack.version.as_str()),
        (stream_id, ROUTE, first.version_info.as_str())
    );
    assert_eq!(ack.message, None);

    let revision = server
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
                message: "route v1 refused: no such cluster".into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let ClientEvent::Nack(nack) = &*next_event(&mut events).await else {
        panic!("expected a nack")
    };
    assert_eq!(nack.node_id, "envoy-events");
    assert_eq!(
        nack.message.as_deref(),
        Some("route v1 refused: no such cluster")
    );
    assert_eq!(nack.version, update.version_info);
    assert_eq!(nack.nonce, update.nonce);
    // The revision's rollout moved with it: the one stream it changed refused it.
    loop {
        if let ClientEvent::Rollout(progress) = &*any_event(&mut rollouts).await
            && progress.revision == revision
            && progress.nacked == 1
        {
            assert_eq!((progress.streams, progress.pending), (1, 0));
            break;
        }
    }

    drop(stream);
    let ClientEvent::ClientDisconnected(gone) = &*next_event(&mut events).await else {
        panic!("expected client_disconnected")
    };
    assert_eq!(
        (gone.stream_id, gone.node_id.as_str()),
        (stream_id, "envoy-events")
    );
}

/// The next event but rollout progress (see `rollout_events`).
async fn next_event(events: &mut broadcast::Receiver<Arc<ClientEvent>>) -> Arc<ClientEvent> {
    loop {
        let event = any_event(events).await;
        if !matches!(&*event, ClientEvent::Rollout(_)) {
            return event;
        }
    }
}

async fn any_event(events: &mut broadcast::Receiver<Arc<ClientEvent>>) -> Arc<ClientEvent> {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("an event in time")
        .unwrap()
}

/// This replica's counts of `revision`: `(streams, acked, nacked, pending)`.
fn rollout_counts(server: &Server, revision: u64) -> (u64, u64, u64, u64) {
    match server.xds.registry().rollouts.get(revision) {
        vxds_xds::rollout::Known::Record(r) => (r.streams, r.acked, r.nacked, r.pending),
        other => panic!("revision {revision}: {other:?}"),
    }
}

/// Review finding 4: a SotW client that lags behind ACKs a response a later one superseded (a
/// stale nonce), then NACKs the later one. It holds the superseded response's state: that
/// revision is accepted, and only the later one refused.
async fn a_sotw_ack_of_a_superseded_response_counts_for_rollout(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node("envoy-lagging", &[])),
            resource_names: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    stream.ack(&first).await;
    let accepted = server
        .apply(json!([put_route("web", &[("*", "v1")])]))
        .await;
    let superseded = stream.next().await;
    let refused = server
        .apply(json!([put_route("web", &[("*", "v2")])]))
        .await;
    let latest = stream.next().await;
    assert_eq!(tag(&latest.resources[0].value), "v2");
    // Its answers arrive late: the ACK of v1, then the NACK of v2.
    stream.ack(&superseded).await;
    stream
        .requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["web".into()],
            version_info: superseded.version_info.clone(),
            response_nonce: latest.nonce.clone(),
            error_detail: Some(vxds_envoy::pb::google::rpc::Status {
                code: 3,
                message: "route v2 refused".into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while rollout_counts(&server, refused).2 == 0 {
        assert!(tokio::time::Instant::now() < deadline, "no refusal counted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rollout_counts(&server, refused), (1, 0, 1, 0));
    assert_eq!(rollout_counts(&server, accepted), (1, 1, 0, 0));
}

const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// Envoy with its secret from elsewhere (a static one in its bootstrap, another SDS server):
/// the revision adding a listener that names it waits for the secret only the grace, then
/// settles — on a stream that sends nothing more (its task wakes at the deadline).
async fn an_idle_stream_stops_waiting_for_a_secret_it_never_asks_for(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    let secret = json!({"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
        "name": "cert", "tls_certificate": {"certificate_chain": {"inline_string": "x"},
        "private_key": {"inline_string": "y"}}});
    server
        .apply(json!([{"op": "put", "type": "secret", "name": "cert",
            "variants": [{"constraints": "*", "resource": secret}]}]))
        .await;
    let mut stream = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: LISTENER.into(),
            node: Some(node("envoy-static-secret", &[])),
            ..Default::default()
        },
    )
    .await;
    let first = stream.next().await;
    stream.ack(&first).await;
    let listener = json!({"@type": LISTENER, "name": "l",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 1}},
        "filter_chains": [{"transport_socket": {"name": "tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "common_tls_context": {"tls_certificate_sds_secret_configs": [{"name": "cert"}]}}},
          "filters": [{"name": "tcp", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
            "stat_prefix": "t", "cluster": "static_c"}}]}]});
    let revision = server
        .apply(json!([{"op": "put", "type": "listener", "name": "l",
            "variants": [{"constraints": "*", "resource": listener}]}]))
        .await;
    let lds = stream.next().await;
    stream.ack(&lds).await;
    let acked_at = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        rollout_counts(&server, revision),
        (1, 0, 0, 1),
        "the secret is waited for"
    );
    // Nothing more is sent on the stream: it settles at the grace.
    let deadline = acked_at + vxds_xds::rollout::NEED_GRACE + Duration::from_secs(2);
    while rollout_counts(&server, revision).3 != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "still waiting for the secret"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(rollout_counts(&server, revision), (1, 1, 0, 0));
}
