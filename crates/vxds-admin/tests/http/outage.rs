//! Issue 9, item 1: the admin API while Postgres is away (a proxy between the server and the
//! shared Postgres stops and resumes). Writes and store reads get 503 with `Retry-After` in
//! well under 2 s; `/readyz` stays 200 and shows the store down; what the index answers keeps
//! working; after it comes back writes succeed without a restart and nothing acknowledged is
//! lost.

use std::time::{Duration, Instant};

use vxds_admin::OriginPolicy;
use vxds_store::{Store, StoreOptions};
use vxds_testkit::proxy::TcpProxy;
use vxds_testkit::{Db, with_db};

use super::*;

async fn wait_for_store(api: &Api, status: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while api.get("/readyz").await.body["store"]["status"] != status {
        assert!(Instant::now() < deadline, "the store never showed {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_going_away_answers_503_fast() {
    with_db(Db::Postgres, |db| async move {
        let proxy = TcpProxy::start(db.postgres_addr()).await.unwrap();
        let store = Store::connect(&proxy.url_for(&db.url), StoreOptions::default())
            .await
            .unwrap();
        let api = serve_store(
            store,
            Tokens::none(),
            DEFAULT_BODY_LIMIT,
            OriginPolicy::default(),
        )
        .await;
        let put = |name: &str, text: &str| {
            let path = format!("/v1/resources/route/{name}");
            let body = variants(name, &[("*", text)]);
            let api = &api;
            async move { api.send_json(Method::PUT, &path, body).await }
        };
        let mut acknowledged = vec![];
        assert_eq!(put("before", "x").await.status, StatusCode::CREATED);
        acknowledged.push("before");
        let resolve = || {
            api.send_json(
                Method::POST,
                "/v1/resolve",
                json!({"type": "route", "name": "before"}),
            )
        };
        // Resolving waits for the index to hold what was written.
        assert_eq!(resolve().await.status, StatusCode::OK);

        proxy.stop();
        wait_for_store(&api, "down").await;
        let mut slowest = Duration::ZERO;
        for attempt in 0..5 {
            let started = Instant::now();
            let refused = put(&format!("during-{attempt}"), "y").await;
            let took = started.elapsed();
            slowest = slowest.max(took);
            assert_problem(&refused, 503);
            assert_eq!(refused.headers["retry-after"], "1");
            assert!(took < Duration::from_secs(2), "a write took {took:?}");
            let read = api.get("/v1/resources/route/before").await;
            assert_problem(&read, 503);
            assert_eq!(read.headers["retry-after"], "1");
        }
        eprintln!("the slowest refused write took {slowest:?}");
        let ready = api.get("/readyz").await;
        assert_eq!(ready.status, StatusCode::OK);
        assert_eq!(ready.body["store"]["status"], "down", "{}", ready.text);
        assert!(ready.body["store"]["since"].is_string());
        assert_problem(&api.get("/healthz/store").await, 503);
        assert!(api.get("/metrics").await.text.contains("vxds_store_up 0"));
        // What the index answers does not need the store.
        assert_eq!(resolve().await.status, StatusCode::OK);

        proxy.resume().await.unwrap();
        wait_for_store(&api, "up").await;
        assert_eq!(api.get("/healthz/store").await.status, StatusCode::OK);
        let after = put("after", "z").await;
        assert_eq!(after.status, StatusCode::CREATED, "{}", after.text);
        acknowledged.push("after");
        assert!(api.get("/metrics").await.text.contains("vxds_store_up 1"));
        for name in acknowledged {
            let got = api.get(&format!("/v1/resources/route/{name}")).await;
            assert_eq!(got.status, StatusCode::OK, "{name} was lost");
        }
        for attempt in 0..5 {
            let path = format!("/v1/resources/route/during-{attempt}");
            assert_eq!(api.get(&path).await.status, StatusCode::NOT_FOUND);
        }
        api.store.close().await;
    })
    .await;
}
