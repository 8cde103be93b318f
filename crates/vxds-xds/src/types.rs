//! The resource types xDS serves, the order pushes go in, and the gRPC services that carry them.

pub const LISTENER: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
pub const SECRET: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
pub const RUNTIME: &str = "type.googleapis.com/envoy.service.runtime.v3.Runtime";
pub const VIRTUAL_HOST: &str = "type.googleapis.com/envoy.config.route.v3.VirtualHost";
pub const SCOPED_ROUTE: &str = "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration";
pub const EXTENSION_CONFIG: &str = "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";

/// The type URL of the `Resource` wrapper, for wrapped resources in SotW responses.
pub const RESOURCE_WRAPPER: &str = "type.googleapis.com/envoy.service.discovery.v3.Resource";

/// Make before break: what other resources refer to goes first — secrets, runtime and
/// extension configs, then clusters before their endpoints, listeners before their routes.
/// Removals go in the reverse order, and only once the client has acknowledged the updates.
pub const PUSH_ORDER: [&str; 9] = [
    SECRET,
    RUNTIME,
    EXTENSION_CONFIG,
    CLUSTER,
    ENDPOINT,
    LISTENER,
    ROUTE,
    SCOPED_ROUTE,
    VIRTUAL_HOST,
];

/// Where a type goes in [`PUSH_ORDER`]; types it does not list go last.
pub fn push_rank(type_url: &str) -> usize {
    PUSH_ORDER
        .iter()
        .position(|t| *t == type_url)
        .unwrap_or(PUSH_ORDER.len())
}

/// Types whose first request with no names is a (legacy) wildcard subscription: LDS and CDS
/// (xds_protocol), and SRDS, whose Envoy subscription starts with no names
/// (`ScopedRdsConfigSubscription`) and expects every scope.
pub fn legacy_wildcard(type_url: &str) -> bool {
    type_url == LISTENER || type_url == CLUSTER || type_url == SCOPED_ROUTE
}

/// Which method of a service a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// State of the world, streaming.
    Sotw,
    /// Incremental, streaming.
    Delta,
    /// State of the world, one request, one response.
    Fetch,
}

/// A gRPC service that carries xDS: ADS (any type) or one type's own service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// The gRPC service's full name.
    pub name: &'static str,
    /// The one type it serves; `None` for ADS.
    pub type_url: Option<&'static str>,
    /// Short name for logs, metrics and `/v1/clients`.
    pub label: &'static str,
    pub sotw: Option<&'static str>,
    pub delta: Option<&'static str>,
    pub fetch: Option<&'static str>,
}

impl ServiceSpec {
    /// The method a request path names, if it is one of this service's.
    pub fn method(&self, path: &str) -> Option<Method> {
        let method = path
            .strip_prefix('/')?
            .strip_prefix(self.name)?
            .strip_prefix('/')?;
        [
            (self.sotw, Method::Sotw),
            (self.delta, Method::Delta),
            (self.fetch, Method::Fetch),
        ]
        .into_iter()
        .find_map(|(name, kind)| (name == Some(method)).then_some(kind))
    }
}

const fn per_type(
    name: &'static str,
    type_url: &'static str,
    label: &'static str,
    stem: (&'static str, &'static str, &'static str),
) -> ServiceSpec {
    ServiceSpec {
        name,
        type_url: Some(type_url),
        label,
        sotw: Some(stem.0),
        delta: Some(stem.1),
        fetch: Some(stem.2),
    }
}

pub const ADS: ServiceSpec = ServiceSpec {
    name: "envoy.service.discovery.v3.AggregatedDiscoveryService",
    type_url: None,
    label: "ads",
    sotw: Some("StreamAggregatedResources"),
    delta: Some("DeltaAggregatedResources"),
    fetch: None,
};

pub const SERVICES: [ServiceSpec; 10] = [
    ADS,
    per_type(
        "envoy.service.listener.v3.ListenerDiscoveryService",
        LISTENER,
        "lds",
        ("StreamListeners", "DeltaListeners", "FetchListeners"),
    ),
    per_type(
        "envoy.service.route.v3.RouteDiscoveryService",
        ROUTE,
        "rds",
        ("StreamRoutes", "DeltaRoutes", "FetchRoutes"),
    ),
    per_type(
        "envoy.service.cluster.v3.ClusterDiscoveryService",
        CLUSTER,
        "cds",
        ("StreamClusters", "DeltaClusters", "FetchClusters"),
    ),
    per_type(
        "envoy.service.endpoint.v3.EndpointDiscoveryService",
        ENDPOINT,
        "eds",
        ("StreamEndpoints", "DeltaEndpoints", "FetchEndpoints"),
    ),
    per_type(
        "envoy.service.secret.v3.SecretDiscoveryService",
        SECRET,
        "sds",
        ("StreamSecrets", "DeltaSecrets", "FetchSecrets"),
    ),
    per_type(
        "envoy.service.runtime.v3.RuntimeDiscoveryService",
        RUNTIME,
        "rtds",
        ("StreamRuntime", "DeltaRuntime", "FetchRuntime"),
    ),
    ServiceSpec {
        name: "envoy.service.route.v3.VirtualHostDiscoveryService",
        type_url: Some(VIRTUAL_HOST),
        label: "vhds",
        sotw: None,
        delta: Some("DeltaVirtualHosts"),
        fetch: None,
    },
    per_type(
        "envoy.service.route.v3.ScopedRoutesDiscoveryService",
        SCOPED_ROUTE,
        "srds",
        (
            "StreamScopedRoutes",
            "DeltaScopedRoutes",
            "FetchScopedRoutes",
        ),
    ),
    per_type(
        "envoy.service.extension.v3.ExtensionConfigDiscoveryService",
        EXTENSION_CONFIG,
        "ecds",
        (
            "StreamExtensionConfigs",
            "DeltaExtensionConfigs",
            "FetchExtensionConfigs",
        ),
    ),
];

/// `type_url` as a `&'static str`: one of the constants above, or (a type the store serves
/// that they do not name) a copy kept for good, one per type URL. Only for a finite set: type
/// URLs of resources the server sent, or a client's that name a message of the Envoy API
/// (`vxds_envoy::descriptors`) — never any other text a client sends.
pub fn intern(type_url: &str) -> &'static str {
    use std::collections::HashSet;
    use std::sync::{LazyLock, Mutex};
    if let Some(known) = PUSH_ORDER.iter().find(|t| **t == type_url) {
        return known;
    }
    static OTHERS: LazyLock<Mutex<HashSet<&'static str>>> = LazyLock::new(Default::default);
    let mut others = OTHERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = others.get(type_url) {
        return known;
    }
    let leaked: &'static str = Box::leak(type_url.to_owned().into_boxed_str());
    others.insert(leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_methods() {
        assert_eq!(
            ADS.method(
                "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
            ),
            Some(Method::Sotw)
        );
        assert_eq!(
            SERVICES[1]
                .method("/envoy.service.listener.v3.ListenerDiscoveryService/DeltaListeners"),
            Some(Method::Delta)
        );
        assert_eq!(
            SERVICES[1].method("/envoy.service.listener.v3.ListenerDiscoveryService/Nope"),
            None
        );
        assert_eq!(
            SERVICES[7]
                .method("/envoy.service.route.v3.VirtualHostDiscoveryService/DeltaVirtualHosts"),
            Some(Method::Delta)
        );
        assert!(push_rank(CLUSTER) < push_rank(ENDPOINT));
        assert!(push_rank(ENDPOINT) < push_rank(LISTENER));
        assert!(push_rank(LISTENER) < push_rank(ROUTE));
        assert_eq!(
            push_rank("type.googleapis.com/custom.Thing"),
            PUSH_ORDER.len()
        );
        // Every type's message exists in the Envoy API.
        for t in PUSH_ORDER {
            assert!(
                vxds_envoy::resource::ResourceType::resolve(t).is_ok(),
                "{t}"
            );
        }
    }
}
