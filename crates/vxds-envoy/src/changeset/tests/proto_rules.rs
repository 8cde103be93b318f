//! Envoy's own proto rules (protoc-gen-validate), refused with the pointer as the request
//! spells the field, and gRPC's form of an API listener only warned of.

use super::*;

#[test]
fn envoys_proto_rules_are_refused_with_the_pointer_as_the_request_spells_it() {
    let cluster = |timeout_key: &str| {
        op(
            json!({"type": "cluster", "name": "c", "variants": [{"resource": {
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "c",
            "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}},
            timeout_key: "0s"}}]}),
        )
    };
    assert_eq!(
        problems(vec![cluster("connect_timeout")]),
        [(
            "/operations/0/variants/0/resource/connect_timeout".to_owned(),
            "proto_rule".to_owned()
        )]
    );
    assert_eq!(
        problems(vec![cluster("connectTimeout")]),
        [(
            "/operations/0/variants/0/resource/connectTimeout".to_owned(),
            "proto_rule".to_owned()
        )]
    );
    let listener = op(
        json!({"type": "listener", "name": "l", "variants": [{"resource": {
        "@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": "l",
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 70000}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "statPrefix": "",
                "rds": {"route_config_name": "r", "config_source": {"ads": {}}}}}]}]}}]}),
    );
    assert_eq!(
        problems(vec![listener]),
        [
            (
                "/operations/0/variants/0/resource/address/socket_address/port_value".to_owned(),
                "proto_rule".to_owned()
            ),
            (
                "/operations/0/variants/0/resource/filter_chains/0/filters/0/typed_config/statPrefix"
                    .to_owned(),
                "proto_rule".to_owned()
            )
        ]
    );
}

#[test]
fn a_grpc_api_listener_without_envoys_stat_prefix_is_accepted_with_a_warning() {
    let listener = op(
        json!({"type": "listener", "name": "l", "variants": [{"resource": {
        "@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": "l",
        "api_listener": {"api_listener": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "rds": {"route_config_name": "r", "config_source": {"ads": {}}}}}}}]}),
    );
    let validated = run(vec![listener]).unwrap();
    let warnings: Vec<_> = validated
        .warnings
        .iter()
        .map(|w| (w.pointer.to_string(), w.code.clone()))
        .collect();
    assert_eq!(
        warnings,
        [(
            "/operations/0/variants/0/resource/api_listener/api_listener/stat_prefix".to_owned(),
            "proto_rule".to_owned()
        )]
    );
}
