//! The cost of validating one big changeset, and the share of it that Envoy's proto rules
//! (`proto_rules`) take: 1,000 clusters × 4 variants, each a realistic EDS cluster (timeouts,
//! circuit breakers, outlier detection, a TLS transport socket in a typed config).
//!
//! `cargo bench -p vxds-envoy --bench changeset`; figures in docs/benchmarks.md.

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use vxds_envoy::changeset::{ChangesetRequest, ValidationConfig, validate};
use vxds_envoy::proto_rules;
use vxds_envoy::resource::{Body, ResourceType};

const CLUSTERS: usize = 1_000;
const ENVS: [&str; 4] = ["prod", "staging", "dev", "test"];

fn cluster(name: &str, env: &str) -> Value {
    json!({
        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": name,
        "type": "EDS",
        "eds_cluster_config": {"eds_config": {"ads": {}, "resource_api_version": "V3"}},
        "connect_timeout": "0.25s",
        "lb_policy": "LEAST_REQUEST",
        "circuit_breakers": {"thresholds": [{"max_connections": 1024, "max_requests": 1024}]},
        "outlier_detection": {"consecutive_5xx": 5, "interval": "10s", "enforcing_consecutive_5xx": 100},
        "transport_socket": {"name": "envoy.transport_sockets.tls", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "sni": format!("{name}.{env}.svc"),
            "common_tls_context": {"tls_certificate_sds_secret_configs": [
                {"name": format!("{env}-cert"), "sds_config": {"ads": {}}}]}}}
    })
}

fn request() -> ChangesetRequest {
    let operations: Vec<Value> = (0..CLUSTERS)
        .map(|i| {
            let name = format!("cluster-{i}");
            json!({"op": "put", "type": "cluster", "name": name, "variants": ENVS.iter().map(|env| json!({
                "constraints": format!("env = {env}"), "resource": cluster(&name, env)})).collect::<Vec<_>>()})
        })
        .collect();
    serde_json::from_value(json!({"operations": operations})).expect("a well-formed changeset")
}

fn bench(c: &mut Criterion) {
    let request = request();
    let config = ValidationConfig::default();
    assert!(
        validate(&request, &config).is_ok(),
        "the changeset is valid"
    );
    let ty = ResourceType::resolve("cluster").expect("a known type");
    let bodies: Vec<Body> = (0..CLUSTERS)
        .flat_map(|i| ENVS.map(|env| cluster(&format!("cluster-{i}"), env)))
        .map(|json| Body::from_value(&json, &ty).expect("a cluster"))
        .collect();
    let mut group = c.benchmark_group("changeset_1000x4");
    group.sample_size(10);
    group.bench_function("validate", |b| b.iter(|| validate(&request, &config)));
    group.bench_function("proto_rules_only", |b| {
        b.iter(|| {
            bodies
                .iter()
                .map(|body| proto_rules::check(body.message()).len())
                .sum::<usize>()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
