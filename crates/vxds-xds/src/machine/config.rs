//! The limits and options every stream of a server shares, and the secrets rules: which
//! secrets SDS serves, and that they are asked for by name.

use std::sync::Arc;

use tonic::Status;

use crate::types;

/// Limits and options every stream shares.
#[derive(Clone, Debug)]
pub struct MachineConfig {
    /// Node metadata fields that serve as dynamic parameters when the node sends none.
    pub node_metadata_params: Vec<String>,
    /// Subscriptions (names, locators and globs, over all types) one stream may hold.
    pub max_subscriptions: usize,
    /// Resource types one stream may subscribe to.
    pub max_types: usize,
    /// Heartbeats renew each TTL'd resource at this fraction of its TTL.
    pub heartbeat_fraction: f64,
    /// Responses a stream may leave unanswered before it is ended with `RESOURCE_EXHAUSTED`
    /// (a client that never answers would otherwise make the server keep what each carried).
    pub max_unanswered: usize,
    /// Which secrets SDS serves.
    pub secrets: SecretAccess,
}

/// Which secrets SDS serves (issue 22: deny by default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum SecretAccess {
    /// Every secret, to any client its variants match: clients are not told apart by
    /// certificate (mutual TLS without an identity template; tests).
    #[default]
    Open,
    /// None: clients are not authenticated (no mutual TLS), so a secret would go to anyone who
    /// reaches the port. Subscriptions to secrets find nothing.
    Refused,
    /// A secret's variant only when its constraints hold just for the identities they name
    /// (these trusted keys), unless the secret is marked shared.
    IdentityBound(Arc<[String]>),
}

impl SecretAccess {
    /// Whether `variant` of `resource` (a secret) may be served.
    pub fn serves(&self, resource: &vxds_store::IndexedResource, variant: usize) -> bool {
        match self {
            SecretAccess::Open => true,
            SecretAccess::Refused => false,
            SecretAccess::IdentityBound(keys) => {
                resource.shared || resource.variants[variant].identity_bound(keys)
            }
        }
    }
}

/// The default limit of unanswered responses per stream.
pub const DEFAULT_MAX_UNANSWERED: usize = 1024;

/// The default heartbeat fraction: two heartbeats per TTL, so one may be lost or late.
pub const DEFAULT_HEARTBEAT_FRACTION: f64 = 0.5;

impl Default for MachineConfig {
    fn default() -> Self {
        Self {
            node_metadata_params: Vec::new(),
            max_subscriptions: 100_000,
            max_types: 64,
            heartbeat_fraction: DEFAULT_HEARTBEAT_FRACTION,
            max_unanswered: DEFAULT_MAX_UNANSWERED,
            secrets: SecretAccess::Open,
        }
    }
}

/// Secrets are asked for by name: a wildcard or a glob would hand a client every secret it can
/// match without knowing their names, so such a subscription ends the stream.
pub(super) fn refuse_secret_globs<'a>(
    type_url: &str,
    mut names: impl Iterator<Item = &'a String>,
) -> Result<(), Status> {
    if type_url != types::SECRET {
        return Ok(());
    }
    match names.find(|n| n.as_str() == "*" || n.ends_with("/*") || n.contains("/*?")) {
        Some(name) => Err(Status::invalid_argument(format!(
            "secrets are subscribed to by name: `{name}` (a wildcard or a glob) is refused on \
             {type_url}"
        ))),
        None => Ok(()),
    }
}
