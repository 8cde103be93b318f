//! The descriptor pool of the Envoy API, as `envoy-types` was generated from it (514 files),
//! decoded once on first use.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, MessageDescriptor};

static ENVOY_TYPES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_types.bin"));

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(ENVOY_TYPES).expect("the envoy-types descriptor set decodes")
});

/// Every message, enum and service of the Envoy API and its dependencies.
pub fn pool() -> &'static DescriptorPool {
    &POOL
}

/// A message by full name, e.g. `envoy.config.cluster.v3.Cluster`.
pub fn message(full_name: &str) -> Option<MessageDescriptor> {
    POOL.get_message_by_name(full_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_the_whole_envoy_api() {
        assert_eq!(pool().files().count(), 514);
        for name in [
            "envoy.config.listener.v3.Listener",
            "envoy.config.route.v3.RouteConfiguration",
            "envoy.config.cluster.v3.Cluster",
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
            "envoy.extensions.clusters.aggregate.v3.ClusterConfig",
            "envoy.service.discovery.v3.DynamicParameterConstraints",
        ] {
            assert!(message(name).is_some(), "{name}");
        }
    }
}
