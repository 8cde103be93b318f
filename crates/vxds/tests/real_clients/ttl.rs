//! Resource TTL with a real Envoy 1.40: an RTDS layer with `ttl: 2s` stays while vxds sends
//! heartbeats, and falls back (Envoy drops the layer) within the TTL once vxds is killed.

use super::*;

const RUNTIME: &str = "type.googleapis.com/envoy.service.runtime.v3.Runtime";
const TTL: Duration = Duration::from_secs(2);

/// An Envoy whose runtime has a static layer and an RTDS layer `flags` over ADS.
fn start_runtime_envoy(dir: &Path, name: &'static str, ads: Ads, xds_port: u16) -> (Process, u16) {
    let mut bootstrap = envoy_bootstrap(name, ads, xds_port, json!({}), "none");
    bootstrap["layered_runtime"] = json!({"layers": [
        {"name": "static", "static_layer": {"vxds.flag": "static"}},
        {"name": "rtds", "rtds_layer": {"name": "flags", "rtds_config": {"ads": {}, "resource_api_version": "V3"}}},
    ]});
    let admin_port = bootstrap["admin"]["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap() as u16;
    (spawn_envoy(dir, name, &bootstrap), admin_port)
}

/// `vxds.flag` as Envoy's admin `/runtime` shows it; `None` while Envoy does not answer.
async fn runtime_flag(client: &reqwest::Client, admin_port: u16) -> Option<String> {
    let response = client
        .get(format!("http://127.0.0.1:{admin_port}/runtime"))
        .send()
        .await
        .ok()?;
    let json: Value = response.json().await.ok()?;
    json["entries"]["vxds.flag"]["final_value"]
        .as_str()
        .map(str::to_owned)
}

async fn wait_for_flag(client: &reqwest::Client, admin_port: u16, value: &str, within: Duration) {
    let deadline = Instant::now() + within;
    let mut last = None;
    while Instant::now() < deadline {
        last = runtime_flag(client, admin_port).await;
        if last.as_deref() == Some(value) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("vxds.flag never became {value:?} within {within:?}; last: {last:?}");
}

async fn an_rtds_layer_lives_by_heartbeats_and_expires_without_them(ads: Ads) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (mut vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let client = reqwest::Client::new();
    apply(
        &client,
        &admin,
        vec![
            json!({"op": "put", "type": "runtime", "name": "flags", "variants": [{
                "ttl": "2s",
                "resource": {"@type": RUNTIME, "name": "flags", "layer": {"vxds.flag": "dynamic"}},
            }]}),
        ],
    )
    .await;
    let (_envoy, envoy_admin) = start_runtime_envoy(dir.path(), "envoy-rtds", ads, xds_port);
    wait_for_flag(&client, envoy_admin, "dynamic", WAIT).await;

    // Three TTLs long, the value holds: heartbeats (every TTL/2) keep it alive.
    let until = Instant::now() + 3 * TTL;
    while Instant::now() < until {
        assert_eq!(
            runtime_flag(&client, envoy_admin).await.as_deref(),
            Some("dynamic"),
            "the TTL'd layer lapsed while vxds was serving"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let heartbeats = metrics_text(&client, &admin).await;
    assert!(
        sample_sum(&heartbeats, "vxds_xds_heartbeats_total") >= 4.0,
        "{heartbeats}"
    );

    // vxds dies without a goodbye: Envoy drops the layer when its TTL runs out.
    vxds.child.kill().unwrap();
    vxds.child.wait().unwrap();
    let killed = Instant::now();
    // The last heartbeat came before the kill, so the layer lapses within the TTL of it (the
    // slack is the polling and Envoy's TTL timer granularity).
    wait_for_flag(
        &client,
        envoy_admin,
        "static",
        TTL + Duration::from_millis(500),
    )
    .await;
    eprintln!("fell back {:?} after the kill", killed.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_envoy_drops_a_ttl_runtime_layer_when_vxds_stops() {
    an_rtds_layer_lives_by_heartbeats_and_expires_without_them(Ads::Delta).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_envoy_drops_a_ttl_runtime_layer_when_vxds_stops() {
    an_rtds_layer_lives_by_heartbeats_and_expires_without_them(Ads::Sotw).await;
}
