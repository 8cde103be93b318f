//! A revision's rollout over HTTP, counted from every replica's published summary (here other
//! replicas', published straight into the store: this server runs no xDS server of its own).

use std::time::Duration;

use vxds_core::ParamSet;
use vxds_core::impact::{Subscription, SummaryBuilder};

use super::*;

on_both_backends!(
    a_replica_that_has_told_its_streams_nothing_yet_keeps_a_rollout_open,
    a_record_shared_by_revisions_applied_together_answers_for_each,
);

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

/// Review finding 7: another replica applied three revisions together (a burst while its
/// dispatcher was busy) and counted them in one record: each of them answers with those
/// counts, not as "concerned none of its streams" for the first two.
async fn a_record_shared_by_revisions_applied_together_answers_for_each(db: TestDb) {
    let api = serve(&db, Tokens::none(), DEFAULT_BODY_LIMIT).await;
    let mut revisions = Vec::new();
    for name in ["c1", "c2", "c3"] {
        let put = json!({"operations": [{
            "op": "put", "type": "cluster", "name": name,
            "variants": [{"resource": {
                "@type": CLUSTER, "name": name, "type": "STATIC", "connect_timeout": "1s"
            }}]
        }]});
        let written = api.send_json(Method::POST, "/v1/changesets", put).await;
        assert_eq!(written.status, StatusCode::OK, "{}", written.text);
        revisions.push(written.body["revision"].as_u64().unwrap());
    }
    let (first, last) = (revisions[0], revisions[2]);
    let mut record = vxds_core::rollout::RolloutRecord::new(last, None);
    record.first = Some(first);
    record.published = true;
    record.streams = 1;
    record.nacked = 1;
    record.nacks.push(vxds_core::rollout::RolloutNack {
        node: "envoy-1".into(),
        type_url: CLUSTER.into(),
        error: "refused".into(),
        ..Default::default()
    });
    let mut summary = SummaryBuilder::default();
    summary.stream();
    let mut summary = summary.build();
    summary.rollouts = vec![record];
    summary.rollout_head = Some(last);
    api.store
        .publish_client_summary("replica-b", &summary, Duration::from_secs(60))
        .await
        .unwrap();
    for n in revisions {
        let status = api.get(&format!("/v1/revisions/{n}/rollout")).await;
        assert_eq!(status.status, StatusCode::OK, "{}", status.text);
        assert_eq!(status.body["revision"], n, "{}", status.text);
        assert_eq!(status.body["state"], "failed", "{}", status.text);
        assert_eq!(
            (&status.body["streams"], &status.body["nacked"]),
            (&json!(1), &json!(1)),
            "{}",
            status.text
        );
        assert_eq!(status.body["nacks"][0]["replica"], "replica-b");
    }
}
