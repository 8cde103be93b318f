//! Issue 9, items 4 and 5: the body limit holds before a body is read, and `GET /v1/export`
//! reads the store in one snapshot and round-trips through a changeset, on both backends.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

on_both_backends!(
    a_body_over_the_limit_is_refused_before_it_is_read,
    json_bodies_are_read_straight_into_the_request,
    export_round_trips_through_a_changeset,
);

const LIMIT: usize = 64 << 10;

/// Sends `head` (and `body`) on a fresh connection and returns what the server answers, up to
/// the end of the response head. Nothing is sent after `body`: a server that waited for the
/// rest would answer only when its body timeout fired, and not with 413.
async fn raw_request(api: &Api, head: &str, body: &[u8]) -> String {
    let address = api.base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    // The server may answer and close while this is still being written.
    let _ = stream.write_all(body).await;
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buffer[..n]),
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// `Content-Length` over the limit: 413 from the headers alone, no byte of the body sent. A
/// chunked body with no length: 413 once the limit is crossed, although the body never ends.
/// Nothing is written either way.
async fn a_body_over_the_limit_is_refused_before_it_is_read(db: TestDb) {
    let api = serve(&db, Tokens::none(), LIMIT).await;
    let declared = raw_request(
        &api,
        &format!(
            "POST /v1/changesets HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            100 << 20
        ),
        b"",
    )
    .await;
    assert!(declared.starts_with("HTTP/1.1 413"), "{declared}");

    let mut chunked = Vec::new();
    let opening = b"{\"operations\": [], \"message\": \"";
    chunked.extend_from_slice(b"4000\r\n");
    chunked.extend_from_slice(opening);
    chunked.extend(std::iter::repeat_n(b'x', 0x4000 - opening.len()));
    chunked.extend_from_slice(b"\r\n");
    for _ in 0..(LIMIT / 0x4000 + 2) {
        chunked.extend_from_slice(b"4000\r\n");
        chunked.extend(std::iter::repeat_n(b'x', 0x4000));
        chunked.extend_from_slice(b"\r\n");
    }
    // No last chunk: the body is never complete.
    let streamed = raw_request(
        &api,
        "POST /v1/changesets HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n",
        &chunked,
    )
    .await;
    assert!(streamed.starts_with("HTTP/1.1 413"), "{streamed}");
    assert_eq!(api.store.head_revision().await.unwrap(), 0);

    // Within the limit, the same server takes a body.
    let ok = api
        .send_json(
            Method::PUT,
            "/v1/resources/route/r",
            variants("r", &[("", "one")]),
        )
        .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{}", ok.text);
}

/// JSON goes straight into the typed request: syntax errors, trailing text and shape errors
/// are still told apart, and shape errors point inside operations and variants.
async fn json_bodies_are_read_straight_into_the_request(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let post = |body: &str| {
        api.call(
            Method::POST,
            "/v1/changesets",
            Some(("application/json", body.to_owned())),
            &[],
        )
    };
    let syntax = post(r#"{"operations": [}"#).await;
    assert_problem(&syntax, 400);
    assert_eq!(problem_codes(&syntax), [("".into(), "invalid_json".into())]);
    let trailing = post(r#"{"operations": []} {"#).await;
    assert_eq!(
        problem_codes(&trailing),
        [("".into(), "invalid_json".into())]
    );
    let unknown = post(
        r#"{"operations": [{"op": "put", "type": "route", "name": "r",
            "variants": [{"resource": {}, "colour": "red"}]}]}"#,
    )
    .await;
    assert_problem(&unknown, 400);
    assert_eq!(
        problem_codes(&unknown),
        [("/operations/0/variants/0/colour".into(), "malformed".into())]
    );
    let delete_with_variants =
        post(r#"{"operations": [{"op": "delete", "type": "route", "name": "r", "variants": []}]}"#)
            .await;
    assert_eq!(
        problem_codes(&delete_with_variants),
        [("/operations/0".into(), "malformed".into())],
        "{}",
        delete_with_variants.text
    );
    let put_without_variants =
        post(r#"{"operations": [{"op": "put", "type": "route", "name": "r"}]}"#).await;
    assert!(
        put_without_variants
            .text
            .contains("missing field `variants`"),
        "{}",
        put_without_variants.text
    );
    // A body whose `@type` comes last, spelt with spaces, is read like any other.
    let body = route("late", "x");
    let mut fields: Vec<String> = body
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "@type")
        .map(|(k, v)| format!("{k:?} : {v}"))
        .collect();
    fields.push(format!("\"@type\" : {:?}", ROUTE));
    let late = post(&format!(
        r#"{{ "operations" : [ {{ "op" : "put", "type" : "route", "name" : "late",
              "variants" : [ {{ "resource" : {{ {} }} }} ] }} ] }}"#,
        fields.join(", ")
    ))
    .await;
    assert_eq!(late.status, StatusCode::OK, "{}", late.text);
    assert_eq!(late.body["changed"][0]["change"], "created");
}

/// `GET /v1/export` is every resource as fixture documents, at one revision; posted back as a
/// changeset it changes nothing.
async fn export_round_trips_through_a_changeset(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    for (name, rows) in [
        (
            "a",
            vec![(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")],
        ),
        ("b", vec![("", "only")]),
    ] {
        let put = api
            .send_json(
                Method::PUT,
                &format!("/v1/resources/route/{name}"),
                variants(name, &rows),
            )
            .await;
        assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);
    }
    let cluster = json!({"variants": [{"resource": {
        "@type": CLUSTER, "name": "c", "type": "EDS", "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": {"ads": {}}}
    }}]});
    let put = api
        .send_json(Method::PUT, "/v1/resources/cluster/c", cluster)
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.text);

    let export = api.get("/v1/export").await;
    assert_eq!(export.status, StatusCode::OK, "{}", export.text);
    assert_eq!(export.headers["content-type"], "application/yaml");
    assert_eq!(export.headers["vxds-revision"], "3");
    let documents: Vec<Value> = export
        .text
        .split("---\n")
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_norway::from_str(d).unwrap())
        .collect();
    let names: Vec<(&str, &str)> = documents
        .iter()
        .map(|d| (d["type"].as_str().unwrap(), d["name"].as_str().unwrap()))
        .collect();
    assert_eq!(names, [("cluster", "c"), ("route", "a"), ("route", "b")]);
    assert_eq!(
        documents[1]["variants"][0]["constraints"],
        r#"env = "prod""#
    );
    assert!(documents[2]["variants"][0].get("constraints").is_none());

    let operations: Vec<Value> = documents
        .into_iter()
        .map(|mut d| {
            d["op"] = json!("put");
            d
        })
        .collect();
    let again = api
        .send_json(
            Method::POST,
            "/v1/changesets",
            json!({"operations": operations}),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.body["changed"], json!([]), "{}", again.text);
    assert_eq!(again.body["revision"], 3);

    let routes = api.get("/v1/export?type=route").await;
    assert_eq!(routes.text.matches("---\n").count(), 2, "{}", routes.text);
    assert!(!routes.text.contains("type: cluster"));
    assert_problem(&api.get("/v1/export?type=nonsense").await, 400);
    let empty = api.get("/v1/export?type=secret").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(empty.text, "");
}
