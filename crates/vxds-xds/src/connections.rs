//! The xDS listener's connections: HTTP/2 served by hyper around the gRPC routes, with what a
//! fleet of proxies needs of a control plane's connections.
//!
//! - **Keepalive**: the server pings every `keepalive_interval` and closes a connection whose
//!   peer does not answer within `keepalive_timeout`, so a proxy whose host vanished (no FIN)
//!   frees its stream and state within interval + timeout. A peer that connects and sends
//!   nothing (no HTTP/2 preface, so no pings either) is closed after `keepalive_timeout`.
//! - **Maximum age** (gRPC's MAX_CONNECTION_AGE): after `max_age`, ±10 % so that connections
//!   made together do not all leave together, a connection is closed gracefully: its streams
//!   end with `UNAVAILABLE` and a GOAWAY stops new ones, so clients reconnect — through the load
//!   balancer, to any replica — and load re-spreads after replicas are added. A connection
//!   still open `max_age_grace` later is cut.
//! - **Revocation**: when the listener's TLS re-reads its certificate revocation lists
//!   (`--xds-client-crl`, checked every couple of seconds) and they now revoke the certificate a
//!   connection's client presented (by issuer and serial number), the connection is closed the
//!   same way, its streams ending with `PERMISSION_DENIED`; new handshakes with that
//!   certificate are refused by the TLS layer itself.
//! - **Drain**: when the server stops, it accepts nothing more and closes every connection the
//!   same way, each at its own moment spread over the drain window, so proxies move to other
//!   replicas without a thundering herd.
//!
//! Each request carries the connection's [`PeerInfo`] and its [`ConnectionClosing`] signal in
//! its extensions; a stream ends when its connection closes.

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio_stream::{Stream, StreamExt};
use tracing::{debug, info};

use crate::identity::PeerInfo;
use crate::metrics::{ClosedLabels, XdsMetrics};
use crate::woken::WhenWoken;

/// How the server treats its connections.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// Server pings; `None` sends none.
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// Close connections this old (±10 %); `None` keeps them for ever.
    pub max_age: Option<Duration>,
    /// How long a closing connection's streams have to finish before it is cut.
    pub max_age_grace: Duration,
    /// Closes spread over this long when the server drains; zero closes all at once.
    pub drain_window: Duration,
    /// How long a connection closed by the drain has for its streams before it is cut.
    pub drain_grace: Duration,
    /// Concurrent streams one connection may open.
    pub max_concurrent_streams: u32,
    /// The client certificates revoked now, republished by the TLS layer at each reload of its
    /// revocation lists; a connection whose certificate appears is closed. `None`: no lists.
    pub revoked: Option<watch::Receiver<Arc<RevokedCertificates>>>,
}

/// A certificate as a revocation list names it: its issuer (the DER of the issuer's name) and
/// its serial number (big-endian, without leading zero bytes).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CertificateId {
    pub issuer: Vec<u8>,
    pub serial: Vec<u8>,
}

impl CertificateId {
    /// From the raw DER of the issuer's name and the serial's content octets.
    pub fn new(issuer: &[u8], serial: &[u8]) -> Self {
        let start = serial.iter().position(|b| *b != 0).unwrap_or(serial.len());
        Self {
            issuer: issuer.to_vec(),
            serial: serial[start..].to_vec(),
        }
    }
}

/// The certificates the current revocation lists revoke.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevokedCertificates(pub BTreeSet<CertificateId>);

impl RevokedCertificates {
    pub fn contains(&self, certificate: &CertificateId) -> bool {
        self.0.contains(certificate)
    }
}

impl Default for ConnectionConfig {
    fn default() -> Self {
        Self {
            keepalive_interval: Some(Duration::from_secs(30)),
            keepalive_timeout: Duration::from_secs(10),
            max_age: None,
            max_age_grace: Duration::from_secs(30),
            drain_window: Duration::ZERO,
            drain_grace: Duration::from_secs(10),
            // Envoy and gRPC open one ADS stream per connection; per-type services a few.
            max_concurrent_streams: 64,
            revoked: None,
        }
    }
}

/// Set when a stream's connection is closing (maximum age, drain): the stream ends with
/// `UNAVAILABLE` so that its client reconnects.
#[derive(Clone, Debug)]
pub struct ConnectionClosing(pub watch::Receiver<Option<&'static str>>);

impl ConnectionClosing {
    /// Resolves with why the connection closes, once it does.
    pub async fn closed(&mut self) -> &'static str {
        match self.0.wait_for(Option::is_some).await {
            Ok(reason) => reason.unwrap_or("closing"),
            // The connection task is gone: so is the connection.
            Err(_) => "closed",
        }
    }
}

/// Serves `routes` on every connection `incoming` yields, until `stop` resolves; then drains.
pub(crate) async fn serve<IO, E>(
    routes: tonic::service::Routes,
    incoming: impl Stream<Item = Result<(IO, PeerInfo), E>>,
    stop: impl Future<Output = ()>,
    config: ConnectionConfig,
    metrics: Arc<XdsMetrics>,
) -> io::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    E: std::fmt::Display,
{
    let routes = routes.prepare();
    let config = Arc::new(config);
    // Tells every connection when the server drains.
    let (drain, draining) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let counter = AtomicU64::new(0);
    // Boxed, to be dropped (the listener closed) the moment the drain starts.
    let mut incoming = Box::pin(incoming);
    let mut stop = pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = incoming.next() => accepted,
            () = &mut stop => break,
            // Reap finished connection tasks as they go.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (io, info) = match accepted {
            Some(Ok(accepted)) => accepted,
            Some(Err(e)) => {
                // Out of file descriptors and the like: wait a moment rather than spin.
                tracing::warn!(error = %e, "accepting an xDS connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            None => break,
        };
        let n = counter.fetch_add(1, Ordering::Relaxed);
        connections.spawn(serve_connection(
            io,
            info,
            n,
            routes.clone(),
            config.clone(),
            draining.clone(),
            metrics.clone(),
        ));
    }
    drop(incoming);
    info!(
        connections = connections.len(),
        window = ?config.drain_window,
        "xDS server draining: no new connections; open ones close spread over the window"
    );
    metrics.draining.set(1);
    let _ = drain.send(true);
    while connections.join_next().await.is_some() {}
    info!("xDS server drained");
    Ok(())
}

/// A fraction in (0, 1) that spreads connection `n`'s moments (golden-ratio sequence: evenly
/// spread, whatever the count; never 0, so no connection closes the instant a drain starts).
fn spread(n: u64) -> f64 {
    ((n + 1) as f64 * 0.618_033_988_749_895).fract()
}

async fn serve_connection<IO>(
    io: IO,
    info: PeerInfo,
    n: u64,
    routes: tonic::service::Routes,
    config: Arc<ConnectionConfig>,
    mut draining: watch::Receiver<bool>,
    metrics: Arc<XdsMetrics>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // HTTP/2 pings only start once the client's preface arrives: a peer that connects and
    // says nothing would hold its connection forever.
    let heard = Arc::new(AtomicBool::new(false));
    let io = Heard {
        io,
        heard: heard.clone(),
    };
    let (closing, closing_rx) = watch::channel(None);
    let certificate = info.certificate.clone();
    let remote = info.remote_addr;
    let extensions = (
        info,
        ConnectionClosing(closing_rx),
        crate::service::FetchBudget::default(),
    );
    let service = tower::service_fn(move |mut request: http::Request<hyper::body::Incoming>| {
        request.extensions_mut().insert(extensions.0.clone());
        request.extensions_mut().insert(extensions.1.clone());
        request.extensions_mut().insert(extensions.2.clone());
        let mut routes = routes.clone();
        async move {
            let response = tower::Service::call(&mut routes, request).await;
            Ok::<_, Infallible>(response.unwrap_or_else(|never| match never {}))
        }
    });
    let mut builder = http2::Builder::new(TokioExecutor::new());
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.max_concurrent_streams.max(1))
        .keep_alive_interval(config.keepalive_interval)
        .keep_alive_timeout(config.keepalive_timeout);
    let connection = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    let mut connection = pin!(connection);
    metrics.connections.inc();
    let _gauge = scopeguard(|| {
        metrics.connections.dec();
    });

    let age = config.max_age.map(|age| age.mul_f64(0.9 + 0.2 * spread(n)));
    let drain_delay = config.drain_window.mul_f64(spread(n));
    // What closes the connection besides its peer, in one future polled only when one of
    // them woke it (`WhenWoken`): the connection's task wakes for every frame, and a select
    // polls all its branches each time — a timer, a watch and the revocation lists, per frame.
    let watchdogs = WhenWoken::new(async {
        tokio::select! {
            () = async {
                tokio::time::sleep(config.keepalive_timeout).await;
                if heard.load(Ordering::Relaxed) {
                    std::future::pending::<()>().await;
                }
            } => "silent",
            () = async {
                match age {
                    Some(age) => tokio::time::sleep(age).await,
                    None => std::future::pending().await,
                }
            } => "max_age",
            () = async {
                let _ = draining.wait_for(|d| *d).await;
                tokio::time::sleep(drain_delay).await;
            } => "drain",
            () = until_revoked(config.revoked.clone(), certificate) => {
                info!(
                    remote = ?remote,
                    "a client certificate was revoked (the reloaded CRL lists it); its connection is closed"
                );
                "revoked"
            }
        }
    });
    // The watchdogs first: not woken, they cost a flag's read; woken, they get the task's
    // fresh coop budget, which a flooding peer's connection would spend in full on every poll.
    let reason = tokio::select! {
        biased;
        reason = watchdogs => reason,
        result = connection.as_mut() => {
            let reason = match &result {
                Ok(()) => "client",
                Err(e) if e.is_timeout() => "keepalive",
                Err(_) => "error",
            };
            metrics.connections_closed.get_or_create(&ClosedLabels { reason }).inc();
            if let Err(e) = result {
                debug!(error = %e, "an xDS connection ended with an error (a keepalive timeout, or a reset)");
            }
            return;
        }
    };
    if reason == "silent" {
        metrics
            .connections_closed
            .get_or_create(&ClosedLabels { reason })
            .inc();
        debug!("an xDS connection sent nothing within the keepalive timeout; closed");
        return;
    }
    // Streams end with UNAVAILABLE (clients reconnect; PERMISSION_DENIED when revoked); GOAWAY
    // refuses new ones; the connection closes when its streams are done, or is cut after the
    // grace period.
    let _ = closing.send(Some(reason));
    connection.as_mut().graceful_shutdown();
    metrics
        .connections_closed
        .get_or_create(&ClosedLabels { reason })
        .inc();
    let grace = match reason {
        "drain" => config.drain_grace,
        _ => config.max_age_grace,
    };
    if tokio::time::timeout(grace, connection.as_mut())
        .await
        .is_err()
    {
        debug!(
            ?grace,
            reason, "a closing xDS connection outlived its grace period; cut"
        );
    }
}

/// Resolves once `revoked` lists `certificate` (at once if it does already: the lists may have
/// been reloaded during the handshake); never without either.
async fn until_revoked(
    revoked: Option<watch::Receiver<Arc<RevokedCertificates>>>,
    certificate: Option<CertificateId>,
) {
    let (Some(mut revoked), Some(certificate)) = (revoked, certificate) else {
        return std::future::pending().await;
    };
    loop {
        if revoked.borrow_and_update().contains(&certificate) {
            return;
        }
        if revoked.changed().await.is_err() {
            // The lists are no longer followed: nothing more will be revoked.
            return std::future::pending().await;
        }
    }
}

/// A connection's transport that notes when the peer first sends something.
struct Heard<IO> {
    io: IO,
    heard: Arc<AtomicBool>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Heard<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.heard.store(true, Ordering::Relaxed);
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Heard<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Runs `f` when dropped, however the function returns.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
