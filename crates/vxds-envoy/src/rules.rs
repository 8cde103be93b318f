//! Type-specific resource rules.
//!
//! Clusters follow gRFC A37's validation section for the kinds it covers: EDS, LOGICAL_DNS and
//! aggregate clusters are checked strictly (errors). Other kinds (STATIC, STRICT_DNS,
//! ORIGINAL_DST, custom cluster types) are valid Envoy configuration that gRPC clients reject,
//! so they pass with a warning. Across the store, the aggregate-cluster graph must be acyclic
//! and at most 16 clusters deep, as gRPC counts it (root at depth 0, failing on reaching 16).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::config_source::ConfigSourceSpecifier;
use envoy_types::pb::envoy::config::core::v3::socket_address::PortSpecifier;
use envoy_types::pb::envoy::extensions::clusters::aggregate::v3::ClusterConfig;
use prost::Message;

use crate::pointer::Pointer;
use crate::resource::Body;

pub const AGGREGATE_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig";

/// gRPC's `kMaxAggregateClusterRecursionDepth`: clusters in the longest aggregate chain.
pub const MAX_AGGREGATE_DEPTH: usize = 16;

/// A broken rule inside one body; `pointer` is relative to the body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleProblem {
    pub pointer: Pointer,
    pub code: &'static str,
    pub message: String,
}

/// What the rules found in one body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleReport {
    pub errors: Vec<RuleProblem>,
    pub warnings: Vec<RuleProblem>,
    /// For an aggregate cluster, the clusters it points to.
    pub aggregate_children: Option<Vec<String>>,
}

impl RuleReport {
    fn error(&mut self, pointer: Pointer, code: &'static str, message: impl Into<String>) {
        self.errors.push(RuleProblem {
            pointer,
            code,
            message: message.into(),
        });
    }

    fn warning(&mut self, pointer: Pointer, code: &'static str, message: impl Into<String>) {
        self.warnings.push(RuleProblem {
            pointer,
            code,
            message: message.into(),
        });
    }
}

/// gRFC A37's rules for one cluster body.
pub fn check_cluster(body: &Body) -> RuleReport {
    let mut report = RuleReport::default();
    let root = Pointer::root();
    let cluster: Cluster = match body.decode_as() {
        Ok(cluster) => cluster,
        Err(e) => {
            report.error(root, "invalid_body", format!("not a Cluster: {e}"));
            return report;
        }
    };
    match &cluster.cluster_discovery_type {
        Some(ClusterDiscoveryType::Type(t)) => match DiscoveryType::try_from(*t) {
            Ok(DiscoveryType::Eds) => check_eds(&cluster, &mut report),
            Ok(DiscoveryType::LogicalDns) => check_logical_dns(&cluster, &mut report),
            Ok(other) => report.warning(
                root.push("type"),
                "not_for_grpc",
                format!(
                    "{} clusters work for Envoy but gRPC clients accept only EDS, LOGICAL_DNS \
                     and aggregate clusters (gRFC A37)",
                    other.as_str_name()
                ),
            ),
            Err(_) => report.error(
                root.push("type"),
                "invalid_cluster_type",
                format!("unknown discovery type {t}"),
            ),
        },
        Some(ClusterDiscoveryType::ClusterType(custom)) => {
            let at = root.push("cluster_type");
            let Some(typed_config) = &custom.typed_config else {
                report.error(
                    at.push("typed_config"),
                    "missing_field",
                    "`cluster_type` needs `typed_config`",
                );
                return report;
            };
            if typed_config.type_url != AGGREGATE_CONFIG_TYPE_URL {
                report.warning(
                    at.push("typed_config").push("@type"),
                    "not_for_grpc",
                    format!(
                        "custom cluster type `{}`: gRPC clients accept only the aggregate \
                         cluster type ({AGGREGATE_CONFIG_TYPE_URL})",
                        typed_config.type_url
                    ),
                );
                return report;
            }
            let clusters_at = at.push("typed_config").push("clusters");
            match ClusterConfig::decode(typed_config.value.as_slice()) {
                Err(e) => report.error(at.push("typed_config"), "invalid_body", e.to_string()),
                Ok(config) if config.clusters.is_empty() => report.error(
                    clusters_at,
                    "empty_aggregate",
                    "an aggregate cluster needs at least one cluster in `clusters`",
                ),
                Ok(config) => {
                    for (i, child) in config.clusters.iter().enumerate() {
                        if child.is_empty() {
                            report.error(
                                clusters_at.push(i),
                                "empty_name",
                                "cluster names must not be empty",
                            );
                        }
                    }
                    // The graph is keyed by normal names: two spellings of one xdstp name
                    // (context parameters in another order) are one cluster, so neither a
                    // cycle nor the depth limit can hide behind a respelling.
                    let children = config
                        .clusters
                        .into_iter()
                        .map(|child| match vxds_core::xdstp::normalize(&child) {
                            Ok(normal) => normal.into_owned(),
                            Err(_) => child,
                        })
                        .collect();
                    report.aggregate_children = Some(children);
                }
            }
        }
        None => report.warning(
            root.push("type"),
            "not_for_grpc",
            "neither `type` nor `cluster_type` is set, so Envoy treats the cluster as STATIC; gRPC \
             clients need EDS, LOGICAL_DNS or an aggregate cluster (gRFC A37)",
        ),
    }
    report
}

fn check_eds(cluster: &Cluster, report: &mut RuleReport) {
    let at = Pointer::root().push("eds_cluster_config");
    let Some(eds) = &cluster.eds_cluster_config else {
        report.error(
            at,
            "missing_field",
            "EDS clusters need `eds_cluster_config`",
        );
        return;
    };
    let Some(source) = &eds.eds_config else {
        report.error(
            at.push("eds_config"),
            "missing_field",
            "EDS clusters need `eds_cluster_config.eds_config` (e.g. `{\"ads\": {}}`)",
        );
        return;
    };
    match &source.config_source_specifier {
        Some(ConfigSourceSpecifier::Ads(_)) | Some(ConfigSourceSpecifier::Self_(_)) => {}
        Some(_) => report.warning(
            at.push("eds_config"),
            "not_for_grpc",
            "gRPC clients fetch EDS only over ADS or from the same server (`ads` or `self`)",
        ),
        None => report.error(
            at.push("eds_config"),
            "missing_field",
            "`eds_config` needs a source: `ads`, `self`, `api_config_source` or `path_config_source`",
        ),
    }
}

/// A37: exactly one locality with exactly one endpoint with an address and a port.
fn check_logical_dns(cluster: &Cluster, report: &mut RuleReport) {
    let mut at = Pointer::root().push("load_assignment");
    let need = "LOGICAL_DNS clusters need";
    let Some(assignment) = &cluster.load_assignment else {
        report.error(at, "missing_field", format!("{need} `load_assignment`"));
        return;
    };
    at = at.push("endpoints");
    if assignment.endpoints.len() != 1 {
        report.error(
            at,
            "logical_dns_endpoints",
            format!(
                "{need} exactly one locality in `endpoints`, found {}",
                assignment.endpoints.len()
            ),
        );
        return;
    }
    at = at.push(0).push("lb_endpoints");
    let lb_endpoints = &assignment.endpoints[0].lb_endpoints;
    if lb_endpoints.len() != 1 {
        report.error(
            at,
            "logical_dns_endpoints",
            format!(
                "{need} exactly one endpoint in `lb_endpoints`, found {}",
                lb_endpoints.len()
            ),
        );
        return;
    }
    at = at.push(0);
    use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier;
    let Some(HostIdentifier::Endpoint(endpoint)) = &lb_endpoints[0].host_identifier else {
        report.error(
            at.push("endpoint"),
            "missing_field",
            format!("{need} `endpoint` to be set"),
        );
        return;
    };
    at = at.push("endpoint").push("address");
    let Some(address) = &endpoint.address else {
        report.error(
            at,
            "missing_field",
            format!("{need} the endpoint's `address`"),
        );
        return;
    };
    use envoy_types::pb::envoy::config::core::v3::address::Address as AddressKind;
    let Some(AddressKind::SocketAddress(socket)) = &address.address else {
        report.error(
            at.push("socket_address"),
            "missing_field",
            format!("{need} a `socket_address`"),
        );
        return;
    };
    at = at.push("socket_address");
    if socket.address.is_empty() {
        report.error(
            at.push("address"),
            "missing_field",
            format!("{need} a non-empty host in `address`"),
        );
    }
    if !matches!(socket.port_specifier, Some(PortSpecifier::PortValue(_))) {
        report.error(
            at.push("port_value"),
            "missing_field",
            format!("{need} `port_value`"),
        );
    }
}

/// A broken rule of the aggregate-cluster graph, attributed to one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphProblem {
    pub cluster: String,
    pub code: &'static str,
    pub message: String,
}

/// Checks the aggregate graph `edges` (aggregate cluster → the clusters it points to, over all
/// its variants) for cycles and chains deeper than [`MAX_AGGREGATE_DEPTH`]. Only problems that
/// involve a cluster in `changed` are reported, attributed to one of them.
pub fn check_aggregate_graph(
    edges: &BTreeMap<String, BTreeSet<String>>,
    changed: &BTreeSet<String>,
) -> Vec<GraphProblem> {
    // Iterative throughout: a hostile chain of thousands of clusters must not blow the stack.
    let mut nodes: BTreeSet<&str> = edges.keys().map(String::as_str).collect();
    nodes.extend(edges.values().flatten().map(String::as_str));
    let mut parents: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    let mut in_degree: BTreeMap<&str, usize> = nodes.iter().map(|n| (*n, 0)).collect();
    for (parent, children) in edges {
        for child in children {
            parents.entry(child).or_default().push(parent);
            *in_degree.entry(child).or_default() += 1;
        }
    }
    let children_of = |n: &str| edges.get(n).into_iter().flatten().map(String::as_str);

    // Kahn's algorithm: what it cannot order lies on or below a cycle.
    let mut queue: VecDeque<&str> = in_degree
        .iter()
        .filter(|(_, d)| **d == 0)
        .map(|(n, _)| *n)
        .collect();
    let mut order = Vec::with_capacity(nodes.len());
    while let Some(n) = queue.pop_front() {
        order.push(n);
        for child in children_of(n) {
            let d = in_degree.get_mut(child).expect("every child is a node");
            *d -= 1;
            if *d == 0 {
                queue.push_back(child);
            }
        }
    }
    let ordered: BTreeSet<&str> = order.iter().copied().collect();
    let unordered: BTreeSet<&str> = nodes.difference(&ordered).copied().collect();

    let mut problems = Vec::new();
    if !unordered.is_empty() {
        // Walking parents inside the unordered set always closes a cycle.
        let mut reported: BTreeSet<&str> = BTreeSet::new();
        for start in changed
            .iter()
            .map(String::as_str)
            .filter(|c| unordered.contains(c))
        {
            if reported.contains(start) {
                continue;
            }
            let mut seen: Vec<&str> = vec![start];
            let mut position: BTreeMap<&str, usize> = BTreeMap::from([(start, 0)]);
            let mut at = start;
            let cycle = loop {
                let parent = parents[at]
                    .iter()
                    .copied()
                    .find(|p| unordered.contains(p))
                    .expect("unordered nodes have unordered parents");
                if let Some(&i) = position.get(parent) {
                    break seen[i..].to_vec();
                }
                position.insert(parent, seen.len());
                seen.push(parent);
                at = parent;
            };
            if cycle.iter().any(|c| reported.contains(c)) {
                continue;
            }
            reported.extend(cycle.iter().copied());
            // `cycle` runs child → parent; show it the way the edges point, from a changed
            // cluster (the walk may have started below the cycle).
            let mut path: Vec<&str> = cycle.iter().rev().copied().collect();
            let owner = if path.contains(&start) {
                start
            } else {
                path.iter()
                    .copied()
                    .find(|c| changed.contains(*c))
                    .unwrap_or(start)
            };
            if let Some(i) = path.iter().position(|c| *c == owner) {
                path.rotate_left(i);
            }
            path.push(path[0]);
            problems.push(GraphProblem {
                cluster: owner.to_owned(),
                code: "aggregate_cycle",
                message: format!("aggregate clusters form a cycle: {}", show_path(&path)),
            });
        }
        return problems;
    }

    // Longest chains: clusters from a root down to each node, and from each node down.
    let mut above: BTreeMap<&str, (usize, Option<&str>)> = BTreeMap::new();
    for &n in &order {
        let best = parents
            .get(n)
            .into_iter()
            .flatten()
            .map(|p| (above[p].0, *p))
            .max();
        above.insert(n, best.map_or((1, None), |(d, p)| (d + 1, Some(p))));
    }
    let mut below: BTreeMap<&str, (usize, Option<&str>)> = BTreeMap::new();
    for &n in order.iter().rev() {
        let best = children_of(n).map(|c| (below[c].0, c)).max();
        below.insert(n, best.map_or((1, None), |(d, c)| (d + 1, Some(c))));
    }
    let mut reported_chains = BTreeSet::new();
    for c in changed
        .iter()
        .map(String::as_str)
        .filter(|c| nodes.contains(c))
    {
        let depth = above[c].0 + below[c].0 - 1;
        if depth <= MAX_AGGREGATE_DEPTH {
            continue;
        }
        let mut chain = Vec::new();
        let mut up = above[c].1;
        while let Some(p) = up {
            chain.push(p);
            up = above[p].1;
        }
        chain.reverse();
        let mut down = Some(c);
        while let Some(n) = down {
            chain.push(n);
            down = below[n].1;
        }
        if !reported_chains.insert(chain.clone()) {
            continue;
        }
        problems.push(GraphProblem {
            cluster: c.to_owned(),
            code: "aggregate_too_deep",
            message: format!(
                "an aggregate chain through `{c}` is {depth} clusters deep; the limit is \
                 {MAX_AGGREGATE_DEPTH}: {}",
                show_path(&chain)
            ),
        });
    }
    problems
}

/// `a → b → c`, eliding the middle of very long paths.
fn show_path(path: &[&str]) -> String {
    const SHOWN: usize = 20;
    if path.len() <= SHOWN {
        return path.join(" → ");
    }
    let (head, tail) = (&path[..SHOWN / 2], &path[path.len() - SHOWN / 2..]);
    format!(
        "{} → … ({} more) … → {}",
        head.join(" → "),
        path.len() - SHOWN,
        tail.join(" → ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::ResourceType;
    use serde_json::{Value, json};

    fn cluster(extra: Value) -> RuleReport {
        let mut body =
            json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "c"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let ty = ResourceType::resolve("cluster").unwrap();
        check_cluster(&Body::from_value(&body, &ty).unwrap())
    }

    fn dns(endpoints: Value) -> RuleReport {
        cluster(
            json!({"type": "LOGICAL_DNS", "load_assignment": {"cluster_name": "c", "endpoints": endpoints}}),
        )
    }

    fn codes(problems: &[RuleProblem]) -> Vec<(&str, String)> {
        problems
            .iter()
            .map(|p| (p.code, p.pointer.to_string()))
            .collect()
    }

    #[test]
    fn eds_clusters_need_an_eds_config() {
        assert_eq!(
            cluster(json!({"type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}})),
            RuleReport::default()
        );
        assert_eq!(
            cluster(json!({"type": "EDS", "eds_cluster_config": {"eds_config": {"self": {}}}}))
                .errors,
            vec![]
        );
        assert_eq!(
            codes(&cluster(json!({"type": "EDS"})).errors),
            vec![("missing_field", "/eds_cluster_config".into())]
        );
        assert_eq!(
            codes(&cluster(json!({"type": "EDS", "eds_cluster_config": {}})).errors),
            vec![("missing_field", "/eds_cluster_config/eds_config".into())]
        );
        let path = cluster(
            json!({"type": "EDS", "eds_cluster_config": {"eds_config": {"path_config_source": {"path": "/x"}}}}),
        );
        assert_eq!(
            codes(&path.warnings),
            vec![("not_for_grpc", "/eds_cluster_config/eds_config".into())]
        );
    }

    #[test]
    fn logical_dns_needs_exactly_one_endpoint_with_address_and_port() {
        let ok = dns(
            json!([{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "dns.example", "port_value": 443}}}}]}]),
        );
        assert_eq!(ok, RuleReport::default());

        let base = "/load_assignment/endpoints";
        assert_eq!(
            codes(&cluster(json!({"type": "LOGICAL_DNS"})).errors),
            vec![("missing_field", "/load_assignment".into())]
        );
        assert_eq!(
            codes(&dns(json!([])).errors),
            vec![("logical_dns_endpoints", base.into())]
        );
        assert_eq!(
            codes(&dns(json!([{"lb_endpoints": []}, {"lb_endpoints": []}])).errors),
            vec![("logical_dns_endpoints", base.into())]
        );
        let two = json!([{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "a", "port_value": 1}}}},
            {"endpoint": {"address": {"socket_address": {"address": "b", "port_value": 1}}}}
        ]}]);
        assert_eq!(
            codes(&dns(two).errors),
            vec![("logical_dns_endpoints", format!("{base}/0/lb_endpoints"))]
        );
        let ep = format!("{base}/0/lb_endpoints/0/endpoint");
        assert_eq!(
            codes(&dns(json!([{"lb_endpoints": [{}]}])).errors),
            vec![("missing_field", ep.clone())]
        );
        assert_eq!(
            codes(&dns(json!([{"lb_endpoints": [{"endpoint": {}}]}])).errors),
            vec![("missing_field", format!("{ep}/address"))]
        );
        assert_eq!(
            codes(
                &dns(
                    json!([{"lb_endpoints": [{"endpoint": {"address": {"pipe": {"path": "/p"}}}}]}])
                )
                .errors
            ),
            vec![("missing_field", format!("{ep}/address/socket_address"))]
        );
        let sa = format!("{ep}/address/socket_address");
        assert_eq!(
            codes(&dns(json!([{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": ""}}}}]}])).errors),
            vec![("missing_field", format!("{sa}/address")), ("missing_field", format!("{sa}/port_value"))]
        );
        assert_eq!(
            codes(&dns(json!([{"lb_endpoints": [{"endpoint": {"address": {"socket_address": {"address": "a", "named_port": "http"}}}}]}])).errors),
            vec![("missing_field", format!("{sa}/port_value"))]
        );
    }

    #[test]
    fn aggregate_clusters_need_clusters() {
        let agg = |clusters: Value| {
            cluster(
                json!({"cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
                "@type": AGGREGATE_CONFIG_TYPE_URL, "clusters": clusters}}}),
            )
        };
        let ok = agg(json!(["primary", "fallback"]));
        assert_eq!(ok.errors, vec![]);
        assert_eq!(
            ok.aggregate_children,
            Some(vec!["primary".into(), "fallback".into()])
        );
        assert_eq!(
            codes(&agg(json!([])).errors),
            vec![(
                "empty_aggregate",
                "/cluster_type/typed_config/clusters".into()
            )]
        );
        assert_eq!(
            codes(&agg(json!(["a", ""])).errors),
            vec![("empty_name", "/cluster_type/typed_config/clusters/1".into())]
        );
        assert_eq!(
            codes(&cluster(json!({"cluster_type": {"name": "x"}})).errors),
            vec![("missing_field", "/cluster_type/typed_config".into())]
        );
        let custom = cluster(
            json!({"cluster_type": {"name": "envoy.clusters.dynamic_forward_proxy", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy.v3.ClusterConfig"}}}),
        );
        assert_eq!(custom.errors, vec![]);
        assert_eq!(
            codes(&custom.warnings),
            vec![("not_for_grpc", "/cluster_type/typed_config/@type".into())]
        );
    }

    #[test]
    fn other_kinds_pass_with_a_warning() {
        let r = cluster(json!({"type": "STATIC"}));
        assert_eq!(
            (r.errors.len(), codes(&r.warnings)),
            (0, vec![("not_for_grpc", "/type".into())])
        );
        let r = cluster(json!({}));
        assert_eq!((r.errors.len(), r.warnings.len()), (0, 1));
    }

    fn graph(pairs: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        pairs
            .iter()
            .map(|(p, cs)| {
                (
                    (*p).to_owned(),
                    cs.iter().map(|c| (*c).to_owned()).collect(),
                )
            })
            .collect()
    }

    fn changed(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn aggregate_children_are_named_in_normal_form() {
        let report = cluster(
            json!({"cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.clusters.aggregate.v3.ClusterConfig",
            "clusters": ["xdstp://a/envoy.config.cluster.v3.Cluster/c?q=2&p=1", "plain"]}}}),
        );
        assert_eq!(
            report.aggregate_children.unwrap(),
            [
                "xdstp://a/envoy.config.cluster.v3.Cluster/c?p=1&q=2",
                "plain"
            ]
        );
    }

    #[test]
    fn cycles_are_found_and_shown() {
        let g = graph(&[("a", &["b"]), ("b", &["c", "leaf"]), ("c", &["a"])]);
        let problems = check_aggregate_graph(&g, &changed(&["c"]));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].code, "aggregate_cycle");
        assert_eq!(problems[0].cluster, "c");
        assert_eq!(
            problems[0].message,
            "aggregate clusters form a cycle: c → a → b → c"
        );
        let selfloop = check_aggregate_graph(&graph(&[("a", &["a"])]), &changed(&["a"]));
        assert_eq!(
            selfloop[0].message,
            "aggregate clusters form a cycle: a → a"
        );
        // Unrelated changes are not blamed for a cycle elsewhere.
        assert!(check_aggregate_graph(&g, &changed(&["leaf2"])).is_empty());
    }

    #[test]
    fn chains_may_hold_sixteen_clusters() {
        let chain = |n: usize| -> BTreeMap<String, BTreeSet<String>> {
            (0..n - 1)
                .map(|i| (format!("c{i}"), BTreeSet::from([format!("c{}", i + 1)])))
                .collect()
        };
        assert!(check_aggregate_graph(&chain(16), &changed(&["c0"])).is_empty());
        let problems = check_aggregate_graph(&chain(17), &changed(&["c8"]));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].code, "aggregate_too_deep");
        assert!(
            problems[0]
                .message
                .contains("is 17 clusters deep; the limit is 16: c0 → c1"),
            "{}",
            problems[0].message
        );
        // A diamond is not a cycle.
        let diamond = graph(&[("top", &["l", "r"]), ("l", &["leaf"]), ("r", &["leaf"])]);
        assert!(check_aggregate_graph(&diamond, &changed(&["top"])).is_empty());
        // Deep hostile chains do not overflow the stack.
        assert_eq!(
            check_aggregate_graph(&chain(100_000), &changed(&["c0"])).len(),
            1
        );
        let mut ring = chain(100_000);
        ring.insert("c99999".into(), BTreeSet::from(["c0".to_owned()]));
        assert_eq!(
            check_aggregate_graph(&ring, &changed(&["c5"]))[0].code,
            "aggregate_cycle"
        );
    }
}
