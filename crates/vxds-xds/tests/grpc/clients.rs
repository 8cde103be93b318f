//! Clients that misbehave or leave, over real gRPC: a stuck client holds up no one, one that
//! leaves leaves nothing behind, an oversized request fails clearly, and requests read by hand
//! fail as prost's decoder would.

use super::*;

on_both_backends!(
    a_stuck_client_does_not_hold_up_others,
    a_client_that_leaves_leaves_nothing_behind,
    oversized_requests_fail_clearly,
    requests_read_by_hand_and_undecodable_ones_fail_as_before,
);

async fn a_stuck_client_does_not_hold_up_others(db: TestDb) {
    let server = Server::start(
        &db,
        XdsConfig {
            queue_depth: 2,
            ..Default::default()
        },
    )
    .await;
    // Big enough that a stuck reader's HTTP/2 window fills.
    let big = "x".repeat(200_000);
    server
        .apply(json!([
            put_route("big", &[("*", &big)]),
            put_route("web", &[("*", "v0")])
        ]))
        .await;
    let stuck = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["big".into(), "web".into()],
            ..Default::default()
        },
    )
    .await;
    let mut healthy = SotwStream::open(
        &server,
        DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["web".into()],
            ..Default::default()
        },
    )
    .await;
    let mut last = healthy.next().await;
    healthy.ack(&last).await;
    // Many revisions; the stuck client reads nothing, the healthy one sees the last state soon.
    for i in 1..=30 {
        server
            .apply(json!([
                put_route("big", &[("*", &format!("{big}{i}"))]),
                put_route("web", &[("*", &format!("v{i}"))])
            ]))
            .await;
    }
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let next = healthy.next().await;
        healthy.ack(&next).await;
        if tag(&next.resources[0].value) == "v30" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the healthy client fell behind"
        );
        last = next;
    }
    let _ = last;
    drop(stuck);
}

async fn a_client_that_leaves_leaves_nothing_behind(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server
        .apply(json!([put_route("web", &[("*", "v0")])]))
        .await;
    let registry = server.xds.registry();
    {
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
        assert_eq!(registry.len(), 1);
    }
    // Gone mid-push: revisions arrive while nobody listens.
    server
        .apply(json!([put_route("web", &[("*", "v1")])]))
        .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while !registry.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stream's task never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn oversized_requests_fail_clearly(db: TestDb) {
    let server = Server::start(
        &db,
        XdsConfig {
            max_request_bytes: 1024,
            ..Default::default()
        },
    )
    .await;
    let names: Vec<String> = (0..200).map(|i| format!("route-{i}")).collect();
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: names,
            ..Default::default()
        })
        .await
        .unwrap();
    let result = server
        .ads()
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await;
    let error = match result {
        Err(status) => status,
        Ok(response) => response.into_inner().message().await.unwrap_err(),
    };
    assert_eq!(error.code(), tonic::Code::ResourceExhausted, "{error:?}");
    assert!(
        error.message().contains("message length too large") || error.message().contains("larger"),
        "{error:?}"
    );
}

/// Requests as bytes: what the client library would never send.
#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

#[derive(Debug)]
struct RawEncoder;

#[derive(Debug)]
struct DeltaDecoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for DeltaDecoder {
    type Item = DeltaDiscoveryResponse;
    type Error = tonic::Status;

    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<DeltaDiscoveryResponse>, tonic::Status> {
        DeltaDiscoveryResponse::decode(buf)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = DeltaDiscoveryResponse;
    type Encoder = RawEncoder;
    type Decoder = DeltaDecoder;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> DeltaDecoder {
        DeltaDecoder
    }
}

/// A Delta ADS stream that sends `requests` as they are.
async fn raw_delta(
    server: &Server,
    requests: Vec<Vec<u8>>,
) -> Result<tonic::Streaming<DeltaDiscoveryResponse>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(server.channel.clone());
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(
        "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources",
    );
    let (tx, rx) = mpsc::channel(4);
    for request in requests {
        tx.send(request).await.unwrap();
    }
    // The sender stays open: the stream ends by the server's word.
    std::mem::forget(tx);
    grpc.streaming(tonic::Request::new(ReceiverStream::new(rx)), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

/// An answer's fields are read by hand, anything else by prost: a request of only a type
/// (written twice, the last one counting) opens CDS's legacy wildcard as ever, and one whose
/// nonce is not UTF-8 ends the stream with prost's error, as tonic's decoder reported it.
async fn requests_read_by_hand_and_undecodable_ones_fail_as_before(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
    server
        .apply(json!([{"op": "put", "type": "cluster", "name": "c1", "variants": [{"resource":
            {"@type": CDS, "name": "c1", "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}}}]}]))
        .await;
    let field = |tag: u8, bytes: &[u8]| {
        let mut b = vec![tag << 3 | 2, bytes.len() as u8];
        b.extend_from_slice(bytes);
        b
    };
    // CDS with nothing subscribed: the legacy wildcard (the type written twice, the last counts).
    let mut first = field(2, ROUTE.as_bytes());
    first.extend(field(2, CDS.as_bytes()));
    let mut stream = raw_delta(&server, vec![first]).await.unwrap();
    let response = tokio::time::timeout(WAIT, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(response.type_url, CDS);
    assert_eq!(response.resources.len(), 1);
    assert_eq!(response.resources[0].name, "c1");

    let mut bad = field(2, ROUTE.as_bytes());
    bad.extend(field(6, b"\xff\xfe"));
    let error = match raw_delta(&server, vec![bad]).await {
        Err(status) => status,
        Ok(mut stream) => tokio::time::timeout(WAIT, stream.message())
            .await
            .unwrap()
            .unwrap_err(),
    };
    assert_eq!(error.code(), tonic::Code::Internal, "{error:?}");
    let expected = DeltaDiscoveryRequest::decode(&field(6, b"\xff\xfe")[..]).unwrap_err();
    assert!(error.message().contains(&expected.to_string()), "{error:?}");
}
