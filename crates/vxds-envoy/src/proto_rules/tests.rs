use serde_json::{Value as Json, json};

use super::*;
use crate::resource::{Body, ResourceType};

fn body(alias: &str, mut body: Json) -> Body {
    let ty = ResourceType::resolve(alias).unwrap();
    body.as_object_mut()
        .unwrap()
        .insert("@type".into(), ty.type_url().into());
    Body::from_value(&body, &ty).unwrap()
}

fn problems(alias: &str, json: Json) -> Vec<ProtoRuleProblem> {
    let body = body(alias, json);
    check(body.message())
}

fn pointers(alias: &str, body: Json) -> Vec<String> {
    problems(alias, body)
        .into_iter()
        .map(|p| p.pointer.as_str().to_owned())
        .collect()
}

fn eds_cluster(extra: Json) -> Json {
    let mut cluster = json!({"name": "c", "type": "EDS",
        "eds_cluster_config": {"eds_config": {"ads": {}}}});
    cluster
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    cluster
}

#[test]
fn the_rules_are_in_the_pool() {
    assert!(EXTENSIONS.field_rules.is_some());
    assert!(EXTENSIONS.oneof_required.is_some());
}

#[test]
fn a_zero_connect_timeout_is_refused_at_its_field() {
    let found = problems("cluster", eds_cluster(json!({"connect_timeout": "0s"})));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].pointer.as_str(), "/connect_timeout");
    assert_eq!(found[0].code, "proto_rule");
    assert_eq!(
        found[0].message,
        "`connect_timeout` must be greater than 0s (Envoy's rule: duration.gt)"
    );
    assert!(pointers("cluster", eds_cluster(json!({"connect_timeout": "0.25s"}))).is_empty());
}

#[test]
fn a_port_above_65535_is_refused_where_it_is_nested() {
    let listener = |port: u32| json!({"name": "l", "address": {"socket_address": {"address": "0.0.0.0", "port_value": port}}});
    let found = problems("listener", listener(70000));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        found[0].pointer.as_str(),
        "/address/socket_address/port_value"
    );
    assert!(
        found[0].message.contains("at most 65535"),
        "{}",
        found[0].message
    );
    assert!(pointers("listener", listener(8080)).is_empty());
}

#[test]
fn list_items_are_pointed_at_by_index() {
    let endpoints = json!({"cluster_name": "c", "endpoints": [{"lb_endpoints": [
        {"endpoint": {"address": {"socket_address": {"address": "10.0.0.1", "port_value": 80}}}},
        {"endpoint": {"address": {"socket_address": {"address": "10.0.0.2", "port_value": 99999}}}}
    ]}]});
    assert_eq!(
        pointers("endpoint", endpoints),
        ["/endpoints/0/lb_endpoints/1/endpoint/address/socket_address/port_value"]
    );
}

#[test]
fn rules_inside_a_typed_config_are_checked() {
    // The HTTP connection manager's `stat_prefix` has `min_len: 1`.
    let listener = |stat_prefix: &str| {
        json!({"name": "l", "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                "stat_prefix": stat_prefix,
                "rds": {"route_config_name": "r", "config_source": {"ads": {}}}
            }
        }]}]})
    };
    assert_eq!(
        pointers("listener", listener("")),
        ["/filter_chains/0/filters/0/typed_config/stat_prefix"]
    );
    assert!(pointers("listener", listener("ingress")).is_empty());
}

#[test]
fn required_oneofs_and_messages_point_at_the_message() {
    // A route needs an action, and a match.
    let found = problems(
        "route",
        json!({"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"],
               "routes": [{"name": "x"}]}]}),
    );
    let at: Vec<_> = found.iter().map(|p| p.pointer.as_str()).collect();
    assert_eq!(
        at,
        [
            "/virtual_hosts/0/routes/0",
            "/virtual_hosts/0/routes/0/match"
        ],
        "{found:?}"
    );
    assert!(found[0].message.contains("`route`"), "{}", found[0].message);
    assert!(
        found[1].message.contains("required"),
        "{}",
        found[1].message
    );
}

#[test]
fn repeated_and_wrapper_rules() {
    // A virtual host needs at least one domain (`repeated.min_items: 1`).
    let route = |domains: Json| {
        json!({"name": "r", "virtual_hosts": [{"name": "v", "domains": domains,
               "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "c"}}]}]})
    };
    assert_eq!(
        pointers("route", route(json!([]))),
        ["/virtual_hosts/0/domains"]
    );
    // Items of a repeated string: each header name is non-empty and has no NUL, CR or LF
    // (`min_len: 1`, `well_known_regex: HTTP_HEADER_NAME`, `strict: false`).
    let route_with_header = |header: &str| {
        json!({"name": "r", "virtual_hosts": [{"name": "v", "domains": ["*"],
               "request_headers_to_remove": [header],
               "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "c"}}]}]})
    };
    assert!(pointers("route", route_with_header("x-ok")).is_empty());
    assert_eq!(
        pointers("route", route_with_header("bad\nheader")),
        ["/virtual_hosts/0/request_headers_to_remove/0"]
    );
    assert_eq!(
        pointers("route", route_with_header("")),
        ["/virtual_hosts/0/request_headers_to_remove/0"]
    );
    // A wrapper with a rule: `per_connection_buffer_limit_bytes` has none, but a
    // cluster's `max_requests_per_connection` has none either; the outlier detection's
    // `enforcing_consecutive_5xx` is a UInt32Value with `lte: 100`.
    assert!(
        pointers(
            "cluster",
            eds_cluster(json!({"outlier_detection": {"enforcing_consecutive_5xx": 100}}))
        )
        .is_empty()
    );
    assert_eq!(
        pointers(
            "cluster",
            eds_cluster(json!({"outlier_detection": {"enforcing_consecutive_5xx": 101}}))
        ),
        ["/outlier_detection/enforcing_consecutive_5xx"]
    );
}

#[test]
fn enums_must_be_defined() {
    let body = body("cluster", eds_cluster(json!({})));
    let mut message = body.message().clone();
    let lb = message.descriptor().get_field_by_name("lb_policy").unwrap();
    message.set_field(&lb, prost_reflect::Value::EnumNumber(99));
    let found = check(&message);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].pointer.as_str(), "/lb_policy");
    assert!(
        found[0].message.contains("defined_only"),
        "{}",
        found[0].message
    );
}

#[test]
fn inside_an_api_listener_problems_are_for_grpc_only() {
    // gRPC's listeners carry an HttpConnectionManager without `stat_prefix`.
    let listener = json!({"name": "l", "api_listener": {"api_listener": {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "rds": {"route_config_name": "r", "config_source": {"ads": {}}}}},
        "address": {"socket_address": {"address": "0.0.0.0", "port_value": 70000}}});
    let found = problems("listener", listener);
    let seen: Vec<_> = found
        .iter()
        .map(|p| (p.pointer.as_str(), p.grpc_only))
        .collect();
    assert_eq!(
        seen,
        [
            ("/address/socket_address/port_value", false),
            ("/api_listener/api_listener/stat_prefix", true)
        ]
    );
}
