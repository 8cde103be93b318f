//! What a resource body names in other types: the route configurations a listener's HTTP
//! connection managers load by RDS (in filter chains and in a gRPC `api_listener`), the
//! clusters a route configuration (or an inline one) routes or mirrors to and a TCP proxy
//! connects to, the endpoints (EDS) a cluster loads, the secrets (SDS) a listener's or a
//! cluster's TLS transport socket loads (certificates, validation contexts, session ticket
//! keys), and, wherever they are in a listener, route, cluster, scoped route or extension
//! configuration (however deep in typed configs): the clusters a gRPC service names
//! (`envoy_grpc.cluster_name`: ext_authz, rate limit, access log services, ext_proc, config
//! sources), the route configurations scoped routes name (`route_configuration_name` of a
//! `ScopedRouteConfiguration`, an SRDS resource or one inline in an HCM's `scoped_routes`), and
//! the extension configurations (ECDS) a filter loads by `config_discovery` (named by the
//! filter's name). An HCM's `scoped_routes.scoped_rds` names no resource: Envoy subscribes to
//! every scoped route configuration of its source (a wildcard), so there is no name to keep.
//! Computed once per variant when the index loads it;
//! the stream machine uses it to keep what a client's accepted configuration still needs while
//! an update is refused (issue 20's NACK scope).

use prost::Message;
use prost_reflect::{DynamicMessage, ReflectMessage, Value};

use crate::pb::envoy::config::cluster::v3::Cluster;
use crate::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use crate::pb::envoy::config::core::v3::TransportSocket;
use crate::pb::envoy::config::core::v3::transport_socket::ConfigType as SocketConfig;
use crate::pb::envoy::config::listener::v3::filter::ConfigType as FilterConfig;
use crate::pb::envoy::config::listener::v3::{FilterChain, Listener};
use crate::pb::envoy::config::route::v3::RouteConfiguration;
use crate::pb::envoy::config::route::v3::route::Action;
use crate::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
use crate::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier;
use crate::pb::envoy::extensions::filters::network::tcp_proxy::v3::TcpProxy;
use crate::pb::envoy::extensions::filters::network::tcp_proxy::v3::tcp_proxy::ClusterSpecifier as TcpClusterSpecifier;
use crate::pb::envoy::extensions::transport_sockets::tls::v3::downstream_tls_context::SessionTicketKeysType;
use crate::pb::envoy::extensions::transport_sockets::tls::v3::common_tls_context::ValidationContextType;
use crate::pb::envoy::extensions::transport_sockets::tls::v3::{
    CommonTlsContext, DownstreamTlsContext, UpstreamTlsContext,
};

const PREFIX: &str = "type.googleapis.com/";
pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
pub const SCOPED_ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration";
pub const EXTENSION_CONFIG: &str = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
const HCM: &str =
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const TCP_PROXY: &str = "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy";
const DOWNSTREAM_TLS: &str = "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext";
const UPSTREAM_TLS: &str = "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";

/// A resource another one names: its type URL and name.
pub type Reference = (&'static str, String);

/// What the encoded `google.protobuf.Any` `body` names; empty for types that name nothing
/// (or a body that does not decode, which validation never lets in).
pub fn of(body: &[u8]) -> Vec<Reference> {
    let Ok(any) = prost_types::Any::decode(body) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    match any.type_url.as_str() {
        LISTENER => {
            if let Ok(listener) = Listener::decode(any.value.as_slice()) {
                listener_refs(&listener, &mut out);
            }
        }
        ROUTE => {
            if let Ok(route) = RouteConfiguration::decode(any.value.as_slice()) {
                route_refs(&route, &mut out);
            }
        }
        CLUSTER => {
            if let Ok(cluster) = Cluster::decode(any.value.as_slice()) {
                cluster_refs(&cluster, &mut out);
            }
        }
        _ => {}
    }
    // Endpoints and secrets name nothing, and are the most numerous: not walked.
    if matches!(
        any.type_url.as_str(),
        LISTENER | ROUTE | CLUSTER | SCOPED_ROUTE | EXTENSION_CONFIG
    ) && let Some(message) = crate::descriptors::message("google.protobuf.Any")
        && let Ok(message) = DynamicMessage::decode(message, body)
    {
        walk(&message, 0, &mut out);
    }
    out.sort();
    out.dedup();
    // Kept with every indexed variant: no spare capacity (a push reserves four).
    out.shrink_to_fit();
    out
}

/// How deep [`walk`] follows nested messages (Envoy's own configurations nest a few dozen
/// levels at most; validation bounds the rest).
const MAX_DEPTH: usize = 100;

/// What a message names wherever it is, typed configs (`Any`) included: the cluster of an
/// `envoy_grpc` service, the route configuration of a scoped route, the extension
/// configuration a filter loads by `config_discovery`.
fn walk(message: &DynamicMessage, depth: usize, out: &mut Vec<Reference>) {
    if depth > MAX_DEPTH {
        return;
    }
    let descriptor = message.descriptor();
    let string = |field: &str| {
        message
            .get_field_by_name(field)
            .and_then(|v| v.as_str().map(str::to_owned))
            .filter(|s| !s.is_empty())
    };
    match descriptor.full_name() {
        "google.protobuf.Any" => {
            let (Some(type_url), Some(Value::Bytes(value))) = (
                string("type_url"),
                message.get_field_by_name("value").map(|v| v.into_owned()),
            ) else {
                return;
            };
            let name = type_url.rsplit('/').next().unwrap_or_default();
            if let Some(inner) = crate::descriptors::message(name)
                && let Ok(inner) = DynamicMessage::decode(inner, value)
            {
                walk(&inner, depth + 1, out);
            }
            return;
        }
        "envoy.config.core.v3.GrpcService.EnvoyGrpc" => {
            out.extend(string("cluster_name").map(|name| (CLUSTER, name)));
        }
        "envoy.config.route.v3.ScopedRouteConfiguration" => {
            out.extend(string("route_configuration_name").map(|name| (ROUTE, name)));
        }
        // Filters that load their configuration by ECDS, under the filter's name.
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpFilter"
        | "envoy.config.listener.v3.Filter"
        | "envoy.config.listener.v3.ListenerFilter"
            if message.has_field_by_name("config_discovery") =>
        {
            out.extend(string("name").map(|name| (EXTENSION_CONFIG, name)));
        }
        _ => {}
    }
    for (_, value) in message.fields() {
        walk_value(value, depth + 1, out);
    }
}

fn walk_value(value: &Value, depth: usize, out: &mut Vec<Reference>) {
    match value {
        Value::Message(message) => walk(message, depth, out),
        Value::List(values) => {
            for v in values {
                walk_value(v, depth, out);
            }
        }
        Value::Map(entries) => {
            for v in entries.values() {
                walk_value(v, depth, out);
            }
        }
        _ => {}
    }
}

fn listener_refs(listener: &Listener, out: &mut Vec<Reference>) {
    let chains: Vec<&FilterChain> = listener
        .filter_chains
        .iter()
        .chain(listener.default_filter_chain.as_ref())
        .collect();
    for chain in chains {
        socket_refs(chain.transport_socket.as_ref(), DOWNSTREAM_TLS, out);
        for filter in &chain.filters {
            if let Some(FilterConfig::TypedConfig(any)) = &filter.config_type {
                network_filter_refs(any, out);
            }
        }
    }
    // gRPC's listeners: an HTTP connection manager as the API listener.
    if let Some(any) = listener
        .api_listener
        .as_ref()
        .and_then(|a| a.api_listener.as_ref())
    {
        network_filter_refs(any, out);
    }
}

/// What a network filter's typed config names: an HTTP connection manager's route
/// configuration (or what its inline one names), a TCP proxy's clusters.
fn network_filter_refs(any: &crate::pb::google::protobuf::Any, out: &mut Vec<Reference>) {
    match any.type_url.strip_prefix(PREFIX) {
        Some(HCM) => {
            let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice()) else {
                return;
            };
            match &hcm.route_specifier {
                Some(RouteSpecifier::Rds(rds)) => out.push((ROUTE, rds.route_config_name.clone())),
                Some(RouteSpecifier::RouteConfig(route)) => route_refs(route, out),
                _ => {}
            }
        }
        Some(TCP_PROXY) => {
            let Ok(proxy) = TcpProxy::decode(any.value.as_slice()) else {
                return;
            };
            match &proxy.cluster_specifier {
                Some(TcpClusterSpecifier::Cluster(name)) => out.push((CLUSTER, name.clone())),
                Some(TcpClusterSpecifier::WeightedClusters(weighted)) => {
                    out.extend(weighted.clusters.iter().map(|c| (CLUSTER, c.name.clone())))
                }
                None => {}
            }
        }
        _ => {}
    }
}

fn route_refs(route: &RouteConfiguration, out: &mut Vec<Reference>) {
    for host in &route.virtual_hosts {
        for r in &host.routes {
            let Some(Action::Route(action)) = &r.action else {
                continue;
            };
            out.extend(
                action
                    .request_mirror_policies
                    .iter()
                    .filter(|m| !m.cluster.is_empty())
                    .map(|m| (CLUSTER, m.cluster.clone())),
            );
            match &action.cluster_specifier {
                Some(ClusterSpecifier::Cluster(name)) => out.push((CLUSTER, name.clone())),
                Some(ClusterSpecifier::WeightedClusters(weighted)) => {
                    out.extend(weighted.clusters.iter().map(|c| (CLUSTER, c.name.clone())))
                }
                _ => {}
            }
        }
    }
}

fn cluster_refs(cluster: &Cluster, out: &mut Vec<Reference>) {
    let eds = matches!(
        cluster.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(t)) if t == DiscoveryType::Eds as i32
    );
    if eds {
        let service = cluster
            .eds_cluster_config
            .as_ref()
            .map(|c| c.service_name.as_str())
            .filter(|s| !s.is_empty())
            .unwrap_or(&cluster.name);
        out.push((ENDPOINT, service.to_owned()));
    }
    socket_refs(cluster.transport_socket.as_ref(), UPSTREAM_TLS, out);
    for matcher in &cluster.transport_socket_matches {
        socket_refs(matcher.transport_socket.as_ref(), UPSTREAM_TLS, out);
    }
}

fn socket_refs(socket: Option<&TransportSocket>, tls_type: &str, out: &mut Vec<Reference>) {
    let Some(SocketConfig::TypedConfig(any)) = socket.and_then(|s| s.config_type.as_ref()) else {
        return;
    };
    let common = match any.type_url.strip_prefix(PREFIX) {
        Some(t) if t == tls_type && t == DOWNSTREAM_TLS => {
            let context = DownstreamTlsContext::decode(any.value.as_slice()).ok();
            if let Some(SessionTicketKeysType::SessionTicketKeysSdsSecretConfig(keys)) = context
                .as_ref()
                .and_then(|c| c.session_ticket_keys_type.as_ref())
            {
                out.push((SECRET, keys.name.clone()));
            }
            context.and_then(|c| c.common_tls_context)
        }
        Some(t) if t == tls_type && t == UPSTREAM_TLS => {
            UpstreamTlsContext::decode(any.value.as_slice())
                .ok()
                .and_then(|c| c.common_tls_context)
        }
        _ => None,
    };
    if let Some(common) = common {
        tls_refs(&common, out);
    }
}

fn tls_refs(common: &CommonTlsContext, out: &mut Vec<Reference>) {
    out.extend(
        common
            .tls_certificate_sds_secret_configs
            .iter()
            .map(|s| (SECRET, s.name.clone())),
    );
    match &common.validation_context_type {
        Some(ValidationContextType::ValidationContextSdsSecretConfig(s)) => {
            out.push((SECRET, s.name.clone()))
        }
        Some(ValidationContextType::CombinedValidationContext(c)) => out.extend(
            c.validation_context_sds_secret_config
                .iter()
                .map(|s| (SECRET, s.name.clone())),
        ),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::resource::{Body, ResourceType};

    fn refs(json: serde_json::Value) -> Vec<Reference> {
        let ty = ResourceType::resolve(json["@type"].as_str().unwrap()).unwrap();
        of(&Body::from_value(&json, &ty).unwrap().any_bytes)
    }

    #[test]
    fn listeners_routes_and_clusters_name_what_they_load() {
        let tls = |ty: &str| {
            serde_json::json!({"name": "tls", "typed_config": {
            "@type": format!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{ty}"),
            "common_tls_context": {
                "tls_certificate_sds_secret_configs": [{"name": "cert"}],
                "validation_context_sds_secret_config": {"name": "ca"}}}})
        };
        let listener = serde_json::json!({"@type": LISTENER, "name": "l",
            "filter_chains": [{"transport_socket": tls("DownstreamTlsContext"),
                "filters": [{"name": "hcm", "typed_config": {"@type": format!("{PREFIX}{HCM}"),
                "stat_prefix": "x", "rds": {"route_config_name": "r", "config_source": {"ads": {}}}}}]},
              {"filters": [{"name": "hcm", "typed_config": {"@type": format!("{PREFIX}{HCM}"),
                "stat_prefix": "y", "route_config": {"name": "inline", "virtual_hosts": [{"name": "v",
                "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "c0"}}]}]}}}]}]});
        assert_eq!(
            refs(listener),
            [
                (CLUSTER, "c0".to_owned()),
                (ROUTE, "r".to_owned()),
                (SECRET, "ca".to_owned()),
                (SECRET, "cert".to_owned()),
            ]
        );
        let route = serde_json::json!({"@type": ROUTE, "name": "r", "virtual_hosts": [{"name": "v",
            "domains": ["*"], "routes": [
                {"match": {"prefix": "/a"}, "route": {"cluster": "c1"}},
                {"match": {"prefix": "/b"}, "route": {"weighted_clusters": {"clusters": [
                    {"name": "c2", "weight": 1}, {"name": "c3", "weight": 1}]}}}]}]});
        assert_eq!(
            refs(route),
            [
                (CLUSTER, "c1".to_owned()),
                (CLUSTER, "c2".to_owned()),
                (CLUSTER, "c3".to_owned()),
            ]
        );
        let cluster = serde_json::json!({"@type": CLUSTER, "name": "c1", "type": "EDS",
            "eds_cluster_config": {"eds_config": {"ads": {}}}, "transport_socket": tls("UpstreamTlsContext")});
        assert_eq!(
            refs(cluster),
            [
                (ENDPOINT, "c1".to_owned()),
                (SECRET, "ca".to_owned()),
                (SECRET, "cert".to_owned()),
            ]
        );
        let named = serde_json::json!({"@type": CLUSTER, "name": "c2", "type": "EDS",
            "eds_cluster_config": {"service_name": "svc", "eds_config": {"ads": {}}}});
        assert_eq!(refs(named), [(ENDPOINT, "svc".to_owned())]);
        let static_cluster = serde_json::json!({"@type": CLUSTER, "name": "s", "type": "STATIC"});
        assert!(refs(static_cluster).is_empty());
    }

    #[test]
    fn tcp_proxies_mirrors_api_listeners_and_ticket_keys_are_references_too() {
        let tcp = |specifier: serde_json::Value| {
            let mut config = serde_json::json!({"@type": format!("{PREFIX}{TCP_PROXY}"),
                "stat_prefix": "tcp"});
            config
                .as_object_mut()
                .unwrap()
                .extend(specifier.as_object().unwrap().clone());
            serde_json::json!({"@type": LISTENER, "name": "l", "filter_chains": [{
                "transport_socket": {"name": "tls", "typed_config": {
                    "@type": format!("{PREFIX}{DOWNSTREAM_TLS}"),
                    "session_ticket_keys_sds_secret_config": {"name": "tickets"}}},
                "filters": [{"name": "tcp", "typed_config": config}]}]})
        };
        assert_eq!(
            refs(tcp(serde_json::json!({"cluster": "db"}))),
            [(CLUSTER, "db".to_owned()), (SECRET, "tickets".to_owned())]
        );
        assert_eq!(
            refs(tcp(serde_json::json!({"weighted_clusters": {"clusters": [
                {"name": "a", "weight": 1}, {"name": "b", "weight": 1}]}}))),
            [
                (CLUSTER, "a".to_owned()),
                (CLUSTER, "b".to_owned()),
                (SECRET, "tickets".to_owned())
            ]
        );
        let grpc = serde_json::json!({"@type": LISTENER, "name": "svc", "api_listener": {
            "api_listener": {"@type": format!("{PREFIX}{HCM}"),
                "rds": {"route_config_name": "grpc_route", "config_source": {"ads": {}}}}}});
        assert_eq!(refs(grpc), [(ROUTE, "grpc_route".to_owned())]);
        let mirrored = serde_json::json!({"@type": ROUTE, "name": "r", "virtual_hosts": [{
            "name": "v", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": {
                "cluster": "c1", "request_mirror_policies": [{"cluster": "shadow"}]}}]}]});
        assert_eq!(
            refs(mirrored),
            [(CLUSTER, "c1".to_owned()), (CLUSTER, "shadow".to_owned())]
        );
    }

    /// Issue 20: scoped routes (SRDS), extension configurations (ECDS) and the clusters gRPC
    /// services name, wherever Envoy follows them.
    #[test]
    fn scoped_routes_extension_configs_and_grpc_clusters_are_references_too() {
        let grpc = |cluster: &str| serde_json::json!({"envoy_grpc": {"cluster_name": cluster}});
        let hcm = serde_json::json!({"@type": format!("{PREFIX}{HCM}"), "stat_prefix": "x",
            "scoped_routes": {"name": "scopes",
                "scope_key_builder": {"fragments": [{"header_value_extractor": {"name": "x-scope"}}]},
                "rds_config_source": {"api_config_source": {"api_type": "GRPC",
                    "transport_api_version": "V3", "grpc_services": [grpc("xds_rds")]}},
                "scoped_route_configurations_list": {"scoped_route_configurations": [
                    {"name": "s1", "route_configuration_name": "scoped_r1",
                     "key": {"fragments": [{"string_key": "a"}]}}]}},
            "access_log": [{"name": "als", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
                "common_config": {"log_name": "l", "transport_api_version": "V3",
                    "grpc_service": grpc("als_cluster")}}}],
            "http_filters": [
                {"name": "authz", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
                    "transport_api_version": "V3", "grpc_service": grpc("authz_cluster")}},
                {"name": "dynamic_lua", "config_discovery": {"config_source": {"ads": {}},
                    "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua"]}},
                {"name": "envoy.filters.http.router", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]});
        let listener = serde_json::json!({"@type": LISTENER, "name": "l",
            "filter_chains": [{"filters": [
                {"name": "rl", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.ratelimit.v3.RateLimit",
                    "stat_prefix": "rl", "domain": "d", "rate_limit_service": {
                        "transport_api_version": "V3", "grpc_service": grpc("rl_cluster")}}},
                {"name": "hcm", "typed_config": hcm}]}]});
        assert_eq!(
            refs(listener),
            [
                (EXTENSION_CONFIG, "dynamic_lua".to_owned()),
                (ROUTE, "scoped_r1".to_owned()),
                (CLUSTER, "als_cluster".to_owned()),
                (CLUSTER, "authz_cluster".to_owned()),
                (CLUSTER, "rl_cluster".to_owned()),
                (CLUSTER, "xds_rds".to_owned()),
            ]
            .into_iter()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
        );
        // An SRDS resource names its route configuration.
        let scoped = serde_json::json!({"@type": SCOPED_ROUTE, "name": "s2",
            "route_configuration_name": "scoped_r2", "key": {"fragments": [{"string_key": "b"}]}});
        assert_eq!(refs(scoped), [(ROUTE, "scoped_r2".to_owned())]);
        // A cluster whose endpoints come from a gRPC config source names that source's cluster.
        let cluster = serde_json::json!({"@type": CLUSTER, "name": "c", "type": "EDS",
            "eds_cluster_config": {"eds_config": {"api_config_source": {"api_type": "GRPC",
                "transport_api_version": "V3", "grpc_services": [grpc("xds_eds")]}}}});
        assert_eq!(
            refs(cluster),
            [(CLUSTER, "xds_eds".to_owned()), (ENDPOINT, "c".to_owned())]
        );
        // An ECDS resource's configuration names its gRPC cluster.
        let extension = serde_json::json!({"@type": EXTENSION_CONFIG, "name": "authz",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
                "transport_api_version": "V3", "grpc_service": grpc("authz2")}});
        assert_eq!(refs(extension), [(CLUSTER, "authz2".to_owned())]);
        // A Google gRPC service names no cluster; scoped RDS names no resource (a wildcard).
        let google = serde_json::json!({"@type": LISTENER, "name": "g", "filter_chains": [{
            "filters": [{"name": "hcm", "typed_config": {"@type": format!("{PREFIX}{HCM}"),
                "stat_prefix": "g", "scoped_routes": {"name": "s",
                    "scope_key_builder": {"fragments": [{"header_value_extractor": {"name": "x"}}]},
                    "rds_config_source": {"ads": {}},
                    "scoped_rds": {"scoped_rds_config_source": {"ads": {}}}},
                "http_filters": [{"name": "authz", "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
                    "grpc_service": {"google_grpc": {"target_uri": "a:1", "stat_prefix": "a"}}}}]}}]}]});
        assert!(refs(google).is_empty());
    }
}
