//! Accepted TCP connections made TLS connections. Each handshake runs in its own task with a
//! deadline, so a client that connects and says nothing holds up no one else's; what comes out
//! carries the client certificate's names for the xDS server (which puts the connection's
//! [`PeerInfo`] in every request's extensions).
//!
//! No cheap stall (issue 22): the accept loop never waits for anything but `accept()`.
//! Handshakes in progress are bounded, [`MAX_HANDSHAKES`] in all and
//! [`MAX_HANDSHAKES_PER_SOURCE`] per source address; a connection past either bound is closed
//! at once rather than queued. A client must send its whole ClientHello within
//! [`CLIENT_HELLO_TIMEOUT`] and finish the handshake within [`HANDSHAKE_TIMEOUT`], so a socket
//! that says nothing holds its slot for two seconds at most.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tracing::debug;
use vxds_xds::{CertificateId, PeerIdentity, PeerInfo};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// How long a client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client has, from connecting, to send its whole ClientHello: a real client sends
/// it at once; a socket that says nothing is closed after this.
pub const CLIENT_HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// Handshakes in progress at once; past it, new connections are closed at once (the client
/// retries). Connections that never finish a handshake cannot pile up beyond it.
pub const MAX_HANDSHAKES: usize = 1024;

/// Handshakes in progress at once from one source address; past it, that address's new
/// connections are closed at once, so one host cannot take every slot.
pub const MAX_HANDSHAKES_PER_SOURCE: usize = 64;

/// Handshake slots: one per connection in its handshake, counted in all and per source.
#[derive(Clone, Debug)]
pub struct HandshakeSlots {
    global: Arc<tokio::sync::Semaphore>,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
    per_source_limit: usize,
}

/// A taken slot; dropping it frees it.
pub struct HandshakeSlot {
    _global: tokio::sync::OwnedSemaphorePermit,
    source: IpAddr,
    per_source: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        if let Ok(mut counts) = self.per_source.lock()
            && let Some(count) = counts.get_mut(&self.source)
        {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.source);
            }
        }
    }
}

impl HandshakeSlots {
    pub fn new(global: usize, per_source: usize) -> Self {
        Self {
            global: Arc::new(tokio::sync::Semaphore::new(global)),
            per_source: Arc::default(),
            per_source_limit: per_source,
        }
    }

    /// A slot for a handshake from `source`, or `None` at once when either bound is reached.
    pub fn try_take(&self, source: IpAddr) -> Option<HandshakeSlot> {
        let mut counts = self.per_source.lock().ok()?;
        let count = counts.entry(source).or_insert(0);
        if *count >= self.per_source_limit {
            return None;
        }
        let permit = self.global.clone().try_acquire_owned().ok()?;
        *count += 1;
        Some(HandshakeSlot {
            _global: permit,
            source,
            per_source: self.per_source.clone(),
        })
    }
}

/// A TLS connection and who is at the other end.
pub type TlsConn = (TlsStream<TcpStream>, PeerInfo);

/// The names in a client certificate and its issuer and serial number (none when it sent
/// none, or on a parse failure — the certificate was verified already, so the latter does not
/// happen in practice).
fn peer_identity(stream: &TlsStream<TcpStream>) -> Option<(PeerIdentity, CertificateId)> {
    let der = stream.get_ref().1.peer_certificates()?.first()?;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let id = CertificateId::new(cert.issuer().as_raw(), cert.raw_serial());
    let mut identity = PeerIdentity::default();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::URI(uri) => identity.uri_sans.push((*uri).to_owned()),
                // DNS names compare case-insensitively; templates see one spelling.
                GeneralName::DNSName(dns) => identity.dns_sans.push(dns.to_ascii_lowercase()),
                _ => {}
            }
        }
    }
    Some((identity, id))
}

/// The connections `listener` accepts, after their TLS handshake; ends when the stream is
/// dropped. A failed handshake (no certificate, an untrusted one, a port scan) is logged and
/// costs nothing else.
pub fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> ReceiverStream<io::Result<TlsConn>> {
    let slots = HandshakeSlots::new(MAX_HANDSHAKES, MAX_HANDSHAKES_PER_SOURCE);
    incoming_with(listener, acceptor, slots)
}

/// [`incoming`] with its handshake bounds.
fn incoming_with(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    slots: HandshakeSlots,
) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let (stream, remote) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait a moment, keep serving.
                        tracing::warn!(error = %e, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            // Past either bound, shed at once: waiting would let idle sockets stall everyone.
            let Some(slot) = slots.try_take(remote.ip()) else {
                debug!(%remote, "too many TLS handshakes in progress; connection closed");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let handshake = handshake(&acceptor, stream, remote).await;
                drop(slot);
                match handshake {
                    Ok(conn) => {
                        // The receiver gone means the server stopped: the connection just closes.
                        let _ = tx.send(Ok(conn)).await;
                    }
                    Err(e) => debug!(%remote, error = %e, "TLS handshake failed"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

pub async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    remote: SocketAddr,
) -> io::Result<TlsConn> {
    let finish = async {
        let start = tokio_rustls::LazyConfigAcceptor::new(
            tokio_rustls::rustls::server::Acceptor::default(),
            stream,
        );
        let hello = tokio::time::timeout(CLIENT_HELLO_TIMEOUT, start)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "no ClientHello in time"))??;
        hello.into_stream(acceptor.config().clone()).await
    };
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, finish)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    let (identity, certificate) = peer_identity(&stream).unzip();
    let info = PeerInfo {
        remote_addr: Some(remote),
        identity,
        certificate,
    };
    Ok((stream, info))
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio_rustls::rustls;
    use tokio_stream::StreamExt;

    use super::*;

    #[test]
    fn slots_are_bounded_in_all_and_per_source() {
        let slots = HandshakeSlots::new(3, 2);
        let (a, b, c) = (
            IpAddr::from([10, 0, 0, 1]),
            IpAddr::from([10, 0, 0, 2]),
            IpAddr::from([10, 0, 0, 3]),
        );
        let a1 = slots.try_take(a).unwrap();
        let _a2 = slots.try_take(a).unwrap();
        assert!(slots.try_take(a).is_none(), "per source");
        let _b1 = slots.try_take(b).unwrap();
        assert!(slots.try_take(c).is_none(), "in all");
        drop(a1);
        assert!(slots.try_take(a).is_some(), "a freed slot is taken again");
    }

    /// Idle sockets from one address beyond its bound are closed at once, and a client from
    /// another finishes its handshake while those within the bound are still held open (the
    /// old accept loop waited for a slot before accepting, so it waited for them to time out).
    #[tokio::test]
    async fn idle_sockets_do_not_stall_a_real_client() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let key =
            rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
        let server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut conns = incoming_with(
            listener,
            TlsAcceptor::from(Arc::new(server)),
            HandshakeSlots::new(16, 4),
        );

        // 40 sockets that never say a word, from 127.0.0.2.
        let mut idle = Vec::new();
        for _ in 0..40 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
            idle.push(socket.connect(addr).await.unwrap());
        }
        // Those past the bound of 4 are closed without waiting for any deadline.
        let mut closed = 0;
        for socket in &mut idle[4..] {
            let mut byte = [0u8; 1];
            if matches!(socket.read(&mut byte).await, Ok(0) | Err(_)) {
                closed += 1;
            }
        }
        assert_eq!(closed, 36);

        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.cert.der().clone()).unwrap();
        let client = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let _tls = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(name, tcp)
            .await
            .unwrap();
        let (_, info) = conns.next().await.unwrap().unwrap();
        assert_eq!(info.remote_addr.unwrap().ip(), IpAddr::from([127, 0, 0, 1]));
        // The four within the bound are still in their handshake: open, not yet timed out.
        for socket in &idle[..4] {
            let mut byte = [0u8; 1];
            assert!(
                matches!(socket.try_read(&mut byte), Err(e) if e.kind() == io::ErrorKind::WouldBlock),
                "an idle socket within the bound was closed before the client got through"
            );
        }
    }
}
