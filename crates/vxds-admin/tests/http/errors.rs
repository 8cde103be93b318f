//! Errors over HTTP: every status the API answers with carries an RFC 9457 problem document,
//! and a database failure is a 503 that tells nothing of the database.

use super::*;

on_both_backends!(
    every_error_status_has_a_problem_document,
    database_errors_stay_inside,
);

async fn every_error_status_has_a_problem_document(db: TestDb) {
    let api = serve(&db, Tokens::none(), 4096).await;
    // 400: not JSON; and JSON of the wrong shape, with a pointer.
    let broken = api
        .call(
            Method::POST,
            "/v1/changesets",
            Some(("application/json", "{".into())),
            &[],
        )
        .await;
    assert_problem(&broken, 400);
    let shape = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            json!({"operations": [{"op": "rename"}]}),
        )
        .await;
    assert_problem(&shape, 400);
    assert_eq!(shape.body["errors"][0]["pointer"], "/operations/0/op");
    let unknown_field = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            json!({"operations": [], "extra": 1}),
        )
        .await;
    assert_problem(&unknown_field, 400);
    assert_problem(
        &api.call(
            Method::POST,
            "/v1/changesets",
            Some(("application/json", String::new())),
            &[],
        )
        .await,
        400,
    );
    // 404 and 405.
    assert_problem(&api.get("/v1/nothing-here").await, 404);
    let patch = api
        .call(Method::PATCH, "/v1/resources/route/x", None, &[])
        .await;
    assert_problem(&patch, 405);
    assert_eq!(patch.headers["allow"], "DELETE, GET, HEAD, PUT");
    let put_list = api.call(Method::PUT, "/v1/resources", None, &[]).await;
    assert_problem(&put_list, 405);
    assert_eq!(put_list.headers["allow"], "GET, HEAD");
    // 409: a stale expected revision.
    let stale = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            json!({"expected_revision": 7, "operations": []}),
        )
        .await;
    assert_problem(&stale, 409);
    assert_eq!(stale.body["errors"][0]["pointer"], "/expected_revision");
    // 413 and 415.
    let big = format!(
        "{{\"operations\": [], \"message\": \"{}\"}}",
        "x".repeat(8192)
    );
    let too_large = api
        .call(
            Method::POST,
            "/v1/changesets",
            Some(("application/json", big)),
            &[],
        )
        .await;
    assert_problem(&too_large, 413);
    let form = api
        .call(
            Method::POST,
            "/v1/changesets",
            Some(("application/x-www-form-urlencoded", "a=b".into())),
            &[],
        )
        .await;
    assert_problem(&form, 415);
    // 422 on a PUT points into the PUT body; path problems name the parameter.
    let put = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/r",
            variants("r", &[("a = 1", "x"), ("a = 1", "y")]),
        )
        .await;
    assert_problem(&put, 422);
    assert_eq!(
        problem_codes(&put),
        vec![(
            "/variants/1/constraints".to_owned(),
            "duplicate_variant".to_owned()
        )]
    );
    // Like every overlap, a duplicate shows a parameter set both match.
    assert_eq!(
        put.body["errors"][0]["witness"],
        json!({"a": "1"}),
        "{}",
        put.text
    );
    let mismatch = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/r",
            variants("other", &[("*", "x")]),
        )
        .await;
    assert_eq!(
        problem_codes(&mismatch),
        vec![(
            "/variants/0/resource/name".to_owned(),
            "name_mismatch".to_owned()
        )]
    );
    let xdstp = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/xdstp%3A%2F%2Fa%2Fenvoy.config.cluster.v3.Cluster%2Fr",
            variants("xdstp://a/envoy.config.cluster.v3.Cluster/r", &[("*", "x")]),
        )
        .await;
    assert_problem(&xdstp, 400);
    assert_eq!(xdstp.body["errors"][0]["parameter"], "name");
}

async fn database_errors_stay_inside(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    api.store.close().await;
    let reply = api.get("/v1/resources/route/web").await;
    assert_problem(&reply, 503);
    assert_eq!(reply.body["detail"], "the store is unavailable; try again");
    for leak in ["pool", "sqlx", "closed", "database", "postgres", "sqlite"] {
        assert!(
            !reply.text.to_lowercase().contains(leak),
            "{leak} leaked: {}",
            reply.text
        );
    }
    assert_eq!(reply.headers["retry-after"], "1");
    // Still ready: the index serves xDS; the store's state is shown, and probed apart.
    let ready = api.get("/readyz").await;
    assert_eq!(ready.status, StatusCode::OK);
    assert_eq!(ready.body["store"]["status"], "down");
    assert_eq!(ready.body["store"]["reason"], "the store was closed");
    let store = api.get("/healthz/store").await;
    assert_problem(&store, 503);
    assert_eq!(store.headers["retry-after"], "1");
    assert!(api.get("/metrics").await.text.contains("vxds_store_up 0"));
}
