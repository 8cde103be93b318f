//! The ADS server: xDS over gRPC, SotW and Delta, for Envoy and proxyless gRPC clients.
//!
//! - [`machine`]: one stream's state machine — subscriptions, TP2 variant matching, the
//!   protocol rules, make-before-break pushes. Pure; tested without sockets.
//! - [`registry`]: connected streams and what they subscribe to; the dispatcher that turns a
//!   new index snapshot into work for exactly the streams it concerns.
//! - [`service`]: the gRPC services (ADS and the nine per-type ones, from one generic
//!   implementation), a task per stream, bounded queues.
//! - [`wire`]: responses encoded around the variants' shared bytes.
//! - [`csds`], [`status`]: what the server knows of each client; [`summary`]: the compact
//!   summary of them impact preview reads; [`metrics`]: Prometheus.
//! - [`rollout`]: which streams each recent revision changed, and whether they accepted it.
//!
//! It reads only the in-memory index, never the database.
#![forbid(unsafe_code)]

pub mod connections;
pub mod csds;
pub mod events;
mod held;
pub mod identity;
mod intern;
pub mod machine;
pub mod metrics;
pub mod params;
pub mod registry;
pub mod rollout;
mod service;
pub mod status;
pub mod summary;
pub mod types;
pub mod wire;
mod woken;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use vxds_envoy::pb::envoy::service::status::v3::client_status_discovery_service_server::ClientStatusDiscoveryServiceServer;
use vxds_store::Index;

pub use connections::{CertificateId, ConnectionClosing, ConnectionConfig, RevokedCertificates};
pub use events::{ClientEvent, ClientEvents};
pub use identity::{PeerIdentity, PeerInfo};
pub use machine::{
    DEFAULT_HEARTBEAT_FRACTION, DEFAULT_MAX_UNANSWERED, MachineConfig, SecretAccess,
};
pub use metrics::XdsMetrics;
pub use registry::Registry;
use service::{Shared, Spec, XdsGrpc};
pub use status::ClientStatus;

/// Server options.
#[derive(Clone, Debug)]
pub struct XdsConfig {
    pub machine: MachineConfig,
    /// Largest request a client may send.
    pub max_request_bytes: usize,
    /// Largest response the server will send; a bigger one fails the stream with a clear error.
    pub max_response_bytes: usize,
    /// Responses queued per stream before the stream waits for its client.
    pub queue_depth: usize,
    /// Serve CSDS (what each client holds, secret bodies excepted) on the xDS port.
    pub csds: bool,
    /// Keepalive, maximum age, drain and stream limits of the connections.
    pub connections: ConnectionConfig,
    /// Requests one stream may send: a sustained rate and a burst above it. A stream that
    /// keeps sending faster is ended with `RESOURCE_EXHAUSTED`.
    pub request_rate: RequestRate,
    /// Turns a client certificate's identity into trusted parameters; clients it does not
    /// fit are refused. Needs connections that carry [`PeerInfo`] (mutual TLS).
    pub identity_template: Option<vxds_core::IdentityTemplate>,
}

impl Default for XdsConfig {
    fn default() -> Self {
        Self {
            machine: MachineConfig::default(),
            // Room for the default 100,000 subscriptions at ~160 bytes a name.
            max_request_bytes: 16 << 20,
            max_response_bytes: 256 << 20,
            queue_depth: 16,
            csds: true,
            connections: ConnectionConfig::default(),
            request_rate: RequestRate::default(),
            identity_template: None,
        }
    }
}

macro_rules! specs {
    ($($marker:ident => $index:expr),* $(,)?) => {
        $(
            #[derive(Debug)]
            struct $marker;
            impl Spec for $marker {
                const SPEC: &'static types::ServiceSpec = &types::SERVICES[$index];
            }
        )*
    };
}

specs!(Ads => 0, Lds => 1, Rds => 2, Cds => 3, Eds => 4, Sds => 5, Rtds => 6, Vhds => 7, Srds => 8, Ecds => 9);

/// A stream's request allowance: `per_second` sustained, `burst` at once.
#[derive(Clone, Copy, Debug)]
pub struct RequestRate {
    pub per_second: u32,
    pub burst: u32,
}

impl Default for RequestRate {
    fn default() -> Self {
        // A client sends a request per response it answers and per subscription change: far
        // below this, however busy the control plane.
        Self {
            per_second: 100,
            burst: 1000,
        }
    }
}

/// The xDS server. Dropping it stops the dispatcher.
#[derive(Debug)]
pub struct XdsServer {
    shared: Arc<Shared>,
    dispatcher: JoinHandle<()>,
    heartbeats: JoinHandle<()>,
    connections: ConnectionConfig,
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.dispatcher.abort();
        self.heartbeats.abort();
    }
}

impl XdsServer {
    /// Serves `index`; starts the dispatcher that follows it.
    pub fn new(index: Index, config: XdsConfig, metrics: Arc<XdsMetrics>) -> Self {
        let registry = Arc::new(Registry::new(index.snapshot()));
        let convergence = metrics.convergence.clone();
        registry
            .rollouts
            .observe_with(Arc::new(move |seconds| convergence.observe(seconds)));
        let dispatcher = tokio::spawn(registry::dispatch_changes(index.clone(), registry.clone()));
        let heartbeats = tokio::spawn(registry::heartbeats::run(registry.clone()));
        let shared = Arc::new(Shared {
            registry,
            machine: Arc::new(config.machine),
            metrics,
            max_request_bytes: config.max_request_bytes,
            max_response_bytes: config.max_response_bytes,
            queue_depth: config.queue_depth.max(1),
            csds: config.csds,
            request_rate: config.request_rate,
            identity_template: config.identity_template,
        });
        Self {
            shared,
            dispatcher,
            heartbeats,
            connections: config.connections,
        }
    }

    /// Every connected stream, for `/v1/clients`.
    pub fn registry(&self) -> Arc<Registry> {
        self.shared.registry.clone()
    }

    /// All the gRPC services: ADS, the per-type services and (unless turned off) CSDS.
    pub fn routes(&self) -> tonic::service::Routes {
        let s = &self.shared;
        let routes = tonic::service::Routes::new(XdsGrpc::<Ads>::new(s.clone()))
            .add_service(XdsGrpc::<Lds>::new(s.clone()))
            .add_service(XdsGrpc::<Rds>::new(s.clone()))
            .add_service(XdsGrpc::<Cds>::new(s.clone()))
            .add_service(XdsGrpc::<Eds>::new(s.clone()))
            .add_service(XdsGrpc::<Sds>::new(s.clone()))
            .add_service(XdsGrpc::<Rtds>::new(s.clone()))
            .add_service(XdsGrpc::<Vhds>::new(s.clone()))
            .add_service(XdsGrpc::<Srds>::new(s.clone()))
            .add_service(XdsGrpc::<Ecds>::new(s.clone()));
        if !s.csds {
            return routes;
        }
        routes.add_service(ClientStatusDiscoveryServiceServer::new(csds::Csds::new(
            s.registry.clone(),
            s.identity_template.clone(),
        )))
    }

    /// Serves on `listener` (plain TCP) until `shutdown` resolves; then drains: nothing more
    /// is accepted, and open connections are closed (their streams end with `UNAVAILABLE`,
    /// clients reconnect elsewhere) spread over the drain window.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()> {
        let incoming = async_stream_of(listener);
        self.serve_incoming(incoming, shutdown).await
    }

    /// Like [`Self::serve`], on connections someone else accepts — the TLS listener's — each
    /// with the [`PeerInfo`] that says who the client is.
    pub async fn serve_incoming<IO, E>(
        &self,
        incoming: impl tokio_stream::Stream<Item = Result<(IO, PeerInfo), E>>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> std::io::Result<()>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
        E: std::fmt::Display,
    {
        connections::serve(
            self.routes(),
            incoming,
            shutdown,
            self.connections.clone(),
            self.shared.metrics.clone(),
        )
        .await
    }
}

/// A plain TCP listener's connections, with their remote addresses.
fn async_stream_of(
    listener: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<(tokio::net::TcpStream, PeerInfo)>> {
    tokio_stream::StreamExt::map(
        tokio_stream::wrappers::TcpListenerStream::new(listener),
        |accepted| {
            let stream = accepted?;
            let _ = stream.set_nodelay(true);
            let info = PeerInfo {
                remote_addr: stream.peer_addr().ok(),
                identity: None,
                certificate: None,
            };
            Ok((stream, info))
        },
    )
}
