//! The gRPC side: one generic implementation for ADS and every per-type service, SotW, Delta
//! and Fetch.
//!
//! Each stream gets a task that owns its [`StreamMachine`]: it reads requests, waits on its
//! inbox for changes, and sends what the machine computes into a bounded channel that tonic
//! drains. A slow client fills only its own channel; its task then waits while its inbox
//! coalesces changes, so others are never held up and memory stays bounded. When the client
//! goes (its requests end, or the channel closes), the task ends and its registration is
//! dropped: nothing is left behind.

use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::codegen::{Body, BoxFuture, StdError, http};
use tonic::server::{Grpc, NamedService, StreamingService, UnaryService};
use tonic::{Request, Response as GrpcResponse, Status, Streaming};
use tonic_prost::{ProstCodec, ProstEncoder};
use tracing::{debug, warn};
use vxds_envoy::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};

use crate::connections::ConnectionClosing;
use crate::events::{Answer, ClientEvent, ClientEvents, Presence};
use crate::identity::{PeerIdentity, PeerInfo, trusted_params};
use crate::machine::{MachineConfig, Protocol, RequestOutcome, Response, StreamMachine};
use crate::metrics::{PerType, StreamLabels, TypeCounters, XdsMetrics};
use crate::registry::{Registry, wake};
use crate::rollout::StreamRollout;
use crate::types::{Method, ServiceSpec};
use crate::wire::{self, DeltaResponse, FastDecode, SotwResponse};
use crate::woken::WhenWoken;

mod tracking;

use tracking::{after_request, catch_up_and_compute, computes_after_request, record_answers};

/// Prost's codec with small starting buffers. A stream keeps one encode and one decode buffer
/// for its whole life; tonic's 8 KiB defaults cost 16 KiB per stream, 160 MiB for ten thousand
/// mostly idle streams. The buffers still grow to the largest message.
struct StreamCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for StreamCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

fn stream_buffers() -> BufferSettings {
    BufferSettings::new(1024, 32 * 1024)
}

impl<T, U> Codec for StreamCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: FastDecode + Send + 'static,
{
    type Encode = T;
    type Decode = Box<U>;
    type Encoder = ProstEncoder<T>;
    type Decoder = RequestDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(stream_buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder(PhantomData)
    }
}

/// Prost's decoder, with answers (most requests) read by hand: [`wire::decode_request`].
/// Errors are prost's, as tonic's `ProstDecoder` reports them (`INTERNAL`, prost's text).
///
/// A request comes boxed, in a fresh allocation (which the allocator usually serves from
/// memory just freed, in cache): unboxed, its 600 bytes were copied into the stream task's
/// state two or three times on their way to the machine, and a stream's state is out of
/// cache whenever a revision reaches it among thousands of others.
struct RequestDecoder<U>(PhantomData<U>);

impl<U: FastDecode> Decoder for RequestDecoder<U> {
    type Item = Box<U>;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Box<U>>, Status> {
        wire::decode_request(buf)
            .map(|request| Some(Box::new(request)))
            .map_err(|error| Status::internal(error.to_string()))
    }

    fn buffer_settings(&self) -> BufferSettings {
        stream_buffers()
    }
}

/// What every stream of the server shares.
#[derive(Debug)]
pub(crate) struct Shared {
    pub registry: Arc<Registry>,
    pub machine: Arc<MachineConfig>,
    pub metrics: Arc<XdsMetrics>,
    pub max_request_bytes: usize,
    pub max_response_bytes: usize,
    /// Responses queued per stream before the stream waits for its client.
    pub queue_depth: usize,
    pub csds: bool,
    pub request_rate: crate::RequestRate,
    pub identity_template: Option<vxds_core::IdentityTemplate>,
}

/// Who the client is and what it may not claim, checked before its stream starts; and its
/// connection's closing signal.
struct Admitted {
    peer: Option<PeerIdentity>,
    trusted: vxds_core::ParamSet,
    connection: Option<ConnectionClosing>,
}

impl Admitted {
    fn opening(self, spec: &'static ServiceSpec, protocol: Protocol) -> Opening {
        Opening {
            spec,
            protocol,
            admitted: self,
        }
    }
}

/// A stream about to start: its service, its protocol and its client.
struct Opening {
    spec: &'static ServiceSpec,
    protocol: Protocol,
    admitted: Admitted,
}

impl Shared {
    fn admit<T>(&self, request: &Request<T>) -> Result<Admitted, Status> {
        let peer = request
            .extensions()
            .get::<PeerInfo>()
            .and_then(|info| info.identity.clone());
        let trusted = trusted_params(self.identity_template.as_ref(), peer.as_ref()).inspect_err(
            |status| {
                warn!(peer = ?peer, error = status.message(), "refusing a client");
            },
        )?;
        let connection = request.extensions().get::<ConnectionClosing>().cloned();
        Ok(Admitted {
            peer,
            trusted,
            connection,
        })
    }
}

/// Ties a zero-sized marker to one [`ServiceSpec`], so that each gRPC service is a type of its
/// own (tonic names services by type).
pub trait Spec: Send + Sync + 'static {
    const SPEC: &'static ServiceSpec;
}

/// One xDS gRPC service.
pub struct XdsGrpc<S: Spec> {
    shared: Arc<Shared>,
    _spec: PhantomData<S>,
}

impl<S: Spec> XdsGrpc<S> {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self {
            shared,
            _spec: PhantomData,
        }
    }
}

impl<S: Spec> Clone for XdsGrpc<S> {
    fn clone(&self) -> Self {
        Self::new(self.shared.clone())
    }
}

impl<S: Spec> NamedService for XdsGrpc<S> {
    const NAME: &'static str = S::SPEC.name;
}

impl<S: Spec, B> tower::Service<http::Request<B>> for XdsGrpc<S>
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
        let shared = self.shared.clone();
        let spec = S::SPEC;
        Box::pin(async move {
            let limits = (
                Some(shared.max_request_bytes),
                Some(shared.max_response_bytes),
            );
            Ok(match spec.method(request.uri().path()) {
                Some(Method::Sotw) => {
                    let mut grpc =
                        Grpc::new(StreamCodec::<SotwResponse, DiscoveryRequest>::default())
                            .apply_max_message_size_config(limits.0, limits.1);
                    grpc.streaming(SotwMethod { shared, spec }, request).await
                }
                Some(Method::Delta) => {
                    let mut grpc =
                        Grpc::new(StreamCodec::<DeltaResponse, DeltaDiscoveryRequest>::default())
                            .apply_max_message_size_config(limits.0, limits.1);
                    grpc.streaming(DeltaMethod { shared, spec }, request).await
                }
                Some(Method::Fetch) => {
                    let mut grpc =
                        Grpc::new(StreamCodec::<SotwResponse, DiscoveryRequest>::default())
                            .apply_max_message_size_config(limits.0, limits.1);
                    grpc.unary(FetchMethod { shared, spec }, request).await
                }
                None => Status::unimplemented(format!(
                    "{} has no method {}",
                    spec.name,
                    request.uri().path()
                ))
                .into_http(),
            })
        })
    }
}

/// A response waiting in a stream's queue. Boxed: the queue allocates its slots in blocks,
/// and a `Status` is large.
type Queued<T> = Box<Result<T, Status>>;

/// The responses tonic sends on a stream, unboxed from its queue.
pub(crate) struct Outbox<T>(ReceiverStream<Queued<T>>);

impl<T> tokio_stream::Stream for Outbox<T> {
    type Item = Result<T, Status>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.0)
            .poll_next(cx)
            .map(|queued| queued.map(|boxed| *boxed))
    }
}

struct SotwMethod {
    shared: Arc<Shared>,
    spec: &'static ServiceSpec,
}

impl StreamingService<Box<DiscoveryRequest>> for SotwMethod {
    type Response = SotwResponse;
    type ResponseStream = Outbox<SotwResponse>;
    type Future = BoxFuture<GrpcResponse<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<Box<DiscoveryRequest>>>) -> Self::Future {
        let admitted = match self.shared.admit(&request) {
            Ok(admitted) => admitted,
            Err(status) => return Box::pin(async move { Err(status) }),
        };
        let (tx, rx) = mpsc::channel(self.shared.queue_depth);
        tokio::spawn(run_stream(
            self.shared.clone(),
            admitted.opening(self.spec, Protocol::Sotw),
            request.into_inner(),
            tx,
            |machine, request| machine.on_sotw_request(*request),
            |r| match r {
                Response::Sotw(r) => Some(r),
                Response::Delta(_) => None,
            },
        ));
        Box::pin(async move { Ok(GrpcResponse::new(Outbox(ReceiverStream::new(rx)))) })
    }
}

struct DeltaMethod {
    shared: Arc<Shared>,
    spec: &'static ServiceSpec,
}

impl StreamingService<Box<DeltaDiscoveryRequest>> for DeltaMethod {
    type Response = DeltaResponse;
    type ResponseStream = Outbox<DeltaResponse>;
    type Future = BoxFuture<GrpcResponse<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<Box<DeltaDiscoveryRequest>>>) -> Self::Future {
        let admitted = match self.shared.admit(&request) {
            Ok(admitted) => admitted,
            Err(status) => return Box::pin(async move { Err(status) }),
        };
        let (tx, rx) = mpsc::channel(self.shared.queue_depth);
        tokio::spawn(run_stream(
            self.shared.clone(),
            admitted.opening(self.spec, Protocol::Delta),
            request.into_inner(),
            tx,
            |machine, request| machine.on_delta_request(*request),
            |r| match r {
                Response::Delta(r) => Some(r),
                Response::Sotw(_) => None,
            },
        ));
        Box::pin(async move { Ok(GrpcResponse::new(Outbox(ReceiverStream::new(rx)))) })
    }
}

/// The REST-like `Fetch*` methods: one request, the state of the world in one response.
struct FetchMethod {
    shared: Arc<Shared>,
    spec: &'static ServiceSpec,
}

impl UnaryService<Box<DiscoveryRequest>> for FetchMethod {
    type Response = SotwResponse;
    type Future = BoxFuture<GrpcResponse<SotwResponse>, Status>;

    fn call(&mut self, request: Request<Box<DiscoveryRequest>>) -> Self::Future {
        let shared = self.shared.clone();
        let spec = self.spec;
        Box::pin(async move {
            let admitted = shared.admit(&request)?;
            // The unary methods share their connection's allowance: a client calling Fetch in
            // a tight loop gets no more of a core than a stream does.
            if let Some(budget) = request.extensions().get::<FetchBudget>()
                && !budget.take(shared.request_rate)
            {
                shared.metrics.rate_limited_fetches.inc();
                let limit = shared.request_rate;
                return Err(Status::resource_exhausted(format!(
                    "more than {} Fetch requests per second (bursts up to {}) on one connection",
                    limit.per_second, limit.burst
                )));
            }
            let request = request.into_inner();
            let mut machine = StreamMachine::new(0, Protocol::Sotw, spec, shared.machine.clone());
            machine.set_peer(admitted.peer, admitted.trusted);
            machine.on_sotw_request(*request)?;
            let snapshot = shared.registry.snapshot();
            let response = machine.poll(&snapshot).into_iter().find_map(|r| match r {
                Response::Sotw(r) => Some(r),
                Response::Delta(_) => None,
            });
            Ok(GrpcResponse::new(response.unwrap_or_default()))
        })
    }
}

/// Resolves with the reason once the stream's connection closes (never for a connection
/// without the signal).
async fn until_closing(connection: &mut Option<ConnectionClosing>) -> &'static str {
    match connection {
        Some(connection) => connection.closed().await,
        None => std::future::pending().await,
    }
}

/// What the request loop needs to know of a request before the machine reads it.
trait XdsRequest {
    /// The nonce of the response it answers; empty for none.
    fn response_nonce(&self) -> &str;
}

impl XdsRequest for DiscoveryRequest {
    fn response_nonce(&self) -> &str {
        &self.response_nonce
    }
}

impl XdsRequest for DeltaDiscoveryRequest {
    fn response_nonce(&self) -> &str {
        &self.response_nonce
    }
}

impl<T: XdsRequest> XdsRequest for Box<T> {
    fn response_nonce(&self) -> &str {
        (**self).response_nonce()
    }
}

/// Whether `request` answers a response the client still owes an answer to (and so is free);
/// counts the answer.
fn answers_response(request: &impl XdsRequest, answers_owed: &mut u64) -> bool {
    if request.response_nonce().is_empty() || *answers_owed == 0 {
        return false;
    }
    *answers_owed -= 1;
    true
}

/// Ends the stream of a closing connection: `UNAVAILABLE` (clients reconnect, to another
/// replica if there is one), or `PERMISSION_DENIED` when its certificate was revoked;
/// waiting a moment for room in the queue: a client that does not read gets no say in how
/// long closing takes.
async fn end_closing<T>(out: &mpsc::Sender<Queued<T>>, reason: &'static str) {
    let status = match reason {
        "drain" => Status::unavailable("vxds is shutting down; reconnect"),
        "max_age" => Status::unavailable("the connection reached its maximum age; reconnect"),
        "revoked" => Status::permission_denied(
            "the client certificate is revoked (the certificate revocation list given by \
             --xds-client-crl now lists it); the connection is closed",
        ),
        _ => Status::unavailable("the connection is closing; reconnect"),
    };
    let status = Box::new(Err(status));
    let _ = tokio::time::timeout(Duration::from_secs(1), out.send(status)).await;
}

/// A stream's request allowance: a token bucket, `burst` deep, refilled at `per_second`.
/// The allowance of one connection's unary `Fetch*` calls (streams have their own each), made
/// with the connection and shared by its calls.
#[derive(Clone, Debug, Default)]
pub struct FetchBudget(Arc<std::sync::Mutex<Option<RequestBudget>>>);

impl FetchBudget {
    /// Takes one call's token; `false` when the connection has none left.
    fn take(&self, rate: crate::RequestRate) -> bool {
        let mut budget = self.0.lock().unwrap_or_else(|e| e.into_inner());
        budget
            .get_or_insert_with(|| RequestBudget::new(rate))
            .take()
    }
}

#[derive(Debug)]
struct RequestBudget {
    tokens: f64,
    rate: crate::RequestRate,
    refilled: tokio::time::Instant,
}

impl RequestBudget {
    fn new(rate: crate::RequestRate) -> Self {
        Self {
            tokens: f64::from(rate.burst.max(1)),
            rate,
            refilled: tokio::time::Instant::now(),
        }
    }

    /// Takes one request's token; `false` when the stream has none left.
    fn take(&mut self) -> bool {
        let now = tokio::time::Instant::now();
        let elapsed = now.duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * f64::from(self.rate.per_second))
            .min(f64::from(self.rate.burst.max(1)));
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// The client's answers in `outcome`, as events (only built while someone listens).
fn publish_answers(events: &ClientEvents, machine: &StreamMachine, outcome: &RequestOutcome) {
    let status = machine.status();
    let Ok(status) = status.lock() else {
        return;
    };
    let answers =
        (outcome.acks.iter().map(|t| (t, false))).chain(outcome.nacks.iter().map(|t| (t, true)));
    for (type_url, nacked) in answers {
        if let Some(answer) = Answer::of(&status, type_url, nacked) {
            events.send(if nacked {
                ClientEvent::Nack(answer)
            } else {
                ClientEvent::Ack(answer)
            });
        }
    }
}

/// The revisions a computation was told of: usually one, held inline.
type Marked = smallvec::SmallVec<[crate::rollout::Mark; 2]>;

/// Keeps the streams gauge honest however the task ends.
struct StreamGauge {
    metrics: Arc<XdsMetrics>,
    labels: StreamLabels,
}

impl Drop for StreamGauge {
    fn drop(&mut self) {
        self.metrics.streams.get_or_create(&self.labels).dec();
    }
}

async fn run_stream<Req, Resp>(
    shared: Arc<Shared>,
    opening: Opening,
    mut requests: Streaming<Req>,
    out: mpsc::Sender<Queued<Resp>>,
    handle: fn(&mut StreamMachine, Req) -> Result<RequestOutcome, Status>,
    unwrap: fn(Response) -> Option<Resp>,
) where
    Req: XdsRequest + Send + 'static,
    Resp: Send + 'static,
{
    let Opening {
        spec,
        protocol,
        admitted,
    } = opening;
    let id = shared.registry.next_id();
    let mut machine = StreamMachine::new(id, protocol, spec, shared.machine.clone());
    machine.set_peer(admitted.peer, admitted.trusted);
    let registration = shared.registry.register(id, machine.status());
    let mut rollout = StreamRollout::new(shared.registry.rollouts.clone(), id);
    if protocol == Protocol::Delta {
        rollout = rollout.delta();
    }
    let labels = StreamLabels {
        service: spec.label,
        protocol: match protocol {
            Protocol::Sotw => "sotw",
            Protocol::Delta => "delta",
        },
    };
    shared.metrics.streams.get_or_create(&labels).inc();
    let _gauge = StreamGauge {
        metrics: shared.metrics.clone(),
        labels,
    };
    debug!(
        stream = id,
        service = spec.label,
        ?protocol,
        "stream opened"
    );
    let mut connection = admitted.connection;
    let mut budget = RequestBudget::new(shared.request_rate);
    // Responses sent and not yet answered: a request answering one is what the protocol asks
    // of the client, and costs it nothing; everything else is charged to its budget.
    let mut answers_owed: u64 = 0;
    // The shortest TTL the client holds, as the heartbeat task last heard it.
    let mut ttl_registered = None;
    // Set at the first request (the node is known then); says goodbye when the task ends.
    let mut presence: Option<Presence> = None;
    let mut counters = TypeCounters::default();
    // The futures every turn of the loop waits on besides the request, made once: made anew
    // on every request, each registered and unregistered a waiter under its notifier's lock,
    // on every stream for every ACK. The one-shot ones (the client leaving, the connection
    // closing) end the task: one future, polled only once it woke the task (`WhenWoken`),
    // since a select polls every branch on every turn, and their notifiers were cold cache
    // lines on every turn of every stream. Marks and heartbeats wake the task through
    // `registration.wake`, whose poll is an atomic load and a waker's re-registration.
    // `None`: the client left (its responses are no longer read); else why the connection
    // closes.
    let endings = WhenWoken::new(async {
        tokio::select! {
            biased;
            () = out.closed() => None,
            reason = until_closing(&mut connection) => Some(reason),
        }
    });
    tokio::pin!(endings);
    // When the first of what a revision waits for and the client has not asked for stops
    // being waited for (rollout tracking's grace): an idle stream wakes then, so that the
    // revision settles. One timer, reset only when the deadline moves; none armed without.
    let mut need_deadline: Option<tokio::time::Instant> = None;
    let need_due = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(need_due);

    loop {
        // In a fixed order (`biased`): an unbiased select draws a random number on every poll
        // to pick where to start. Endings first; then requests, which every turn is nearly
        // always for, and which catch up with the inbox as they go unless they are answers
        // with nothing else to do; the inbox and the heartbeat wait behind them no longer
        // than a client's requests last (rate-limited, and answers owe to what was sent).
        let responses = tokio::select! {
            biased;
            ending = &mut endings => {
                if let Some(reason) = ending {
                    end_closing(&out, reason).await;
                }
                break;
            }
            message = requests.message() => match message {
                Ok(Some(request)) if !answers_response(&request, &mut answers_owed) && !budget.take() => {
                    // A client in a tight loop: it gets no more of a core than its share.
                    drop(request);
                    shared.metrics.rate_limited.inc();
                    let limit = shared.request_rate;
                    warn!(stream = id, node = ?machine.node().map(|n| n.id.clone()), "a client exceeded the request rate; closing its stream");
                    let _ = out.try_send(Box::new(Err(Status::resource_exhausted(format!(
                        "more than {} requests per second (bursts up to {}) on one stream",
                        limit.per_second, limit.burst
                    )))));
                    break;
                }
                Ok(Some(request)) => {
                    // Nonces are numbers (the machine's counter); an answer names the response.
                    let answered = request.response_nonce().parse::<u64>().ok();
                    // The request's outcome ends before any await: the task's state, out of
                    // cache when a revision reaches it, keeps nothing of it across one.
                    let computes = match handle(&mut machine, request) {
                    Ok(outcome) => {
                        let events = &shared.registry.events;
                        if presence.is_none() {
                            presence = Some(Presence::announce(events, machine.status()));
                        }
                        // Once the node is known: what a previous stream of it left open is
                        // this one's to answer.
                        if let Some(node) = machine.node() {
                            rollout.identify(spec.label, &node.id);
                        }
                        if events.is_watched() {
                            publish_answers(events, &machine, &outcome);
                        }
                        if let Some(unknown) = &outcome.unknown_type {
                            shared.metrics.unknown_type_requests.inc();
                            if unknown.first {
                                warn!(stream = id, node = ?machine.node().map(|n| n.id.clone()), type_url = %unknown.type_url, "ignoring requests for a type URL that names no message of the Envoy API");
                            }
                        }
                        let refusals = record_answers(&mut rollout, &machine, &outcome, answered);
                        for type_url in &outcome.acks {
                            counters.get(&shared.metrics, PerType::Acks, type_url).inc();
                        }
                        for type_url in &outcome.nacks {
                            counters.get(&shared.metrics, PerType::Nacks, type_url).inc();
                        }
                        Ok(computes_after_request((&shared.registry, id), &rollout, &mut machine, &outcome).then_some(refusals))
                    }
                    Err(status) => Err(status),
                    };
                    match computes {
                        Ok(Some(refusals)) => after_request(&shared.registry, &registration.inbox, &mut rollout, &mut machine, refusals).await,
                        Ok(None) => Vec::new(),
                        Err(status) => {
                            warn!(stream = id, node = ?machine.node().map(|n| n.id.clone()), error = %status.message(), "closing the stream");
                            let _ = out.send(Box::new(Err(status))).await;
                            break;
                        }
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    // A request too large or undecodable: the client is told why (if it is
                    // still there to hear it). Too large is a limit, not a bad range.
                    debug!(stream = id, error = %status, "the client's request stream failed");
                    let status = if status.code() == tonic::Code::OutOfRange {
                        Status::resource_exhausted(status.message().to_owned())
                    } else {
                        status
                    };
                    let _ = out.try_send(Box::new(Err(status)));
                    break;
                }
            },
            woken = registration.wake.take() => {
                let mut responses = Vec::new();
                if woken & wake::MARKED != 0 {
                    let snapshot;
                    (responses, snapshot) = catch_up_and_compute(&shared.registry, &registration.inbox, &mut rollout, &mut machine).await;
                    if !responses.is_empty()
                        && let Some(committed) = snapshot.committed_at_ms()
                    {
                        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_millis() as i64;
                        shared.metrics.push_latency.observe((now - committed).max(0) as f64 / 1000.0);
                    }
                }
                if woken & wake::HEARTBEAT != 0 {
                    let beats = machine.heartbeat(shared.registry.snapshot().revision, std::time::Instant::now());
                    for beat in &beats {
                        counters.get(&shared.metrics, PerType::Heartbeats, beat.type_url()).inc();
                    }
                    responses.extend(beats);
                }
                responses
            }
            () = &mut need_due, if need_deadline.is_some() => {
                need_deadline = None;
                rollout.needs_expired();
                Vec::new()
            }
        };
        // Each boxed before its wait, so that the task's state holds a pointer across it, not
        // a response.
        let queued = responses.into_iter().filter_map(|response| {
            let counted = counters
                .get(&shared.metrics, PerType::Responses, response.type_url())
                .clone();
            Some((counted, Box::new(Ok(unwrap(response)?))))
        });
        for (counted, queued) in queued {
            let sent = tokio::select! {
                biased;
                ending = &mut endings => {
                    match ending {
                        Some(reason) => end_closing(&out, reason).await,
                        None => debug!(stream = id, "the client left mid-push"),
                    }
                    return;
                }
                sent = out.send(queued) => sent.is_ok(),
            };
            if !sent {
                debug!(stream = id, "the client left mid-push");
                return;
            }
            answers_owed += 1;
            counted.inc();
        }
        if let Err(status) = machine.check_backlog() {
            shared.metrics.unanswered_ended.inc();
            warn!(stream = id, node = ?machine.node().map(|n| n.id.clone()), error = %status.message(), "a client left too many responses unanswered; closing its stream");
            // Its queue is likely full (it does not answer, so it may not read either): wait
            // a moment for room, as `end_closing` does, so that it learns why.
            let status = Box::new(Err(status));
            let _ = tokio::time::timeout(Duration::from_secs(1), out.send(status)).await;
            break;
        }
        let deadline = rollout.need_deadline();
        if deadline != need_deadline {
            if let Some(at) = deadline {
                need_due.as_mut().reset(at);
            }
            need_deadline = deadline;
        }
        let ttl = machine.shortest_ttl();
        if ttl != ttl_registered {
            if ttl_registered.is_none() {
                // A first TTL'd resource: at once what needs it (what a reconnecting client
                // reported holding, whose TTL has been running since the last server's
                // heartbeat); what was just sent is in flight and skipped.
                registration.wake.raise(wake::HEARTBEAT);
            }
            ttl_registered = ttl;
            let every = ttl.map(|t| t.mul_f64(shared.machine.heartbeat_fraction));
            shared
                .registry
                .heartbeats
                .set(id, every, &registration.wake);
        }
    }
    debug!(stream = id, "stream closed");
}
