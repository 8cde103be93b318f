//! Certificates that follow their files. cert-manager and SPIFFE agents rotate them often
//! (hourly), by rewriting or by swapping symlinks; a poll that compares contents sees both.
//! A new set is checked whole — certificate, key, that they belong together, the CA bundle —
//! before it replaces the old one; a bad one is logged and the old one kept. Handshakes read
//! the current set; established connections keep theirs, except that the certificates the
//! current revocation lists revoke are published ([`Reloader::revoked`]) and the connections
//! that presented one are closed.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, bail};
use notify::{PollWatcher, RecursiveMode, Watcher};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use tokio::sync::watch;
use tracing::{info, warn};
use vxds_xds::{CertificateId, RevokedCertificates};
use x509_parser::prelude::FromDer;
use x509_parser::revocation_list::CertificateRevocationList;

use super::TlsFiles;

/// What one load of the files produced.
struct Material {
    cert: Arc<CertifiedKey>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    revoked: RevokedCertificates,
}

struct Current {
    what: &'static str,
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    cert: RwLock<Arc<CertifiedKey>>,
    verifier: RwLock<Option<Arc<dyn ClientCertVerifier>>>,
    revoked: watch::Sender<Arc<RevokedCertificates>>,
}

/// Follows one listener's TLS files; stops when dropped.
pub struct Reloader {
    current: Arc<Current>,
    _watcher: PollWatcher,
}

impl fmt::Debug for Reloader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloader")
            .field("what", &self.current.what)
            .field("files", &self.current.files)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// Loads the files (an error names the file and the reason) and starts following them.
    pub fn start(
        what: &'static str,
        files: TlsFiles,
        provider: Arc<CryptoProvider>,
        interval: Duration,
    ) -> anyhow::Result<Self> {
        let material = load(&files, &provider).with_context(|| format!("{what} TLS"))?;
        let current = Arc::new(Current {
            what,
            files: files.clone(),
            provider,
            cert: RwLock::new(material.cert),
            verifier: RwLock::new(material.verifier),
            revoked: watch::Sender::new(Arc::new(material.revoked)),
        });
        let on_change = {
            let current = current.clone();
            move |event: notify::Result<notify::Event>| {
                if let Ok(event) = event
                    && matches!(event.kind, notify::EventKind::Access(_))
                {
                    return;
                }
                current.reload();
            }
        };
        let config = notify::Config::default()
            .with_poll_interval(interval)
            .with_compare_contents(true);
        let mut watcher = PollWatcher::new(on_change, config)
            .with_context(|| format!("watching the {what} TLS files"))?;
        for path in [
            Some(&files.cert),
            Some(&files.key),
            files.client_ca.as_ref(),
            files.client_crl.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            watcher
                .watch(path, RecursiveMode::NonRecursive)
                .with_context(|| format!("watching {}", path.display()))?;
        }
        Ok(Self {
            current,
            _watcher: watcher,
        })
    }

    /// What handshakes take their certificate from.
    pub fn cert_resolver(&self) -> Arc<dyn ResolvesServerCert> {
        Arc::new(CertResolver(self.current.clone()))
    }

    /// The client certificates the current revocation lists revoke, updated at each reload
    /// (empty without lists).
    pub fn revoked(&self) -> watch::Receiver<Arc<RevokedCertificates>> {
        self.current.revoked.subscribe()
    }

    /// What verifies client certificates, when the files include a CA bundle.
    pub fn client_verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.current.files.client_ca.as_ref()?;
        Some(Arc::new(ClientVerifier(self.current.clone())))
    }
}

impl Current {
    fn reload(&self) {
        match load(&self.files, &self.provider) {
            Ok(material) => {
                if let Ok(mut cert) = self.cert.write() {
                    *cert = material.cert;
                }
                if let Ok(mut verifier) = self.verifier.write() {
                    *verifier = material.verifier;
                }
                // After the verifier: a revoked certificate can no longer reconnect when its
                // connection is closed. Connections watch only a change of the set.
                self.revoked.send_if_modified(|revoked| {
                    let changed = **revoked != material.revoked;
                    if changed {
                        *revoked = Arc::new(material.revoked);
                    }
                    changed
                });
                info!(what = self.what, cert = %self.files.cert.display(), "TLS files reloaded; new handshakes use them");
            }
            // Mid-rotation (the certificate written, the key not yet) or a bad file: keep
            // serving with what works. The next change is tried again.
            Err(e) => warn!(
                what = self.what,
                error = format!("{e:#}"),
                "the new TLS files are not usable; keeping the previous ones"
            ),
        }
    }

    fn cert(&self) -> Option<Arc<CertifiedKey>> {
        self.cert.read().ok().map(|c| c.clone())
    }

    fn verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.verifier.read().ok().and_then(|v| v.clone())
    }
}

fn load(files: &TlsFiles, provider: &Arc<CryptoProvider>) -> anyhow::Result<Material> {
    let chain = read_certs(&files.cert)?;
    let key = read(&files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key).with_context(|| {
        format!(
            "{}: no private key (expected a PEM `PRIVATE KEY`, `RSA PRIVATE KEY` or `EC PRIVATE KEY` block)",
            files.key.display()
        )
    })?;
    let cert = CertifiedKey::from_der(chain, key, provider).with_context(|| {
        format!(
            "the key in {} does not fit the certificate in {}",
            files.key.display(),
            files.cert.display()
        )
    })?;
    let mut revoked = RevokedCertificates::default();
    let verifier = match &files.client_ca {
        None => None,
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for ca in read_certs(path)? {
                roots.add(ca).with_context(|| {
                    format!("{}: a CA certificate is not usable", path.display())
                })?;
            }
            let mut builder =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            if let Some(crl_path) = &files.client_crl {
                let crls = rustls::pki_types::CertificateRevocationListDer::pem_slice_iter(&read(
                    crl_path,
                )?)
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("{}: not PEM X509 CRLs", crl_path.display()))?;
                anyhow::ensure!(
                    !crls.is_empty(),
                    "{}: no X509 CRL in it",
                    crl_path.display()
                );
                for der in &crls {
                    let (_, crl) =
                        CertificateRevocationList::from_der(der.as_ref()).map_err(|e| {
                            anyhow::anyhow!("{}: a CRL does not parse: {e}", crl_path.display())
                        })?;
                    let issuer = crl.issuer().as_raw();
                    revoked.0.extend(
                        crl.iter_revoked_certificates()
                            .map(|r| CertificateId::new(issuer, r.raw_serial())),
                    );
                }
                // The client's own certificate is checked against the lists of the CAs that
                // issued them; one from a CA no list covers is let through (a bundle may hold
                // CAs that publish no list).
                builder = builder
                    .with_crls(crls)
                    .only_check_end_entity_revocation()
                    .allow_unknown_revocation_status();
            }
            let verifier = builder
                .build()
                .with_context(|| format!("{}: not a usable CA bundle or CRL", path.display()))?;
            Some(verifier)
        }
    };
    Ok(Material {
        cert: Arc::new(cert),
        verifier,
        revoked,
    })
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{}: not PEM", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{}: no certificate (expected PEM `CERTIFICATE` blocks)",
            path.display()
        );
    }
    Ok(certs)
}

struct CertResolver(Arc<Current>);

impl fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CertResolver")
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.cert()
    }
}

/// The current CA bundle's verifier. It sends no CA names in its request: clients present
/// their one certificate anyway, and the names would have to outlive a reload.
struct ClientVerifier(Arc<Current>);

impl fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClientVerifier")
    }
}

impl ClientVerifier {
    fn current(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.0
            .verifier()
            .ok_or_else(|| rustls::Error::General("no client CA bundle is loaded".into()))
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0
            .provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
