//! Issue 20, finding 7, with a real Envoy 1.40 on its unified mux
//! (`envoy.reloadable_features.unified_mux`): after Envoy refuses an EDS update, its requests of
//! that type carry the nonce of the last response it *accepted* (a stale nonce). Such a request
//! is neither an ACK nor a NACK, but the subscription it carries counts: a cluster added then
//! gets its endpoints.

use super::*;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

fn eds_cluster(name: &str) -> Value {
    json!({"op": "put", "type": "cluster", "name": name, "variants": [{"resource": {
        "@type": CLUSTER, "name": name, "type": "EDS", "connect_timeout": "1s",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}}}}]})
}

/// `name`'s endpoints: one at `address`:`port`.
fn endpoints(name: &str, address: &str, port: u16) -> Value {
    json!({"op": "put", "type": "endpoint", "name": name, "variants": [{"resource": {
        "@type": ENDPOINT, "cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": address, "port_value": port}}}}]}]}}]})
}

/// Envoy's admin `/clusters` text; empty while it does not answer.
async fn clusters_text(client: &reqwest::Client, admin_port: u16) -> String {
    match client
        .get(format!("http://127.0.0.1:{admin_port}/clusters"))
        .send()
        .await
    {
        Ok(response) => response.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

/// Whether `/clusters` shows host `host` in cluster `cluster` (an active cluster: a warming
/// one is not listed).
async fn has_host(client: &reqwest::Client, admin_port: u16, cluster: &str, host: &str) -> bool {
    let prefix = format!("{cluster}::{host}::");
    clusters_text(client, admin_port)
        .await
        .lines()
        .any(|l| l.starts_with(&prefix))
}

async fn stat(client: &reqwest::Client, admin_port: u16, name: &str) -> u64 {
    let Ok(response) = client
        .get(format!(
            "http://127.0.0.1:{admin_port}/stats?filter=^{name}$"
        ))
        .send()
        .await
    else {
        return 0;
    };
    let text = response.text().await.unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{what} did not happen within {within:?}");
}

/// An EDS update Envoy refuses (an endpoint address that is not an IP), then cluster `c2`
/// added: Envoy's unified mux asks for `c2`'s endpoints with the nonce of the last EDS
/// response it accepted, and `c2` gets them — well within Envoy's 15 s initial fetch timeout,
/// after which a warming cluster would go active without endpoints. `c1` leaves in the same
/// change, so the answer carries `c2` alone and the test does not rest on how Envoy treats a
/// response part of which it refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unified_mux_stale_nonce_requests_after_an_eds_nack_are_honoured() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let client = reqwest::Client::new();
    apply(
        &client,
        &admin,
        vec![eds_cluster("c1"), endpoints("c1", "127.0.0.1", 9)],
    )
    .await;
    let mut bootstrap = envoy_bootstrap("envoy-unified", Ads::Sotw, xds_port, json!({}), "none");
    with_mux(&mut bootstrap, Mux::Unified);
    let envoy_admin = bootstrap["admin"]["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap() as u16;
    let _envoy = spawn_envoy(dir.path(), "envoy-unified", &bootstrap);
    eventually("c1 with its endpoint in Envoy", WAIT, || {
        has_host(&client, envoy_admin, "c1", "127.0.0.1:9")
    })
    .await;
    let runtime: Value = client
        .get(format!("http://127.0.0.1:{envoy_admin}/runtime"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        runtime["entries"]["envoy.reloadable_features.unified_mux"]["final_value"], "true",
        "Envoy runs its unified mux: {runtime}"
    );

    // Endpoints Envoy refuses: from now on its EDS requests carry a stale nonce.
    apply(&client, &admin, vec![endpoints("c1", "not-an-ip", 9)]).await;
    eventually("Envoy refusing c1's endpoints", WAIT, || {
        let client = &client;
        async move { stat(client, envoy_admin, "cluster.c1.update_rejected").await > 0 }
    })
    .await;

    apply(
        &client,
        &admin,
        vec![
            json!({"op": "delete", "type": "cluster", "name": "c1"}),
            eds_cluster("c2"),
            endpoints("c2", "127.0.0.1", 10),
        ],
    )
    .await;
    eventually(
        "c2 with its endpoint in Envoy",
        Duration::from_secs(10),
        || has_host(&client, envoy_admin, "c2", "127.0.0.1:10"),
    )
    .await;
}
