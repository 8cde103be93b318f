//! Resource TTL with a real Envoy 1.40: an RTDS layer and a cluster with `ttl: 2s` stay while
//! vxds is up — through a refused unrelated update, a vxds restart and (Delta) a glob
//! subscription — and go (Envoy drops them) within the TTL once vxds is killed.

use vxds_testkit::proxy::TcpProxy;

use super::*;

const RUNTIME: &str = "type.googleapis.com/envoy.service.runtime.v3.Runtime";
const TTL: Duration = Duration::from_secs(2);

/// An Envoy whose runtime has a static layer and an RTDS layer `flags` over ADS.
fn start_runtime_envoy(
    dir: &Path,
    name: &'static str,
    ads: Ads,
    mux: Mux,
    xds_port: u16,
) -> (Process, u16) {
    let mut bootstrap = envoy_bootstrap(name, ads, xds_port, json!({}), "none");
    bootstrap["layered_runtime"] = json!({"layers": [
        {"name": "static", "static_layer": {"vxds.flag": "static"}},
        {"name": "rtds", "rtds_layer": {"name": "flags", "rtds_config": {"ads": {}, "resource_api_version": "V3"}}},
    ]});
    with_mux(&mut bootstrap, mux);
    let admin_port = bootstrap["admin"]["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap() as u16;
    (spawn_envoy(dir, name, &bootstrap), admin_port)
}

/// Whether the vxds at `admin` has a stream of `node`.
async fn serves_node(client: &reqwest::Client, admin: &str, node: &str) -> bool {
    let request = client.get(format!("{admin}/v1/clients"));
    let Ok(response) = request.timeout(Duration::from_secs(2)).send().await else {
        return false;
    };
    let clients: Value = response.json().await.unwrap_or_default();
    (clients["clients"].as_array().into_iter().flatten()).any(|c| c["node_id"] == node)
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

// ---- issue 20: TTLs survive refusals, restarts and globs -----------------------------------

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const GLOB_MEMBER: &str = "xdstp://vxds/envoy.config.cluster.v3.Cluster/ttl/g";
const GLOB: &str = "xdstp://vxds/envoy.config.cluster.v3.Cluster/ttl/*";

fn static_cluster(name: &str, ttl: Option<&str>) -> Value {
    let mut variant = json!({"resource": {"@type": CLUSTER, "name": name, "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 9}}}}]}]}}});
    if let Some(ttl) = ttl {
        variant["ttl"] = json!(ttl);
    }
    json!({"op": "put", "type": "cluster", "name": name, "variants": [variant]})
}

/// The names of the clusters Envoy has (its admin `/clusters`); empty while it does not answer.
async fn envoy_clusters(client: &reqwest::Client, admin_port: u16) -> Vec<String> {
    let Ok(response) = client
        .get(format!("http://127.0.0.1:{admin_port}/clusters"))
        .send()
        .await
    else {
        return vec![];
    };
    let text = response.text().await.unwrap_or_default();
    let mut names: Vec<String> = text
        .lines()
        .filter_map(|l| l.split("::").next())
        .map(str::to_owned)
        .collect();
    names.dedup();
    names
}

/// An Envoy stat (admin `/stats`), 0 when absent.
async fn envoy_stat(client: &reqwest::Client, admin_port: u16, name: &str) -> u64 {
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

async fn wait_until<F, Fut>(what: &str, within: Duration, mut check: F)
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

/// A Delta Envoy that takes its clusters through the glob `GLOB` (and nothing else).
fn start_glob_envoy(dir: &Path, mux: Mux, xds_port: u16) -> (Process, u16) {
    let mut bootstrap = envoy_bootstrap("envoy-glob", Ads::Delta, xds_port, json!({}), "none");
    with_mux(&mut bootstrap, mux);
    let dynamic = bootstrap["dynamic_resources"].as_object_mut().unwrap();
    dynamic.remove("lds_config");
    dynamic.insert("cds_resources_locator".into(), json!(GLOB));
    let admin_port = bootstrap["admin"]["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap() as u16;
    (spawn_envoy(dir, "envoy-glob", &bootstrap), admin_port)
}

/// Issue 20: an RTDS layer and a cluster with a 2 s TTL stay in Envoy for 20 s while vxds is
/// up — through a refused unrelated update (which holds back no unrelated deletion), through
/// a vxds restart, and (Delta) when subscribed through a glob — and are gone within the TTL
/// once vxds is killed.
async fn ttl_resources_live_through_refusals_and_restarts(ads: Ads, mux: Mux) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    // Heartbeats at a quarter of the TTL: a restart (process start, Envoy's reconnect backoff)
    // fits in what is left of the TTL after the last one.
    let args = ["--xds-heartbeat-fraction", "0.25"];
    let (vxds, admin, xds_port) = start_vxds(dir.path(), &args);
    let client = reqwest::Client::new();
    apply(
        &client,
        &admin,
        vec![
            json!({"op": "put", "type": "runtime", "name": "flags", "variants": [{
                "ttl": "2s",
                "resource": {"@type": RUNTIME, "name": "flags", "layer": {"vxds.flag": "dynamic"}},
            }]}),
            static_cluster("ttl-c", Some("2s")),
            static_cluster("doomed", None),
            static_cluster(GLOB_MEMBER, Some("2s")),
        ],
    )
    .await;
    let (_envoy, envoy_admin) = start_runtime_envoy(dir.path(), "envoy-ttl", ads, mux, xds_port);
    let glob = matches!(ads, Ads::Delta).then(|| start_glob_envoy(dir.path(), mux, xds_port));
    wait_for_flag(&client, envoy_admin, "dynamic", WAIT).await;
    wait_until("ttl-c and doomed in Envoy", WAIT, || async {
        let clusters = envoy_clusters(&client, envoy_admin).await;
        clusters.iter().any(|c| c == "ttl-c") && clusters.iter().any(|c| c == "doomed")
    })
    .await;
    if let Some((_, glob_admin)) = &glob {
        wait_until("the glob member in Envoy", WAIT, || async {
            envoy_clusters(&client, *glob_admin)
                .await
                .iter()
                .any(|c| c == GLOB_MEMBER)
        })
        .await;
    }

    // A listener Envoy refuses (a malformed address), for good.
    apply(
        &client,
        &admin,
        vec![json!({"op": "put", "type": "listener", "name": "refused", "variants": [{"resource": {
            "@type": LISTENER, "name": "refused",
            "address": {"socket_address": {"address": "not-an-ip", "port_value": 1}},
            "filter_chains": [{"filters": [{"name": "tcp", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                "stat_prefix": "t", "cluster": "ttl-c"}}]}]}}]})],
    )
    .await;
    wait_until("Envoy refusing the listener", WAIT, || async {
        envoy_stat(&client, envoy_admin, "listener_manager.lds.update_rejected").await > 0
    })
    .await;
    // The refusal holds back no deletion nothing accepted needs.
    apply(
        &client,
        &admin,
        vec![json!({"op": "delete", "type": "cluster", "name": "doomed"})],
    )
    .await;
    wait_until(
        "doomed removed despite the refusal",
        Duration::from_secs(5),
        || async {
            let clusters = envoy_clusters(&client, envoy_admin).await;
            !clusters.is_empty() && !clusters.iter().any(|c| c == "doomed")
        },
    )
    .await;

    // 20 s, with a restart of vxds in the middle: the layer and the cluster never lapse.
    let mut vxds = Some(vxds);
    let start = Instant::now();
    let mut restarted = false;
    // While the old process is dead and the new one starting, and until Envoy reconnects
    // (its own jittered backoff: seconds on a loaded machine), vxds is not up for it: a TTL
    // (2 s) may run out there; Envoy gets it back at reconnect, within a second of it.
    let mut down_until: Option<Instant> = None;
    // At least 8 s (four TTLs) are checked after Envoy reconnects, however late it does.
    let mut end = start + Duration::from_secs(20);
    while Instant::now() < end {
        if down_until.is_some_and(|t| Instant::now() < t) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if !restarted && start.elapsed() > Duration::from_secs(8) {
            let mut old = vxds.take().unwrap();
            old.child.kill().unwrap();
            old.child.wait().unwrap();
            let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
            vxds = Some(
                ServeProcess::start_at(binary, dir.path(), &format!("127.0.0.1:{xds_port}"), &args)
                    .unwrap(),
            );
            restarted = true;
            let again = &vxds.as_ref().unwrap().admin_url;
            let deadline = Instant::now() + WAIT;
            let nodes: &[&str] = if glob.is_some() {
                &["envoy-ttl", "envoy-glob"]
            } else {
                &["envoy-ttl"]
            };
            for node in nodes {
                while !serves_node(&client, again, node).await {
                    assert!(Instant::now() < deadline, "{node} never reconnected");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            down_until = Some(Instant::now() + Duration::from_secs(1));
            end = end.max(Instant::now() + Duration::from_secs(8));
            continue;
        }
        assert_eq!(
            runtime_flag(&client, envoy_admin).await.as_deref(),
            Some("dynamic"),
            "the TTL'd layer lapsed while vxds was up ({:?} in)",
            start.elapsed()
        );
        let clusters = envoy_clusters(&client, envoy_admin).await;
        assert!(
            clusters.iter().any(|c| c == "ttl-c"),
            "the TTL'd cluster lapsed while vxds was up ({:?} in): {clusters:?}",
            start.elapsed()
        );
        if let Some((_, glob_admin)) = &glob {
            let clusters = envoy_clusters(&client, *glob_admin).await;
            assert!(clusters.iter().any(|c| c == GLOB_MEMBER), "{clusters:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if let Some((_, glob_admin)) = &glob {
        // No heartbeat Envoy cannot take: the glob subscriber refused nothing.
        assert_eq!(
            envoy_stat(&client, *glob_admin, "cluster_manager.cds.update_rejected").await,
            0
        );
    }

    // vxds dies without a goodbye: the layer and the cluster go within the TTL.
    let mut last = vxds.take().unwrap();
    last.child.kill().unwrap();
    last.child.wait().unwrap();
    wait_for_flag(
        &client,
        envoy_admin,
        "static",
        TTL + Duration::from_millis(500),
    )
    .await;
    wait_until(
        "the TTL'd cluster gone after the kill",
        TTL + Duration::from_millis(500),
        || async {
            let clusters = envoy_clusters(&client, envoy_admin).await;
            !clusters.is_empty() && !clusters.iter().any(|c| c == "ttl-c")
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_ttl_resources_live_through_refusals_restarts_and_globs() {
    ttl_resources_live_through_refusals_and_restarts(Ads::Delta, Mux::Default).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_ttl_resources_live_through_refusals_and_restarts() {
    ttl_resources_live_through_refusals_and_restarts(Ads::Sotw, Mux::Default).await;
}

/// The same with Envoy's unified mux (`envoy.reloadable_features.unified_mux`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_ttl_resources_live_through_refusals_restarts_and_globs_unified_mux() {
    ttl_resources_live_through_refusals_and_restarts(Ads::Delta, Mux::Unified).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_ttl_resources_live_through_refusals_and_restarts_unified_mux() {
    ttl_resources_live_through_refusals_and_restarts(Ads::Sotw, Mux::Unified).await;
}

/// A network stall longer than the TTL: Envoy drops the TTL'd cluster, then refuses the
/// bodiless heartbeats that arrive when the stream recovers (it holds nothing to renew). vxds
/// takes the refusal as the lapse it is and sends the cluster again in full: it is back at
/// once, not at the next change of it. SotW heartbeats carry bodies and restore it anyway.
async fn a_ttl_cluster_that_lapsed_in_a_stall_comes_back(ads: Ads, mux: Mux) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let stall = TcpProxy::start(format!("127.0.0.1:{xds_port}").parse().unwrap())
        .await
        .unwrap();
    let client = reqwest::Client::new();
    apply(&client, &admin, vec![static_cluster("ttl-c", Some("2s"))]).await;
    let (_envoy, envoy_admin) =
        start_runtime_envoy(dir.path(), "envoy-stall", ads, mux, stall.addr.port());
    let has_cluster = || async {
        envoy_clusters(&client, envoy_admin)
            .await
            .iter()
            .any(|c| c == "ttl-c")
    };
    wait_until("ttl-c in Envoy", WAIT, has_cluster).await;

    stall.pause();
    wait_until("ttl-c lapsed in the stall", TTL * 3, || async {
        !has_cluster().await
    })
    .await;
    stall.unpause();
    wait_until(
        "ttl-c back after the stall",
        Duration::from_secs(5),
        has_cluster,
    )
    .await;
    if matches!(ads, Ads::Delta) {
        // Over the same stream: Envoy refused a bodiless heartbeat of what it had dropped
        // (a reconnect would not report it, and would get it in full anyway).
        assert!(envoy_stat(&client, envoy_admin, "cluster_manager.cds.update_rejected").await >= 1);
    }
    // And it stays: renewed again from then on.
    let start = Instant::now();
    while start.elapsed() < TTL * 3 {
        assert!(has_cluster().await, "ttl-c lapsed again after the stall");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_a_ttl_cluster_that_lapsed_in_a_stall_comes_back() {
    a_ttl_cluster_that_lapsed_in_a_stall_comes_back(Ads::Delta, Mux::Default).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delta_a_ttl_cluster_that_lapsed_in_a_stall_comes_back_unified_mux() {
    a_ttl_cluster_that_lapsed_in_a_stall_comes_back(Ads::Delta, Mux::Unified).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sotw_a_ttl_cluster_that_lapsed_in_a_stall_comes_back() {
    a_ttl_cluster_that_lapsed_in_a_stall_comes_back(Ads::Sotw, Mux::Default).await;
}
