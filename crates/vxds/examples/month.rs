//! A month in minutes (issue 21): synthesises a month of writes — by default 2,592,000
//! revisions, one a second for 30 days — directly through the store in batches, then reports
//! the database's size on disk and, from a fresh process, the time to load the index (what
//! `/readyz` waits for) and that process's peak memory. Three stores of the same resources:
//!
//! - `baseline`: 100 revisions;
//! - `forever`: the whole month, nothing pruned;
//! - `retention`: the whole month with `--retention` (default `7d`) applied as the server's
//!   background pruner would, after every batch, as of the batch's last commit time (on
//!   Postgres followed by a `VACUUM`, as autovacuum would keep up at one write a second).
//!
//! Each revision rewrites one of `--resources` routes (4 variants of ~1.1 KB each, as a
//! typical route), with its variant set copied into the history as `Store::apply` records it
//! (`Store::synthesize_history`: the same rows, without validation).
//!
//! ```sh
//! cargo build --release -p vxds --example month
//! ./target/release/examples/month                     # the full month on SQLite (~15 GiB)
//! ./target/release/examples/month --postgres          # on Postgres (DATABASE_URL)
//! ./target/release/examples/month --revisions 50000   # a small run
//! ```
//!
//! Ready time and peak memory are the medians of `--measure-runs` (5) fresh processes per
//! store, pinned to one CPU with `--pin`.
//!
//! Results are written down in docs/benchmarks.md.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use vxds_store::{ResourceKey, Retention, Store, StoreOptions, index};
use vxds_testkit::{Db, TestDb};

#[path = "common/load.rs"]
mod load;
use load::median;

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const MONTH_MS: i64 = 30 * 24 * 3600 * 1000;

#[derive(Parser)]
#[command(about = "A month of writes: disk, ready time and peak memory with and without retention")]
struct Args {
    /// Revisions in the month (spread evenly over 30 days).
    #[arg(long, default_value_t = 2_592_000)]
    revisions: u64,
    /// Routes the revisions rewrite, one per batch in turn.
    #[arg(long, default_value_t = 100)]
    resources: usize,
    /// Revisions synthesised per transaction.
    #[arg(long, default_value_t = 10_000)]
    batch: u64,
    /// The retention of the `retention` store, as `--history-retention` takes it.
    #[arg(long, default_value = "7d", value_parser = Retention::parse)]
    retention: Retention,
    /// Run on Postgres (a fresh database at DATABASE_URL's server) instead of SQLite.
    #[arg(long)]
    postgres: bool,
    /// Measuring processes per store: ready time and peak memory are their medians.
    #[arg(long, default_value_t = 5)]
    measure_runs: usize,
    /// Pin the measuring processes to this CPU (`taskset -c`), away from the synthesis.
    #[arg(long)]
    pin: Option<usize>,
    /// Internal: load the index from this store and report (the measuring child process).
    #[arg(long, hide = true)]
    measure: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(url) = &args.measure {
        return measure(url).await;
    }
    let backend = if args.postgres {
        Db::Postgres
    } else {
        Db::Sqlite
    };
    println!(
        "{:<10} {:>10} {:>10} {:>12} {:>10} {:>10} {:>12} {:>10}",
        "store", "revisions", "kept", "disk MiB", "write s", "prune s", "ready ms", "peak MiB"
    );
    for (name, revisions, retention) in [
        ("baseline", 100, Retention::FOREVER),
        ("forever", args.revisions, Retention::FOREVER),
        ("retention", args.revisions, args.retention),
    ] {
        let db = TestDb::fresh(backend).await;
        let result = scenario(&args, &db, revisions, retention).await;
        let report = match result {
            Ok(report) => report,
            Err(e) => {
                db.remove().await;
                return Err(e);
            }
        };
        println!(
            "{name:<10} {revisions:>10} {:>10} {:>12.1} {:>10.1} {:>10.1} {:>12.0} {:>10.1}",
            report.kept,
            report.disk as f64 / (1 << 20) as f64,
            report.write.as_secs_f64(),
            report.prune.as_secs_f64(),
            report.ready_ms,
            report.peak_kib as f64 / 1024.0,
        );
        db.remove().await;
    }
    println!(
        "(retention: {}; {} routes of 4 variants; backend: {backend:?})",
        args.retention, args.resources
    );
    Ok(())
}

struct Report {
    kept: u64,
    disk: u64,
    write: Duration,
    prune: Duration,
    ready_ms: f64,
    peak_kib: u64,
}

async fn scenario(
    args: &Args,
    db: &TestDb,
    revisions: u64,
    retention: Retention,
) -> anyhow::Result<Report> {
    let store = Store::connect(&db.url, StoreOptions::default()).await?;
    // On Postgres, autovacuum makes pruned rows' space reusable; synthesis outruns it, so
    // the benchmark vacuums after every prune as autovacuum would keep up at one write a second.
    let vacuum = match (db.backend, retention.prunes()) {
        (Db::Postgres, true) => Some(sqlx::PgPool::connect(&db.url).await?),
        _ => None,
    };
    let keys = seed(&store, args.resources).await?;
    let start_ms = now_ms() - MONTH_MS;
    let step_ms = (MONTH_MS / revisions.max(1) as i64).max(1);
    let (mut write, mut prune) = (Duration::ZERO, Duration::ZERO);
    let mut written = 0;
    let mut batch_index = 0;
    while written < revisions {
        let count = args.batch.min(revisions - written);
        let first_ms = start_ms + written as i64 * step_ms;
        let started = Instant::now();
        store
            .synthesize_history(&keys[batch_index % keys.len()], count, first_ms, step_ms)
            .await?;
        write += started.elapsed();
        written += count;
        batch_index += 1;
        if retention.prunes() {
            let started = Instant::now();
            let now = first_ms + count as i64 * step_ms;
            store.prune_all_at(&retention, now).await?;
            prune += started.elapsed();
            if let Some(pool) = &vacuum {
                sqlx::query("VACUUM vxds_variant_history, vxds_revision_changes, vxds_revisions")
                    .execute(pool)
                    .await?;
            }
        }
    }
    if let Some(pool) = vacuum {
        pool.close().await;
    }
    let head = store.head_revision().await?;
    let kept = head + 1 - store.oldest_kept_revision().await?;
    let disk = disk_bytes(&store, db).await?;
    store.close().await;
    let (mut ready, mut peak) = (Vec::new(), Vec::new());
    for _ in 0..args.measure_runs.max(1) {
        let (ready_ms, peak_kib) = measure_in_child(&db.url, args.pin)?;
        ready.push(ready_ms);
        peak.push(peak_kib as f64);
    }
    let (ready_ms, peak_kib) = (median(&mut ready), median(&mut peak) as u64);
    Ok(Report {
        kept,
        disk,
        write,
        prune,
        ready_ms,
        peak_kib,
    })
}

/// `resources` routes of 4 variants (~1.1 KB each), written as one ordinary changeset.
async fn seed(store: &Store, resources: usize) -> anyhow::Result<Vec<ResourceKey>> {
    let filler = "x".repeat(1000);
    let operations: Vec<Value> = (0..resources)
        .map(|i| {
            let name = format!("route-{i}");
            let variants: Vec<Value> = ["a", "b", "c"]
                .iter()
                .map(|shard| format!(r#"shard = "{shard}""#))
                .chain([r#"shard != "a" && shard != "b" && shard != "c""#.to_owned()])
                .enumerate()
                .map(|(v, constraints)| {
                    json!({"constraints": constraints, "resource": {
                        "@type": ROUTE, "name": name,
                        "virtual_hosts": [{"name": "vh", "domains": ["*"], "routes": [{
                            "match": {"prefix": "/"},
                            "direct_response": {"status": 200,
                                "body": {"inline_string": format!("{v}{filler}")}}}]}]}})
                })
                .collect();
            json!({"op": "put", "type": "route", "name": name, "variants": variants})
        })
        .collect();
    let request = serde_json::from_value(json!({ "operations": operations }))?;
    store
        .apply(request, None)
        .await
        .map_err(|e| anyhow::anyhow!("seeding: {e}"))?;
    Ok((0..resources)
        .map(|i| ResourceKey {
            type_url: ROUTE.into(),
            name: format!("route-{i}"),
        })
        .collect())
}

async fn disk_bytes(store: &Store, db: &TestDb) -> anyhow::Result<u64> {
    match db.backend {
        Db::Sqlite => {
            let path = db
                .url
                .strip_prefix("sqlite://")
                .context("a SQLite URL")?
                .split('?')
                .next()
                .unwrap_or_default();
            let mut total = 0;
            for suffix in ["", "-wal", "-shm"] {
                if let Ok(meta) = std::fs::metadata(format!("{path}{suffix}")) {
                    total += meta.len();
                }
            }
            Ok(total)
        }
        Db::Postgres => {
            let _ = store;
            let pool = sqlx::PgPool::connect(&db.url).await?;
            let size: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
                .fetch_one(&pool)
                .await?;
            pool.close().await;
            Ok(size as u64)
        }
    }
}

/// Runs this program again with `--measure`: a process that does nothing but load the index,
/// so that its peak memory is the start-up's. On this shared machine one start-up's time is
/// noise-prone; the caller takes the median of several.
fn measure_in_child(url: &str, pin: Option<usize>) -> anyhow::Result<(f64, u64)> {
    let exe = std::env::current_exe()?;
    let mut command = match pin {
        Some(cpu) => {
            let mut taskset = std::process::Command::new("taskset");
            taskset.args(["-c", &cpu.to_string()]).arg(&exe);
            taskset
        }
        None => std::process::Command::new(&exe),
    };
    let output = command.args(["--measure", url]).output()?;
    if !output.status.success() {
        bail!(
            "the measuring process failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = String::from_utf8(output.stdout)?;
    let mut fields = text.split_whitespace();
    let ready_ms: f64 = fields.next().context("ready time")?.parse()?;
    let peak_kib: u64 = fields.next().context("peak memory")?.parse()?;
    Ok((ready_ms, peak_kib))
}

/// The child: connect, load the index as `vxds serve` does before `/readyz` answers, report.
async fn measure(url: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    let store = Store::connect(
        url,
        StoreOptions {
            migrate: false,
            ..Default::default()
        },
    )
    .await?;
    let (index, follower) = index::start(store.clone()).await?;
    let ready = started.elapsed();
    anyhow::ensure!(index.snapshot().revision > 0, "an empty index");
    follower.abort();
    store.close().await;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let peak_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("VmHWM in /proc/self/status")?;
    println!("{} {peak_kib}", ready.as_secs_f64() * 1000.0);
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
