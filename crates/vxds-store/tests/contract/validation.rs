//! What only the store can check, across what it holds: the aggregate-cluster graph (cycles
//! and depth over every changeset so far), and its problems reported together with the
//! stateless ones, on both backends.

use super::*;

on_both_backends!(
    the_aggregate_graph_is_checked_across_the_store,
    every_error_is_reported_at_once,
);

async fn the_aggregate_graph_is_checked_across_the_store(db: TestDb) {
    let store = db.store().await;
    let ops = json!({"operations": [put_cluster(aggregate("a", &["b"])), put_cluster(aggregate("b", &["leaf"]))]});
    store.apply(changeset(ops), None).await.unwrap();
    // Closing the loop in a later changeset is refused, naming the cycle.
    let close = changeset(json!({"operations": [put_cluster(aggregate("leaf", &["a"]))]}));
    let ApplyError::Invalid(invalid) = store.apply(close, None).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(invalid.errors[0].code, "aggregate_cycle");
    assert_eq!(
        invalid.errors[0].message,
        "aggregate clusters form a cycle: leaf → a → b → leaf"
    );

    // A respelling of an xdstp name (context parameters reordered) is the same cluster.
    let x = "xdstp://a/envoy.config.cluster.v3.Cluster/x?p=1&q=2";
    let x_respelled = "xdstp://a/envoy.config.cluster.v3.Cluster/x?q=2&p=1";
    let y = "xdstp://a/envoy.config.cluster.v3.Cluster/y";
    let ops = json!({"operations": [put_cluster(aggregate(x, &[y]))]});
    store.apply(changeset(ops), None).await.unwrap();
    let close = changeset(json!({"operations": [put_cluster(aggregate(y, &[x_respelled]))]}));
    assert_eq!(
        codes(store.apply(close, None).await.unwrap_err()),
        ["aggregate_cycle"]
    );

    // Depth counts across changesets too: a chain of 16 is fine, 17 is not.
    let chain: Vec<Value> = (1..16)
        .map(|i| put_cluster(aggregate(&format!("d{i}"), &[&format!("d{}", i + 1)])))
        .collect();
    store
        .apply(changeset(json!({"operations": chain})), None)
        .await
        .unwrap();
    let top = changeset(json!({"operations": [put_cluster(aggregate("d0", &["d1"]))]}));
    assert_eq!(
        codes(store.apply(top, None).await.unwrap_err()),
        ["aggregate_too_deep"]
    );
    // Removing an edge makes room.
    let cut = changeset(json!({"operations": [put_cluster(eds_cluster("d15"))]}));
    store.apply(cut, None).await.unwrap();
    let top = changeset(json!({"operations": [put_cluster(aggregate("d0", &["d1"]))]}));
    store.apply(top, None).await.unwrap();
}

/// Stateless problems and the ones only the store can see come back together.
async fn every_error_is_reported_at_once(db: TestDb) {
    let store = db.store().await;
    store
        .apply(
            changeset(json!({"operations": [put_cluster(aggregate("a", &["b"]))]})),
            None,
        )
        .await
        .unwrap();
    let request = changeset(json!({"operations": [
        {"op": "put", "type": "route", "name": "r", "variants": [{"constraints": "env =", "resource": route("r", "x")}]},
        put_cluster(aggregate("b", &["a"])),
        {"op": "delete", "type": "listener", "name": "missing"},
    ]}));
    let ApplyError::Invalid(invalid) = store.apply(request, None).await.unwrap_err() else {
        panic!()
    };
    let found: Vec<(Option<usize>, &str)> = invalid
        .errors
        .iter()
        .map(|e| (e.operation, e.code.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (Some(0), "invalid_constraints"),
            (Some(1), "aggregate_cycle"),
            (Some(2), "not_found")
        ]
    );
    assert_eq!(store.head_revision().await.unwrap(), 1);
}
