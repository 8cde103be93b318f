//! Load generator for the xDS server: many concurrent ADS streams against real `vxds serve`
//! processes — one, or several replicas on one Postgres database.
//!
//! It starts `vxds serve` (release build; SQLite in a temporary directory, or with
//! `--replicas N` / `--postgres` N processes on a fresh Postgres database), seeds `--clusters`
//! clusters with `--variants` variants each (keyed on `shard`), then opens `--streams` ADS
//! streams, one TCP connection each as real proxies do (or `--streams-per-connection` sharing
//! one), spread round-robin over the replicas (and over `--local-addrs` source addresses). A
//! stream subscribes to CDS in one of three ways: SotW wildcard, Delta wildcard — both with
//! their shard in `node.dynamic_parameters` — or Delta by `resource_locators_subscribe`, one
//! locator per cluster with the shard as its parameter (`--locators`: the share of Delta
//! streams doing so). Every stream ACKs what it receives. Then it updates cluster `c0` (every
//! variant) through one replica's REST API, round after round, and measures for every stream
//! on every replica the time from the admin request to the moment the stream received the new
//! version. It reports each server's memory (RSS) and CPU time, and on Postgres the
//! database's transactions and rows read per revision.
//!
//! ```sh
//! cargo build --release -p vxds --example xds_load --bin vxds
//! ./target/release/examples/xds_load --streams 10000 --protocol delta --locators 1
//! ```
//!
//! The load generator and the servers share the machine, so the figures include the load
//! generator's own cost, unless `--pin` puts them on cores of their own. `--against BIN`
//! measures another server (the limit, `xds_baseline`) the same way, alternating with vxds,
//! and prints the ratios. Results are written down in docs/benchmarks.md.

use std::collections::HashSet;
use std::net::IpAddr;
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
use tonic::transport::{Channel, Endpoint};
use vxds_envoy::pb::envoy::config::cluster::v3::Cluster;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    ResourceLocator,
};
use vxds_testkit::serve::ServeProcess;
use vxds_testkit::{Db, TestDb};

#[path = "xds_load/compare.rs"]
mod compare;
#[path = "common/load.rs"]
mod load;
use load::{
    CLUSTER, node, percentile, process_usage, put, raise_open_file_limit, servers_usage, shard,
};

/// The cluster every round changes; its connect timeout carries the round.
const MARKED: &str = "c0";

#[derive(Parser)]
#[command(about = "Many concurrent ADS streams against real `vxds serve` replicas")]
struct Args {
    /// Concurrent ADS streams in all, spread over the replicas.
    #[arg(long, default_value_t = 10_000)]
    streams: usize,
    /// ADS streams per HTTP/2 connection (1, as proxies do; more lets one machine's open-file
    /// limit hold more streams: every connection takes a descriptor on both sides). At most
    /// the server's 64 concurrent streams per connection.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    streams_per_connection: u16,
    /// SotW, Delta, or half of each.
    #[arg(long, value_enum, default_value_t = Protocol::Mixed)]
    protocol: Protocol,
    /// The share of Delta streams (0 to 1) that subscribe by locator, one per cluster with
    /// their shard as its parameter; the others subscribe by wildcard.
    #[arg(long, default_value_t = 0.0)]
    locators: f64,
    /// Clusters every stream receives.
    #[arg(long, default_value_t = 10)]
    clusters: usize,
    /// Variants of every cluster, one per shard (`shard = "s0"` ...); stream i has shard
    /// i % variants.
    #[arg(long, default_value_t = 4)]
    variants: usize,
    /// Updates of cluster c0 measured.
    #[arg(long, default_value_t = 6)]
    rounds: usize,
    /// Streams connecting at once.
    #[arg(long, default_value_t = 256)]
    connect_concurrency: usize,
    /// The vxds binary (default: the one built beside this example, same profile).
    #[arg(long)]
    vxds: Option<PathBuf>,
    /// Replicas of `vxds serve` to start, all on one fresh Postgres database.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Run one replica on Postgres too (more than one replica always does).
    #[arg(long)]
    postgres: bool,
    /// On Postgres, measure the database's transactions and rows read per revision, less its
    /// background (each replica's head poll) measured over an idle stretch as long as the
    /// rounds. Backends report to `pg_stat_database` up to 10 s late, so every reading waits
    /// 11 s first: this adds about 45 s.
    #[arg(long)]
    database_stats: bool,
    /// Source addresses the streams' connections are spread over (e.g. 127.0.0.1,127.0.0.2):
    /// one source address reaches one server port from at most ~28,000 ephemeral ports.
    #[arg(long, value_delimiter = ',')]
    local_addrs: Vec<IpAddr>,
    /// Extra arguments for every `vxds serve`.
    #[arg(long, allow_hyphen_values = true)]
    serve_arg: Vec<String>,
    /// Load servers that are already running instead (e.g. under a profiler): the admin API
    /// URL of the replica that takes the writes. Needs `--xds-url` and `--server-pid` too.
    #[arg(long, requires_all = ["xds_url", "server_pid"])]
    admin_url: Option<String>,
    /// The running servers' xDS URLs (`http://127.0.0.1:18000`), comma-separated.
    #[arg(long, value_delimiter = ',')]
    xds_url: Vec<String>,
    /// The running servers' process ids (same order), for memory and CPU figures.
    #[arg(long, value_delimiter = ',')]
    server_pid: Vec<u32>,
    /// Dedicated cores (`taskset`): every server on core 0, the load generator on core 1, so
    /// that neither's CPU hides the other's (a server started here starts on core 0, so its
    /// runtime sizes itself to one core).
    #[arg(long)]
    pin: bool,
    /// A shell command run (`sh -c`) just before the first measured round with `ROUNDS=start`
    /// and just after the last with `ROUNDS=end`, and `SERVER_PID` set: e.g. to switch a
    /// profiler or `callgrind_control -i on` over the fan-out window only.
    #[arg(long)]
    rounds_hook: Option<String>,
    /// Side by side: run the same measurement against this server too (e.g.
    /// `target/release/examples/xds_baseline`, the limit), alternating with vxds, `--runs`
    /// times each, and print both medians and vxds ÷ it.
    #[arg(long, conflicts_with = "admin_url")]
    against: Option<PathBuf>,
    /// Runs of each server with `--against`.
    #[arg(long, default_value_t = 2, requires = "against")]
    runs: usize,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Protocol {
    Sotw,
    Delta,
    Mixed,
}

/// How one stream subscribes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sotw,
    Delta,
    DeltaLocators,
}

/// What each stream last received: the marked cluster's round, when, and how many clusters
/// it holds.
struct Seen {
    round: AtomicU64,
    at: AtomicU64,
    held: AtomicUsize,
}

struct Shared {
    start: Instant,
    seen: Vec<Seen>,
    clusters: usize,
    failed: AtomicUsize,
    /// Set when measuring is over: streams then end because the server stops, not in error.
    finished: AtomicBool,
}

impl Shared {
    fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records the round marker the responses' bodies carry, if any.
    fn observe<'a>(&self, stream: usize, bodies: impl Iterator<Item = &'a [u8]>) {
        for round in bodies.filter_map(marked_round) {
            let seen = &self.seen[stream];
            seen.at.store(self.now(), Ordering::Relaxed);
            seen.round.store(round, Ordering::Release);
        }
    }

    /// Whether the stream holds every cluster at round 0 or later.
    fn configured(&self, stream: usize) -> bool {
        let seen = &self.seen[stream];
        seen.round.load(Ordering::Acquire) != u64::MAX
            && seen.held.load(Ordering::Acquire) >= self.clusters
    }
}

fn cluster_variants(name: &str, variants: usize, round: u64) -> Value {
    let variants: Vec<Value> = (0..variants)
        .map(|shard| {
            json!({
                "constraints": format!("shard = \"s{shard}\""),
                "resource": {
                    "@type": CLUSTER,
                    "name": name, "type": "EDS", "connect_timeout": format!("{}s", round + 1),
                    "alt_stat_name": format!("{name}-s{shard}"),
                    "eds_cluster_config": {"eds_config": {"ads": {}}},
                },
            })
        })
        .collect();
    json!(variants)
}

fn marked_round(resource: &[u8]) -> Option<u64> {
    let cluster = Cluster::decode(resource).ok()?;
    let seconds = cluster.connect_timeout?.seconds;
    (cluster.name == MARKED)
        .then(|| u64::try_from(seconds - 1).ok())
        .flatten()
}

/// One SotW ADS stream: CDS wildcard, then ACK every response and record the markers.
async fn run_sotw(
    channel: Channel,
    stream: usize,
    variants: usize,
    shared: Arc<Shared>,
    slot: OwnedSemaphorePermit,
) {
    let result: anyhow::Result<()> = async {
        let (tx, rx) = mpsc::channel(8);
        tx.send(DiscoveryRequest {
            type_url: CLUSTER.into(),
            node: Some(node(stream, variants)),
            ..Default::default()
        })
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
            shared.seen[stream]
                .held
                .store(resources.len(), Ordering::Release);
            shared.observe(stream, resources.iter().map(|any| any.value.as_slice()));
            tx.send(DiscoveryRequest {
                type_url,
                version_info,
                response_nonce: nonce,
                ..Default::default()
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

/// One Delta ADS stream: CDS by wildcard, or by one locator per cluster.
async fn run_delta(
    channel: Channel,
    stream: usize,
    kind: Kind,
    args: (usize, usize),
    shared: Arc<Shared>,
    slot: OwnedSemaphorePermit,
) {
    let (clusters, variants) = args;
    let result: anyhow::Result<()> = async {
        let (tx, rx) = mpsc::channel(8);
        let mut first = DeltaDiscoveryRequest {
            type_url: CLUSTER.into(),
            node: Some(node(stream, variants)),
            ..Default::default()
        };
        if kind == Kind::DeltaLocators {
            first.resource_locators_subscribe = (0..clusters)
                .map(|i| ResourceLocator {
                    name: format!("c{i}"),
                    dynamic_parameters: [("shard".to_owned(), shard(stream, variants))].into(),
                })
                .collect();
        } // else an empty first subscription: the legacy wildcard, as Envoy sends for CDS
        tx.send(first).await?;
        let mut responses = AggregatedDiscoveryServiceClient::new(channel)
            .delta_aggregated_resources(ReceiverStream::new(rx))
            .await?
            .into_inner();
        let mut slot = Some(slot);
        let mut held: HashSet<String> = HashSet::new();
        while let Some(response) = responses.message().await? {
            let DeltaDiscoveryResponse {
                type_url,
                nonce,
                resources,
                removed_resources,
                removed_resource_names,
                ..
            } = response;
            // Removals first: a variant swapped for another is removed and added in one.
            for name in &removed_resources {
                held.remove(name);
            }
            for named in &removed_resource_names {
                held.remove(&named.name);
            }
            // A locator's variant is named by `resource_name` (name and constraints).
            for resource in &resources {
                match &resource.resource_name {
                    Some(named) => held.insert(named.name.clone()),
                    None => held.insert(resource.name.clone()),
                };
            }
            shared.seen[stream]
                .held
                .store(held.len(), Ordering::Release);
            let bodies = resources
                .iter()
                .filter_map(|r| r.resource.as_ref())
                .map(|any| any.value.as_slice());
            shared.observe(stream, bodies);
            tx.send(DeltaDiscoveryRequest {
                type_url,
                response_nonce: nonce,
                ..Default::default()
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

/// The servers under load.
struct Targets {
    /// The admin API that takes the writes (the first replica's).
    admin: String,
    xds: Vec<String>,
    pids: Vec<u32>,
    /// The Postgres database, for its statistics.
    database: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(against) = &args.against {
        return compare::run(against, args.runs);
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    raise_open_file_limit(args.streams);
    if let Some(admin) = &args.admin_url {
        if args.xds_url.len() != args.server_pid.len() {
            bail!("--xds-url and --server-pid need one entry per server");
        }
        if args.pin {
            for pid in &args.server_pid {
                pin(*pid, "0")?;
            }
            pin(std::process::id(), "1")?;
        }
        let targets = Targets {
            admin: admin.clone(),
            xds: args.xds_url.clone(),
            pids: args.server_pid.clone(),
            database: None,
        };
        return run(&args, &targets).await;
    }
    // By default the vxds built beside this example (same target folder and profile).
    let beside = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|profile| profile.join("vxds"));
    let binary = args
        .vxds
        .clone()
        .or(beside)
        .context("no vxds binary: give --vxds")?;
    let dir = tempfile::tempdir()?;
    let postgres = if args.replicas > 1 || args.postgres {
        Some(TestDb::fresh(Db::Postgres).await)
    } else {
        None
    };
    let serve_args: Vec<&str> = args.serve_arg.iter().map(String::as_str).collect();
    if args.pin {
        // The servers inherit core 0 from this process as they start.
        pin(std::process::id(), "0")?;
    }
    let mut servers = Vec::new();
    for replica in 0..args.replicas.max(1) {
        let replica_dir = dir.path().join(format!("replica-{replica}"));
        std::fs::create_dir_all(&replica_dir)?;
        let started = match &postgres {
            Some(db) => {
                ServeProcess::start_on(&binary, &replica_dir, &db.url, "127.0.0.1:0", &serve_args)
            }
            None => ServeProcess::start(&binary, &replica_dir, &serve_args),
        };
        servers.push(started.with_context(|| {
            format!(
                "starting {} (build it: cargo build --release -p vxds --bin vxds)",
                binary.display()
            )
        })?);
    }
    if args.pin {
        pin(std::process::id(), "1")?;
        println!("pinned: servers on core 0, the load generator on core 1");
    }
    let targets = Targets {
        admin: servers[0].admin_url.clone(),
        xds: servers
            .iter()
            .map(|s| format!("http://{}", s.xds_addr))
            .collect(),
        pids: servers.iter().map(|s| s.child.id()).collect(),
        database: postgres.as_ref().map(|db| db.url.clone()),
    };
    let result = run(&args, &targets).await;
    drop(servers);
    if let Some(db) = postgres {
        db.remove().await;
    }
    result
}

/// Puts every thread of process `pid` on `cores` (`taskset -a -p -c`).
fn pin(pid: u32, cores: &str) -> anyhow::Result<()> {
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cores, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .context("running taskset (util-linux) for --pin")?;
    if !status.success() {
        bail!("taskset -a -p -c {cores} {pid}: {status}");
    }
    Ok(())
}

/// Runs `--rounds-hook` with `ROUNDS=phase`, waiting for it.
fn rounds_hook(args: &Args, targets: &Targets, phase: &str) -> anyhow::Result<()> {
    let Some(hook) = &args.rounds_hook else {
        return Ok(());
    };
    let pids: Vec<String> = targets.pids.iter().map(u32::to_string).collect();
    let status = std::process::Command::new("sh")
        .args(["-c", hook])
        .env("ROUNDS", phase)
        .env("SERVER_PID", pids.join(","))
        .status()
        .context("running --rounds-hook")?;
    if !status.success() {
        bail!("--rounds-hook ({phase}): {status}");
    }
    Ok(())
}

/// The database's committed transactions and rows read so far (`pg_stat_database`).
async fn database_activity(url: &str) -> anyhow::Result<(i64, i64)> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(url).await?;
    let row: (i64, i64) = sqlx::query_as(
        "SELECT xact_commit, tup_returned + tup_fetched FROM pg_stat_database \
         WHERE datname = current_database()",
    )
    .fetch_one(&mut conn)
    .await?;
    conn.close().await?;
    Ok(row)
}

/// Whether stream `stream` subscribes by SotW, Delta wildcard or Delta locators.
fn kind_of(args: &Args, stream: usize) -> Kind {
    let delta_index = match args.protocol {
        Protocol::Sotw => return Kind::Sotw,
        Protocol::Delta => stream,
        Protocol::Mixed if stream.is_multiple_of(2) => return Kind::Sotw,
        Protocol::Mixed => stream / 2,
    };
    // Spread evenly: the k-th Delta stream uses locators when the running share steps up.
    let share = args.locators.clamp(0.0, 1.0);
    let before = (delta_index as f64 * share).floor();
    let after = ((delta_index + 1) as f64 * share).floor();
    if after > before {
        Kind::DeltaLocators
    } else {
        Kind::Delta
    }
}

async fn run(args: &Args, targets: &Targets) -> anyhow::Result<()> {
    let admin = &targets.admin;
    let client = reqwest::Client::new();
    let ops: Vec<Value> = (0..args.clusters)
        .map(|i| {
            let name = format!("c{i}");
            json!({"op": "put", "type": "cluster", "name": name,
                   "variants": cluster_variants(&name, args.variants, 0)})
        })
        .collect();
    let seeded = client
        .post(format!("{admin}/v1/changesets"))
        .json(&json!({"operations": ops}))
        .send()
        .await?;
    if !seeded.status().is_success() {
        bail!("seeding: {}", seeded.text().await?);
    }
    let (idle_rss, cpu) = servers_usage(&targets.pids)?;
    let kinds: Vec<Kind> = (0..args.streams).map(|i| kind_of(args, i)).collect();
    let count = |k: Kind| kinds.iter().filter(|x| **x == k).count();
    println!(
        "{} replica(s) idle, seeded: RSS {} MiB, CPU {cpu:.2} s",
        targets.pids.len(),
        idle_rss
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(" + "),
    );
    println!(
        "{} streams ({} SotW wildcard, {} Delta wildcard, {} Delta with {} locators each), {} clusters × {} variants",
        args.streams,
        count(Kind::Sotw),
        count(Kind::Delta),
        count(Kind::DeltaLocators),
        args.clusters,
        args.clusters,
        args.variants,
    );

    let shared = Arc::new(Shared {
        start: Instant::now(),
        seen: (0..args.streams)
            .map(|_| Seen {
                round: AtomicU64::new(u64::MAX),
                at: AtomicU64::new(0),
                held: AtomicUsize::new(0),
            })
            .collect(),
        clusters: args.clusters,
        failed: AtomicUsize::new(0),
        finished: AtomicBool::new(false),
    });
    let mut endpoints = Vec::new();
    for xds in &targets.xds {
        endpoints
            .push(Endpoint::from_shared(xds.clone())?.connect_timeout(Duration::from_secs(10)));
    }
    // The streams of one connection are consecutive; consecutive connections go to different
    // replicas first, then to other source addresses.
    let per_connection = usize::from(args.streams_per_connection);
    let replica_of = |stream: usize| (stream / per_connection) % endpoints.len();
    // Connecting streams wait for a slot; a stream frees its slot once it holds its config.
    let slots = Arc::new(Semaphore::new(args.connect_concurrency));
    let connect_started = Instant::now();
    let mut connection: Option<Channel> = None;
    for (stream, kind) in kinds.iter().copied().enumerate() {
        let slot = slots.clone().acquire_owned().await?;
        let channel = match &connection {
            Some(shared) if stream % per_connection != 0 => shared.clone(),
            _ => {
                let mut endpoint = endpoints[replica_of(stream)].clone();
                if !args.local_addrs.is_empty() {
                    let nth = stream / per_connection;
                    let source = (nth / endpoints.len()) % args.local_addrs.len();
                    endpoint = endpoint.local_address(Some(args.local_addrs[source]));
                }
                // One HTTP/2 connection, made by its first stream, that its streams share.
                let channel = endpoint.connect_lazy();
                connection = Some(channel.clone());
                channel
            }
        };
        let shared = shared.clone();
        match kind {
            Kind::Sotw => {
                tokio::spawn(run_sotw(channel, stream, args.variants, shared, slot));
            }
            Kind::Delta | Kind::DeltaLocators => {
                let shape = (args.clusters, args.variants);
                tokio::spawn(run_delta(channel, stream, kind, shape, shared, slot));
            }
        }
    }
    wait_until("initial configuration", Duration::from_secs(600), || {
        let have = (0..args.streams).filter(|s| shared.configured(*s)).count();
        (have, args.streams, shared.failed.load(Ordering::Relaxed))
    })
    .await?;
    let connect_time = connect_started.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await; // let ACKs settle before measuring memory
    let (rss_connected, cpu_connected) = servers_usage(&targets.pids)?;
    let over_idle: f64 = rss_connected
        .iter()
        .zip(&idle_rss)
        .map(|(now, idle)| now - idle)
        .sum();
    let per_stream_kib = over_idle * 1024.0 / args.streams as f64;
    println!(
        "all {} streams ({} connections) connected and configured in {:.2} s; server RSS {} MiB ({per_stream_kib:.1} KiB per stream over idle), CPU {cpu_connected:.2} s",
        args.streams,
        args.streams.div_ceil(per_connection),
        connect_time.as_secs_f64(),
        rss_connected
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(" + "),
    );

    println!(
        "\n| round | admin PUT | p50 | p99 | max (all streams have it) | slowest replica's p99 | servers' CPU | load generator CPU |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    // The database's background activity (each replica's head poll, the probes), measured
    // over an idle stretch, so that what a revision costs can be told apart from it.
    let settle = Duration::from_secs(11);
    let database = targets.database.as_ref().filter(|_| args.database_stats);
    let idle_rate = match database {
        Some(url) => {
            let idle = Duration::from_secs(3 + 2 * args.rounds as u64);
            tokio::time::sleep(settle).await;
            let (xacts, rows) = database_activity(url).await?;
            tokio::time::sleep(idle).await;
            let idle = idle + settle; // the second reading's own wait is idle too
            tokio::time::sleep(settle).await;
            let (xacts_after, rows_after) = database_activity(url).await?;
            let seconds = idle.as_secs_f64();
            Some((
                (xacts_after - xacts) as f64 / seconds,
                (rows_after - rows) as f64 / seconds,
            ))
        }
        None => None,
    };
    let database_before = match database {
        Some(url) => Some((database_activity(url).await?, Instant::now())),
        None => None,
    };
    let mut all_latencies = Vec::new();
    let mut round_p99s = Vec::new();
    rounds_hook(args, targets, "start")?;
    for round in 1..=args.rounds as u64 {
        let (_, cpu_before) = servers_usage(&targets.pids)?;
        let (_, _, own_before) = process_usage(std::process::id())?;
        let sent = shared.now();
        let put_time = put(
            &client,
            format!("{admin}/v1/resources/cluster/{MARKED}"),
            json!({"variants": cluster_variants(MARKED, args.variants, round)}),
        )
        .await?;
        wait_until(&format!("round {round}"), Duration::from_secs(120), || {
            let have = shared
                .seen
                .iter()
                .filter(|s| s.round.load(Ordering::Acquire) == round)
                .count();
            (have, args.streams, shared.failed.load(Ordering::Relaxed))
        })
        .await?;
        let (_, cpu_after) = servers_usage(&targets.pids)?;
        let (_, _, own_after) = process_usage(std::process::id())?;
        let latency = |s: &Seen| s.at.load(Ordering::Relaxed).saturating_sub(sent) as f64 / 1e6;
        let mut latencies: Vec<f64> = shared.seen.iter().map(latency).collect();
        latencies.sort_by(f64::total_cmp);
        let slowest_replica = (0..endpoints.len())
            .map(|replica| {
                let mut of_replica: Vec<f64> = (0..args.streams)
                    .filter(|s| replica_of(*s) == replica)
                    .map(|s| latency(&shared.seen[s]))
                    .collect();
                of_replica.sort_by(f64::total_cmp);
                percentile(&of_replica, 99.0)
            })
            .fold(f64::NAN, f64::max);
        let p99 = percentile(&latencies, 99.0);
        round_p99s.push(p99);
        println!(
            "| {round} | {:.1} ms | {:.1} ms | {p99:.1} ms | {:.1} ms | {slowest_replica:.1} ms | {:.2} s | {:.2} s |",
            put_time.as_secs_f64() * 1e3,
            percentile(&latencies, 50.0),
            percentile(&latencies, 100.0),
            cpu_after - cpu_before,
            own_after - own_before,
        );
        all_latencies.extend(latencies);
        tokio::time::sleep(Duration::from_millis(500)).await; // ACKs in before the next change
    }
    rounds_hook(args, targets, "end")?;
    if let (Some(url), Some(((xacts, rows), since)), Some((idle_xacts, idle_rows))) =
        (database, database_before, idle_rate)
    {
        tokio::time::sleep(settle).await;
        let (xacts_after, rows_after) = database_activity(url).await?;
        let seconds = since.elapsed().as_secs_f64();
        let rounds = args.rounds.max(1) as f64;
        let per_revision = |total: i64, idle: f64| (total as f64 - idle * seconds) / rounds;
        println!(
            "\nPostgres per revision, {} replica(s), background subtracted ({idle_xacts:.1} transactions and {idle_rows:.0} rows read per second when idle): {:.1} transactions, {:.0} rows read",
            targets.pids.len(),
            per_revision(xacts_after - xacts, idle_xacts),
            per_revision(rows_after - rows, idle_rows),
        );
    }
    all_latencies.sort_by(f64::total_cmp);
    round_p99s.sort_by(f64::total_cmp);
    let (rss_end, cpu_end) = servers_usage(&targets.pids)?;
    let (p50, p99, max) = (
        percentile(&all_latencies, 50.0),
        percentile(&all_latencies, 99.0),
        percentile(&all_latencies, 100.0),
    );
    println!(
        "\nall rounds: p50 {p50:.1} ms, p99 {p99:.1} ms, max {max:.1} ms from the admin request to the stream; server RSS {:.1} MiB in all, CPU {cpu_end:.2} s in all",
        rss_end.iter().sum::<f64>(),
    );
    println!(
        "RESULT streams={} connections={} replicas={} sync_s={:.3} kib_per_stream={per_stream_kib:.1} p50_ms={p50:.1} p99_ms={p99:.1} max_ms={max:.1} median_round_p99_ms={:.1} server_cpu_s={cpu_end:.2}",
        args.streams,
        args.streams.div_ceil(per_connection),
        targets.pids.len(),
        connect_time.as_secs_f64(),
        percentile(&round_p99s, 50.0),
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
