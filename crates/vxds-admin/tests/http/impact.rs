//! Impact preview over HTTP: dry runs answer with the clients each change would move, counted
//! from every replica's published summary (here another replica's, published straight into
//! the store: this server runs no xDS server of its own).

use std::time::Duration;

use vxds_core::ParamSet;
use vxds_core::impact::{Subscription, SummaryBuilder};

use super::*;

on_both_backends!(
    dry_runs_preview_the_impact_on_every_replicas_clients,
    list_collection_options_reach_the_collections_subscribers,
);

/// A list collection's `ListCollectionOptions` (named by the collection's URN) reach the
/// clients subscribed to that collection: creating them previews those streams, not none.
async fn list_collection_options_reach_the_collections_subscribers(db: TestDb) {
    const COLLECTION: &str = "type.googleapis.com/envoy.config.listener.v3.ListenerCollection";
    let list = "xdstp://a/envoy.config.listener.v3.ListenerCollection/edge";
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let mut summary = SummaryBuilder::default();
    for node in ["e1", "e2", "e3"] {
        summary.stream();
        summary.add(
            COLLECTION,
            Subscription::Name(list.into()),
            &ParamSet::new(),
            1,
            &[node.to_owned()],
        );
    }
    api.store
        .publish_client_summary("replica-x", &summary.build(), Duration::from_secs(60))
        .await
        .unwrap();
    let options = json!({"operations": [{
        "op": "put", "type": "vxds.config.v1.ListCollectionOptions", "name": list,
        "variants": [{"resource": {
            "@type": "type.googleapis.com/vxds.config.v1.ListCollectionOptions",
            "inline_entries": true
        }}]
    }]});
    let preview = api.send_json(Method::POST, "/v1/impact", options).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
    let resource = &preview.body["impact"]["resources"][0];
    assert_eq!(resource["name"], list);
    assert_eq!(resource["change"], "created");
    assert_eq!(resource["streams"], 3, "{resource}");
    assert_eq!(resource["affected"], 3, "{resource}");
}

async fn dry_runs_preview_the_impact_on_every_replicas_clients(db: TestDb) {
    let tokens = Tokens::parse(&format!("write {WRITE_TOKEN}\nread {READ_TOKEN}\n")).unwrap();
    let api = serve(&db, tokens, DEFAULT_BODY_LIMIT).await;
    let write = format!("Bearer {WRITE_TOKEN}");
    let read = format!("Bearer {READ_TOKEN}");
    let post = |path: &'static str, body: Value, token: Option<String>| {
        let api = &api;
        async move {
            let headers: Vec<(&str, &str)> = token
                .as_deref()
                .map(|t| vec![("authorization", t)])
                .unwrap_or_default();
            api.call(
                Method::POST,
                path,
                Some(("application/json", body.to_string())),
                &headers,
            )
            .await
        }
    };
    let put_web = |rows: &[(&str, &str)], dry_run: bool| {
        let mut op = variants("web", rows);
        op["op"] = json!("put");
        op["type"] = json!("route");
        op["name"] = json!("web");
        json!({"dry_run": dry_run, "operations": [op]})
    };
    let committed = post(
        "/v1/changesets",
        put_web(
            &[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")],
            false,
        ),
        Some(write.clone()),
    )
    .await;
    assert_eq!(committed.status, StatusCode::OK, "{}", committed.text);
    assert!(committed.body.get("impact").is_none(), "{}", committed.text);

    // Another replica's clients: two prod, one dev, one with no env.
    let mut summary = SummaryBuilder::default();
    for (node, env) in [
        ("p1", Some("prod")),
        ("p2", Some("prod")),
        ("d1", Some("dev")),
        ("n1", None),
    ] {
        summary.stream();
        let params = env.map_or_else(ParamSet::new, |e| ParamSet::new().with("env", e));
        summary.add(
            ROUTE,
            Subscription::Name("web".into()),
            &params,
            1,
            &[node.to_owned()],
        );
    }
    api.store
        .publish_client_summary("replica-x", &summary.build(), Duration::from_secs(60))
        .await
        .unwrap();

    // Narrow `env != "prod"` to dev: dev switches, the client without env loses `web`.
    let change = put_web(
        &[(r#"env = "prod""#, "prod"), (r#"env = "dev""#, "dev")],
        true,
    );
    let dry = post("/v1/changesets", change.clone(), Some(write.clone())).await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.text);
    let impact = &dry.body["impact"];
    assert_eq!(impact["streams"], 4);
    assert_eq!(
        impact["replicas"],
        json!([{"replica_id": "replica-x", "streams": 4, "published_at": impact["replicas"][0]["published_at"], "local": false}])
    );
    let web = &impact["resources"][0];
    assert_eq!(
        (web["type"].as_str(), web["name"].as_str()),
        (Some("route"), Some("web"))
    );
    assert_eq!(web["change"], "updated");
    assert_eq!(
        (
            web["streams"].as_u64(),
            web["affected"].as_u64(),
            web["unchanged"].as_u64()
        ),
        (Some(4), Some(2), Some(2))
    );
    assert_eq!(
        web["moves"],
        json!([
            {"kind": "switch", "from": r#"env != "prod""#, "to": r#"env = "dev""#, "streams": 1, "sample_nodes": ["d1"]},
            {"kind": "lose", "from": r#"env != "prod""#, "to": null, "streams": 1, "sample_nodes": ["n1"]},
        ])
    );

    let web_moves = web["moves"].clone();
    // `/v1/impact` is the same preview with read scope, whatever `dry_run` says; nothing is
    // written.
    let mut not_dry = change.clone();
    not_dry["dry_run"] = json!(false);
    let preview = post("/v1/impact", not_dry, Some(read.clone())).await;
    assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
    assert_eq!(preview.body["dry_run"], true);
    assert_eq!(
        preview.body["impact"]["resources"][0]["moves"],
        web["moves"]
    );
    assert_eq!(api.store.head_revision().await.unwrap(), 1);
    assert_problem(&post("/v1/impact", change.clone(), None).await, 401);
    assert_problem(
        &post("/v1/changesets", change.clone(), Some(read.clone())).await,
        403,
    );

    // Validation errors are reported as for any changeset.
    let overlapping = put_web(&[("env in (a, b)", "x"), ("env in (b, c)", "y")], true);
    let refused = post("/v1/impact", overlapping, Some(read.clone())).await;
    assert_problem(&refused, 422);
    assert_eq!(
        problem_codes(&refused)[0].0,
        "/operations/0/variants/1/constraints"
    );

    // A dry-run restore previews too: back to revision 0, where `web` did not exist.
    let restore = post(
        "/v1/revisions/0/restore",
        json!({"dry_run": true}),
        Some(write.clone()),
    )
    .await;
    assert_eq!(restore.status, StatusCode::OK, "{}", restore.text);
    let web = &restore.body["impact"]["resources"][0];
    assert_eq!(
        (web["name"].as_str(), web["change"].as_str()),
        (Some("web"), Some("deleted"))
    );
    assert_eq!(web["affected"], 4);

    // A dry-run PUT of the resource previews the same moves as the changeset.
    let variants_only = json!({"variants": change["operations"][0]["variants"].clone()});
    let put = api
        .call(
            Method::PUT,
            "/v1/resources/route/web?dry_run=true",
            Some(("application/json", variants_only.to_string())),
            &[("authorization", write.as_str())],
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.text);
    assert_eq!(put.body["impact"]["resources"][0]["moves"], web_moves);

    // A dry-run delete loses every matched client.
    let delete = api
        .call(
            Method::DELETE,
            "/v1/resources/route/web?dry_run=true",
            None,
            &[("authorization", write.as_str())],
        )
        .await;
    assert_eq!(delete.status, StatusCode::OK, "{}", delete.text);
    let web = &delete.body["impact"]["resources"][0];
    assert_eq!(web["change"], "deleted");
    let lost: u64 = web["moves"]
        .as_array()
        .unwrap()
        .iter()
        .inspect(|m| assert_eq!(m["kind"], "lose"))
        .map(|m| m["streams"].as_u64().unwrap())
        .sum();
    assert_eq!(lost, 4);
}
