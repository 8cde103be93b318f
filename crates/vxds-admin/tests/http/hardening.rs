//! Issue 14: hostile or ambiguous input (YAML aliases, doubly encoded paths, missing or
//! foreign headers, conditional requests) over HTTP on both backends.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use vxds_admin::{OriginPolicy, path_segment};

use super::*;

on_both_backends!(
    yaml_aliases_cannot_expand_past_the_body,
    path_parameters_are_decoded_once,
    cli_encoding_round_trips_any_name,
    a_body_needs_a_json_or_yaml_content_type,
    json_sent_as_a_form_is_read_with_a_warning,
    host_must_name_this_server,
    writes_from_other_origins_are_refused,
    if_none_match_star_creates_only,
    must_not_exist_in_changesets,
    conditions_follow_rfc_9110,
    bearer_scheme_is_case_insensitive,
);

/// A YAML body whose aliases would expand to billions of values (far past 1 GB) is refused
/// from its budget, before the values are built; nothing is written and the server goes on.
async fn yaml_aliases_cannot_expand_past_the_body(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let list = vec!["0"; 1500].join(",");
    let level1 = vec!["*a"; 1500].join(",");
    let level2 = vec!["*b"; 1000].join(",");
    // 1500 × 1500 × 1000 values, from about 12 KB.
    let bomb =
        format!("message: &a [{list}]\noperations: &b [{level1}]\nexpected_revision: [{level2}]\n");
    assert!(bomb.len() < 16 << 10);
    for path in ["/v1/changesets", "/v1/resolve", "/v1/resources/route/r"] {
        let method = if path.starts_with("/v1/resources") {
            Method::PUT
        } else {
            Method::POST
        };
        let reply = api
            .call(method, path, Some(("application/yaml", bomb.clone())), &[])
            .await;
        assert_problem(&reply, 400);
        assert_eq!(
            problem_codes(&reply),
            vec![(String::new(), "yaml_alias_expansion".to_owned())],
            "{path}: {}",
            reply.text
        );
        let detail = reply.body["detail"].as_str().unwrap();
        assert!(
            detail.contains("aliases") && detail.contains("line "),
            "{detail}"
        );
    }
    assert_eq!(api.store.head_revision().await.unwrap(), 0);
    assert_eq!(api.get("/healthz").await.status, StatusCode::OK);
    // Aliases within the budget keep working.
    let fine = format!(
        "variants:\n  - constraints: env = \"a\"\n    resource: &r\n      '@type': {ROUTE}\n      name: r\n  - constraints: env = \"b\"\n    resource: *r\n"
    );
    let put = api
        .call(
            Method::PUT,
            "/v1/resources/route/r",
            Some(("application/yaml", fine)),
            &[],
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);
}

/// `r%2541` is the name `r%41`, never `rA`; escapes that are not UTF-8 name the parameter.
async fn path_parameters_are_decoded_once(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let put_a = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/rA",
            variants("rA", &[("*", "A")]),
        )
        .await;
    assert_eq!(put_a.status, StatusCode::CREATED, "{}", put_a.text);
    assert_eq!(path_segment("r%41"), "r%2541");
    let put = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/r%2541",
            variants("r%41", &[("*", "percent")]),
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);
    assert_eq!(put.body["resource"]["name"], "r%41");
    let deleted = api
        .call(Method::DELETE, "/v1/resources/route/r%2541", None, &[])
        .await;
    assert_eq!(deleted.status, StatusCode::OK, "{}", deleted.text);
    assert_eq!(deleted.body["changed"][0]["name"], "r%41");
    let a = api.get("/v1/resources/route/rA").await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.body["variants"][0]["resource"], route("rA", "A"));
    // An xdstp name whose normal form holds `%25`.
    let xdstp = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?k=a%25b";
    let path = format!("/v1/resources/route/{}", path_segment(xdstp));
    let put = api
        .send_json(Method::PUT, &path, variants(xdstp, &[("*", "x")]))
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);
    assert_eq!(api.get(&path).await.body["name"], xdstp);

    let bad = api.get("/v1/resources/route/%FF").await;
    assert_problem(&bad, 400);
    assert_eq!(bad.body["errors"][0]["parameter"], "name");
    assert_eq!(bad.body["errors"][0]["code"], "invalid_encoding");
    let bad_type = api.get("/v1/resources/%C3%28/x").await;
    assert_problem(&bad_type, 400);
    assert_eq!(bad_type.body["errors"][0]["parameter"], "type");
}

/// Names the CLI might be given: opaque ones with `%`, `/`, unicode and the like, and xdstp
/// names with context parameters (escaped or not).
fn names() -> impl Strategy<Value = String> {
    let opaque = "[a-zA-Z0-9%/?#&=+ .~_é日🦀-]{1,24}";
    let xdstp = (
        "[a-z0-9.-]{1,8}",
        "[a-zA-Z0-9%/._-]{1,12}",
        proptest::collection::vec(("[a-z]{1,3}", "[a-zA-Z0-9%é ._-]{0,6}"), 0..3),
    )
        .prop_map(|(authority, id, params)| {
            let mut name =
                format!("xdstp://{authority}/envoy.config.route.v3.RouteConfiguration/{id}");
            for (i, (k, v)) in params.iter().enumerate() {
                name.push(if i == 0 { '?' } else { '&' });
                name.push_str(&format!("{k}={v}"));
            }
            name
        });
    prop_oneof![opaque, xdstp]
}

/// For any name the store accepts, the CLI's encoding of it addresses exactly that resource:
/// a PUT there creates it under its normal form, a GET there reads it back, and no two names
/// meet.
async fn cli_encoding_round_trips_any_name(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let handle = tokio::runtime::Handle::current();
    // `run` takes an `Fn`: the names stored so far live in a cell.
    let stored = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&names(), |name| {
        let Ok(normal) = vxds_core::xdstp::normalize(&name) else {
            return Err(TestCaseError::reject("not a valid xdstp name"));
        };
        // Refused on write: no URL path can carry them (`dot_segment_names_are_refused`).
        if name == "." || name == ".." {
            return Err(TestCaseError::reject("a URL dot-segment"));
        }
        let normal = normal.into_owned();
        let path = format!("/v1/resources/route/{}", path_segment(&name));
        let (put, got) = tokio::task::block_in_place(|| {
            handle.block_on(async {
                let put = api
                    .send_json(Method::PUT, &path, variants(&name, &[("*", "x")]))
                    .await;
                let got = api
                    .get(&format!("/v1/resources/route/{}", path_segment(&normal)))
                    .await;
                (put, got)
            })
        });
        prop_assert!(put.status.is_success(), "{name}: {}", put.text);
        prop_assert_eq!(&put.body["resource"]["name"], &Value::from(normal.clone()));
        prop_assert_eq!(got.status, StatusCode::OK);
        prop_assert_eq!(&got.body["name"], &Value::from(normal.clone()));
        stored.borrow_mut().insert(normal);
        Ok(())
    });
    result.unwrap();
    let listed = api.get("/v1/resources?limit=1000").await;
    let names: std::collections::BTreeSet<String> = listed.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, stored.into_inner());
}

/// Every route that reads a body refuses one without a JSON or YAML Content-Type (415, naming
/// the header), and writes nothing.
async fn a_body_needs_a_json_or_yaml_content_type(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let put = variants("r", &[("*", "x")]).to_string();
    let changeset = json!({"operations": [{"op": "put", "type": "route", "name": "r",
        "variants": [{"resource": route("r", "x")}]}]})
    .to_string();
    let resolve = json!({"type": "route", "name": "r"}).to_string();
    for (method, path, body) in [
        (Method::PUT, "/v1/resources/route/r", put),
        (Method::POST, "/v1/changesets", changeset),
        (Method::POST, "/v1/resolve", resolve),
    ] {
        let url = format!("{}{path}", api.base);
        let response = api
            .http
            .request(method.clone(), url)
            .body(body)
            .send()
            .await
            .unwrap();
        assert!(response.headers().get("content-type").is_some());
        let status = response.status();
        let problem: Value = response.json().await.unwrap();
        assert_eq!(
            status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{method} {path}"
        );
        assert_eq!(problem["errors"][0]["header"], "Content-Type");
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("no `Content-Type`")
        );
    }
    assert_eq!(api.store.head_revision().await.unwrap(), 0);
}

/// `curl -d '{...}'` sends JSON as `application/x-www-form-urlencoded`: it is read as JSON,
/// with a `Warning`; a real form body is still refused (415), and a JSON-typed body gets no
/// warning.
async fn json_sent_as_a_form_is_read_with_a_warning(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    const FORM: &str = "application/x-www-form-urlencoded";
    let put = api
        .call(
            Method::PUT,
            "/v1/resources/route/r",
            Some((FORM, variants("r", &[("*", "x")]).to_string())),
            &[],
        )
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);
    let warning = put.headers["warning"].to_str().unwrap();
    assert!(warning.starts_with("299 - \""), "{warning}");
    assert!(warning.contains("application/json"), "{warning}");
    let resolve = json!({"type": "route", "name": "r"}).to_string();
    let resolved = api
        .call(
            Method::POST,
            "/v1/resolve",
            Some((FORM, resolve.clone())),
            &[],
        )
        .await;
    assert_eq!(resolved.status, StatusCode::OK, "{}", resolved.text);
    assert!(resolved.headers.contains_key("warning"));
    let plain = api
        .call(
            Method::POST,
            "/v1/resolve",
            Some(("application/json", resolve)),
            &[],
        )
        .await;
    assert!(!plain.headers.contains_key("warning"));
    let form = api
        .call(
            Method::POST,
            "/v1/resolve",
            Some((FORM, "type=route".into())),
            &[],
        )
        .await;
    assert_problem(&form, 415);
    assert!(!form.headers.contains_key("warning"));
}

/// `Host` must be a loopback name, the listen address or a configured name (DNS rebinding);
/// the probes answer whatever it is.
async fn host_must_name_this_server(db: TestDb) {
    let api = serve_with(
        &db,
        Tokens::none(),
        DEFAULT_BODY_LIMIT,
        OriginPolicy::new(["vxds.example"], [""; 0]).unwrap(),
    )
    .await;
    let body = variants("r", &[("*", "x")]).to_string();
    for (method, body) in [(Method::GET, None), (Method::PUT, Some(body.clone()))] {
        let refused = api
            .call(
                method.clone(),
                "/v1/resources/route/r",
                body.clone().map(|b| ("application/json", b)),
                &[("host", "rebound.evil.example:8080")],
            )
            .await;
        assert_problem(&refused, 421);
        assert_eq!(refused.body["errors"][0]["header"], "Host");
        assert_eq!(refused.body["errors"][0]["code"], "host_not_allowed");
    }
    assert_eq!(api.store.head_revision().await.unwrap(), 0);
    let healthz = api
        .call(Method::GET, "/healthz", None, &[("host", "10.9.9.9:8080")])
        .await;
    assert_eq!(healthz.status, StatusCode::OK);
    for host in [
        "vxds.example",
        "VXDS.example:8080",
        "localhost:1234",
        "[::1]:8080",
    ] {
        let reply = api
            .call(Method::GET, "/v1/resources", None, &[("host", host)])
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{host}: {}", reply.text);
    }
}

/// A write whose `Origin` is another origin is refused (403, naming `Origin`) with a token or
/// without; the server's own origin and configured origins may write; reads are not affected.
async fn writes_from_other_origins_are_refused(db: TestDb) {
    for tokens in [
        Tokens::none(),
        Tokens::parse(&format!("write {WRITE_TOKEN} alice\n")).unwrap(),
    ] {
        let with_token = !tokens.is_empty();
        let api = serve_with(
            &db,
            tokens,
            DEFAULT_BODY_LIMIT,
            OriginPolicy::new([""; 0], ["https://console.example"]).unwrap(),
        )
        .await;
        let bearer = format!("Bearer {WRITE_TOKEN}");
        let auth: &[(&str, &str)] = if with_token {
            &[("authorization", bearer.as_str())]
        } else {
            &[]
        };
        let head = api.store.head_revision().await.unwrap();
        let write = |origin: String| {
            let api = &api;
            async move {
                let mut headers = auth.to_vec();
                headers.push(("origin", origin.as_str()));
                api.call(
                    Method::PUT,
                    "/v1/resources/route/r",
                    Some(("application/json", variants("r", &[("*", "x")]).to_string())),
                    &headers,
                )
                .await
            }
        };
        for origin in ["http://evil.example", "null", "http://localhost:1"] {
            let refused = write(origin.to_owned()).await;
            assert_problem(&refused, 403);
            assert_eq!(refused.body["errors"][0]["header"], "Origin");
            assert_eq!(refused.body["errors"][0]["code"], "cross_origin");
        }
        assert_eq!(api.store.head_revision().await.unwrap(), head);
        let mut read_headers = auth.to_vec();
        read_headers.push(("origin", "http://evil.example"));
        let read = api
            .call(Method::GET, "/v1/resources", None, &read_headers)
            .await;
        assert_eq!(read.status, StatusCode::OK, "{}", read.text);
        let allowed = write("https://console.example".to_owned()).await;
        assert_eq!(allowed.status, StatusCode::CREATED, "{}", allowed.text);
        // The server's own origin: the page came from the authority the request names.
        assert_eq!(write(api.base.clone()).await.status, StatusCode::OK);
        api.store
            .apply(
                serde_json::from_value(
                    json!({"operations": [{"op": "delete", "type": "route", "name": "r"}]}),
                )
                .unwrap(),
                None,
            )
            .await
            .unwrap();
    }
}

fn put_body(text: &str) -> Option<(&'static str, String)> {
    Some((
        "application/json",
        variants("web", &[("*", text)]).to_string(),
    ))
}

/// `If-None-Match: *` creates or refuses with 412, checked under the store's write lock: of
/// concurrent create-only PUTs exactly one wins, and the others change nothing.
async fn if_none_match_star_creates_only(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let path = "/v1/resources/route/web";
    let racers = (0..6).map(|i| {
        let api = &api;
        async move {
            api.call(
                Method::PUT,
                path,
                put_body(&format!("racer {i}")),
                &[("if-none-match", "*")],
            )
            .await
        }
    });
    // All in flight together: each is a separate request to the server.
    let replies = futures::future::join_all(racers).await;
    let created: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status == StatusCode::CREATED)
        .collect();
    assert_eq!(
        created.len(),
        1,
        "{:?}",
        replies.iter().map(|r| &r.text).collect::<Vec<_>>()
    );
    for refused in replies.iter().filter(|r| r.status != StatusCode::CREATED) {
        assert_problem(refused, 412);
        assert_eq!(refused.body["errors"][0]["header"], "If-None-Match");
        assert_eq!(refused.body["errors"][0]["code"], "precondition_failed");
    }
    let winner = created[0].body["resource"]["variants"][0]["resource"].clone();
    assert_eq!(api.get(path).await.body["variants"][0]["resource"], winner);
    assert_eq!(api.store.head_revision().await.unwrap(), 1);
    // Entity-tags in `If-None-Match` mean nothing to a write: refused, not ignored.
    let tagged = api
        .call(
            Method::PUT,
            path,
            put_body("x"),
            &[("if-none-match", "\"abc\"")],
        )
        .await;
    assert_problem(&tagged, 400);
    assert_eq!(tagged.body["errors"][0]["header"], "If-None-Match");
}

/// The changeset form of create-only: `must_not_exist` (409 at its pointer when the resource
/// exists), and not together with `expected_version` (422).
async fn must_not_exist_in_changesets(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let op = |extra: Value| {
        let mut op = json!({"op": "put", "type": "route", "name": "web",
            "variants": [{"resource": route("web", "x")}]});
        op.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"operations": [op]})
    };
    let first = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            op(json!({"must_not_exist": true})),
        )
        .await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text);
    let again = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            op(json!({"must_not_exist": true})),
        )
        .await;
    assert_problem(&again, 409);
    assert_eq!(
        problem_codes(&again),
        vec![(
            "/operations/0/must_not_exist".to_owned(),
            "conflict".to_owned()
        )]
    );
    let both = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            op(json!({"must_not_exist": true, "expected_version": "abc"})),
        )
        .await;
    assert_problem(&both, 422);
    assert_eq!(
        problem_codes(&both),
        vec![(
            "/operations/0/must_not_exist".to_owned(),
            "contradictory_preconditions".to_owned()
        )]
    );
    // A list of expected versions: any will do.
    let version = api.get("/v1/resources/route/web").await.body["version"].clone();
    let listed = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            json!({"operations": [{"op": "put", "type": "route", "name": "web",
                "expected_version": ["0000", version],
                "variants": [{"resource": route("web", "y")}]}]}),
        )
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text);
    assert_eq!(api.store.head_revision().await.unwrap(), 2);
}

/// RFC 9110: a failed `If-Match` is 412; every tag of the list counts; weak tags never match;
/// a non-ASCII or malformed value is a 400 naming the header; `If-Match: *` needs the resource.
async fn conditions_follow_rfc_9110(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let path = "/v1/resources/route/web";
    let absent = api
        .call(Method::PUT, path, put_body("one"), &[("if-match", "*")])
        .await;
    assert_problem(&absent, 412);
    assert_eq!(absent.body["errors"][0]["header"], "If-Match");
    let created = api.call(Method::PUT, path, put_body("one"), &[]).await;
    let etag = created.headers["etag"].to_str().unwrap().to_owned();
    let stale = "\"0000000000000000\"";
    // The matching tag is second in the list, and in a second field line.
    let listed = format!("{stale}, W/{etag}");
    let reply = api
        .call(
            Method::PUT,
            path,
            put_body("two"),
            &[("if-match", &listed), ("if-match", &etag)],
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    let etag = reply.headers["etag"].to_str().unwrap().to_owned();
    // Weak tags never match If-Match, even the current version.
    let weak = format!("W/{etag}");
    let refused = api
        .call(Method::PUT, path, put_body("three"), &[("if-match", &weak)])
        .await;
    assert_problem(&refused, 412);
    let stale_reply = api
        .call(Method::DELETE, path, None, &[("if-match", stale)])
        .await;
    assert_problem(&stale_reply, 412);
    assert_eq!(stale_reply.body["errors"][0]["code"], "precondition_failed");
    for bad in ["abc", "\"unterminated", "\"a\" \"b\""] {
        let reply = api
            .call(Method::PUT, path, put_body("four"), &[("if-match", bad)])
            .await;
        assert_problem(&reply, 400);
        assert_eq!(reply.body["errors"][0]["header"], "If-Match", "{bad}");
    }
    // Not ASCII: sent as raw bytes.
    let url = format!("{}{path}", api.base);
    let response = api
        .http
        .put(url)
        .header("content-type", "application/json")
        .header(
            "if-match",
            reqwest::header::HeaderValue::from_bytes(b"\"caf\xc3\xa9\"").unwrap(),
        )
        .body(variants("web", &[("*", "five")]).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["errors"][0]["header"], "If-Match");
    assert_eq!(problem["errors"][0]["code"], "invalid_header");
    // Nothing refused was written; `If-Match: *` on an existing resource passes.
    assert_eq!(api.store.head_revision().await.unwrap(), 2);
    let star = api
        .call(Method::DELETE, path, None, &[("if-match", "*")])
        .await;
    assert_eq!(star.status, StatusCode::OK, "{}", star.text);
    // A weak If-None-Match matches on GET (weak comparison).
    let put = api.call(Method::PUT, path, put_body("six"), &[]).await;
    let etag = put.headers["etag"].to_str().unwrap().to_owned();
    let weak = format!("W/{etag}");
    let cached = api
        .call(Method::GET, path, None, &[("if-none-match", &weak)])
        .await;
    assert_eq!(cached.status, StatusCode::NOT_MODIFIED);
}

/// `Authorization: BEARER <token>` is the same scheme as `Bearer`.
async fn bearer_scheme_is_case_insensitive(db: TestDb) {
    let tokens = Tokens::parse(&format!("read {READ_TOKEN}\n")).unwrap();
    let api = serve(&db, tokens, DEFAULT_BODY_LIMIT).await;
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let value = format!("{scheme} {READ_TOKEN}");
        let reply = api
            .call(
                Method::GET,
                "/v1/resources",
                None,
                &[("authorization", &value)],
            )
            .await;
        assert_eq!(reply.status, StatusCode::OK, "{scheme}: {}", reply.text);
    }
    let basic = format!("Basic {READ_TOKEN}");
    assert_problem(
        &api.call(
            Method::GET,
            "/v1/resources",
            None,
            &[("authorization", &basic)],
        )
        .await,
        401,
    );
}
