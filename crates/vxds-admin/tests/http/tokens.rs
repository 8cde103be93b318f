//! Bearer tokens: what no token, a read token and a write token may do, and what stays public;
//! issue 8: hashed tokens in the token file, beside plaintext ones, and the author each
//! token's writes are recorded under.

use vxds_admin::auth::token_sha256_hex;

use super::*;

on_both_backends!(
    tokens_guard_reads_and_writes,
    hashed_and_plaintext_tokens_authorize_and_name_the_author,
    secret_key_material_is_shown_only_to_a_secrets_token,
    inline_key_material_in_listeners_is_redacted_for_read_tokens,
);

async fn tokens_guard_reads_and_writes(db: TestDb) {
    let tokens = Tokens::parse(&format!("write {WRITE_TOKEN} alice\nread {READ_TOKEN}\n")).unwrap();
    let api = serve(&db, tokens, DEFAULT_BODY_LIMIT).await;
    let body = variants("web", &[("*", "x")]).to_string();
    let bearer = |t: &str| format!("Bearer {t}");
    let anonymous = api
        .call(
            Method::PUT,
            "/v1/resources/route/web",
            Some(("application/json", body.clone())),
            &[],
        )
        .await;
    assert_problem(&anonymous, 401);
    assert_eq!(
        anonymous.headers["www-authenticate"],
        r#"Bearer realm="vxds""#
    );
    let wrong = bearer("not-a-token-at-all-xyz");
    assert_problem(
        &api.call(
            Method::GET,
            "/v1/resources",
            None,
            &[("authorization", &wrong)],
        )
        .await,
        401,
    );
    let reader = bearer(READ_TOKEN);
    let forbidden = api
        .call(
            Method::PUT,
            "/v1/resources/route/web",
            Some(("application/json", body.clone())),
            &[("authorization", &reader)],
        )
        .await;
    assert_problem(&forbidden, 403);
    let writer = bearer(WRITE_TOKEN);
    let put = api
        .call(
            Method::PUT,
            "/v1/resources/route/web",
            Some(("application/json", body)),
            &[("authorization", &writer)],
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED);
    assert_eq!(
        api.call(
            Method::GET,
            "/v1/resources/route/web",
            None,
            &[("authorization", &reader)]
        )
        .await
        .status,
        StatusCode::OK
    );
    let resolve = json!({"type": "route", "name": "web"}).to_string();
    assert_eq!(
        api.call(
            Method::POST,
            "/v1/resolve",
            Some(("application/json", resolve)),
            &[("authorization", &reader)]
        )
        .await
        .status,
        StatusCode::OK
    );
    assert_problem(&api.get("/v1/revisions").await, 401);
    let history = api
        .call(
            Method::GET,
            "/v1/revisions/1",
            None,
            &[("authorization", &reader)],
        )
        .await;
    assert_eq!(history.body["author"], "alice");
    // Health and the API description stay public.
    assert_eq!(api.get("/healthz").await.status, StatusCode::OK);
    assert_eq!(api.get("/readyz").await.status, StatusCode::OK);
    assert_eq!(api.get("/v1/openapi.json").await.status, StatusCode::OK);
}

/// A token stored as `sha256:<hex>` writes; a plaintext one still does; a wrong token, the
/// stored hash itself, or no token is 401. Each revision's author is the writing token's name.
async fn hashed_and_plaintext_tokens_authorize_and_name_the_author(db: TestDb) {
    let hashed_secret = "hashed-write-token-0123456789";
    // Uppercase in the file: the comparison is of the bytes, not the text.
    let hash = token_sha256_hex(hashed_secret).to_ascii_uppercase();
    let file = format!(
        "# ci writes with a hashed token\nwrite sha256:{hash} ci-bot\nwrite {WRITE_TOKEN} alice\nread {READ_TOKEN}\nwrite anonymous-write-token-0123\n"
    );
    let api = serve(&db, Tokens::parse(&file).unwrap(), DEFAULT_BODY_LIMIT).await;
    let bearer = |t: &str| format!("Bearer {t}");
    let put = |name: &str, token: Option<String>| {
        let body = variants(name, &[("*", "x")]).to_string();
        let path = format!("/v1/resources/route/{name}");
        let api = &api;
        async move {
            let headers: Vec<(&str, &str)> = token
                .as_deref()
                .map(|t| vec![("authorization", t)])
                .unwrap_or_default();
            api.call(
                Method::PUT,
                &path,
                Some(("application/json", body)),
                &headers,
            )
            .await
        }
    };

    for wrong in [
        Some(bearer("not-a-token-at-all-xyz")),
        Some(bearer(&format!("sha256:{hash}"))),
        Some(bearer(&hash)),
        Some(bearer(&format!("{hashed_secret}x"))),
        None,
    ] {
        assert_problem(&put("denied", wrong).await, 401);
    }
    let reader = bearer(READ_TOKEN);
    assert_problem(&put("denied", Some(reader.clone())).await, 403);

    let by_hash = put("by-hash", Some(bearer(hashed_secret))).await;
    assert_eq!(by_hash.status, StatusCode::CREATED, "{}", by_hash.text);
    let by_plain = put("by-plain", Some(bearer(WRITE_TOKEN))).await;
    assert_eq!(by_plain.status, StatusCode::CREATED, "{}", by_plain.text);
    let unnamed = put("unnamed", Some(bearer("anonymous-write-token-0123"))).await;
    assert_eq!(unnamed.status, StatusCode::CREATED, "{}", unnamed.text);
    // A changeset is recorded under the token's name too.
    let changeset = json!({"operations": [
        {"op": "put", "type": "route", "name": "by-changeset", "variants": [{"resource": route("by-changeset", "x")}]},
    ]})
    .to_string();
    let applied = api
        .call(
            Method::POST,
            "/v1/changesets",
            Some(("application/json", changeset)),
            &[("authorization", &bearer(hashed_secret))],
        )
        .await;
    assert!(applied.status.is_success(), "{}", applied.text);

    let mut authors = Vec::new();
    for revision in 1..=4 {
        let reply = api
            .call(
                Method::GET,
                &format!("/v1/revisions/{revision}"),
                None,
                &[("authorization", &reader)],
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
        authors.push(reply.body["author"].clone());
    }
    assert_eq!(
        authors,
        vec![
            json!("ci-bot"),
            json!("alice"),
            Value::Null,
            json!("ci-bot")
        ]
    );
}

/// Issue 22 item 2: a read (or write) token sees secrets with their key material redacted in
/// every answer that carries bodies; a `secrets` token sees it; a `metrics` token reads
/// `/metrics` and nothing else.
async fn secret_key_material_is_shown_only_to_a_secrets_token(db: TestDb) {
    const SECRETS_TOKEN: &str = "secrets-token-0123456789";
    const METRICS_TOKEN: &str = "metrics-token-0123456789";
    let file = format!(
        "write {WRITE_TOKEN}\nread {READ_TOKEN}\nsecrets {SECRETS_TOKEN}\nmetrics {METRICS_TOKEN}\n"
    );
    let api = serve(&db, Tokens::parse(&file).unwrap(), DEFAULT_BODY_LIMIT).await;
    let as_token = |method: Method, path: &str, token: &str, body: Option<Value>| {
        let (api, path) = (&api, path.to_owned());
        let bearer = format!("Bearer {token}");
        async move {
            let body = body.map(|b| ("application/json", b.to_string()));
            api.call(method, &path, body, &[("authorization", &bearer)])
                .await
        }
    };
    let key = "-----BEGIN PRIVATE KEY-----PRIVATE-KEY-BYTES";
    let secret = json!({"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
        "name": "tls", "tls_certificate": {
            "certificate_chain": {"inline_string": "PUBLIC-CHAIN"},
            "private_key": {"inline_string": key}}});
    let written = as_token(
        Method::PUT,
        "/v1/resources/secret/tls",
        WRITE_TOKEN,
        Some(json!({"variants": [{"resource": secret}]})),
    )
    .await;
    assert_eq!(written.status, StatusCode::CREATED);
    // The write's own answer, to a write token: redacted too.
    assert!(
        !written.text.contains("PRIVATE-KEY-BYTES"),
        "{}",
        written.text
    );
    assert!(written.text.contains("PUBLIC-CHAIN"), "{}", written.text);

    let reads: [(Method, &str, Option<Value>); 4] = [
        (Method::GET, "/v1/resources/secret/tls", None),
        (Method::GET, "/v1/export", None),
        (Method::GET, "/v1/revisions/1?bodies=true", None),
        (
            Method::POST,
            "/v1/resolve",
            Some(json!({"type": "secret", "name": "tls", "params": {}})),
        ),
    ];
    for (method, path, body) in reads {
        for token in [READ_TOKEN, WRITE_TOKEN] {
            let reply = as_token(method.clone(), path, token, body.clone()).await;
            assert!(reply.status.is_success(), "{path}: {}", reply.text);
            assert!(
                !reply.text.contains("PRIVATE-KEY-BYTES"),
                "{path}: {}",
                reply.text
            );
        }
        let reply = as_token(method.clone(), path, SECRETS_TOKEN, body.clone()).await;
        assert!(
            reply.text.contains("PRIVATE-KEY-BYTES"),
            "{path}: {}",
            reply.text
        );
    }
    let read = as_token(Method::GET, "/v1/resources/secret/tls", READ_TOKEN, None).await;
    assert_eq!(
        read.body["variants"][0]["resource"]["tls_certificate"]["private_key"],
        vxds_admin::redact::REDACTED,
        "{}",
        read.text
    );
    let shown = as_token(Method::GET, "/v1/resources/secret/tls", SECRETS_TOKEN, None).await;
    assert!(shown.text.contains("PRIVATE-KEY-BYTES"), "{}", shown.text);

    // A secrets token writes, too.
    let rewritten = as_token(
        Method::PUT,
        "/v1/resources/secret/tls",
        SECRETS_TOKEN,
        Some(json!({"variants": [{"resource": shown.body["variants"][0]["resource"]}]})),
    )
    .await;
    assert!(rewritten.status.is_success(), "{}", rewritten.text);
    // A redacted body applied back is refused, not written as a key.
    let refused = as_token(
        Method::PUT,
        "/v1/resources/secret/tls",
        WRITE_TOKEN,
        Some(json!({"variants": [{"resource": read.body["variants"][0]["resource"]}]})),
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        refused.text
    );

    // Two representations of one version, two entity-tags (RFC 9110 §8.8.3).
    let read = as_token(Method::GET, "/v1/resources/secret/tls", READ_TOKEN, None).await;
    let shown = as_token(Method::GET, "/v1/resources/secret/tls", SECRETS_TOKEN, None).await;
    let read_tag = read.headers["etag"].to_str().unwrap().to_owned();
    let full_tag = shown.headers["etag"].to_str().unwrap().to_owned();
    assert_ne!(read_tag, full_tag);
    assert_eq!(
        full_tag,
        format!("\"{}\"", shown.body["version"].as_str().unwrap())
    );
    let conditional_get = |token: &'static str, tag: String| {
        let api = &api;
        async move {
            let bearer = format!("Bearer {token}");
            api.call(
                Method::GET,
                "/v1/resources/secret/tls",
                None,
                &[("authorization", &bearer), ("if-none-match", &tag)],
            )
            .await
        }
    };
    // Each representation is "not modified" against its own tag only: a secrets token that
    // holds the redacted one gets the full one.
    let same = conditional_get(READ_TOKEN, read_tag.clone()).await;
    assert_eq!(same.status, StatusCode::NOT_MODIFIED, "{}", same.text);
    assert_eq!(same.headers["etag"].to_str().unwrap(), read_tag);
    let same = conditional_get(SECRETS_TOKEN, full_tag.clone()).await;
    assert_eq!(same.status, StatusCode::NOT_MODIFIED, "{}", same.text);
    let other = conditional_get(SECRETS_TOKEN, read_tag.clone()).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text);
    assert!(other.text.contains("PRIVATE-KEY-BYTES"), "{}", other.text);
    let other = conditional_get(READ_TOKEN, full_tag.clone()).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text);
    assert!(!other.text.contains("PRIVATE-KEY-BYTES"), "{}", other.text);
    // A writer that read the redacted representation writes with its tag: `If-Match` takes
    // it as the version it names (the body sent is a public one, so it is not refused).
    let public = json!({"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
        "name": "tls", "validation_context": {"trusted_ca": {"inline_string": "CA"}}});
    let bearer = format!("Bearer {WRITE_TOKEN}");
    let conditional_put = |tag: String| {
        let (api, bearer, public) = (&api, bearer.clone(), public.clone());
        async move {
            api.call(
                Method::PUT,
                "/v1/resources/secret/tls",
                Some((
                    "application/json",
                    json!({"variants": [{"resource": public}]}).to_string(),
                )),
                &[("authorization", &bearer), ("if-match", &tag)],
            )
            .await
        }
    };
    let stale = conditional_put("\"not-the-version;redacted\"".to_owned()).await;
    assert_problem(&stale, 412);
    let rewritten = conditional_put(read_tag.clone()).await;
    assert_eq!(rewritten.status, StatusCode::OK, "{}", rewritten.text);
    // Nothing to redact any more: one representation, one tag, the version.
    let public_tag = rewritten.headers["etag"].to_str().unwrap().to_owned();
    assert!(!public_tag.contains(";redacted"), "{public_tag}");
    let shown = as_token(Method::GET, "/v1/resources/secret/tls", SECRETS_TOKEN, None).await;
    assert_eq!(shown.headers["etag"].to_str().unwrap(), public_tag);
    let read = as_token(Method::GET, "/v1/resources/secret/tls", READ_TOKEN, None).await;
    assert_eq!(read.headers["etag"].to_str().unwrap(), public_tag);

    // /metrics has its own scope; that scope reads nothing else.
    let metrics = as_token(Method::GET, "/metrics", METRICS_TOKEN, None).await;
    assert_eq!(metrics.status, StatusCode::OK, "{}", metrics.text);
    let denied = as_token(Method::GET, "/v1/resources/secret/tls", METRICS_TOKEN, None).await;
    assert_problem(&denied, 403);
    assert!(denied.text.contains("`metrics`"), "{}", denied.text);
}

/// Key material held inline in a listener's TLS context (not in a `Secret`) is redacted for a
/// read token as well, in every answer.
async fn inline_key_material_in_listeners_is_redacted_for_read_tokens(db: TestDb) {
    const SECRETS_TOKEN: &str = "secrets-token-0123456789";
    let file = format!("write {WRITE_TOKEN}\nread {READ_TOKEN}\nsecrets {SECRETS_TOKEN}\n");
    let api = serve(&db, Tokens::parse(&file).unwrap(), DEFAULT_BODY_LIMIT).await;
    let as_token = |method: Method, path: &str, token: &str, body: Option<Value>| {
        let (api, path) = (&api, path.to_owned());
        let bearer = format!("Bearer {token}");
        async move {
            let body = body.map(|b| ("application/json", b.to_string()));
            api.call(method, &path, body, &[("authorization", &bearer)])
                .await
        }
    };
    let listener = json!({"@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
        "name": "l", "filter_chains": [{"transport_socket": {"name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                "common_tls_context": {"tls_certificates": [{
                    "certificate_chain": {"inline_string": "PUBLIC-CHAIN"},
                    "private_key": {"inline_string": "INLINE-KEY-BYTES"}}]}}}}]});
    let written = as_token(
        Method::PUT,
        "/v1/resources/listener/l",
        WRITE_TOKEN,
        Some(json!({"variants": [{"resource": listener}]})),
    )
    .await;
    assert_eq!(written.status, StatusCode::CREATED, "{}", written.text);
    let reads: [(Method, &str, Option<Value>); 4] = [
        (Method::GET, "/v1/resources/listener/l", None),
        (Method::GET, "/v1/export", None),
        (Method::GET, "/v1/revisions/1?bodies=true", None),
        (
            Method::POST,
            "/v1/resolve",
            Some(json!({"type": "listener", "name": "l", "params": {}})),
        ),
    ];
    for (method, path, body) in reads {
        let reply = as_token(method.clone(), path, READ_TOKEN, body.clone()).await;
        assert!(reply.status.is_success(), "{path}: {}", reply.text);
        assert!(
            !reply.text.contains("INLINE-KEY-BYTES"),
            "{path}: {}",
            reply.text
        );
        assert!(
            reply.text.contains("PUBLIC-CHAIN"),
            "{path}: {}",
            reply.text
        );
        let reply = as_token(method.clone(), path, SECRETS_TOKEN, body.clone()).await;
        assert!(
            reply.text.contains("INLINE-KEY-BYTES"),
            "{path}: {}",
            reply.text
        );
    }
}
