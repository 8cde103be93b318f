//! A store whose database goes away and comes back: requests fail fast while it is away, and
//! nothing acknowledged is lost. Postgres is shared with other tests, so the outage is a TCP
//! proxy between the store and Postgres that the test stops and resumes; a closed store stands
//! for an unreachable one on both backends.

use std::time::Instant;

use vxds_store::{DownReason, StoreState};
use vxds_testkit::proxy::TcpProxy;
use vxds_testkit::{Db, with_db};

use super::*;

on_both_backends!(a_closed_store_refuses_at_once);

/// Waits until the store's state is `up` (or not), or fails after `within`.
async fn wait_state(store: &Store, up: bool, within: Duration) -> Duration {
    let started = Instant::now();
    let mut states = store.watch_state();
    tokio::time::timeout(within, states.wait_for(|s| s.is_up() == up))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the store was not found {} within {within:?}",
                if up { "up" } else { "down" }
            )
        })
        .unwrap();
    started.elapsed()
}

fn put_named(name: &str) -> ChangesetRequest {
    changeset(
        json!({"operations": [{"op": "put", "type": "route", "name": name,
        "variants": [{"resource": route(name, name)}]}]}),
    )
}

async fn a_closed_store_refuses_at_once(db: TestDb) {
    let store = db.store().await;
    assert_eq!(store.state(), StoreState::Up);
    assert_eq!(store.metrics().up.get(), 1);
    store.close().await;
    assert!(matches!(
        store.state(),
        StoreState::Down {
            reason: DownReason::Closed,
            ..
        }
    ));
    assert_eq!(store.metrics().up.get(), 0);
    let started = Instant::now();
    let refused = store.apply(put_named("r"), None).await.unwrap_err();
    assert!(
        matches!(refused, ApplyError::Store(StoreError::Down)),
        "{refused:?}"
    );
    assert!(matches!(
        store.get(&key(ROUTE, "r")).await,
        Err(StoreError::Down)
    ));
    assert!(started.elapsed() < Duration::from_millis(100));
}

/// Postgres goes away under a store (a proxy in between stops), while a second replica keeps
/// its own connection: writes and reads fail within 2 s as unavailable; after it comes back,
/// writes succeed without a restart, both replicas' indexes get every acknowledged write, and
/// nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_going_away_fails_fast_and_loses_nothing() {
    with_db(Db::Postgres, |db| async move {
        let proxy = TcpProxy::start(db.postgres_addr()).await.unwrap();
        let options = StoreOptions {
            head_poll: Some(Duration::from_millis(500)),
            ..Default::default()
        };
        let a = Store::connect(&proxy.url_for(&db.url), options.clone())
            .await
            .unwrap();
        let b = Store::connect(&db.url, options).await.unwrap();
        let (index_a, task_a) = index::start(a.clone()).await.unwrap();
        let (index_b, task_b) = index::start(b.clone()).await.unwrap();
        let mut acknowledged = Vec::new();
        let before = a.apply(put_named("before"), None).await.unwrap();
        acknowledged.push("before".to_owned());
        tokio::time::timeout(Duration::from_secs(10), index_a.wait_for(before.revision))
            .await
            .unwrap();

        proxy.stop();
        let noticed = wait_state(&a, false, Duration::from_secs(5)).await;
        eprintln!("the store was found down {noticed:?} after the database went away");
        assert_eq!(a.metrics().up.get(), 0);
        for attempt in 0..5 {
            let started = Instant::now();
            let refused = a
                .apply(put_named(&format!("during-{attempt}")), None)
                .await
                .unwrap_err();
            let took = started.elapsed();
            assert!(
                matches!(&refused, ApplyError::Store(e) if e.is_outage()),
                "{refused:?}"
            );
            assert!(
                took < Duration::from_secs(2),
                "a write took {took:?} to fail"
            );
            let started = Instant::now();
            assert!(a.get(&key(ROUTE, "before")).await.unwrap_err().is_outage());
            assert!(started.elapsed() < Duration::from_secs(2));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The other replica still reaches the database.
        b.apply(put_named("on-b-meanwhile"), None).await.unwrap();
        acknowledged.push("on-b-meanwhile".to_owned());
        // The index still serves.
        assert!(index_a.snapshot().get(ROUTE, "before").is_some());

        proxy.resume().await.unwrap();
        let recovered = wait_state(&a, true, Duration::from_secs(5)).await;
        eprintln!("the store was found up again {recovered:?} after the database came back");
        assert_eq!(a.metrics().up.get(), 1);
        assert!(a.metrics().outages.get() >= 1);
        let after = a.apply(put_named("after"), None).await.unwrap();
        acknowledged.push("after".to_owned());

        for (replica, index) in [("a", &index_a), ("b", &index_b)] {
            let snapshot =
                tokio::time::timeout(Duration::from_secs(10), index.wait_for(after.revision))
                    .await
                    .unwrap_or_else(|_| {
                        panic!(
                            "replica {replica}'s index did not reach revision {}",
                            after.revision
                        )
                    });
            for name in &acknowledged {
                assert!(
                    snapshot.get(ROUTE, name).is_some(),
                    "replica {replica}'s index lacks {name}"
                );
            }
            assert!(snapshot.get(ROUTE, "during-0").is_none());
        }
        for name in &acknowledged {
            assert!(
                b.get(&key(ROUTE, name)).await.unwrap().is_some(),
                "{name} was lost"
            );
        }
        task_a.abort();
        task_b.abort();
        a.close().await;
        b.close().await;
    })
    .await;
}
