//! Issue 21, item 7: answers that grow with the store or the fleet come a page at a time —
//! revision lists summarise their changes (`change_count` and the first 10; every change from
//! `GET /v1/revisions/{n}/changes`, paginated), and `GET /v1/clients` takes `limit` and
//! `after`.

use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use vxds_admin::{AdminMetrics, AdminState};
use vxds_store::index;
use vxds_testkit::{Db, with_db};
use vxds_xds::ClientStatus;

use super::*;

on_both_backends!(revision_lists_summarise_and_changes_page,);

/// A revision of 25 resources is listed with `change_count` 25 and its first 10 changes; its
/// changes page by `limit` and `after` in the revision's order, 404 for a revision that does
/// not exist, 400 for a bad limit.
async fn revision_lists_summarise_and_changes_page(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let operations: Vec<Value> = (0..25)
        .map(|i| {
            let name = format!("r{i:02}");
            json!({"op": "put", "type": "route", "name": name,
                   "variants": [{"resource": route(&name, "x")}]})
        })
        .collect();
    let written = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            json!({"message": "many", "operations": operations}),
        )
        .await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text);
    let list = api.get("/v1/revisions").await;
    let revision = &list.body["revisions"][0];
    assert_eq!(revision["change_count"], 25);
    assert_eq!(revision["changes"].as_array().unwrap().len(), 10);
    assert_eq!(revision["changes"][0]["name"], "r00");

    let mut names = Vec::new();
    let mut after = 0;
    loop {
        let page = api
            .get(&format!("/v1/revisions/1/changes?limit=10&after={after}"))
            .await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
        assert_eq!(page.body["change_count"], 25);
        let changes = page.body["changes"].as_array().unwrap();
        assert!(changes.len() <= 10);
        names.extend(
            changes
                .iter()
                .map(|c| c["name"].as_str().unwrap().to_owned()),
        );
        match page.body["next_after"].as_u64() {
            Some(next) => after = next,
            None => break,
        }
    }
    let expected: Vec<String> = (0..25).map(|i| format!("r{i:02}")).collect();
    assert_eq!(names, expected);
    let all = api.get("/v1/revisions/1/changes").await;
    assert_eq!(all.body["changes"].as_array().unwrap().len(), 25);
    assert_eq!(all.body["next_after"], Value::Null);
    assert_problem(&api.get("/v1/revisions/2/changes").await, 404);
    assert_problem(&api.get("/v1/revisions/1/changes?limit=0").await, 400);
}

/// `GET /v1/clients` pages by stream id: `limit` at a time, `next_after` to go on, null on
/// the last page; every stream once; 400 for a limit out of range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_are_listed_a_page_at_a_time() {
    with_db(Db::Sqlite, |db| async move {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = db.store().await;
        let (index, follower) = index::start(store.clone()).await.unwrap();
        let registry = Arc::new(vxds_xds::Registry::new(index.snapshot()));
        let mut registrations = Vec::new();
        for id in 1..=25u64 {
            let status = ClientStatus {
                stream_id: id,
                node_id: format!("envoy-{id}"),
                ..ClientStatus::default()
            };
            registrations.push(registry.register(id, Arc::new(Mutex::new(status))));
        }
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
        .with_clients(registry.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, vxds_admin::router(state))
                .await
                .unwrap();
        });
        let http = reqwest::Client::new();
        let get = |path: String| {
            let http = http.clone();
            let base = base.clone();
            async move {
                let reply = http.get(format!("{base}{path}")).send().await.unwrap();
                (reply.status(), reply.json::<Value>().await.unwrap())
            }
        };
        let mut ids = Vec::new();
        let mut after = 0;
        let mut pages = 0;
        loop {
            let (status, body) = get(format!("/v1/clients?limit=10&after={after}")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            pages += 1;
            ids.extend(
                body["clients"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c["stream_id"].as_u64().unwrap()),
            );
            match body["next_after"].as_u64() {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(ids, (1..=25).collect::<Vec<u64>>());
        let (_, first) = get("/v1/clients".into()).await;
        assert_eq!(first["clients"].as_array().unwrap().len(), 25);
        assert_eq!(first["next_after"], Value::Null);
        let (status, body) = get("/v1/clients?limit=1001".into()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        drop(registrations);
        server.abort();
        follower.abort();
    })
    .await;
}
