//! Issue 12 over real HTTP, the event stream: `GET /v1/events` (revisions with author, message
//! and changed names; resuming with `Last-Event-ID`, from the index, the store's history or a
//! `reset`; read scope), and the SSE reader the event tests share. Client events and how
//! readers are held are in `events/readers.rs`.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use vxds_admin::{AdminMetrics, AdminState};
use vxds_store::index;

use super::*;

// Loaded by `#[path]`, this file resolves its modules beside it, not in `events/`.
#[path = "events/readers.rs"]
mod readers;

on_both_backends!(
    revisions_stream_live_and_resume_after_last_event_id,
    a_resume_beyond_the_index_memory_reads_the_store,
    a_resume_on_a_replica_behind_the_store_is_no_reset,
    a_resume_before_the_kept_history_is_reset,
    a_resume_after_a_failover_that_reused_the_revision_is_reset,
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
