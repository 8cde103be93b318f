//! The web console in a real headless Chromium (Debian's `chromium` and `chromium-driver`,
//! installed by .ci/run), driven through WebDriver, against `vxds serve` with a token file:
//! sign in, the fixtures' `local_route` with its four variants and the coverage grid, a
//! parameter set resolved in the try box, a NACKing gRPC client's error text on the clients
//! page, a revision arriving live, and an earlier revision restored with the button.
//!
//! Without Chromium or chromedriver the test fails, naming what to install; it is never
//! skipped. `VXDS_UPDATE_SCREENSHOTS=1` writes the resource and clients pages to
//! docs/console-resource.png and docs/console-clients.png.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

#[path = "console/webdriver.rs"]
mod webdriver;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::DiscoveryRequest;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::xds::core::v3::ContextParams;
use vxds_testkit::serve::ServeProcess;
use webdriver::Driver;

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const TOKEN: &str = "console-test-write-token-0123456789";
const NACK_TEXT: &str = "route local_route refused: unknown cluster 'backend-canary'";

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

async fn rest(
    server: &ServeProcess,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> Value {
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{path}", server.admin_url))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let value: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{path}: {status} {value}");
    value
}

/// A SotW ADS client with `env=prod, version=v1` that refuses the route it is sent; the stream
/// is kept open until the returned sender is dropped.
async fn nacking_client(server: &ServeProcess) -> mpsc::Sender<DiscoveryRequest> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.xds_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut node = Node {
        id: "envoy-canary-7".into(),
        cluster: "edge".into(),
        user_agent_name: "console-test".into(),
        ..Default::default()
    };
    node.dynamic_parameters.insert(
        ROUTE.into(),
        ContextParams {
            params: [("env", "prod"), ("version", "v1")]
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        },
    );
    let (requests, rx) = mpsc::channel(4);
    requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            node: Some(node),
            resource_names: vec!["local_route".into()],
            ..Default::default()
        })
        .await
        .unwrap();
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    // The first response may come from an index a moment behind the fixtures' commit: the
    // one that carries the route follows.
    let response = loop {
        let response = tokio::time::timeout(Duration::from_secs(20), responses.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if response.resources.len() == 1 {
            break response;
        }
    };
    requests
        .send(DiscoveryRequest {
            type_url: ROUTE.into(),
            resource_names: vec!["local_route".into()],
            response_nonce: response.nonce.clone(),
            error_detail: Some(vxds_envoy::pb::google::rpc::Status {
                code: 3,
                message: NACK_TEXT.into(),
                details: vec![],
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    // Keep reading, so the stream stays healthy while the test runs.
    tokio::spawn(async move { while let Ok(Some(_)) = responses.message().await {} });
    requests
}

fn save_screenshot(png: &[u8], name: &str) {
    let target = std::env::temp_dir().join(name);
    std::fs::write(&target, png).unwrap();
    if std::env::var_os("VXDS_UPDATE_SCREENSHOTS").is_some() {
        std::fs::write(workspace().join("docs").join(name), png).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_chromium() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("write {TOKEN} operator\n")).unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let server = ServeProcess::start(
        binary,
        dir.path(),
        &["--admin-token-file", tokens.to_str().unwrap()],
    )
    .unwrap();

    // Revision 1: the fixtures.
    let applied = Command::new(binary)
        .args(["apply", "-f"])
        .arg(workspace().join("fixtures"))
        .args(["--server", &server.admin_url, "--token", TOKEN])
        .output()
        .unwrap();
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );

    let driver = Driver::start(&dir.path().join("chromedriver.log")).await;
    let browser = driver.session().await;
    let ui = format!("{}/ui/", server.admin_url);

    // Sign in: the page asks for a token, keeps it in the tab, and shows the resources.
    browser.goto(&ui).await;
    browser.wait_for("#login:not([hidden]) #token").await;
    browser.type_css("#token", TOKEN).await;
    browser.click_css("#login-button").await;
    browser
        .wait_for_text("#resource-table", "local_route")
        .await;
    browser.wait_for_text("#live", "live").await;

    // The resource page: four variants with their constraints and bodies, and the grid.
    browser
        .goto(&format!("{ui}#/resource/route/local_route"))
        .await;
    browser.wait_for_count(".variant", 4).await;
    let texts = browser.texts(".variant").await;
    assert_eq!(texts.len(), 4);
    for (text, constraints) in texts.iter().zip([
        r#"env != "prod" && version != "v1""#,
        r#"env = "prod" && version != "v1""#,
        r#"env != "prod" && version = "v1""#,
        r#"env = "prod" && version = "v1""#,
    ]) {
        assert!(text.contains(constraints), "{text}");
        assert!(text.contains("x-vxds-variant"), "the body is shown: {text}");
    }
    // env: "prod", other, absent × version: "v1", other, absent.
    browser.wait_for_count("#coverage-grid td.cell", 9).await;
    let picture: Vec<String> = browser
        .attributes("#coverage-grid td.cell", "data-variant")
        .await
        .into_iter()
        .map(Option::unwrap)
        .collect();
    // Rows: env "prod", other, absent; columns: version "v1", other, absent.
    assert_eq!(picture, ["3", "1", "1", "2", "0", "0", "2", "0", "0"]);
    let headers = browser
        .wait_for_text("#coverage-grid thead", "absent")
        .await;
    for label in [r#""v1""#, "other", "absent"] {
        assert!(headers.contains(label), "{headers}");
    }
    browser
        .wait_for_text("#uncovered-count", "every cell covered")
        .await;

    // Try parameters: env=prod, version=v1 gets the fourth variant.
    browser
        .type_css(r#"input.try-param[data-key="env"]"#, "prod")
        .await;
    browser
        .type_css(r#"input.try-param[data-key="version"]"#, "v1")
        .await;
    browser.click_css("#try-button").await;
    let chosen = browser.wait_for_text("#try-variant", "V4").await;
    assert!(
        chosen.contains(r#"env = "prod" && version = "v1""#),
        "{chosen}"
    );
    browser.wait_for("#variant-3.chosen").await;
    browser.script("window.scrollTo(0, 0)").await;
    save_screenshot(&browser.screenshot().await, "console-resource.png");
    // A cell fills the box: (absent, absent) gets the first variant.
    browser
        .click_css("#coverage-grid tbody tr:nth-child(3) td.cell:nth-of-type(3)")
        .await;
    browser.wait_for("td.cell.picked").await;
    browser.click_css("#try-button").await;
    browser.wait_for_text("#try-variant", "V1").await;

    // The clients page, live: a client connects and refuses its route; the page shows it, its
    // parameters, subscription and error text, and the event log says so as it happens.
    browser.goto(&format!("{ui}#/clients")).await;
    browser
        .wait_for_text("#clients-table", "No client is connected.")
        .await;
    let _client = nacking_client(&server).await;
    let client = browser.wait_for_text(".client", "envoy-canary-7").await;
    assert!(client.contains("env=prod, version=v1"), "{client}");
    assert!(client.contains("local_route"), "{client}");
    let nack = browser.wait_for_text(".client .nack", NACK_TEXT).await;
    assert!(nack.contains("NACK"), "{nack}");
    browser
        .wait_for_text("#event-log", "client envoy-canary-7 connected")
        .await;
    browser
        .wait_for_text(
            "#event-log",
            &format!("NACK envoy-canary-7 RouteConfiguration: {NACK_TEXT}"),
        )
        .await;
    save_screenshot(&browser.screenshot().await, "console-clients.png");

    // Revision 2 (two variants left) arrives live; then revision 1 is restored from the page.
    rest(
        &server,
        reqwest::Method::PUT,
        "/v1/resources/route/local_route?message=fewer%20variants",
        Some(json!({"variants": [
            {"constraints": r#"env = "prod""#, "resource": {"@type": ROUTE, "name": "local_route"}},
            {"constraints": r#"env != "prod""#, "resource": {"@type": ROUTE, "name": "local_route"}},
        ]})),
    )
    .await;
    browser
        .wait_for_text("#event-log", "revision 2 by operator: fewer variants")
        .await;
    browser.goto(&format!("{ui}#/revisions")).await;
    browser.wait_for("#revision-2").await;
    browser.click_css("#revision-2 .show-diff").await;
    let diff = browser
        .wait_for_text("#revision-2 .details", "local_route")
        .await;
    assert!(
        diff.contains("deleted") && diff.contains("updated"),
        "{diff}"
    );
    browser.click_css("#revision-1 .restore").await;
    let confirm = browser
        .wait_for_text("#confirm-restore", "revision 1")
        .await;
    assert!(confirm.contains("new revision"), "{confirm}");
    browser.click_css("#confirm-restore-yes").await;
    let result = browser.wait_for_text("#restore-result", "Revision 3").await;
    assert!(result.contains("Revision 3"), "{result}");
    browser.wait_for("#revision-3").await;
    browser.click_css("#revision-3 .show-diff").await;
    browser
        .wait_for_text("#revision-3 .details", "created")
        .await;
    std::fs::write(
        std::env::temp_dir().join("console-revisions.png"),
        browser.screenshot().await,
    )
    .unwrap();

    let restored = rest(
        &server,
        reqwest::Method::GET,
        "/v1/resources/route/local_route",
        None,
    )
    .await;
    assert_eq!(restored["variants"].as_array().unwrap().len(), 4);
    assert_eq!(restored["revision"], 3);
    let revision = rest(&server, reqwest::Method::GET, "/v1/revisions/3", None).await;
    assert_eq!(revision["author"], "operator");
    assert_eq!(
        revision["message"],
        "restore to revision 1: via the web console"
    );
}
