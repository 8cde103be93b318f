//! The xDS server's connections over real gRPC: keepalive reaps a client whose peer vanished
//! without a FIN, connections reach their maximum age and clients reconnect, a drain spreads
//! its closes and refuses new connections, a client in a tight loop is rate limited while
//! others are served, a connection that says nothing is closed.

use std::time::Instant;

use vxds_testkit::Db;
use vxds_testkit::proxy::TcpProxy;
use vxds_xds::{ConnectionConfig, RequestRate};

use super::*;

async fn sqlite() -> TestDb {
    TestDb::fresh(Db::Sqlite).await
}

fn with_connections(connections: ConnectionConfig) -> XdsConfig {
    XdsConfig {
        connections,
        ..Default::default()
    }
}

fn routes_request() -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: ROUTE.into(),
        node: Some(node("envoy", &[])),
        resource_names_subscribe: vec!["web".into()],
        ..Default::default()
    }
}

async fn channel_to(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// Opens a Delta stream for `web` on `channel` and reads the first response.
async fn open(channel: &Channel) -> DeltaStream {
    let (requests, rx) = mpsc::channel(16);
    requests.send(routes_request()).await.unwrap();
    let responses = AggregatedDiscoveryServiceClient::new(channel.clone())
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let mut stream = DeltaStream {
        requests,
        responses,
    };
    stream.next().await;
    stream
}

/// Waits (within `WAIT`) for the stream to end; its status.
async fn ended(stream: &mut DeltaStream) -> tonic::Status {
    loop {
        match tokio::time::timeout(WAIT, stream.responses.message())
            .await
            .expect("the stream ends")
        {
            Ok(Some(_)) => continue,
            Ok(None) => return tonic::Status::ok(""),
            Err(status) => return status,
        }
    }
}

#[tokio::test]
async fn keepalive_reaps_a_client_that_vanished_without_a_fin() {
    let db = sqlite().await;
    let server = Server::start(
        &db,
        with_connections(ConnectionConfig {
            keepalive_interval: Some(Duration::from_millis(500)),
            keepalive_timeout: Duration::from_millis(500),
            ..Default::default()
        }),
    )
    .await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let proxy = TcpProxy::start(server.addr).await.unwrap();
    let _stream = open(&channel_to(proxy.addr).await).await;
    let clients = || server.xds.registry().clients().len();
    assert_eq!(clients(), 1);
    // The client's host vanishes: no FIN, no answer to pings.
    proxy.freeze();
    let deadline = Instant::now() + WAIT;
    while clients() > 0 {
        assert!(Instant::now() < deadline, "the stream was never reaped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn connections_reach_their_maximum_age_and_clients_reconnect() {
    let db = sqlite().await;
    let server = Server::start(
        &db,
        with_connections(ConnectionConfig {
            max_age: Some(Duration::from_secs(3)),
            max_age_grace: Duration::from_secs(5),
            ..Default::default()
        }),
    )
    .await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let channel = channel_to(server.addr).await;
    let mut stream = open(&channel).await;
    let status = ended(&mut stream).await;
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("maximum age"), "{status:?}");
    // The client reconnects (a new connection: the old one said GOAWAY) and is served.
    let mut again = open(&channel).await;
    server
        .apply(json!([put_route("web", &[("*", "v1")])]))
        .await;
    let update = again.next().await;
    assert_eq!(
        tag(&update.resources[0].resource.as_ref().unwrap().value),
        "v1"
    );
}

#[tokio::test]
async fn a_drain_spreads_its_closes_and_refuses_new_connections() {
    let db = sqlite().await;
    let mut server = Server::start(
        &db,
        with_connections(ConnectionConfig {
            drain_window: Duration::from_secs(2),
            ..Default::default()
        }),
    )
    .await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    // One stream per connection, as proxies have.
    let mut streams = Vec::new();
    for _ in 0..4 {
        streams.push(open(&channel_to(server.addr).await).await);
    }
    let started = Instant::now();
    let _ = server.stop.take().unwrap().send(());
    let mut ending = tokio::task::JoinSet::new();
    for mut stream in streams {
        ending.spawn(async move {
            let status = ended(&mut stream).await;
            (status, started.elapsed())
        });
    }
    let mut ends = Vec::new();
    while let Some(end) = ending.join_next().await {
        let (status, at) = end.unwrap();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(status.message().contains("shutting down"), "{status:?}");
        ends.push(at);
    }
    // Not all at once: the closes spread over the window.
    let (first, last) = (ends.iter().min().unwrap(), ends.iter().max().unwrap());
    assert!(
        *last - *first > Duration::from_millis(800),
        "closes at {ends:?}"
    );
    assert!(
        tokio::net::TcpStream::connect(server.addr).await.is_err(),
        "a draining server accepts no new connection"
    );
    tokio::time::timeout(WAIT, &mut server.task)
        .await
        .expect("the server finishes")
        .unwrap();
}

#[tokio::test]
async fn a_client_in_a_tight_loop_is_rate_limited_and_others_are_served() {
    let db = sqlite().await;
    let server = Server::start(
        &db,
        XdsConfig {
            request_rate: RequestRate {
                per_second: 10,
                burst: 20,
            },
            ..Default::default()
        },
    )
    .await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let mut polite = open(&server.channel).await;
    // Answering every response costs nothing, however many there are.
    for i in 0..30 {
        server
            .apply(json!([put_route("web", &[("*", &format!("u{i}"))])]))
            .await;
        let update = polite.next().await;
        polite.ack(&update).await;
    }
    let mut greedy = open(&server.channel).await;
    // The same ACK, again and again, as fast as it can.
    let spam = tokio::spawn({
        let requests = greedy.requests.clone();
        async move {
            for _ in 0..500 {
                let ack = DeltaDiscoveryRequest {
                    type_url: ROUTE.into(),
                    ..Default::default()
                };
                if requests.send(ack).await.is_err() {
                    return;
                }
            }
        }
    });
    let status = ended(&mut greedy).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("requests per second"),
        "{status:?}"
    );
    spam.abort();
    server
        .apply(json!([put_route("web", &[("*", "after")])]))
        .await;
    let update = polite.next().await;
    assert_eq!(
        tag(&update.resources[0].resource.as_ref().unwrap().value),
        "after"
    );
}

/// A peer that connects and says nothing (no HTTP/2 preface, so no pings) is closed after the
/// keepalive timeout; a client that speaks is not.
#[tokio::test]
async fn a_silent_connection_is_closed() {
    use tokio::io::AsyncReadExt;
    let db = sqlite().await;
    let server = Server::start(
        &db,
        with_connections(ConnectionConfig {
            keepalive_timeout: Duration::from_millis(500),
            ..Default::default()
        }),
    )
    .await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let mut silent = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let speaking = open(&channel_to(server.addr).await).await;
    let started = Instant::now();
    // The server's own SETTINGS arrive first; then the end of the connection.
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(WAIT, silent.read_to_end(&mut sink))
        .await
        .expect("the silent connection is closed");
    assert!(started.elapsed() >= Duration::from_millis(400));
    // The speaking client's stream lives on.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(server.xds.registry().clients().len(), 1);
    drop(speaking);
}

/// Unary `Fetch*` calls are charged to their connection's allowance as stream requests are:
/// a client fetching in a tight loop is refused with `RESOURCE_EXHAUSTED`; another connection
/// is served.
#[tokio::test]
async fn fetch_calls_in_a_tight_loop_are_rate_limited_per_connection() {
    use vxds_envoy::pb::envoy::service::discovery::v3::DiscoveryRequest;
    use vxds_envoy::pb::envoy::service::route::v3::route_discovery_service_client::RouteDiscoveryServiceClient;
    let db = sqlite().await;
    let server = Server::start(
        &db,
        XdsConfig {
            request_rate: RequestRate {
                per_second: 1,
                burst: 5,
            },
            ..Default::default()
        },
    )
    .await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let fetch = || DiscoveryRequest {
        type_url: ROUTE.into(),
        node: Some(node("envoy", &[])),
        resource_names: vec!["web".into()],
        ..Default::default()
    };
    let mut greedy = RouteDiscoveryServiceClient::new(server.channel.clone());
    let mut refused = None;
    for i in 0..50 {
        match greedy.fetch_routes(fetch()).await {
            Ok(response) => assert_eq!(response.get_ref().resources.len(), 1),
            Err(status) => {
                refused = Some((i, status));
                break;
            }
        }
    }
    let (i, status) = refused.expect("a tight loop of Fetch calls is refused");
    assert!(i >= 5, "the burst is allowed: refused at call {i}");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("Fetch requests per second"),
        "{status:?}"
    );
    // Another connection has its own allowance.
    let other = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let response = RouteDiscoveryServiceClient::new(other)
        .fetch_routes(fetch())
        .await
        .expect("another connection is served");
    assert_eq!(response.get_ref().resources.len(), 1);
}
