//! Issue 12, item 3: `GET /v1/revisions/{n}` shows the diff a revision made;
//! `POST /v1/revisions/{n}/restore` brings a past state back as a new revision.

use vxds_store::{Store, StoreOptions};

use super::*;

on_both_backends!(
    a_revision_shows_its_diff,
    a_restore_is_a_new_revision_by_the_caller,
    a_restore_todays_rules_reject_is_a_problem_document,
    a_pruned_revision_is_gone,
);

/// Issue 21: a diff or restore of a revision the history retention pruned answers 410
/// `history_pruned`, naming the oldest kept revision; kept ones answer as before.
async fn a_pruned_revision_is_gone(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    for n in 1..=4 {
        let body = variants("web", &[("*", &format!("body {n}"))]);
        let put = api
            .send_json(Method::PUT, "/v1/resources/route/web", body)
            .await;
        assert!(put.status.is_success(), "{}", put.text);
    }
    let retention = vxds_store::Retention {
        revisions: Some(2),
        age: None,
    };
    let oldest = api.store.prune_all_at(&retention, i64::MAX).await.unwrap();
    assert_eq!(oldest, 3);
    let gone = api.get("/v1/revisions/2").await;
    assert_problem(&gone, 410);
    assert_eq!(gone.body["errors"][0]["code"], "history_pruned");
    assert!(
        gone.body["detail"]
            .as_str()
            .unwrap()
            .contains("the oldest kept revision is 3"),
        "{}",
        gone.text
    );
    let restore = api
        .send_json(Method::POST, "/v1/revisions/1/restore", json!({}))
        .await;
    assert_problem(&restore, 410);
    assert_eq!(restore.body["errors"][0]["code"], "history_pruned");
    assert_eq!(api.get("/v1/revisions/3").await.status, StatusCode::OK);
    let listed = api.get("/v1/revisions").await;
    let numbers: Vec<u64> = listed.body["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, [3, 4]);
    // Restoring the state the oldest kept revision starts from still works.
    let restore = api
        .send_json(
            Method::POST,
            "/v1/revisions/2/restore",
            json!({"dry_run": true}),
        )
        .await;
    assert_eq!(restore.status, StatusCode::OK, "{}", restore.text);
}

async fn a_revision_shows_its_diff(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let put = |body: Value| api.send_json(Method::PUT, "/v1/resources/route/web", body);
    put(variants(
        "web",
        &[(r#"env = "prod""#, "prod"), ("env != \"prod\"", "x")],
    ))
    .await;
    put(variants(
        "web",
        &[
            (r#"env = "prod""#, "prod 2"),
            (r#"env = "dev""#, "dev"),
            ("env != \"prod\" && env != \"dev\"", "x"),
        ],
    ))
    .await;

    let got = api.get("/v1/revisions/2").await;
    assert_eq!(got.status, StatusCode::OK, "{}", got.text);
    let web = &got.body["resources"][0];
    assert_eq!(web["name"], "web");
    assert_eq!(web["change"], "updated");
    assert_eq!(web["history_kept"], true);
    let changes: Vec<(&str, &str)> = web["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["constraints_text"].as_str().unwrap(),
                v["change"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [
            (r#"env = "prod""#, "updated"),
            (r#"env = "dev""#, "created"),
            (r#"env != "dev" && env != "prod""#, "created"),
            (r#"env != "prod""#, "deleted"),
        ]
    );
    let prod = &web["variants"][0];
    assert_ne!(prod["before"]["version"], prod["after"]["version"]);
    assert!(prod["after"].get("resource").is_none());
    assert_eq!(web["variants"][3]["after"], Value::Null);

    let with_bodies = api.get("/v1/revisions/2?bodies=true").await;
    let prod = &with_bodies.body["resources"][0]["variants"][0];
    assert_eq!(prod["before"]["resource"], route("web", "prod"));
    assert_eq!(prod["after"]["resource"], route("web", "prod 2"));
    assert_problem(&api.get("/v1/revisions/2?bodies=maybe").await, 400);
}

async fn a_restore_is_a_new_revision_by_the_caller(db: TestDb) {
    let tokens = Tokens::parse(&format!("write {WRITE_TOKEN} alice\n")).unwrap();
    let api = serve(&db, tokens, DEFAULT_BODY_LIMIT).await;
    let auth = format!("Bearer {WRITE_TOKEN}");
    let send = |method: Method, path: &str, body: Value| {
        let (api, auth, path) = (&api, auth.clone(), path.to_owned());
        async move {
            api.call(
                method,
                &path,
                Some(("application/json", body.to_string())),
                &[("authorization", &auth)],
            )
            .await
        }
    };
    send(
        Method::PUT,
        "/v1/resources/route/web",
        variants("web", &[("*", "one")]),
    )
    .await;
    send(
        Method::PUT,
        "/v1/resources/route/web",
        variants("web", &[("*", "two")]),
    )
    .await;
    send(
        Method::PUT,
        "/v1/resources/route/new",
        variants("new", &[("*", "new")]),
    )
    .await;

    let stale = send(
        Method::POST,
        "/v1/revisions/1/restore",
        json!({"expected_revision": 2}),
    )
    .await;
    assert_problem(&stale, 409);
    assert_eq!(
        problem_codes(&stale),
        [("/expected_revision".to_owned(), "conflict".to_owned())]
    );

    let dry = send(
        Method::POST,
        "/v1/revisions/1/restore",
        json!({"dry_run": true}),
    )
    .await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.text);
    assert_eq!(dry.body["revision"], 4);
    assert_eq!(
        dry.body["summary"],
        "restoring revision 1 would make revision 4"
    );

    let done = send(
        Method::POST,
        "/v1/revisions/1/restore",
        json!({"expected_revision": 3, "message": "bad deploy"}),
    )
    .await;
    assert_eq!(done.status, StatusCode::OK, "{}", done.text);
    assert_eq!(done.body["restored_to"], 1);
    assert_eq!(done.body["revision"], 4);
    assert_eq!(done.body["summary"], "restored revision 1 as revision 4");
    let changed: Vec<(&str, &str)> = done.body["changed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), c["change"].as_str().unwrap()))
        .collect();
    assert_eq!(changed, [("new", "deleted"), ("web", "updated")]);
    let history = api
        .call(
            Method::GET,
            "/v1/revisions/4",
            None,
            &[("authorization", &auth)],
        )
        .await;
    assert_eq!(history.body["author"], "alice");
    assert_eq!(history.body["message"], "restore to revision 1: bad deploy");
    let web = api
        .call(
            Method::GET,
            "/v1/resources/route/web",
            None,
            &[("authorization", &auth)],
        )
        .await;
    assert_eq!(web.body["variants"][0]["resource"], route("web", "one"));

    // The head's own state: said, and no revision.
    let noop = send(Method::POST, "/v1/revisions/4/restore", json!({})).await;
    assert_eq!(noop.status, StatusCode::OK, "{}", noop.text);
    assert_eq!(noop.body["changed"], json!([]));
    assert_eq!(noop.body["revision"], 4);
    assert_eq!(
        noop.body["summary"],
        "the store already is in revision 4's state; no revision was made"
    );
    assert_problem(
        &send(Method::POST, "/v1/revisions/9/restore", json!({})).await,
        404,
    );
    assert_problem(
        &send(Method::POST, "/v1/revisions/x/restore", json!({})).await,
        400,
    );
    assert_problem(
        &send(
            Method::POST,
            "/v1/revisions/1/restore",
            json!({"expected": 1}),
        )
        .await,
        400,
    );
    // Writing needs a token.
    let anonymous = api
        .send_json(Method::POST, "/v1/revisions/1/restore", json!({}))
        .await;
    assert_problem(&anonymous, 401);
}

/// A server restarted with a lower variant limit refuses to bring back a resource with more.
async fn a_restore_todays_rules_reject_is_a_problem_document(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let three = [
        (r#"env = "a""#, "a"),
        (r#"env = "b""#, "b"),
        (r#"env = "c""#, "c"),
    ];
    api.send_json(
        Method::PUT,
        "/v1/resources/route/web",
        variants("web", &three),
    )
    .await;
    api.send_json(
        Method::PUT,
        "/v1/resources/route/web",
        variants("web", &[("*", "one")]),
    )
    .await;
    drop(api);
    let mut options = StoreOptions::default();
    options.validation.variant_limits.max_variants = 2;
    let strict = Store::connect(&db.url, options).await.unwrap();
    let api = serve_store(
        strict,
        Tokens::none(),
        DEFAULT_BODY_LIMIT,
        Default::default(),
    )
    .await;
    let refused = api
        .send_json(Method::POST, "/v1/revisions/1/restore", json!({}))
        .await;
    assert_problem(&refused, 422);
    let error = &refused.body["errors"][0];
    assert!(
        error["message"].as_str().unwrap().starts_with("`web`: "),
        "{}",
        refused.text
    );
    assert_eq!(
        api.get("/v1/revisions/3").await.status,
        StatusCode::NOT_FOUND
    );
}
