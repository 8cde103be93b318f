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
            IdentityMismatch::Missing => Status::permission_denied(
                "this server derives trusted parameters from client certificates, and the \
                 connection carries none with a URI or DNS SAN",
            ),
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
    /// The identity: the first URI SAN (a SPIFFE ID), else the first DNS SAN.
    pub fn identity(&self) -> Option<&str> {
        self.uri_sans
            .first()
            .or_else(|| self.dns_sans.first())
            .map(String::as_str)
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
    fn uri_sans_come_first() {
        let peer = PeerIdentity {
            uri_sans: vec!["spiffe://td/ns/a/sa/b".into()],
            dns_sans: vec!["envoy.a.svc".into()],
        };
        assert_eq!(peer.identity(), Some("spiffe://td/ns/a/sa/b"));
        let dns_only = PeerIdentity {
            dns_sans: vec!["envoy.a.svc".into(), "other".into()],
            ..Default::default()
        };
        assert_eq!(dns_only.identity(), Some("envoy.a.svc"));
        assert_eq!(PeerIdentity::default().identity(), None);
    }
}
