//! Failover to a streaming standby (issue 25): each test makes its own primary and standby
//! (`vxds_testkit::cluster`), with stoppable proxies in front — one carries replication, one
//! each replica's database connections — and two replicas: A takes writes (a store), B serves
//! a Delta client (store, index and ADS server).
//!
//! Asynchronous replication loses the last commits: B must notice that the database no longer
//! holds what it indexed — here the new primary has even reused B's revision number with other
//! content — reload, and push the database's state to its client within [`BOUND`]. Synchronous
//! replication loses nothing acknowledged, and nothing is reloaded.

use std::collections::BTreeMap;

use tokio::task::block_in_place;
use tokio::time::Instant;
use vxds_store::StoreOptions;
use vxds_testkit::cluster::{PgServer, Replication};
use vxds_testkit::proxy::TcpProxy;

use super::*;

/// How long after the new primary is reachable a replica may still serve what the database no
/// longer holds (README, Production: a LISTEN reconnection within a second, a reload, a push;
/// the head poll, 10 s, if no reconnection tells it). Generous for a loaded machine.
const BOUND: Duration = Duration::from_secs(15);

struct Failover {
    primary: PgServer,
    standby: PgServer,
    replication: TcpProxy,
    /// A's and B's database addresses.
    a_db: TcpProxy,
    b_db: TcpProxy,
    writer: Store,
    server: Server,
}

impl Failover {
    async fn start(mode: Replication) -> Failover {
        let primary = block_in_place(|| PgServer::primary(mode));
        let replication = TcpProxy::start(primary.addr()).await.unwrap();
        let standby = block_in_place(|| PgServer::standby_of(replication.addr));
        let a_db = TcpProxy::start(primary.addr()).await.unwrap();
        let b_db = TcpProxy::start(primary.addr()).await.unwrap();
        let writer = Store::connect(&a_db.url_for(&primary.url()), StoreOptions::default())
            .await
            .unwrap();
        let reader = Store::connect(&b_db.url_for(&primary.url()), StoreOptions::default())
            .await
            .unwrap();
        let server = Server::start_on(reader, XdsConfig::default()).await;
        Failover {
            primary,
            standby,
            replication,
            a_db,
            b_db,
            writer,
            server,
        }
    }

    /// Commits through A, retrying while A finds the database away (as a client would):
    /// the acknowledged revision.
    async fn write(&self, ops: Value) -> u64 {
        let deadline = Instant::now() + BOUND;
        loop {
            let request: ChangesetRequest =
                serde_json::from_value(json!({"operations": ops.clone()})).unwrap();
            let applied = tokio::time::timeout(BOUND, self.writer.apply(request, None))
                .await
                .expect("a write through A is answered");
            match applied {
                Ok(applied) => return applied.revision,
                Err(e) => {
                    assert!(Instant::now() < deadline, "writing through A: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Waits until the standby has replayed `revision`.
    async fn standby_reaches(&self, revision: u64) {
        let standby = Store::connect(
            &self.standby.url(),
            StoreOptions {
                migrate: false,
                max_connections: 1,
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let deadline = Instant::now() + WAIT;
        while standby.head_revision().await.unwrap() < revision {
            assert!(
                Instant::now() < deadline,
                "the standby never replayed {revision}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        standby.close().await;
    }

    /// The primary dies; the standby is promoted. The replicas' database addresses are still
    /// unreachable afterwards.
    async fn fail_over(&self) {
        self.a_db.stop();
        self.b_db.stop();
        block_in_place(|| self.primary.crash());
        self.replication.stop();
        block_in_place(|| self.standby.promote());
    }
}

/// A Delta subscriber of every route these tests name, and the routes it holds (name → tag).
struct Client {
    stream: DeltaStream,
    held: BTreeMap<String, String>,
}

impl Client {
    async fn open(server: &Server) -> Client {
        let stream = DeltaStream::open(
            server,
            DeltaDiscoveryRequest {
                type_url: ROUTE.into(),
                node: Some(node("proxy-failover", &[])),
                resource_names_subscribe: ["a", "b", "c", "d", "e", "f"].map(String::from).to_vec(),
                ..Default::default()
            },
        )
        .await;
        Client {
            stream,
            held: BTreeMap::new(),
        }
    }

    /// Takes responses (acknowledging each) until the client holds `expected`; how long it took.
    async fn holds(&mut self, expected: &[(&str, &str)], limit: Duration) -> Duration {
        let expected: BTreeMap<String, String> = expected
            .iter()
            .map(|(n, t)| ((*n).to_owned(), (*t).to_owned()))
            .collect();
        let start = Instant::now();
        while self.held != expected {
            let remaining = limit.saturating_sub(start.elapsed());
            let Ok(response) =
                tokio::time::timeout(remaining, self.stream.responses.message()).await
            else {
                panic!(
                    "after {limit:?} the client holds {:?}, the database {expected:?}",
                    self.held
                );
            };
            let response = response.unwrap().expect("the stream stays open");
            for resource in &response.resources {
                let body = resource.resource.as_ref().expect("a body");
                self.held.insert(resource.name.clone(), tag(&body.value));
            }
            for name in &response.removed_resources {
                self.held.remove(name);
            }
            self.stream.ack(&response).await;
        }
        start.elapsed()
    }
}

fn put(name: &str, tag: &str) -> Value {
    put_route(name, &[("*", tag)])
}

fn delete(name: &str) -> Value {
    json!({"op": "delete", "type": "route", "name": name})
}

/// Asynchronous replication: three acknowledged, pushed revisions are lost; the new primary
/// then commits three others under the same numbers. B's client converges to the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_asynchronous_failover_converges_to_the_new_primary() {
    let f = Failover::start(Replication::Asynchronous).await;
    let mut client = Client::open(&f.server).await;
    assert_eq!(f.write(json!([put("a", "v1"), put("b", "v1")])).await, 1);
    client.holds(&[("a", "v1"), ("b", "v1")], WAIT).await;
    f.standby_reaches(1).await;

    // Replication is cut: what follows never reaches the standby.
    f.replication.stop();
    assert_eq!(f.write(json!([put("a", "v2")])).await, 2);
    assert_eq!(f.write(json!([put("c", "lost")])).await, 3);
    assert_eq!(f.write(json!([put("d", "lost"), delete("b")])).await, 4);
    client
        .holds(&[("a", "v2"), ("c", "lost"), ("d", "lost")], WAIT)
        .await;
    let before = f.server.xds.registry().snapshot();
    assert_eq!(before.revision, 4);

    f.fail_over().await;
    // A reaches the new primary first and commits revisions 2 to 4 again, other ones.
    f.a_db.resume_to(f.standby.addr()).await.unwrap();
    assert_eq!(f.write(json!([put("e", "new")])).await, 2);
    assert_eq!(f.write(json!([put("a", "v3")])).await, 3);
    assert_eq!(f.write(json!([put("c", "new")])).await, 4);

    // B's database address now leads to the new primary: same head number, other history.
    f.b_db.resume_to(f.standby.addr()).await.unwrap();
    let took = client
        .holds(
            &[("a", "v3"), ("b", "v1"), ("c", "new"), ("e", "new")],
            BOUND,
        )
        .await;
    let after = f.server.xds.registry().snapshot();
    assert_eq!(after.revision, 4);
    assert!(after.epoch > before.epoch, "the index was reloaded");
    assert_ne!(after.commit_id, before.commit_id);
    assert!(f.server.store.metrics().head_resets.get() >= 1);
    eprintln!("converged {took:?} after the new primary became reachable");

    // New writes keep flowing.
    assert_eq!(f.write(json!([put("f", "new"), delete("e")])).await, 5);
    client
        .holds(
            &[("a", "v3"), ("b", "v1"), ("c", "new"), ("f", "new")],
            WAIT,
        )
        .await;
    assert_eq!(f.server.xds.registry().snapshot().revision, 5);
}

/// Synchronous replication: a commit is acknowledged only once the standby has it, so the
/// failover loses nothing acknowledged and B reloads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronous_failover_loses_no_acknowledged_write() {
    let f = Failover::start(Replication::Synchronous).await;
    let mut client = Client::open(&f.server).await;
    assert_eq!(f.write(json!([put("a", "v1"), put("b", "v1")])).await, 1);
    assert_eq!(f.write(json!([put("a", "v2")])).await, 2);
    assert_eq!(f.write(json!([put("c", "kept")])).await, 3);

    // Replication cut: a commit waits for the standby, unacknowledged, and goes through once
    // the standby is back.
    f.replication.stop();
    let writer = f.writer.clone();
    let request: ChangesetRequest =
        serde_json::from_value(json!({"operations": [put("d", "kept"), delete("b")]})).unwrap();
    let mut pending = tokio::spawn(async move { writer.apply(request, None).await });
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), &mut pending)
            .await
            .is_err(),
        "a synchronous commit is not acknowledged while the standby is away"
    );
    f.replication.resume().await.unwrap();
    let applied = tokio::time::timeout(WAIT, pending)
        .await
        .expect("acknowledged once the standby is back")
        .unwrap()
        .unwrap();
    assert_eq!(applied.revision, 4);
    client
        .holds(&[("a", "v2"), ("c", "kept"), ("d", "kept")], WAIT)
        .await;
    let before = f.server.xds.registry().snapshot();

    f.fail_over().await;
    f.a_db.resume_to(f.standby.addr()).await.unwrap();
    f.b_db.resume_to(f.standby.addr()).await.unwrap();
    assert_eq!(f.write(json!([put("e", "new")])).await, 5);
    client
        .holds(
            &[("a", "v2"), ("c", "kept"), ("d", "kept"), ("e", "new")],
            BOUND,
        )
        .await;
    let after = f.server.xds.registry().snapshot();
    assert_eq!(after.revision, 5);
    assert_eq!(
        after.epoch, before.epoch,
        "nothing was lost, nothing reloaded"
    );
    assert_eq!(f.server.store.metrics().head_resets.get(), 0);
}
