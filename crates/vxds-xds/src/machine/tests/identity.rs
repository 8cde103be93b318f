//! Trusted parameters: what a client's certificate says overrides what it claims, in every
//! source (node.dynamic_parameters, node metadata, locators), and cannot be left out.

use super::*;
use crate::identity::PeerIdentity;

fn trusted_prod(m: &mut StreamMachine) {
    m.set_peer(
        Some(PeerIdentity {
            uri_sans: vec!["spiffe://td/ns/prod/sa/envoy".into()],
            dns_sans: vec![],
        }),
        vxds_core::ParamSet::new().with("env", "prod"),
    );
}

#[test]
fn trusted_parameters_override_node_parameters_and_metadata() {
    let mut world = World::new();
    env_routes(&mut world);
    // Claimed through node.dynamic_parameters.
    let mut m = sotw_machine();
    trusted_prod(&mut m);
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    request.node = Some(node_with(ROUTE, &[("env", "test")]));
    m.on_sotw_request(request).unwrap();
    let response = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(route_tag(&response.resources[0].value), "prod");
    let status = m.status().lock().unwrap().clone();
    assert_eq!(
        status.identity.as_deref(),
        Some("spiffe://td/ns/prod/sa/envoy")
    );
    assert_eq!(status.trusted_params["env"], "prod");
    assert_eq!(status.types[0].params.0["env"], "prod");
    assert_eq!(status.types[0].param_sources["env"], "identity");

    // Not claimed at all: the trusted value still applies.
    let mut m = sotw_machine();
    trusted_prod(&mut m);
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let response = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(route_tag(&response.resources[0].value), "prod");

    // Claimed through node metadata (TP2's migration path).
    let config = MachineConfig {
        node_metadata_params: vec!["env".into(), "zone".into()],
        ..Default::default()
    };
    let mut m = StreamMachine::new(1, Protocol::Sotw, &ADS, Arc::new(config));
    trusted_prod(&mut m);
    let string = |s: &str| vxds_envoy::pb::google::protobuf::Value {
        kind: Some(vxds_envoy::pb::google::protobuf::value::Kind::StringValue(
            s.into(),
        )),
    };
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    request.node = Some(Node {
        metadata: Some(vxds_envoy::pb::google::protobuf::Struct {
            fields: [
                ("env".to_owned(), string("test")),
                ("zone".to_owned(), string("eu")),
            ]
            .into(),
        }),
        ..Default::default()
    });
    m.on_sotw_request(request).unwrap();
    let response = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(route_tag(&response.resources[0].value), "prod");
    let status = m.status().lock().unwrap().clone();
    assert_eq!(status.types[0].param_sources["env"], "identity");
    assert_eq!(status.types[0].param_sources["zone"], "node.metadata");

    // A node update mid-stream cannot claim it either.
    let mut again = sotw_request(ROUTE, &["web"], &response.nonce, &response.version_info);
    again.node = Some(node_with(ROUTE, &[("env", "test")]));
    m.on_sotw_request(again).unwrap();
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "the variant must not change"
    );
}

#[test]
fn trusted_parameters_override_sotw_locator_parameters() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = sotw_machine();
    trusted_prod(&mut m);
    let mut request = sotw_request(ROUTE, &[], "", "");
    request.resource_locators = vec![ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [("env".to_owned(), "test".to_owned())].into(),
    }];
    m.on_sotw_request(request).unwrap();
    let response = sotw(&m.poll(&world.snapshot)[0]);
    let wrapped = Resource::decode(response.resources[0].value.as_slice()).unwrap();
    assert_eq!(route_tag(&wrapped.resource.unwrap().value), "prod");
}

#[test]
fn trusted_parameters_override_locator_parameters() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = delta_machine();
    trusted_prod(&mut m);
    let claimed = ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [("env".to_owned(), "test".to_owned())].into(),
    };
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.resource_locators_subscribe = vec![claimed.clone()];
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        route_tag(&r.resources[0].resource.as_ref().unwrap().value),
        "prod"
    );
    let constraints = r.resources[0]
        .resource_name
        .clone()
        .unwrap()
        .dynamic_parameter_constraints;
    assert_eq!(
        constraints,
        vxds_envoy::constraints::constraints_to_proto(&r#"env = "prod""#.parse().unwrap())
    );
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();

    // Unsubscribing with the same (claimed) parameters finds the same subscription.
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.resource_locators_unsubscribe = vec![claimed];
    m.on_delta_request(request).unwrap();
    assert!(m.interest()[ROUTE].names.is_empty(), "{:?}", m.interest());
}

fn secret(name: &str) -> serde_json::Value {
    json!({"@type": crate::types::SECRET, "name": name,
           "generic_secret": {"secret": {"inline_string": name}}})
}

/// The secrets of issue 22: `a-cert` bound to namespace a, `env-key` constrained only on an
/// untrusted key, `open` unconstrained, and `ca` unconstrained but marked shared.
fn secrets_world() -> World {
    let mut world = World::new();
    world.apply(json!([
        put("secret", "a-cert", &[(r#"namespace = "a""#, secret("a-cert"))]),
        put("secret", "env-key", &[(r#"env = "prod""#, secret("env-key"))]),
        put("secret", "open", &[("*", secret("open"))]),
        {"type": "secret", "name": "ca", "shared": true,
         "variants": [{"resource": secret("ca")}]},
    ]));
    world
}

fn secret_machine(access: SecretAccess, protocol: Protocol, namespace: &str) -> StreamMachine {
    let config = MachineConfig {
        secrets: access,
        ..Default::default()
    };
    let mut m = StreamMachine::new(1, protocol, &ADS, Arc::new(config));
    m.set_peer(
        Some(PeerIdentity {
            uri_sans: vec![format!("spiffe://td/ns/{namespace}/sa/envoy")],
            dns_sans: vec![],
        }),
        vxds_core::ParamSet::new().with("namespace", namespace),
    );
    m
}

const ALL_SECRETS: [&str; 4] = ["a-cert", "env-key", "open", "ca"];

#[test]
fn secrets_go_only_through_identity_bound_variants_unless_shared() {
    let world = secrets_world();
    let bound = || SecretAccess::IdentityBound(Arc::from(["namespace".to_owned()]));
    // SotW: namespace a gets its own certificate and the shared CA, nothing open.
    let mut m = secret_machine(bound(), Protocol::Sotw, "a");
    let mut request = sotw_request(crate::types::SECRET, &ALL_SECRETS, "", "");
    request.node = Some(node_with(crate::types::SECRET, &[("env", "prod")]));
    m.on_sotw_request(request).unwrap();
    let response = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(sotw_names(&response), ["a-cert", "ca"]);
    // Namespace b: only the shared CA, whatever it claims.
    let mut m = secret_machine(bound(), Protocol::Delta, "b");
    let mut request = delta_request(crate::types::SECRET, &ALL_SECRETS, &[], "");
    request.node = Some(node_with(crate::types::SECRET, &[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let response = delta(&m.poll(&world.snapshot)[0]);
    let names: Vec<&str> = response.resources.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["ca"]);
    assert_eq!(
        response.removed_resources.len(),
        3,
        "the others read as absent: {response:?}"
    );
    // Without authenticated clients, no secret at all; open access serves all four.
    let mut m = secret_machine(SecretAccess::Refused, Protocol::Sotw, "a");
    m.on_sotw_request(sotw_request(crate::types::SECRET, &ALL_SECRETS, "", ""))
        .unwrap();
    assert!(sotw(&m.poll(&world.snapshot)[0]).resources.is_empty());
    let mut m = secret_machine(SecretAccess::Open, Protocol::Sotw, "a");
    let mut request = sotw_request(crate::types::SECRET, &ALL_SECRETS, "", "");
    request.node = Some(node_with(crate::types::SECRET, &[("env", "prod")]));
    m.on_sotw_request(request).unwrap();
    assert_eq!(sotw(&m.poll(&world.snapshot)[0]).resources.len(), 4);
}

#[test]
fn secret_wildcards_and_globs_are_refused() {
    for name in [
        "*",
        "xdstp://vxds/envoy.extensions.transport_sockets.tls.v3.Secret/ns/*",
    ] {
        let mut m = sotw_machine();
        let refused = m
            .on_sotw_request(sotw_request(crate::types::SECRET, &[name], "", ""))
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{name}");
        assert!(refused.message().contains(name), "{refused:?}");
        let mut m = delta_machine();
        let refused = m
            .on_delta_request(delta_request(crate::types::SECRET, &[name], &[], ""))
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{name}");
    }
    // Other types keep their wildcards.
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &["*"], "", ""))
        .unwrap();
}
