//! The store contract: one suite, run against SQLite and against Postgres.
//!
//! Postgres tests use the server at `DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`), each in a fresh database of its own, and
//! fail loudly when it is not there.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::time::Duration;

use serde_json::{Value, json};
use vxds_core::ParamSet;
use vxds_envoy::changeset::ChangesetRequest;
use vxds_envoy::resource::{Body, ResourceType};
use vxds_store::{
    ApplyError, ChangeKind, ListQuery, ResourceKey, Store, StoreError, StoreOptions, index,
};
use vxds_testkit::{TestDb, on_both_backends};

// A test crate's root resolves modules beside it, not in a folder named after it.
#[path = "contract/big.rs"]
mod big;
#[path = "contract/concurrency.rs"]
mod concurrency;
#[path = "contract/following.rs"]
mod following;
#[path = "contract/outage.rs"]
mod outage;
#[path = "contract/redirects.rs"]
mod redirects;
#[path = "contract/restore.rs"]
mod restore;
#[path = "contract/retention.rs"]
mod retention;
#[path = "contract/summaries.rs"]
mod summaries;
#[path = "contract/validation.rs"]
mod validation;

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

on_both_backends!(
    an_empty_store_is_at_revision_zero,
    a_put_reads_back_the_same_json,
    a_changeset_is_one_revision,
    a_put_that_changes_nothing_makes_no_revision,
    a_failed_changeset_leaves_no_trace,
    expected_revisions_and_versions_guard_writes,
    deletes_are_recorded_and_missing_ones_refused,
    a_dry_run_commits_nothing,
    listing_filters_and_paginates,
    history_lists_every_revision,
    the_change_feed_reads_one_snapshot,
    xdstp_names_are_stored_in_normal_form,
    an_unmigrated_store_says_so,
    versions_are_content_hashes_the_same_everywhere,
    a_variant_ttl_is_stored_and_indexed,
);

fn route(name: &str, header: &str) -> Value {
    json!({
        "@type": ROUTE,
        "name": name,
        "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [{
            "match": {"prefix": "/"},
            "direct_response": {"status": 200, "body": {"inline_string": header}}
        }]}]
    })
}

fn changeset(value: Value) -> ChangesetRequest {
    serde_json::from_value(value).unwrap()
}

fn put_routes(variants: &[(&str, &str)]) -> ChangesetRequest {
    let variants: Vec<Value> = variants
        .iter()
        .map(|(c, body)| json!({"constraints": c, "resource": route("r", body)}))
        .collect();
    changeset(
        json!({"operations": [{"op": "put", "type": "route", "name": "r", "variants": variants}]}),
    )
}

fn eds_cluster(name: &str) -> Value {
    json!({"@type": CLUSTER, "name": name, "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}})
}

fn aggregate(name: &str, children: &[&str]) -> Value {
    json!({"@type": CLUSTER, "name": name, "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig", "clusters": children}}})
}

fn put_cluster(body: Value) -> Value {
    let name = body["name"].as_str().unwrap().to_owned();
    json!({"op": "put", "type": "cluster", "name": name, "variants": [{"resource": body}]})
}

fn key(type_url: &str, name: &str) -> ResourceKey {
    ResourceKey {
        type_url: type_url.into(),
        name: name.into(),
    }
}

fn codes(e: ApplyError) -> Vec<String> {
    match e {
        ApplyError::Invalid(invalid) => invalid.errors.into_iter().map(|p| p.code).collect(),
        other => panic!("expected a validation error, got {other:?}"),
    }
}

async fn an_empty_store_is_at_revision_zero(db: TestDb) {
    let store = db.store().await;
    assert_eq!(store.head_revision().await.unwrap(), 0);
    assert_eq!(*store.watch_head().borrow(), 0);
    assert!(store.get(&key(ROUTE, "r")).await.unwrap().is_none());
    assert!(store.revisions(0, 10).await.unwrap().is_empty());
    store.ping().await.unwrap();
}

async fn a_variant_ttl_is_stored_and_indexed(db: TestDb) {
    let store = db.store().await;
    let request = changeset(
        json!({"operations": [{"op": "put", "type": "route", "name": "r",
        "variants": [
            {"constraints": r#"env = "prod""#, "resource": route("r", "prod"), "ttl": "2s"},
            {"constraints": r#"env != "prod""#, "resource": route("r", "other")}
        ]}]}),
    );
    store.apply(request, None).await.unwrap();
    let stored = store.get(&key(ROUTE, "r")).await.unwrap().unwrap();
    let ttls: Vec<_> = stored.variants.iter().map(|v| v.ttl).collect();
    assert_eq!(ttls, [Some(std::time::Duration::from_secs(2)), None]);
    let (index, writer) = index::start(store.clone()).await.unwrap();
    let snapshot = index.snapshot();
    let resource = snapshot.get(ROUTE, "r").unwrap();
    let ttls: Vec<_> = resource.variants.iter().map(|v| v.ttl).collect();
    assert_eq!(ttls, [Some(std::time::Duration::from_secs(2)), None]);
    writer.abort();
}

async fn a_put_reads_back_the_same_json(db: TestDb) {
    let store = db.store().await;
    let applied = store
        .apply(
            put_routes(&[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")]),
            Some("alice".into()),
        )
        .await
        .unwrap();
    assert_eq!(applied.revision, 1);
    assert_eq!(applied.changes.len(), 1);
    assert_eq!(applied.changes[0].change, ChangeKind::Created);

    let stored = store.get(&key(ROUTE, "r")).await.unwrap().unwrap();
    assert_eq!(stored.revision, 1);
    assert_eq!(stored.created_revision, 1);
    assert_eq!(Some(stored.version.clone()), applied.changes[0].version);
    assert_eq!(stored.variants.len(), 2);
    assert_eq!(
        stored.variants[0].constraints.to_string(),
        r#"env = "prod""#
    );
    assert_eq!(
        stored.variants[1].constraints.to_string(),
        r#"env != "prod""#
    );
    let ty = ResourceType::resolve(ROUTE).unwrap();
    let body = Body::from_any_bytes(stored.variants[0].body.clone(), &ty).unwrap();
    assert_eq!(body.to_json(&ty), route("r", "prod"));
    assert!(stored.variants[0].created_at_ms > 0);
    assert_eq!(store.head_revision().await.unwrap(), 1);
    assert_eq!(*store.watch_head().borrow(), 1);
}

async fn a_changeset_is_one_revision(db: TestDb) {
    let store = db.store().await;
    let request = changeset(json!({
        "message": "primary with fallback",
        "operations": [
            put_cluster(eds_cluster("primary")),
            put_cluster(eds_cluster("secondary")),
            put_cluster(aggregate("agg", &["primary", "secondary"])),
        ]
    }));
    let applied = store.apply(request, Some("ci".into())).await.unwrap();
    assert_eq!(applied.revision, 1);
    assert_eq!(applied.changes.len(), 3);
    let revision = store.revision(1).await.unwrap().unwrap();
    assert_eq!(revision.author.as_deref(), Some("ci"));
    assert_eq!(revision.message.as_deref(), Some("primary with fallback"));
    let names: Vec<&str> = revision
        .changes
        .iter()
        .map(|c| c.key.name.as_str())
        .collect();
    assert_eq!(names, ["agg", "primary", "secondary"]);
    assert!(
        revision
            .changes
            .iter()
            .all(|c| c.change == ChangeKind::Created)
    );
}

async fn a_put_that_changes_nothing_makes_no_revision(db: TestDb) {
    let store = db.store().await;
    store.apply(put_routes(&[("*", "x")]), None).await.unwrap();
    let again = store.apply(put_routes(&[("*", "x")]), None).await.unwrap();
    assert_eq!(again.revision, 1);
    assert!(again.changes.is_empty());
    assert_eq!(store.head_revision().await.unwrap(), 1);
    // A respelt but equivalent changeset is no change either.
    let same = store
        .apply(put_routes(&[("all()", "x")]), None)
        .await
        .unwrap();
    assert!(same.changes.is_empty());
    let changed = store.apply(put_routes(&[("*", "y")]), None).await.unwrap();
    assert_eq!(
        (changed.revision, changed.changes[0].change),
        (2, ChangeKind::Updated)
    );
}

async fn a_failed_changeset_leaves_no_trace(db: TestDb) {
    let store = db.store().await;
    store
        .apply(put_routes(&[("*", "before")]), None)
        .await
        .unwrap();
    let before = store.get(&key(ROUTE, "r")).await.unwrap();

    // One bad operation among good ones: nothing of it is written.
    let bad = changeset(json!({"operations": [
        {"op": "put", "type": "route", "name": "r", "variants": [{"resource": route("r", "after")}]},
        put_cluster(eds_cluster("c1")),
        {"op": "put", "type": "cluster", "name": "c2", "variants": [{"resource": {"@type": CLUSTER, "name": "c2", "type": "EDS"}}]},
    ]}));
    assert_eq!(
        codes(store.apply(bad, None).await.unwrap_err()),
        ["missing_field"]
    );
    // Refused under the lock (not found), after earlier operations were checked.
    let missing = changeset(json!({"operations": [
        {"op": "put", "type": "route", "name": "r", "variants": [{"resource": route("r", "after")}]},
        {"op": "delete", "type": "cluster", "name": "nope"},
    ]}));
    assert_eq!(
        codes(store.apply(missing, None).await.unwrap_err()),
        ["not_found"]
    );
    // A conflict.
    let stale = changeset(json!({"expected_revision": 0, "operations": [
        {"op": "put", "type": "route", "name": "r", "variants": [{"resource": route("r", "after")}]},
    ]}));
    assert!(matches!(
        store.apply(stale, None).await,
        Err(ApplyError::Conflict(_))
    ));

    assert_eq!(store.head_revision().await.unwrap(), 1);
    assert_eq!(store.get(&key(ROUTE, "r")).await.unwrap(), before);
    assert!(store.get(&key(CLUSTER, "c1")).await.unwrap().is_none());
    assert_eq!(store.revisions(0, 10).await.unwrap().len(), 1);
    assert!(store.changes_since(1).await.unwrap().revisions.is_empty());
    // And the next write gets the next number: no gap.
    assert_eq!(
        store
            .apply(put_routes(&[("*", "after")]), None)
            .await
            .unwrap()
            .revision,
        2
    );
}

async fn expected_revisions_and_versions_guard_writes(db: TestDb) {
    let store = db.store().await;
    let first = store.apply(put_routes(&[("*", "v1")]), None).await.unwrap();
    let version = first.changes[0].version.clone().unwrap();

    let mut request = put_routes(&[("*", "v2")]);
    request.expected_revision = Some(0);
    let ApplyError::Conflict(conflict) = store.apply(request, None).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(conflict.pointer.to_string(), "/expected_revision");
    assert_eq!(conflict.message, "the store is at revision 1, not 0");

    let with_version = |v: &str| {
        changeset(
            json!({"operations": [{"op": "put", "type": "route", "name": "r", "expected_version": v,
            "variants": [{"resource": route("r", "v2")}]}]}),
        )
    };
    let ApplyError::Conflict(conflict) = store
        .apply(with_version("0000000000000000"), None)
        .await
        .unwrap_err()
    else {
        panic!()
    };
    assert_eq!(
        conflict.pointer.to_string(),
        "/operations/0/expected_version"
    );
    assert_eq!(conflict.operation, Some(0));

    let ok = store.apply(with_version(&version), None).await.unwrap();
    assert_eq!(ok.revision, 2);
    let mut request = put_routes(&[("*", "v3")]);
    request.expected_revision = Some(2);
    assert_eq!(store.apply(request, None).await.unwrap().revision, 3);

    let absent = changeset(
        json!({"operations": [{"op": "delete", "type": "route", "name": "ghost", "expected_version": "x"}]}),
    );
    assert!(matches!(
        store.apply(absent, None).await,
        Err(ApplyError::Conflict(_))
    ));
}

async fn deletes_are_recorded_and_missing_ones_refused(db: TestDb) {
    let store = db.store().await;
    store.apply(put_routes(&[("*", "x")]), None).await.unwrap();
    let delete =
        || changeset(json!({"operations": [{"op": "delete", "type": "route", "name": "r"}]}));
    let applied = store.apply(delete(), None).await.unwrap();
    assert_eq!(applied.revision, 2);
    assert_eq!(applied.changes[0].change, ChangeKind::Deleted);
    assert_eq!(applied.changes[0].version, None);
    assert!(store.get(&key(ROUTE, "r")).await.unwrap().is_none());
    let err = store.apply(delete(), None).await.unwrap_err();
    let ApplyError::Invalid(invalid) = err else {
        panic!()
    };
    assert_eq!(invalid.errors[0].code, "not_found");
    assert_eq!(invalid.errors[0].pointer.to_string(), "/operations/0");
    // Re-creating starts a new life.
    let again = store.apply(put_routes(&[("*", "x")]), None).await.unwrap();
    assert_eq!(again.changes[0].change, ChangeKind::Created);
    assert_eq!(
        store
            .get(&key(ROUTE, "r"))
            .await
            .unwrap()
            .unwrap()
            .created_revision,
        3
    );
}

async fn a_dry_run_commits_nothing(db: TestDb) {
    let store = db.store().await;
    let mut request = put_routes(&[("*", "x")]);
    request.dry_run = true;
    let applied = store.apply(request, None).await.unwrap();
    assert!(applied.dry_run);
    assert_eq!(applied.revision, 1);
    assert_eq!(applied.changes.len(), 1);
    assert_eq!(store.head_revision().await.unwrap(), 0);
    assert!(store.get(&key(ROUTE, "r")).await.unwrap().is_none());
    // Dry runs still report problems.
    let mut bad = put_routes(&[(r#"env in (a, b)"#, "x"), (r#"env in (b, c)"#, "y")]);
    bad.dry_run = true;
    let ApplyError::Invalid(invalid) = store.apply(bad, None).await.unwrap_err() else {
        panic!()
    };
    assert_eq!(
        invalid.errors[0].witness,
        Some(ParamSet::new().with("env", "b"))
    );
}

async fn listing_filters_and_paginates(db: TestDb) {
    let store = db.store().await;
    let mut ops: Vec<Value> = (0..7)
        .map(|i| {
            let name = format!("web-{i}");
            json!({"op": "put", "type": "route", "name": name, "variants": [{"resource": route(&name, "x")}]})
        })
        .collect();
    ops.push(put_cluster(eds_cluster("web-cluster")));
    ops.push(json!({"op": "put", "type": "route", "name": "api", "variants": [{"resource": route("api", "x")}]}));
    store
        .apply(changeset(json!({"operations": ops})), None)
        .await
        .unwrap();

    let all = store
        .list(&ListQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.resources.len(), 9);
    assert_eq!(all.next, None);
    let routes = ListQuery {
        type_url: Some(ROUTE.into()),
        prefix: Some("web-".into()),
        limit: 3,
        after: None,
    };
    let mut names = Vec::new();
    let mut query = routes.clone();
    loop {
        let page = store.list(&query).await.unwrap();
        assert!(page.resources.len() <= 3);
        names.extend(page.resources.iter().map(|r| r.key.name.clone()));
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        names,
        (0..7).map(|i| format!("web-{i}")).collect::<Vec<_>>()
    );
    let first = store.list(&routes).await.unwrap().resources[0].clone();
    assert_eq!((first.variant_count, first.revision), (1, 1));
    // Prefixes are literal: `%` and `_` are not wildcards.
    let literal = ListQuery {
        prefix: Some("web%".into()),
        limit: 10,
        ..Default::default()
    };
    assert!(store.list(&literal).await.unwrap().resources.is_empty());
}

async fn history_lists_every_revision(db: TestDb) {
    let store = db.store().await;
    for i in 0..5 {
        let mut request = put_routes(&[("*", &format!("v{i}"))]);
        request.message = Some(format!("change {i}"));
        store.apply(request, Some("bob".into())).await.unwrap();
    }
    let revisions = store.revisions(1, 2).await.unwrap();
    assert_eq!(
        revisions.iter().map(|r| r.revision).collect::<Vec<_>>(),
        [2, 3]
    );
    assert_eq!(revisions[0].message.as_deref(), Some("change 1"));
    assert_eq!(revisions[0].changes[0].change, ChangeKind::Updated);
    assert_eq!(store.revisions(0, 100).await.unwrap().len(), 5);
    assert!(store.revision(6).await.unwrap().is_none());
    assert_eq!(
        store.revision(5).await.unwrap().unwrap().author.as_deref(),
        Some("bob")
    );
}

async fn the_change_feed_reads_one_snapshot(db: TestDb) {
    let store = db.store().await;
    store.apply(put_routes(&[("*", "x")]), None).await.unwrap();
    store
        .apply(
            changeset(json!({"operations": [put_cluster(eds_cluster("c"))]})),
            None,
        )
        .await
        .unwrap();
    store
        .apply(
            changeset(json!({
                "message": "drop r",
                "operations": [{"op": "delete", "type": "route", "name": "r"}],
            })),
            Some("carol".into()),
        )
        .await
        .unwrap();

    let everything = store.changes_since(0).await.unwrap();
    assert_eq!(everything.revision, 3);
    assert_eq!(everything.revisions.len(), 3);
    assert_eq!(
        everything
            .resources
            .iter()
            .map(|r| r.key.name.as_str())
            .collect::<Vec<_>>(),
        ["c"]
    );
    assert_eq!(everything.deleted, vec![key(ROUTE, "r")]);

    let since_two = store.changes_since(2).await.unwrap();
    assert_eq!(since_two.revisions.len(), 1);
    assert_eq!(
        (
            since_two.revisions[0].revision,
            since_two.revisions[0].changed.clone()
        ),
        (3, vec![key(ROUTE, "r")])
    );
    assert!(since_two.revisions[0].committed_at_ms > 0);
    // Who and why travel with the feed (the event stream reads them from the index).
    assert_eq!(
        (
            since_two.revisions[0].author.as_deref(),
            since_two.revisions[0].message.as_deref()
        ),
        (Some("carol"), Some("drop r"))
    );
    assert_eq!(everything.revisions[0].author, None);
    assert!(since_two.resources.is_empty());
    assert_eq!(since_two.deleted, vec![key(ROUTE, "r")]);
    assert!(store.changes_since(3).await.unwrap().revisions.is_empty());
}

async fn xdstp_names_are_stored_in_normal_form(db: TestDb) {
    let store = db.store().await;
    let spelt = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?zone=a&env=b";
    let normal = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?env=b&zone=a";
    let request = changeset(
        json!({"operations": [{"op": "put", "type": "route", "name": spelt,
        "variants": [{"resource": route(spelt, "x")}]}]}),
    );
    let applied = store.apply(request, None).await.unwrap();
    assert_eq!(applied.changes[0].key.name, normal);
    assert!(store.get(&key(ROUTE, normal)).await.unwrap().is_some());
}

async fn an_unmigrated_store_says_so(db: TestDb) {
    let err = Store::connect(
        &db.url,
        StoreOptions {
            migrate: false,
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, StoreError::NotMigrated), "{err:?}");
    assert!(err.to_string().contains("vxds migrate"));
    vxds_store::migrate_url(&db.url).await.unwrap();
    Store::connect(
        &db.url,
        StoreOptions {
            migrate: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// Delta clients compare per-resource versions across reconnects, to any replica: a version
/// depends on the content only, never on the backend, the machine, the run or the spelling of
/// the JSON. The pinned values prove it across backends and builds.
async fn versions_are_content_hashes_the_same_everywhere(db: TestDb) {
    let store = db.store().await;
    store
        .apply(
            put_routes(&[(r#"env = "prod""#, "prod"), (r#"env != "prod""#, "other")]),
            None,
        )
        .await
        .unwrap();
    let stored = store.get(&key(ROUTE, "r")).await.unwrap().unwrap();
    let versions: Vec<&str> = stored.variants.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(versions, ["314c90738429b370", "c814c32ea37ba7a1"]);
    assert_eq!(stored.version, "b8416aa3408c2bad");

    // The same content spelled otherwise (constraint syntax, JSON key order) is the same
    // version, and no revision.
    let respelled = changeset(json!({"operations": [{
        "op": "put", "type": "route", "name": "r",
        "variants": [
            {"resource": route("r", "prod"), "constraints": "(env = \"prod\")"},
            {"constraints": {"not_constraints": {"constraint": {"key": "env", "value": "prod"}}},
             "resource": route("r", "other")},
        ],
    }]}));
    let applied = store.apply(respelled, None).await.unwrap();
    assert!(applied.changes.is_empty(), "{applied:?}");

    // The order of variants is the operator's and is kept, so reordering them is a revision;
    // but no variant changes, so clients receive nothing new.
    let reordered = changeset(json!({"operations": [{
        "op": "put", "type": "route", "name": "r",
        "variants": [
            {"constraints": r#"env != "prod""#, "resource": route("r", "other")},
            {"constraints": r#"env = "prod""#, "resource": route("r", "prod")},
        ],
    }]}));
    store.apply(reordered, None).await.unwrap();
    let after = store.get(&key(ROUTE, "r")).await.unwrap().unwrap();
    let after: Vec<&str> = after.variants.iter().map(|v| v.version.as_str()).collect();
    assert_eq!(after, ["c814c32ea37ba7a1", "314c90738429b370"]);
    let versions = after;

    // What streams send is the stored version.
    let (index, task) = index::start(store.clone()).await.unwrap();
    let snapshot = index.snapshot();
    let indexed = snapshot.get(ROUTE, "r").unwrap();
    let indexed: Vec<&str> = indexed.variants.iter().map(|v| &*v.version).collect();
    assert_eq!(indexed, versions);
    task.abort();
}
