//! Safe rollouts with a real Envoy: `vxds apply --wait` exits 0 once Envoy accepted the change
//! (and serves it), 1 naming the node and Envoy's own text when it refuses one (a listener on
//! a port already in use), and with `--revert-on-nack` puts the previous state back as a new
//! revision that Envoy accepts; `vxds rollout status` of each revision agrees. A new listener
//! whose route Envoy fetches by RDS after ACKing the listener is rolled out once that route is
//! accepted, and refused when Envoy refuses the route.

use std::process::Output;

use super::*;

/// A listener `name` on `port` answering every request with `x-vxds-variant: tag`.
fn tagged_listener(name: &str, port: u16, tag: &str) -> Value {
    json!({"type": "listener", "name": name, "variants": [{"resource": {
        "@type": LISTENER,
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": name,
            "route_config": {
                "name": "inline",
                "response_headers_to_add": [{"header": {"key": "x-vxds-variant", "value": tag}}],
                "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [
                    {"match": {"prefix": "/"}, "route": {"cluster": "backend"}},
                ]}],
            },
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }}]}],
    }}]})
}

/// Runs the `vxds` CLI against the server at `admin`.
fn vxds(admin: &str, args: &[&str]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_vxds"))
        .args(args)
        .args(["--server", admin])
        .output()
        .unwrap();
    eprintln!(
        "vxds {args:?}: {:?}\n{}{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// `vxds apply -f` of `documents` (written to `dir/file`) with `extra` options.
fn apply_file(dir: &Path, admin: &str, file: &str, documents: &[Value], extra: &[&str]) -> Output {
    let path = dir.join(file);
    std::fs::write(&path, Value::from(documents.to_vec()).to_string()).unwrap();
    let mut args = vec!["apply", "-f", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    vxds(admin, &args)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The revision `apply` reported committing.
fn committed(output: &Output) -> u64 {
    let text = stdout(output);
    let line = text.lines().find(|l| l.starts_with("revision ")).unwrap();
    line["revision ".len()..]
        .split(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The variant an Envoy listener on `port` answers with now (one try).
async fn variant_now(client: &reqwest::Client, port: u16) -> String {
    match client.get(format!("http://127.0.0.1:{port}/")).send().await {
        Ok(r) => r
            .headers()
            .get("x-vxds-variant")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned(),
        Err(e) => format!("no answer: {e}"),
    }
}

/// Envoy applies an accepted listener before it ACKs it: right after `apply --wait` exits,
/// the listener answers with `tag` (a few tries, for the socket's accept, not for the push).
/// A new connection each time: one kept alive would stay on the listener Envoy replaced, which
/// serves its old configuration while it drains.
async fn serves_now(port: u16, tag: &str) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut last = String::new();
    for _ in 0..5 {
        last = variant_now(&client, port).await;
        if last == tag {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("right after the rollout, :{port} answers {last:?}, not {tag:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_waits_for_envoy_fails_on_its_refusal_and_reverts_it() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let backend_port = start_backend().await;
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let client = reqwest::Client::new();
    let port = free_port();
    let mut ops = backend(backend_port);
    let mut first = tagged_listener("http", port, "v1");
    first["op"] = json!("put");
    ops.push(first);
    apply(&client, &admin, ops).await;
    let _envoy = start_envoy(
        dir.path(),
        "envoy-rollout",
        Ads::Sotw,
        xds_port,
        "prod",
        "a",
    );
    wait_for_variant(&client, port, "v1").await;

    // Accepted: exit 0 once Envoy ACKed; it serves the change by then.
    let accepted = apply_file(
        dir.path(),
        &admin,
        "v2.json",
        &[tagged_listener("http", port, "v2")],
        &["--wait", "30s"],
    );
    assert_eq!(accepted.status.code(), Some(0));
    assert!(
        stdout(&accepted).contains("1/1 streams accepted"),
        "{}",
        stdout(&accepted)
    );
    serves_now(port, "v2").await;
    let v2 = committed(&accepted);
    assert_eq!(
        vxds(&admin, &["rollout", "status", &v2.to_string()])
            .status
            .code(),
        Some(0)
    );

    // A listener on a port in use: Envoy cannot bind it and refuses the update.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port();
    let refused = apply_file(
        dir.path(),
        &admin,
        "busy.json",
        &[tagged_listener("busy", busy, "busy")],
        &["--wait", "30s"],
    );
    assert_eq!(refused.status.code(), Some(1));
    let text = stdout(&refused);
    assert!(text.contains("refused by node envoy-rollout"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{busy}")), "{text}");
    assert!(text.contains("Address already in use"), "{text}");
    let busy_revision = committed(&refused);
    let status = vxds(
        &admin,
        &["rollout", "status", &busy_revision.to_string(), "--wait"],
    );
    assert_eq!(status.status.code(), Some(1));
    assert!(stdout(&status).contains("Address already in use"));
    let rollout = get_json(
        &client,
        &format!("{admin}/v1/revisions/{busy_revision}/rollout"),
    )
    .await;
    assert_eq!(rollout["streams"], 1, "{rollout}");
    assert_eq!(rollout["nacked"], 1, "{rollout}");
    assert_eq!(rollout["nacks"][0]["node"], "envoy-rollout", "{rollout}");

    // Undone by hand: Envoy accepts the state without it.
    let back = vxds(&admin, &["rollback", "--to", &v2.to_string()]);
    assert_eq!(back.status.code(), Some(0));
    let head = get_json(
        &client,
        &format!("{admin}/v1/revisions?after={busy_revision}"),
    )
    .await;
    let back_revision = head["revisions"][0]["revision"].as_u64().unwrap();
    let status = vxds(
        &admin,
        &[
            "rollout",
            "status",
            &back_revision.to_string(),
            "--wait",
            "--timeout",
            "30s",
        ],
    );
    assert_eq!(status.status.code(), Some(0));

    // With --revert-on-nack: the listener changed and a busy one added; Envoy refuses; the
    // previous state comes back as a new revision, which Envoy accepts.
    let reverted = apply_file(
        dir.path(),
        &admin,
        "v3.json",
        &[
            tagged_listener("http", port, "v3"),
            tagged_listener("busy", busy, "busy"),
        ],
        &["--wait", "30s", "--revert-on-nack"],
    );
    assert_eq!(reverted.status.code(), Some(1));
    let text = stdout(&reverted);
    let v3 = committed(&reverted);
    assert!(text.contains("refused by node envoy-rollout"), "{text}");
    assert!(
        text.contains(&format!(
            "reverted: revision {} restores revision {back_revision}'s state",
            v3 + 1
        )),
        "{text}"
    );
    assert!(text.contains("revert: revision"), "{text}");
    assert!(text.contains("revert: rollout complete"), "{text}");
    serves_now(port, "v2").await;
    let revert = get_json(&client, &format!("{admin}/v1/revisions/{}", v3 + 1)).await;
    assert!(
        revert["message"]
            .as_str()
            .unwrap()
            .contains("Address already in use"),
        "{revert}"
    );
    assert_eq!(
        vxds(&admin, &["rollout", "status", &(v3 + 1).to_string()])
            .status
            .code(),
        Some(0)
    );
    // The Prometheus histogram counted each stream's commit → ACK.
    let metrics = metrics_text(&client, &admin).await;
    assert!(
        sample_sum(&metrics, "vxds_xds_convergence_seconds_count") >= 3.0,
        "{metrics}"
    );
    drop(taken);
}

/// A listener `name` on `port` whose connection manager loads the route configuration
/// `route` by RDS over ADS: Envoy warms it until the route is in.
fn rds_listener(name: &str, port: u16, route: &str) -> Value {
    json!({"type": "listener", "name": name, "variants": [{"resource": {
        "@type": LISTENER,
        "name": name,
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": name,
            "rds": {"route_config_name": route, "config_source": {"ads": {}, "resource_api_version": "V3"}},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }}]}],
    }}]})
}

/// The route configuration `name`: a virtual host per entry of `hosts` (its domains), each
/// routing to the backend and answering with `x-vxds-variant: tag`.
fn tagged_route(name: &str, tag: &str, hosts: &[&[&str]]) -> Value {
    let virtual_hosts: Vec<Value> = hosts
        .iter()
        .enumerate()
        .map(|(i, domains)| {
            json!({"name": format!("host{i}"), "domains": domains, "routes": [
                {"match": {"prefix": "/"}, "route": {"cluster": "backend"}},
            ]})
        })
        .collect();
    json!({"type": "route", "name": name, "variants": [{"resource": {
        "@type": ROUTE,
        "name": name,
        "response_headers_to_add": [{"header": {"key": "x-vxds-variant", "value": tag}}],
        "virtual_hosts": virtual_hosts,
    }}]})
}

/// Envoy ACKs a new listener while it warms, then fetches the route it names by RDS: `apply
/// --wait` exits 0 only once that route is accepted too (the listener serves by then), and 1
/// naming the node and Envoy's text when Envoy refuses the route (duplicate domains).
async fn apply_waits_for_the_route_a_new_listener_fetches(ads: Ads, node: &'static str) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let backend_port = start_backend().await;
    let (_vxds, admin, xds_port) = start_vxds(dir.path(), &[]);
    let client = reqwest::Client::new();
    let port = free_port();
    let mut ops = backend(backend_port);
    let mut first = tagged_listener("http", port, "v1");
    first["op"] = json!("put");
    ops.push(first);
    apply(&client, &admin, ops).await;
    let _envoy = start_envoy(dir.path(), node, ads, xds_port, "prod", "a");
    wait_for_variant(&client, port, "v1").await;

    // A listener and the route it loads by RDS, in one revision: complete once Envoy
    // accepted the route, so the listener serves right away.
    let web = free_port();
    let accepted = apply_file(
        dir.path(),
        &admin,
        "web.json",
        &[
            rds_listener("web", web, "web-route"),
            tagged_route("web-route", "r1", &[&["*"]]),
        ],
        &["--wait", "30s"],
    );
    assert_eq!(accepted.status.code(), Some(0));
    assert!(
        stdout(&accepted).contains("1/1 streams accepted"),
        "{}",
        stdout(&accepted)
    );
    serves_now(web, "r1").await;

    // The route alone changes: complete once Envoy accepted it.
    let changed = apply_file(
        dir.path(),
        &admin,
        "web-r2.json",
        &[tagged_route("web-route", "r2", &[&["*"]])],
        &["--wait", "30s"],
    );
    assert_eq!(changed.status.code(), Some(0));
    serves_now(web, "r2").await;

    // A listener whose route Envoy refuses: its ACK of the listener is not the end of it.
    let dup = free_port();
    let refused = apply_file(
        dir.path(),
        &admin,
        "dup.json",
        &[
            rds_listener("dup", dup, "dup-route"),
            tagged_route("dup-route", "d", &[&["a.example"], &["a.example"]]),
        ],
        &["--wait", "30s"],
    );
    assert_eq!(refused.status.code(), Some(1));
    let text = stdout(&refused);
    assert!(text.contains(&format!("refused by node {node}")), "{text}");
    assert!(
        text.contains("Only unique values for domains are permitted"),
        "{text}"
    );
    let revision = committed(&refused);
    let rollout = get_json(&client, &format!("{admin}/v1/revisions/{revision}/rollout")).await;
    assert_eq!(rollout["streams"], 1, "{rollout}");
    assert_eq!(rollout["nacked"], 1, "{rollout}");
    assert_eq!(rollout["nacks"][0]["type_url"], ROUTE, "{rollout}");
    assert_eq!(
        vxds(&admin, &["rollout", "status", &revision.to_string()])
            .status
            .code(),
        Some(1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_waits_for_the_route_a_new_listener_fetches_over_sotw() {
    apply_waits_for_the_route_a_new_listener_fetches(Ads::Sotw, "envoy-rds-sotw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_waits_for_the_route_a_new_listener_fetches_over_delta() {
    apply_waits_for_the_route_a_new_listener_fetches(Ads::Delta, "envoy-rds-delta").await;
}
