//! How a store learns of commits it did not make, on both backends: another process's commits
//! (SQLite has no notifications), and a database whose head went backwards (a restore).

use super::*;

on_both_backends!(
    another_process_commits_reach_the_index,
    a_head_that_goes_backwards_reloads_the_index,
);

fn polling_quickly() -> StoreOptions {
    StoreOptions {
        head_poll: Some(Duration::from_millis(100)),
        ..Default::default()
    }
}

fn put_route_named(name: &str) -> ChangesetRequest {
    changeset(
        json!({"operations": [{"op": "put", "type": "route", "name": name,
        "variants": [{"resource": route(name, name)}]}]}),
    )
}

async fn another_process_commits_reach_the_index(db: TestDb) {
    let server = Store::connect(&db.url, polling_quickly()).await.unwrap();
    let (index, task) = index::start(server.clone()).await.unwrap();
    // `vxds apply --database-url` beside a running server: a store of its own.
    let cli = Store::connect(&db.url, StoreOptions::default())
        .await
        .unwrap();
    cli.apply(put_route_named("from-the-cli"), None)
        .await
        .unwrap();
    let snapshot = tokio::time::timeout(Duration::from_secs(10), index.wait_for(1))
        .await
        .expect("the running server's index follows the other process");
    assert!(snapshot.get(ROUTE, "from-the-cli").is_some());
    cli.close().await;
    task.abort();
}

async fn a_head_that_goes_backwards_reloads_the_index(db: TestDb) {
    let writer = db.store().await;
    for name in ["a", "b", "c"] {
        writer.apply(put_route_named(name), None).await.unwrap();
    }
    let replica = Store::connect(&db.url, polling_quickly()).await.unwrap();
    let (index, task) = index::start(replica.clone()).await.unwrap();
    assert_eq!(index.snapshot().revision, 3);

    // The database is restored to revision 1, in one transaction (as a restore from backup
    // or a failover shows it: never half of it).
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for sql in [
        "DELETE FROM vxds_revision_changes WHERE revision > 1",
        "DELETE FROM vxds_revisions WHERE revision > 1",
        "DELETE FROM vxds_variant_history WHERE revision > 1",
        "DELETE FROM vxds_variants WHERE name IN ('b', 'c')",
        "DELETE FROM vxds_resources WHERE name IN ('b', 'c')",
        "UPDATE vxds_head SET revision = 1 WHERE id = 1",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    pool.close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while index.snapshot().revision != 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the index never reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(index.snapshot().get(ROUTE, "b").is_none());
    assert_eq!(replica.metrics().head_resets.get(), 1);

    // Revision 2 again, with other content: the index takes it, not the old revision 2.
    writer.apply(put_route_named("d"), None).await.unwrap();
    let snapshot = tokio::time::timeout(Duration::from_secs(10), index.wait_for(2))
        .await
        .unwrap();
    assert!(snapshot.get(ROUTE, "d").is_some());
    assert!(snapshot.get(ROUTE, "b").is_none());
    task.abort();
}
