//! Replicas and their connections with a real Envoy: two `vxds serve` on one Postgres; the
//! Envoy's replica is sent SIGTERM, drains (readiness off at once, the drain in its metrics),
//! and exits 0; Envoy reconnects to the other replica and keeps serving traffic with the same
//! configuration, and follows a change made there. And a maximum connection age: a Delta Envoy
//! reconnects and resumes with what it holds, and nothing is sent again.

use vxds_testkit::{Db, TestDb};

use super::*;

/// An Envoy whose xDS cluster is every replica in `xds_ports`.
fn start_envoy_on(dir: &Path, name: &'static str, ads: Ads, xds_ports: &[u16]) -> Process {
    let mut bootstrap = envoy_bootstrap(name, ads, xds_ports[0], json!({"env": "prod"}), "a");
    let endpoints: Vec<Value> = xds_ports
        .iter()
        .map(|port| {
            json!({"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}})
        })
        .collect();
    bootstrap["static_resources"]["clusters"][0]["load_assignment"]["endpoints"] =
        json!([{ "lb_endpoints": endpoints }]);
    spawn_envoy(dir, name, &bootstrap)
}

/// The node ids a replica has streams for.
async fn nodes(client: &reqwest::Client, admin: &str) -> Vec<String> {
    let clients = get_json(client, &format!("{admin}/v1/clients")).await;
    clients["clients"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["node_id"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until the replica at `admin` serves `node`.
async fn wait_for_node(client: &reqwest::Client, admin: &str, node: &str) {
    let deadline = Instant::now() + WAIT;
    while !nodes(client, admin).await.iter().any(|n| n == node) {
        assert!(
            Instant::now() < deadline,
            "{node} never connected to {admin}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Requests through the Envoy on `port` until `stop`; the statuses that were not 200.
fn watch_traffic(
    client: &reqwest::Client,
    port: u16,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Vec<u16>>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let client = client.clone();
    let task = tokio::spawn(async move {
        let mut failures = Vec::new();
        while stopped.try_recv().is_err() {
            let status = match client.get(format!("http://127.0.0.1:{port}/")).send().await {
                Ok(response) => response.status().as_u16(),
                Err(_) => 0,
            };
            if status != 200 {
                failures.push(status);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        failures
    });
    (stop, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_moves_to_another_replica_when_its_replica_drains() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let db = TestDb::fresh(Db::Postgres).await;
    let (dir_a, dir_b, dir) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let drain = ["--drain-timeout", "2s"];
    let mut replicas = vec![
        ServeProcess::start_on(binary, dir_a.path(), &db.url, "127.0.0.1:0", &drain).unwrap(),
        ServeProcess::start_on(binary, dir_b.path(), &db.url, "127.0.0.1:0", &drain).unwrap(),
    ];
    let client = reqwest::Client::new();
    let backend_port = start_backend().await;
    let (port_a, port_b) = (free_port(), free_port());
    let mut ops = backend(backend_port);
    ops.push(listener(port_a, port_b));
    ops.push(routes("prod", "test"));
    apply(&client, &replicas[0].admin_url, ops).await;

    let ports: Vec<u16> = replicas.iter().map(|r| r.xds_addr.port()).collect();
    let _envoy = start_envoy_on(dir.path(), "envoy-failover", Ads::Delta, &ports);
    wait_for_variant(&client, port_a, "prod").await;
    // Whichever replica the Envoy chose is the one to go.
    let deadline = Instant::now() + WAIT;
    let serving = loop {
        let mut found = None;
        for (i, replica) in replicas.iter().enumerate() {
            if nodes(&client, &replica.admin_url)
                .await
                .iter()
                .any(|n| n == "envoy-failover")
            {
                found = Some(i);
            }
        }
        if let Some(i) = found {
            break i;
        }
        assert!(
            Instant::now() < deadline,
            "the Envoy connected to no replica"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut leaving = replicas.remove(serving);
    let staying = replicas.remove(0);

    let (stop_traffic, traffic) = watch_traffic(&client, port_a);
    let pid = leaving.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Readiness turns off at once, while the admin API still answers; the drain shows.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ready = client
            .get(format!("{}/readyz", leaving.admin_url))
            .send()
            .await
            .unwrap();
        if ready.status() == 503 {
            let body: Value = ready.json().await.unwrap();
            assert_eq!(body["status"], "draining");
            break;
        }
        assert!(Instant::now() < deadline, "readiness never turned off");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The drain shows in the metrics (the xDS task sets it as it starts draining).
    loop {
        let metrics = metrics_text(&client, &leaving.admin_url).await;
        if sample_sum(&metrics, "vxds_xds_draining") == 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the drain never showed: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The leaving replica finishes its drain and exits 0.
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = leaving.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the draining replica never exited"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status}");
    let log = std::fs::read_to_string(&leaving.log).unwrap();
    assert!(log.contains("xDS server draining"), "{log}");

    // The Envoy is now the other replica's, and served traffic all along.
    wait_for_node(&client, &staying.admin_url, "envoy-failover").await;
    let _ = stop_traffic.send(());
    let failures = traffic.await.unwrap();
    assert!(
        failures.is_empty(),
        "requests failed during the move: {failures:?}"
    );
    // And it follows a change made on the replica it moved to.
    let put = client
        .put(format!(
            "{}/v1/resources/route/local_route",
            staying.admin_url
        ))
        .json(&json!({"variants": routes("prod-2", "test-2")["variants"]}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    wait_for_variant(&client, port_a, "prod-2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_envoy_resumes_after_its_connection_reaches_its_maximum_age() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let backend_port = start_backend().await;
    let (vxds, admin, xds_port) = start_vxds(
        dir.path(),
        &[
            "--xds-max-connection-age",
            "3s",
            "--xds-max-connection-age-grace",
            "2s",
        ],
    );
    let client = reqwest::Client::new();
    let (port_a, port_b) = (free_port(), free_port());
    let mut ops = backend(backend_port);
    ops.push(listener(port_a, port_b));
    ops.push(routes("prod", "test"));
    apply(&client, &admin, ops).await;
    let _envoy = start_envoy(dir.path(), "envoy-aged", Ads::Delta, xds_port, "prod", "a");
    wait_for_variant(&client, port_a, "prod").await;

    // A few connection lifetimes pass: the Envoy reconnects each time and is sent nothing it
    // holds; its traffic never fails.
    let (stop_traffic, traffic) = watch_traffic(&client, port_a);
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = metrics_text(&client, &admin).await;
        let aged: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("vxds_xds_connections_closed_total{reason=\"max_age\"}"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if aged >= 2.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no connection reached its age: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for_node(&client, &admin, "envoy-aged").await;
    let _ = stop_traffic.send(());
    let failures = traffic.await.unwrap();
    assert!(
        failures.is_empty(),
        "requests failed across reconnects: {failures:?}"
    );
    let metrics = metrics_text(&client, &admin).await;
    // The first connection's responses only: one per type (clusters, endpoints, listeners,
    // routes); the reconnected streams were sent nothing again.
    assert_eq!(
        sample_sum(&metrics, "vxds_xds_responses_total"),
        4.0,
        "{metrics}"
    );
    drop(vxds);
}
