//! `vxds rollback --to N`, straight on each store backend and against a running server.

use super::*;

on_both_backends!(rollback_restores_a_revision_straight_on_the_database);

async fn rollback_restores_a_revision_straight_on_the_database(db: TestDb) {
    let url = db.url.clone();
    let fixtures = fixtures();
    let all = run(&[
        "apply",
        "-f",
        fixtures.to_str().unwrap(),
        "--database-url",
        &url,
    ]);
    assert!(all.status.success(), "{}", stderr(&all));
    let routes = fixtures.join("routes.yaml");
    let pruned = run(&[
        "apply",
        "-f",
        routes.to_str().unwrap(),
        "--database-url",
        &url,
        "--prune",
        "--all",
    ]);
    assert!(pruned.status.success(), "{}", stderr(&pruned));

    let stale = run(&[
        "rollback",
        "--to",
        "1",
        "--expected-revision",
        "1",
        "--database-url",
        &url,
    ]);
    assert_eq!(stale.status.code(), Some(1), "{}", stderr(&stale));
    assert!(
        stderr(&stale).contains("the store is at revision 2, not 1"),
        "{}",
        stderr(&stale)
    );
    let dry = run(&["rollback", "--to", "1", "--dry-run", "--database-url", &url]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(
        stdout(&dry).starts_with("restoring revision 1 would make revision 3\n"),
        "{}",
        stdout(&dry)
    );

    let restored = run(&[
        "rollback",
        "--to",
        "1",
        "--expected-revision",
        "2",
        "--database-url",
        &url,
    ]);
    assert!(restored.status.success(), "{}", stderr(&restored));
    let text = stdout(&restored);
    assert!(
        text.starts_with("restored revision 1 as revision 3\n"),
        "{text}"
    );
    assert_eq!(text.matches("created").count(), 5, "{text}");
    // The fixtures are the store again: applying them changes nothing.
    let again = run(&[
        "apply",
        "-f",
        fixtures.to_str().unwrap(),
        "--database-url",
        &url,
    ]);
    assert_eq!(
        stdout(&again),
        "no changes; the store stays at revision 3\n",
        "{}",
        stderr(&again)
    );

    let noop = run(&["rollback", "--to", "3", "--database-url", &url]);
    assert!(noop.status.success(), "{}", stderr(&noop));
    assert_eq!(
        stdout(&noop),
        "the store already is in revision 3's state; no revision was made\n"
    );
    let missing = run(&["rollback", "--to", "7", "--database-url", &url]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("there is no revision 7"),
        "{}",
        stderr(&missing)
    );
}

#[test]
fn rollback_against_a_running_server_records_the_token_name() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "write ops-write-token-0123456789 ops\n").unwrap();
    let server = Server::start(&["--admin-token-file", tokens.to_str().unwrap()]);
    let fixtures = fixtures();
    let with_token = |args: &[&str]| {
        vxds()
            .args(args)
            .args(["--server", &server.base])
            .env("VXDS_TOKEN", "ops-write-token-0123456789")
            .output()
            .unwrap()
    };
    assert!(
        with_token(&["apply", "-f", fixtures.to_str().unwrap()])
            .status
            .success()
    );
    let routes = fixtures.join("routes.yaml");
    assert!(
        with_token(&["apply", "-f", routes.to_str().unwrap(), "--prune", "--all"])
            .status
            .success()
    );

    let anonymous = run(&["rollback", "--to", "1", "--server", &server.base]);
    assert_eq!(anonymous.status.code(), Some(2));
    assert!(
        stderr(&anonymous).contains("HTTP 401"),
        "{}",
        stderr(&anonymous)
    );
    let restored = with_token(&["rollback", "--to", "1", "-m", "pruned too much"]);
    assert!(restored.status.success(), "{}", stderr(&restored));
    assert!(stdout(&restored).starts_with("restored revision 1 as revision 3\n"));

    let revision = get_json(
        &server.base,
        "/v1/revisions/3",
        "ops-write-token-0123456789",
    );
    assert_eq!(revision["author"], "ops");
    assert_eq!(
        revision["message"],
        "restore to revision 1: pruned too much"
    );
    assert_eq!(revision["changes"].as_array().unwrap().len(), 5);
}

/// A GET over plain HTTP/1.1, as curl would send it: the test needs no HTTP client of its own.
fn get_json(base: &str, path: &str, token: &str) -> serde_json::Value {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{response}");
    serde_json::from_str(body).unwrap()
}
