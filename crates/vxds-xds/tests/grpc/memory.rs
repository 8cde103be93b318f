//! What the server keeps of past revisions: nothing of an index the streams have moved past.

use super::*;

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

on_both_backends!(a_deleted_resource_is_released_once_the_next_revision_is_published);

fn put_cluster(name: &str) -> Value {
    json!({"op": "put", "type": "cluster", "name": name, "variants": [{"resource":
        {"@type": CLUSTER, "name": name, "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}}}]})
}

/// The dispatcher once kept the previous snapshot until the write after: deleting every
/// resource left the whole old index in memory until something else was written.
async fn a_deleted_resource_is_released_once_the_next_revision_is_published(db: TestDb) {
    let server = Server::start(&db, XdsConfig::default()).await;
    server.apply(json!([put_cluster("a")])).await;
    let held = {
        let snapshot = server.xds.registry().snapshot();
        Arc::downgrade(snapshot.get(CLUSTER, "a").expect("indexed"))
    };
    server
        .apply(json!([{"op": "delete", "type": "cluster", "name": "a"}]))
        .await;
    // Published; whoever still holds the old snapshot lets it go as it moves on.
    let released = tokio::time::timeout(WAIT, async {
        while held.upgrade().is_some() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        released.is_ok(),
        "the deleted resource is still held {WAIT:?} after its deletion was published"
    );
}
