//! A changeset larger than the old limit of 10,000 operations: one revision, and back through
//! restore, on both backends. Kept at 12,000 small resources so that the suite stays fast; the
//! 100,000-resource figures are the `big_write` example's (docs/benchmarks.md).

use vxds_store::RestoreOptions;

use super::*;

on_both_backends!(a_changeset_beyond_ten_thousand_is_one_revision_and_round_trips);

const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const RESOURCES: usize = 12_000;

fn endpoints(count: usize) -> ChangesetRequest {
    let operations: Vec<Value> = (0..count)
        .map(|i| {
            let name = format!("ep-{i:05}");
            json!({"op": "put", "type": "endpoint", "name": name, "variants": [{"resource": {
                "@type": ENDPOINT,
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": "10.0.0.1", "port_value": 8080}}}}]}],
            }}]})
        })
        .collect();
    changeset(json!({"message": "bulk", "operations": operations}))
}

/// Every stored `(name, version)`, a page at a time.
async fn versions(store: &Store) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list(&ListQuery {
                limit: 1000,
                after,
                ..Default::default()
            })
            .await
            .unwrap();
        out.extend(page.resources.into_iter().map(|r| (r.key.name, r.version)));
        match page.next {
            Some(next) => after = Some(next),
            None => return out,
        }
    }
}

async fn a_changeset_beyond_ten_thousand_is_one_revision_and_round_trips(db: TestDb) {
    let store = db.store().await;
    let applied = store.apply(endpoints(RESOURCES), None).await.unwrap();
    assert_eq!(applied.revision, 1, "one revision");
    assert_eq!(applied.changes.len(), RESOURCES);
    assert_eq!(store.head_revision().await.unwrap(), 1);
    let written = versions(&store).await;
    assert_eq!(written.len(), RESOURCES);

    // Its diff reads a page at a time.
    let page = store
        .revision_diff_page(1, RESOURCES - 50, 100)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(page.revision.changes.len(), RESOURCES);
    assert_eq!(page.resources.len(), 50);
    assert_eq!(
        page.resources[0].change.key.name,
        format!("ep-{:05}", RESOURCES - 50)
    );

    // Down to the empty store in one revision, and back again.
    let emptied = store
        .restore(0, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(emptied.applied.revision, 2);
    assert_eq!(emptied.applied.changes.len(), RESOURCES);
    assert!(
        emptied
            .applied
            .changes
            .iter()
            .all(|c| c.change == ChangeKind::Deleted)
    );
    assert!(versions(&store).await.is_empty());
    let restored = store
        .restore(1, RestoreOptions::default(), None)
        .await
        .unwrap();
    assert_eq!(restored.applied.revision, 3);
    assert_eq!(restored.applied.changes.len(), RESOURCES);
    assert_eq!(store.head_revision().await.unwrap(), 3);
    assert_eq!(
        versions(&store).await,
        written,
        "the same state as revision 1"
    );
}
