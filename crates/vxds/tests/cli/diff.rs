//! `vxds diff -f PATH...`: unified diffs between the store and the fixtures, exit 0 when
//! equal and 1 when different, straight on each store backend.

use super::*;

on_both_backends!(diff_shows_what_the_fixtures_would_change);

async fn diff_shows_what_the_fixtures_would_change(db: TestDb) {
    let url = db.url.clone();
    let fixtures = fixtures();
    let f = fixtures.to_str().unwrap();
    let nothing = run(&["diff", "-f", f, "--database-url", &url]);
    assert_eq!(nothing.status.code(), Some(1), "{}", stderr(&nothing));
    assert!(
        stdout(&nothing).starts_with("--- /dev/null\n+++ fixtures/"),
        "{}",
        stdout(&nothing)
    );
    assert!(
        run(&["apply", "-f", f, "--database-url", &url])
            .status
            .success()
    );
    let equal = run(&["diff", "-f", f, "--database-url", &url]);
    assert_eq!(equal.status.code(), Some(0), "{}", stderr(&equal));
    assert_eq!(stdout(&equal), "");

    // A body edited, a variant's constraints changed, and a new resource.
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "clusters.yaml",
        "endpoints.yaml",
        "listener.yaml",
        "routes.yaml",
    ] {
        std::fs::copy(fixtures.join(file), dir.path().join(file)).unwrap();
    }
    let routes = dir.path().join("routes.yaml");
    let text = std::fs::read_to_string(&routes).unwrap();
    let edited = text.replace("value: base}", "value: base-2}").replace(
        r#"env = "prod" && version != "v1""#,
        r#"env = "prod" && version != "v1" && version != "v0""#,
    );
    assert_ne!(edited, text);
    std::fs::write(&routes, edited).unwrap();
    std::fs::write(
        dir.path().join("extra.yaml"),
        "type: route\nname: extra\nvariants:\n  - resource: {\"@type\": type.googleapis.com/envoy.config.route.v3.RouteConfiguration, name: extra}\n",
    )
    .unwrap();
    let d = dir.path().to_str().unwrap();
    let differs = run(&["diff", "-f", d, "--database-url", &url, "--context", "1"]);
    assert_eq!(differs.status.code(), Some(1), "{}", stderr(&differs));
    let out = stdout(&differs);
    assert!(
        out.contains("--- /dev/null\n+++ fixtures/route/extra\n"),
        "{out}"
    );
    // Per variant: a changed body under its constraints; new constraint text is one variant
    // gone and one new.
    let base = r#"route/local_route [env != "prod" && version != "v1"]"#;
    assert!(
        out.contains(&format!("--- server/{base}\n+++ fixtures/{base}\n")),
        "{out}"
    );
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.contains(&"-    value: base"), "{out}");
    assert!(lines.contains(&"+    value: base-2"), "{out}");
    assert!(
        out.contains(concat!(
            r#"--- server/route/local_route [env = "prod" && version != "v1"]"#,
            "\n+++ /dev/null\n"
        )),
        "{out}"
    );
    assert!(
        lines.contains(&r#"+constraints: env = "prod" && version != "v0" && version != "v1""#),
        "{out}"
    );
    // Clusters and the listener are the same: not shown.
    assert!(!out.contains("cluster/"), "{out}");

    // Applied, they are equal again.
    assert!(
        run(&["apply", "-f", d, "--database-url", &url])
            .status
            .success()
    );
    let equal = run(&["diff", "-f", d, "--database-url", &url]);
    assert_eq!(equal.status.code(), Some(0), "{}", stdout(&equal));

    // A TTL alone is a difference too.
    let extra = dir.path().join("extra.yaml");
    let text = std::fs::read_to_string(&extra).unwrap();
    std::fs::write(&extra, format!("{}    ttl: 30s\n", text)).unwrap();
    let ttl = run(&["diff", "-f", d, "--database-url", &url]);
    assert_eq!(ttl.status.code(), Some(1), "{}", stderr(&ttl));
    assert!(stdout(&ttl).contains("+ttl: 30s"), "{}", stdout(&ttl));

    // Fixtures the rules refuse: no comparison, exit 2.
    std::fs::write(
        dir.path().join("extra.yaml"),
        "type: route\nname: extra\nvariants: []\n",
    )
    .unwrap();
    let refused = run(&["diff", "-f", d, "--database-url", &url]);
    assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
}
