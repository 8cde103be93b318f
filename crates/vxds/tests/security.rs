//! The command line's security rules, as a real process: `vxds serve` refuses plaintext xDS
//! beyond loopback, bad identity templates and bad certificate files at start, each with the
//! reason; `vxds dev-certs` keeps what exists; `vxds validate` flags secrets anyone could
//! obtain; `vxds resolve --identity` answers as for a connected client.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;
use std::process::{Command, Output};

use vxds_testkit::serve::ServeProcess;

fn run(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vxds"));
    for (var, _) in std::env::vars() {
        if var.starts_with("VXDS_") {
            command.env_remove(var);
        }
    }
    command.args(args).output().unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn dev_certs(dir: &Path, args: &[&str]) {
    let mut all = vec!["dev-certs", "--dir", dir.to_str().unwrap()];
    all.extend_from_slice(args);
    let output = run(&all);
    assert!(output.status.success(), "{}", stderr(&output));
}

/// `vxds serve` with `args` on an in-memory store; it must refuse to start.
fn serve_refuses(args: &[&str]) -> String {
    let mut all = vec![
        "serve",
        "--admin-addr",
        "127.0.0.1:0",
        "--database-url",
        "sqlite::memory:",
    ];
    all.extend_from_slice(args);
    let output = run(&all);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    stderr(&output)
}

#[test]
fn serve_refuses_plaintext_xds_beyond_loopback_unless_told() {
    let error = serve_refuses(&["--xds-addr", "0.0.0.0:0"]);
    assert!(
        error.contains("refusing to serve xDS in plaintext on 0.0.0.0:0")
            && error.contains("--xds-insecure"),
        "{error}"
    );
    let dir = tempfile::tempdir().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let server =
        ServeProcess::start_at(binary, dir.path(), "0.0.0.0:0", &["--xds-insecure"]).unwrap();
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(
        log.contains("serving xDS in PLAINTEXT beyond loopback"),
        "{log}"
    );
}

#[test]
fn serve_refuses_insecure_starts_naming_the_flag_that_allows_them() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    dev_certs(&certs, &[]);
    let file = |name: &str| certs.join(name).display().to_string();
    let (cert, key) = (file("server.pem"), file("server.key"));
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "write s3cret-token-of-length\n").unwrap();
    let tokens = tokens.display().to_string();
    // TLS without client certificates beyond loopback.
    let error = serve_refuses(&[
        "--xds-addr",
        "0.0.0.0:0",
        "--xds-tls-cert",
        &cert,
        "--xds-tls-key",
        &key,
    ]);
    assert!(
        error.contains("without --xds-client-ca") && error.contains("--xds-unauthenticated"),
        "{error}"
    );
    // The admin API in plaintext beyond loopback, tokens or not.
    let error = run(&[
        "serve",
        "--admin-addr",
        "0.0.0.0:0",
        "--admin-token-file",
        &tokens,
        "--database-url",
        "sqlite::memory:",
    ]);
    let error = stderr(&error);
    assert!(
        error.contains("refusing to serve the admin API in plaintext on 0.0.0.0:0")
            && error.contains("--admin-insecure"),
        "{error}"
    );
    // Any Host without tokens: a DNS-rebinding page could write.
    let error = serve_refuses(&["--admin-allowed-hosts", "*"]);
    assert!(
        error.contains("--admin-allowed-hosts '*' without tokens")
            && error.contains("--admin-insecure"),
        "{error}"
    );
    // Each opt-in starts, with a warning.
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let server = ServeProcess::start_at(
        binary,
        dir.path(),
        "0.0.0.0:0",
        &[
            "--xds-tls-cert",
            &cert,
            "--xds-tls-key",
            &key,
            "--xds-unauthenticated",
        ],
    )
    .unwrap();
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("--xds-unauthenticated: xDS over TLS"), "{log}");
    drop(server);
    let server = ServeProcess::start(
        binary,
        dir.path(),
        &["--admin-allowed-hosts", "*", "--admin-insecure"],
    )
    .unwrap();
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(
        log.contains("--admin-insecure: any Host is accepted"),
        "{log}"
    );
}

#[test]
fn serve_refuses_bad_templates_and_certificate_files_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    dev_certs(&certs, &[]);
    let file = |name: &str| certs.join(name).display().to_string();
    let (cert, key, ca) = (file("server.pem"), file("server.key"), file("ca.pem"));
    let tls = [
        "--xds-tls-cert",
        &cert,
        "--xds-tls-key",
        &key,
        "--xds-client-ca",
        &ca,
    ];

    let mut args = tls.to_vec();
    args.extend(["--xds-identity-template", "spiffe://{td}{ns}"]);
    let error = serve_refuses(&args);
    assert!(
        error.contains("--xds-identity-template") && error.contains("nothing between"),
        "{error}"
    );

    // A template needs client certificates to read identities from.
    let output = run(&["serve", "--xds-identity-template", "spiffe://{td}/ns/{ns}"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("--xds-client-ca"),
        "{}",
        stderr(&output)
    );

    // A key that is not the certificate's; a missing file; a file with no certificate.
    dev_certs(&certs, &["--client", "other=spiffe://td/ns/a/sa/b"]);
    let other_key = file("other.key");
    let error = serve_refuses(&["--xds-tls-cert", &cert, "--xds-tls-key", &other_key]);
    assert!(error.contains("does not fit the certificate"), "{error}");
    let missing = file("missing.pem");
    let error = serve_refuses(&["--xds-tls-cert", &missing, "--xds-tls-key", &key]);
    assert!(error.contains("missing.pem"), "{error}");
    let error = serve_refuses(&["--xds-tls-cert", &key, "--xds-tls-key", &key]);
    assert!(error.contains("no certificate"), "{error}");
}

#[test]
fn dev_certs_keeps_what_exists_and_renews_on_request() {
    let dir = tempfile::tempdir().unwrap();
    dev_certs(dir.path(), &["--client", "envoy=spiffe://td/ns/a/sa/envoy"]);
    let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
    let (ca, server, client) = (read("ca.pem"), read("server.pem"), read("envoy.pem"));
    dev_certs(dir.path(), &["--client", "envoy=spiffe://td/ns/a/sa/envoy"]);
    assert_eq!(
        (read("ca.pem"), read("server.pem"), read("envoy.pem")),
        (ca.clone(), server.clone(), client)
    );
    dev_certs(dir.path(), &["--renew-server"]);
    assert_eq!(read("ca.pem"), ca);
    assert_ne!(read("server.pem"), server);
    let bad = run(&[
        "dev-certs",
        "--dir",
        dir.path().to_str().unwrap(),
        "--client",
        "server=x",
    ]);
    assert!(!bad.status.success());
}

#[test]
fn validate_flags_secrets_that_constrain_no_trusted_key() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("secrets.yaml");
    std::fs::write(
        &fixture,
        r#"type: secret
name: tls
variants:
  - constraints: namespace = "shop"
    resource: {"@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret, name: tls}
  - constraints: namespace != "shop"
    resource: {"@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret, name: tls}
---
type: secret
name: open
variants:
  - resource: {"@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret, name: open}
"#,
    )
    .unwrap();
    let path = fixture.to_str().unwrap();
    let template = "spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}";
    let output = run(&["validate", "-f", path, "--identity-template", template]);
    assert!(
        output.status.success(),
        "warnings do not refuse: {}",
        stderr(&output)
    );
    let warnings = stderr(&output);
    // `namespace != "shop"` reaches every other namespace; the unconstrained one reaches all.
    assert_eq!(
        warnings.matches("untrusted_secret_variant").count(),
        2,
        "{warnings}"
    );
    assert!(warnings.contains("namespace=<no identity>"), "{warnings}");
    assert!(
        warnings.contains("so it is served to no client"),
        "{warnings}"
    );
    let plain = run(&["validate", "-f", path]);
    assert!(!stderr(&plain).contains("untrusted_secret_variant"));
}

#[test]
fn connections_have_a_maximum_age_by_default() {
    let help = run(&["serve", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    let flag = text
        .split("--xds-max-connection-age <")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    let until_next = flag.split("--xds-max-connection-age-grace").next().unwrap();
    assert!(until_next.contains("[default: 1h]"), "{until_next}");
}
