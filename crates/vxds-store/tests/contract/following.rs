//! How the index follows commits, on both backends: its own store's, each seen whole; and how a
//! store learns of commits it did not make: a second store's and another process's (SQLite has
//! no notifications), and a database whose head went backwards (a restore).

use super::*;

on_both_backends!(
    the_index_follows_every_commit,
    a_second_store_sees_the_first_ones_commits,
    another_process_commits_reach_the_index,
    a_head_that_goes_backwards_reloads_the_index,
    a_writer_that_finds_the_head_behind_reloads_the_index_at_once,
    the_same_revision_as_another_commit_reloads_the_index,
    a_diverged_revision_at_pruned_through_reloads_the_index,
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

async fn the_index_follows_every_commit(db: TestDb) {
    let store = db.store().await;
    store
        .apply(
            put_routes(&[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")]),
            None,
        )
        .await
        .unwrap();
    let (index, writer) = index::start(store.clone()).await.unwrap();
    let snapshot = index.snapshot();
    assert_eq!(snapshot.revision, 1);
    let resource = snapshot.get(ROUTE, "r").unwrap();
    let prod = resource
        .resolve(&ParamSet::new().with("env", "prod"))
        .unwrap();
    assert_eq!(prod.constraints.to_string(), r#"env = "prod""#);
    assert!(prod.constraints_bytes.is_some());
    assert_eq!(
        resource
            .resolve(&ParamSet::new())
            .unwrap()
            .constraints
            .to_string(),
        r#"env != "prod""#
    );

    // Split prod by version: one revision, seen whole.
    let split = store
        .apply(
            put_routes(&[
                (r#"env = "prod" && version = "v1""#, "prod-v1"),
                (r#"env = "prod" && version != "v1""#, "prod-rest"),
                (
                    r#"env != "prod" && (exists(version) || !exists(version))"#,
                    "other",
                ),
            ]),
            None,
        )
        .await
        .unwrap();
    let snapshot = tokio::time::timeout(Duration::from_secs(10), index.wait_for(split.revision))
        .await
        .unwrap();
    assert_eq!(snapshot.revision, 2);
    let resource = snapshot.get(ROUTE, "r").unwrap();
    assert_eq!(resource.variants.len(), 3);
    let v1 = resource
        .resolve(&ParamSet::new().with("env", "prod").with("version", "v1"))
        .unwrap();
    assert_eq!(
        v1.constraints.to_string(),
        r#"env = "prod" && version = "v1""#
    );
    assert_eq!(
        snapshot.changed_since(1),
        Some([std::sync::Arc::new(key(ROUTE, "r"))].into())
    );
    // The old snapshot still holds the old state.
    assert_eq!(index.wait_for(0).await.revision, 2);

    store
        .apply(
            changeset(json!({"operations": [{"op": "delete", "type": "route", "name": "r"}]})),
            None,
        )
        .await
        .unwrap();
    let snapshot = tokio::time::timeout(Duration::from_secs(10), index.wait_for(3))
        .await
        .unwrap();
    assert!(snapshot.get(ROUTE, "r").is_none());
    assert_eq!(
        snapshot.changed_since(0),
        Some([std::sync::Arc::new(key(ROUTE, "r"))].into())
    );
    writer.abort();
}

/// A second store on the same database: it loads what the first wrote, and with Postgres
/// LISTEN/NOTIFY it learns of every new commit at once.
async fn a_second_store_sees_the_first_ones_commits(db: TestDb) {
    let writer = db.store().await;
    writer
        .apply(put_routes(&[("*", "one")]), None)
        .await
        .unwrap();
    let replica = db.store().await;
    let (index, task) = index::start(replica.clone()).await.unwrap();
    assert_eq!(index.snapshot().revision, 1);
    // Postgres notifies; SQLite is polled.
    writer
        .apply(put_routes(&[("*", "two")]), None)
        .await
        .unwrap();
    let snapshot = tokio::time::timeout(Duration::from_secs(10), index.wait_for(2))
        .await
        .unwrap();
    assert_eq!(snapshot.revision, 2);
    assert_eq!(*replica.watch_head().borrow(), 2);
    task.abort();
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

/// Restores the database to revision 1 of three (routes a, b, c), in one transaction, as a
/// restore from backup or a failover shows it: never half of it.
async fn restore_to_revision_1(db: &TestDb) {
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
}

/// Issue 25: a replica that writes right after a failover to a lagging standby finds the
/// database's head (1) below what it indexed (3) under the writers' lock. Its index checks at
/// once, not at the next poll (here an hour away) or LISTEN reconnection: it reloads and
/// holds the new revision 2, not the lost revisions 2 and 3.
async fn a_writer_that_finds_the_head_behind_reloads_the_index_at_once(db: TestDb) {
    let options = StoreOptions {
        head_poll: Some(Duration::from_secs(3600)),
        ..Default::default()
    };
    let replica = Store::connect(&db.url, options).await.unwrap();
    for name in ["a", "b", "c"] {
        replica.apply(put_route_named(name), None).await.unwrap();
    }
    let (index, task) = index::start(replica.clone()).await.unwrap();
    assert_eq!(index.snapshot().revision, 3);
    restore_to_revision_1(&db).await;

    let applied = replica.apply(put_route_named("d"), None).await.unwrap();
    assert_eq!(applied.revision, 2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let snapshot = index.snapshot();
        if snapshot.get(ROUTE, "d").is_some() {
            assert!(
                snapshot.get(ROUTE, "b").is_none(),
                "a lost revision's route"
            );
            assert!(
                snapshot.get(ROUTE, "c").is_none(),
                "a lost revision's route"
            );
            assert_eq!(snapshot.revision, 2);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the index never took the write made on the restored database (at {})",
            snapshot.revision
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(replica.metrics().head_resets.get(), 1);
    assert_eq!(*replica.watch_head().borrow(), 2);
    task.abort();
}

/// Issue 25: the database now holds the indexed revision number as another commit (restored
/// or failed over, then written to that same number) with nothing newer: only a check of the
/// commit shows it. The head poll asks for that check on both backends (SQLite too: a file
/// restored under a running server).
async fn the_same_revision_as_another_commit_reloads_the_index(db: TestDb) {
    let writer = db.store().await;
    for name in ["a", "b", "c"] {
        writer.apply(put_route_named(name), None).await.unwrap();
    }
    let replica = Store::connect(&db.url, polling_quickly()).await.unwrap();
    let (index, task) = index::start(replica.clone()).await.unwrap();
    assert_eq!(index.snapshot().revision, 3);

    // Revision 3 becomes another commit that deleted `c` instead, in one transaction.
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for sql in [
        "UPDATE vxds_revisions SET commit_id = commit_id + 1 WHERE revision = 3",
        "DELETE FROM vxds_variant_history WHERE name = 'c'",
        "DELETE FROM vxds_variants WHERE name = 'c'",
        "DELETE FROM vxds_resources WHERE name = 'c'",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    pool.close().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while index.snapshot().get(ROUTE, "c").is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the index never noticed that revision 3 is another commit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(index.snapshot().revision, 3);
    assert_eq!(replica.metrics().head_resets.get(), 1);
    task.abort();
}

/// Issue 25: the index holds revision 3, which the retention has just pruned
/// (`pruned_through` = 3: its row is still there), and the database holds 3 as another commit
/// (a failover), then a revision 4. The commit check must not skip revision 3 for being pruned
/// while the index goes on from it with changes after it: it reloads, and `c` (lost) is gone.
async fn a_diverged_revision_at_pruned_through_reloads_the_index(db: TestDb) {
    let writer = db.store().await;
    for name in ["a", "b", "c"] {
        writer.apply(put_route_named(name), None).await.unwrap();
    }
    let replica = Store::connect(&db.url, polling_quickly()).await.unwrap();
    let (index, task) = index::start(replica.clone()).await.unwrap();
    assert_eq!(index.snapshot().revision, 3);

    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    for sql in [
        "UPDATE vxds_revisions SET commit_id = commit_id + 1 WHERE revision = 3",
        "DELETE FROM vxds_variant_history WHERE name = 'c'",
        "DELETE FROM vxds_variants WHERE name = 'c'",
        "DELETE FROM vxds_resources WHERE name = 'c'",
        "UPDATE vxds_retention SET pruned_through = 3 WHERE id = 1",
    ] {
        sqlx::query(sql).execute(&mut *tx).await.unwrap();
    }
    tx.commit().await.unwrap();
    pool.close().await;
    writer.apply(put_route_named("e"), None).await.unwrap();

    let snapshot = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let snapshot = index.snapshot();
            if snapshot.get(ROUTE, "e").is_some() {
                return snapshot;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the index follows to revision 4");
    assert!(
        snapshot.get(ROUTE, "c").is_none(),
        "the index kept a route of the lost commit at revision 3"
    );
    assert_eq!(replica.metrics().head_resets.get(), 1);
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
