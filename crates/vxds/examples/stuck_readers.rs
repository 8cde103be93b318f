//! Event-stream readers that never read: what they cost the server.
//!
//! Starts `vxds serve` (the release build beside this example) on a fresh SQLite store, writes
//! `--names` endpoints, opens `--readers` connections that send `GET /v1/events` and then never
//! read a byte, and writes `--revisions` revisions that each change every one of the names (one
//! `data:` line of the size of the change list per revision, per reader). It reads the server's
//! resident memory (`VmRSS`, and the peak `VmHWM`) before and after, and with `--readers 0` for
//! comparison in the same run. The hub serialises each event once and bounds each reader's queue
//! in bytes (1 MiB); a reader that overflows is sent `reset` and dropped.
//!
//! ```sh
//! cargo build --release -p vxds --example stuck_readers --bin vxds
//! target/release/examples/stuck_readers            # 0 and 100 stuck readers
//! ```
//!
//! Results are written down in docs/benchmarks.md.

use std::io::Write;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use vxds_testkit::serve::ServeProcess;

#[derive(Parser)]
#[command(about = "Server memory with event-stream readers that never read")]
struct Args {
    /// The vxds binary (default: `vxds` in the target folder this example was built into).
    #[arg(long)]
    vxds: Option<PathBuf>,
    /// Stuck readers, measured after a run with none.
    #[arg(long, default_value_t = 100)]
    readers: usize,
    /// Names each revision changes.
    #[arg(long, default_value_t = 1_000)]
    names: usize,
    /// Revisions written while the readers are stuck.
    #[arg(long, default_value_t = 80)]
    revisions: usize,
}

struct Measured {
    readers: usize,
    idle_mib: f64,
    before_mib: f64,
    after_mib: f64,
    peak_mib: f64,
    event_bytes: usize,
    elapsed: Duration,
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
    let runtime = tokio::runtime::Runtime::new()?;
    let mut results = Vec::new();
    for readers in [0, args.readers] {
        results.push(runtime.block_on(measure(&vxds, &args, readers))?);
    }
    println!(
        "{} names changed per revision, {} revisions; a revision's change list is {:.0} KiB of JSON",
        args.names,
        args.revisions,
        results[0].event_bytes as f64 / 1024.0
    );
    println!(
        "| stuck readers | idle RSS | RSS with the store, before | RSS after | peak RSS (VmHWM) | peak over before | time |"
    );
    println!("|---|---|---|---|---|---|---|");
    for m in &results {
        println!(
            "| {} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.1} s |",
            m.readers,
            m.idle_mib,
            m.before_mib,
            m.after_mib,
            m.peak_mib,
            m.peak_mib - m.before_mib,
            m.elapsed.as_secs_f64(),
        );
    }
    Ok(())
}

async fn measure(binary: &Path, args: &Args, readers: usize) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir()?;
    let server = ServeProcess::start(binary, dir.path(), &["--max-event-readers", "1000"])
        .with_context(|| format!("starting {}", binary.display()))?;
    let pid = server.child.id();
    let admin = server.admin_url.clone();
    let client = reqwest::Client::new();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_mib = memory(pid, "VmRSS:")?;
    put(&client, &admin, args.names, 0).await?;

    let address = admin
        .strip_prefix("http://")
        .context("an http:// admin address")?
        .to_owned();
    let mut stuck = Vec::new();
    for _ in 0..readers {
        // Never read: what the kernel's socket buffers take, then the server's queue.
        let mut stream = TcpStream::connect(&address)?;
        write!(
            stream,
            "GET /v1/events HTTP/1.1\r\nHost: {address}\r\nAccept: text/event-stream\r\n\r\n"
        )?;
        stuck.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before_mib = memory(pid, "VmRSS:")?;
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    let started = Instant::now();
    let mut head = 1;
    for revision in 1..=args.revisions {
        head = put(&client, &admin, args.names, revision).await?;
    }
    wait_indexed(&client, &admin, head).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let elapsed = started.elapsed();
    let after_mib = memory(pid, "VmRSS:")?;
    let peak_mib = memory(pid, "VmHWM:")?;
    // About the size of one revision's event: its change list.
    let event_bytes = serde_json::to_vec(
        &client
            .get(format!("{admin}/v1/revisions/{head}/changes"))
            .send()
            .await?
            .json::<Value>()
            .await?,
    )?
    .len();
    drop(stuck);
    drop(server);
    Ok(Measured {
        readers,
        idle_mib,
        before_mib,
        after_mib,
        peak_mib,
        event_bytes,
        elapsed,
    })
}

/// Puts `names` endpoints, each with a port that differs per `round`; the new head.
async fn put(
    client: &reqwest::Client,
    admin: &str,
    names: usize,
    round: usize,
) -> anyhow::Result<u64> {
    let operations: Vec<Value> = (0..names)
        .map(|i| {
            let name = format!("service-{i:05}");
            json!({"op": "put", "type": "endpoint", "name": name, "variants": [{"resource": {
                "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                "cluster_name": name,
                "endpoints": [{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {
                    "address": "10.0.0.1", "port_value": 1000 + round}}}}]}],
            }}]})
        })
        .collect();
    let response = client
        .post(format!("{admin}/v1/changesets"))
        .json(&json!({"operations": operations}))
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
