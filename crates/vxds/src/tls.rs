//! TLS for both listeners (rustls, ring): the server's certificate and key, and for mutual TLS
//! the CA bundle client certificates must chain to, all re-read when their files change
//! ([`reload`]); the handshakes, off the accept loop, and the client's identity handed to the
//! xDS server with each connection ([`incoming`]).

mod incoming;
mod reload;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

pub use incoming::{handshake, incoming};
pub use reload::Reloader;

/// The files one listener's TLS is made of.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// PEM: the certificate, then its chain.
    pub cert: PathBuf,
    /// PEM: the private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// PEM: the CAs client certificates must chain to; set, client certificates are required.
    pub client_ca: Option<PathBuf>,
    /// PEM: certificate revocation lists; a client certificate they revoke is refused.
    pub client_crl: Option<PathBuf>,
}

/// A listener's TLS: the acceptor, and the watcher that keeps its files current (dropped, the
/// files are no longer followed).
pub struct ServerTls {
    pub acceptor: TlsAcceptor,
    /// The client certificates the revocation lists revoke, as they are reloaded.
    pub revoked: tokio::sync::watch::Receiver<Arc<vxds_xds::RevokedCertificates>>,
    _reloader: Reloader,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("reloader", &self._reloader)
            .finish_non_exhaustive()
    }
}

/// How often certificate files are compared with what was loaded: rotation shows in new
/// handshakes within about this long, and a newly revoked client certificate's connections are
/// closed within about this long.
pub const RELOAD_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

impl ServerTls {
    /// Loads `files` (refusing a missing, empty or mismatched file with the reason) and follows
    /// them. `alpn`: the protocols offered, e.g. `h2` alone for gRPC.
    pub fn load(what: &'static str, files: TlsFiles, alpn: &[&[u8]]) -> anyhow::Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let reloader = Reloader::start(what, files, provider.clone(), RELOAD_INTERVAL)?;
        let builder = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
        let builder = match reloader.client_verifier() {
            Some(verifier) => builder.with_client_cert_verifier(verifier),
            None => builder.with_no_client_auth(),
        };
        let mutual = reloader.client_verifier().is_some();
        let mut config = builder.with_cert_resolver(reloader.cert_resolver());
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        if mutual {
            // A resumed session skips certificate verification: a client whose certificate
            // expired, or whose CA was removed from the bundle, could resume forever.
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            revoked: reloader.revoked(),
            _reloader: reloader,
        })
    }
}
