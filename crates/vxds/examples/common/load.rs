//! What the load examples (`xds_load`, `soak`, `month`) share: the clients' node and shard,
//! the admin API's PUT, the servers' resource use read from /proc, and percentiles.
//!
//! Each example includes this file as a module (`#[path = "common/load.rs"] mod load;`);
//! an example that does not use every item would warn about it, hence the `allow`.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::Value;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::xds::core::v3::ContextParams;

pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

/// The shard of stream `stream`: `s0`, `s1`, ... round-robin over `variants`.
pub fn shard(stream: usize, variants: usize) -> String {
    format!("s{}", stream % variants.max(1))
}

/// Stream `stream`'s node: id `load-N`, its shard in CDS's `dynamic_parameters`.
pub fn node(stream: usize, variants: usize) -> Node {
    let mut node = Node {
        id: format!("load-{stream}"),
        user_agent_name: "vxds-load".into(),
        ..Default::default()
    };
    let params = [("shard".to_owned(), shard(stream, variants))]
        .into_iter()
        .collect();
    node.dynamic_parameters
        .insert(CLUSTER.into(), ContextParams { params });
    node
}

/// Resident and peak memory (MiB) and CPU seconds of a process, from /proc.
pub fn process_usage(pid: u32) -> anyhow::Result<(f64, f64, f64)> {
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

/// A process's resident memory split as /proc/PID/status splits it, in MiB: anonymous pages
/// (the heap, stacks: what a leak grows) and file-backed pages (the binary's code and data as
/// they are first touched, which only ever grows to the binary's size).
pub fn resident_split(pid: u32) -> anyhow::Result<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mib = |field: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(f64::NAN, |kib| kib / 1024.0)
    };
    Ok((mib("RssAnon:"), mib("RssFile:")))
}

/// The process's open file descriptors (entries of /proc/PID/fd).
pub fn open_files(pid: u32) -> anyhow::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// RSS (MiB) of each server and CPU (s) summed over them.
pub fn servers_usage(pids: &[u32]) -> anyhow::Result<(Vec<f64>, f64)> {
    let mut rss = Vec::new();
    let mut cpu = 0.0;
    for pid in pids {
        let (r, _, c) = process_usage(*pid)?;
        rss.push(r);
        cpu += c;
    }
    Ok((rss, cpu))
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The middle value (the mean of the two middle ones for an even count); NaN for none.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[mid],
        _ => (values[mid - 1] + values[mid]) / 2.0,
    }
}

/// PUTs `body` to the admin API; an error unless it answers 2xx. Returns the time it took.
pub async fn put(client: &reqwest::Client, url: String, body: Value) -> anyhow::Result<Duration> {
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

/// Raises this process's open-file limit to what the streams need (each is a socket here and
/// one in a server, which inherits the limit): the soft limit to the hard one, and — where the
/// process may (root, `CAP_SYS_RESOURCE`) — the hard one too.
pub fn raise_open_file_limit(streams: usize) {
    use rlimit::Resource;
    let want = u64::try_from(streams).unwrap_or(u64::MAX / 2) + 4096;
    let (soft, hard) = Resource::NOFILE.get().unwrap_or((1024, 1024));
    if hard < want && Resource::NOFILE.set(want, want).is_ok() {
        println!("open-file limit raised from {soft}/{hard} to {want}/{want}");
        return;
    }
    match rlimit::increase_nofile_limit(want) {
        Ok(limit) if limit < want => println!(
            "open-file limit {limit} (hard limit {hard}): fewer than the {want} these streams need"
        ),
        Ok(_) => {}
        Err(e) => println!("could not raise the open-file limit: {e}"),
    }
}
