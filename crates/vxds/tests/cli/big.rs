//! A store beyond the old limit of 10,000 operations, through the command line against a
//! running server on each backend: `apply` of 12,000 resources is one revision, `export` →
//! `diff` is equal, `diff` finds the one resource edited, and `rollback` empties the store and
//! brings it back, each in one revision. (The 100,000-resource figures are the `big_write`
//! example's, in docs/benchmarks.md.)

use super::*;

on_both_backends!(a_store_of_twelve_thousand_round_trips_through_the_cli);

const RESOURCES: usize = 12_000;

fn endpoints_yaml(count: usize) -> String {
    let mut text = String::new();
    for i in 0..count {
        text.push_str(&format!(
            "---\ntype: endpoint\nname: ep-{i:05}\nvariants:\n  - resource:\n      \"@type\": \
             type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\n      \
             cluster_name: ep-{i:05}\n      endpoints:\n        - lb_endpoints:\n            - \
             endpoint: {{address: {{socket_address: {{address: 10.0.0.1, port_value: 8080}}}}}}\n"
        ));
    }
    text
}

async fn a_store_of_twelve_thousand_round_trips_through_the_cli(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let server = ServeProcess::start_on(binary, dir.path(), &db.url, "127.0.0.1:0", &[]).unwrap();
    let base = server.admin_url.clone();
    let file = dir.path().join("big.yaml");
    std::fs::write(&file, endpoints_yaml(RESOURCES)).unwrap();
    let f = file.to_str().unwrap();

    let applied = run(&["apply", "-f", f, "--server", &base]);
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(
        stdout(&applied).starts_with(&format!("revision 1: {RESOURCES} changes\n")),
        "{}",
        &stdout(&applied)[..200.min(stdout(&applied).len())]
    );

    let exported = dir.path().join("export.yaml");
    let export = run(&[
        "export",
        "--server",
        &base,
        "-o",
        exported.to_str().unwrap(),
    ]);
    assert!(export.status.success(), "{}", stderr(&export));
    let e = exported.to_str().unwrap();
    let equal = run(&["diff", "-f", e, "--server", &base]);
    assert_eq!(equal.status.code(), Some(0), "{}", stderr(&equal));
    assert_eq!(stdout(&equal), "");
    let again = run(&["apply", "-f", e, "--server", &base]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(
        stdout(&again),
        "no changes; the store stays at revision 1\n"
    );

    // One resource edited: the diff shows it alone.
    let text = std::fs::read_to_string(&exported).unwrap();
    let at = text.find("name: ep-07777\n").unwrap();
    let port = at + text[at..].find("port_value: 8080").unwrap();
    let edited = format!(
        "{}port_value: 9090{}",
        &text[..port],
        &text[port + "port_value: 8080".len()..]
    );
    let edited_file = dir.path().join("edited.yaml");
    std::fs::write(&edited_file, edited).unwrap();
    let differs = run(&[
        "diff",
        "-f",
        edited_file.to_str().unwrap(),
        "--server",
        &base,
    ]);
    assert_eq!(differs.status.code(), Some(1), "{}", stderr(&differs));
    let out = stdout(&differs);
    assert_eq!(
        out.matches("\n--- server/").count() + usize::from(out.starts_with("--- server/")),
        1,
        "{out}"
    );
    assert!(out.contains("endpoint/ep-07777"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with('+') && l.contains("port_value: 9090")),
        "{out}"
    );

    // Down to the empty store and back, one revision each.
    let emptied = run(&["rollback", "--to", "0", "--server", &base]);
    assert!(emptied.status.success(), "{}", stderr(&emptied));
    assert!(
        stdout(&emptied).starts_with("restored revision 0 as revision 2\n"),
        "{}",
        &stdout(&emptied)[..200.min(stdout(&emptied).len())]
    );
    assert_eq!(stdout(&emptied).matches("  deleted ").count(), RESOURCES);
    let restored = run(&["rollback", "--to", "1", "--server", &base]);
    assert!(restored.status.success(), "{}", stderr(&restored));
    assert!(
        stdout(&restored).starts_with("restored revision 1 as revision 3\n"),
        "{}",
        &stdout(&restored)[..200.min(stdout(&restored).len())]
    );
    let equal = run(&["diff", "-f", e, "--server", &base]);
    assert_eq!(equal.status.code(), Some(0), "{}", stderr(&equal));
    drop(server);
}
