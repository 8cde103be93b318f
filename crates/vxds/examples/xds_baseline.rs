//! The practical limit for `xds_load`: a minimal pre-encoded ADS server to measure vxds
//! against, side by side.
//!
//! No matching, no state machine, no bookkeeping: every write builds, once per version, one
//! encoded response body per shard and kind — SotW (the whole state), Delta (the whole state,
//! and only what the write changed) — as one `Bytes` that every stream shares; a stream writes
//! only its nonce after it. A stream's shard is read once from its first request's
//! `node.dynamic_parameters` (the same `shard` key `xds_load` uses); subscriptions are not
//! read (a Delta stream by locator gets what a wildcard one gets, named the legacy way), and
//! ACKs are read and dropped.
//!
//! It takes the part of `vxds serve`'s command line that `xds_load` uses, prints the same
//! "listening" lines, and answers the two admin requests `xds_load` makes (`POST
//! /v1/changesets` with cluster puts, `PUT /v1/resources/cluster/{name}`), so the load
//! generator runs it exactly as it runs vxds:
//!
//! ```sh
//! cargo build --release -p vxds --example xds_load --example xds_baseline --bin vxds
//! ./target/release/examples/xds_load --streams 10000 --protocol delta --vxds target/release/examples/xds_baseline
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{post, put};
use prost::Message;
use prost::bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{WireType, encode_key, encode_varint};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use vxds_envoy::resource::{Body as ResourceBody, ResourceType};

const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const ADS: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";

/// One version's responses for one shard, encoded without their nonce.
struct ShardResponses {
    sotw: Bytes,
    delta_full: Bytes,
    delta_changed: Bytes,
}

/// What every stream reads: the current version's responses, per shard.
#[derive(Default)]
struct Snapshot {
    version: u64,
    shards: HashMap<String, ShardResponses>,
}

/// What the admin side keeps: every cluster's `Any` per shard.
#[derive(Default)]
struct Store {
    version: u64,
    clusters: BTreeMap<String, BTreeMap<String, Bytes>>,
}

struct Server {
    store: Mutex<Store>,
    snapshot: watch::Sender<Arc<Snapshot>>,
    cluster_type: ResourceType,
}

fn put_field(tag: u32, bytes: &[u8], buf: &mut impl BufMut) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(bytes.len() as u64, buf);
    buf.put_slice(bytes);
}

/// A `DiscoveryResponse` without its nonce.
fn encode_sotw(version: &str, anys: &[&Bytes]) -> Bytes {
    let mut buf = BytesMut::new();
    put_field(1, version.as_bytes(), &mut buf);
    for any in anys {
        put_field(2, any, &mut buf);
    }
    put_field(4, CLUSTER.as_bytes(), &mut buf);
    buf.freeze()
}

/// A `DeltaDiscoveryResponse` without its nonce; every resource at `version`.
fn encode_delta(version: &str, named: &[(&str, &Bytes)]) -> Bytes {
    let mut buf = BytesMut::new();
    put_field(1, version.as_bytes(), &mut buf);
    for (name, any) in named {
        let mut resource = BytesMut::new();
        put_field(1, version.as_bytes(), &mut resource);
        put_field(2, any, &mut resource);
        put_field(3, name.as_bytes(), &mut resource);
        put_field(2, &resource, &mut buf);
    }
    put_field(4, CLUSTER.as_bytes(), &mut buf);
    buf.freeze()
}

impl Server {
    /// Applies cluster puts (name, variants as `xds_load` writes them) as one version and
    /// publishes its responses.
    fn apply(&self, puts: &[(String, Value)]) -> Result<(), String> {
        let mut store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        for (name, variants) in puts {
            let mut shards = BTreeMap::new();
            for variant in variants.as_array().ok_or("variants: not a list")? {
                let constraints = variant["constraints"].as_str().unwrap_or_default();
                // `shard = "s0"`: the value between the quotes.
                let shard = constraints.split('"').nth(1).unwrap_or_default().to_owned();
                let body = ResourceBody::from_value(&variant["resource"], &self.cluster_type)
                    .map_err(|e| format!("{name}: {}", e.message))?;
                shards.insert(shard, Bytes::from(body.any_bytes));
            }
            store.clusters.insert(name.clone(), shards);
        }
        store.version += 1;
        let version = store.version.to_string();
        let changed: BTreeSet<&str> = puts.iter().map(|(n, _)| n.as_str()).collect();
        let all_shards: BTreeSet<&String> =
            store.clusters.values().flat_map(|s| s.keys()).collect();
        let mut shards = HashMap::new();
        for shard in all_shards {
            let held: Vec<(&str, &Bytes)> = store
                .clusters
                .iter()
                .filter_map(|(name, by)| by.get(shard).map(|any| (name.as_str(), any)))
                .collect();
            let changed: Vec<(&str, &Bytes)> = held
                .iter()
                .filter(|(name, _)| changed.contains(name))
                .copied()
                .collect();
            let anys: Vec<&Bytes> = held.iter().map(|(_, any)| *any).collect();
            shards.insert(
                shard.clone(),
                ShardResponses {
                    sotw: encode_sotw(&version, &anys),
                    delta_full: encode_delta(&version, &held),
                    delta_changed: encode_delta(&version, &changed),
                },
            );
        }
        self.snapshot.send_replace(Arc::new(Snapshot {
            version: store.version,
            shards,
        }));
        Ok(())
    }
}

/// A response on the wire: the shared body, then this stream's nonce (field 5).
struct Pre {
    body: Bytes,
    nonce: u64,
}

struct PreCodec<D>(PhantomData<D>);

/// The same buffer sizes as vxds's streams.
fn buffers() -> BufferSettings {
    BufferSettings::new(1024, 32 * 1024)
}

struct PreEncoder;

impl Encoder for PreEncoder {
    type Item = Pre;
    type Error = Status;

    fn encode(&mut self, item: Pre, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.put_slice(&item.body);
        let mut digits = itoa_buf(item.nonce);
        put_field(5, digits.as_bytes_mut(), buf);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffers()
    }
}

/// A nonce's decimal digits without an allocation.
struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    fn as_bytes_mut(&mut self) -> &[u8] {
        &self.buf[self.start..]
    }
}

fn itoa_buf(mut n: u64) -> Digits {
    let mut buf = [0u8; 20];
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    Digits { buf, start }
}

struct PreDecoder<D>(PhantomData<D>);

impl<D: Message + Default> Decoder for PreDecoder<D> {
    type Item = D;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        D::decode(buf)
            .map(Some)
            .map_err(|e| Status::internal(e.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffers()
    }
}

impl<D: Message + Default + Send + 'static> Codec for PreCodec<D> {
    type Encode = Pre;
    type Decode = D;
    type Encoder = PreEncoder;
    type Decoder = PreDecoder<D>;

    fn encoder(&mut self) -> PreEncoder {
        PreEncoder
    }

    fn decoder(&mut self) -> PreDecoder<D> {
        PreDecoder(PhantomData)
    }
}

/// The requests of either protocol: their node, on the first.
trait HasNode: Message + Default + Send + 'static {
    fn node(&self) -> Option<&Node>;
    const DELTA: bool;
}

impl HasNode for DiscoveryRequest {
    fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }
    const DELTA: bool = false;
}

impl HasNode for DeltaDiscoveryRequest {
    fn node(&self) -> Option<&Node> {
        self.node.as_ref()
    }
    const DELTA: bool = true;
}

struct Method<R>(Arc<Server>, PhantomData<R>);

impl<R: HasNode> StreamingService<R> for Method<R> {
    type Response = Pre;
    type ResponseStream = ReceiverStream<Result<Pre, Status>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<R>>) -> Self::Future {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(run_stream(self.0.clone(), request.into_inner(), tx));
        Box::pin(async move { Ok(Response::new(ReceiverStream::new(rx))) })
    }
}

async fn run_stream<R: HasNode>(
    server: Arc<Server>,
    mut requests: Streaming<R>,
    out: mpsc::Sender<Result<Pre, Status>>,
) {
    let Ok(Some(first)) = requests.message().await else {
        return;
    };
    let shard = first
        .node()
        .and_then(|n| n.dynamic_parameters.get(CLUSTER))
        .and_then(|p| p.params.get("shard"))
        .cloned()
        .unwrap_or_default();
    drop(first);
    let mut updates = server.snapshot.subscribe();
    let (mut sent, mut nonce) = (0u64, 0u64);
    loop {
        let snapshot = updates.borrow_and_update().clone();
        if snapshot.version != sent
            && let Some(responses) = snapshot.shards.get(&shard)
        {
            let body = if !R::DELTA {
                &responses.sotw
            } else if sent != 0 && sent + 1 == snapshot.version {
                &responses.delta_changed
            } else {
                &responses.delta_full
            };
            nonce += 1;
            let pre = Pre {
                body: body.clone(),
                nonce,
            };
            if out.send(Ok(pre)).await.is_err() {
                return;
            }
            sent = snapshot.version;
        }
        drop(snapshot);
        tokio::select! {
            request = requests.message() => match request {
                Ok(Some(_)) => {} // an ACK: nothing to do
                _ => return,
            },
            changed = updates.changed() => if changed.is_err() {
                return;
            },
        }
    }
}

#[derive(Clone)]
struct Ads(Arc<Server>);

impl NamedService for Ads {
    const NAME: &'static str = ADS;
}

impl<B> tower::Service<http::Request<B>> for Ads
where
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let server = self.0.clone();
        Box::pin(async move {
            let path = request.uri().path().to_owned();
            Ok(match path.rsplit('/').next() {
                Some("StreamAggregatedResources") => {
                    let mut grpc = Grpc::new(PreCodec::<DiscoveryRequest>(PhantomData));
                    let method = Method::<DiscoveryRequest>(server, PhantomData);
                    grpc.streaming(method, request).await
                }
                Some("DeltaAggregatedResources") => {
                    let mut grpc = Grpc::new(PreCodec::<DeltaDiscoveryRequest>(PhantomData));
                    let method = Method::<DeltaDiscoveryRequest>(server, PhantomData);
                    grpc.streaming(method, request).await
                }
                _ => Status::unimplemented(path).into_http(),
            })
        })
    }
}

type AdminResult = Result<Json<Value>, (StatusCode, String)>;

fn bad(message: String) -> (StatusCode, String) {
    (StatusCode::BAD_REQUEST, message)
}

async fn changesets(State(server): State<Arc<Server>>, Json(body): Json<Value>) -> AdminResult {
    let mut puts = Vec::new();
    for op in body["operations"].as_array().into_iter().flatten() {
        if op["op"] != "put" || op["type"] != "cluster" {
            return Err(bad(format!("only cluster puts: {op}")));
        }
        let name = op["name"].as_str().ok_or_else(|| bad("no name".into()))?;
        puts.push((name.to_owned(), op["variants"].clone()));
    }
    server.apply(&puts).map_err(bad)?;
    Ok(Json(serde_json::json!({})))
}

async fn put_cluster(
    State(server): State<Arc<Server>>,
    Path(name): Path<String>,
    Json(body): Json<Value>,
) -> AdminResult {
    server
        .apply(&[(name, body["variants"].clone())])
        .map_err(bad)?;
    Ok(Json(serde_json::json!({})))
}

/// `--name value` from `vxds serve`'s command line.
fn flag(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_owned())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    // Logging as `vxds serve` sets it up. Without a subscriber, every span that h2 opens
    // around a frame (at trace level, disabled) is still built and offered to `log`: about a
    // sixth of this server's instructions, which vxds, with its subscriber, does not pay.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let _ = rlimit::increase_nofile_limit(u64::MAX);
    let server = Arc::new(Server {
        store: Mutex::default(),
        snapshot: watch::Sender::new(Arc::new(Snapshot::default())),
        cluster_type: ResourceType::resolve("cluster")?,
    });
    let xds = tokio::net::TcpListener::bind(flag(&args, "--xds-addr", "127.0.0.1:0")).await?;
    let admin = tokio::net::TcpListener::bind(flag(&args, "--admin-addr", "127.0.0.1:0")).await?;
    eprintln!("xDS server listening addr={}", xds.local_addr()?);
    eprintln!("admin API listening addr={}", admin.local_addr()?);
    let routes = axum::Router::new()
        .route("/v1/changesets", post(changesets))
        .route("/v1/resources/cluster/{name}", put(put_cluster))
        .with_state(server.clone());
    tokio::spawn(async move { axum::serve(admin, routes).await });
    let incoming = tonic::transport::server::TcpIncoming::from(xds).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .max_concurrent_streams(64)
        .add_service(Ads(server))
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}
