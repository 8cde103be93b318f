//! The ADS server: xDS over gRPC, SotW and Delta, for Envoy and proxyless gRPC clients.
//!
//! - [`machine`]: one stream's state machine — subscriptions, TP2 variant matching, the
//!   protocol rules, make-before-break pushes. Pure; tested without sockets.
//! - [`registry`]: connected streams and what they subscribe to; the dispatcher that turns a
//!   new index snapshot into work for exactly the streams it concerns.
//! - [`service`]: the gRPC services (ADS and the nine per-type ones, from one generic
//!   implementation), a task per stream, bounded queues.
//! - [`wire`]: responses encoded around the variants' shared bytes.
//! - [`csds`], [`status`]: what the server knows of each client; [`metrics`]: Prometheus.
//!
//! It reads only the in-memory index, never the database.
#![forbid(unsafe_code)]

pub mod csds;
pub mod identity;
pub mod machine;
pub mod metrics;
pub mod params;
pub mod registry;
mod service;
pub mod status;
pub mod types;
pub mod wire;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use vxds_envoy::pb::envoy::service::status::v3::client_status_discovery_service_server::ClientStatusDiscoveryServiceServer;
use vxds_store::Index;

pub use identity::{PeerIdentity, PeerInfo};
pub use machine::MachineConfig;
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
    /// Concurrent streams one HTTP/2 connection may open.
    pub max_concurrent_streams: u32,
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
            // Envoy and gRPC open one ADS stream per connection; per-type services a few.
            max_concurrent_streams: 64,
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

/// The xDS server. Dropping it stops the dispatcher.
#[derive(Debug)]
pub struct XdsServer {
    shared: Arc<Shared>,
    dispatcher: JoinHandle<()>,
}

impl Drop for XdsServer {
    fn drop(&mut self) {
        self.dispatcher.abort();
    }
}

impl XdsServer {
    /// Serves `index`; starts the dispatcher that follows it.
    pub fn new(index: Index, config: XdsConfig, metrics: Arc<XdsMetrics>) -> Self {
        let registry = Arc::new(Registry::new(index.snapshot()));
        let dispatcher = tokio::spawn(registry::dispatch_changes(index.clone(), registry.clone()));
        let shared = Arc::new(Shared {
            registry,
            machine: Arc::new(config.machine),
            metrics,
            max_request_bytes: config.max_request_bytes,
            max_response_bytes: config.max_response_bytes,
            queue_depth: config.queue_depth.max(1),
            csds: config.csds,
            max_concurrent_streams: config.max_concurrent_streams.max(1),
            identity_template: config.identity_template,
            closing: tokio::sync::watch::channel(false).0,
        });
        Self { shared, dispatcher }
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

    /// Serves on `listener` (plain TCP) until `shutdown` resolves; then open streams are ended
    /// with `UNAVAILABLE` (clients reconnect) and the server finishes.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error> {
        self.serve_incoming(TcpListenerStream::new(listener), shutdown)
            .await
    }

    /// Like [`Self::serve`], on connections someone else accepts: the TLS listener's, whose
    /// [`PeerInfo`] says who each client is.
    pub async fn serve_incoming<IO, IE>(
        &self,
        incoming: impl tokio_stream::Stream<Item = Result<IO, IE>>,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<(), tonic::transport::Error>
    where
        IO: tokio::io::AsyncRead
            + tokio::io::AsyncWrite
            + tonic::transport::server::Connected
            + Unpin
            + Send
            + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let shared = self.shared.clone();
        let shutdown = async move {
            shutdown.await;
            shared.closing.send_replace(true);
        };
        tonic::transport::Server::builder()
            .max_concurrent_streams(Some(self.shared.max_concurrent_streams))
            .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
            .add_routes(self.routes())
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
    }
}
