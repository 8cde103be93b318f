//! Big writes and export: memory and time of one large changeset and of `vxds export`.
//!
//! It generates one changeset of `--clusters` clusters with `--variants` variants each (10,000
//! × 4 by default, about 13 MB of JSON), starts `vxds serve` (release build) on a fresh Postgres
//! database and on SQLite, posts the changeset to `/v1/changesets`, waits until the server's
//! index holds it, and reads the server's peak resident memory (`VmHWM` in /proc). Then it adds
//! `--endpoints` more resources in a second changeset and times `vxds export` of the whole store,
//! against the server and with `--database-url`. With `--baseline`, another binary (e.g. a
//! build of the previous release) is measured the same way in the same run, and the exports of
//! the two are compared byte for byte.
//!
//! Then the round trip, on a second fresh database with a fresh server: `vxds apply` of that
//! export, `vxds diff` of it (which must find nothing), `vxds rollback --to 0` (every resource
//! deleted) and `vxds rollback --to 1` (all back), each timed, with the server's peak resident
//! memory during each (the peak is reset between steps through `/proc/PID/clear_refs`) and its
//! resident memory before and after: the peak above the larger of those two is what the write
//! cost beyond holding the store. Each must be one revision. Before the idle figure, each server
//! validates one resource in a dry run, so that what the first validation loads once (the Envoy
//! descriptor pool) is not counted as the first write's.
//!
//! ```sh
//! cargo build --release -p vxds --example big_write --bin vxds
//! target/release/examples/big_write --baseline PATH/TO/OLD/vxds
//! target/release/examples/big_write --clusters 100000 --endpoints 0   # 100,000 resources
//! ```
//!
//! Results are written down in docs/benchmarks.md.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use vxds_testkit::bench::{cluster_variant, metric_mib};
use vxds_testkit::serve::ServeProcess;
use vxds_testkit::{Db, TestDb};

#[derive(Parser)]
#[command(about = "Peak server memory of one big changeset, and the time of `vxds export`")]
struct Args {
    /// The vxds binary (default: `vxds` in the target folder this example was built into).
    #[arg(long)]
    vxds: Option<PathBuf>,
    /// Another vxds binary measured the same way, for a side-by-side comparison.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Clusters in the changeset.
    #[arg(long, default_value_t = 10_000)]
    clusters: usize,
    /// Variants per cluster.
    #[arg(long, default_value_t = 4)]
    variants: usize,
    /// Endpoints (one variant each) written after the big changeset, before the export.
    /// (Their names have five digits: at most 100,000.)
    #[arg(long, default_value_t = 3_000)]
    endpoints: usize,
    /// Backends to measure on: postgres, sqlite.
    #[arg(long, value_delimiter = ',', default_value = "postgres,sqlite")]
    backends: Vec<String>,
    /// Seconds to wait before each round-trip step, so that what the allocator keeps of the
    /// previous step has time to go back to the system (jemalloc's decay) before it is measured.
    #[arg(long, default_value_t = 0)]
    settle: u64,
}

/// One binary on one backend.
struct Measured {
    idle_mib: f64,
    peak_mib: f64,
    after_mib: f64,
    /// A fresh server on the same store: what holding it costs, without the write.
    restarted_mib: f64,
    commit: Duration,
    indexed: Duration,
    export_server: Duration,
    export_database: Duration,
    exported_documents: usize,
    export: Vec<u8>,
    round_trip: RoundTrip,
}

/// The export applied to an empty store, diffed, and rolled back and forth.
struct RoundTrip {
    idle_mib: f64,
    steps: Vec<Step>,
    /// The server's resident memory at the end, holding the store.
    end_mib: f64,
}

/// One command of the round trip: its time and the server's peak resident memory meanwhile.
struct Step {
    what: &'static str,
    time: Duration,
    peak_mib: f64,
    /// Resident memory when the step started and once it was indexed: the peak above the
    /// larger of the two is what the write itself cost, beyond holding the store.
    before_mib: f64,
    after_mib: f64,
    /// What the server's heap held (jemalloc's `allocated`) and kept resident when the step
    /// started: RSS above the allocated figure is what the allocator kept of earlier steps.
    allocated_before_mib: f64,
    resident_before_mib: f64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let vxds = match &args.vxds {
        Some(path) => path.clone(),
        None => std::env::current_exe()?
            .parent()
            .and_then(Path::parent)
            .context("locating the target folder")?
            .join("vxds"),
    };
    let mut binaries = vec![("this build", vxds)];
    if let Some(baseline) = &args.baseline {
        binaries.insert(0, ("baseline", baseline.clone()));
    }
    let changeset = serde_json::to_vec(&big_changeset(args.clusters, args.variants))?;
    let endpoints = serde_json::to_vec(&endpoints(args.endpoints))?;
    println!(
        "changeset: {} clusters x {} variants, {:.1} MB of JSON; then {} endpoints ({:.1} MB)",
        args.clusters,
        args.variants,
        changeset.len() as f64 / 1e6,
        args.endpoints,
        endpoints.len() as f64 / 1e6,
    );
    let runtime = tokio::runtime::Runtime::new()?;
    for backend in &args.backends {
        let db = match backend.as_str() {
            "postgres" => Db::Postgres,
            "sqlite" => Db::Sqlite,
            other => bail!("unknown backend `{other}`"),
        };
        let mut results = Vec::new();
        for (label, binary) in &binaries {
            let measured = runtime.block_on(measure(
                Duration::from_secs(args.settle),
                binary,
                db,
                &changeset,
                &endpoints,
            ))?;
            results.push((*label, measured));
        }
        report(backend, &changeset, &results);
    }
    Ok(())
}

async fn measure(
    settle: Duration,
    binary: &Path,
    db: Db,
    changeset: &[u8],
    endpoints: &[u8],
) -> anyhow::Result<Measured> {
    let database = TestDb::fresh(db).await;
    let result = measure_on(binary, &database, changeset, endpoints).await;
    database.remove().await;
    let mut measured = result?;
    let database = TestDb::fresh(db).await;
    let result = round_trip(binary, &database, &measured.export, settle).await;
    database.remove().await;
    measured.round_trip = result?;
    Ok(measured)
}

async fn round_trip(
    binary: &Path,
    database: &TestDb,
    export: &[u8],
    settle: Duration,
) -> anyhow::Result<RoundTrip> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("export.yaml");
    std::fs::write(&file, export)?;
    let file = file.display().to_string();
    let server = ServeProcess::start_on(binary, dir.path(), &database.url, "127.0.0.1:0", &[])
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = server.child.id();
    let client = reqwest::Client::new();
    let admin = server.admin_url.as_str();
    tokio::time::sleep(Duration::from_millis(500)).await;
    warm_up(&client, admin).await?;
    let idle_mib = memory(pid, "VmRSS:")?;
    let commands: [(&'static str, Vec<&str>, u64); 4] = [
        (
            "apply of the export",
            vec!["apply", "-f", &file, "--server", admin],
            1,
        ),
        (
            "diff of the export (equal)",
            vec!["diff", "-f", &file, "--server", admin],
            1,
        ),
        (
            "rollback --to 0 (delete all)",
            vec!["rollback", "--to", "0", "--server", admin],
            2,
        ),
        (
            "rollback --to 1 (restore all)",
            vec!["rollback", "--to", "1", "--server", admin],
            3,
        ),
    ];
    let mut steps = Vec::new();
    for (what, args, head) in commands {
        tokio::time::sleep(settle).await;
        let (allocated_before_mib, resident_before_mib) = heap(&client, admin).await?;
        // Resets VmHWM to the current RSS, so that each step's peak is its own.
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
        let before_mib = memory(pid, "VmRSS:")?;
        let started = Instant::now();
        run(binary, &args)?;
        wait_indexed(&client, admin, head).await?;
        let time = started.elapsed();
        let peak_mib = memory(pid, "VmHWM:")?;
        let after_mib = memory(pid, "VmRSS:")?;
        let revision: Value = client
            .get(format!("{admin}/healthz/store"))
            .send()
            .await?
            .json()
            .await?;
        if revision["revision"].as_u64() != Some(head) {
            bail!(
                "{what}: the store is at {}, not one revision on ({head})",
                revision["revision"]
            );
        }
        steps.push(Step {
            what,
            time,
            peak_mib,
            before_mib,
            after_mib,
            allocated_before_mib,
            resident_before_mib,
        });
    }
    let end_mib = memory(pid, "VmRSS:")?;
    drop(server);
    Ok(RoundTrip {
        idle_mib,
        steps,
        end_mib,
    })
}

async fn measure_on(
    binary: &Path,
    database: &TestDb,
    changeset: &[u8],
    endpoints: &[u8],
) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir()?;
    let server = ServeProcess::start_on(binary, dir.path(), &database.url, "127.0.0.1:0", &[])
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = server.child.id();
    let client = reqwest::Client::new();
    let admin = &server.admin_url;
    // Let start-up settle before reading the idle figure.
    tokio::time::sleep(Duration::from_millis(500)).await;
    warm_up(&client, admin).await?;
    let idle_mib = memory(pid, "VmRSS:")?;

    let started = Instant::now();
    let revision = post(&client, admin, changeset).await?;
    let commit = started.elapsed();
    wait_indexed(&client, admin, revision).await?;
    let indexed = started.elapsed();
    let peak_mib = memory(pid, "VmHWM:")?;
    let after_mib = memory(pid, "VmRSS:")?;

    let revision = post(&client, admin, endpoints).await?;
    wait_indexed(&client, admin, revision).await?;
    let out = dir.path().join("export.yaml");
    let out_arg = out.display().to_string();
    let started = Instant::now();
    run(binary, &["export", "--server", admin, "-o", &out_arg])?;
    let export_server = started.elapsed();
    let export = std::fs::read(&out)?;
    let started = Instant::now();
    run(
        binary,
        &["export", "--database-url", &database.url, "-o", &out_arg],
    )?;
    let export_database = started.elapsed();
    if std::fs::read(&out)? != export {
        bail!("{}: the two exports differ", binary.display());
    }
    let exported_documents = export
        .split(|b| *b == b'\n')
        .filter(|line| *line == b"---")
        .count();
    drop(server);
    let server = ServeProcess::start_on(binary, dir.path(), &database.url, "127.0.0.1:0", &[])?;
    wait_indexed(&client, &server.admin_url, revision).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let restarted_mib = memory(server.child.id(), "VmRSS:")?;
    drop(server);
    Ok(Measured {
        idle_mib,
        peak_mib,
        after_mib,
        restarted_mib,
        commit,
        indexed,
        export_server,
        export_database,
        exported_documents,
        export,
        round_trip: RoundTrip {
            idle_mib: 0.0,
            steps: Vec::new(),
            end_mib: 0.0,
        },
    })
}

fn report(backend: &str, changeset: &[u8], results: &[(&str, Measured)]) {
    let body_mib = changeset.len() as f64 / (1 << 20) as f64;
    println!("\n{backend}:");
    println!(
        "| binary | idle RSS | peak RSS (VmHWM) | peak over idle | ÷ body | RSS after | restarted on the store | commit | indexed | export (server) | export (--database-url) | documents |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (label, m) in results {
        let over = m.peak_mib - m.idle_mib;
        println!(
            "| {label} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.1}× | {:.0} MiB | {:.0} MiB | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {} |",
            m.idle_mib,
            m.peak_mib,
            over,
            over / body_mib,
            m.after_mib,
            m.restarted_mib,
            m.commit.as_secs_f64(),
            m.indexed.as_secs_f64(),
            m.export_server.as_secs_f64(),
            m.export_database.as_secs_f64(),
            m.exported_documents,
        );
    }
    for (label, m) in results {
        let export_mib = m.export.len() as f64 / (1 << 20) as f64;
        let rt = &m.round_trip;
        println!(
            "\n{label}: round trip of the export ({} documents, {export_mib:.1} MiB) on an empty store; server idle {:.0} MiB, at the end {:.0} MiB",
            m.exported_documents, rt.idle_mib, rt.end_mib
        );
        println!(
            "| step | time | server peak RSS | RSS before / after | heap allocated / resident before | peak over idle | ÷ export size | peak over max(before, after) | ÷ export size |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for step in &rt.steps {
            let over = step.peak_mib - rt.idle_mib;
            let own = step.peak_mib - step.before_mib.max(step.after_mib);
            println!(
                "| {} | {:.2} s | {:.0} MiB | {:.0} / {:.0} MiB | {:.0} / {:.0} MiB | {:.0} MiB | {:.1}× | {:.0} MiB | {:.1}× |",
                step.what,
                step.time.as_secs_f64(),
                step.peak_mib,
                step.before_mib,
                step.after_mib,
                step.allocated_before_mib,
                step.resident_before_mib,
                over,
                over / export_mib,
                own,
                own / export_mib,
            );
        }
    }
    if let [(_, first), (_, second)] = results {
        let same = first.export == second.export;
        println!(
            "exports of the two binaries: {}",
            if same { "identical" } else { "DIFFERENT" }
        );
    }
}

/// `clusters` clusters, each with `variants` mutually exclusive variants on `env`.
fn big_changeset(clusters: usize, variants: usize) -> Value {
    let operations: Vec<Value> = (0..clusters)
        .map(|i| {
            let name = format!("cluster-{i:06}");
            let variants: Vec<Value> = (0..variants)
                .map(|v| cluster_variant(&name, v, variants))
                .collect();
            json!({"op": "put", "type": "cluster", "name": name, "variants": variants})
        })
        .collect();
    json!({"message": "big write", "operations": operations})
}

/// `count` endpoints, one variant each.
fn endpoints(count: usize) -> Value {
    let operations: Vec<Value> = (0..count)
        .map(|i| {
            let name = format!("endpoints-{i:05}");
            json!({"op": "put", "type": "endpoint", "name": name, "variants": [{"resource": {
                "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": format!("10.0.{}.{}", i / 250, i % 250), "port_value": 8080}}}}]}],
            }}]})
        })
        .collect();
    json!({"operations": operations})
}

/// Validates one resource without writing it (a dry run: no revision), so that what a server
/// loads once on its first validation (the Envoy descriptor pool, tens of MiB) counts as idle
/// rather than as the first measured write's.
async fn warm_up(client: &reqwest::Client, admin: &str) -> anyhow::Result<()> {
    let mut changeset = big_changeset(1, 1);
    changeset["dry_run"] = json!(true);
    let response = client
        .post(format!("{admin}/v1/changesets"))
        .json(&changeset)
        .send()
        .await?;
    if !response.status().is_success() {
        bail!(
            "the warm-up dry run was refused: {}",
            response.text().await?
        );
    }
    Ok(())
}

async fn post(client: &reqwest::Client, admin: &str, body: &[u8]) -> anyhow::Result<u64> {
    let response = client
        .post(format!("{admin}/v1/changesets"))
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await?;
    let status = response.status();
    let answer: Value = response.json().await?;
    if !status.is_success() {
        bail!("the changeset was refused ({status}): {answer}");
    }
    answer["revision"]
        .as_u64()
        .context("the answer has no revision")
}

/// Waits until the server's index serves `revision`.
async fn wait_indexed(client: &reqwest::Client, admin: &str, revision: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let ready: Value = client
            .get(format!("{admin}/readyz"))
            .send()
            .await?
            .json()
            .await?;
        if ready["index_revision"].as_u64() >= Some(revision) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the index did not reach revision {revision}")
}

fn run(binary: &Path, args: &[&str]) -> anyhow::Result<()> {
    let output = std::process::Command::new(binary).args(args).output()?;
    if !output.status.success() {
        bail!(
            "{} {}: {}",
            binary.display(),
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// The server's heap as its /metrics reports it: (allocated, resident), in MiB.
async fn heap(client: &reqwest::Client, admin: &str) -> anyhow::Result<(f64, f64)> {
    let text = client
        .get(format!("{admin}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let gauge =
        |name: &str| metric_mib(&text, name).with_context(|| format!("no {name} on /metrics"));
    Ok((
        gauge("vxds_heap_allocated_bytes")?,
        gauge("vxds_heap_resident_bytes")?,
    ))
}

/// A /proc/PID/status field, in MiB.
fn memory(pid: u32, field: &str) -> anyhow::Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|kib| kib / 1024.0)
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}
