//! A revision's rollout over HTTP, counted from every replica's published summary (here other
//! replicas', published straight into the store: this server runs no xDS server of its own).

use std::time::Duration;

use vxds_core::ParamSet;
use vxds_core::impact::{Subscription, SummaryBuilder};

use super::*;

on_both_backends!(a_replica_that_has_told_its_streams_nothing_yet_keeps_a_rollout_open);

/// Right after a restart a replica has dispatched no revision (`rollout_head` absent): with
/// streams connected, a new revision is still to come there, not "concerned none".
async fn a_replica_that_has_told_its_streams_nothing_yet_keeps_a_rollout_open(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let put = json!({"operations": [{
        "op": "put", "type": "cluster", "name": "c1",
        "variants": [{"resource": {
            "@type": CLUSTER, "name": "c1", "type": "STATIC", "connect_timeout": "1s"
        }}]
    }]});
    let written = api.send_json(Method::POST, "/v1/changesets", put).await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.text);
    let revision = written.body["revision"].as_u64().unwrap();

    let mut just_started = SummaryBuilder::default();
    just_started.stream();
    just_started.add(
        CLUSTER,
        Subscription::Name("c1".into()),
        &ParamSet::new(),
        1,
        &["envoy-1".to_owned()],
    );
    let just_started = just_started.build();
    assert_eq!(just_started.rollout_head, None);
    api.store
        .publish_client_summary("replica-b", &just_started, Duration::from_secs(60))
        .await
        .unwrap();
    let path = format!("/v1/revisions/{revision}/rollout");
    let status = api.get(&path).await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.text);
    assert_eq!(status.body["state"], "progressing", "{}", status.text);

    // Once it publishes a head at the revision with no record of it, the revision concerned
    // none of its streams.
    let mut told = just_started.clone();
    told.rollout_head = Some(revision);
    api.store
        .publish_client_summary("replica-b", &told, Duration::from_secs(60))
        .await
        .unwrap();
    let status = api.get(&path).await;
    assert_eq!(status.body["state"], "complete", "{}", status.text);

    // A replica without streams and without a head has nothing to count.
    let idle = SummaryBuilder::default().build();
    api.store
        .publish_client_summary("replica-b", &idle, Duration::from_secs(60))
        .await
        .unwrap();
    let status = api.get(&path).await;
    assert_eq!(status.body["state"], "complete", "{}", status.text);
}
