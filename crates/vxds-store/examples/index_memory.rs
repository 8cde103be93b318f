//! What the in-memory index holds per resource, counted by a counting allocator (dhat): a
//! write of `--clusters` clusters (shaped as `big_write`'s, `--variants` each) read back as the
//! follower reads it (one change batch), then applied to an empty snapshot.
//!
//! ```sh
//! cargo run -p vxds-store --example index_memory -- --clusters 20000 --variants 1
//! ```
//!
//! It prints the batch's bytes, the snapshot's bytes once the batch is gone, and the peak while
//! applying, each per resource and against the bodies' own size. Figures are in
//! docs/benchmarks.md (issue 21's 100,000-resource round trip).

use serde_json::{Value, json};
use vxds_envoy::changeset::{Action, ChangesetRequest, validate};
use vxds_store::{ChangeBatch, RevisionChangeList, Snapshot, StoredResource};
use vxds_testkit::bench::{arg, cluster_variant};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

fn live() -> usize {
    dhat::HeapStats::get().curr_bytes
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let clusters = arg("--clusters", 100_000);
    let variants = arg("--variants", 1).max(1);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    // The first validation builds the Envoy descriptor pool and the proto rules, which stay
    // for the process's life: not the index's.
    let warm: ChangesetRequest = serde_json::from_value(json!({"operations": [
        {"op": "put", "type": "cluster", "name": "warm", "variants": [cluster_variant("warm", 0, 1)]}
    ]}))
    .expect("a changeset");
    drop(validate(&warm, &Default::default()).expect("a valid changeset"));
    let idle = live();
    let live = || live() - idle;

    // The batch as the follower reads it after the write.
    let mut batch = ChangeBatch {
        revision: 1,
        commit_id: 1,
        revisions: vec![RevisionChangeList {
            revision: 1,
            committed_at_ms: 1,
            ..Default::default()
        }],
        resources: Vec::with_capacity(clusters),
        deleted: vec![],
        complete: false,
    };
    let mut body_bytes = 0;
    let chunk = 500;
    for start in (0..clusters).step_by(chunk) {
        let operations: Vec<Value> = (start..(start + chunk).min(clusters))
            .map(|i| {
                let name = format!("cluster-{i:06}");
                let variants: Vec<Value> = (0..variants)
                    .map(|v| cluster_variant(&name, v, variants))
                    .collect();
                json!({"op": "put", "type": "cluster", "name": name, "variants": variants})
            })
            .collect();
        let request: ChangesetRequest =
            serde_json::from_value(json!({ "operations": operations })).expect("a changeset");
        let validated = validate(&request, &Default::default()).expect("a valid changeset");
        for op in validated.changeset.operations {
            if let Action::Put(resource) = op.action {
                let stored = StoredResource::from_validated(op.key, &resource, 1, 1);
                body_bytes += stored.variants.iter().map(|v| v.body.len()).sum::<usize>();
                batch.resources.push(stored);
            }
        }
    }
    let without_list = live();
    batch.revisions[0].changed = batch.resources.iter().map(|r| r.key.clone()).collect();
    let batch_bytes = live();
    let list_bytes = batch_bytes - without_list;
    println!(
        "{clusters} clusters × {variants} variant(s): bodies {:.1} MiB ({} B/resource)",
        mib(body_bytes),
        body_bytes / clusters
    );
    println!(
        "  change batch: {:.1} MiB ({} B/resource)",
        mib(batch_bytes),
        batch_bytes / clusters
    );

    println!(
        "  inline sizes: IndexedResource {} B, IndexedVariant {} B",
        std::mem::size_of::<vxds_store::IndexedResource>(),
        std::mem::size_of::<vxds_store::IndexedVariant>(),
    );
    let empty = Snapshot::default();
    let snapshot = empty.apply(batch);
    let held = live();
    // The process's peak: applying is its largest moment (the batch is fully read by then).
    let peak = dhat::HeapStats::get().max_bytes - idle;
    println!(
        "  snapshot: {:.1} MiB ({} B/resource, {:.1}× the bodies), of which the change list about {} B/resource",
        mib(held),
        held / clusters,
        held as f64 / body_bytes as f64,
        list_bytes / clusters,
    );
    println!(
        "  peak while applying: {:.1} MiB ({} B/resource)",
        mib(peak),
        peak / clusters
    );
    drop(snapshot);
}
