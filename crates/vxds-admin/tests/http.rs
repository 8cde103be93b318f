//! The admin API over real HTTP: a server on 127.0.0.1 (ephemeral port) on each store backend.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

#[path = "http/bulk.rs"]
mod bulk;
#[path = "http/console.rs"]
mod console;
#[path = "http/errors.rs"]
mod errors;
#[path = "http/events.rs"]
mod events;
#[path = "http/hardening.rs"]
mod hardening;
#[path = "http/impact.rs"]
mod impact;
#[path = "http/outage.rs"]
mod outage;
#[path = "http/pages.rs"]
mod pages;
#[path = "http/restore.rs"]
mod restore;
#[path = "http/rollout.rs"]
mod rollout;
#[path = "http/shared.rs"]
mod shared;
#[path = "http/support.rs"]
mod support;
#[path = "http/tokens.rs"]
mod tokens;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::*;
use vxds_admin::{DEFAULT_BODY_LIMIT, Tokens};
use vxds_testkit::{TestDb, on_both_backends};

on_both_backends!(
    a_put_reads_back_whole,
    yaml_bodies_are_accepted,
    listing_paginates,
    deletes_and_unknown_resources,
    changesets_report_every_error_with_its_pointer,
    if_match_guards_writes,
    names_with_reserved_characters_fit_one_segment,
    resolve_says_which_variant_and_why,
    history_is_listed,
    operations_endpoints,
);

async fn a_put_reads_back_whole(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let body = variants(
        "web",
        &[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")],
    );
    let created = api
        .send_json(Method::PUT, "/v1/resources/route/web", body.clone())
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    assert_eq!(created.body["revision"], 1);
    assert_eq!(created.body["changed"][0]["change"], "created");
    let etag = created.headers["etag"].to_str().unwrap().to_owned();

    let got = api.get("/v1/resources/route/web").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.headers["etag"].to_str().unwrap(), etag);
    let r = &got.body;
    assert_eq!(r["type_url"], ROUTE);
    assert_eq!(r["type"], "route");
    assert_eq!(r["name"], "web");
    assert_eq!(r["revision"], 1);
    assert_eq!(format!("\"{}\"", r["version"].as_str().unwrap()), etag);
    assert_eq!(
        r["variants"][0]["constraints"],
        json!({"constraint": {"key": "env", "value": "prod"}})
    );
    assert_eq!(r["variants"][0]["constraints_text"], r#"env = "prod""#);
    assert_eq!(
        r["variants"][1]["constraints"],
        json!({"not_constraints": {"constraint": {"key": "env", "value": "prod"}}})
    );
    assert_eq!(r["variants"][0]["resource"], route("web", "prod"));
    assert_eq!(r["variants"][0]["id"].as_str().unwrap().len(), 16);
    assert!(r["created_at"].as_str().unwrap().ends_with('Z'));

    // The same PUT again changes nothing.
    let again = api
        .send_json(Method::PUT, "/v1/resources/route/web", body)
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(again.body["changed"], json!([]));
    assert_eq!(again.body["revision"], 1);
    // Conditional GET.
    let unchanged = api
        .call(
            Method::GET,
            "/v1/resources/route/web",
            None,
            &[("if-none-match", &etag)],
        )
        .await;
    assert_eq!(unchanged.status, StatusCode::NOT_MODIFIED);
    // Full message names work as well as aliases; JSON constraints too.
    let by_name = api
        .send_json(
            Method::PUT,
            "/v1/resources/envoy.config.route.v3.RouteConfiguration/other",
            json!({"variants": [{"constraints": {"constraint": {"key": "env", "exists": {}}}, "resource": route("other", "x")}]}),
        )
        .await;
    assert_eq!(by_name.status, StatusCode::CREATED, "{}", by_name.text);
    assert_eq!(
        by_name.body["resource"]["variants"][0]["constraints_text"],
        "exists(env)"
    );
    // Dry runs report and write nothing.
    let dry = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/dry?dry_run=true",
            variants("dry", &[("*", "x")]),
        )
        .await;
    assert_eq!(
        (dry.status, dry.body["dry_run"].clone()),
        (StatusCode::OK, json!(true))
    );
    assert_eq!(
        api.get("/v1/resources/route/dry").await.status,
        StatusCode::NOT_FOUND
    );
}

async fn yaml_bodies_are_accepted(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let yaml = format!(
        "variants:\n  - constraints: env = \"prod\"\n    resource:\n      '@type': {ROUTE}\n      name: web\n  - constraints: '!(env = \"prod\")'\n    resource:\n      '@type': {ROUTE}\n      name: web\n"
    );
    let put = api
        .call(
            Method::PUT,
            "/v1/resources/route/web",
            Some(("application/yaml", yaml)),
            &[],
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);
    let changeset = format!(
        "message: from yaml\noperations:\n  - op: put\n    type: cluster\n    name: c1\n    variants:\n      - resource:\n          '@type': {CLUSTER}\n          name: c1\n          type: EDS\n          eds_cluster_config: {{eds_config: {{ads: {{}}}}}}\n"
    );
    let applied = api
        .call(
            Method::POST,
            "/v1/changesets",
            Some(("application/yaml", changeset)),
            &[],
        )
        .await;
    assert_eq!(applied.status, StatusCode::OK, "{}", applied.text);
    assert_eq!(applied.body["changed"][0]["name"], "c1");
    let bad = api
        .call(
            Method::POST,
            "/v1/changesets",
            Some(("application/yaml", "operations: [".into())),
            &[],
        )
        .await;
    assert_problem(&bad, 400);
}

async fn listing_paginates(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let ops: Vec<Value> = (0..5)
        .map(|i| {
            let name = format!("r{i}");
            json!({"op": "put", "type": "route", "name": name, "variants": [{"resource": route(&name, "x")}]})
        })
        .collect();
    assert_eq!(
        api.send_json(Method::POST, "/v1/changesets", json!({"operations": ops}))
            .await
            .status,
        StatusCode::OK
    );
    let mut names = Vec::new();
    let mut path = "/v1/resources?type=route&limit=2".to_owned();
    loop {
        let page = api.get(&path).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
        for r in page.body["resources"].as_array().unwrap() {
            names.push(r["name"].as_str().unwrap().to_owned());
            assert_eq!(r["variant_count"], 1);
        }
        match page.body["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/resources?type=route&limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(names, ["r0", "r1", "r2", "r3", "r4"]);
    let prefixed = api.get("/v1/resources?prefix=r3").await;
    assert_eq!(prefixed.body["resources"].as_array().unwrap().len(), 1);
    assert_problem(&api.get("/v1/resources?limit=0").await, 400);
    assert_problem(&api.get("/v1/resources?limit=abc").await, 400);
    assert_problem(&api.get("/v1/resources?cursor=not-ours").await, 400);
    let unknown = api.get("/v1/resources?type=nonsense").await;
    assert_problem(&unknown, 400);
    assert_eq!(unknown.body["errors"][0]["parameter"], "type");
}

async fn deletes_and_unknown_resources(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    api.send_json(
        Method::PUT,
        "/v1/resources/route/web",
        variants("web", &[("*", "x")]),
    )
    .await;
    let deleted = api
        .call(
            Method::DELETE,
            "/v1/resources/route/web?message=gone",
            None,
            &[],
        )
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.text);
    assert_eq!(deleted.body["changed"][0]["change"], "deleted");
    assert_problem(
        &api.call(Method::DELETE, "/v1/resources/route/web", None, &[])
            .await,
        404,
    );
    assert_problem(&api.get("/v1/resources/route/web").await, 404);
    assert_problem(&api.get("/v1/resources/nonsense/web").await, 400);
    let revision = api.get("/v1/revisions/2").await;
    assert_eq!(revision.body["message"], "gone");
}

async fn changesets_report_every_error_with_its_pointer(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let request = json!({"operations": [
        {"op": "put", "type": "route", "name": "ok", "variants": [{"resource": route("ok", "x")}]},
        {"op": "put", "type": "route", "name": "bad-constraints", "variants": [{"constraints": "env = ", "resource": route("bad-constraints", "x")}]},
        {"op": "put", "type": "route", "name": "overlap", "variants": [
            {"constraints": r#"env = "prod" || env = "test""#, "resource": route("overlap", "a")},
            {"constraints": r#"env = "qa" || env = "test""#, "resource": route("overlap", "b")}
        ]},
        {"op": "put", "type": "cluster", "name": "dns", "variants": [{"resource": {"@type": CLUSTER, "name": "dns", "type": "LOGICAL_DNS"}}]},
    ]});
    let reply = api.send_json(Method::POST, "/v1/changesets", request).await;
    assert_problem(&reply, 422);
    assert_eq!(
        problem_codes(&reply),
        vec![
            (
                "/operations/1/variants/0/constraints".to_owned(),
                "invalid_constraints".to_owned()
            ),
            (
                "/operations/2/variants/1/constraints".to_owned(),
                "overlapping_variants".to_owned()
            ),
            (
                "/operations/3/variants/0/resource/load_assignment".to_owned(),
                "missing_field".to_owned()
            ),
        ]
    );
    let overlap = &reply.body["errors"][1];
    assert_eq!(overlap["witness"], json!({"env": "test"}));
    assert_eq!(
        (overlap["operation"].clone(), overlap["variant"].clone()),
        (json!(2), json!(1))
    );
    assert!(
        reply.body["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("line 1, column 7")
    );
    // Nothing was written, not even the good operation.
    assert_eq!(
        api.get("/v1/resources/route/ok").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(api.get("/v1/revisions").await.body["revisions"], json!([]));
}

async fn if_match_guards_writes(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let body = variants("web", &[("*", "one")]);
    let absent = api
        .call(
            Method::PUT,
            "/v1/resources/route/web",
            Some(("application/json", body.to_string())),
            &[("if-match", "*")],
        )
        .await;
    assert_problem(&absent, 412);
    let created = api
        .send_json(Method::PUT, "/v1/resources/route/web", body)
        .await;
    let etag = created.headers["etag"].to_str().unwrap().to_owned();
    let two = variants("web", &[("*", "two")]).to_string();
    let stale = api
        .call(
            Method::PUT,
            "/v1/resources/route/web",
            Some(("application/json", two.clone())),
            &[("if-match", "\"0000000000000000\"")],
        )
        .await;
    assert_problem(&stale, 412);
    let ok = api
        .call(
            Method::PUT,
            "/v1/resources/route/web",
            Some(("application/json", two)),
            &[("if-match", &etag)],
        )
        .await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    assert_problem(
        &api.call(
            Method::DELETE,
            "/v1/resources/route/web",
            None,
            &[("if-match", &etag)],
        )
        .await,
        412,
    );
    let new_etag = ok.headers["etag"].to_str().unwrap().to_owned();
    // Reads too (RFC 9110 §13.1.1): a GET whose If-Match fails is 412, not the resource.
    let read = |tag: String| {
        let api = &api;
        async move {
            api.call(
                Method::GET,
                "/v1/resources/route/web",
                None,
                &[("if-match", &tag)],
            )
            .await
        }
    };
    let stale_read = read(etag.clone()).await;
    assert_problem(&stale_read, 412);
    assert_eq!(stale_read.body["errors"][0]["code"], "precondition_failed");
    assert!(stale_read.text.contains("If-Match"), "{}", stale_read.text);
    assert_eq!(read(new_etag.clone()).await.status, StatusCode::OK);
    assert_eq!(read("*".into()).await.status, StatusCode::OK);
    assert_problem(&read(format!("W/{new_etag}")).await, 412);
    assert_problem(
        &api.call(
            Method::GET,
            "/v1/resources/route/nothing",
            None,
            &[("if-match", "*")],
        )
        .await,
        412,
    );
    assert_eq!(
        api.call(
            Method::DELETE,
            "/v1/resources/route/web",
            None,
            &[("if-match", &new_etag)]
        )
        .await
        .status,
        StatusCode::OK
    );
}

async fn names_with_reserved_characters_fit_one_segment(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    for (name, encoded) in [
        ("a/b?c#d", "a%2Fb%3Fc%23d"),
        ("with space", "with%20space"),
        (
            "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r/1?env=b",
            "xdstp%3A%2F%2Fauth%2Fenvoy.config.route.v3.RouteConfiguration%2Fr%2F1%3Fenv%3Db",
        ),
    ] {
        let put = api
            .send_json(
                Method::PUT,
                &format!("/v1/resources/route/{encoded}"),
                variants(name, &[("*", "x")]),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{name}: {}", put.text);
        let got = api.get(&format!("/v1/resources/route/{encoded}")).await;
        assert_eq!(got.body["name"], name);
    }
    // xdstp names are looked up in normal form, whatever the order of context parameters.
    let spelt = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/n?z=1&a=2";
    let put = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/xdstp%3A%2F%2Fauth%2Fenvoy.config.route.v3.RouteConfiguration%2Fn%3Fz%3D1%26a%3D2",
            variants(spelt, &[("*", "x")]),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);
    let got = api.get("/v1/resources/route/xdstp%3A%2F%2Fauth%2Fenvoy.config.route.v3.RouteConfiguration%2Fn%3Fa%3D2%26z%3D1").await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(
        got.body["name"],
        "xdstp://auth/envoy.config.route.v3.RouteConfiguration/n?a=2&z=1"
    );
}

async fn resolve_says_which_variant_and_why(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let table = variants(
        "web",
        &[
            (r#"env != "prod" && version != "v1""#, "neither"),
            (r#"env = "prod" && version != "v1""#, "prod"),
            (r#"env != "prod" && version = "v1""#, "v1"),
            (r#"env = "prod" && version = "v1""#, "both"),
        ],
    );
    api.send_json(Method::PUT, "/v1/resources/route/web", table)
        .await;
    let resolve = |params: Value| {
        api.send_json(
            Method::POST,
            "/v1/resolve",
            json!({"type": "route", "name": "web", "params": params}),
        )
    };
    let both = resolve(json!({"env": "prod", "version": "v1", "zone": "eu"})).await;
    assert_eq!(both.status, StatusCode::OK, "{}", both.text);
    assert_eq!(both.body["variant"]["resource"], route("web", "both"));
    assert_eq!(
        both.body["variant"]["constraints_text"],
        r#"env = "prod" && version = "v1""#
    );
    assert_eq!(
        both.body["decisive_params"],
        json!({"env": "prod", "version": "v1"})
    );
    assert_eq!(both.body["ignored_params"], json!(["zone"]));
    assert!(
        both.body["reason"]
            .as_str()
            .unwrap()
            .contains("matches env=prod, version=v1")
    );
    assert_eq!(
        both.body["variants"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["matches"] == true)
            .count(),
        1
    );
    let nothing = resolve(json!({})).await;
    assert_eq!(nothing.body["variant"]["resource"], route("web", "neither"));
    assert!(
        nothing.body["reason"]
            .as_str()
            .unwrap()
            .contains("env not sent")
    );

    api.send_json(
        Method::PUT,
        "/v1/resources/route/only",
        variants("only", &[(r#"env = "prod""#, "p")]),
    )
    .await;
    let none = api
        .send_json(
            Method::POST,
            "/v1/resolve",
            json!({"type": "route", "name": "only", "params": {"env": "qa"}}),
        )
        .await;
    assert_eq!(none.status, StatusCode::OK);
    assert_eq!(none.body["variant"], Value::Null);
    assert!(
        none.body["reason"]
            .as_str()
            .unwrap()
            .contains("sees the resource as absent")
    );
    assert_problem(
        &api.send_json(
            Method::POST,
            "/v1/resolve",
            json!({"type": "route", "name": "ghost"}),
        )
        .await,
        404,
    );
    assert_problem(
        &api.send_json(Method::POST, "/v1/resolve", json!({"type": "route"}))
            .await,
        400,
    );
}

async fn history_is_listed(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    for i in 0..3 {
        api.send_json(
            Method::PUT,
            &format!("/v1/resources/route/web?message=change%20{i}"),
            variants("web", &[("*", &i.to_string())]),
        )
        .await;
    }
    let page = api.get("/v1/revisions?after=1&limit=1").await;
    assert_eq!(page.body["revisions"][0]["revision"], 2);
    assert_eq!(page.body["revisions"][0]["message"], "change 1");
    assert_eq!(page.body["revisions"][0]["changes"][0]["change"], "updated");
    assert_eq!(page.body["next_after"], 2);
    assert_eq!(
        api.get("/v1/revisions").await.body["revisions"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        api.get("/v1/revisions/3").await.body["changes"][0]["name"],
        "web"
    );
    assert_problem(&api.get("/v1/revisions/4").await, 404);
    assert_problem(&api.get("/v1/revisions/three").await, 400);
}

async fn operations_endpoints(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    assert_eq!(api.get("/healthz").await.body, json!({"status": "ok"}));
    api.send_json(
        Method::PUT,
        "/v1/resources/route/web",
        variants("web", &[("*", "x")]),
    )
    .await;
    let ready = api.get("/readyz").await;
    assert_eq!(
        (ready.status, ready.body["revision"].clone()),
        (StatusCode::OK, json!(1))
    );
    assert_eq!(ready.body["store"], json!({"status": "up"}));
    assert_eq!(
        api.get("/healthz/store").await.body,
        json!({"status": "up", "revision": 1})
    );
    // Made-up methods from unauthenticated clients share one label value.
    for method in ["BREW", "WHEN"] {
        api.call(
            Method::from_bytes(method.as_bytes()).unwrap(),
            "/v1/resources",
            None,
            &[],
        )
        .await;
    }
    let metrics = api.get("/metrics").await;
    assert!(!metrics.text.contains("BREW"), "{}", metrics.text);
    assert!(
        metrics.text.contains(r#"method="other""#),
        "{}",
        metrics.text
    );
    assert!(
        metrics.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    assert!(metrics.text.contains(r#"vxds_http_requests_total{method="PUT",route="/v1/resources/{type}/{name}",status="201"} 1"#), "{}", metrics.text);
    assert!(
        metrics
            .text
            .contains(r#"vxds_changesets_total{outcome="committed"} 1"#)
    );
    assert!(metrics.text.contains("vxds_store_head_revision 1"));
    assert!(metrics.text.contains("vxds_store_up 1"), "{}", metrics.text);
    let served = api.get("/v1/openapi.json").await;
    assert_eq!(
        served.body,
        serde_json::to_value(vxds_admin::openapi()).unwrap()
    );
}
