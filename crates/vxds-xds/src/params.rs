//! A subscriber's dynamic parameters, from the first source that has them (TP2, A67):
//! a resource locator's own parameters; else `node.dynamic_parameters[type_url]` (what Envoy
//! sends from its bootstrap; for a list collection type `<T>Collection` without its own, those
//! of `<T>`); else the node metadata fields the server is told to read
//! (`--node-metadata-params`; string values only), the migration path TP2 describes.
//! Trusted parameters (from the client's certificate) then override all of them.

use std::collections::HashMap;

use vxds_core::ParamSet;
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::google::protobuf::value::Kind;

/// Where a subscriber's parameter came from, for operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamSource {
    /// The client certificate's identity, through the identity template.
    Identity,
    DynamicParameters,
    NodeMetadata,
    Locator,
}

impl ParamSource {
    pub fn label(self) -> &'static str {
        match self {
            ParamSource::Identity => "identity",
            ParamSource::DynamicParameters => "node.dynamic_parameters",
            ParamSource::NodeMetadata => "node.metadata",
            ParamSource::Locator => "locator",
        }
    }
}

/// The parameters a node subscribes to `type_url` with, when it names no locator.
pub fn node_params(node: Option<&Node>, type_url: &str, metadata_keys: &[String]) -> ParamSet {
    node_params_from(node, type_url, metadata_keys).0
}

/// [`node_params`], and which of the node's fields they came from.
pub fn node_params_from(
    node: Option<&Node>,
    type_url: &str,
    metadata_keys: &[String],
) -> (ParamSet, ParamSource) {
    let Some(node) = node else {
        return (ParamSet::new(), ParamSource::DynamicParameters);
    };
    // A list collection's members are resolved as the members' own type would be: a node
    // that gives parameters for listeners gets the same listeners in a ListenerCollection.
    let context = node.dynamic_parameters.get(type_url).or_else(|| {
        vxds_envoy::collections::member_type(type_url).and_then(|member| {
            node.dynamic_parameters
                .get(&format!("type.googleapis.com/{member}"))
        })
    });
    if let Some(context) = context {
        let params = context
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        return (params, ParamSource::DynamicParameters);
    }
    let Some(metadata) = &node.metadata else {
        return (ParamSet::new(), ParamSource::DynamicParameters);
    };
    let params = metadata_keys
        .iter()
        .filter_map(
            |key| match metadata.fields.get(key).and_then(|v| v.kind.as_ref()) {
                Some(Kind::StringValue(value)) => Some((key.clone(), value.clone())),
                _ => None,
            },
        )
        .collect();
    (params, ParamSource::NodeMetadata)
}

/// A resource locator's parameters.
pub fn locator_params(parameters: &HashMap<String, String>) -> ParamSet {
    parameters
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use vxds_envoy::pb::google::protobuf::{Struct, Value};
    use vxds_envoy::pb::xds::core::v3::ContextParams;

    #[test]
    fn sources_in_order() {
        let route = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
        let mut node = Node {
            metadata: Some(Struct {
                fields: [
                    (
                        "env".to_owned(),
                        Value {
                            kind: Some(Kind::StringValue("canary".into())),
                        },
                    ),
                    (
                        "replicas".to_owned(),
                        Value {
                            kind: Some(Kind::NumberValue(3.0)),
                        },
                    ),
                ]
                .into(),
            }),
            ..Default::default()
        };
        let keys = vec!["env".to_owned(), "replicas".to_owned()];
        assert_eq!(
            node_params(Some(&node), route, &keys),
            ParamSet::new().with("env", "canary")
        );
        assert_eq!(node_params(Some(&node), route, &[]), ParamSet::new());
        node.dynamic_parameters.insert(
            route.into(),
            ContextParams {
                params: [("env".to_owned(), "prod".to_owned())].into(),
            },
        );
        assert_eq!(
            node_params(Some(&node), route, &keys),
            ParamSet::new().with("env", "prod")
        );
        // Other types still fall back to the metadata.
        assert_eq!(
            node_params(Some(&node), "type.googleapis.com/x.Y", &keys),
            ParamSet::new().with("env", "canary")
        );
        assert_eq!(node_params(None, route, &keys), ParamSet::new());
    }
}
