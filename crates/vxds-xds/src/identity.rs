//! Who a client is, as far as the transport can tell: the subject alternative names of the
//! certificate it presented in a mutual-TLS handshake. The TLS layer fills it in; the stream
//! machine records it (and, with an identity template, derives trusted parameters from it).

use serde::Serialize;

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
