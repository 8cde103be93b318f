//! Issue 22: a secret marked shared is recorded in the store (migration 0007), shown in the
//! API and the export, is part of the version, and is undone by a put without it.

use super::*;

on_both_backends!(a_secrets_sharing_is_recorded_shown_and_exported);

fn secret(name: &str) -> Value {
    json!({"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
           "name": name, "generic_secret": {"secret": {"inline_string": "x"}}})
}

async fn a_secrets_sharing_is_recorded_shown_and_exported(db: TestDb) {
    let api = serve(&db, Tokens::none(), 1 << 20).await;
    let shared = api
        .send_json(
            Method::PUT,
            "/v1/resources/secret/ca",
            json!({"shared": true, "variants": [{"resource": secret("ca")}]}),
        )
        .await;
    assert_eq!(shared.status, StatusCode::CREATED, "{}", shared.text);
    let got = api.get("/v1/resources/secret/ca").await;
    assert_eq!(got.body["shared"], true, "{}", got.text);
    let shared_version = got.body["version"].clone();
    let export = api.get("/v1/export?type=secret").await;
    assert!(export.text.contains("shared: true"), "{}", export.text);

    // The same variants without `shared`: a change, a new version, no longer shared.
    let unshared = api
        .send_json(
            Method::PUT,
            "/v1/resources/secret/ca",
            json!({"variants": [{"resource": secret("ca")}]}),
        )
        .await;
    assert_eq!(unshared.status, StatusCode::OK, "{}", unshared.text);
    let got = api.get("/v1/resources/secret/ca").await;
    assert_eq!(got.body["shared"], false, "{}", got.text);
    assert_ne!(got.body["version"], shared_version);
    assert!(
        !api.get("/v1/export?type=secret")
            .await
            .text
            .contains("shared")
    );

    // Only secrets: refused, naming the field, and nothing written.
    let refused = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            json!({"operations": [{"op": "put", "type": "route", "name": "r", "shared": true,
                                   "variants": [{"resource": route("r", "x")}]}]}),
        )
        .await;
    assert_eq!(
        problem_codes(&refused),
        [(
            "/operations/0/shared".to_owned(),
            "shared_not_secret".to_owned()
        )]
    );
    assert_eq!(
        api.get("/v1/resources/route/r").await.status,
        StatusCode::NOT_FOUND
    );
}
