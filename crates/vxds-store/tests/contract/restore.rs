//! Restoring a past revision and showing what a revision changed, on both backends.

use vxds_store::{PastState, RestoreError, RestoreOptions};

use super::*;

on_both_backends!(
    a_restore_undoes_creates_updates_and_deletes,
    a_revision_shows_each_resource_before_and_after,
    a_restore_todays_rules_reject_is_refused,
    a_restore_is_guarded_by_the_expected_revision,
    states_written_before_the_history_are_not_restored,
    a_restore_brings_back_ttls,
    a_restore_brings_back_a_secrets_sharing,
);

fn put_route(name: &str, variants: &[(&str, &str)]) -> Value {
    let variants: Vec<Value> = variants
        .iter()
        .map(|(c, body)| json!({"constraints": c, "resource": route(name, body)}))
        .collect();
    json!({"op": "put", "type": "route", "name": name, "variants": variants})
}

fn delete_route(name: &str) -> Value {
    json!({"op": "delete", "type": "route", "name": name})
}

fn ops(operations: Vec<Value>) -> ChangesetRequest {
    changeset(json!({ "operations": operations }))
}

fn put_secret(shared: bool, ca: &str) -> Value {
    json!({"op": "put", "type": "secret", "name": "ca", "shared": shared, "variants": [
        {"resource": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
            "name": "ca", "validation_context": {"trusted_ca": {"inline_string": ca}}}}]})
}

/// Issue 22: restoring (or rolling back to) a revision brings back whether a secret was
/// marked shared with its variants: it neither shares nor unshares a secret by itself.
async fn a_restore_brings_back_a_secrets_sharing(db: TestDb) {
    let store = db.store().await;
    let secret = key(
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret",
        "ca",
    );
    let state = |store: &vxds_store::Store| {
        let (store, secret) = (store.clone(), secret.clone());
        async move {
            let s = store.get(&secret).await.unwrap().unwrap();
            (s.shared, s.version)
        }
    };
    // r1 shared; r2 the same variants unshared; r3 shared with other variants; r4 deleted.
    store
        .apply(ops(vec![put_secret(true, "CA1")]), None)
        .await
        .unwrap();
    let at1 = state(&store).await;
    assert!(at1.0);
    store
        .apply(ops(vec![put_secret(false, "CA1")]), None)
        .await
        .unwrap();
    let at2 = state(&store).await;
    assert!(!at2.0);
    store
        .apply(ops(vec![put_secret(true, "CA2")]), None)
        .await
        .unwrap();
    store
        .apply(
            ops(vec![
                json!({"op": "delete", "type": "secret", "name": "ca"}),
            ]),
            None,
        )
        .await
        .unwrap();

    // Recreated from r1: shared, at r1's version.
    store
        .restore(1, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(state(&store).await, at1);
    // Back to r2: the same variants, unshared again.
    store
        .restore(2, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(state(&store).await, at2);
    // And shared again from r1 over the unshared state.
    store
        .restore(1, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(state(&store).await, at1);
}

async fn a_restore_brings_back_ttls(db: TestDb) {
    let store = db.store().await;
    let with_ttl = json!({"op": "put", "type": "route", "name": "t", "variants": [
        {"resource": route("t", "t"), "ttl": "30s"}]});
    store.apply(ops(vec![with_ttl]), None).await.unwrap();
    let before = store.get(&key(ROUTE, "t")).await.unwrap().unwrap();
    assert_eq!(
        before.variants[0].ttl,
        Some(std::time::Duration::from_secs(30))
    );
    store
        .apply(ops(vec![put_route("t", &[("*", "t")])]), None)
        .await
        .unwrap();
    let without = store.get(&key(ROUTE, "t")).await.unwrap().unwrap();
    assert_eq!(without.variants[0].ttl, None);
    store
        .restore(1, RestoreOptions::default(), None)
        .await
        .unwrap();
    let restored = store.get(&key(ROUTE, "t")).await.unwrap().unwrap();
    assert_eq!(
        restored.variants[0].ttl,
        Some(std::time::Duration::from_secs(30))
    );
    assert_eq!(restored.variants[0].version, before.variants[0].version);
}

async fn a_restore_undoes_creates_updates_and_deletes(db: TestDb) {
    let store = db.store().await;
    store
        .apply(
            ops(vec![
                put_route(
                    "a",
                    &[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")],
                ),
                put_route("b", &[("*", "b")]),
            ]),
            None,
        )
        .await
        .unwrap();
    let a1 = store.get(&key(ROUTE, "a")).await.unwrap().unwrap();
    let b1 = store.get(&key(ROUTE, "b")).await.unwrap().unwrap();
    // Revision 2 updates a, deletes b, creates c; revision 3 updates a again.
    store
        .apply(
            ops(vec![
                put_route("a", &[("*", "changed")]),
                delete_route("b"),
                put_route("c", &[("*", "c")]),
            ]),
            None,
        )
        .await
        .unwrap();
    store
        .apply(ops(vec![put_route("a", &[("*", "again")])]), None)
        .await
        .unwrap();

    let restored = store
        .restore(1, RestoreOptions::default(), Some("ops".into()))
        .await
        .unwrap();
    assert_eq!(restored.restored_to, 1);
    assert_eq!(restored.applied.revision, 4);
    let kinds: Vec<(&str, ChangeKind)> = restored
        .applied
        .changes
        .iter()
        .map(|c| (c.key.name.as_str(), c.change))
        .collect();
    assert_eq!(
        kinds,
        [
            ("a", ChangeKind::Updated),
            ("b", ChangeKind::Created),
            ("c", ChangeKind::Deleted)
        ]
    );
    let a = store.get(&key(ROUTE, "a")).await.unwrap().unwrap();
    assert_eq!(a.version, a1.version);
    assert_eq!(a.variants.len(), 2);
    assert_eq!(a.variants[0].body, a1.variants[0].body);
    assert_eq!(a.variants[1].constraints, a1.variants[1].constraints);
    let b = store.get(&key(ROUTE, "b")).await.unwrap().unwrap();
    assert_eq!((b.version, b.created_revision), (b1.version, 4));
    assert!(store.get(&key(ROUTE, "c")).await.unwrap().is_none());
    let revision = store.revision(4).await.unwrap().unwrap();
    assert_eq!(revision.author.as_deref(), Some("ops"));
    assert_eq!(revision.message.as_deref(), Some("restore to revision 1"));

    // The state it is in: nothing to do, no revision.
    let again = store
        .restore(4, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(again.applied.revision, 4);
    assert!(again.applied.changes.is_empty());
    // Revision 1's state is revision 4's: no revision either.
    let same = store
        .restore(1, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert!(same.applied.changes.is_empty());
    assert_eq!(store.head_revision().await.unwrap(), 4);

    // Back to revision 3, with a message of the operator's; then to the empty store.
    let options = RestoreOptions {
        message: Some("undo the undo".into()),
        ..Default::default()
    };
    let forward = store.restore(3, options, None).await.unwrap();
    assert_eq!(forward.applied.revision, 5);
    let revision = store.revision(5).await.unwrap().unwrap();
    assert_eq!(
        revision.message.as_deref(),
        Some("restore to revision 3: undo the undo")
    );
    let a = store.get(&key(ROUTE, "a")).await.unwrap().unwrap();
    let ty = ResourceType::resolve(ROUTE).unwrap();
    let body = Body::from_any_bytes(a.variants[0].body.clone(), &ty).unwrap();
    assert_eq!(body.to_json(&ty), route("a", "again"));
    assert!(store.get(&key(ROUTE, "b")).await.unwrap().is_none());
    assert!(store.get(&key(ROUTE, "c")).await.unwrap().is_some());
    let empty = store
        .restore(0, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(empty.applied.changes.len(), 2);
    assert!(
        store
            .list(&ListQuery {
                limit: 10,
                ..Default::default()
            })
            .await
            .unwrap()
            .resources
            .is_empty()
    );

    assert!(matches!(
        store.restore(99, RestoreOptions::default(), None).await,
        Err(RestoreError::NoSuchRevision(99))
    ));
}

async fn a_revision_shows_each_resource_before_and_after(db: TestDb) {
    let store = db.store().await;
    store
        .apply(
            ops(vec![
                put_route("a", &[("*", "one")]),
                put_route("b", &[("*", "b")]),
            ]),
            None,
        )
        .await
        .unwrap();
    store
        .apply(
            ops(vec![
                put_route("a", &[(r#"env = "prod""#, "two")]),
                delete_route("b"),
            ]),
            None,
        )
        .await
        .unwrap();
    let diff = store.revision_diff(2).await.unwrap().unwrap();
    assert_eq!(diff.revision.revision, 2);
    let [a, b] = &diff.resources[..] else {
        panic!()
    };
    assert_eq!(a.change.change, ChangeKind::Updated);
    let (PastState::Present(before), PastState::Present(after)) = (&a.before, &a.after) else {
        panic!()
    };
    assert_eq!(before[0].constraints.to_string(), "*");
    assert_eq!(after[0].constraints.to_string(), r#"env = "prod""#);
    assert_eq!(b.change.change, ChangeKind::Deleted);
    assert!(matches!(b.before, PastState::Present(_)));
    assert_eq!(b.after, PastState::Absent);
    let created = store.revision_diff(1).await.unwrap().unwrap();
    assert!(
        created
            .resources
            .iter()
            .all(|r| r.before == PastState::Absent)
    );
    assert!(store.revision_diff(3).await.unwrap().is_none());
}

/// The old state is validated like any changeset: here a server restarted with a lower
/// variant limit than the one the old state was written under.
async fn a_restore_todays_rules_reject_is_refused(db: TestDb) {
    let store = db.store().await;
    store
        .apply(
            ops(vec![
                put_route("a", &[("*", "a")]),
                put_route(
                    "b",
                    &[
                        (r#"env = "a""#, "a"),
                        (r#"env = "b""#, "b"),
                        (r#"env = "c""#, "c"),
                    ],
                ),
            ]),
            None,
        )
        .await
        .unwrap();
    store
        .apply(
            ops(vec![
                put_route("a", &[("*", "one")]),
                put_route("b", &[("*", "one")]),
            ]),
            None,
        )
        .await
        .unwrap();
    let mut validation = vxds_envoy::changeset::ValidationConfig::default();
    validation.variant_limits.max_variants = 2;
    let strict = Store::connect(
        &db.url,
        StoreOptions {
            validation,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let Err(RestoreError::Apply(ApplyError::Invalid(invalid))) =
        strict.restore(1, RestoreOptions::default(), None).await
    else {
        panic!("expected the restore to be refused")
    };
    assert_eq!(invalid.errors.len(), 1, "{invalid:?}");
    // Named by the resource: the second operation of the restore, the one refused.
    assert!(
        invalid.errors[0].message.starts_with("`b`: "),
        "{invalid:?}"
    );
    assert_eq!(invalid.errors[0].pointer.to_string(), "");
    assert_eq!(strict.head_revision().await.unwrap(), 2);
}

async fn a_restore_is_guarded_by_the_expected_revision(db: TestDb) {
    let store = db.store().await;
    store
        .apply(ops(vec![put_route("a", &[("*", "one")])]), None)
        .await
        .unwrap();
    store
        .apply(ops(vec![put_route("a", &[("*", "two")])]), None)
        .await
        .unwrap();
    let stale = RestoreOptions {
        expected_revision: Some(1),
        ..Default::default()
    };
    let Err(RestoreError::Apply(ApplyError::Conflict(conflict))) =
        store.restore(1, stale, None).await
    else {
        panic!("expected a conflict")
    };
    assert_eq!(conflict.pointer.to_string(), "/expected_revision");
    assert_eq!(conflict.message, "the store is at revision 2, not 1");

    // A dry run reports and commits nothing.
    let dry = RestoreOptions {
        expected_revision: Some(2),
        dry_run: true,
        ..Default::default()
    };
    let report = store.restore(1, dry, None).await.unwrap();
    assert!(report.applied.dry_run);
    assert_eq!(report.applied.revision, 3);
    assert_eq!(store.head_revision().await.unwrap(), 2);
    let current = RestoreOptions {
        expected_revision: Some(2),
        ..Default::default()
    };
    assert_eq!(
        store
            .restore(1, current, None)
            .await
            .unwrap()
            .applied
            .revision,
        3
    );
}

/// A store written before migration 0002 kept only each resource's latest variant set: an
/// older state is refused by name, and a diff says its variants are not known.
async fn states_written_before_the_history_are_not_restored(db: TestDb) {
    let store = db.store().await;
    store
        .apply(ops(vec![put_route("a", &[("*", "one")])]), None)
        .await
        .unwrap();
    store
        .apply(ops(vec![put_route("a", &[("*", "two")])]), None)
        .await
        .unwrap();
    // What the migration's backfill leaves: the current set only.
    let pool = sqlx::AnyPool::connect(&db.url).await.unwrap();
    sqlx::query("DELETE FROM vxds_variant_history WHERE revision = 1")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let Err(RestoreError::HistoryNotKept { key, revision }) =
        store.restore(1, RestoreOptions::default(), None).await
    else {
        panic!("expected history_not_kept")
    };
    assert_eq!((key.name.as_str(), revision), ("a", 1));
    assert_eq!(store.head_revision().await.unwrap(), 2);
    let diff = store.revision_diff(2).await.unwrap().unwrap();
    assert_eq!(diff.resources[0].before, PastState::NotKept);
    assert!(matches!(diff.resources[0].after, PastState::Present(_)));
}
