//! Impact preview end to end: two `vxds serve` replicas on one Postgres database, gRPC clients
//! with different parameters on each; a dry run on one replica counts the other's clients
//! (published through the store), `vxds apply --dry-run` prints them as a table, and a replica
//! that dies stops counting once its summary expires.

use std::collections::HashMap;

use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use vxds_envoy::pb::xds::core::v3::ContextParams;
use vxds_testkit::Db;

use super::*;

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
/// How often the replicas publish their summaries in this test.
const PERIOD: &str = "200ms";

/// A connected SotW ADS stream subscribed to routes; it lives as long as the value.
struct Client {
    _requests: mpsc::Sender<DiscoveryRequest>,
    _responses: tonic::Streaming<DiscoveryResponse>,
}

/// Connects `node` with route parameters `params` to `xds`, subscribed to `names`, and
/// waits for the first response (by then the stream is registered with its subscriptions).
async fn connect(
    xds: std::net::SocketAddr,
    node: &str,
    params: &[(&str, &str)],
    names: &[&str],
) -> Client {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{xds}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let mut dynamic_parameters = HashMap::new();
    dynamic_parameters.insert(
        ROUTE.to_owned(),
        ContextParams {
            params: params
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        },
    );
    tx.send(DiscoveryRequest {
        type_url: ROUTE.into(),
        resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
        node: Some(Node {
            id: node.into(),
            cluster: "impact-test".into(),
            dynamic_parameters,
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), responses.message())
        .await
        .unwrap_or_else(|_| panic!("{node} got no response"))
        .unwrap()
        .unwrap();
    // Acknowledge it, as a client does.
    tx.send(DiscoveryRequest {
        type_url: ROUTE.into(),
        resource_names: names.iter().map(|n| (*n).to_owned()).collect(),
        version_info: first.version_info,
        response_nonce: first.nonce,
        ..Default::default()
    })
    .await
    .unwrap();
    Client {
        _requests: tx,
        _responses: responses,
    }
}

/// The changeset previewed: `local_route` loses its env=prod/version=v1 variant, its prod
/// variant gets a new body, its version=v1 variant narrows to canary; `new_route` appears.
const CHANGE: &str = r#"type: route
name: local_route
variants:
  - constraints: env != "prod" && version != "v1"
    resource:
      "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
      name: local_route
      response_headers_to_add:
        - header: {key: x-vxds-variant, value: base}
      virtual_hosts:
        - name: backend
          domains: ["*"]
          routes:
            - match: {prefix: /}
              route: {cluster: backend}
  - constraints: env = "prod" && version != "v1"
    resource:
      "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
      name: local_route
      response_headers_to_add:
        - header: {key: x-vxds-variant, value: prod-2}
      virtual_hosts:
        - name: backend
          domains: ["*"]
          routes:
            - match: {prefix: /}
              route: {cluster: backend}
  - constraints: env = "canary" && version = "v1"
    resource:
      "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
      name: local_route
      response_headers_to_add:
        - header: {key: x-vxds-variant, value: canary-v1}
      virtual_hosts:
        - name: backend
          domains: ["*"]
          routes:
            - match: {prefix: /}
              route: {cluster: backend}
---
type: route
name: new_route
variants:
  - resource:
      "@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration
      name: new_route
"#;

async fn post_impact(client: &reqwest::Client, admin: &str, body: &Value) -> Value {
    let response = client
        .post(format!("{admin}/v1/impact"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// The constraints text the server shows for each stored variant of `local_route`.
async fn stored_texts(client: &reqwest::Client, admin: &str) -> Vec<String> {
    let resource: Value = client
        .get(format!("{admin}/v1/resources/route/local_route"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    resource["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["constraints_text"].as_str().unwrap().to_owned())
        .collect()
}

fn resource<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["impact"]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no impact for {name}: {report:#}"))
}

/// The moves as (kind, from, to, streams, samples).
fn moves(resource: &Value) -> Vec<(String, Value, Value, u64, Vec<String>)> {
    resource["moves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["kind"].as_str().unwrap().to_owned(),
                m["from"].clone(),
                m["to"].clone(),
                m["streams"].as_u64().unwrap(),
                m["sample_nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|n| n.as_str().unwrap().to_owned())
                    .collect(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_on_one_replica_counts_the_clients_of_every_replica() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let db = vxds_testkit::TestDb::fresh(Db::Postgres).await;
    let (dir_a, dir_b, dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let args = |id: &'static str| ["--replica-id", id, "--client-summary-period", PERIOD];
    let a = ServeProcess::start_on(
        binary,
        dir_a.path(),
        &db.url,
        "127.0.0.1:0",
        &args("replica-a"),
    )
    .unwrap();
    let mut b = ServeProcess::start_on(
        binary,
        dir_b.path(),
        &db.url,
        "127.0.0.1:0",
        &args("replica-b"),
    )
    .unwrap();
    let fixtures = fixtures();
    let applied = run(&[
        "apply",
        "-f",
        fixtures.to_str().unwrap(),
        "--server",
        &a.admin_url,
    ]);
    assert!(applied.status.success(), "{}", stderr(&applied));

    // Three clients on each replica, over the nine kinds of client of the fixtures, and one on
    // B that waits for a route that does not exist yet.
    let local = ["local_route"];
    let _clients = [
        connect(
            a.xds_addr,
            "a-prod-v1",
            &[("env", "prod"), ("version", "v1")],
            &local,
        )
        .await,
        connect(
            a.xds_addr,
            "a-prod-v2",
            &[("env", "prod"), ("version", "v2")],
            &local,
        )
        .await,
        connect(
            a.xds_addr,
            "a-test-v2",
            &[("env", "test"), ("version", "v2")],
            &local,
        )
        .await,
        connect(
            b.xds_addr,
            "b-prod-v3",
            &[("env", "prod"), ("version", "v3")],
            &local,
        )
        .await,
        connect(
            b.xds_addr,
            "b-canary-v1",
            &[("env", "canary"), ("version", "v1")],
            &local,
        )
        .await,
        connect(
            b.xds_addr,
            "b-test-v3",
            &[("env", "test"), ("version", "v3")],
            &local,
        )
        .await,
        connect(b.xds_addr, "b-new", &[("env", "test")], &["new_route"]).await,
    ];

    let change = dir.path().join("change.yaml");
    std::fs::write(&change, CHANGE).unwrap();
    let texts = stored_texts(&reqwest::Client::new(), &a.admin_url).await;
    // Stored order: base, prod, v1, prod-v1.
    let (prod, v1, prod_v1) = (&texts[1], &texts[2], &texts[3]);

    // The same request `vxds apply` sends, to the impact endpoint: A answers, with B's
    // clients once B has published them.
    let client = reqwest::Client::new();
    let body: Value = json!({"operations": [
        {"op": "put", "type": "route", "name": "local_route", "variants": serde_norway::from_str::<Value>(CHANGE.split("---").next().unwrap()).unwrap()["variants"]},
        {"op": "put", "type": "route", "name": "new_route", "variants": [{"resource": {"@type": ROUTE, "name": "new_route"}}]},
    ]});
    let deadline = Instant::now() + Duration::from_secs(15);
    let report = loop {
        let report = post_impact(&client, &a.admin_url, &body).await;
        if report["impact"]["streams"] == 7 {
            break report;
        }
        assert!(
            Instant::now() < deadline,
            "B's clients never counted: {report:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(report["dry_run"], true);
    let replicas: Vec<(&str, u64, bool)> = report["impact"]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["replica_id"].as_str().unwrap(),
                r["streams"].as_u64().unwrap(),
                r["local"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(replicas, [("replica-a", 3, true), ("replica-b", 4, false)]);

    let local_route = resource(&report, "local_route");
    assert_eq!(local_route["change"], "updated");
    assert_eq!(local_route["streams"], 6);
    assert_eq!(local_route["unchanged"], 2, "{local_route:#}");
    assert_eq!(local_route["unmatched"], 0);
    assert_eq!(local_route["affected"], 4);
    let canary = moves(local_route)
        .iter()
        .find(|m| m.0 == "switch")
        .map(|m| m.2.as_str().unwrap().to_owned())
        .unwrap();
    assert!(canary.contains("canary"), "{canary}");
    assert_eq!(
        moves(local_route),
        [
            (
                "switch".to_owned(),
                json!(v1),
                json!(canary),
                1,
                vec!["b-canary-v1".to_owned()]
            ),
            (
                "update".to_owned(),
                json!(prod),
                json!(prod),
                2,
                vec!["a-prod-v2".to_owned(), "b-prod-v3".to_owned()]
            ),
            (
                "lose".to_owned(),
                json!(prod_v1),
                Value::Null,
                1,
                vec!["a-prod-v1".to_owned()]
            ),
        ]
    );
    let new_route = resource(&report, "new_route");
    assert_eq!(new_route["change"], "created");
    assert_eq!(
        moves(new_route),
        [(
            "gain".to_owned(),
            Value::Null,
            json!("*"),
            1,
            vec!["b-new".to_owned()]
        )]
    );

    // The CLI on B: the same figures, as a table; B counts A's clients.
    let dry = vxds()
        .args([
            "apply",
            "--dry-run",
            "-f",
            change.to_str().unwrap(),
            "--server",
            &b.admin_url,
        ])
        .output()
        .unwrap();
    assert!(dry.status.success(), "{}", stderr(&dry));
    let text = stdout(&dry);
    eprintln!("{text}");
    assert!(text.contains("(dry run: nothing written)"), "{text}");
    assert!(
        text.contains("impact on 7 streams connected over 2 replicas (replica-b 4, replica-a 3)"),
        "{text}"
    );
    let row = |needle: &str| {
        text.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no row with {needle}:\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert!(
        row("a-prod-v1").starts_with("route local_route lose"),
        "{text}"
    );
    assert!(row("a-prod-v1").ends_with("- 1 a-prod-v1"), "{text}");
    assert!(
        row("b-canary-v1").starts_with("route local_route switch"),
        "{text}"
    );
    assert!(
        row("a-prod-v2").ends_with("2 a-prod-v2, b-prod-v3"),
        "{text}"
    );
    assert!(
        row("b-new").starts_with("route new_route gain - * 1 b-new"),
        "{text}"
    );
    assert_eq!(row("unchanged"), "route local_route unchanged 2");
    // Nothing was written.
    assert_eq!(stored_texts(&client, &a.admin_url).await, texts);

    // B dies without withdrawing its summary: A stops counting its clients once it expires
    // (three periods), not before the first.
    b.child.kill().unwrap();
    b.child.wait().unwrap();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(10);
    loop {
        let report = post_impact(&client, &a.admin_url, &body).await;
        if report["impact"]["streams"] == 3 {
            assert_eq!(report["impact"]["replicas"].as_array().unwrap().len(), 1);
            assert_eq!(resource(&report, "local_route")["streams"], 3);
            assert!(moves(resource(&report, "new_route")).is_empty());
            break;
        }
        assert!(
            Instant::now() < deadline,
            "B's summary never expired: {report:#}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        killed.elapsed() >= Duration::from_millis(200),
        "B dropped out before its summary could expire"
    );
    drop(a);
    db.remove().await;
}

/// On SQLite the one server publishes too: `vxds apply --dry-run --database-url` (the admin
/// API in-process, no xDS server of its own) counts the server's clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_straight_on_sqlite_counts_the_servers_clients() {
    let dir = tempfile::tempdir().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let server =
        ServeProcess::start(binary, dir.path(), &["--client-summary-period", PERIOD]).unwrap();
    let database = format!("sqlite://{}", dir.path().join("vxds.db").display());
    let fixtures = fixtures();
    let applied = run(&[
        "apply",
        "-f",
        fixtures.to_str().unwrap(),
        "--database-url",
        &database,
    ]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    let _client = connect(
        server.xds_addr,
        "sqlite-prod-v1",
        &[("env", "prod"), ("version", "v1")],
        &["local_route"],
    )
    .await;
    let change = dir.path().join("change.yaml");
    std::fs::write(&change, CHANGE).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let dry = run(&[
            "apply",
            "--dry-run",
            "-f",
            change.to_str().unwrap(),
            "--database-url",
            &database,
        ]);
        assert!(dry.status.success(), "{}", stderr(&dry));
        let text = stdout(&dry);
        if text.contains("sqlite-prod-v1") {
            assert!(
                text.contains("impact on 1 stream connected over 1 replica"),
                "{text}"
            );
            let row = text.lines().find(|l| l.contains("sqlite-prod-v1")).unwrap();
            assert!(row.split_whitespace().nth(2) == Some("lose"), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server's client never counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
