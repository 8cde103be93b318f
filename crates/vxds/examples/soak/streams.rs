//! The soak's ADS streams: the five shapes a stream subscribes in, a session (subscribe, then
//! ACK and record what the client holds), and a stream for the whole run, reconnecting when it
//! churns.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::bail;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use vxds_envoy::pb::envoy::config::cluster::v3::Cluster;
use vxds_envoy::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use vxds_envoy::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    ResourceLocator,
};

use super::Shared;
use super::load::{CLUSTER, node, shard};

/// How one stream subscribes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    SotwWildcard,
    SotwNames,
    DeltaWildcard,
    DeltaNames,
    DeltaLocators,
}

pub(crate) const KINDS: [Kind; 5] = [
    Kind::SotwWildcard,
    Kind::SotwNames,
    Kind::DeltaWildcard,
    Kind::DeltaNames,
    Kind::DeltaLocators,
];

/// The write number a cluster's body carries (its connect timeout less one second).
fn write_number(resource: &[u8]) -> Option<(String, u64)> {
    let cluster = Cluster::decode(resource).ok()?;
    let seconds = cluster.connect_timeout?.seconds;
    Some((cluster.name, u64::try_from(seconds - 1).ok()?))
}

/// One session of a stream: subscribe, then ACK and record every response until the server
/// ends it (an error) or `until` passes (`Ok`).
async fn session(
    channel: Channel,
    stream: usize,
    kind: Kind,
    shared: &Shared,
    until: Option<Instant>,
) -> anyhow::Result<()> {
    shared.held[stream].lock().expect("held").clear();
    let run = async {
        match kind {
            Kind::SotwWildcard | Kind::SotwNames => sotw(channel, stream, kind, shared).await,
            _ => delta(channel, stream, kind, shared).await,
        }
    };
    let result = match until {
        Some(until) => match tokio::time::timeout_at(until.into(), run).await {
            Ok(ended) => ended,
            Err(_) => Ok(()), // our own reconnect
        },
        None => run.await,
    };
    shared.live[stream].store(false, Ordering::Release);
    result
}

pub(crate) fn names(clusters: usize) -> Vec<String> {
    (0..clusters).map(|i| format!("c{i}")).collect()
}

async fn sotw(channel: Channel, stream: usize, kind: Kind, shared: &Shared) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(8);
    tx.send(DiscoveryRequest {
        type_url: CLUSTER.into(),
        node: Some(node(stream, shared.args_variants)),
        resource_names: match kind {
            Kind::SotwNames => names(shared.clusters),
            _ => Vec::new(),
        },
        ..Default::default()
    })
    .await?;
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .stream_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        let DiscoveryResponse {
            type_url,
            version_info,
            nonce,
            resources,
            ..
        } = response;
        let state: HashMap<String, u64> = resources
            .iter()
            .filter_map(|any| write_number(&any.value))
            .collect();
        *shared.held[stream].lock().expect("held") = state;
        shared.live[stream].store(true, Ordering::Release);
        shared.responses.fetch_add(1, Ordering::Relaxed);
        let ack = DiscoveryRequest {
            type_url,
            version_info,
            response_nonce: nonce,
            resource_names: match kind {
                Kind::SotwNames => names(shared.clusters),
                _ => Vec::new(),
            },
            ..Default::default()
        };
        if tx.send(ack).await.is_err() {
            return ended_while_answering(&mut responses).await;
        }
    }
    bail!("the server ended the stream")
}

async fn delta(channel: Channel, stream: usize, kind: Kind, shared: &Shared) -> anyhow::Result<()> {
    let (tx, rx) = mpsc::channel(8);
    let mut first = DeltaDiscoveryRequest {
        type_url: CLUSTER.into(),
        node: Some(node(stream, shared.args_variants)),
        ..Default::default()
    };
    match kind {
        Kind::DeltaLocators => {
            first.resource_locators_subscribe = names(shared.clusters)
                .into_iter()
                .map(|name| ResourceLocator {
                    name,
                    dynamic_parameters: [("shard".to_owned(), shard(stream, shared.args_variants))]
                        .into(),
                })
                .collect();
        }
        Kind::DeltaNames => first.resource_names_subscribe = names(shared.clusters),
        _ => {} // the legacy wildcard, as Envoy sends for CDS
    }
    tx.send(first).await?;
    let mut responses = AggregatedDiscoveryServiceClient::new(channel)
        .delta_aggregated_resources(ReceiverStream::new(rx))
        .await?
        .into_inner();
    while let Some(response) = responses.message().await? {
        let DeltaDiscoveryResponse {
            type_url,
            nonce,
            resources,
            removed_resources,
            removed_resource_names,
            ..
        } = response;
        {
            let mut held = shared.held[stream].lock().expect("held");
            // Removals first: a variant swapped for another is removed and added in one.
            for name in &removed_resources {
                held.remove(name);
            }
            for named in &removed_resource_names {
                held.remove(&named.name);
            }
            for resource in &resources {
                if let Some((name, number)) = resource
                    .resource
                    .as_ref()
                    .and_then(|any| write_number(&any.value))
                {
                    held.insert(name, number);
                }
            }
        }
        shared.live[stream].store(true, Ordering::Release);
        shared.responses.fetch_add(1, Ordering::Relaxed);
        let ack = DeltaDiscoveryRequest {
            type_url,
            response_nonce: nonce,
            ..Default::default()
        };
        if tx.send(ack).await.is_err() {
            return ended_while_answering(&mut responses).await;
        }
    }
    bail!("the server ended the stream")
}

/// The call ended while the client was answering its last response (tonic drops the request
/// side once the server's status arrives): the status says why, as it would have had the
/// client read first. Without this a maximum-age close could read as the request channel's
/// "channel closed".
async fn ended_while_answering<T>(responses: &mut tonic::Streaming<T>) -> anyhow::Result<()> {
    loop {
        match responses.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => bail!("the server ended the stream"),
            Err(status) => return Err(status.into()),
        }
    }
}

/// A stream for the whole run: sessions one after another on new connections. A churning
/// stream ends each session after 2–6 s (until settling); any other end is counted.
pub(crate) async fn run_stream(
    stream: usize,
    kind: Kind,
    churn: bool,
    replica: usize,
    shared: Arc<Shared>,
) {
    let endpoint = match Endpoint::from_shared(shared.replicas[replica].xds.clone()) {
        Ok(e) => e.connect_timeout(Duration::from_secs(10)),
        Err(e) => {
            shared.error(&format!("stream {stream}: endpoint: {e}"));
            return;
        }
    };
    let mut cycle = stream as u64;
    loop {
        let until = (churn && !shared.settling.load(Ordering::Acquire)).then(|| {
            cycle = cycle
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            Instant::now() + Duration::from_millis(2000 + (cycle >> 33) % 4000)
        });
        shared.sessions.fetch_add(1, Ordering::Relaxed);
        let channel = endpoint.connect_lazy();
        match session(channel, stream, kind, &shared, until).await {
            Ok(()) => {}
            Err(e) if is_max_age(&e) => {
                shared.max_age_reconnects.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                shared.ended(
                    replica,
                    &format!("stream {stream} ({kind:?})"),
                    &format!("{e:#}"),
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Whether the server ended the stream because its connection reached its maximum age: it
/// asks the client to reconnect (UNAVAILABLE), as it should.
fn is_max_age(error: &anyhow::Error) -> bool {
    error.downcast_ref::<tonic::Status>().is_some_and(|status| {
        status.code() == tonic::Code::Unavailable && status.message().contains("maximum age")
    })
}
