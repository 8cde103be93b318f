//! What one stream's state costs in heap, counted by a counting allocator: the state machine
//! (subscriptions, desired and sent state, the operator status) and the registry's index of
//! its interest, for Delta streams that subscribe to CDS by wildcard or by one
//! `resource_locators_subscribe` locator per cluster. No sockets: hyper's and h2's
//! per-connection buffers and the task are not in these figures (the load generator,
//! `crates/vxds/examples/xds_load.rs`, measures the whole process).
//!
//! ```sh
//! cargo run --release -p vxds-xds --example stream_memory -- --streams 10000
//! ```
//!
//! Each phase's bytes are what stays allocated after it, per stream, so the phases add up to
//! the total. With `--profile`, the locator run is recorded by dhat's heap profiler into
//! `dhat-heap.json` (with the streams still alive at the end, so its "at t-end" figures are
//! what the streams hold, by call site; open it with dhat's viewer, `dh_view.html`).
//! Figures are in docs/benchmarks.md.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::json;
use vxds_envoy::changeset::{Action, ChangesetRequest, validate};
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, ResourceLocator};
use vxds_envoy::pb::xds::core::v3::ContextParams;
use vxds_store::{ChangeBatch, RevisionChangeList, Snapshot, StoredResource};
use vxds_testkit::bench::arg;
use vxds_xds::machine::{Protocol, Response, StreamMachine};
use vxds_xds::registry::Registration;
use vxds_xds::types::{ADS, CLUSTER};
use vxds_xds::{MachineConfig, Registry};

// Every allocation goes through dhat's allocator, which counts what is live (and, with
// `--profile`, records where each allocation was made).
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Bytes and blocks live now.
fn live() -> (isize, isize) {
    let stats = dhat::HeapStats::get();
    let signed = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
    (signed(stats.curr_bytes), signed(stats.curr_blocks))
}

/// A snapshot of `clusters` clusters with `variants` variants each, keyed on `shard`.
fn snapshot(clusters: usize, variants: usize) -> Snapshot {
    let operations: Vec<serde_json::Value> = (0..clusters)
        .map(|i| {
            let name = format!("c{i}");
            let variants: Vec<serde_json::Value> = (0..variants)
                .map(|shard| json!({
                    "constraints": format!("shard = \"s{shard}\""),
                    "resource": {"@type": CLUSTER, "name": name, "type": "EDS", "connect_timeout": "1s",
                                 "alt_stat_name": format!("{name}-s{shard}"),
                                 "eds_cluster_config": {"eds_config": {"ads": {}}}},
                }))
                .collect();
            json!({"op": "put", "type": "cluster", "name": name, "variants": variants})
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

fn first_request(
    stream: usize,
    locators: bool,
    clusters: usize,
    variants: usize,
) -> DeltaDiscoveryRequest {
    let shard = format!("s{}", stream % variants);
    let mut node = Node {
        id: format!("load-{stream}"),
        ..Default::default()
    };
    node.dynamic_parameters.insert(
        CLUSTER.into(),
        ContextParams {
            params: [("shard".to_owned(), shard.clone())].into(),
        },
    );
    let mut request = DeltaDiscoveryRequest {
        type_url: CLUSTER.into(),
        node: Some(node),
        ..Default::default()
    };
    if locators {
        request.resource_locators_subscribe = (0..clusters)
            .map(|i| ResourceLocator {
                name: format!("c{i}"),
                dynamic_parameters: [("shard".to_owned(), shard.clone())].into(),
            })
            .collect();
    }
    request
}

fn ack(response: &Response) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: response.type_url().to_owned(),
        response_nonce: response.nonce().to_owned(),
        ..Default::default()
    }
}

/// Bytes per stream of each phase, for `streams` streams of one kind; returns the streams.
fn measure(
    locators: bool,
    streams: usize,
    clusters: usize,
    variants: usize,
) -> (Vec<Registration>, Vec<StreamMachine>) {
    let snapshot = Arc::new(snapshot(clusters, variants));
    let registry = Arc::new(Registry::new(snapshot.clone()));
    let config = Arc::new(MachineConfig::default());
    let mut machines: Vec<StreamMachine> = Vec::with_capacity(streams);
    let mut registrations: Vec<Registration> = Vec::with_capacity(streams);
    let mut phases: BTreeMap<usize, (&str, isize, isize)> = BTreeMap::new();
    let mut last = live();
    let mut phase = |n: usize, label: &'static str| {
        let now = live();
        phases.insert(n, (label, now.0 - last.0, now.1 - last.1));
        last = now;
    };

    for stream in 0..streams {
        let id = registry.next_id();
        let mut machine = StreamMachine::new(id, Protocol::Delta, &ADS, config.clone());
        registrations.push(registry.register(id, machine.status()));
        // Made and dropped within the phase: only what the stream keeps of it counts.
        let request = first_request(stream, locators, clusters, variants);
        machine.on_delta_request(request).expect("a valid request");
        machines.push(machine);
    }
    phase(0, "machine + subscriptions (request handled)");
    for (machine, registration) in machines.iter().zip(&registrations) {
        registry.set_interest(registration.id, machine.interest());
    }
    phase(1, "registry: the stream's interest");
    let mut responses: Vec<Vec<Response>> =
        machines.iter_mut().map(|m| m.poll(&snapshot)).collect();
    phase(
        2,
        "poll: desired state, sent state, status (responses still held)",
    );
    for (machine, responses) in machines.iter_mut().zip(&responses) {
        for response in responses {
            machine.on_delta_request(ack(response)).expect("an ACK");
        }
        // As the service does after every request: nothing more to send here.
        assert!(machine.poll(&snapshot).is_empty(), "nothing left to send");
    }
    responses.clear();
    responses.shrink_to_fit();
    phase(3, "responses dropped, ACKs handled");

    let held: usize = machines
        .first()
        .map(|m| {
            m.status()
                .lock()
                .map(|s| s.types.iter().map(|t| t.resources.len()).sum())
                .unwrap_or(0)
        })
        .unwrap_or(0);
    println!(
        "\nDelta, CDS {} ({clusters} clusters × {variants} variants, {held} held per stream), {streams} streams:",
        if locators {
            "by one locator per cluster"
        } else {
            "by wildcard, parameters from the node"
        }
    );
    println!("| phase | bytes per stream | allocations per stream |");
    println!("|---|---|---|");
    let (mut bytes, mut blocks) = (0, 0);
    for (label, b, n) in phases.values() {
        bytes += b;
        blocks += n;
        println!(
            "| {label} | {:.0} | {:.1} |",
            *b as f64 / streams as f64,
            *n as f64 / streams as f64
        );
    }
    println!(
        "| **total** | **{:.0}** ({:.2} KiB) | {:.1} |",
        bytes as f64 / streams as f64,
        bytes as f64 / streams as f64 / 1024.0,
        blocks as f64 / streams as f64
    );
    (registrations, machines)
}

fn main() {
    let streams = arg("--streams", 2000);
    let clusters = arg("--clusters", 10);
    let variants = arg("--variants", 4);
    let profile = std::env::args().any(|a| a == "--profile");
    for locators in [false, true] {
        let profiler = if profile && locators {
            dhat::Profiler::new_heap()
        } else {
            dhat::Profiler::builder().testing().build()
        };
        let streams = measure(locators, streams, clusters, variants);
        drop(profiler); // with the streams alive: the profile's end state is what they hold
        drop(streams);
    }
}
