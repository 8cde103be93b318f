//! Issue 12, items 4 and 5 over real HTTP: `GET /v1/events` (revisions with author, message
//! and changed names; resuming with `Last-Event-ID`; client events and `lagged`; keep-alive;
//! read scope), the coverage grid, and the console's files.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use vxds_admin::{AdminMetrics, AdminState};
use vxds_store::index;
use vxds_testkit::{Db, with_db};
use vxds_xds::ClientEvent;
use vxds_xds::events::{Answer, StreamInfo};

use super::*;

on_both_backends!(
    revisions_stream_live_and_resume_after_last_event_id,
    a_resume_beyond_the_index_memory_reads_the_store,
    a_resume_on_a_replica_behind_the_store_is_no_reset,
    a_resume_before_the_kept_history_is_reset,
    a_resume_after_a_failover_that_reused_the_revision_is_reset,
    coverage_grid_of_a_stored_resource,
);

const WAIT: Duration = Duration::from_secs(20);

/// One parsed Server-Sent Event (`event`, `id`, `data`), or a keep-alive comment.
#[derive(Debug)]
pub(crate) enum Sse {
    Event {
        name: String,
        id: Option<String>,
        data: Value,
    },
    Comment,
}

/// Reads a `text/event-stream` response event by event.
pub(crate) struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    pub(crate) async fn open(base: &str, token: Option<&str>, last_event_id: Option<&str>) -> Self {
        let mut request = reqwest::Client::new().get(format!("{base}/v1/events"));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event or comment.
    pub(crate) async fn next(&mut self) -> Sse {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut name, mut id, mut data) = (None, None, String::new());
                let mut comment = false;
                for line in block.lines() {
                    if line.starts_with(':') {
                        comment = true;
                    } else if let Some(v) = line.strip_prefix("event:") {
                        name = Some(v.trim_start().to_owned());
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim_start().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                match name {
                    Some(name) => {
                        return Sse::Event {
                            name,
                            id,
                            data: serde_json::from_str(&data).unwrap_or(Value::Null),
                        };
                    }
                    None if comment => return Sse::Comment,
                    None => continue,
                }
            }
            let chunk = tokio::time::timeout(WAIT, self.response.chunk())
                .await
                .expect("no event within the wait")
                .unwrap()
                .expect("the event stream ended");
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// The next event, skipping keep-alive comments: (name, the revision its id names (the id
    /// without its commit), data).
    pub(crate) async fn event(&mut self) -> (String, Option<String>, Value) {
        let (name, id, data) = self.event_with_id().await;
        let revision = id.map(|id| id.split('-').next().unwrap_or_default().to_owned());
        (name, revision, data)
    }

    /// The next event, skipping keep-alive comments: (name, id as sent, data).
    pub(crate) async fn event_with_id(&mut self) -> (String, Option<String>, Value) {
        loop {
            if let Sse::Event { name, id, data } = self.next().await {
                return (name, id, data);
            }
        }
    }
}

/// Revisions arrive live with author, message and changed names; a reader that resumes with
/// `Last-Event-ID` gets every revision after it, then `hello`; a bad id is 400 naming the
/// header; an id ahead of the head is a `reset`. Read scope: no token is 401.
async fn revisions_stream_live_and_resume_after_last_event_id(db: TestDb) {
    let tokens = Tokens::parse(&format!("write {WRITE_TOKEN} alice\nread {READ_TOKEN}\n")).unwrap();
    let api = serve(&db, tokens, DEFAULT_BODY_LIMIT).await;

    let anonymous = api.get("/v1/events").await;
    assert_problem(&anonymous, 401);

    let mut live = SseReader::open(&api.base, Some(READ_TOKEN), None).await;
    let (name, id, data) = live.event().await;
    assert_eq!(
        (name.as_str(), id.as_deref()),
        ("hello", Some("0")),
        "{data}"
    );
    assert_eq!(data["revision"], 0);
    assert_eq!(data["clients"], false);

    let write = |path: String, message: &str| {
        let body = json!({"message": message, "operations": [
            {"op": "put", "type": "route", "name": path, "variants": [{"resource": route(&path, "x")}]},
            {"op": "put", "type": "route", "name": format!("{path}-2"), "variants": [{"resource": route(&format!("{path}-2"), "y")}]},
        ]});
        let api = &api;
        async move {
            let reply = api
                .call(
                    Method::POST,
                    "/v1/changesets",
                    Some(("application/json", body.to_string())),
                    &[("authorization", &format!("Bearer {WRITE_TOKEN}"))],
                )
                .await;
            assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        }
    };
    for n in 1..=3 {
        write(format!("web{n}"), &format!("change {n}")).await;
    }
    for n in 1..=3u64 {
        let (name, id, data) = live.event().await;
        assert_eq!(name, "revision", "{data}");
        assert_eq!(id, Some(n.to_string()));
        assert_eq!(data["revision"], n);
        assert_eq!(data["author"], "alice");
        assert_eq!(data["message"], format!("change {n}"));
        assert_eq!(
            data["changed"],
            json!([
                {"type_url": ROUTE, "type": "route", "name": format!("web{n}")},
                {"type_url": ROUTE, "type": "route", "name": format!("web{n}-2")},
            ])
        );
        assert!(data["committed_at"].as_str().unwrap().ends_with('Z'));
    }

    // Resume after revision 1: 2 and 3 again, then hello at 3, then live.
    let mut resumed = SseReader::open(&api.base, Some(READ_TOKEN), Some("1")).await;
    for n in 2..=3u64 {
        let (name, id, data) = resumed.event().await;
        assert_eq!((name.as_str(), id), ("revision", Some(n.to_string())));
        assert_eq!(data["message"], format!("change {n}"));
    }
    let (name, id, _) = resumed.event().await;
    assert_eq!((name.as_str(), id.as_deref()), ("hello", Some("3")));
    write("web4".into(), "change 4").await;
    for reader in [&mut live, &mut resumed] {
        let (name, id, _) = reader.event().await;
        assert_eq!((name.as_str(), id.as_deref()), ("revision", Some("4")));
    }

    // A reader a revision ahead of the index (it resumes from what its own write returned, or
    // another replica served it) waits for the index to get there: no reset.
    let mut soon = SseReader::open(&api.base, Some(READ_TOKEN), Some("5")).await;
    write("web5".into(), "change 5").await;
    let (name, id, _) = soon.event().await;
    assert_eq!((name.as_str(), id.as_deref()), ("hello", Some("5")));

    // A reader ahead of the head (a restored database) is told, and continues from the head.
    let mut ahead = SseReader::open(&api.base, Some(READ_TOKEN), Some("99")).await;
    let (name, id, data) = ahead.event().await;
    assert_eq!(
        (name.as_str(), &data),
        ("reset", &json!({"revision": 5, "reason": "head_went_back"}))
    );
    assert_eq!(id.as_deref(), Some("5"));
    let (name, id, _) = ahead.event().await;
    assert_eq!((name.as_str(), id.as_deref()), ("hello", Some("5")));

    let bad = api
        .call(
            Method::GET,
            "/v1/events",
            None,
            &[
                ("authorization", &format!("Bearer {READ_TOKEN}")),
                ("last-event-id", "seven"),
            ],
        )
        .await;
    assert_problem(&bad, 400);
    assert!(bad.text.contains("last-event-id"), "{}", bad.text);
}

/// A reader resuming from further back than the index remembers gets the older revisions
/// from the store's history, then the rest from the index, each once and in order; a store
/// that cannot answer is reported as `lagged` and the stream goes on from the index.
async fn a_resume_beyond_the_index_memory_reads_the_store(db: TestDb) {
    let store = db.store().await;
    for n in 1..=4 {
        let request: vxds_envoy::changeset::ChangesetRequest = serde_json::from_value(json!({
            "message": format!("change {n}"),
            "operations": [{"op": "put", "type": "route", "name": format!("r{n}"),
                            "variants": [{"resource": route(&format!("r{n}"), "x")}]}],
        }))
        .unwrap();
        store.apply(request, Some("bob".into())).await.unwrap();
    }
    // An index that remembers only revisions 3 and 4 (a long-running server's, after many).
    let mut batch = store.changes_since(0).await.unwrap();
    batch.revisions.retain(|r| r.revision >= 3);
    let index = vxds_store::Index::fixed(vxds_store::Snapshot::default().apply(batch));
    assert_eq!(index.snapshot().revisions_since(0).count(), 2);
    let mut metrics_registry = Registry::default();
    let metrics = Arc::new(AdminMetrics::register(&mut metrics_registry));
    let state = AdminState::new(
        store.clone(),
        index,
        Tokens::none(),
        metrics,
        Arc::new(metrics_registry),
        DEFAULT_BODY_LIMIT,
    );
    let (base, server) = serve_state(state).await;
    let mut reader = SseReader::open(&base, None, Some("0")).await;
    for n in 1..=4u64 {
        let (name, id, data) = reader.event().await;
        assert_eq!(
            (name.as_str(), id),
            ("revision", Some(n.to_string())),
            "{data}"
        );
        assert_eq!(data["message"], format!("change {n}"));
        assert_eq!(data["author"], "bob");
        assert_eq!(data["changed"][0]["name"], format!("r{n}"));
    }
    let (name, id, _) = reader.event().await;
    assert_eq!((name.as_str(), id.as_deref()), ("hello", Some("4")));
    // From revision 1: only 2 comes from the store.
    let mut reader = SseReader::open(&base, None, Some("1")).await;
    for n in 2..=4u64 {
        let (_, id, _) = reader.event().await;
        assert_eq!(id, Some(n.to_string()));
    }
    server.abort();
}

/// A reader resuming from a revision the store has but this replica's index has not reached
/// (a replica a few seconds behind) gets no `reset` and no revision twice: `hello` at its
/// revision, then what comes after it.
async fn a_resume_on_a_replica_behind_the_store_is_no_reset(db: TestDb) {
    let store = db.store().await;
    for n in 1..=5 {
        let request: vxds_envoy::changeset::ChangesetRequest = serde_json::from_value(json!({
            "message": format!("change {n}"),
            "operations": [{"op": "put", "type": "route", "name": format!("r{n}"),
                            "variants": [{"resource": route(&format!("r{n}"), "x")}]}],
        }))
        .unwrap();
        store.apply(request, Some("bob".into())).await.unwrap();
    }
    // A replica whose index is still at revision 3.
    let mut batch = store.changes_since(0).await.unwrap();
    batch.revisions.retain(|r| r.revision <= 3);
    batch.revision = 3;
    let index = vxds_store::Index::fixed(vxds_store::Snapshot::default().apply(batch));
    let mut metrics_registry = Registry::default();
    let metrics = Arc::new(AdminMetrics::register(&mut metrics_registry));
    let state = AdminState::new(
        store.clone(),
        index,
        Tokens::none(),
        metrics,
        Arc::new(metrics_registry),
        DEFAULT_BODY_LIMIT,
    );
    let (base, server) = serve_state(state).await;
    let mut reader = SseReader::open(&base, None, Some("5")).await;
    let (name, id, data) = reader.event().await;
    assert_eq!(
        (name.as_str(), id.as_deref()),
        ("hello", Some("5")),
        "{data}"
    );
    // From 4 on the lagging replica: revision 5 is not known here yet, so nothing is replayed
    // and nothing is reset.
    let mut reader = SseReader::open(&base, None, Some("4")).await;
    let (name, id, data) = reader.event().await;
    assert_eq!(
        (name.as_str(), id.as_deref()),
        ("hello", Some("4")),
        "{data}"
    );
    server.abort();
}

/// The grid of a stored resource: keys, values with other and absent, each cell's variant,
/// uncovered cells; 404 for a missing resource.
async fn coverage_grid_of_a_stored_resource(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let body = variants(
        "web",
        &[
            (r#"env = "prod" && version = "v1""#, "a"),
            (r#"env = "prod" && version != "v1""#, "b"),
            (r#"env = "test" && exists(version)"#, "c"),
        ],
    );
    let created = api
        .send_json(Method::PUT, "/v1/resources/route/web", body)
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    let grid = api.get("/v1/resources/route/web/coverage").await;
    assert_eq!(grid.status, StatusCode::OK, "{}", grid.text);
    let g = &grid.body;
    assert_eq!(g["name"], "web");
    assert_eq!(g["version"], created.body["changed"][0]["version"]);
    assert_eq!(g["variants"].as_array().unwrap().len(), 3);
    assert_eq!(g["keys"][0]["key"], "env");
    assert_eq!(
        g["keys"][0]["values"],
        json!([
            {"kind": "value", "value": "prod"},
            {"kind": "value", "value": "test"},
            {"kind": "other"},
            {"kind": "absent"}
        ])
    );
    let cells = g["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 12);
    assert_eq!(cells[0]["classes"], json!([0, 0]));
    assert_eq!(cells[0]["example"], json!({"env": "prod", "version": "v1"}));
    assert_eq!(cells[0]["variant"], 0);
    assert_eq!(cells[5]["variant"], Value::Null); // test, absent
    assert_eq!(g["uncovered"], 7);
    // Each cell's example resolves to the cell's variant.
    for cell in cells {
        let answer = api
            .send_json(
                Method::POST,
                "/v1/resolve",
                json!({"type": "route", "name": "web", "params": cell["example"]}),
            )
            .await;
        let id = &answer.body["variant"]["id"];
        let expected = cell["variant"]
            .as_u64()
            .map(|i| g["variants"][i as usize]["id"].clone())
            .unwrap_or(Value::Null);
        assert_eq!(id, &expected, "{cell}");
    }
    let missing = api.get("/v1/resources/route/nothing/coverage").await;
    assert_problem(&missing, 404);
}

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

async fn serve_state(state: AdminState) -> (String, tokio::task::JoinHandle<()>) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = vxds_admin::router(state);
    let server = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (base, server)
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

/// The console's page, script and style are served without a token, with a CSP that allows
/// only them and forbids framing; `/ui` redirects to `/ui/`; the API behind it still needs one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_its_headers() {
    with_db(Db::Sqlite, |db| async move {
        let tokens = Tokens::parse(&format!("read {READ_TOKEN}\n")).unwrap();
        let api = serve(&db, tokens, DEFAULT_BODY_LIMIT).await;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let redirect = http.get(format!("{}/ui", api.base)).send().await.unwrap();
        assert_eq!(redirect.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(redirect.headers()["location"], "/ui/");
        for (path, content_type, marker) in [
            ("/ui/", "text/html; charset=utf-8", "console.js"),
            (
                "/ui/console.js",
                "text/javascript; charset=utf-8",
                "/v1/events",
            ),
            (
                "/ui/console.css",
                "text/css; charset=utf-8",
                "td.cell.uncovered",
            ),
        ] {
            let reply = api.get(path).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}");
            assert_eq!(reply.headers["content-type"], content_type, "{path}");
            let csp = reply.headers["content-security-policy"].to_str().unwrap();
            assert!(
                csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
                "{csp}"
            );
            assert_eq!(reply.headers["x-frame-options"], "DENY");
            assert!(reply.text.contains(marker), "{path}");
        }
        assert_problem(&api.get("/v1/resources").await, 401);
        assert_problem(&api.get("/ui/nothing-here").await, 404);
        // A misdirected Host is still refused for the API.
        let misdirected = api
            .call(
                Method::GET,
                "/v1/resources",
                None,
                &[
                    ("host", "evil.example"),
                    ("authorization", &format!("Bearer {READ_TOKEN}")),
                ],
            )
            .await;
        assert_problem(&misdirected, 421);
        let rebound = api
            .call(Method::GET, "/ui/", None, &[("host", "evil.example")])
            .await;
        assert_problem(&rebound, 421);
    })
    .await;
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

/// Issue 21: a reader resuming from before the oldest revision the history retention kept
/// gets `reset` at the head (it cannot be told what it missed); one resuming from just before
/// the oldest kept revision is replayed as before.
async fn a_resume_before_the_kept_history_is_reset(db: TestDb) {
    let store = db.store().await;
    for n in 1..=4 {
        let request: vxds_envoy::changeset::ChangesetRequest = serde_json::from_value(json!({
            "operations": [{"op": "put", "type": "route", "name": format!("r{n}"),
                            "variants": [{"resource": route(&format!("r{n}"), "x")}]}],
        }))
        .unwrap();
        store.apply(request, None).await.unwrap();
    }
    let retention = vxds_store::Retention {
        revisions: Some(2),
        age: None,
    };
    assert_eq!(store.prune_all_at(&retention, 0).await.unwrap(), 3);
    // A server started now: its index remembers the head revision only.
    let api = serve_store(
        store,
        Tokens::none(),
        DEFAULT_BODY_LIMIT,
        vxds_admin::OriginPolicy::default(),
    )
    .await;
    let mut reader = SseReader::open(&api.base, None, Some("1")).await;
    let (name, id, data) = reader.event().await;
    assert_eq!(
        (name.as_str(), id.as_deref()),
        ("reset", Some("4")),
        "{data}"
    );
    assert_eq!(data["revision"], 4);
    let (name, id, _) = reader.event().await;
    assert_eq!((name.as_str(), id.as_deref()), ("hello", Some("4")));
    let mut reader = SseReader::open(&api.base, None, Some("2")).await;
    for expected in ["3", "4"] {
        let (name, id, _) = reader.event().await;
        assert_eq!((name.as_str(), id.as_deref()), ("revision", Some(expected)));
    }
    let (name, _, _) = reader.event().await;
    assert_eq!(name, "hello");
}

/// Issue 25: a reader that was told of revisions 2 and 3, then away while the database failed
/// over to a standby that lost them and took other revisions 2 and 3, resumes with its last
/// event's id: it is told to reset (what it was told no longer holds), though revision 3
/// exists and it never saw the index reload. Event ids name the commit; a bare number is not
/// checked.
async fn a_resume_after_a_failover_that_reused_the_revision_is_reset(db: TestDb) {
    let store = vxds_store::Store::connect(
        &db.url,
        vxds_store::StoreOptions {
            head_poll: Some(Duration::from_millis(100)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let put = |name: &str| -> vxds_envoy::changeset::ChangesetRequest {
        serde_json::from_value(json!({
            "operations": [{"op": "put", "type": "route", "name": name,
                            "variants": [{"resource": route(name, "x")}]}],
        }))
        .unwrap()
    };
    store.apply(put("a"), None).await.unwrap();
    let api = serve_store(
        store.clone(),
        Tokens::none(),
        DEFAULT_BODY_LIMIT,
        vxds_admin::OriginPolicy::default(),
    )
    .await;
    let mut reader = SseReader::open(&api.base, None, None).await;
    let (name, _, _) = reader.event().await;
    assert_eq!(name, "hello");
    store.apply(put("b"), None).await.unwrap();
    store.apply(put("c"), None).await.unwrap();
    let mut told = None;
    for n in 2..=3 {
        let (name, id, data) = reader.event_with_id().await;
        assert_eq!((name.as_str(), &data["revision"]), ("revision", &json!(n)));
        told = id;
    }
    let told = told.unwrap();
    assert!(told.starts_with("3-"), "an id naming the commit: {told}");
    drop(reader);

    // The failover: revisions 2 and 3 lost (one transaction), then other revisions 2 and 3.
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for sql in [
        "DELETE FROM vxds_revision_changes WHERE revision > 1",
        "DELETE FROM vxds_revisions WHERE revision > 1",
        "DELETE FROM vxds_variant_history WHERE revision > 1",
        "DELETE FROM vxds_variants WHERE name IN ('b', 'c')",
        "DELETE FROM vxds_resources WHERE name IN ('b', 'c')",
        "UPDATE vxds_head SET revision = 1 WHERE id = 1",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    pool.close().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while store.metrics().head_resets.get() == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never reloaded");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.apply(put("d"), None).await.unwrap();
    store.apply(put("e"), None).await.unwrap();
    // Wait for the index to take them: a new reader's hello is at 3 (the new commit).
    loop {
        let mut fresh = SseReader::open(&api.base, None, None).await;
        let (_, id, _) = fresh.event_with_id().await;
        let id = id.unwrap();
        if id.starts_with("3-") {
            assert_ne!(id, told, "revision 3 is another commit now");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the index never reached 3"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut resumed = SseReader::open(&api.base, None, Some(&told)).await;
    let (name, id, data) = resumed.event_with_id().await;
    assert_eq!(
        (name.as_str(), &data),
        ("reset", &json!({"revision": 3, "reason": "head_went_back"})),
        "a reader resuming from a lost commit is told to reset"
    );
    let now = id.unwrap();
    assert!(now.starts_with("3-") && now != told, "{now}");
    let (name, id, _) = resumed.event_with_id().await;
    assert_eq!(
        (name.as_str(), id.as_deref()),
        ("hello", Some(now.as_str()))
    );

    // The new revision 3's own id resumes without a reset; a bare number is not checked.
    for resume in [now.as_str(), "3"] {
        let mut again = SseReader::open(&api.base, None, Some(resume)).await;
        let (name, id, _) = again.event().await;
        assert_eq!(
            (name.as_str(), id.as_deref()),
            ("hello", Some("3")),
            "{resume}"
        );
    }
}
