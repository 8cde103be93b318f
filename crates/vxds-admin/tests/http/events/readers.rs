//! Issue 12 over real HTTP, who reads the event stream and how: xDS client events and readers
//! that fall behind (`lagged`), keep-alive comments, the reader limit, a reader that stops
//! reading, and streams ending when the server drains.

use vxds_testkit::{Db, with_db};
use vxds_xds::ClientEvent;
use vxds_xds::events::{Answer, StreamInfo};

use super::*;

/// The admin API with an xDS registry's client events, and keep-alive every `keep_alive`.
async fn serve_with_clients(
    db: &TestDb,
    keep_alive: Duration,
) -> (
    String,
    Arc<vxds_xds::Registry>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = db.store().await;
    let (index, follower) = index::start(store.clone()).await.unwrap();
    let registry = Arc::new(vxds_xds::Registry::new(index.snapshot()));
    let mut metrics_registry = Registry::default();
    let metrics = Arc::new(AdminMetrics::register(&mut metrics_registry));
    let state = AdminState::new(
        store,
        index,
        Tokens::none(),
        metrics,
        Arc::new(metrics_registry),
        DEFAULT_BODY_LIMIT,
    )
    .with_clients(registry.clone())
    .with_events_keep_alive(keep_alive);
    let (base, server) = serve_state(state).await;
    (base, registry, vec![server, follower])
}

/// The admin API with client events and the given event-stream limits; its metrics too.
async fn serve_with_limits(
    db: &TestDb,
    max_readers: usize,
    queue_bytes: usize,
) -> (
    String,
    Arc<vxds_xds::Registry>,
    Arc<AdminMetrics>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let store = db.store().await;
    let (index, follower) = index::start(store.clone()).await.unwrap();
    let registry = Arc::new(vxds_xds::Registry::new(index.snapshot()));
    let mut metrics_registry = Registry::default();
    let metrics = Arc::new(AdminMetrics::register(&mut metrics_registry));
    let state = AdminState::new(
        store,
        index,
        Tokens::none(),
        metrics.clone(),
        Arc::new(metrics_registry),
        DEFAULT_BODY_LIMIT,
    )
    .with_clients(registry.clone())
    .with_event_limits(max_readers, queue_bytes);
    let (base, server) = serve_state(state).await;
    (base, registry, metrics, vec![server, follower])
}

/// Event streams end when the server starts draining, so that shutdown does not wait for them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_end_when_the_server_drains() {
    with_db(Db::Sqlite, |db| async move {
        let store = db.store().await;
        let (index, follower) = index::start(store.clone()).await.unwrap();
        let mut metrics_registry = Registry::default();
        let metrics = Arc::new(AdminMetrics::register(&mut metrics_registry));
        let (drain, draining) = tokio::sync::watch::channel(false);
        let state = AdminState::new(
            store,
            index,
            Tokens::none(),
            metrics,
            Arc::new(metrics_registry),
            DEFAULT_BODY_LIMIT,
        )
        .with_drain_signal(draining);
        let (base, server) = serve_state(state).await;
        let mut reader = SseReader::open(&base, None, None).await;
        assert_eq!(reader.event().await.0, "hello");
        drain.send_replace(true);
        let end = tokio::time::timeout(WAIT, reader.response.chunk())
            .await
            .expect("the stream ended in time")
            .unwrap();
        assert!(end.is_none(), "{end:?}");
        server.abort();
        follower.abort();
    })
    .await;
}

/// Client events are forwarded with their data; a reader that cannot keep up loses the oldest
/// and is told how many (`lagged`), and every event is either received or counted as missed.
/// One thread: while the test sends, the reader's task cannot run, so it must fall behind.
#[tokio::test(flavor = "current_thread")]
async fn client_events_and_lagged_readers() {
    with_db(Db::Sqlite, |db| async move {
        let (base, registry, tasks) = serve_with_clients(&db, Duration::from_secs(60)).await;
        let mut reader = SseReader::open(&base, None, None).await;
        let (name, _, data) = reader.event().await;
        assert_eq!((name.as_str(), &data["clients"]), ("hello", &json!(true)));

        let events = &registry.events;
        events.send(ClientEvent::ClientConnected(StreamInfo {
            stream_id: 7,
            node_id: "envoy-a".into(),
            service: "ads",
            protocol: "delta",
            ..StreamInfo::default()
        }));
        events.send(ClientEvent::Nack(Answer {
            stream_id: 7,
            node_id: "envoy-a".into(),
            type_url: ROUTE.into(),
            version: "v2".into(),
            nonce: "3".into(),
            message: Some("route refused: unknown cluster".into()),
            at: "2026-11-23T00:00:00Z".into(),
        }));
        let (name, _, data) = reader.event().await;
        assert_eq!(name, "client_connected");
        assert_eq!(
            (&data["node_id"], &data["protocol"], &data["stream_id"]),
            (&json!("envoy-a"), &json!("delta"), &json!(7))
        );
        let (name, _, data) = reader.event().await;
        assert_eq!(name, "nack");
        assert_eq!(data["message"], "route refused: unknown cluster");
        assert_eq!(data["type_url"], ROUTE);

        // Far more than the channel keeps, without yielding: the reader must lag.
        let sent = 5 * vxds_xds::events::CAPACITY as u64;
        for stream_id in 0..sent {
            events.send(ClientEvent::Ack(Answer {
                stream_id,
                ..Answer::default()
            }));
        }
        events.send(ClientEvent::ClientDisconnected(StreamInfo {
            stream_id: u64::MAX,
            ..StreamInfo::default()
        }));
        let (mut acks, mut missed, mut lagged_events) = (0u64, 0u64, 0);
        loop {
            let (name, _, data) = reader.event().await;
            match name.as_str() {
                "ack" => acks += 1,
                "lagged" => {
                    lagged_events += 1;
                    missed += data["missed"].as_u64().unwrap();
                }
                "client_disconnected" => break,
                other => panic!("unexpected {other}: {data}"),
            }
        }
        assert!(lagged_events >= 1 && missed > 0, "{missed}");
        assert_eq!(acks + missed, sent);
        drop(reader);
        tasks.iter().for_each(|t| t.abort());
    })
    .await;
}

/// An idle stream gets keep-alive comments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_get_keep_alive_comments() {
    with_db(Db::Sqlite, |db| async move {
        let (base, _registry, tasks) = serve_with_clients(&db, Duration::from_millis(100)).await;
        let mut reader = SseReader::open(&base, None, None).await;
        let (name, _, _) = reader.event().await;
        assert_eq!(name, "hello");
        for _ in 0..2 {
            assert!(matches!(reader.next().await, Sse::Comment));
        }
        tasks.iter().for_each(|t| t.abort());
    })
    .await;
}

/// `--max-event-readers`: beyond it a reader gets 503 (`too_many_event_readers`, with
/// `Retry-After`); a reader that leaves frees its place. Streams say `X-Accel-Buffering: no`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_beyond_the_limit_are_refused() {
    with_db(Db::Sqlite, |db| async move {
        let (base, _registry, metrics, tasks) = serve_with_limits(&db, 2, 1 << 20).await;
        let mut first = SseReader::open(&base, None, None).await;
        assert_eq!(first.response.headers()["x-accel-buffering"], "no");
        assert_eq!(first.response.headers()["cache-control"], "no-cache");
        assert_eq!(first.event().await.0, "hello");
        let mut second = SseReader::open(&base, None, None).await;
        assert_eq!(second.event().await.0, "hello");
        assert_eq!(metrics.event_readers.get(), 2);
        let third = reqwest::get(format!("{base}/v1/events")).await.unwrap();
        assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(third.headers().contains_key("retry-after"));
        let body: Value = third.json().await.unwrap();
        assert_eq!(
            body["errors"][0]["code"], "too_many_event_readers",
            "{body}"
        );
        drop(first);
        // The server sees the reader leave when its connection closes.
        let mut again = None;
        for _ in 0..200 {
            let reply = reqwest::get(format!("{base}/v1/events")).await.unwrap();
            if reply.status() == StatusCode::OK {
                again = Some(reply);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            again.is_some(),
            "the place of a reader that left was never freed"
        );
        tasks.iter().for_each(|t| t.abort());
    })
    .await;
}

/// A reader that stops reading never holds more than its queue: once its socket and queue
/// are full it is dropped from the hub (counted in `vxds_event_readers_reset`), and what it
/// finally reads ends with `reset` (`slow_reader`, id = the last revision it had) and the end
/// of the stream. A reader that keeps reading meanwhile gets every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_stops_reading_is_reset() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    with_db(Db::Sqlite, |db| async move {
        let (base, registry, metrics, tasks) = serve_with_limits(&db, 8, 64 << 10).await;
        let address: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stuck = socket.connect(address).await.unwrap();
        stuck
            .write_all(b"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .unwrap();
        let mut live = SseReader::open(&base, None, None).await;
        assert_eq!(live.event().await.0, "hello");
        while metrics.event_readers.get() < 2 {
            tokio::task::yield_now().await;
        }
        const BATCH: u64 = 50;
        let mut sent = 0u64;
        while metrics.event_readers_dropped.get() == 0 {
            assert!(sent < 2_000_000, "the stuck reader was never reset");
            // A batch well within the live reader's 64 KiB queue (~400 bytes an event), so
            // that only the stuck reader can overflow, however late the live one's writer runs.
            for _ in 0..BATCH {
                registry.events.send(ClientEvent::Nack(Answer {
                    stream_id: sent,
                    node_id: format!("envoy-{sent}"),
                    type_url: ROUTE.into(),
                    message: Some("x".repeat(200)),
                    ..Answer::default()
                }));
                sent += 1;
            }
            // Let the live reader keep up.
            let (mut seen, mut missed) = (0, 0);
            while seen + missed < BATCH {
                let (name, _, data) = live.event().await;
                match name.as_str() {
                    "nack" => seen += 1,
                    "lagged" => missed += data["missed"].as_u64().unwrap(),
                    other => panic!("{other}: {data}"),
                }
            }
        }
        assert_eq!(metrics.event_readers_dropped.get(), 1, "only the stuck one");
        // Now it reads: whatever was in flight, then the reset, then the end of the stream.
        let mut text = Vec::new();
        let mut buffer = vec![0; 1 << 16];
        loop {
            let n = tokio::time::timeout(WAIT, stuck.read(&mut buffer))
                .await
                .expect("the stream ended in time")
                .unwrap();
            text.extend_from_slice(&buffer[..n]);
            if n == 0 || text.ends_with(b"\r\n0\r\n\r\n") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&text);
        let reset = text
            .find("event: reset\nid: 0\ndata: {\"revision\":0,\"reason\":\"slow_reader\"}\n\n")
            .expect("a reset at the end");
        assert!(
            !text[reset..].contains("event: nack"),
            "nothing after the reset"
        );
        assert!(text.ends_with("\r\n0\r\n\r\n"), "the stream ended");
        tasks.iter().for_each(|t| t.abort());
    })
    .await;
}
