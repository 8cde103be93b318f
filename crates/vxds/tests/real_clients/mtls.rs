//! Mutual TLS and client identity, with certificates from `vxds dev-certs` (rcgen): Envoy over
//! SotW and Delta and grpcio's xDS client get the variant of their certificate's namespace
//! whatever namespace they claim; clients without a certificate, with an untrusted one, or
//! with one the identity template does not fit get nothing; rotating the server certificate
//! shows in new handshakes while an existing Envoy stream goes on; the admin API over HTTPS
//! with hashed and plaintext tokens.

use std::sync::Arc;

use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::config::route::v3::RouteConfiguration;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use vxds_envoy::pb::envoy::service::status::v3::ClientStatusRequest;
use vxds_envoy::pb::envoy::service::status::v3::client_status_discovery_service_client::ClientStatusDiscoveryServiceClient;
use vxds_envoy::pb::xds::core::v3::ContextParams;

use super::*;

const TEMPLATE: &str = "spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}";

/// `vxds dev-certs --dir DIR ARGS...`.
fn dev_certs(dir: &Path, args: &[&str]) {
    let output = Command::new(env!("CARGO_BIN_EXE_vxds"))
        .arg("dev-certs")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "vxds dev-certs failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA, the server's certificate, and clients `shop` and `bank` (their namespaces) and
/// `misfit` (an identity the template does not fit).
pub(super) fn certificates(dir: &Path) -> PathBuf {
    let certs = dir.join("certs");
    dev_certs(
        &certs,
        &[
            "--client",
            "shop=spiffe://vxds.test/ns/shop/sa/envoy",
            "--client",
            "bank=spiffe://vxds.test/ns/bank/sa/envoy",
            "--client",
            "misfit=spiffe://vxds.test/team/shop",
        ],
    );
    certs
}

pub(super) fn file(certs: &Path, name: &str) -> String {
    certs.join(name).display().to_string()
}

/// `vxds serve` with xDS over mutual TLS and the SPIFFE identity template.
pub(super) fn start_mtls_vxds(
    dir: &Path,
    certs: &Path,
    extra: &[&str],
) -> (ServeProcess, String, u16) {
    let (cert, key, ca) = (
        file(certs, "server.pem"),
        file(certs, "server.key"),
        file(certs, "ca.pem"),
    );
    let mut args = vec![
        "--xds-tls-cert",
        &cert,
        "--xds-tls-key",
        &key,
        "--xds-client-ca",
        &ca,
        "--xds-identity-template",
        TEMPLATE,
    ];
    args.extend_from_slice(extra);
    start_vxds(dir, &args)
}

/// Routes keyed on the trusted `namespace`.
fn namespace_routes(shop_tag: &str, bank_tag: &str) -> Value {
    let mut ops = routes(shop_tag, bank_tag);
    let variants = ops["variants"].as_array_mut().unwrap();
    variants[0]["constraints"] = json!(r#"namespace = "shop""#);
    variants[1]["constraints"] = json!(r#"namespace = "bank""#);
    ops
}

/// An Envoy `envoy-<client>` that reaches vxds over mutual TLS with `client`'s certificate,
/// and claims `claimed` as its namespace.
fn start_mtls_envoy(
    dir: &Path,
    certs: &Path,
    name: &'static str,
    ads: Ads,
    xds_port: u16,
    claimed: &str,
    instance: &str,
) -> Process {
    let mut bootstrap =
        envoy_bootstrap(name, ads, xds_port, json!({"namespace": claimed}), instance);
    mtls_bootstrap(&mut bootstrap, certs, name);
    spawn_envoy(dir, name, &bootstrap)
}

/// Like [`start_mtls_envoy`], with `dynamic_parameters` added to the node's (by type URL);
/// returns the bootstrap too (its admin port).
pub(super) fn start_mtls_envoy_with(
    dir: &Path,
    certs: &Path,
    name: &'static str,
    ads: Ads,
    xds_port: u16,
    dynamic_parameters: Value,
) -> (Process, Value) {
    let mut bootstrap = envoy_bootstrap(name, ads, xds_port, json!({}), "a");
    for (type_url, params) in dynamic_parameters.as_object().unwrap() {
        bootstrap["node"]["dynamic_parameters"][type_url] = params.clone();
    }
    mtls_bootstrap(&mut bootstrap, certs, name);
    (spawn_envoy(dir, name, &bootstrap), bootstrap)
}

/// The `xds` cluster over mutual TLS with `envoy-<client>`'s certificate.
fn mtls_bootstrap(bootstrap: &mut Value, certs: &Path, name: &str) {
    let client = name.strip_prefix("envoy-").unwrap();
    bootstrap["static_resources"]["clusters"][0]["transport_socket"] = json!({
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": "localhost",
            "common_tls_context": {
                "alpn_protocols": ["h2"],
                "tls_certificates": [{
                    "certificate_chain": {"filename": file(certs, &format!("{client}.pem"))},
                    "private_key": {"filename": file(certs, &format!("{client}.key"))},
                }],
                "validation_context": {
                    "trusted_ca": {"filename": file(certs, "ca.pem")},
                    "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": "localhost"}}],
                },
            },
        },
    });
}

fn client_config(certs: &Path, client: Option<(&Path, &str)>) -> ClientConfig {
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(certs.join("ca.pem")).unwrap() {
        roots.add(ca.unwrap()).unwrap();
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match client {
        Some((dir, name)) => {
            let chain = CertificateDer::pem_file_iter(dir.join(format!("{name}.pem")))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{name}.key"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// The certificate the server presents to a new handshake.
async fn presented_certificate(port: u16, certs: &Path) -> Vec<u8> {
    let connector = TlsConnector::from(Arc::new(client_config(certs, Some((certs, "shop")))));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// A gRPC channel to vxds over TLS with `config`.
async fn mtls_channel(
    port: u16,
    config: ClientConfig,
) -> Result<tonic::transport::Channel, String> {
    let connector = TlsConnector::from(Arc::new(config));
    let endpoint = tonic::transport::Endpoint::from_static("http://localhost");
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let connector = connector.clone();
            async move {
                let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                let tls = connector
                    .connect(ServerName::try_from("localhost").unwrap(), tcp)
                    .await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        }))
        .await
        .map_err(|e| format!("connect: {e}"))
}

/// One ADS request for the route `local_route` over TLS with `config`, claiming the namespace
/// `bank` in `node.dynamic_parameters`; the first response, or why there is none.
async fn ask_for_routes(port: u16, config: ClientConfig) -> Result<DiscoveryResponse, String> {
    let channel = mtls_channel(port, config).await?;
    let node = Node {
        id: "raw-client".into(),
        dynamic_parameters: [(
            ROUTE.to_owned(),
            ContextParams {
                params: [("namespace".to_owned(), "bank".to_owned())].into(),
            },
        )]
        .into(),
        ..Default::default()
    };
    let request = DiscoveryRequest {
        node: Some(node),
        type_url: ROUTE.into(),
        resource_names: vec!["local_route".into()],
        ..Default::default()
    };
    let (_keep_open, requests) = tokio::sync::mpsc::channel::<DiscoveryRequest>(1);
    _keep_open.send(request).await.unwrap();
    let answer = async {
        let mut responses = AggregatedDiscoveryServiceClient::new(channel)
            .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(requests))
            .await
            .map_err(|s| format!("{:?}: {}", s.code(), s.message()))?
            .into_inner();
        match responses.message().await {
            Ok(Some(response)) => Ok(response),
            Ok(None) => Err("the stream ended without a response".to_owned()),
            Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
        }
    };
    tokio::time::timeout(Duration::from_secs(10), answer)
        .await
        .map_err(|_| "no answer within 10 s".to_owned())?
}

fn route_tag(response: &DiscoveryResponse) -> String {
    use prost::Message;
    let route = RouteConfiguration::decode(response.resources[0].value.as_slice()).unwrap();
    route.response_headers_to_add[0]
        .header
        .as_ref()
        .unwrap()
        .value
        .clone()
}

fn client_named<'a>(clients: &'a Value, node: &str) -> &'a Value {
    clients["clients"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["node_id"] == node)
        .unwrap_or_else(|| panic!("no client {node} in {clients}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_over_mtls_get_their_certificates_variant_and_ride_out_a_rotation() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    let backend_port = start_backend().await;
    let (_vxds, admin, xds_port) = start_mtls_vxds(dir.path(), &certs, &[]);
    let (port_a, port_b) = (free_port(), free_port());
    let client = reqwest::Client::new();
    let mut ops = backend(backend_port);
    ops.push(listener(port_a, port_b));
    ops.push(namespace_routes("shop", "bank"));
    apply(&client, &admin, ops).await;

    // Each claims the other's namespace; each certificate says otherwise.
    let d = dir.path();
    let _shop = start_mtls_envoy(d, &certs, "envoy-shop", Ads::Sotw, xds_port, "bank", "a");
    let _bank = start_mtls_envoy(d, &certs, "envoy-bank", Ads::Delta, xds_port, "shop", "b");
    wait_for_variant(&client, port_a, "shop").await;
    wait_for_variant(&client, port_b, "bank").await;

    // The operator sees the identity, the trusted parameters and where each came from.
    let clients = get_json(&client, &format!("{admin}/v1/clients")).await;
    let shop = client_named(&clients, "envoy-shop");
    assert_eq!(
        shop["identity"], "spiffe://vxds.test/ns/shop/sa/envoy",
        "{shop}"
    );
    assert_eq!(shop["trusted_params"]["namespace"], "shop", "{shop}");
    let routes_status = shop["types"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["type_url"] == ROUTE)
        .unwrap();
    assert_eq!(routes_status["params"]["namespace"], "shop");
    assert_eq!(routes_status["param_sources"]["namespace"], "identity");
    let stream_id = shop["stream_id"].clone();

    // CSDS over mTLS: a proxy sees its own identity's streams, with what was trusted, and not
    // another namespace's.
    let channel = mtls_channel(xds_port, client_config(&certs, Some((&certs, "shop"))))
        .await
        .unwrap();
    let status = ClientStatusDiscoveryServiceClient::new(channel)
        .fetch_client_status(ClientStatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    let nodes: Vec<&Node> = status
        .config
        .iter()
        .filter_map(|c| c.node.as_ref())
        .collect();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(nodes[0].id, "envoy-shop");
    assert_eq!(
        nodes[0].dynamic_parameters[ROUTE].params["namespace"],
        "shop"
    );
    let vxds_meta = format!("{:?}", nodes[0].metadata);
    assert!(
        vxds_meta.contains("trusted_params")
            && vxds_meta.contains("spiffe://vxds.test/ns/shop/sa/envoy"),
        "{vxds_meta}"
    );

    // Rotation: new handshakes get the new certificate within 10 s; the Envoys' streams stay.
    let before = presented_certificate(xds_port, &certs).await;
    dev_certs(&certs, &["--renew-server"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while presented_certificate(xds_port, &certs).await == before {
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was not served within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let put = client
        .put(format!("{admin}/v1/resources/route/local_route"))
        .json(&json!({"variants": namespace_routes("shop-2", "bank-2")["variants"]}))
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    wait_for_variant(&client, port_a, "shop-2").await;
    wait_for_variant(&client, port_b, "bank-2").await;
    let clients = get_json(&client, &format!("{admin}/v1/clients")).await;
    assert_eq!(
        client_named(&clients, "envoy-shop")["stream_id"],
        stream_id,
        "the stream was replaced: {clients}"
    );

    // A broken rotation (a certificate without its key) is refused; the old pair serves on.
    let serving = presented_certificate(xds_port, &certs).await;
    std::fs::write(certs.join("server.key"), "not a key").unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(presented_certificate(xds_port, &certs).await, serving);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_without_a_fitting_certificate_get_no_configuration() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    // A CA of its own: its client is a stranger to vxds.
    let strangers = dir.path().join("strangers");
    dev_certs(
        &strangers,
        &["--client", "stranger=spiffe://vxds.test/ns/shop/sa/envoy"],
    );
    let (_vxds, admin, xds_port) = start_mtls_vxds(dir.path(), &certs, &[]);
    let client = reqwest::Client::new();
    apply(&client, &admin, vec![namespace_routes("shop", "bank")]).await;

    // The certificate's namespace wins over the claimed one.
    let answer = ask_for_routes(xds_port, client_config(&certs, Some((&certs, "shop")))).await;
    assert_eq!(route_tag(&answer.unwrap()), "shop");

    let refused = [
        ("no certificate", client_config(&certs, None)),
        (
            "an untrusted certificate",
            client_config(&certs, Some((&strangers, "stranger"))),
        ),
    ];
    for (what, config) in refused {
        // Refused by the handshake itself, not by the template: the transport fails.
        let error = ask_for_routes(xds_port, config).await.unwrap_err();
        assert!(!error.starts_with("PermissionDenied"), "{what}: {error}");
    }
    let misfit = ask_for_routes(xds_port, client_config(&certs, Some((&certs, "misfit")))).await;
    let error = misfit.unwrap_err();
    assert!(error.starts_with("PermissionDenied"), "{error}");
    assert!(error.contains("spiffe://vxds.test/team/shop"), "{error}");

    // `/v1/resolve` applies the same rule.
    let resolved = client
        .post(format!("{admin}/v1/resolve"))
        .json(
            &json!({"type": "route", "name": "local_route", "params": {"namespace": "bank"},
            "identity": "spiffe://vxds.test/ns/shop/sa/envoy"}),
        )
        .send()
        .await
        .unwrap();
    let resolved: Value = resolved.json().await.unwrap();
    assert_eq!(resolved["params"]["namespace"], "shop", "{resolved}");
    assert_eq!(resolved["param_sources"]["namespace"], "identity");
    assert_eq!(
        resolved["variant"]["constraints_text"],
        r#"namespace = "shop""#
    );
    let output = Command::new(env!("CARGO_BIN_EXE_vxds"))
        .args([
            "resolve",
            "route",
            "local_route",
            "namespace=bank",
            "--server",
            &admin,
        ])
        .args(["--identity", "spiffe://vxds.test/ns/shop/sa/envoy"])
        .env_remove("VXDS_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("trusted (from the identity): namespace=shop"),
        "{stdout}"
    );
}

/// grpcio 1.85's xDS client with `tls` channel credentials (A65): its node metadata claims the
/// namespace `bank`, its certificate says `shop`.
#[test]
fn grpc_proxyless_client_over_mtls_gets_its_certificates_variant() {
    let python = python_with_grpcio();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    let (_vxds, admin, xds_port) =
        start_mtls_vxds(dir.path(), &certs, &["--node-metadata-params", "namespace"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/grpc_xds_client.py");
    let output = Command::new(python)
        .arg(script)
        .args([admin.as_str(), &xds_port.to_string()])
        .arg(&certs)
        .arg("shop")
        .env("GRPC_VERBOSITY", "ERROR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "gRPC client failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
}

/// The admin API over HTTPS: a hashed token writes, a plaintext one reads, a wrong one is 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_over_https_with_hashed_and_plaintext_tokens() {
    use sha2::{Digest, Sha256};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    let hashed: String = Sha256::digest(b"writer-secret-0123456789")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("write sha256:{hashed} ops\nread reader-secret-0123456789 auditor\n"),
    )
    .unwrap();
    let (cert, key, token_file) = (
        file(&certs, "server.pem"),
        file(&certs, "server.key"),
        tokens.display().to_string(),
    );
    let (_vxds, admin, _) = start_vxds(
        dir.path(),
        &[
            "--admin-tls-cert",
            &cert,
            "--admin-tls-key",
            &key,
            "--admin-token-file",
            &token_file,
        ],
    );
    assert!(admin.starts_with("https://"), "{admin}");
    let ca = reqwest::Certificate::from_pem(&std::fs::read(certs.join("ca.pem")).unwrap()).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let admin = admin.replace("127.0.0.1", "localhost");
    let write = client
        .post(format!("{admin}/v1/changesets"))
        .bearer_auth("writer-secret-0123456789")
        .json(&json!({"operations": [namespace_routes("shop", "bank")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(write.status(), 200, "{}", write.text().await.unwrap());
    let revisions = client
        .get(format!("{admin}/v1/revisions"))
        .bearer_auth("reader-secret-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(revisions.status(), 200);
    let revisions: Value = revisions.json().await.unwrap();
    assert_eq!(revisions["revisions"][0]["author"], "ops", "{revisions}");
    let wrong = client
        .get(format!("{admin}/v1/revisions"))
        .bearer_auth("guess")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    // The command line over HTTPS, trusting the development CA.
    let output = Command::new(env!("CARGO_BIN_EXE_vxds"))
        .args([
            "resolve",
            "route",
            "local_route",
            "namespace=shop",
            "--server",
            &admin,
        ])
        .args(["--token", "reader-secret-0123456789", "--ca-cert"])
        .arg(certs.join("ca.pem"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Plain HTTP to the HTTPS port gets nowhere.
    let plain = reqwest::Client::new()
        .get(admin.replace("https://", "http://") + "/v1/revisions")
        .bearer_auth("reader-secret-0123456789")
        .send()
        .await;
    assert!(plain.is_err() || plain.unwrap().status() != 200);
}

/// A CRL from `certs`' CA that revokes `client`'s certificate, in `certs/revoked.crl.pem`.
fn revoke(certs: &Path, client: &str) -> String {
    revocation_list(certs, &[client], 1)
}

/// A CRL (number `number`) from `certs`' CA that revokes the certificates of `clients` (none:
/// an empty list), written to `certs/revoked.crl.pem` (replaced whole, as a CRL distributor
/// would); its path.
fn revocation_list(certs: &Path, clients: &[&str], number: u64) -> String {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(certs.join("ca.key")).unwrap()).unwrap();
    let ca_pem = std::fs::read_to_string(certs.join("ca.pem")).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).unwrap();
    let revoked_certs = clients
        .iter()
        .map(|client| {
            let pem = std::fs::read(certs.join(format!("{client}.pem"))).unwrap();
            let der = CertificateDer::from_pem_slice(&pem).unwrap();
            let (_, cert) = X509Certificate::from_der(&der).unwrap();
            rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from_slice(cert.tbs_certificate.raw_serial()),
                revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                invalidity_date: None,
            }
        })
        .collect();
    let crl = rcgen::CertificateRevocationListParams {
        this_update: rcgen::date_time_ymd(2024, 1, 1),
        next_update: rcgen::date_time_ymd(2099, 1, 1),
        crl_number: rcgen::SerialNumber::from(number),
        issuing_distribution_point: None,
        revoked_certs,
        key_identifier_method: rcgen::KeyIdMethod::Sha256,
    }
    .signed_by(&issuer)
    .unwrap();
    let path = certs.join("revoked.crl.pem");
    let next = certs.join("revoked.crl.pem.next");
    std::fs::write(&next, crl.pem().unwrap()).unwrap();
    std::fs::rename(&next, &path).unwrap();
    path.display().to_string()
}

/// An open ADS stream for the route `local_route` over TLS with `config`.
struct RouteStream {
    requests: tokio::sync::mpsc::Sender<DiscoveryRequest>,
    responses: tonic::Streaming<DiscoveryResponse>,
}

impl RouteStream {
    async fn open(port: u16, config: ClientConfig) -> Self {
        let channel = mtls_channel(port, config).await.unwrap();
        let (requests, rx) = tokio::sync::mpsc::channel::<DiscoveryRequest>(4);
        requests
            .send(DiscoveryRequest {
                node: Some(Node {
                    id: "streaming-client".into(),
                    ..Default::default()
                }),
                type_url: ROUTE.into(),
                resource_names: vec!["local_route".into()],
                ..Default::default()
            })
            .await
            .unwrap();
        let responses = AggregatedDiscoveryServiceClient::new(channel)
            .stream_aggregated_resources(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Self {
            requests,
            responses,
        }
    }

    /// The next response, acknowledged; or the status the stream ended with.
    async fn next(&mut self) -> Result<DiscoveryResponse, tonic::Status> {
        let response = tokio::time::timeout(Duration::from_secs(10), self.responses.message())
            .await
            .expect("a response or the stream's end within 10 s")?
            .ok_or_else(|| tonic::Status::unknown("the stream ended without a status"))?;
        let _ = self
            .requests
            .send(DiscoveryRequest {
                type_url: ROUTE.into(),
                resource_names: vec!["local_route".into()],
                version_info: response.version_info.clone(),
                response_nonce: response.nonce.clone(),
                ..Default::default()
            })
            .await;
        Ok(response)
    }
}

/// Issue 22 item 6: when the CRL file is rewritten to revoke a connected client's
/// certificate, its stream is ended (`PERMISSION_DENIED`, naming the revocation) within the
/// reload interval; another client's stream goes on and gets the next update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_a_newly_revoked_certificate_are_closed() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    let crl = revocation_list(&certs, &[], 1);
    let (_vxds, admin, xds_port) = start_mtls_vxds(dir.path(), &certs, &["--xds-client-crl", &crl]);
    let client = reqwest::Client::new();
    apply(&client, &admin, vec![namespace_routes("shop", "bank")]).await;
    let mut shop = RouteStream::open(xds_port, client_config(&certs, Some((&certs, "shop")))).await;
    let mut bank = RouteStream::open(xds_port, client_config(&certs, Some((&certs, "bank")))).await;
    assert_eq!(route_tag(&shop.next().await.unwrap()), "shop");
    assert_eq!(route_tag(&bank.next().await.unwrap()), "bank");

    revocation_list(&certs, &["shop"], 2);
    let revoked_at = std::time::Instant::now();
    let ended = shop
        .next()
        .await
        .expect_err("the revoked client's stream ends");
    let took = revoked_at.elapsed();
    assert_eq!(ended.code(), tonic::Code::PermissionDenied, "{ended:?}");
    assert!(ended.message().contains("revoked"), "{ended:?}");
    // The file is compared every 2 s (RELOAD_INTERVAL): closed within that and a margin.
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // And it cannot come back.
    let again = ask_for_routes(xds_port, client_config(&certs, Some((&certs, "shop")))).await;
    assert!(again.is_err(), "{again:?}");

    // The other client's stream lives on and gets what is written next.
    apply(&client, &admin, vec![namespace_routes("shop-2", "bank-2")]).await;
    assert_eq!(route_tag(&bank.next().await.unwrap()), "bank-2");
}

/// Issue 22 item 6: `--xds-client-crl` refuses a revoked certificate at the handshake; the
/// CA's other clients go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_client_certificates_are_refused() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let certs = certificates(dir.path());
    let crl = revoke(&certs, "shop");
    let (_vxds, admin, xds_port) = start_mtls_vxds(dir.path(), &certs, &["--xds-client-crl", &crl]);
    let client = reqwest::Client::new();
    apply(&client, &admin, vec![namespace_routes("shop", "bank")]).await;

    let bank = ask_for_routes(xds_port, client_config(&certs, Some((&certs, "bank")))).await;
    assert_eq!(route_tag(&bank.unwrap()), "bank");
    let shop = ask_for_routes(xds_port, client_config(&certs, Some((&certs, "shop")))).await;
    let error = shop.unwrap_err();
    // Refused by the handshake, not by the template.
    assert!(!error.starts_with("PermissionDenied"), "{error}");
}
