//! Issue 12 over real HTTP, what the console reads besides the event stream: the coverage grid
//! of a stored resource, and the console's own files with their headers.

use vxds_testkit::{Db, with_db};

use super::*;

on_both_backends!(coverage_grid_of_a_stored_resource);

/// The grid of a stored resource: keys, values with other and absent, each cell's variant,
/// uncovered cells; 404 for a missing resource.
async fn coverage_grid_of_a_stored_resource(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let body = variants(
        "web",
        &[
            (r#"env = "prod" && version = "v1""#, "a"),
            (r#"env = "prod" && version != "v1""#, "b"),
            (r#"env = "test" && exists(version)"#, "c"),
        ],
    );
    let created = api
        .send_json(Method::PUT, "/v1/resources/route/web", body)
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    let grid = api.get("/v1/resources/route/web/coverage").await;
    assert_eq!(grid.status, StatusCode::OK, "{}", grid.text);
    let g = &grid.body;
    assert_eq!(g["name"], "web");
    assert_eq!(g["version"], created.body["changed"][0]["version"]);
    assert_eq!(g["variants"].as_array().unwrap().len(), 3);
    assert_eq!(g["keys"][0]["key"], "env");
    assert_eq!(
        g["keys"][0]["values"],
        json!([
            {"kind": "value", "value": "prod"},
            {"kind": "value", "value": "test"},
            {"kind": "other"},
            {"kind": "absent"}
        ])
    );
    let cells = g["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 12);
    assert_eq!(cells[0]["classes"], json!([0, 0]));
    assert_eq!(cells[0]["example"], json!({"env": "prod", "version": "v1"}));
    assert_eq!(cells[0]["variant"], 0);
    assert_eq!(cells[5]["variant"], Value::Null); // test, absent
    assert_eq!(g["uncovered"], 7);
    // Each cell's example resolves to the cell's variant.
    for cell in cells {
        let answer = api
            .send_json(
                Method::POST,
                "/v1/resolve",
                json!({"type": "route", "name": "web", "params": cell["example"]}),
            )
            .await;
        let id = &answer.body["variant"]["id"];
        let expected = cell["variant"]
            .as_u64()
            .map(|i| g["variants"][i as usize]["id"].clone())
            .unwrap_or(Value::Null);
        assert_eq!(id, &expected, "{cell}");
    }
    let missing = api.get("/v1/resources/route/nothing/coverage").await;
    assert_problem(&missing, 404);
}

/// The console's page, script and style are served without a token, with a CSP that allows
/// only them and forbids framing; `/ui` redirects to `/ui/`; the API behind it still needs one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_served_with_its_headers() {
    with_db(Db::Sqlite, |db| async move {
        let tokens = Tokens::parse(&format!("read {READ_TOKEN}\n")).unwrap();
        let api = serve(&db, tokens, DEFAULT_BODY_LIMIT).await;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap();
        let redirect = http.get(format!("{}/ui", api.base)).send().await.unwrap();
        assert_eq!(redirect.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(redirect.headers()["location"], "/ui/");
        for (path, content_type, marker) in [
            ("/ui/", "text/html; charset=utf-8", "console.js"),
            (
                "/ui/console.js",
                "text/javascript; charset=utf-8",
                "/v1/events",
            ),
            (
                "/ui/console.css",
                "text/css; charset=utf-8",
                "td.cell.uncovered",
            ),
        ] {
            let reply = api.get(path).await;
            assert_eq!(reply.status, StatusCode::OK, "{path}");
            assert_eq!(reply.headers["content-type"], content_type, "{path}");
            let csp = reply.headers["content-security-policy"].to_str().unwrap();
            assert!(
                csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
                "{csp}"
            );
            assert_eq!(reply.headers["x-frame-options"], "DENY");
            assert!(reply.text.contains(marker), "{path}");
        }
        assert_problem(&api.get("/v1/resources").await, 401);
        assert_problem(&api.get("/ui/nothing-here").await, 404);
        // A misdirected Host is still refused for the API.
        let misdirected = api
            .call(
                Method::GET,
                "/v1/resources",
                None,
                &[
                    ("host", "evil.example"),
                    ("authorization", &format!("Bearer {READ_TOKEN}")),
                ],
            )
            .await;
        assert_problem(&misdirected, 421);
        let rebound = api
            .call(Method::GET, "/ui/", None, &[("host", "evil.example")])
            .await;
        assert_problem(&rebound, 421);
    })
    .await;
}
