//! Issue 8: hashed tokens in the token file, beside plaintext ones, and the author each
//! token's writes are recorded under.

use vxds_admin::auth::token_sha256_hex;

use super::*;

on_both_backends!(hashed_and_plaintext_tokens_authorize_and_name_the_author);

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
