//! The changeset model and its validation, rule by rule.

use super::*;
use serde_json::json;

mod proto_rules;
mod xdstp;

fn route(name: &str) -> Value {
    json!({"@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration", "name": name})
}

fn put(ty: &str, name: &str, variants: Vec<(Value, Value)>) -> OperationRequest {
    OperationRequest::Put(PutRequest {
        resource_type: ty.into(),
        name: name.into(),
        expected_version: None,
        must_not_exist: false,
        shared: false,
        variants: variants
            .into_iter()
            .map(|(constraints, resource)| VariantRequest {
                constraints,
                resource: resource.into(),
                ttl: None,
                redirect: None,
            })
            .collect(),
    })
}

/// A put of aggregate cluster `name` pointing to `children`.
fn aggregate(name: &str, children: &[&str]) -> OperationRequest {
    put(
        "cluster",
        name,
        vec![(
            json!(null),
            json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": name,
                   "cluster_type": {"name": "envoy.clusters.aggregate", "typed_config": {
                       "@type": rules::AGGREGATE_CONFIG_TYPE_URL, "clusters": children}}}),
        )],
    )
}

fn run(ops: Vec<OperationRequest>) -> Result<Validated, Invalid> {
    validate(
        &ChangesetRequest {
            operations: ops,
            ..Default::default()
        },
        &ValidationConfig::default(),
    )
}

fn problems(ops: Vec<OperationRequest>) -> Vec<(String, String)> {
    run(ops)
        .unwrap_err()
        .errors
        .into_iter()
        .map(|p| (p.pointer.to_string(), p.code))
        .collect()
}

fn op(json: Value) -> OperationRequest {
    let mut json = json;
    json.as_object_mut()
        .unwrap()
        .entry("op")
        .or_insert(json!("put"));
    serde_json::from_value(json).unwrap()
}

#[test]
fn accepts_variants_in_text_json_and_null() {
    let ok = run(vec![put(
        "route",
        "r",
        vec![
            (json!(r#"env = "prod""#), route("r")),
            (
                json!({"constraint": {"key": "env", "value": "test"}}),
                route("r"),
            ),
        ],
    )])
    .unwrap();
    let Action::Put(resource) = &ok.changeset.operations[0].action else {
        panic!()
    };
    assert_eq!(resource.variants.len(), 2);
    assert_eq!(resource.version.len(), 16);
    assert_ne!(resource.variants[0].version, resource.variants[1].version);
    assert_eq!(
        ok.changeset.operations[0].key.type_url,
        "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
    );
    assert!(run(vec![put("route", "r", vec![(json!(null), route("r"))])]).is_ok());
}

#[test]
fn versions_are_content_hashes() {
    let a = run(vec![put(
        "route",
        "r",
        vec![(json!("env = a"), route("r"))],
    )])
    .unwrap();
    let b = run(vec![put(
        "route",
        "r",
        vec![(json!(r#"env == "a""#), route("r"))],
    )])
    .unwrap();
    let version = |v: &Validated| match &v.changeset.operations[0].action {
        Action::Put(r) => r.version.clone(),
        Action::Delete => unreachable!(),
    };
    assert_eq!(version(&a), version(&b));
    let c = run(vec![put(
        "route",
        "r",
        vec![(json!("env = b"), route("r"))],
    )])
    .unwrap();
    assert_ne!(version(&a), version(&c));
}

#[test]
fn ttl_is_validated_and_versioned() {
    let with_ttl = |ttl: &str| {
        let mut op = put("route", "r", vec![(json!(null), route("r"))]);
        if let OperationRequest::Put(put) = &mut op {
            put.variants[0].ttl = Some(ttl.into());
        }
        op
    };
    let variant = |v: &Validated| match &v.changeset.operations[0].action {
        Action::Put(r) => r.variants[0].clone(),
        Action::Delete => unreachable!(),
    };
    let plain = variant(&run(vec![put("route", "r", vec![(json!(null), route("r"))])]).unwrap());
    let thirty = variant(&run(vec![with_ttl("30s")]).unwrap());
    assert_eq!(plain.ttl, None);
    assert_eq!(thirty.ttl, Some(std::time::Duration::from_secs(30)));
    assert_ne!(plain.version, thirty.version);
    assert_ne!(
        thirty.version,
        variant(&run(vec![with_ttl("31s")]).unwrap()).version
    );
    let errors = run(vec![with_ttl("0s")]).unwrap_err().errors;
    assert_eq!(errors[0].code, "invalid_ttl");
    assert_eq!(
        errors[0].pointer.to_string(),
        "/operations/0/variants/0/ttl"
    );
}

#[test]
fn dot_segment_names_are_refused() {
    // A client normalises `/v1/resources/route/.` to `/v1/resources/route/`: no URL reaches them.
    let errors = problems(vec![
        put("route", ".", vec![(json!(null), route("."))]),
        put("route", "..", vec![(json!(null), route(".."))]),
        put("route", "...", vec![(json!(null), route("..."))]),
    ]);
    assert_eq!(
        errors,
        vec![
            ("/operations/0/name".into(), "invalid_name".into()),
            ("/operations/1/name".into(), "invalid_name".into()),
        ]
    );
}

/// A repeat of a kept operation is found by key (an xdstp name in any spelling), and names the
/// first; an operation on another resource after it is kept.
#[test]
fn a_repeat_of_a_kept_operation_is_refused() {
    let x = "xdstp://a/envoy.config.route.v3.RouteConfiguration/x?p=1&q=2";
    let x_respelled = "xdstp://a/envoy.config.route.v3.RouteConfiguration/x?q=2&p=1";
    let delete = |name: &str| {
        OperationRequest::Delete(DeleteRequest {
            resource_type: "route".into(),
            name: name.into(),
            expected_version: None,
        })
    };
    let config = ValidationConfig {
        authorities: vec!["a".into()],
        ..Default::default()
    };
    let request = ChangesetRequest {
        operations: vec![
            delete("r"),
            delete(x),
            delete("s"),
            delete(x_respelled),
            delete("r"),
        ],
        ..Default::default()
    };
    let invalid = validate(&request, &config).unwrap_err();
    let found: Vec<(String, String)> = invalid
        .errors
        .iter()
        .map(|e| (e.pointer.to_string(), e.message.clone()))
        .collect();
    assert_eq!(
        found,
        [
            (
                "/operations/3".to_owned(),
                "operation 3 repeats the resource of operation 1; one operation per resource"
                    .to_owned()
            ),
            (
                "/operations/4".to_owned(),
                "operation 4 repeats the resource of operation 0; one operation per resource"
                    .to_owned()
            ),
        ]
    );
    let mut checker = Checker::with_capacity(&config, 3);
    for op in [delete("r"), delete(x), delete("s")] {
        checker.push(op);
    }
    let checked = checker.finish(ChangesetHeader::default());
    assert!(checked.errors.is_empty());
    assert_eq!(checked.changeset.operations.len(), 3);
}

#[test]
fn reports_every_problem_with_its_pointer() {
    let errors = problems(vec![
        put("nope", "x", vec![(json!(null), route("x"))]),
        put("route", "", vec![(json!("env = "), json!({"name": "y"}))]),
        put(
            "route",
            "r",
            vec![
                (json!("env in (a, b)"), route("r")),
                (json!("env in (b, c)"), route("r")),
            ],
        ),
        put("route", "r2", vec![(json!(null), route("other"))]),
        put("route", "r3", vec![]),
        OperationRequest::Delete(DeleteRequest {
            resource_type: "route".into(),
            name: "r".into(),
            expected_version: None,
        }),
    ]);
    assert_eq!(
        errors,
        vec![
            ("/operations/0/type".into(), "unknown_type".into()),
            ("/operations/1/name".into(), "empty_name".into()),
            (
                "/operations/1/variants/0/constraints".into(),
                "invalid_constraints".into()
            ),
            (
                "/operations/1/variants/0/resource/@type".into(),
                "missing_type".into()
            ),
            (
                "/operations/2/variants/1/constraints".into(),
                "overlapping_variants".into()
            ),
            (
                "/operations/3/variants/0/resource/name".into(),
                "name_mismatch".into()
            ),
            ("/operations/4/variants".into(), "no_variants".into()),
            ("/operations/5".into(), "duplicate_operation".into()),
        ]
    );
    let overlap = run(vec![put(
        "route",
        "r",
        vec![
            (json!("env in (a, b)"), route("r")),
            (json!("env in (b, c)"), route("r")),
        ],
    )])
    .unwrap_err();
    assert_eq!(
        overlap.errors[0].witness,
        Some([("env", "b")].into_iter().collect())
    );
    assert_eq!(
        (overlap.errors[0].operation, overlap.errors[0].variant),
        (Some(0), Some(1))
    );
}

#[test]
fn json_constraint_errors_point_inside_the_constraints() {
    let errors = problems(vec![put(
        "route",
        "r",
        vec![(
            json!({"and_constraints": {"constraints": [{"constraint": {"key": "", "value": "x"}}]}}),
            route("r"),
        )],
    )]);
    assert_eq!(
        errors,
        vec![(
            "/operations/0/variants/0/constraints/and_constraints/constraints/0/constraint/key"
                .into(),
            "empty_key".into()
        )]
    );
}

#[test]
fn pointers_name_fields_as_the_request_spells_them() {
    // Found by the fuzz target `changeset_body`: proto3 JSON takes `notConstraints` for
    // `not_constraints` (and `edsClusterConfig` for `eds_cluster_config`), and the pointers
    // named the protobuf field, a key the request did not hold.
    let cluster = json!({
        "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        "name": "c",
        "type": "EDS",
        "edsClusterConfig": {"serviceName": "c"},
    });
    let errors = problems(vec![put(
        "cluster",
        "c",
        vec![(
            json!({"notConstraints": {"constraint": {"key": "env", "value": "a\u{7f}"}}}),
            cluster,
        )],
    )]);
    assert_eq!(
        errors,
        vec![
            (
                "/operations/0/variants/0/constraints/notConstraints/constraint/value".into(),
                "control_character".into()
            ),
            (
                "/operations/0/variants/0/resource/edsClusterConfig/eds_config".into(),
                "missing_field".into()
            ),
        ]
    );
}

#[test]
fn xdstp_names_are_normalised_and_checked() {
    let name = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?b=2&a=1";
    let ok = run(vec![put("route", name, vec![(json!(null), route(name))])]).unwrap();
    assert_eq!(
        ok.changeset.operations[0].key.name,
        "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r?a=1&b=2"
    );
    let wrong_type = "xdstp://auth/envoy.config.cluster.v3.Cluster/r";
    assert_eq!(
        problems(vec![put(
            "route",
            wrong_type,
            vec![(json!(null), route(wrong_type))]
        )]),
        vec![("/operations/0/name".into(), "xdstp_type_mismatch".into())]
    );
    let config = ValidationConfig {
        authorities: vec!["auth".into()],
        ..Default::default()
    };
    let other = "xdstp://elsewhere/envoy.config.route.v3.RouteConfiguration/r";
    let request = ChangesetRequest {
        operations: vec![put("route", other, vec![(json!(null), route(other))])],
        ..Default::default()
    };
    assert_eq!(
        validate(&request, &config).unwrap_err().errors[0].code,
        "unknown_authority"
    );
}

#[test]
fn standalone_validation_checks_the_aggregate_graph() {
    let request = ChangesetRequest {
        operations: vec![aggregate("a", &["b"]), aggregate("b", &["a"])],
        ..Default::default()
    };
    assert!(validate(&request, &ValidationConfig::default()).is_ok());
    let invalid = validate_standalone(&request, &ValidationConfig::default()).unwrap_err();
    assert_eq!(invalid.errors.len(), 1);
    assert_eq!(invalid.errors[0].code, "aggregate_cycle");
    assert_eq!(invalid.errors[0].pointer.to_string(), "/operations/0");
}

/// Only a changeset that adds aggregate edges needs the graph checked; the edges it leaves are
/// the graph's old ones with its clusters' edges replaced, removed when deleted or made leaves.
#[test]
fn aggregate_edges_are_updated_by_the_clusters_a_changeset_touches() {
    let leaf = |name: &str| {
        put(
            "cluster",
            name,
            vec![(
                json!(null),
                json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": name, "type": "EDS", "eds_cluster_config": {"eds_config": {"ads": {}}}}),
            )],
        )
    };
    let delete = |name: &str| {
        OperationRequest::Delete(DeleteRequest {
            resource_type: "cluster".into(),
            name: name.into(),
            expected_version: None,
        })
    };
    let edges = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, BTreeSet<String>> {
        pairs
            .iter()
            .map(|(p, c)| (p.to_string(), c.iter().map(|c| c.to_string()).collect()))
            .collect()
    };

    let removing = run(vec![leaf("a"), delete("b"), leaf("c")])
        .unwrap()
        .changeset;
    assert!(!removing.adds_aggregate_edges());
    let mut graph = edges(&[("a", &["x"]), ("b", &["a"]), ("z", &["c"])]);
    removing.update_aggregate_edges(&mut graph);
    assert_eq!(graph, edges(&[("z", &["c"])]));

    let adding = run(vec![leaf("a"), aggregate("b", &["a", "c"])])
        .unwrap()
        .changeset;
    assert!(adding.adds_aggregate_edges());
    let mut graph = edges(&[("a", &["x"]), ("z", &["b"])]);
    adding.update_aggregate_edges(&mut graph);
    assert_eq!(graph, edges(&[("b", &["a", "c"]), ("z", &["b"])]));
    // A cycle through a cluster of the changeset is reported against it; clusters of the
    // changeset outside the graph play no part.
    let closing = run(vec![leaf("far"), aggregate("c", &["z"])])
        .unwrap()
        .changeset;
    closing.update_aggregate_edges(&mut graph);
    let problems = closing.graph_problems(&graph);
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].code, "aggregate_cycle");
    assert_eq!(problems[0].operation, Some(1));
}

#[test]
fn warnings_do_not_refuse() {
    let ok = run(vec![put(
        "cluster",
        "s",
        vec![(json!(null), json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "s", "type": "STATIC"}))],
    )])
    .unwrap();
    assert_eq!(ok.warnings[0].code, "not_for_grpc");
    let dead = run(vec![put(
        "route",
        "r",
        vec![(json!("env = a && env = b"), route("r"))],
    )])
    .unwrap();
    assert_eq!(dead.warnings[0].code, "never_matches");
}

#[test]
fn secrets_not_keyed_on_a_trusted_key_are_flagged() {
    let secret = |name: &str| json!({"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", "name": name});
    let request = ChangesetRequest {
        operations: vec![
            put(
                "secret",
                "tls",
                vec![
                    (json!(r#"namespace = "shop""#), secret("tls")),
                    (json!(r#"namespace != "shop""#), secret("tls")),
                ],
            ),
            put("secret", "open", vec![(json!(null), secret("open"))]),
        ],
        ..Default::default()
    };
    let config = ValidationConfig {
        trusted_keys: vec!["namespace".into()],
        ..Default::default()
    };
    let validated = validate(&request, &config).unwrap();
    let flagged: Vec<&str> = validated
        .warnings
        .iter()
        .map(|w| w.pointer.as_str())
        .collect();
    // `namespace != "shop"` reaches every other namespace, and the unconstrained one all.
    assert_eq!(
        flagged,
        [
            "/operations/0/variants/1/constraints",
            "/operations/1/variants/0/constraints"
        ]
    );
    assert_eq!(validated.warnings[0].code, "untrusted_secret_variant");
    assert!(validated.warnings[0].witness.is_some());
    // Without a template nothing is trusted, and nothing is flagged.
    let plain = validate(&request, &ValidationConfig::default()).unwrap();
    assert!(plain.warnings.is_empty(), "{:?}", plain.warnings);
}

#[test]
fn shared_is_a_secret_opt_in_and_part_of_the_version() {
    let secret = json!({"@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret", "name": "ca"});
    let shared = |ty: &str, body: Value| {
        serde_json::from_value::<OperationRequest>(json!({
            "op": "put", "type": ty, "name": "ca", "shared": true,
            "variants": [{"resource": body}],
        }))
        .unwrap()
    };
    let config = ValidationConfig {
        trusted_keys: vec!["namespace".into()],
        ..Default::default()
    };
    let version = |op: OperationRequest| {
        let request = ChangesetRequest {
            operations: vec![op],
            ..Default::default()
        };
        let validated = validate(&request, &config).unwrap();
        let Action::Put(resource) = &validated.changeset.operations[0].action else {
            panic!("a put");
        };
        (
            resource.shared,
            resource.version.clone(),
            validated.warnings.len(),
        )
    };
    // Shared: no warning (the operator said so), recorded, and a version of its own.
    let (is_shared, shared_version, warnings) = version(shared("secret", secret.clone()));
    assert!(is_shared);
    assert_eq!(warnings, 0);
    let (is_shared, plain_version, warnings) =
        version(put("secret", "ca", vec![(json!(null), secret)]));
    assert!(!is_shared);
    assert_eq!(warnings, 1);
    assert_ne!(shared_version, plain_version);
    // Only secrets.
    assert_eq!(
        problems(vec![shared(
            "cluster",
            json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "ca"})
        )]),
        [(
            "/operations/0/shared".to_owned(),
            "shared_not_secret".to_owned()
        )]
    );
    // A delete takes no `shared`.
    let delete = serde_json::from_value::<OperationRequest>(
        json!({"op": "delete", "type": "secret", "name": "ca", "shared": true}),
    );
    assert!(delete.unwrap_err().to_string().contains("shared"));
}

#[test]
fn request_model_reads_the_documented_shape() {
    let request: ChangesetRequest = serde_json::from_value(json!({
        "expected_revision": 3,
        "message": "split prod",
        "operations": [
            {"op": "put", "type": "route", "name": "r", "variants": [{"constraints": "env = prod", "resource": route("r")}]},
            {"op": "delete", "type": "cluster", "name": "old"}
        ]
    }))
    .unwrap();
    assert_eq!(request.expected_revision, Some(3));
    assert!(matches!(request.operations[1], OperationRequest::Delete(_)));
    let bad: Result<ChangesetRequest, _> = serde_json::from_value(
        json!({"operations": [{"op": "put", "type": "r", "name": "r", "variants": [], "extra": 1}]}),
    );
    assert!(bad.is_err());
}
