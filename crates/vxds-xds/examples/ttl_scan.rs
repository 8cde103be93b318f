//! What finding the shortest TTL costs a stream that holds many resources (issue 20): the
//! service asks a stream for it after every request, to set its heartbeat timer. One Delta
//! wildcard CDS stream holds `--clusters` clusters (default 2,000), one of them with a TTL,
//! all accepted; `shortest_ttl()` is then called `--calls` times. Count the instructions spent
//! in it with callgrind (hardware counters are not available on every machine):
//!
//! ```sh
//! cargo build -p vxds-xds --example ttl_scan
//! valgrind --tool=callgrind --toggle-collect='vxds_xds::machine::StreamMachine::shortest_ttl' \
//!   target/debug/examples/ttl_scan --calls 1000
//! ```
//!
//! Figures are in docs/benchmarks.md.

use std::sync::Arc;

use serde_json::json;
use vxds_envoy::changeset::{Action, ChangesetRequest, validate};
use vxds_envoy::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use vxds_store::{ChangeBatch, RevisionChangeList, Snapshot, StoredResource};
use vxds_testkit::bench::arg;
use vxds_xds::MachineConfig;
use vxds_xds::machine::{Protocol, StreamMachine};
use vxds_xds::types::{ADS, CLUSTER};

/// `clusters` clusters; `c0` alone has a TTL.
fn snapshot(clusters: usize) -> Snapshot {
    let operations: Vec<serde_json::Value> = (0..clusters)
        .map(|i| {
            let name = format!("c{i}");
            let mut variant = json!({"resource": {"@type": CLUSTER, "name": name, "type": "EDS",
                "connect_timeout": "1s", "eds_cluster_config": {"eds_config": {"ads": {}}}}});
            if i == 0 {
                variant["ttl"] = json!("30s");
            }
            json!({"op": "put", "type": "cluster", "name": name, "variants": [variant]})
        })
        .collect();
    let request: ChangesetRequest =
        serde_json::from_value(json!({ "operations": operations })).expect("a changeset");
    let validated = validate(&request, &Default::default()).expect("a valid changeset");
    let mut batch = ChangeBatch {
        revision: 1,
        commit_id: 0,
        revisions: vec![RevisionChangeList {
            revision: 1,
            committed_at_ms: 1,
            changed: vec![],
            ..Default::default()
        }],
        resources: vec![],
        deleted: vec![],
        complete: false,
    };
    for op in validated.changeset.operations {
        batch.revisions[0].changed.push(op.key.clone());
        if let Action::Put(resource) = op.action {
            batch
                .resources
                .push(StoredResource::from_validated(op.key, &resource, 1, 1));
        }
    }
    Snapshot::default().apply(batch)
}

fn main() {
    let clusters = arg("--clusters", 2_000);
    let calls = arg("--calls", 100_000);
    let snapshot = Arc::new(snapshot(clusters));
    let mut machine =
        StreamMachine::new(1, Protocol::Delta, &ADS, Arc::new(MachineConfig::default()));
    machine
        .on_delta_request(DeltaDiscoveryRequest {
            type_url: CLUSTER.into(),
            ..Default::default()
        })
        .expect("a valid request");
    for response in machine.poll(&snapshot) {
        machine
            .on_delta_request(DeltaDiscoveryRequest {
                type_url: response.type_url().to_owned(),
                response_nonce: response.nonce().to_owned(),
                ..Default::default()
            })
            .expect("an ACK");
    }
    let mut found = 0;
    for _ in 0..calls {
        found += usize::from(std::hint::black_box(&machine).shortest_ttl().is_some());
    }
    assert_eq!(found, calls, "the TTL'd cluster is held");
    println!("{clusters} clusters held, shortest_ttl() called {calls} times");
}
