//! The responses, decoded with the generated types: what is encoded by hand is what prost reads.

use super::*;
use vxds_envoy::pb::envoy::service::discovery::v3::dynamic_parameter_constraints::{
    SingleConstraint, Type, single_constraint,
};
use vxds_envoy::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryResponse, DynamicParameterConstraints, Resource,
};

fn body(name: &str) -> Bytes {
    let any = prost_types::Any {
        type_url: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration".into(),
        value: vxds_envoy::pb::envoy::config::route::v3::RouteConfiguration {
            name: name.into(),
            ..Default::default()
        }
        .encode_to_vec(),
    };
    Bytes::from(any.encode_to_vec())
}

fn constraints() -> DynamicParameterConstraints {
    DynamicParameterConstraints {
        r#type: Some(Type::Constraint(SingleConstraint {
            key: "env".into(),
            constraint_type: Some(single_constraint::ConstraintType::Value("prod".into())),
        })),
    }
}

#[test]
fn sotw_responses_decode_as_discovery_responses() {
    let c = Bytes::from(constraints().encode_to_vec());
    let response = SotwResponse {
        version_info: "v1".into(),
        type_url: "type.googleapis.com/envoy.config.route.v3.RouteConfiguration".into(),
        nonce: "7".into(),
        resources: vec![
            SotwEntry::Bare(body("a")),
            SotwEntry::Wrapped(Wrapped {
                name: "b".into(),
                naming: Naming::Legacy,
                version: "vb".into(),
                body: Some(body("b")),
                ttl: Some(std::time::Duration::from_millis(2500)),
            }),
            SotwEntry::Wrapped(Wrapped {
                name: "c".into(),
                naming: Naming::Constrained(Some(c)),
                version: "vc".into(),
                body: Some(body("c")),
                ttl: None,
            }),
        ]
        .into(),
    };
    let bytes = response.encode_to_vec();
    assert_eq!(bytes.len(), response.encoded_len());
    // Encoded once for many responses: the same bytes.
    let shared = SotwResponse {
        resources: SotwResources::encoded(response.resources.to_vec()),
        ..response.clone()
    };
    assert_eq!(shared, response);
    assert_eq!(shared.encoded_len(), response.encoded_len());
    assert_eq!(shared.encode_to_vec(), bytes);
    let decoded = DiscoveryResponse::decode(bytes.as_slice()).unwrap();
    assert_eq!(
        (decoded.version_info.as_str(), decoded.nonce.as_str()),
        ("v1", "7")
    );
    assert_eq!(
        decoded.resources[0].value,
        prost_types::Any::decode(body("a")).unwrap().value
    );
    assert_eq!(decoded.resources[1].type_url, RESOURCE_WRAPPER);
    let b = Resource::decode(decoded.resources[1].value.as_slice()).unwrap();
    assert_eq!((b.name.as_str(), b.version.as_str()), ("b", "vb"));
    assert_eq!(b.resource.unwrap().encode_to_vec(), body("b").to_vec());
    let ttl = b.ttl.unwrap();
    assert_eq!((ttl.seconds, ttl.nanos), (2, 500_000_000));
    let c = Resource::decode(decoded.resources[2].value.as_slice()).unwrap();
    let name = c.resource_name.unwrap();
    assert_eq!(name.name, "c");
    assert_eq!(name.dynamic_parameter_constraints, Some(constraints()));
    assert!(c.name.is_empty());
}

#[test]
fn delta_responses_decode_as_delta_discovery_responses() {
    let response = DeltaResponse {
        system_version_info: "12".into(),
        type_url: "t".into(),
        nonce: "n".into(),
        resources: vec![
            Wrapped {
                name: "r".into(),
                naming: Naming::Constrained(None),
                version: "v".into(),
                body: Some(body("r")),
                ttl: None,
            },
            // A heartbeat: no body, a TTL.
            Wrapped {
                name: "h".into(),
                naming: Naming::Legacy,
                version: "vh".into(),
                body: None,
                ttl: Some(std::time::Duration::from_secs(30)),
            },
        ],
        removed_resources: vec!["gone".into(), String::new()],
        removed_resource_names: vec![
            RemovedName {
                name: "old".into(),
                constraints: Some(Bytes::from(constraints().encode_to_vec())),
            },
            RemovedName {
                name: "missing".into(),
                constraints: None,
            },
        ],
    };
    let bytes = response.encode_to_vec();
    assert_eq!(bytes.len(), response.encoded_len());
    let decoded = DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap();
    assert_eq!(decoded.system_version_info, "12");
    assert_eq!(
        decoded.removed_resources,
        vec!["gone".to_owned(), String::new()]
    );
    assert_eq!(
        decoded.removed_resource_names[0].dynamic_parameter_constraints,
        Some(constraints())
    );
    assert_eq!(
        decoded.removed_resource_names[1].dynamic_parameter_constraints,
        None
    );
    let r = &decoded.resources[0];
    assert_eq!(r.resource_name.as_ref().unwrap().name, "r");
    assert_eq!(
        r.resource_name
            .as_ref()
            .unwrap()
            .dynamic_parameter_constraints,
        None
    );
    assert_eq!(r.version, "v");
    let h = &decoded.resources[1];
    assert_eq!((h.name.as_str(), h.version.as_str()), ("h", "vh"));
    assert!(h.resource.is_none());
    assert_eq!(h.ttl.unwrap().seconds, 30);
}

#[test]
fn long_fields_and_lengths_encode_as_prost_reads_them() {
    // Fields on either side of the one-piece limit, lengths of one to three bytes.
    for n in [0, 1, 111, 112, 113, 127, 128, 300, 20_000] {
        let long = "x".repeat(n);
        let response = DeltaResponse {
            system_version_info: long.as_str().into(),
            resources: vec![Wrapped {
                name: long.as_str().into(),
                naming: Naming::Legacy,
                version: long.as_str().into(),
                body: Some(body(&long)),
                ttl: Some(std::time::Duration::new(
                    u64::from(u32::MAX) + 5,
                    999_999_999,
                )),
            }],
            type_url: long.as_str().into(),
            nonce: long.clone(),
            removed_resources: vec![long.clone(), String::new()],
            removed_resource_names: vec![RemovedName {
                name: long.clone(),
                constraints: Some(Bytes::from(constraints().encode_to_vec())),
            }],
        };
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let decoded = DeltaDiscoveryResponse::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.system_version_info, long);
        assert_eq!(
            (decoded.type_url.as_str(), decoded.nonce.as_str()),
            (long.as_str(), long.as_str())
        );
        assert_eq!(decoded.removed_resources, vec![long.clone(), String::new()]);
        assert_eq!(decoded.removed_resource_names[0].name, long);
        let r = &decoded.resources[0];
        assert_eq!(
            (r.name.as_str(), r.version.as_str()),
            (long.as_str(), long.as_str())
        );
        assert_eq!(
            r.resource.as_ref().unwrap().encode_to_vec(),
            body(&long).to_vec()
        );
        let ttl = r.ttl.unwrap();
        assert_eq!(
            (ttl.seconds, ttl.nanos),
            (i64::from(u32::MAX) + 5, 999_999_999)
        );
    }
}
