//! What a restore holds at its peak, counted by a counting allocator (dhat): `--clusters`
//! clusters (shaped as `big_write`'s, one variant each) written to a fresh SQLite store in
//! changesets of 10,000, then `Store::restore(0)` (every one deleted, one revision), profiled
//! alone. No index and no server: the store's own share of `big_write`'s `rollback --to 0`.
//!
//! ```sh
//! cargo run --release -p vxds-store --example restore_memory -- --clusters 100000
//! ```
//!
//! It prints the live bytes at the peak and writes `dhat-restore.json` (the allocation sites
//! at the peak: `dh_view.html`, or read `pps[].gb`). Figures are in docs/benchmarks.md
//! (issue 21's 100,000-resource round trip).

use serde_json::json;
use vxds_envoy::changeset::ChangesetRequest;
use vxds_store::{RestoreOptions, Store, StoreOptions};
use vxds_testkit::bench::{arg, cluster_variant};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

const PER_CHANGESET: usize = 10_000;

#[tokio::main]
async fn main() {
    let clusters = arg("--clusters", 100_000);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let dir = std::env::temp_dir().join(format!("vxds-restore-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let url = format!("sqlite://{}", dir.join("store.db").display());
    let store = Store::connect(&url, StoreOptions::default())
        .await
        .expect("a SQLite store");
    let names: Vec<String> = (0..clusters).map(|i| format!("cluster-{i:06}")).collect();
    for chunk in names.chunks(PER_CHANGESET) {
        let operations: Vec<_> = chunk
            .iter()
            .map(|name| {
                json!({"op": "put", "type": "cluster", "name": name,
                       "variants": [cluster_variant(name, 0, 1)]})
            })
            .collect();
        let request: ChangesetRequest =
            serde_json::from_value(json!({ "operations": operations })).expect("a changeset");
        store.apply(request, None).await.expect("the write");
    }
    drop(names);

    let profiler = dhat::Profiler::builder()
        .file_name("dhat-restore.json")
        .build();
    let restored = store
        .restore(0, RestoreOptions::default(), None)
        .await
        .expect("the restore");
    let stats = dhat::HeapStats::get();
    println!(
        "restore of {clusters} clusters to revision 0 (revision {}, {} changes): peak {:.1} MiB live, \
         {:.1} MiB allocated in all, {:.2} KiB per resource at the peak",
        restored.applied.revision,
        restored.applied.changes.len(),
        mib(stats.max_bytes),
        mib(stats.total_bytes as usize),
        stats.max_bytes as f64 / 1024.0 / clusters.max(1) as f64,
    );
    drop((restored, profiler));
    drop(store);
    let _ = std::fs::remove_dir_all(&dir);
}
