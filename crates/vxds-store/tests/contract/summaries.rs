//! Impact preview's share of the store: replicas' client summaries, and the variants a dry run
//! would replace.

use std::time::Duration;

use vxds_core::ParamSet;
use vxds_core::impact::{ClientSummary, Subscription, SummaryBuilder};
use vxds_store::{ChangeKind, Store};
use vxds_testkit::{TestDb, on_both_backends};

use super::{ROUTE, key, put_routes};

on_both_backends!(
    replicas_see_each_others_summaries_until_they_expire,
    a_dry_run_previews_the_variants_it_would_replace,
);

fn summary(node: &str, env: &str) -> ClientSummary {
    let mut b = SummaryBuilder::default();
    b.stream();
    b.add(
        ROUTE,
        Subscription::Name("r".into()),
        &ParamSet::new().with("env", env),
        1,
        &[node.to_owned()],
    );
    b.build()
}

/// Two stores on one database stand for two replicas.
async fn replicas_see_each_others_summaries_until_they_expire(db: TestDb) {
    let a = db.store().await;
    let b: Store = db.store().await;
    assert!(a.client_summaries().await.unwrap().is_empty());

    a.publish_client_summary("replica-a", &summary("a1", "prod"), Duration::from_secs(60))
        .await
        .unwrap();
    b.publish_client_summary("replica-b", &summary("b1", "test"), Duration::from_secs(60))
        .await
        .unwrap();
    let seen = b.client_summaries().await.unwrap();
    let ids: Vec<&str> = seen.iter().map(|s| s.replica_id.as_str()).collect();
    assert_eq!(ids, ["replica-a", "replica-b"]);
    assert_eq!(seen[0].summary, summary("a1", "prod"));
    assert!(seen[0].expires_at_ms > seen[0].published_at_ms);

    // A publish replaces the replica's row.
    a.publish_client_summary("replica-a", &summary("a2", "dev"), Duration::from_secs(60))
        .await
        .unwrap();
    let seen = b.client_summaries().await.unwrap();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].summary, summary("a2", "dev"));

    // A renewal keeps the summary and moves its expiry.
    let before = b.client_summaries().await.unwrap()[0].expires_at_ms;
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(
        a.renew_client_summary("replica-a", Duration::from_secs(120))
            .await
            .unwrap()
    );
    let renewed = &b.client_summaries().await.unwrap()[0];
    assert_eq!(renewed.summary, summary("a2", "dev"));
    assert!(renewed.expires_at_ms > before + 50_000, "{renewed:?}");
    assert!(
        !a.renew_client_summary("replica-unknown", Duration::from_secs(60))
            .await
            .unwrap()
    );

    // A replica that stops publishing ages out.
    b.publish_client_summary(
        "replica-b",
        &summary("b1", "test"),
        Duration::from_millis(50),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(120)).await;
    let seen = a.client_summaries().await.unwrap();
    let ids: Vec<&str> = seen.iter().map(|s| s.replica_id.as_str()).collect();
    assert_eq!(ids, ["replica-a"]);

    // An expired summary is not renewed: it must be published again.
    assert!(
        !b.renew_client_summary("replica-b", Duration::from_secs(60))
            .await
            .unwrap()
    );

    // A withdrawn summary is gone at once.
    a.withdraw_client_summary("replica-a").await.unwrap();
    assert!(b.client_summaries().await.unwrap().is_empty());
}

/// A dry run carries each changed resource's variants before and after; a commit does not.
async fn a_dry_run_previews_the_variants_it_would_replace(db: TestDb) {
    let store = db.store().await;
    store
        .apply(
            put_routes(&[("env = prod", "p"), ("env != prod", "o")]),
            None,
        )
        .await
        .unwrap();
    let stored = store.get(&key(ROUTE, "r")).await.unwrap().unwrap();

    let mut request = put_routes(&[("env = prod", "p2"), ("env = test", "t")]);
    request.dry_run = true;
    let applied = store.apply(request, None).await.unwrap();
    assert_eq!(applied.previews.len(), 1);
    let preview = &applied.previews[0];
    assert_eq!(preview.key, key(ROUTE, "r"));
    let before: Vec<(String, String)> = preview
        .before
        .iter()
        .map(|v| (v.constraints.to_string(), v.version.clone()))
        .collect();
    let expected: Vec<(String, String)> = stored
        .variants
        .iter()
        .map(|v| (v.constraints.to_string(), v.version.clone()))
        .collect();
    assert_eq!(before, expected);
    let after: Vec<String> = preview
        .after
        .iter()
        .map(|v| v.constraints.to_string())
        .collect();
    assert_eq!(after, [r#"env = "prod""#, r#"env = "test""#]);
    assert_ne!(preview.after[0].version, preview.before[0].version);

    // A delete previews an empty set after.
    let mut delete: vxds_envoy::changeset::ChangesetRequest = serde_json::from_value(
        serde_json::json!({"dry_run": true, "operations": [{"op": "delete", "type": "route", "name": "r"}]}),
    )
    .unwrap();
    delete.dry_run = true;
    let applied = store.apply(delete, None).await.unwrap();
    assert_eq!(applied.changes[0].change, ChangeKind::Deleted);
    assert_eq!(applied.previews[0].before.len(), 2);
    assert!(applied.previews[0].after.is_empty());

    // A commit carries none.
    let applied = store
        .apply(put_routes(&[("*", "all")]), None)
        .await
        .unwrap();
    assert!(!applied.dry_run);
    assert!(applied.previews.is_empty());
}
