//! A soak run (issue 25): two `vxds serve` replicas on one fresh Postgres database under
//! steady churn for `--duration` (default an hour), watching for slow leaks.
//!
//! - `--streams` ADS streams (default 2,000), spread over both replicas, one TCP connection
//!   each, in five shapes taken in turn: SotW wildcard, SotW by name, Delta wildcard, Delta by
//!   name (the shard in `node.dynamic_parameters`) and Delta by locators (one per cluster,
//!   the shard as its parameter). Every other stream reconnects every 2–6 s (a new
//!   connection); the others stay. Every stream ACKs what it receives and keeps the
//!   clusters it holds.
//! - One write a second through replica 0's admin API: a cluster's variants rewritten
//!   (its connect timeout carries the write's number) with one shard's variant left out in
//!   turn, so that clients see their variant added, changed and removed.
//! - `--event-readers` `GET /v1/events` readers (default 20) over both replicas, one in four
//!   never reading (it reopens every 5 minutes); the others read and resume with
//!   `Last-Event-ID` when the stream ends.
//! - Replica 1 restarted (SIGTERM, then started again on its xDS address) half-way.
//!
//! The servers run with a small `--index-history-bytes` (128 KiB), full within the warm-up, so
//! that a bounded cache still filling is not read as a leak.
//!
//! Every `--report-every` it prints each replica's RSS, heap (`vxds_heap_allocated_bytes` from
//! its `/metrics`: what the server holds, which a leak grows, unlike the allocator's retained
//! pages), open files (/proc/PID/fd) and CPU and the errors so far. At the end it stops writing
//! and churning, reads the head's state (`POST /v1/resolve` for every cluster and shard, on
//! both replicas), checks that every stream holds exactly that, and prints the slope of RSS,
//! heap and open files per hour after `--warm-up` (fitted by least squares, as a share of the
//! mean), per replica process (the restarted replica's second process counts from its own
//! start). It exits non-zero on any error, a stream that did not converge, or a slope above
//! 2 % per hour (a falling slope, memory given back, is not growth).
//!
//! ```sh
//! cargo build --release -p vxds --example soak --bin vxds
//! ./target/release/examples/soak --duration 60m          # the hour
//! ./target/release/examples/soak --duration 2m --warm-up 30s --report-every 30s
//! ```
//!
//! Errors are: a stream or event stream that ends or fails other than around the restart of
//! its replica (kill to 20 s after the new process listens), a failed write, a failed
//! resolve, and `ERROR` lines in a server's log. Results are written down in
//! docs/benchmarks.md.
//!
//! Here: the arguments, the state the run's tasks share, and the run. The ADS streams are in
//! `soak/streams.rs`, the writer, event readers and head check in `soak/admin.rs`, the samples
//! and slopes in `soak/samples.rs`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use vxds_testkit::serve::ServeProcess;
use vxds_testkit::{Db, TestDb};

#[path = "common/load.rs"]
mod load;
// The soak's own modules, found by path as `common/load.rs` is.
#[path = "soak/admin.rs"]
mod admin;
#[path = "soak/samples.rs"]
mod samples;
#[path = "soak/streams.rs"]
mod streams;
use admin::{cluster_variants, head_state, run_reader, run_writer};
use load::{open_files, process_usage, raise_open_file_limit, resident_split, shard};
use samples::{Process, Sample, heap_figures, slope_per_hour};
use streams::{KINDS, Kind, run_stream};

#[derive(Parser)]
#[command(about = "A soak run: two replicas on Postgres under churn, watching for leaks")]
struct Args {
    /// How long to churn (`60m`, `2m`, `90s`).
    #[arg(long, default_value = "60m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Samples before this are left out of the slopes (each replica process counts from its
    /// own start).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    warm_up: Duration,
    /// Print a report line this often.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    report_every: Duration,
    /// ADS streams in all.
    #[arg(long, default_value_t = 2_000)]
    streams: usize,
    /// `GET /v1/events` readers in all; one in four never reads.
    #[arg(long, default_value_t = 20)]
    event_readers: usize,
    /// Clusters.
    #[arg(long, default_value_t = 10)]
    clusters: usize,
    /// Shards (`s0`, ...): each cluster has a variant per shard.
    #[arg(long, default_value_t = 4)]
    variants: usize,
    /// Restart replica 1 half-way (`--no-restart` to keep it).
    #[arg(long)]
    no_restart: bool,
    /// The servers' `--index-history-bytes`. The index keeps recent change lists up to this
    /// bound (16 MiB by default: about 18 hours of this soak's one-name revisions), so with the
    /// default the hour would measure a bounded cache filling (~0.9 MiB/h), not a leak. The
    /// soak's bound fills within the warm-up; pass 16777216 to see the default's filling.
    #[arg(long, default_value_t = 128 << 10)]
    index_history_bytes: usize,
    /// The vxds binary (default: the one built beside this example, same profile).
    #[arg(long)]
    vxds: Option<PathBuf>,
    /// Where the servers' logs go (default: a temporary directory, removed at the end).
    #[arg(long)]
    log_dir: Option<PathBuf>,
}

/// One replica as the streams see it.
struct Replica {
    xds: String,
    admin: RwLock<String>,
    pid: AtomicU64,
    /// Errors on this replica's streams are expected until this (ms since the start); set
    /// when its restart begins, and moved to 20 s after the new process listens.
    restart_until_ms: AtomicU64,
}

struct Shared {
    start: Instant,
    replicas: Vec<Replica>,
    args_variants: usize,
    clusters: usize,
    /// Each stream's clusters: name → the write number its connect timeout carries.
    held: Vec<Mutex<HashMap<String, u64>>>,
    /// Whether the stream currently has a session that has received a response.
    live: Vec<AtomicBool>,
    /// Set at the end: reconnecting streams stop churning.
    settling: AtomicBool,
    /// Set once the figures are taken: the servers stop, and streams end with them.
    finished: AtomicBool,
    errors: AtomicUsize,
    restart_disconnects: AtomicUsize,
    /// Streams the server ended because their connection reached its maximum age
    /// (`--xds-max-connection-age`, 1 h ± 10 %): asked to reconnect, as designed.
    max_age_reconnects: AtomicUsize,
    sessions: AtomicU64,
    responses: AtomicU64,
    writes: AtomicU64,
    event_bytes: AtomicU64,
    event_reopens: AtomicU64,
    slow_reader_resets: AtomicU64,
}

impl Shared {
    fn ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn restarting(&self, replica: usize) -> bool {
        self.ms()
            <= self.replicas[replica]
                .restart_until_ms
                .load(Ordering::Acquire)
    }

    /// Counts the end of a stream or event stream: expected around its replica's restart,
    /// else an error (the first 30 printed).
    fn ended(&self, replica: usize, what: &str, why: &str) {
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        if self.restarting(replica) {
            self.restart_disconnects.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let n = self.errors.fetch_add(1, Ordering::Relaxed);
        if n < 30 {
            println!(
                "[{:>7.1} s] ERROR {what} on replica {replica}: {why}",
                self.start.elapsed().as_secs_f64()
            );
        }
    }

    fn error(&self, what: &str) {
        if self.finished.load(Ordering::Acquire) {
            return;
        }
        let n = self.errors.fetch_add(1, Ordering::Relaxed);
        if n < 30 {
            println!(
                "[{:>7.1} s] ERROR {what}",
                self.start.elapsed().as_secs_f64()
            );
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    raise_open_file_limit(args.streams + args.event_readers);
    let beside = std::env::current_exe()?
        .parent()
        .and_then(|examples| examples.parent())
        .map(|profile| profile.join("vxds"));
    let binary = args
        .vxds
        .clone()
        .or(beside)
        .context("no vxds binary: give --vxds")?;
    let temp = tempfile::tempdir()?;
    let log_dir = args
        .log_dir
        .clone()
        .unwrap_or_else(|| temp.path().to_owned());
    let db = TestDb::fresh(Db::Postgres).await;
    let result = soak(&args, &binary, &log_dir, &db.url).await;
    db.remove().await;
    result
}

async fn soak(
    args: &Args,
    binary: &std::path::Path,
    log_dir: &std::path::Path,
    database: &str,
) -> anyhow::Result<()> {
    let history_bytes = args.index_history_bytes.to_string();
    let server_args = ["--index-history-bytes", history_bytes.as_str()];
    let mut servers = Vec::new();
    for replica in 0..2 {
        let dir = log_dir.join(format!("replica-{replica}"));
        std::fs::create_dir_all(&dir)?;
        servers.push(
            ServeProcess::start_on(binary, &dir, database, "127.0.0.1:0", &server_args)
                .with_context(|| format!("starting {}", binary.display()))?,
        );
    }
    let client = reqwest::Client::new();
    let admin0 = servers[0].admin_url.clone();
    let ops: Vec<Value> = (0..args.clusters)
        .map(|i| {
            let name = format!("c{i}");
            // Write 0 leaves out shard 0: start with every shard instead.
            let all = cluster_variants(&name, args.variants, args.variants as u64);
            let all: Vec<Value> = all
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| {
                    let mut v = v.clone();
                    v["resource"]["connect_timeout"] = json!("1s");
                    v
                })
                .collect();
            json!({"op": "put", "type": "cluster", "name": name, "variants": all})
        })
        .collect();
    let seeded = client
        .post(format!("{admin0}/v1/changesets"))
        .json(&json!({"operations": ops}))
        .send()
        .await?;
    if !seeded.status().is_success() {
        bail!("seeding: {}", seeded.text().await?);
    }

    let shared = Arc::new(Shared {
        start: Instant::now(),
        replicas: servers
            .iter()
            .map(|s| Replica {
                xds: format!("http://{}", s.xds_addr),
                admin: RwLock::new(s.admin_url.clone()),
                pid: AtomicU64::new(u64::from(s.child.id())),
                restart_until_ms: AtomicU64::new(0),
            })
            .collect(),
        args_variants: args.variants,
        clusters: args.clusters,
        held: (0..args.streams)
            .map(|_| Mutex::new(HashMap::new()))
            .collect(),
        live: (0..args.streams).map(|_| AtomicBool::new(false)).collect(),
        settling: AtomicBool::new(false),
        finished: AtomicBool::new(false),
        errors: AtomicUsize::new(0),
        restart_disconnects: AtomicUsize::new(0),
        max_age_reconnects: AtomicUsize::new(0),
        sessions: AtomicU64::new(0),
        responses: AtomicU64::new(0),
        writes: AtomicU64::new(0),
        event_bytes: AtomicU64::new(0),
        event_reopens: AtomicU64::new(0),
        slow_reader_resets: AtomicU64::new(0),
    });
    // Shard i % variants (as `node` gives it), churn, replica and shape independent of it.
    let churns = |i: usize| (i / 4) % 2 == 1;
    let replica_of = |i: usize| (i / 8) % 2;
    let kinds: Vec<Kind> = (0..args.streams)
        .map(|i| KINDS[(i / 16) % KINDS.len()])
        .collect();
    println!(
        "soak: {} streams ({} reconnecting every 2-6 s; {} per shape: SotW wildcard/names, Delta wildcard/names/locators), {} clusters x {} shards, 1 write/s, {} event readers ({} never reading), 2 replicas on Postgres, replica 1 restarted at {:?}; duration {:?}, warm-up {:?}",
        args.streams,
        (0..args.streams).filter(|i| churns(*i)).count(),
        args.streams / KINDS.len(),
        args.clusters,
        args.variants,
        args.event_readers,
        args.event_readers.div_ceil(4),
        if args.no_restart {
            None
        } else {
            Some(args.duration / 2)
        },
        args.duration,
        args.warm_up,
    );
    println!(
        "memory: RSS (VmRSS = RssAnon + RssFile) and heap (vxds_heap_allocated_bytes: what the server holds; resident: what jemalloc keeps)"
    );
    // Connect at most ~200 streams a second, as a fleet coming up would.
    for (stream, kind) in kinds.iter().copied().enumerate() {
        let (churn, replica) = (churns(stream), replica_of(stream));
        tokio::spawn(run_stream(stream, kind, churn, replica, shared.clone()));
        if stream % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    for reader in 0..args.event_readers {
        // Readers 0, 4, 8, ... never read; both kinds alternate between the replicas.
        let (replica, never_reads) = ((reader / 4) % 2, reader % 4 == 0);
        tokio::spawn(run_reader(reader, replica, never_reads, shared.clone()));
    }
    let stop_writes = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(run_writer(
        args.clusters,
        args.variants,
        shared.clone(),
        stop_writes.clone(),
    ));

    let mut processes: Vec<Process> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| Process {
            label: format!("replica {i}"),
            pid: s.child.id(),
            started_s: 0.0,
            samples: Vec::new(),
        })
        .collect();
    let own_pid = std::process::id();
    let sample_every = Duration::from_secs(10).min(args.report_every);
    let mut next_report = args.report_every;
    let mut restarted = args.no_restart;
    // The restart's window in the servers' log timestamps (RFC 3339, UTC: they sort as text).
    let mut restart_window: Option<(String, String)> = None;
    let log_time = |at: std::time::SystemTime| humantime::format_rfc3339_micros(at).to_string();
    println!(
        "\n| min | replica 0 RSS (anon + file) MiB | heap MiB | resident MiB | fds | CPU s | replica 1 RSS (anon + file) MiB | heap MiB | resident MiB | fds | CPU s | streams live | sessions | writes | event MiB | errors | restart disconnects | load gen RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut tick = tokio::time::interval(sample_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let elapsed = shared.start.elapsed();
        let at_s = elapsed.as_secs_f64();
        let mut line = Vec::new();
        for replica in 0..2 {
            let pid = u32::try_from(shared.replicas[replica].pid.load(Ordering::Acquire))?;
            let process = processes
                .iter_mut()
                .rev()
                .find(|p| p.pid == pid)
                .context("a sampled process")?;
            let (rss_mib, _, cpu) = process_usage(pid)?;
            let (anon_mib, file_mib) = resident_split(pid)?;
            let fds = open_files(pid)? as f64;
            let admin = shared.replicas[replica]
                .admin
                .read()
                .expect("admin")
                .clone();
            let (heap_mib, resident_mib) = heap_figures(&client, &admin).await;
            process.samples.push(Sample {
                at_s,
                rss_mib,
                anon_mib,
                file_mib,
                fds,
                heap_mib,
                resident_mib,
            });
            let show = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
            line.push(format!(
                "{rss_mib:.1} ({anon_mib:.1} + {file_mib:.1}) | {} | {} | {fds:.0} | {cpu:.1}",
                show(heap_mib),
                show(resident_mib)
            ));
        }
        if elapsed >= next_report || elapsed >= args.duration {
            next_report += args.report_every;
            let live = shared
                .live
                .iter()
                .filter(|l| l.load(Ordering::Acquire))
                .count();
            let (own_rss, _, _) = process_usage(own_pid)?;
            println!(
                "| {:.1} | {} | {live} | {} | {} | {:.1} | {} | {} | {own_rss:.1} |",
                at_s / 60.0,
                line.join(" | "),
                shared.sessions.load(Ordering::Relaxed),
                shared.writes.load(Ordering::Relaxed),
                shared.event_bytes.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
                shared.errors.load(Ordering::Relaxed),
                shared.restart_disconnects.load(Ordering::Relaxed),
            );
        }
        if elapsed >= args.duration {
            break;
        }
        if !restarted && elapsed >= args.duration / 2 {
            restarted = true;
            let replica = &shared.replicas[1];
            replica.restart_until_ms.store(u64::MAX, Ordering::Release);
            let window_start = log_time(std::time::SystemTime::now());
            let old = &mut servers[1];
            let pid = old.child.id();
            let addr = old.xds_addr.to_string();
            let killed = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()?;
            anyhow::ensure!(killed.success(), "kill -TERM {pid}");
            let stopped = Instant::now();
            let status = loop {
                if let Some(status) = old.child.try_wait()? {
                    break status;
                }
                if stopped.elapsed() > Duration::from_secs(60) {
                    let _ = old.child.kill();
                    break old.child.wait()?;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let down = stopped.elapsed();
            let dir = log_dir.join("replica-1");
            let new = ServeProcess::start_on(binary, &dir, database, &addr, &server_args)
                .context("restarting replica 1")?;
            println!(
                "[{at_s:>7.1} s] replica 1 (pid {pid}) stopped by SIGTERM in {:.2} s ({status}); started again as pid {} in {:.2} s on {addr}",
                down.as_secs_f64(),
                new.child.id(),
                stopped.elapsed().as_secs_f64() - down.as_secs_f64(),
            );
            *replica.admin.write().expect("admin") = new.admin_url.clone();
            replica
                .pid
                .store(u64::from(new.child.id()), Ordering::Release);
            processes.push(Process {
                label: "replica 1 after restart".into(),
                pid: new.child.id(),
                started_s: shared.start.elapsed().as_secs_f64(),
                samples: Vec::new(),
            });
            servers[1] = new; // the old one is gone: dropping it kills nothing
            let window_end = std::time::SystemTime::now() + Duration::from_secs(20);
            restart_window = Some((window_start, log_time(window_end)));
            replica
                .restart_until_ms
                .store(shared.ms() + 20_000, Ordering::Release);
        }
    }

    // The end: stop writing and churning, then check every stream against the head.
    stop_writes.store(true, Ordering::Release);
    writer.await?;
    shared.settling.store(true, Ordering::Release);
    let head = head_state(&client, &shared, args).await?;
    let settle_started = Instant::now();
    let mut not_converged: Vec<usize>;
    loop {
        not_converged = (0..args.streams)
            .filter(|s| {
                let shard = shard(*s, args.variants);
                !shared.live[*s].load(Ordering::Acquire)
                    || *shared.held[*s].lock().expect("held") != head[&shard]
            })
            .collect();
        if not_converged.is_empty() || settle_started.elapsed() > Duration::from_secs(120) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let converged = args.streams - not_converged.len();
    println!(
        "\nconverged: {converged} of {} streams hold the head's state ({} writes; checked {:.1} s after the last write and the end of churn)",
        args.streams,
        shared.writes.load(Ordering::Relaxed),
        settle_started.elapsed().as_secs_f64(),
    );
    for stream in not_converged.iter().take(10) {
        let shard = shard(*stream, args.variants);
        let held: BTreeMap<_, _> = shared.held[*stream]
            .lock()
            .expect("held")
            .clone()
            .into_iter()
            .collect();
        let want: BTreeMap<_, _> = head[&shard].clone().into_iter().collect();
        println!(
            "  stream {stream} ({:?}, {shard}, live {}): holds {held:?}, head {want:?}",
            kinds[*stream],
            shared.live[*stream].load(Ordering::Acquire)
        );
    }

    // Servers' own errors; those of the restarted replica while it drains and starts (its
    // listener closed: 503s) are the restart's.
    let mut log_errors = 0;
    let mut restart_log_errors = 0;
    for replica in 0..2 {
        let log = std::fs::read_to_string(log_dir.join(format!("replica-{replica}/vxds.log")))
            .unwrap_or_default();
        let (during, outside): (Vec<&str>, Vec<&str>) = log
            .lines()
            .filter(|l| l.contains(" ERROR "))
            .partition(|l| {
                let at = l.split_whitespace().next().unwrap_or_default();
                replica == 1
                    && restart_window
                        .as_ref()
                        .is_some_and(|(from, to)| from.as_str() <= at && at <= to.as_str())
            });
        for l in outside.iter().take(5) {
            println!("  replica {replica} log: {l}");
        }
        if let Some(l) = during.first() {
            println!(
                "  replica {replica} log, {} ERROR lines during its restart, e.g.: {l}",
                during.len()
            );
        }
        log_errors += outside.len();
        restart_log_errors += during.len();
    }

    println!(
        "\n| process | samples after warm-up | RSS first → last MiB | RSS slope | anonymous RSS first → last MiB | anonymous RSS slope | file RSS first → last MiB | heap first → last MiB | heap slope | resident first → last MiB | resident slope | open files first → last | open-files slope |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut flat = true;
    for process in &processes {
        let from = process.started_s + args.warm_up.as_secs_f64();
        let kept: Vec<&Sample> = process.samples.iter().filter(|s| s.at_s >= from).collect();
        let rss = slope_per_hour(&process.samples, from, |s| Some(s.rss_mib));
        let anon = slope_per_hour(&process.samples, from, |s| Some(s.anon_mib));
        let heap = slope_per_hour(&process.samples, from, |s| s.heap_mib);
        let resident = slope_per_hour(&process.samples, from, |s| s.resident_mib);
        let fds = slope_per_hour(&process.samples, from, |s| Some(s.fds));
        let mut pct = |slope: Option<(f64, f64, usize)>, unit: &str| match slope {
            Some((per_hour, mean, _)) => {
                let share = 100.0 * per_hour / mean;
                // Growth is what a leak does; memory given back (a negative slope) is not.
                if share > 2.0 {
                    flat = false;
                }
                format!("{per_hour:+.2} {unit}/h ({share:+.2} %/h)")
            }
            None => "too few samples".to_owned(),
        };
        let ends = |f: fn(&Sample) -> Option<f64>| {
            let mut values = kept.iter().filter_map(|s| f(s));
            let first = values.next();
            match (first, values.next_back().or(first)) {
                (Some(a), Some(b)) => format!("{a:.1} → {b:.1}"),
                _ => "-".to_owned(),
            }
        };
        let rss = pct(rss, "MiB");
        let anon = pct(anon, "MiB");
        let heap = pct(heap, "MiB");
        // Resident pages follow the allocator's retention, not the program: shown, not judged.
        let resident = match resident {
            Some((per_hour, mean, _)) => {
                format!("{per_hour:+.2} MiB/h ({:+.2} %/h)", 100.0 * per_hour / mean)
            }
            None => "too few samples".to_owned(),
        };
        let fds = pct(fds, "fds");
        println!(
            "| {} | {} | {} | {rss} | {} | {anon} | {} | {} | {heap} | {} | {resident} | {} | {fds} |",
            process.label,
            kept.len(),
            ends(|s| Some(s.rss_mib)),
            ends(|s| Some(s.anon_mib)),
            ends(|s| Some(s.file_mib)),
            ends(|s| s.heap_mib),
            ends(|s| s.resident_mib),
            ends(|s| Some(s.fds)),
        );
    }
    let errors = shared.errors.load(Ordering::Relaxed) + log_errors;
    println!(
        "\nRESULT duration_s={:.0} streams={} converged={converged} errors={} log_errors={log_errors} restart_log_errors={restart_log_errors} restart_disconnects={} max_age_reconnects={} sessions={} responses={} writes={} event_reopens={} slow_reader_resets={} flat={flat}",
        args.duration.as_secs_f64(),
        args.streams,
        shared.errors.load(Ordering::Relaxed),
        shared.restart_disconnects.load(Ordering::Relaxed),
        shared.max_age_reconnects.load(Ordering::Relaxed),
        shared.sessions.load(Ordering::Relaxed),
        shared.responses.load(Ordering::Relaxed),
        shared.writes.load(Ordering::Relaxed),
        shared.event_reopens.load(Ordering::Relaxed),
        shared.slow_reader_resets.load(Ordering::Relaxed),
    );
    shared.finished.store(true, Ordering::Release);
    drop(servers);
    if errors > 0 || converged < args.streams || !flat {
        bail!(
            "the soak failed: {errors} errors, {converged} of {} converged, flat: {flat}",
            args.streams
        );
    }
    Ok(())
}
