//! Who a client is, as far as the transport can tell: the subject alternative names of the
//! certificate it presented in a mutual-TLS handshake. The TLS layer fills it in (a
//! [`PeerInfo`] in each request's extensions); the service turns it into trusted parameters
//! with the identity template, or refuses the stream; the stream machine records it.

use std::net::SocketAddr;

use serde::Serialize;
use tonic::Status;
use vxds_core::{IdentityMismatch, IdentityTemplate, ParamSet};

/// What the transport knows of a connection; the TLS listener's connections carry it.
#[derive(Clone, Debug, Default)]
pub struct PeerInfo {
    pub remote_addr: Option<SocketAddr>,
    /// The client certificate's names; `None` without one (plain TCP, or TLS without mTLS).
    pub identity: Option<PeerIdentity>,
    /// Which certificate the client presented, for revocation; `None` without one.
    pub certificate: Option<crate::connections::CertificateId>,
}

/// The parameters a stream may not claim for itself: those its certificate's identity gives
/// through `template`. Without a template, none. A client whose identity does not fit is
/// refused with `PERMISSION_DENIED`: a template is an access-control rule, and a client it
/// cannot place must not fall through to variants meant for nobody in particular.
pub fn trusted_params(
    template: Option<&IdentityTemplate>,
    peer: Option<&PeerIdentity>,
) -> Result<ParamSet, Status> {
    let Some(template) = template else {
        return Ok(ParamSet::new());
    };
    template
        .trusted_params(peer.and_then(PeerIdentity::identity))
        .map_err(|mismatch| match mismatch {
            IdentityMismatch::Missing => Status::permission_denied(match peer {
                Some(peer) if peer.uri_sans.len() > 1 => format!(
                    "the client certificate names {} URI SANs; an identity (a SPIFFE ID) is \
                     exactly one",
                    peer.uri_sans.len()
                ),
                Some(peer) if peer.uri_sans.is_empty() && peer.dns_sans.len() > 1 => format!(
                    "the client certificate has no URI SAN and {} DNS SANs; the DNS fallback \
                     takes a certificate with exactly one",
                    peer.dns_sans.len()
                ),
                _ => "this server derives trusted parameters from client certificates, and the \
                      connection carries none with a URI or DNS SAN"
                    .to_owned(),
            }),
            IdentityMismatch::NoMatch { .. } | IdentityMismatch::Ambiguous { .. } => {
                Status::permission_denied(mismatch.to_string())
            }
        })
}

/// A client certificate's names.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PeerIdentity {
    /// URI SANs, in certificate order (a SPIFFE ID is one).
    pub uri_sans: Vec<String>,
    /// DNS SANs, in certificate order.
    pub dns_sans: Vec<String>,
}

impl PeerIdentity {
    /// The identity: the URI SAN (a SPIFFE ID), if there is exactly one; else, when there is
    /// no URI SAN, the DNS SAN if there is exactly one. A certificate with several has none:
    /// SPIFFE's X509-SVID (§2) says validators must reject more than one URI SAN, and taking
    /// the first of several names would let whoever ordered them choose the identity.
    pub fn identity(&self) -> Option<&str> {
        match (self.uri_sans.as_slice(), self.dns_sans.as_slice()) {
            ([uri], _) => Some(uri),
            ([], [dns]) => Some(dns),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_outside_the_template_are_denied() {
        let template =
            IdentityTemplate::parse("spiffe://{trust_domain}/ns/{namespace}/sa/{sa}").unwrap();
        let peer = |uri: &str| PeerIdentity {
            uri_sans: vec![uri.to_owned()],
            dns_sans: vec![],
        };
        let trusted = trusted_params(Some(&template), Some(&peer("spiffe://td/ns/a/sa/b")));
        assert_eq!(
            trusted.unwrap(),
            ParamSet::new()
                .with("trust_domain", "td")
                .with("namespace", "a")
                .with("sa", "b")
        );
        let denied = trusted_params(Some(&template), Some(&peer("spiffe://td/other"))).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("spiffe://td/other"), "{denied:?}");
        let none = trusted_params(Some(&template), None).unwrap_err();
        assert_eq!(none.code(), tonic::Code::PermissionDenied);
        assert_eq!(trusted_params(None, None).unwrap(), ParamSet::new());
    }

    #[test]
    fn one_uri_san_else_one_dns_san() {
        let peer = PeerIdentity {
            uri_sans: vec!["spiffe://td/ns/a/sa/b".into()],
            dns_sans: vec!["envoy.a.svc".into(), "other".into()],
        };
        assert_eq!(peer.identity(), Some("spiffe://td/ns/a/sa/b"));
        let dns_only = PeerIdentity {
            dns_sans: vec!["envoy.a.svc".into()],
            ..Default::default()
        };
        assert_eq!(dns_only.identity(), Some("envoy.a.svc"));
        assert_eq!(PeerIdentity::default().identity(), None);

        // Several URI SANs: no identity, whatever their order; refused under a template.
        let template =
            IdentityTemplate::parse("spiffe://{trust_domain}/ns/{namespace}/sa/{sa}").unwrap();
        let two_uris = PeerIdentity {
            uri_sans: vec![
                "spiffe://td/ns/b/sa/x".into(),
                "spiffe://td/ns/a/sa/x".into(),
            ],
            dns_sans: vec![],
        };
        assert_eq!(two_uris.identity(), None);
        let denied = trusted_params(Some(&template), Some(&two_uris)).unwrap_err();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        assert!(denied.message().contains("2 URI SANs"), "{denied:?}");
        // The DNS fallback only with exactly one DNS SAN.
        let two_dns = PeerIdentity {
            uri_sans: vec![],
            dns_sans: vec!["b.svc".into(), "a.svc".into()],
        };
        assert_eq!(two_dns.identity(), None);
        let dns_template = IdentityTemplate::parse("{namespace}.svc").unwrap();
        let denied = trusted_params(Some(&dns_template), Some(&two_dns)).unwrap_err();
        assert!(denied.message().contains("2 DNS SANs"), "{denied:?}");
    }
}
