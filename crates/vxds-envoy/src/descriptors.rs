//! The descriptor pool of the Envoy API, as `envoy-types` was generated from it (514 files),
//! and vxds's own `vxds.config.v1` messages, decoded once on first use.

use std::sync::LazyLock;

use prost_reflect::{DescriptorPool, MessageDescriptor};

static ENVOY_TYPES: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/envoy_types.bin"));

static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    let mut pool =
        DescriptorPool::decode(ENVOY_TYPES).expect("the envoy-types descriptor set decodes");
    pool.add_file_descriptor_proto(vxds_config())
        .expect("vxds's own messages are well-formed");
    pool
});

/// The one message vxds adds to the API, stored like any resource so that it has variants,
/// history and rollback: `vxds.config.v1.ListCollectionOptions`, named by a list collection's
/// URN, says how the collection is served.
///
/// ```proto
/// package vxds.config.v1;
/// message ListCollectionOptions {
///   // Entries inline (name, version and body of each member) rather than as locators.
///   bool inline_entries = 1;
/// }
/// ```
fn vxds_config() -> prost_types::FileDescriptorProto {
    use prost_types::field_descriptor_proto::{Label, Type};
    use prost_types::{DescriptorProto, FieldDescriptorProto, FileDescriptorProto};
    FileDescriptorProto {
        name: Some("vxds/config/v1/collections.proto".into()),
        package: Some("vxds.config.v1".into()),
        syntax: Some("proto3".into()),
        message_type: vec![DescriptorProto {
            name: Some("ListCollectionOptions".into()),
            field: vec![FieldDescriptorProto {
                name: Some("inline_entries".into()),
                number: Some(1),
                label: Some(Label::Optional as i32),
                r#type: Some(Type::Bool as i32),
                json_name: Some("inlineEntries".into()),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

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
        assert_eq!(pool().files().count(), 515);
        for name in [
            "envoy.config.listener.v3.Listener",
            "envoy.config.route.v3.RouteConfiguration",
            "envoy.config.cluster.v3.Cluster",
            "envoy.config.endpoint.v3.ClusterLoadAssignment",
            "envoy.extensions.clusters.aggregate.v3.ClusterConfig",
            "envoy.service.discovery.v3.DynamicParameterConstraints",
            "vxds.config.v1.ListCollectionOptions",
        ] {
            assert!(message(name).is_some(), "{name}");
        }
    }
}
