//! Load generator for the xDS server: many concurrent ADS streams against a real `vxds serve`.
//!
//! It starts `vxds serve` (release build, SQLite in a temporary directory) as its own process,
//! seeds a route with one variant per shard and a set of clusters, then opens `--streams` ADS
//! streams, one TCP connection each as real proxies do, half SotW and half Delta (`--protocol`).
//! Every stream subscribes to CDS (wildcard) and to the route, with its shard as the route's
//! dynamic parameter, and ACKs what it receives. Then it updates, through the REST API, the
//! route (every variant) and one cluster in turn, and measures for every stream the time from
//! the admin request to the moment the stream received the new version. It reports the
//! server's memory (RSS) and CPU time at each phase.
//!
//! ```sh
//! cargo build --release -p vxds && cargo run --release -p vxds --example xds_load -- --streams 10000
//! ```
//!
//! Both processes share the machine, so the figures include the load generator's own cost.
//! Results are written down in docs/benchmarks.md.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use prost::Message;
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;
use vxds_envoy::pb::envoy::config::cluster::v3::Cluster;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::config::route::v3::RouteConfiguration;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use vxds_envoy::pb::xds::core::v3::ContextParams;
use vxds_testkit::serve::ServeProcess;

const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ROUTE_NAME: &str = "load_route";

#[derive(Parser)]
#[command(about = "Many concurrent ADS streams against a real `vxds serve`")]
struct Args {
    /// Concurrent ADS streams, one connection each.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// SotW, Delta, or half of each.
    #[arg(long, value_enum, default_value_t = Protocol::Mixed)]
    protocol: Protocol,
    /// Variants of the route, one per shard; stream i has shard i % shards.
    #[arg(long, default_value_t = 16)]
    shards: usize,
    /// Clusters every stream receives (CDS wildcard).
    #[arg(long, default_value_t = 50)]
    clusters: usize,
    /// Updates measured, alternating between the route and one cluster.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    /// Streams connecting at once.
    #[arg(long, default_value_t = 256)]
    connect_concurrency: usize,
    /// The vxds binary (default: the workspace's release build).
    #[arg(long)]
    vxds: Option<PathBuf>,
    /// Load a server that is already running instead (e.g. on Postgres, or under a profiler):
    /// its admin API URL. Needs `--xds-url` and `--server-pid` too.
    #[arg(long, requires_all = ["xds_url", "server_pid"])]
    admin_url: Option<String>,
    /// The running server's xDS URL (`http://127.0.0.1:18000`).
    #[arg(long)]
    xds_url: Option<String>,
    /// The running server's process id, for its memory and CPU figures.
    #[arg(long)]
    server_pid: Option<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    Sotw,
    Delta,
    Mixed,
}

/// The round markers each stream last received: the route's header value and cluster `c0`'s
/// connect timeout carry the round number.
struct Seen {
    route: AtomicU64,
    cluster: AtomicU64,
    route_at: AtomicU64,
    cluster_at: AtomicU64,
}

struct Shared {
    start: Instant,
    seen: Vec<Seen>,
    failed: AtomicUsize,
    /// Set when measuring is over: streams then end because the server stops, not in error.
    finished: AtomicBool,
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn record_route(&self, stream: usize, round: u64) {
        let seen = &self.seen[stream];
        seen.route_at.store(self.now(), Ordering::Relaxed);
        seen.route.store(round, Ordering::Release);
    }

    /// Records the round marker a response carries, if any.
    fn observe<'a>(
        &self,
        stream: usize,
        type_url: &str,
        mut bodies: impl Iterator<Item = &'a [u8]>,
    ) {
        if type_url == ROUTE {
            if let Some(round) = bodies.find_map(route_round) {
                self.record_route(stream, round);
            }
        } else if let Some(round) = bodies.find_map(cluster_round) {
            self.record_cluster(stream, round);
        }
    }

    /// Whether the stream holds its route and the clusters.
    fn configured(&self, stream: usize) -> bool {
        let seen = &self.seen[stream];
        seen.route.load(Ordering::Acquire) != u64::MAX
            && seen.cluster.load(Ordering::Acquire) != u64::MAX
    }

    fn record_cluster(&self, stream: usize, round: u64) {
        let seen = &self.seen[stream];
        seen.cluster_at.store(self.now(), Ordering::Relaxed);
        seen.cluster.store(round, Ordering::Release);
    }
}

fn route_variants(shards: usize, round: u64) -> Value {
    let variants: Vec<Value> = (0..shards)
        .map(|shard| {
            json!({
                "constraints": format!("shard = \"s{shard}\""),
                "resource": {
                    "@type": ROUTE,
                    "name": ROUTE_NAME,
                    "response_headers_to_add": [{"header": {"key": "x-round", "value": round.to_string()}}],
                    "virtual_hosts": [{"name": format!("shard-{shard}"), "domains": ["*"], "routes": [
                        {"match": {"prefix": "/"}, "route": {"cluster": format!("c{}", shard % 4)}},
                    ]}],
                },
            })
        })
        .collect();
    json!(variants)
}

fn cluster(name: &str, round: u64) -> Value {
    json!({"op": "put", "type": "cluster", "name": name, "variants": [{"resource": {
        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": name, "type": "EDS", "connect_timeout": format!("{}s", round + 1),
        "eds_cluster_config": {"eds_config": {"ads": {}}},
    }}]})
}

fn route_round(resource: &[u8]) -> Option<u64> {
    let route = RouteConfiguration::decode(resource).ok()?;
    route
        .response_headers_to_add
        .first()?
        .header
        .as_ref()?
        .value
        .parse()
        .ok()
}

fn cluster_round(resource: &[u8]) -> Option<u64> {
    let cluster = Cluster::decode(resource).ok()?;
    let seconds = cluster.connect_timeout?.seconds;
    (cluster.name == "c0")
        .then(|| u64::try_from(seconds - 1).ok())
        .flatten()
}

fn node(stream: usize, shards: usize) -> Node {
    let mut node = Node {
        id: format!("load-{stream}"),
        user_agent_name: "vxds-load".into(),
        ..Default::default()
    };
    let params = [("shard".to_owned(), format!("s{}", stream % shards))]
        .into_iter()
        .collect();
    node.dynamic_parameters
        .insert(ROUTE.into(), ContextParams { params });
    node
}

/// One SotW ADS stream: subscribe, then ACK every response and record the markers.
async fn run_sotw(
    endpoint: Endpoint,
    stream: usize,
    shards: usize,
    shared: Arc<Shared>,
    slot: OwnedSemaphorePermit,
) {
    let result: anyhow::Result<()> = async {
        let channel = endpoint.connect().await?;
        let (tx, rx) = mpsc::channel(8);
        let subscribe = |type_url: &str, names: Vec<String>, node: Option<Node>| DiscoveryRequest {
            type_url: type_url.into(),
            resource_names: names,
            node,
            ..Default::default()
        };
        tx.send(subscribe(CLUSTER, vec![], Some(node(stream, shards))))
            .await?;
        tx.send(subscribe(ROUTE, vec![ROUTE_NAME.into()], None))
            .await?;
        let mut responses = AggregatedDiscoveryServiceClient::new(channel)
            .stream_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let mut slot = Some(slot);
        while let Some(response) = responses.message().await? {
            let DiscoveryResponse {
                type_url,
                version_info,
                nonce,
                resources,
                ..
            } = response;
            shared.observe(
                stream,
                &type_url,
                resources.iter().map(|any| any.value.as_slice()),
            );
            let names = if type_url == ROUTE {
                vec![ROUTE_NAME.into()]
            } else {
                vec![]
            };
            tx.send(DiscoveryRequest {
                version_info,
                response_nonce: nonce,
                ..subscribe(&type_url, names, None)
            })
            .await?;
            if shared.configured(stream) {
                slot.take(); // configured: the next stream may connect
            }
        }
        Ok(())
    }
    .await;
    report_end(stream, result, &shared);
}

/// One Delta ADS stream.
async fn run_delta(
    endpoint: Endpoint,
    stream: usize,
    shards: usize,
    shared: Arc<Shared>,
    slot: OwnedSemaphorePermit,
) {
    let result: anyhow::Result<()> = async {
        let channel = endpoint.connect().await?;
        let (tx, rx) = mpsc::channel(8);
        let request = |type_url: &str| DeltaDiscoveryRequest {
            type_url: type_url.into(),
            ..Default::default()
        };
        // An empty first subscription is the legacy wildcard, as Envoy sends for CDS.
        tx.send(DeltaDiscoveryRequest {
            node: Some(node(stream, shards)),
            ..request(CLUSTER)
        })
        .await?;
        tx.send(DeltaDiscoveryRequest {
            resource_names_subscribe: vec![ROUTE_NAME.into()],
            ..request(ROUTE)
        })
        .await?;
        let mut responses = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let mut slot = Some(slot);
        while let Some(response) = responses.message().await? {
            let DeltaDiscoveryResponse {
                type_url,
                nonce,
                resources,
                ..
            } = response;
            let bodies = resources
                .iter()
                .filter_map(|r| r.resource.as_ref())
                .map(|any| any.value.as_slice());
            shared.observe(stream, &type_url, bodies);
            tx.send(DeltaDiscoveryRequest {
                response_nonce: nonce,
                ..request(&type_url)
            })
            .await?;
            if shared.configured(stream) {
                slot.take(); // configured: the next stream may connect
            }
        }
        Ok(())
    }
    .await;
    report_end(stream, result, &shared);
}

fn report_end(stream: usize, result: anyhow::Result<()>, shared: &Shared) {
    if let Err(error) = result {
        if shared.finished.load(Ordering::Relaxed) {
            return;
        }
        if shared.failed.fetch_add(1, Ordering::Relaxed) < 5 {
            eprintln!("stream {stream} failed: {error:#}");
        }
    }
}

/// Resident and peak memory (MiB) and CPU seconds of a process, from /proc.
fn process_usage(pid: u32) -> anyhow::Result<(f64, f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kib = |field: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    const USER_HZ: f64 = 100.0; // Linux's fixed clock-tick unit for /proc
    Ok((
        kib("VmRSS:") / 1024.0,
        kib("VmHWM:") / 1024.0,
        (ticks(11) + ticks(12)) / USER_HZ,
    ))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

async fn put(client: &reqwest::Client, url: String, body: Value) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let response = client.put(url).json(&body).send().await?;
    if !response.status().is_success() {
        bail!(
            "admin API: {} {}",
            response.status(),
            response.text().await?
        );
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let (Some(admin), Some(xds), Some(pid)) = (&args.admin_url, &args.xds_url, args.server_pid) {
        return run(&args, pid, admin, xds).await;
    }
    let binary = args.vxds.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/vxds")
    });
    let dir = tempfile::tempdir()?;
    let server = ServeProcess::start(&binary, dir.path(), &[]).with_context(|| {
        format!(
            "starting {} (build it: cargo build --release -p vxds)",
            binary.display()
        )
    })?;
    let xds = format!("http://{}", server.xds_addr);
    run(&args, server.child.id(), &server.admin_url, &xds).await
}

async fn run(args: &Args, pid: u32, admin: &str, xds: &str) -> anyhow::Result<()> {
    let client = reqwest::Client::new();
    let mut ops: Vec<Value> = (0..args.clusters)
        .map(|i| cluster(&format!("c{i}"), 0))
        .collect();
    ops.push(json!({"op": "put", "type": "route", "name": ROUTE_NAME, "variants": route_variants(args.shards, 0)}));
    let seeded = client
        .post(format!("{admin}/v1/changesets"))
        .json(&json!({"operations": ops}))
        .send()
        .await?;
    if !seeded.status().is_success() {
        bail!("seeding: {}", seeded.text().await?);
    }
    let (rss, _, cpu) = process_usage(pid)?;
    println!("server idle, seeded: RSS {rss:.1} MiB, CPU {cpu:.2} s");
    println!(
        "{} streams ({}), {} route variants, {} clusters per stream",
        args.streams,
        match args.protocol {
            Protocol::Sotw => "SotW",
            Protocol::Delta => "Delta",
            Protocol::Mixed => "half SotW, half Delta",
        },
        args.shards,
        args.clusters
    );

    let shared = Arc::new(Shared {
        start: Instant::now(),
        seen: (0..args.streams)
            .map(|_| Seen {
                route: AtomicU64::new(u64::MAX),
                cluster: AtomicU64::new(u64::MAX),
                route_at: AtomicU64::new(0),
                cluster_at: AtomicU64::new(0),
            })
            .collect(),
        failed: AtomicUsize::new(0),
        finished: AtomicBool::new(false),
    });
    let endpoint = Endpoint::from_shared(xds.to_owned())?.connect_timeout(Duration::from_secs(10));
    // Connecting streams wait for a slot; a stream frees its slot once it holds its config.
    let slots = Arc::new(Semaphore::new(args.connect_concurrency));
    let connect_started = Instant::now();
    for stream in 0..args.streams {
        let slot = slots.clone().acquire_owned().await?;
        let delta = match args.protocol {
            Protocol::Sotw => false,
            Protocol::Delta => true,
            Protocol::Mixed => stream % 2 == 1,
        };
        let (endpoint, shared, shards) = (endpoint.clone(), shared.clone(), args.shards);
        if delta {
            tokio::spawn(run_delta(endpoint, stream, shards, shared, slot));
        } else {
            tokio::spawn(run_sotw(endpoint, stream, shards, shared, slot));
        }
    }
    wait_until("initial configuration", Duration::from_secs(300), || {
        let have = shared
            .seen
            .iter()
            .filter(|s| {
                s.route.load(Ordering::Acquire) == 0 && s.cluster.load(Ordering::Acquire) == 0
            })
            .count();
        (have, args.streams, shared.failed.load(Ordering::Relaxed))
    })
    .await?;
    let connect_time = connect_started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await; // let ACKs settle before measuring memory
    let (rss_connected, _, cpu_connected) = process_usage(pid)?;
    println!(
        "all {} streams connected and configured in {:.2} s; server RSS {rss_connected:.1} MiB ({:.1} KiB per stream over idle), CPU {cpu_connected:.2} s",
        args.streams,
        connect_time.as_secs_f64(),
        (rss_connected - rss) * 1024.0 / args.streams as f64,
    );

    println!(
        "\n| round | change | admin PUT | p50 | p99 | max (all streams have it) | server CPU | load generator CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let mut all_latencies = Vec::new();
    for round in 1..=args.rounds as u64 {
        let is_route = round % 2 == 1;
        let (_, _, cpu_before) = process_usage(pid)?;
        let (_, _, own_before) = process_usage(std::process::id())?;
        let sent = shared.now();
        let put_time = if is_route {
            put(
                &client,
                format!("{admin}/v1/resources/route/{ROUTE_NAME}"),
                json!({"variants": route_variants(args.shards, round)}),
            )
            .await?
        } else {
            put(
                &client,
                format!("{admin}/v1/resources/cluster/c0"),
                json!({"variants": cluster("c0", round)["variants"]}),
            )
            .await?
        };
        let marker = |s: &Seen| {
            if is_route {
                s.route.load(Ordering::Acquire)
            } else {
                s.cluster.load(Ordering::Acquire)
            }
        };
        wait_until(&format!("round {round}"), Duration::from_secs(120), || {
            (
                shared.seen.iter().filter(|s| marker(s) == round).count(),
                args.streams,
                shared.failed.load(Ordering::Relaxed),
            )
        })
        .await?;
        let (_, _, cpu_after) = process_usage(pid)?;
        let (_, _, own_after) = process_usage(std::process::id())?;
        let mut latencies: Vec<f64> = shared
            .seen
            .iter()
            .map(|s| {
                let at = if is_route {
                    s.route_at.load(Ordering::Relaxed)
                } else {
                    s.cluster_at.load(Ordering::Relaxed)
                };
                at.saturating_sub(sent) as f64 / 1e6
            })
            .collect();
        latencies.sort_by(f64::total_cmp);
        println!(
            "| {round} | {} | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms | {:.2} s | {:.2} s |",
            if is_route {
                "route, every variant"
            } else {
                "cluster c0"
            },
            put_time.as_secs_f64() * 1e3,
            percentile(&latencies, 50.0),
            percentile(&latencies, 99.0),
            percentile(&latencies, 100.0),
            cpu_after - cpu_before,
            own_after - own_before,
        );
        all_latencies.extend(latencies);
        tokio::time::sleep(Duration::from_millis(500)).await; // ACKs in before the next change
    }
    all_latencies.sort_by(f64::total_cmp);
    let (rss_end, hwm, cpu_end) = process_usage(pid)?;
    println!(
        "\nall rounds: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms from the admin request to the stream; server RSS {rss_end:.1} MiB (peak {hwm:.1} MiB), CPU {cpu_end:.2} s in all",
        percentile(&all_latencies, 50.0),
        percentile(&all_latencies, 99.0),
        percentile(&all_latencies, 100.0),
    );
    shared.finished.store(true, Ordering::Relaxed);
    let failed = shared.failed.load(Ordering::Relaxed);
    if failed > 0 {
        bail!("{failed} streams failed");
    }
    Ok(())
}

/// Polls a progress counter (the load generator's own bookkeeping, not the server) until done.
async fn wait_until(
    what: &str,
    limit: Duration,
    progress: impl Fn() -> (usize, usize, usize),
) -> anyhow::Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        let (done, total, failed) = progress();
        if done == total {
            return Ok(());
        }
        if failed > 0 && done + failed >= total {
            bail!("{what}: {failed} streams failed");
        }
        if Instant::now() > deadline {
            bail!("{what}: only {done} of {total} streams after {limit:?} ({failed} failed)");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
