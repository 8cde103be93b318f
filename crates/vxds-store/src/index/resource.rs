//! A resource as the index holds it, ready to send: [`IndexedResource`], its variants
//! ([`IndexedVariant`]) with their constraints and bodies encoded once, and the matcher that
//! picks one for a subscriber.

use std::sync::Arc;

use bytes::Bytes;
use vxds_core::variants::VariantMatcher;
use vxds_core::{CanonicalConstraints, ConstraintsId, Params};
use vxds_envoy::changeset::ResourceKey;
use vxds_envoy::constraints::constraints_to_proto;

use crate::model::StoredResource;

/// One variant, ready to send.
#[derive(Debug)]
pub struct IndexedVariant {
    pub id: ConstraintsId,
    pub constraints: CanonicalConstraints,
    /// The constraints as sent in `Resource.resource_name` (`DynamicParameterConstraints`),
    /// encoded once for every response that carries them; `None` when unconstrained.
    pub constraints_bytes: Option<Bytes>,
    /// The constraints in the text syntax, for operators; `None` when unconstrained.
    pub constraints_text: Option<Arc<str>>,
    /// The encoded `google.protobuf.Any`.
    pub body: Bytes,
    /// Content hash: the per-resource version clients see. Shared, like the body, by every
    /// stream that holds the variant.
    pub version: Arc<str>,
    /// The TTL clients are sent with it (`Resource.ttl`), kept alive by heartbeats.
    pub ttl: Option<std::time::Duration>,
    /// The body is a TP1 redirect (`xds.core.v3.ResourceLocator`): always sent wrapped.
    pub redirect: bool,
    /// What the body names in other types (RDS, EDS, SDS, clusters), read once here: a
    /// stream keeps what a client's accepted configuration still needs while it refuses an
    /// update, and rollout tracking waits for what the client fetches next. The names are
    /// shared, so that a stream looks them up among what it holds without a copy.
    pub references: Vec<(&'static str, Arc<str>)>,
    /// Whether the constraints hold only for the identities they name; worked out on first
    /// use, for the process's trusted keys (fixed for its life).
    identity_bound: std::sync::OnceLock<bool>,
}

impl IndexedVariant {
    /// Whether only clients whose trusted parameters the constraints name can match this
    /// variant (see [`vxds_core::identity::bound_to_identity`]). `trusted_keys` must be the
    /// same on every call: the answer is kept.
    pub fn identity_bound(&self, trusted_keys: &[String]) -> bool {
        *self.identity_bound.get_or_init(|| {
            vxds_core::identity::bound_to_identity(
                &self.constraints,
                trusted_keys,
                &vxds_core::variants::VariantLimits::DEFAULT,
            )
        })
    }
}

/// A resource: its variants and the matcher that picks one for a subscriber.
#[derive(Debug)]
pub struct IndexedResource {
    /// Its type URL, one allocation shared by every resource of the type in a snapshot.
    pub type_url: Arc<str>,
    /// Its name, shared by the snapshot's map and every stream that tracks the resource.
    pub name: Arc<str>,
    pub version: String,
    /// The revision that last changed it.
    pub revision: u64,
    /// A secret marked shared: served to any client its variants match.
    pub shared: bool,
    pub variants: Vec<IndexedVariant>,
    pub matcher: VariantMatcher,
}

/// What `body` names (see [`vxds_envoy::references`]), its names shared.
fn shared_references(body: &[u8]) -> Vec<(&'static str, Arc<str>)> {
    vxds_envoy::references::of(body)
        .into_iter()
        .map(|(type_url, name)| (type_url, Arc::from(name)))
        .collect()
}

impl IndexedResource {
    /// What identifies it, as the store keys it (a copy).
    pub fn key(&self) -> ResourceKey {
        ResourceKey {
            type_url: (&*self.type_url).into(),
            name: self.name.to_string(),
        }
    }

    /// `stored`, ready to send; `type_url` is its type URL, shared.
    pub(super) fn from_stored(stored: StoredResource, type_url: Arc<str>) -> Self {
        let canonical: Vec<CanonicalConstraints> = stored
            .variants
            .iter()
            .map(|v| v.constraints.clone())
            .collect();
        let matcher = VariantMatcher::new(&canonical);
        let variants = stored
            .variants
            .into_iter()
            .map(|v| {
                let constraints_bytes = constraints_to_proto(v.constraints.constraints())
                    .map(|c| Bytes::from(prost::Message::encode_to_vec(&c)));
                let constrained = !v.constraints.is_unconstrained();
                IndexedVariant {
                    id: v.id,
                    constraints_bytes,
                    constraints_text: constrained.then(|| Arc::from(v.constraints.to_string())),
                    constraints: v.constraints,
                    redirect: vxds_envoy::collections::is_redirect_body(&v.body),
                    references: shared_references(&v.body),
                    body: Bytes::from(v.body),
                    version: Arc::from(v.version),
                    ttl: v.ttl,
                    identity_bound: Default::default(),
                }
            })
            .collect();
        Self {
            type_url,
            name: Arc::from(stored.key.name),
            version: stored.version,
            revision: stored.revision,
            shared: stored.shared,
            variants,
            matcher,
        }
    }

    /// A resource made by the server rather than stored (a list collection built from its
    /// members): one unconstrained variant, which every subscriber resolves to.
    pub fn synthesized(key: ResourceKey, revision: u64, body: Bytes, version: Arc<str>) -> Self {
        let constraints = vxds_core::Constraints::unconstrained().canonical();
        let matcher = VariantMatcher::new(std::slice::from_ref(&constraints));
        Self {
            type_url: Arc::from(key.type_url),
            name: Arc::from(key.name),
            version: version.to_string(),
            revision,
            shared: false,
            variants: vec![IndexedVariant {
                id: constraints.id(),
                constraints,
                constraints_bytes: None,
                constraints_text: None,
                redirect: vxds_envoy::collections::is_redirect_body(&body),
                references: Vec::new(),
                body,
                version,
                ttl: None,
                identity_bound: Default::default(),
            }],
            matcher,
        }
    }

    /// The variant a subscriber with `params` receives, if any.
    pub fn resolve<P: Params + ?Sized>(&self, params: &P) -> Option<&IndexedVariant> {
        self.matcher.resolve(params).map(|i| &self.variants[i])
    }
}
