//! History retention on both backends: pruning removes what no kept revision needs, keeps the
//! head's state and every kept revision's diff and restore exactly as they were, and answers
//! `HistoryPruned` for the rest; the index starts from the head's state.

use vxds_store::{
    ChangeBatch, Followed, RestoreError, RestoreOptions, Restored, Retention, RevisionDiff,
    Snapshot,
};

use super::*;

on_both_backends!(
    pruning_keeps_the_head_and_every_kept_revision,
    pruned_revisions_answer_history_pruned,
    pruning_by_age_keeps_the_head_revision,
    pruning_removes_the_rows_no_kept_revision_needs,
    the_index_starts_from_the_head_state,
    a_reader_from_before_the_pruned_revision_gets_the_whole_state,
    the_newest_pruned_revision_is_the_boundary,
    a_reader_at_the_newest_pruned_revision_is_checked,
);

fn put(name: &str, body: &str) -> Value {
    json!({"op": "put", "type": "route", "name": name,
           "variants": [{"resource": route(name, body)}]})
}

fn del(name: &str) -> Value {
    json!({"op": "delete", "type": "route", "name": name})
}

/// Ten revisions over five routes, with deletions and re-creations. At the head: a (9), b
/// (4), c (10), e (7); d was deleted at 8.
fn script() -> Vec<Vec<Value>> {
    vec![
        vec![put("a", "a1"), put("b", "b1")],
        vec![put("a", "a2")],
        vec![del("b"), put("c", "c1")],
        vec![put("b", "b2"), put("a", "a3")],
        vec![put("c", "c2"), put("d", "d1")],
        vec![del("a")],
        vec![put("e", "e1")],
        vec![del("d")],
        vec![put("a", "a4")],
        vec![put("c", "c3")],
    ]
}

async fn write(store: &Store, revisions: impl IntoIterator<Item = Vec<Value>>) {
    for operations in revisions {
        store
            .apply(changeset(json!({ "operations": operations })), None)
            .await
            .unwrap();
    }
}

fn count(n: u64) -> Retention {
    Retention {
        revisions: Some(n),
        age: None,
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn diffs(store: &Store, revisions: std::ops::RangeInclusive<u64>) -> Vec<RevisionDiff> {
    let mut found = Vec::new();
    for revision in revisions {
        found.push(store.revision_diff(revision).await.unwrap().unwrap());
    }
    found
}

async fn restores(store: &Store, to: std::ops::RangeInclusive<u64>) -> Vec<Restored> {
    let mut found = Vec::new();
    for to in to {
        let options = RestoreOptions {
            dry_run: true,
            ..Default::default()
        };
        found.push(store.restore(to, options, None).await.unwrap());
    }
    found
}

fn pruned(e: StoreError) -> (u64, u64) {
    match e {
        StoreError::HistoryPruned {
            revision,
            oldest_kept,
        } => (revision, oldest_kept),
        other => panic!("expected HistoryPruned, got {other:?}"),
    }
}

async fn rows(db: &TestDb, table: &str) -> i64 {
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let sql = format!("SELECT COUNT(*) FROM {table}");
    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    n
}

async fn pruning_keeps_the_head_and_every_kept_revision(db: TestDb) {
    let store = db.store().await;
    write(&store, script()).await;
    let head = store.export(None).await.unwrap();
    let diffs_before = diffs(&store, 7..=10).await;
    let restores_before = restores(&store, 6..=10).await;

    let oldest = store.prune_all_at(&count(4), now_ms()).await.unwrap();
    assert_eq!(oldest, 7);
    assert_eq!(store.oldest_kept_revision().await.unwrap(), 7);
    assert_eq!(store.export(None).await.unwrap(), head);
    assert_eq!(diffs(&store, 7..=10).await, diffs_before);
    assert_eq!(restores(&store, 6..=10).await, restores_before);

    // A second round sweeps over what the first left as the kept revisions' starting state.
    write(
        &store,
        [vec![put("b", "b3"), del("e")], vec![put("a", "a5")]],
    )
    .await;
    let head = store.export(None).await.unwrap();
    let diffs_before = diffs(&store, 10..=12).await;
    let restores_before = restores(&store, 9..=12).await;
    assert_eq!(store.prune_all_at(&count(3), now_ms()).await.unwrap(), 10);
    assert_eq!(store.export(None).await.unwrap(), head);
    assert_eq!(diffs(&store, 10..=12).await, diffs_before);
    assert_eq!(restores(&store, 9..=12).await, restores_before);

    // A restore of a kept revision still writes, as one new revision.
    let restored = store
        .restore(10, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(restored.applied.revision, 13);
    assert_eq!(
        store.get(&key(ROUTE, "a")).await.unwrap().unwrap().version,
        restores_before[1].applied.changes[0]
            .version
            .clone()
            .unwrap()
    );
}

async fn pruned_revisions_answer_history_pruned(db: TestDb) {
    let store = db.store().await;
    write(&store, script()).await;
    // Nothing pruned: everything answers.
    assert_eq!(store.oldest_kept_revision().await.unwrap(), 1);
    store.revision_diff(1).await.unwrap().unwrap();
    store.prune_all_at(&count(4), now_ms()).await.unwrap();

    assert_eq!(pruned(store.revision(3).await.unwrap_err()), (3, 7));
    assert_eq!(pruned(store.revision_diff(6).await.unwrap_err()), (6, 7));
    assert_eq!(store.revision(0).await.unwrap(), None);
    assert_eq!(store.revision(11).await.unwrap(), None);
    let restore = store.restore(5, RestoreOptions::default(), None).await;
    match restore {
        Err(RestoreError::Apply(ApplyError::Store(e))) => assert_eq!(pruned(e), (5, 7)),
        other => panic!("expected HistoryPruned, got {other:?}"),
    }
    let listed: Vec<u64> = store
        .revisions(0, 100)
        .await
        .unwrap()
        .iter()
        .map(|r| r.revision)
        .collect();
    assert_eq!(listed, [7, 8, 9, 10]);
    assert_eq!(store.revisions(8, 100).await.unwrap().len(), 2);
    assert_eq!(store.head_revision().await.unwrap(), 10);
}

async fn pruning_by_age_keeps_the_head_revision(db: TestDb) {
    let store = db.store().await;
    write(&store, script()).await;
    let hour = Retention {
        revisions: None,
        age: Some(Duration::from_secs(3600)),
    };
    let now = now_ms();
    // Everything is younger than an hour.
    assert_eq!(store.prune_all_at(&hour, now).await.unwrap(), 1);
    store.revision_diff(1).await.unwrap().unwrap();
    // Two hours later all of it is older, but the head stays.
    let head = store.export(None).await.unwrap();
    assert_eq!(
        store.prune_all_at(&hour, now + 7_200_000).await.unwrap(),
        10
    );
    assert_eq!(store.export(None).await.unwrap(), head);
    store.revision_diff(10).await.unwrap().unwrap();
    assert_eq!(pruned(store.revision_diff(9).await.unwrap_err()), (9, 10));
    // Both limits: the stricter one wins.
    write(&store, [vec![put("a", "a5")], vec![put("a", "a6")]]).await;
    let both = Retention {
        revisions: Some(1),
        age: Some(Duration::from_secs(3600)),
    };
    assert_eq!(store.prune_all_at(&both, now).await.unwrap(), 12);
}

async fn pruning_removes_the_rows_no_kept_revision_needs(db: TestDb) {
    let store = db.store().await;
    write(&store, script()).await;
    assert_eq!(rows(&db, "vxds_revision_changes").await, 14);
    assert_eq!(rows(&db, "vxds_revisions").await, 10);
    let head = store.export(None).await.unwrap();
    assert_eq!(store.prune_all_at(&count(1), now_ms()).await.unwrap(), 10);
    // Left: revision 10 (c) and the state it starts from: a (9), b (4), c (5), e (7); d's
    // deletion (8) says no more than no row.
    assert_eq!(rows(&db, "vxds_revision_changes").await, 5);
    assert_eq!(rows(&db, "vxds_revisions").await, 5);
    assert_eq!(rows(&db, "vxds_variant_history").await, 5);
    assert_eq!(store.export(None).await.unwrap(), head);
    if db.backend == vxds_testkit::Db::Sqlite {
        // A new SQLite file gives pruned pages back: incremental auto-vacuum.
        let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
        let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        assert_eq!(mode, 2);
    }
    // Pruning again finds nothing to do.
    let step = store.prune_step_at(&count(1), now_ms()).await.unwrap();
    assert!(step.done);
    assert_eq!((step.swept, step.oldest_kept), (0, 10));
}

/// The resources of a snapshot, with their versions and revisions.
fn contents(snapshot: &Snapshot) -> Vec<(String, String, u64)> {
    snapshot
        .of_type(ROUTE)
        .map(|r| (r.name.to_string(), r.version.clone(), r.revision))
        .collect()
}

async fn the_index_starts_from_the_head_state(db: TestDb) {
    let store = db.store().await;
    write(&store, script()).await;
    // What replaying the whole change log gives.
    let replayed = Snapshot::default().apply(store.changes_since(0).await.unwrap());
    store.prune_all_at(&count(1), now_ms()).await.unwrap();
    let (index, writer) = index::start(store.clone()).await.unwrap();
    let loaded = index.snapshot();
    assert_eq!(loaded.revision, 10);
    assert_eq!(contents(&loaded), contents(&replayed));
    assert_eq!(contents(&loaded).len(), 4);
    // It remembers the head revision's change list only.
    assert_eq!(
        loaded.changed_since(9),
        Some([std::sync::Arc::new(key(ROUTE, "c"))].into())
    );
    assert_eq!(loaded.changed_since(8), None);
    // And follows on from there.
    write(&store, [vec![del("c")]]).await;
    let next = tokio::time::timeout(Duration::from_secs(10), index.wait_for(11))
        .await
        .unwrap();
    assert!(next.get(ROUTE, "c").is_none());
    assert_eq!(
        next.changed_since(9),
        Some([std::sync::Arc::new(key(ROUTE, "c"))].into())
    );
    writer.abort();
}

async fn a_reader_from_before_the_pruned_revision_gets_the_whole_state(db: TestDb) {
    let store = db.store().await;
    let mut revisions = script();
    let later = revisions.split_off(5);
    write(&store, revisions).await;
    let at_five = Snapshot::default().apply(store.changes_since(0).await.unwrap());
    assert!(at_five.get(ROUTE, "d").is_some());
    write(&store, later).await;
    store.prune_all_at(&count(2), now_ms()).await.unwrap();
    // d's deletion (8) was pruned: only the whole state can say it is gone.
    let batch: ChangeBatch = store.changes_since(5).await.unwrap();
    assert!(batch.complete);
    let caught_up = at_five.apply(batch);
    assert!(caught_up.get(ROUTE, "d").is_none());
    let fresh = Snapshot::default().apply(store.current_state().await.unwrap());
    assert_eq!(contents(&caught_up), contents(&fresh));
    // From a kept revision, only what changed.
    let batch = store.changes_since(9).await.unwrap();
    assert!(!batch.complete);
    assert_eq!(batch.resources.len(), 1);
}

/// Issue 21: the revision numbers either side of `pruned_through`. The newest pruned one
/// answers `HistoryPruned` naming the next, which answers as before; a reader at the newest
/// pruned one is one revision behind and gets only what changed since; one before it, the
/// whole state.
async fn the_newest_pruned_revision_is_the_boundary(db: TestDb) {
    let store = db.store().await;
    let mut revisions = script();
    let later = revisions.split_off(9);
    write(&store, revisions).await;
    let at_nine = Snapshot::default().apply(store.changes_since(0).await.unwrap());
    write(&store, later).await;
    assert_eq!(store.prune_all_at(&count(1), now_ms()).await.unwrap(), 10);
    let fresh = Snapshot::default().apply(store.current_state().await.unwrap());

    assert_eq!(pruned(store.revision(9).await.unwrap_err()), (9, 10));
    assert_eq!(store.revision(10).await.unwrap().unwrap().revision, 10);
    assert_eq!(pruned(store.revision_diff(9).await.unwrap_err()), (9, 10));
    let diff = store.revision_diff(10).await.unwrap().unwrap();
    assert_eq!(diff.resources.len(), 1);
    // The state right after 9 is what 10 starts from: it may still be restored; 8's not.
    let dry_run = || RestoreOptions {
        dry_run: true,
        ..Default::default()
    };
    let restored = store.restore(9, dry_run(), None).await.unwrap();
    assert_eq!(restored.applied.changes.len(), 1);
    match store.restore(8, dry_run(), None).await {
        Err(RestoreError::Apply(ApplyError::Store(e))) => assert_eq!(pruned(e), (8, 10)),
        other => panic!("expected HistoryPruned, got {other:?}"),
    }

    let batch = store.changes_since(9).await.unwrap();
    assert!(!batch.complete);
    assert_eq!(contents(&at_nine.apply(batch)), contents(&fresh));
    assert!(store.changes_since(8).await.unwrap().complete);
}

/// A reader that holds the newest pruned revision as some commit is checked like one at a
/// kept revision: its commit id is compared while the revision's row is there, and when the
/// pruning removed the row (nothing kept refers to it) it is sent the whole state, as a
/// reader from before is — never only the changes after a state it may not share.
async fn a_reader_at_the_newest_pruned_revision_is_checked(db: TestDb) {
    let store = db.store().await;
    let mut revisions = script();
    let later = revisions.split_off(9);
    write(&store, revisions).await;
    let at_nine = store.changes_since(0).await.unwrap();
    let (nine, commit) = (at_nine.revision, at_nine.commit_id);
    assert_eq!(nine, 9);
    write(&store, later).await;
    // 9 (a's last put) is pruned but its row stays: the state 10 starts from.
    assert_eq!(store.prune_all_at(&count(1), now_ms()).await.unwrap(), 10);
    match store.changes_after(9, commit).await.unwrap() {
        Followed::Changes(batch) => {
            assert!(!batch.complete);
            assert_eq!(batch.revision, 10);
        }
        other => panic!("expected the changes after 9, got {other:?}"),
    }
    assert_eq!(
        store
            .changes_after(9, commit.wrapping_add(1))
            .await
            .unwrap(),
        Followed::Diverged { head: 10 }
    );

    // 12 (x's deletion) is pruned with its row: it cannot be checked.
    write(&store, [vec![put("x", "x1")], vec![del("x")]]).await;
    let at_twelve = store.changes_since(0).await.unwrap();
    assert_eq!(at_twelve.revision, 12);
    write(&store, [vec![put("a", "a5")]]).await;
    assert_eq!(store.prune_all_at(&count(1), now_ms()).await.unwrap(), 13);
    assert_eq!(rows_at(&db, 12).await, 0);
    let fresh = Snapshot::default().apply(store.current_state().await.unwrap());
    for commit in [at_twelve.commit_id, at_twelve.commit_id.wrapping_add(1)] {
        match store.changes_after(12, commit).await.unwrap() {
            Followed::Changes(batch) => {
                assert!(batch.complete, "the changes after an unchecked 12");
                let caught_up = Snapshot::default().apply(at_twelve.clone()).apply(batch);
                assert_eq!(contents(&caught_up), contents(&fresh));
            }
            other => panic!("expected the whole state, got {other:?}"),
        }
    }
    // Without a commit to check, the changes after 12 are all kept.
    assert!(!store.changes_since(12).await.unwrap().complete);
}

/// Whether revision `n`'s row is still in `vxds_revisions`.
async fn rows_at(db: &TestDb, n: i64) -> i64 {
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    let found: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM vxds_revisions WHERE revision = $1")
        .bind(n)
        .fetch_one(&pool)
        .await
        .unwrap();
    pool.close().await;
    found
}
