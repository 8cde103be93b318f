//! The `vxds` command line, run as a real process: offline validation, apply / export / resolve
//! straight on each store backend and against a running `vxds serve`.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use vxds_testkit::serve::ServeProcess;
use vxds_testkit::{TestDb, on_both_backends};

// A test crate's root resolves modules beside it, not in a folder named after it.
#[path = "cli/big.rs"]
mod big;
#[path = "cli/diff.rs"]
mod diff;
#[path = "cli/impact.rs"]
mod impact;
#[path = "cli/rollback.rs"]
mod rollback;
#[path = "cli/shutdown.rs"]
mod shutdown;

fn vxds() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vxds"));
    for var in [
        "VXDS_SERVER",
        "VXDS_TOKEN",
        "VXDS_DATABASE_URL",
        "VXDS_ADMIN_ADDR",
        "VXDS_ADMIN_TOKEN_FILE",
    ] {
        command.env_remove(var);
    }
    command
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

fn run(args: &[&str]) -> Output {
    vxds().args(args).output().unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_shipped_fixtures_validate_offline() {
    let fixtures = fixtures();
    let output = run(&["validate", "-f", fixtures.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "ok: 6 resources in 4 files pass every rule\n"
    );
}

#[test]
fn validation_errors_name_the_file_document_and_field() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("routes.yaml"),
        r#"type: route
name: ok
variants:
  - resource: {"@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration, name: ok}
---
type: route
name: overlap
variants:
  - constraints: env in (prod, test)
    resource: {"@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration, name: overlap}
  - constraints: env in (qa, test)
    resource: {"@type": type.googleapis.com/envoy.config.route.v3.RouteConfiguration, name: overlap}
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("clusters.json"),
        r#"[{"type": "cluster", "name": "a", "variants": [{"resource": {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "a",
             "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig", "clusters": ["a"]}}}}]}]"#,
    )
    .unwrap();
    let output = run(&["validate", "-f", dir.path().to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1), "{}", stdout(&output));
    let errors = stderr(&output);
    assert!(errors.contains("routes.yaml:11:18 (document 2) /variants/1/constraints: variants 0 and 1 overlap: both match {env=test} [overlapping_variants] (witness: {env=test})"), "{errors}");
    assert!(
        errors.contains(
            "clusters.json:1:2 (document 1): aggregate clusters form a cycle: a → a [aggregate_cycle]"
        ),
        "{errors}"
    );

    std::fs::write(
        dir.path().join("broken.yaml"),
        "type: route\nname: x\nvariants: 3\n",
    )
    .unwrap();
    let output = run(&[
        "validate",
        "-f",
        dir.path().join("broken.yaml").to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("broken.yaml:3:11 (document 1) /variants: invalid type"),
        "{}",
        stderr(&output)
    );

    // Not YAML at all: where the parser stopped (documents are read one at a time, so the
    // first one is whole).
    std::fs::write(
        dir.path().join("broken.yaml"),
        "type: route\nname: a\nvariants: []\n---\nname: [x\nvariants: []\n",
    )
    .unwrap();
    let output = run(&[
        "validate",
        "-f",
        dir.path().join("broken.yaml").to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    let error = stderr(&output);
    assert!(
        error.contains("broken.yaml:6:") && error.contains("(document 2): not valid YAML"),
        "{error}"
    );
}

on_both_backends!(
    apply_export_and_resolve_straight_on_the_database,
    prune_deletes_what_the_fixtures_omit
);

async fn apply_export_and_resolve_straight_on_the_database(db: TestDb) {
    let url = db.url.clone();
    let fixtures = fixtures();
    let applied = run(&[
        "apply",
        "-f",
        fixtures.to_str().unwrap(),
        "--database-url",
        &url,
        "-m",
        "first",
    ]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(
        stdout(&applied).starts_with("revision 1: 6 changes\n"),
        "{}",
        stdout(&applied)
    );
    assert!(stdout(&applied).contains("created  route      local_route"));

    let resolved = run(&[
        "resolve",
        "route",
        "local_route",
        "env=prod",
        "version=v1",
        "--database-url",
        &url,
    ]);
    assert!(resolved.status.success(), "{}", stderr(&resolved));
    let text = stdout(&resolved);
    assert!(text.contains("matches env=prod, version=v1"), "{text}");
    assert!(text.contains("value: prod-v1"), "{text}");
    let none = run(&["resolve", "route", "ghost", "--database-url", &url]);
    assert_eq!(none.status.code(), Some(1));

    let dir = tempfile::tempdir().unwrap();
    let export = dir.path().join("export.yaml");
    let exported = run(&[
        "export",
        "--database-url",
        &url,
        "-o",
        export.to_str().unwrap(),
    ]);
    assert!(exported.status.success(), "{}", stderr(&exported));
    // The round trip: applying the export changes nothing.
    let again = run(&[
        "apply",
        "-f",
        export.to_str().unwrap(),
        "--database-url",
        &url,
    ]);
    assert_eq!(
        stdout(&again),
        "no changes; the store stays at revision 1\n",
        "{}",
        stderr(&again)
    );
    // Neither do the original fixtures; a dry run of an edit writes nothing.
    let dry = run(&[
        "apply",
        "-f",
        fixtures.to_str().unwrap(),
        "--database-url",
        &url,
        "--dry-run",
    ]);
    assert!(stdout(&dry).contains("no changes"), "{}", stdout(&dry));
}

async fn prune_deletes_what_the_fixtures_omit(db: TestDb) {
    let url = db.url.clone();
    let fixtures = fixtures();
    assert!(
        run(&[
            "apply",
            "-f",
            fixtures.to_str().unwrap(),
            "--database-url",
            &url
        ])
        .status
        .success()
    );
    let only_routes = fixtures.join("routes.yaml");
    let routes = only_routes.to_str().unwrap();
    // No scope: refused, nothing deleted (kubectl's `--prune` needs `-l` or `--all` too).
    let unscoped = run(&["apply", "-f", routes, "--database-url", &url, "--prune"]);
    assert_eq!(unscoped.status.code(), Some(2), "{}", stdout(&unscoped));
    assert!(
        stderr(&unscoped).contains("--prune needs a scope"),
        "{}",
        stderr(&unscoped)
    );
    // Scoped to clusters, as a dry run: the three clusters, nothing else, nothing written.
    let clusters = ["--database-url", &url, "--prune", "--prune-type", "cluster"];
    let dry = run(&[&["apply", "-f", routes, "--dry-run"][..], &clusters[..]].concat());
    assert!(dry.status.success(), "{}", stderr(&dry));
    let text = stdout(&dry);
    assert!(text.contains("(dry run: nothing written)"), "{text}");
    assert_eq!(text.matches("deleted").count(), 3, "{text}");
    assert!(!text.contains("listener"), "{text}");
    // `vxds diff --prune` shows the same deletions.
    let diff = run(&[&["diff", "-f", routes][..], &clusters[..]].concat());
    assert_eq!(diff.status.code(), Some(1), "{}", stderr(&diff));
    let text = stdout(&diff);
    for cluster in ["backend", "backend_eds", "backend_dns"] {
        assert!(
            text.contains(&format!("--- server/cluster/{cluster}\n+++ /dev/null")),
            "{text}"
        );
    }
    assert!(!text.contains("listener/http"), "{text}");
    // A name prefix narrows it further.
    let narrowed = run(&[
        &["apply", "-f", routes, "--dry-run"][..],
        &clusters[..],
        &["--prune-prefix", "backend_"][..],
    ]
    .concat());
    assert_eq!(stdout(&narrowed).matches("deleted").count(), 2);
    let pruned = run(&[
        "apply",
        "-f",
        routes,
        "--database-url",
        &url,
        "--prune",
        "--all",
    ]);
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    let text = stdout(&pruned);
    assert!(text.starts_with("revision 2: 5 changes"), "{text}");
    assert_eq!(text.matches("deleted").count(), 5);
    let export = run(&["export", "--database-url", &url]);
    assert_eq!(
        stdout(&export).matches("\ntype: ").count()
            + usize::from(stdout(&export).starts_with("type:")),
        1
    );
}

/// A `vxds serve` process on ephemeral ports, with its own directory.
struct Server {
    process: ServeProcess,
    base: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
        let process = ServeProcess::start(binary, dir.path(), extra).unwrap();
        Server {
            base: process.admin_url.clone(),
            process,
            _dir: dir,
        }
    }
}

#[test]
fn apply_and_resolve_against_a_running_server_with_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "write ci-write-token-0123456789 ci\nread ci-read-token-0123456789\n",
    )
    .unwrap();
    let server = Server::start(&["--admin-token-file", tokens.to_str().unwrap()]);
    let fixtures = fixtures();
    let f = fixtures.to_str().unwrap();

    let anonymous = run(&["apply", "-f", f, "--server", &server.base]);
    assert_eq!(anonymous.status.code(), Some(2), "{}", stderr(&anonymous));
    assert!(
        stderr(&anonymous).contains("HTTP 401"),
        "{}",
        stderr(&anonymous)
    );
    let reader = run(&[
        "apply",
        "-f",
        f,
        "--server",
        &server.base,
        "--token",
        "ci-read-token-0123456789",
    ]);
    assert!(stderr(&reader).contains("HTTP 403"), "{}", stderr(&reader));

    let applied = run(&[
        "apply",
        "-f",
        f,
        "--server",
        &server.base,
        "--token",
        "ci-write-token-0123456789",
    ]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(stdout(&applied).starts_with("revision 1: 6 changes"));
    let resolved = vxds()
        .args([
            "resolve",
            "route",
            "local_route",
            "env=canary",
            "version=v1",
            "--json",
            "--server",
            &server.base,
        ])
        .env("VXDS_TOKEN", "ci-read-token-0123456789")
        .output()
        .unwrap();
    assert!(resolved.status.success(), "{}", stderr(&resolved));
    let answer: serde_json::Value = serde_json::from_slice(&resolved.stdout).unwrap();
    assert_eq!(
        answer["variant"]["constraints_text"],
        r#"env != "prod" && version = "v1""#
    );

    // Export (`GET /v1/export`, a read token will do) and apply it back: nothing changes.
    let export = run(&[
        "export",
        "--server",
        &server.base,
        "--token",
        "ci-read-token-0123456789",
    ]);
    assert!(export.status.success(), "{}", stderr(&export));
    assert_eq!(stdout(&export).matches("---\n").count(), 6);
    let file = tempfile::NamedTempFile::with_suffix(".yaml").unwrap();
    std::fs::write(file.path(), &export.stdout).unwrap();
    let again = run(&[
        "apply",
        "-f",
        file.path().to_str().unwrap(),
        "--server",
        &server.base,
        "--token",
        "ci-write-token-0123456789",
    ]);
    assert_eq!(
        stdout(&again),
        "no changes; the store stays at revision 1\n",
        "{}",
        stderr(&again)
    );
}

/// Review finding 6: `apply --wait` exits 1 only when a client refused the revision; a write
/// the server refuses (here a conflict: `must_not_exist` on a resource that exists) made no
/// revision to wait for, and is an error, 2, as a timeout is. Without `--wait` a refused write
/// stays 1.
#[test]
fn apply_wait_tells_a_refused_write_from_a_refused_rollout() {
    let server = Server::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.yaml");
    let cluster = |must_not_exist: bool| {
        format!(
            "type: cluster\nname: c1\nmust_not_exist: {must_not_exist}\nvariants:\n  - resource:\n      \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster\n      name: c1\n      connect_timeout: 1s\n"
        )
    };
    std::fs::write(&file, cluster(false)).unwrap();
    let f = file.to_str().unwrap();
    // Nothing connected: the revision concerns no stream, and completes at once.
    let applied = run(&["apply", "-f", f, "--server", &server.base, "--wait", "10s"]);
    assert_eq!(applied.status.code(), Some(0), "{}", stderr(&applied));
    std::fs::write(&file, cluster(true)).unwrap();
    let conflict = run(&["apply", "-f", f, "--server", &server.base, "--wait", "10s"]);
    assert_eq!(conflict.status.code(), Some(2), "{}", stderr(&conflict));
    assert!(
        stderr(&conflict).contains("error:"),
        "{}",
        stderr(&conflict)
    );
    let conflict = run(&["apply", "-f", f, "--server", &server.base]);
    assert_eq!(conflict.status.code(), Some(1), "{}", stderr(&conflict));
}

/// `vxds token create` prints a random token and a token-file line holding its SHA-256 (checked
/// here with `sha2`, not the server's code), and a server loading those lines accepts the token
/// with the scope asked for.
#[test]
fn token_create_prints_a_token_and_its_hashed_line() {
    use base64::Engine;
    use sha2::{Digest, Sha256};

    let create = |scope: &str, name: &str| {
        let output = run(&["token", "create", "--scope", scope, "--name", name]);
        assert!(output.status.success(), "{}", stderr(&output));
        let text = stdout(&output);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let (token, line) = (lines[0].to_owned(), lines[1].to_owned());
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&token)
            .unwrap();
        assert_eq!(secret.len(), 32);
        let hex: String = Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(line, format!("{scope} sha256:{hex} {name}"));
        assert!(!line.contains(&token));
        (token, line)
    };
    let (writer, write_line) = create("write", "ci-bot");
    let (reader, read_line) = create("read", "dashboard");
    assert_ne!(writer, reader);

    let refused = run(&["token", "create", "--scope", "admin", "--name", "x"]);
    assert_eq!(refused.status.code(), Some(2));
    let spaced = run(&["token", "create", "--scope", "read", "--name", "a b"]);
    assert_eq!(spaced.status.code(), Some(2));
    assert!(stderr(&spaced).contains("one word"), "{}", stderr(&spaced));

    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{write_line}\n{read_line}\n")).unwrap();
    let server = Server::start(&["--admin-token-file", tokens.to_str().unwrap()]);
    let fixtures = fixtures();
    let f = fixtures.to_str().unwrap();
    let apply = |token: &str| run(&["apply", "-f", f, "--server", &server.base, "--token", token]);
    let as_reader = apply(&reader);
    assert!(
        stderr(&as_reader).contains("HTTP 403"),
        "{}",
        stderr(&as_reader)
    );
    let as_hash = apply(&write_line.split(' ').nth(1).unwrap()["sha256:".len()..]);
    assert!(
        stderr(&as_hash).contains("HTTP 401"),
        "{}",
        stderr(&as_hash)
    );
    let as_writer = apply(&writer);
    assert!(as_writer.status.success(), "{}", stderr(&as_writer));
    assert!(stdout(&as_writer).starts_with("revision 1: "));
}

#[test]
fn serve_refuses_an_open_admin_address_without_tokens() {
    let output = run(&[
        "serve",
        "--admin-addr",
        "0.0.0.0:0",
        "--database-url",
        "sqlite::memory:",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr(&output).contains("refusing to serve the admin API on 0.0.0.0:0 without tokens"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn serve_stops_gracefully_on_sigterm() {
    let mut server = Server::start(&[]);
    let pid = server.process.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = server.process.child.try_wait().unwrap() {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "vxds serve ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A client that trickles its request headers (slowloris) is disconnected once the header
/// timeout passes; a prompt client on another connection is served meanwhile.
#[test]
fn the_admin_api_cuts_off_clients_that_trickle_headers() {
    use std::io::{Read, Write};
    let server = Server::start(&["--admin-header-timeout", "1s"]);
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut slow = std::net::TcpStream::connect(&address).unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
    let started = Instant::now();
    // A prompt client is not held up by the slow one.
    let mut prompt = std::net::TcpStream::connect(&address).unwrap();
    prompt
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    prompt.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // The slow one gets its connection closed (possibly after a 408), not kept forever.
    let mut rest = Vec::new();
    let read = slow.read_to_end(&mut rest);
    assert!(
        read.is_ok(),
        "the connection was still open after 8 s: {read:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    let text = String::from_utf8_lossy(&rest);
    assert!(
        text.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
}

/// Issue 25: `/metrics` carries the allocator's heap figures, so that a soak can tell a leak
/// (allocated grows) from retention (resident grows, allocated flat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_server_reports_its_heap_on_metrics() {
    let server = Server::start(&[]);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let metrics = reqwest::get(format!("{}/metrics", server.base))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {metrics}"))
    };
    let allocated = value("vxds_heap_allocated_bytes");
    let resident = value("vxds_heap_resident_bytes");
    assert!(allocated > 0.0 && resident >= allocated, "{metrics}");
}
