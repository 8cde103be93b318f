//! Real Envoys through what once lost them configuration: on-demand CDS on top of the Delta
//! legacy wildcard, and an xDS connection cut and restored.

use super::*;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// A listener whose routes send `/od` to the cluster named by the `x-cluster` header,
/// discovered on demand (ODCDS over ADS), and everything else to `backend`.
fn on_demand_listener(port: u16) -> Value {
    json!({"op": "put", "type": "listener", "name": "http", "variants": [{"resource": {
        "@type": LISTENER,
        "name": "http",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "http",
            "route_config": {
                "name": "inline",
                "response_headers_to_add": [{"header": {"key": "x-vxds-variant", "value": "od"}}],
                "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/od"}, "route": {"cluster_header": "x-cluster"}},
                    {"match": {"prefix": "/"}, "route": {"cluster": "backend"}},
                ]}],
            },
            "http_filters": [
                {"name": "envoy.filters.http.on_demand", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.on_demand.v3.OnDemand",
                    "odcds": {"source": {"ads": {}, "resource_api_version": "V3"}, "timeout": "2s"},
                }},
                {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
            ],
        }}]}],
    }}]})
}

/// A cluster `name` with its endpoints on `port`, as changeset operations.
fn cluster_to(name: &str, port: u16) -> Vec<Value> {
    backend(port)
        .into_iter()
        .map(|op| {
            let text = op
                .to_string()
                .replace("\"backend\"", &format!("\"{name}\""));
            serde_json::from_str(&text).unwrap()
        })
        .collect()
}

async fn get(client: &reqwest::Client, port: u16, path: &str, cluster: Option<&str>) -> u16 {
    let mut request = client.get(format!("http://127.0.0.1:{port}{path}"));
    if let Some(cluster) = cluster {
        request = request.header("x-cluster", cluster);
    }
    match request.send().await {
        Ok(response) => response.status().as_u16(),
        Err(_) => 0,
    }
}

/// The dynamic clusters an Envoy holds, from its `/config_dump`.
async fn envoy_clusters(client: &reqwest::Client, admin_port: u16) -> Vec<String> {
    let dump = get_json(
        client,
        &format!("http://127.0.0.1:{admin_port}/config_dump?resource=dynamic_active_clusters"),
    )
    .await;
    let mut names: Vec<String> = dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["cluster"]["name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

/// Envoy's admin port, read from the bootstrap `start_envoy` wrote.
fn envoy_admin_port(dir: &Path, name: &str) -> u16 {
    let bootstrap: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    bootstrap["admin"]["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap() as u16
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_envoy_keeps_its_wildcard_clusters_through_on_demand_cds() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let backend_port = start_backend().await;
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let port = free_port();
    let client = reqwest::Client::new();
    let mut ops = backend(backend_port);
    ops.extend(cluster_to("other", backend_port));
    ops.push(on_demand_listener(port));
    apply(&client, &admin, ops).await;

    let _envoy = start_envoy(dir.path(), "envoy-odcds", Ads::Delta, xds_port, "prod", "a");
    let envoy_admin = envoy_admin_port(dir.path(), "envoy-odcds");
    wait_for_variant(&client, port, "od").await;
    assert_eq!(
        envoy_clusters(&client, envoy_admin).await,
        ["backend", "other"]
    );

    // A request for a cluster Envoy does not have: it subscribes to it by name, on the CDS
    // stream that holds the legacy wildcard. The cluster does not exist yet.
    let status = get(&client, port, "/od", Some("late")).await;
    assert_ne!(status, 200);
    let deadline = Instant::now() + WAIT;
    loop {
        let clients = get_json(&client, &format!("{admin}/v1/clients")).await;
        let cds = clients["clients"][0]["types"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type_url"] == CLUSTER)
            .cloned()
            .unwrap_or_default();
        if cds["subscriptions"]
            .as_array()
            .is_some_and(|s| s.iter().any(|n| n == "late"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy never asked for `late`: {clients}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Nothing of the wildcard was taken away: Envoy still routes through `backend`.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        envoy_clusters(&client, envoy_admin).await,
        ["backend", "other"]
    );
    assert_eq!(get(&client, port, "/", None).await, 200);
    // And a cluster that exists gets there, on demand too.
    assert_eq!(get(&client, port, "/od", Some("other")).await, 200);
    apply(&client, &admin, cluster_to("late", backend_port)).await;
    let deadline = Instant::now() + WAIT;
    while get(&client, port, "/od", Some("late")).await != 200 {
        assert!(
            Instant::now() < deadline,
            "the on-demand cluster never arrived"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        envoy_clusters(&client, envoy_admin).await,
        ["backend", "late", "other"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_envoy_rides_out_an_xds_reconnect_and_is_not_sent_its_resources_again() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let backend_port = start_backend().await;
    let (vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let (port_a, port_b) = (free_port(), free_port());
    let client = reqwest::Client::new();
    let mut ops = backend(backend_port);
    ops.push(listener(port_a, port_b));
    ops.push(routes("prod", "test"));
    apply(&client, &admin, ops).await;
    let _envoy = start_envoy(
        dir.path(),
        "envoy-reconnect",
        Ads::Delta,
        xds_port,
        "prod",
        "a",
    );
    wait_for_variant(&client, port_a, "prod").await;

    // The control plane goes away (killed: no goodbye) and comes back on the same address.
    drop(vxds);
    let traffic = {
        let client = client.clone();
        tokio::spawn(async move {
            let mut failures = Vec::new();
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                let status = get(&client, port_a, "/", None).await;
                if status != 200 {
                    failures.push(status);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            failures
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let again =
        ServeProcess::start_at(binary, dir.path(), &format!("127.0.0.1:{xds_port}"), &[]).unwrap();
    let failures = traffic.await.unwrap();
    assert!(
        failures.is_empty(),
        "requests failed during the outage: {failures:?}"
    );

    // Envoy reconnects with what it holds; the server sends none of it again.
    let deadline = Instant::now() + WAIT;
    let acked_types = loop {
        let clients = get_json(&client, &format!("{}/v1/clients", again.admin_url)).await;
        let types = clients["clients"]
            .as_array()
            .and_then(|c| c.first())
            .map(|c| c["types"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default();
        if types.len() >= 4 {
            break types;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy never came back: {clients}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let metrics = metrics_text(&client, &again.admin_url).await;
    assert_eq!(
        sample_sum(&metrics, "vxds_xds_responses_total"),
        0.0,
        "{metrics}\n{acked_types:?}"
    );
    assert_eq!(get(&client, port_a, "/", None).await, 200);
    // Still live: an update reaches it over the new stream.
    let put = client
        .put(format!(
            "{}/v1/resources/route/local_route",
            again.admin_url
        ))
        .json(&json!({"variants": routes("prod-2", "test-2")["variants"]}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    wait_for_variant(&client, port_a, "prod-2").await;
}
