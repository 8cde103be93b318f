//! A lossy Postgres failover under a real Envoy (issue 25): a primary with an asynchronous
//! streaming standby (`vxds_testkit::cluster`), stoppable proxies for replication and for each
//! replica's database address, and two `vxds serve` replicas — A takes the writes through its
//! REST API, B serves a Delta Envoy. Replication is cut, three revisions are committed and
//! pushed to the Envoy, the primary dies, the standby is promoted and A commits other content
//! under the same revision numbers. The Envoy must end up holding what the new primary holds,
//! within the README's bound, and later writes reach it.

use std::collections::BTreeMap;

use tokio::task::block_in_place;
use vxds_testkit::cluster::{PgServer, Replication};
use vxds_testkit::proxy::TcpProxy;

use super::*;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// README (Production, Failover): the failover itself plus at most ~11 s; generous for a
/// loaded machine, as the socket-level test allows.
const BOUND: Duration = Duration::from_secs(15);

/// A cluster whose content is told by its `alt_stat_name`.
fn put_cluster(name: &str, tag: &str) -> Value {
    json!({"op": "put", "type": "cluster", "name": name, "variants": [{"resource": {
        "@type": CLUSTER,
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "alt_stat_name": tag,
    }}]})
}

fn delete_cluster(name: &str) -> Value {
    json!({"op": "delete", "type": "cluster", "name": name})
}

/// Commits `ops` through `admin`, retrying while the replica finds its database away (503),
/// as a client would; the acknowledged revision.
async fn write(client: &reqwest::Client, admin: &str, ops: Vec<Value>) -> u64 {
    let deadline = Instant::now() + BOUND;
    loop {
        let answer = client
            .post(format!("{admin}/v1/changesets"))
            .json(&json!({"operations": ops}))
            .send()
            .await;
        let (status, body) = match answer {
            Ok(answer) => (
                answer.status(),
                answer.json::<Value>().await.unwrap_or_default(),
            ),
            Err(e) => (
                reqwest::StatusCode::BAD_GATEWAY,
                json!({"error": e.to_string()}),
            ),
        };
        if status.is_success() {
            return body["revision"].as_u64().expect("a committed revision");
        }
        assert!(
            Instant::now() < deadline && status.is_server_error(),
            "writing through A: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The dynamic clusters the Envoy holds: name → `alt_stat_name`.
async fn envoy_holds(client: &reqwest::Client, admin_port: u16) -> BTreeMap<String, String> {
    let url = format!("http://127.0.0.1:{admin_port}/config_dump?resource=dynamic_active_clusters");
    let Ok(answer) = client.get(url).send().await else {
        return BTreeMap::new();
    };
    let dump: Value = answer.json().await.unwrap_or_default();
    dump["configs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let cluster = &c["cluster"];
            Some((
                cluster["name"].as_str()?.to_owned(),
                cluster["alt_stat_name"].as_str().unwrap_or("").to_owned(),
            ))
        })
        .collect()
}

/// Waits until the Envoy holds exactly `expected`; how long it took.
async fn until_envoy_holds(
    client: &reqwest::Client,
    admin_port: u16,
    expected: &[(&str, &str)],
    limit: Duration,
) -> Duration {
    let expected: BTreeMap<String, String> = expected
        .iter()
        .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
        .collect();
    let start = Instant::now();
    loop {
        let held = envoy_holds(client, admin_port).await;
        if held == expected {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?} the Envoy holds {held:?}, the database {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the standby has replayed revision `revision`.
async fn standby_reaches(standby: &PgServer, revision: u64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let head = match sqlx::PgPool::connect(&standby.url()).await {
            Ok(pool) => {
                let head: Option<i64> =
                    sqlx::query_scalar("SELECT max(revision) FROM vxds_revisions")
                        .fetch_one(&pool)
                        .await
                        .unwrap_or(None);
                pool.close().await;
                head.unwrap_or(0)
            }
            Err(_) => 0,
        };
        if head >= revision as i64 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the standby never replayed {revision}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_converges_to_the_new_primary_after_a_lossy_failover() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let (a_dir, b_dir) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();

    let primary = block_in_place(|| PgServer::primary(Replication::Asynchronous));
    let replication = TcpProxy::start(primary.addr()).await.unwrap();
    let standby = block_in_place(|| PgServer::standby_of(replication.addr));
    let a_db = TcpProxy::start(primary.addr()).await.unwrap();
    let b_db = TcpProxy::start(primary.addr()).await.unwrap();
    let binary = Path::new(env!("CARGO_BIN_EXE_vxds"));
    let a = ServeProcess::start_on(
        binary,
        &a_dir,
        &a_db.url_for(&primary.url()),
        "127.0.0.1:0",
        &[],
    )
    .unwrap();
    let b = ServeProcess::start_on(
        binary,
        &b_dir,
        &b_db.url_for(&primary.url()),
        "127.0.0.1:0",
        &[],
    )
    .unwrap();
    let client = reqwest::Client::new();

    let bootstrap = envoy_bootstrap("pg-failover", Ads::Delta, b.xds_addr.port(), json!({}), "a");
    let envoy_admin = bootstrap["admin"]["address"]["socket_address"]["port_value"]
        .as_u64()
        .unwrap() as u16;
    let _envoy = spawn_envoy(dir.path(), "pg-failover", &bootstrap);

    let admin_a = a.admin_url.clone();
    let put = |name: &str, tag: &str| put_cluster(name, tag);
    assert_eq!(
        write(&client, &admin_a, vec![put("a", "v1"), put("b", "v1")]).await,
        1
    );
    until_envoy_holds(&client, envoy_admin, &[("a", "v1"), ("b", "v1")], WAIT).await;
    standby_reaches(&standby, 1).await;

    // Replication is cut: these three are acknowledged and pushed, and never reach the standby.
    replication.stop();
    assert_eq!(write(&client, &admin_a, vec![put("a", "v2")]).await, 2);
    assert_eq!(write(&client, &admin_a, vec![put("c", "lost")]).await, 3);
    assert_eq!(
        write(
            &client,
            &admin_a,
            vec![put("d", "lost"), delete_cluster("b")]
        )
        .await,
        4
    );
    until_envoy_holds(
        &client,
        envoy_admin,
        &[("a", "v2"), ("c", "lost"), ("d", "lost")],
        WAIT,
    )
    .await;

    // The primary dies, the standby is promoted; A reaches it first and reuses 2 to 4.
    a_db.stop();
    b_db.stop();
    block_in_place(|| primary.crash());
    block_in_place(|| standby.promote());
    a_db.resume_to(standby.addr()).await.unwrap();
    assert_eq!(write(&client, &admin_a, vec![put("e", "new")]).await, 2);
    assert_eq!(write(&client, &admin_a, vec![put("a", "v3")]).await, 3);
    assert_eq!(write(&client, &admin_a, vec![put("c", "new")]).await, 4);

    // B's address now leads to the new primary: same head number, other history.
    b_db.resume_to(standby.addr()).await.unwrap();
    let took = until_envoy_holds(
        &client,
        envoy_admin,
        &[("a", "v3"), ("b", "v1"), ("c", "new"), ("e", "new")],
        BOUND,
    )
    .await;
    eprintln!("the Envoy converged {took:?} after the new primary became reachable");
    let resets = sample_sum(
        &metrics_text(&client, &b.admin_url).await,
        "vxds_store_head_resets_total",
    );
    assert!(resets >= 1.0, "B reloaded its index: {resets}");

    // New writes keep flowing to the Envoy.
    assert_eq!(
        write(
            &client,
            &admin_a,
            vec![put("f", "new"), delete_cluster("e")]
        )
        .await,
        5
    );
    until_envoy_holds(
        &client,
        envoy_admin,
        &[("a", "v3"), ("b", "v1"), ("c", "new"), ("f", "new")],
        WAIT,
    )
    .await;
}
