//! Accepted TCP connections made TLS connections. Each handshake runs in its own task with a
//! deadline, so a client that connects and says nothing holds up no one else's; what comes out
//! carries the client certificate's names for the xDS server (which puts the connection's
//! [`PeerInfo`] in every request's extensions).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tracing::debug;
use vxds_xds::{PeerIdentity, PeerInfo};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// How long a client has to finish its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once; past it, accepting waits. Connections that never finish a
/// handshake cannot pile up beyond it (each holds a file descriptor for up to the timeout).
pub const MAX_HANDSHAKES: usize = 1024;

/// A TLS connection and who is at the other end.
pub type TlsConn = (TlsStream<TcpStream>, PeerInfo);

/// The names in a client certificate (none when it sent none, or on a parse failure — the
/// certificate was verified already, so the latter does not happen in practice).
fn peer_identity(stream: &TlsStream<TcpStream>) -> Option<PeerIdentity> {
    let der = stream.get_ref().1.peer_certificates()?.first()?;
    let (_, cert) = X509Certificate::from_der(der).ok()?;
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
    Some(identity)
}

/// The connections `listener` accepts, after their TLS handshake; ends when the stream is
/// dropped. A failed handshake (no certificate, an untrusted one, a port scan) is logged and
/// costs nothing else.
pub fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> ReceiverStream<io::Result<TlsConn>> {
    let (tx, rx) = mpsc::channel(64);
    let handshakes = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = handshakes.clone().acquire_owned().await else {
                return;
            };
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
            let _ = stream.set_nodelay(true);
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            tokio::spawn(async move {
                let handshake = handshake(&acceptor, stream, remote).await;
                drop(permit);
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
    let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream))
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
    let info = PeerInfo {
        remote_addr: Some(remote),
        identity: peer_identity(&stream),
    };
    Ok((stream, info))
}
