//! What the benchmark examples share: their one-number command-line options, the clusters
//! `big_write` writes (and `index_memory` counts), so that both measure the same shape, and
//! reading a gauge off the server's `/metrics`.

use serde_json::{Value, json};

/// `--name value` from the command line, or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} takes a number, not {v:?}"))
        })
        .unwrap_or(default)
}

/// The value of the unlabelled metric `name` in a Prometheus text exposition, divided by
/// 2^20 (bytes to MiB, for the heap gauges).
pub fn metric_mib(exposition: &str, name: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| {
            l.strip_prefix(name)?
                .strip_prefix(' ')?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map(|bytes| bytes / f64::from(1u32 << 20))
}

/// Variant `v` of `variants` of the EDS cluster `name`: `env = "e<v>"`, the last one the rest
/// (`env not in (...)`), or `*` alone; each with its own connect timeout and service name.
pub fn cluster_variant(name: &str, v: usize, variants: usize) -> Value {
    let constraints = if variants == 1 {
        "*".to_owned()
    } else if v + 1 < variants {
        format!("env = \"e{v}\"")
    } else {
        let others: Vec<String> = (0..variants - 1).map(|d| format!("\"e{d}\"")).collect();
        format!("env not in ({})", others.join(", "))
    };
    json!({
        "constraints": constraints,
        "resource": {
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "name": name,
            "type": "EDS",
            "connect_timeout": format!("{}.250s", v + 1),
            "lb_policy": "LEAST_REQUEST",
            "eds_cluster_config": {
                "eds_config": {"ads": {}, "resource_api_version": "V3"},
                "service_name": format!("{name}-e{v}"),
            },
        },
    })
}
