//! The soak's admin-API clients: the one writer (a cluster's variants rewritten each second),
//! the `GET /v1/events` readers, and the head's state read back through `POST /v1/resolve`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::load::{CLUSTER, put};
use super::streams::names;
use super::{Args, Shared};

/// Write `number`'s variants of `name`: one per shard, less shard `number % (variants + 1)`
/// (none left out when that is `variants`).
pub(crate) fn cluster_variants(name: &str, variants: usize, number: u64) -> Value {
    let left_out = usize::try_from(number).unwrap_or(0) % (variants + 1);
    let variants: Vec<Value> = (0..variants)
        .filter(|shard| *shard != left_out)
        .map(|shard| {
            json!({
                "constraints": format!("shard = \"s{shard}\""),
                "resource": {
                    "@type": CLUSTER,
                    "name": name, "type": "EDS", "connect_timeout": format!("{}s", number + 1),
                    "alt_stat_name": format!("{name}-s{shard}"),
                    "eds_cluster_config": {"eds_config": {"ads": {}}},
                },
            })
        })
        .collect();
    json!(variants)
}

/// An event-stream reader: reads everything and resumes with `Last-Event-ID`; or, when
/// `never_reads`, opens the stream, never reads it, and reopens it every 5 minutes.
pub(crate) async fn run_reader(
    reader: usize,
    replica: usize,
    never_reads: bool,
    shared: Arc<Shared>,
) {
    let client = reqwest::Client::new();
    let mut last_id: Option<String> = None;
    loop {
        let admin = shared.replicas[replica]
            .admin
            .read()
            .expect("admin")
            .clone();
        let mut request = client.get(format!("{admin}/v1/events"));
        if let Some(id) = &last_id {
            request = request.header("Last-Event-ID", id);
        }
        shared.event_reopens.fetch_add(1, Ordering::Relaxed);
        let mut response = match request.send().await {
            Ok(r) if r.status().is_success() => r,
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                shared.ended(
                    replica,
                    &format!("event reader {reader}"),
                    &format!("{status} {body}"),
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => {
                shared.ended(
                    replica,
                    &format!("event reader {reader}"),
                    &format!("{e:#}"),
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if never_reads {
            tokio::time::sleep(Duration::from_secs(300)).await;
            drop(response);
            continue;
        }
        let mut line = Vec::new();
        let mut reset = false;
        let why = loop {
            match response.chunk().await {
                Ok(Some(bytes)) => {
                    shared
                        .event_bytes
                        .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    for byte in bytes.iter().copied() {
                        if byte != b'\n' {
                            line.push(byte);
                            continue;
                        }
                        if let Some(id) = line.strip_prefix(b"id: ") {
                            last_id = Some(String::from_utf8_lossy(id).into_owned());
                        } else if line.starts_with(b"event: reset") {
                            reset = true;
                        }
                        line.clear();
                    }
                }
                Ok(None) => break "the server ended the event stream".to_owned(),
                Err(e) => break format!("{e:#}"),
            }
        };
        if reset && !shared.restarting(replica) {
            // A reset is the server's own word: a reader that reads should not lag 1 MiB.
            shared.slow_reader_resets.fetch_add(1, Ordering::Relaxed);
            shared.error(&format!(
                "event reader {reader} on replica {replica}: reset ({why})"
            ));
        } else {
            shared.ended(replica, &format!("event reader {reader}"), &why);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One writer: one write a second through replica 0 until `stop`.
pub(crate) async fn run_writer(
    args_clusters: usize,
    variants: usize,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) {
    let client = reqwest::Client::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut number = 0u64;
    while !stop.load(Ordering::Acquire) {
        tick.tick().await;
        number += 1;
        let name = format!("c{}", number as usize % args_clusters);
        let admin = shared.replicas[0].admin.read().expect("admin").clone();
        let result = put(
            &client,
            format!("{admin}/v1/resources/cluster/{name}"),
            json!({"variants": cluster_variants(&name, variants, number)}),
        )
        .await;
        match result {
            Ok(_) => {
                shared.writes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => shared.error(&format!("write {number} ({name}): {e:#}")),
        }
    }
}

/// The head's state for every shard: cluster → write number, from `POST /v1/resolve` on
/// both replicas (which must agree).
pub(crate) async fn head_state(
    client: &reqwest::Client,
    shared: &Shared,
    args: &Args,
) -> anyhow::Result<HashMap<String, HashMap<String, u64>>> {
    // Both replicas index the last write within a second or so; wait until they agree.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut states = Vec::new();
        for replica in &shared.replicas {
            let admin = replica.admin.read().expect("admin").clone();
            let mut state = HashMap::new();
            for s in 0..args.variants {
                let shard = format!("s{s}");
                let mut clusters = HashMap::new();
                for name in names(args.clusters) {
                    let answer: Value = client
                        .post(format!("{admin}/v1/resolve"))
                        .json(&json!({"type": "cluster", "name": name, "params": {"shard": shard}}))
                        .send()
                        .await?
                        .error_for_status()?
                        .json()
                        .await?;
                    if let Some(timeout) = answer["variant"]["resource"]["connect_timeout"].as_str()
                    {
                        let seconds: f64 = timeout
                            .trim_end_matches('s')
                            .parse()
                            .with_context(|| format!("connect_timeout {timeout}"))?;
                        clusters.insert(name, seconds as u64 - 1);
                    }
                }
                state.insert(shard, clusters);
            }
            states.push(state);
        }
        if states.windows(2).all(|w| w[0] == w[1]) {
            return Ok(states.swap_remove(0));
        }
        if Instant::now() > deadline {
            bail!("the replicas' heads disagree after 30 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
