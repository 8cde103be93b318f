//! Secrets deny by default (issue 22), with Envoy fetching secrets over SDS on ADS: with the
//! identity template, a proxy gets only the secrets whose variants are bound to its own
//! certificate's identity, plus those marked shared, whatever it claims; without mutual TLS it
//! gets none unless `--xds-secrets-without-mtls` says so.

use super::mtls::{certificates, start_mtls_envoy_with, start_mtls_vxds};
use super::*;

const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// Secrets made of `certs`' `shop` certificate: `shop-cert` for namespace shop, `bank-cert`
/// for bank, `env-key` keyed on an untrusted parameter, `open` unconstrained, and `ca`
/// unconstrained but shared; and a cluster per secret, so that Envoy asks for each over SDS.
fn secrets_and_clusters(certs: &Path) -> Vec<Value> {
    let pem = |name: &str| std::fs::read_to_string(certs.join(name)).unwrap();
    let (chain, key) = (pem("shop.pem"), pem("shop.key"));
    let body = |name: &str| {
        json!({"@type": SECRET, "name": name, "tls_certificate": {
            "certificate_chain": {"inline_string": chain},
            "private_key": {"inline_string": key},
        }})
    };
    let secret = |name: &str, constraints: Value| {
        json!({"op": "put", "type": "secret", "name": name,
               "variants": [{"constraints": constraints, "resource": body(name)}]})
    };
    let mut ops = vec![
        secret("shop-cert", json!(r#"namespace = "shop""#)),
        secret("bank-cert", json!(r#"namespace = "bank""#)),
        secret("env-key", json!(r#"env = "prod""#)),
        secret("open", Value::Null),
        json!({"op": "put", "type": "secret", "name": "ca", "shared": true,
               "variants": [{"resource": body("ca")}]}),
    ];
    for name in NAMES {
        ops.push(json!({"op": "put", "type": "cluster", "name": format!("via-{name}"),
            "variants": [{"resource": {
                "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                "name": format!("via-{name}"),
                "type": "STATIC",
                "connect_timeout": "1s",
                "load_assignment": {"cluster_name": format!("via-{name}")},
                "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                    "common_tls_context": {"tls_certificate_sds_secret_configs": [{
                        "name": name,
                        "sds_config": {"ads": {}, "resource_api_version": "V3"},
                    }]},
                }},
            }}]}));
    }
    ops
}

const NAMES: [&str; 5] = ["shop-cert", "bank-cert", "env-key", "open", "ca"];

/// The secrets Envoy holds (its config dump's active secrets), once it has `expected` and
/// vxds has answered every secret request (the rest stay warming).
async fn active_secrets(
    client: &reqwest::Client,
    admin_port: u16,
    expected: &[&str],
) -> Vec<String> {
    let url = format!("http://127.0.0.1:{admin_port}/config_dump?resource=dynamic_active_secrets");
    let deadline = Instant::now() + WAIT;
    loop {
        let mut names: Vec<String> = match client.get(&url).send().await {
            Ok(response) => response
                .json::<Value>()
                .await
                .ok()
                .and_then(|dump| dump["configs"].as_array().cloned())
                .unwrap_or_default()
                .iter()
                .filter_map(|c| c["name"].as_str().map(str::to_owned))
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        if expected.iter().all(|e| names.iter().any(|n| n == e)) {
            return names;
        }
        assert!(
            Instant::now() < deadline,
            "Envoy never held {expected:?}; holds {names:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the vxds stream of `node` was last sent for secrets, per the admin API: once every
/// name it asked for has been answered.
async fn secrets_sent(client: &reqwest::Client, admin: &str, node: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let clients = get_json(client, &format!("{admin}/v1/clients")).await;
        let secrets = clients["clients"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["node_id"] == node)
            .flat_map(|c| c["types"].as_array().cloned().unwrap_or_default())
            .find(|t| t["type_url"] == SECRET);
        if let Some(secrets) = secrets
            && secrets["subscriptions"]
                .as_array()
                .is_some_and(|s| s.len() == NAMES.len())
            && secrets["last_acked"]["nonce"].is_string()
            && secrets["last_acked"]["nonce"] == secrets["last_sent"]["nonce"]
        {
            return secrets;
        }
        assert!(
            Instant::now() < deadline,
            "{node} never settled its secrets: {clients}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn admin_port(bootstrap: &Value) -> u16 {
    bootstrap["admin"]["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap() as u16
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_gets_only_its_identitys_secrets_and_shared_ones() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    let (_vxds, admin, xds_port) = start_mtls_vxds(dir.path(), &certs, &[]);
    let client = reqwest::Client::new();
    apply(&client, &admin, secrets_and_clusters(&certs)).await;
    // It claims namespace bank and env prod for secrets; its certificate says shop.
    let (_envoy, bootstrap) = start_mtls_envoy_with(
        dir.path(),
        &certs,
        "envoy-shop",
        Ads::Sotw,
        xds_port,
        json!({SECRET: {"params": {"namespace": "bank", "env": "prod"}}}),
    );
    secrets_sent(&client, &admin, "envoy-shop").await;
    let held = active_secrets(&client, admin_port(&bootstrap), &["ca", "shop-cert"]).await;
    assert_eq!(
        held,
        ["ca", "shop-cert"],
        "bank's, the env-keyed and the open secret are not served"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_mutual_tls_sds_serves_no_secrets_unless_told() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    let client = reqwest::Client::new();
    // Told, it serves what the claimed parameters match: all but bank's.
    let told = vec!["shop-cert", "env-key", "open", "ca"];
    for (flag, expected) in [(None, vec![]), (Some("--xds-secrets-without-mtls"), told)] {
        let run = dir
            .path()
            .join(if flag.is_some() { "open" } else { "closed" });
        std::fs::create_dir_all(&run).unwrap();
        let (_vxds, admin, xds_port) = start_vxds(&run, flag.as_slice());
        apply(&client, &admin, secrets_and_clusters(&certs)).await;
        let mut bootstrap = envoy_bootstrap("envoy-plain", Ads::Delta, xds_port, json!({}), "a");
        bootstrap["node"]["dynamic_parameters"][SECRET] =
            json!({"params": {"namespace": "shop", "env": "prod"}});
        let _envoy = spawn_envoy(&run, "envoy-plain", &bootstrap);
        secrets_sent(&client, &admin, "envoy-plain").await;
        let mut expected: Vec<String> = expected.iter().map(|s| (*s).to_owned()).collect();
        expected.sort();
        let wanted: Vec<&str> = expected.iter().map(String::as_str).collect();
        let held = active_secrets(&client, admin_port(&bootstrap), &wanted).await;
        assert_eq!(held, expected, "{flag:?}");
    }
}
