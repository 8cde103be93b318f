//! SotW: nonces, stale answers, NACKs, whole-state responses, wrapping, and the state shared
//! by streams that resolve alike.

use super::*;

#[test]
fn sotw_nonces_are_unique_and_the_node_is_remembered() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put("cluster", "c1", &[("*", cluster("c1"))])]));
    let mut m = sotw_machine();
    let mut first = sotw_request(ROUTE, &["web"], "", "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_sotw_request(first).unwrap();
    let r1 = m.poll(&world.snapshot);
    // Later requests carry no node: the first one's is kept (and its parameters).
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    let r2 = m.poll(&world.snapshot);
    assert_eq!(m.node().unwrap().id, "node-1");
    let nonces: Vec<&str> = r1.iter().chain(&r2).map(Response::nonce).collect();
    assert_eq!(nonces, ["1", "2"]);
    assert_eq!(route_tag(&sotw(&r1[0]).resources[0].value), "prod");
    assert_eq!(m.status().lock().unwrap().node_id, "node-1");
}

#[test]
fn sotw_answers_first_requests_even_when_nothing_exists() {
    let world = World::new();
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(LISTENER, &[], "", ""))
        .unwrap();
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    assert!(sotw(&responses[0]).resources.is_empty());
}

/// Review of 58376dd: a client's version text of a megabyte is not kept for the stream's life
/// by the ACKs after it (the status holds the last ACK's version, shared with the response
/// when the client echoes it).
#[test]
fn a_huge_acked_version_text_is_let_go_by_the_next_ack() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    let huge = "x".repeat(1 << 20);
    m.on_sotw_request(sotw_request(ROUTE, &["web"], &first.nonce, &huge))
        .unwrap();
    let acked = |m: &StreamMachine| {
        let status = m.status();
        let status = status.lock().unwrap();
        status.types[0].last_acked.as_ref().unwrap().version.clone()
    };
    assert_eq!(acked(&m).len(), 1 << 20);
    let changed = world.apply(json!([put("route", "web", &[("*", route("web", "all"))])]));
    m.on_changes(&changed);
    let second = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web"],
        &second.nonce,
        &second.version_info,
    ))
    .unwrap();
    let version = acked(&m);
    assert_eq!(*version, *second.version_info);
}

#[test]
fn sotw_stale_nonces_are_no_answer_but_their_subscription_counts() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put(
        "route",
        "other",
        &[("*", route("other", "o"))]
    )]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    // A change goes out as nonce 2 before the client answered nonce 1.
    let changed = world.apply(json!([put("route", "web", &[("*", route("web", "all"))])]));
    m.on_changes(&changed);
    let second = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(second.nonce, "2");
    // The client's answer to nonce 1 is stale: no ACK, but its new subscription counts.
    let outcome = m
        .on_sotw_request(sotw_request(
            ROUTE,
            &["web", "other"],
            "1",
            &first.version_info,
        ))
        .unwrap();
    assert!(outcome.acks.is_empty() && outcome.nacks.is_empty());
    assert!(outcome.interest_changed);
    assert_eq!(
        *m.status().lock().unwrap().types[0].subscriptions,
        ["other", "web"]
    );
    let third = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(sotw_names(&third), ["other", "web"]);
    // A stale request that changes nothing is not answered.
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web", "other"],
        "2",
        &second.version_info,
    ))
    .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    // The ACK of the latest: nothing more to send.
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web", "other"],
        &third.nonce,
        &third.version_info,
    ))
    .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    assert_eq!(
        m.status().lock().unwrap().types[0]
            .last_acked
            .as_ref()
            .unwrap()
            .version
            .to_string(),
        third.version_info
    );
}

/// Envoy's unified mux: after a NACK, its next request (a new name) carries the nonce it last
/// *accepted*. The name is answered; the request settles nothing and refuses nothing.
#[test]
fn sotw_a_new_name_after_a_nack_is_answered_under_the_last_accepted_nonce() {
    let mut world = World::new();
    let cla = |name: &str, port: u32| {
        put(
            "endpoint",
            name,
            &[(
                "*",
                json!({"@type": ENDPOINT, "cluster_name": name, "endpoints": [{"lb_endpoints": [
                    {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": port}}}}]}]}),
            )],
        )
    };
    world.apply(json!([cla("c1", 1), cla("c2", 2)]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ENDPOINT, &["c1"], "", ""))
        .unwrap();
    let accepted = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ENDPOINT,
        &["c1"],
        &accepted.nonce,
        &accepted.version_info,
    ))
    .unwrap();
    let changed = world.apply(json!([cla("c1", 3)]));
    m.on_changes(&changed);
    let refused = sotw(&m.poll(&world.snapshot)[0]);
    let mut nack = sotw_request(ENDPOINT, &["c1"], &refused.nonce, &accepted.version_info);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "bad endpoints".into(),
        details: vec![],
    });
    assert_eq!(
        m.on_sotw_request(nack).unwrap().nacks.as_slice(),
        [ENDPOINT]
    );
    assert!(m.poll(&world.snapshot).is_empty());
    // Cluster c2 arrives; Envoy asks for its endpoints, stamped with the last good nonce.
    let outcome = m
        .on_sotw_request(sotw_request(
            ENDPOINT,
            &["c1", "c2"],
            &accepted.nonce,
            &accepted.version_info,
        ))
        .unwrap();
    assert!(outcome.acks.is_empty() && outcome.nacks.is_empty());
    let answer = m.poll(&world.snapshot);
    assert_eq!(answer.len(), 1, "c2's endpoints are sent");
    let answer = sotw(&answer[0]);
    let names: Vec<String> = answer
        .resources
        .iter()
        .map(|any| {
            vxds_envoy::pb::envoy::config::endpoint::v3::ClusterLoadAssignment::decode(
                any.value.as_slice(),
            )
            .unwrap()
            .cluster_name
        })
        .collect();
    assert_eq!(names, ["c1", "c2"]);
    // The refusal is still on record.
    let status = m.status().lock().unwrap().types[0].clone();
    assert_eq!(status.last_nacked.unwrap().message, "bad endpoints");
}

#[test]
fn sotw_nacks_are_recorded_and_not_resent_until_the_next_change() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    let mut nack = sotw_request(ROUTE, &["web"], &first.nonce, "");
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "bad route".into(),
        details: vec![],
    });
    let outcome = m.on_sotw_request(nack).unwrap();
    assert_eq!(outcome.nacks.as_slice(), [ROUTE]);
    // The refused version is not sent again, however often the client asks.
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_changes(&[ResourceKey {
        type_url: ROUTE.into(),
        name: "web".into(),
    }]);
    assert!(m.poll(&world.snapshot).is_empty());
    let status = m.status().lock().unwrap().types[0].clone();
    assert_eq!(status.last_nacked.as_ref().unwrap().message, "bad route");
    assert!(status.in_error());
    // The next change is sent.
    let changed = world.apply(json!([put(
        "route",
        "web",
        &[("*", route("web", "fixed"))]
    )]));
    m.on_changes(&changed);
    let next = m.poll(&world.snapshot);
    assert_eq!(next.len(), 1);
    assert_ne!(sotw(&next[0]).version_info, first.version_info);
}

#[test]
fn sotw_answers_new_names_even_when_the_version_is_unchanged() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web"],
        &first.nonce,
        &first.version_info,
    ))
    .unwrap();
    // `missing` does not exist, so the state (and its version) is the same; it is answered.
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web", "missing"],
        &first.nonce,
        &first.version_info,
    ))
    .unwrap();
    let again = m.poll(&world.snapshot);
    assert_eq!(again.len(), 1);
    assert_eq!(sotw(&again[0]).version_info, first.version_info);
}

#[test]
fn sotw_lds_and_cds_responses_are_complete() {
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "a", &[("*", cluster("a"))]),
        put("cluster", "b", &[("*", cluster("b"))]),
    ]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(sotw_names(&first), ["a", "b"]);
    m.on_sotw_request(sotw_request(
        CLUSTER,
        &[],
        &first.nonce,
        &first.version_info,
    ))
    .unwrap();
    // One cluster changes: the response still holds both.
    let changed = world.apply(json!([put(
        "cluster",
        "b",
        &[(
            "*",
            json!({"@type": CLUSTER, "name": "b", "type": "EDS",
        "connect_timeout": "2s", "eds_cluster_config": {"eds_config": {"ads": {}}}})
        )]
    )]));
    m.on_changes(&changed);
    assert_eq!(sotw_names(&sotw(&m.poll(&world.snapshot)[0])), ["a", "b"]);
}

#[test]
fn sotw_wraps_for_locators_and_for_clients_that_ask() {
    let mut world = World::new();
    env_routes(&mut world);
    // Plain names, legacy client: bare.
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    request.node = Some(node_with(ROUTE, &[("env", "test")]));
    m.on_sotw_request(request).unwrap();
    let bare = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(bare.resources[0].type_url, ROUTE);
    assert_eq!(route_tag(&bare.resources[0].value), "test");
    // Plain names, a client with xds.config.resource-in-sotw: wrapped, named the legacy way.
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    let mut node = node_with(ROUTE, &[("env", "test")]);
    node.client_features.push(RESOURCE_IN_SOTW.into());
    request.node = Some(node);
    m.on_sotw_request(request).unwrap();
    let wrapped = Resource::decode(
        sotw(&m.poll(&world.snapshot)[0]).resources[0]
            .value
            .as_slice(),
    )
    .unwrap();
    assert_eq!(wrapped.name, "web");
    assert!(wrapped.resource_name.is_none());
    // Locators: wrapped with the constraints, never omitted.
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &[], "", "");
    request.resource_locators = vec![ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [("env".to_owned(), "prod".to_owned())].into(),
    }];
    m.on_sotw_request(request).unwrap();
    let response = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        response.resources[0].type_url,
        crate::types::RESOURCE_WRAPPER
    );
    let r = Resource::decode(response.resources[0].value.as_slice()).unwrap();
    let name = r.resource_name.unwrap();
    assert_eq!(name.name, "web");
    assert_eq!(
        name.dynamic_parameter_constraints.unwrap(),
        vxds_envoy::constraints::constraints_to_proto(&"env = prod".parse().unwrap()).unwrap()
    );
    assert_eq!(route_tag(&r.resource.unwrap().value), "prod");
}

/// SotW streams whose responses carry the same items share one state and its encoding (issue
/// 24), and what each holds and accepted still follows its own answers: here when a variant
/// swap changes the second key of a state as long as the last.
#[test]
fn sotw_streams_that_resolve_alike_share_one_state() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put("route", "api", &[("*", route("api", "all"))])]));
    let request = |nonce: &str, version: &str| {
        let mut request = sotw_request(ROUTE, &[], nonce, version);
        request.resource_locators = ["api", "web"]
            .map(|name| ResourceLocator {
                name: name.into(),
                dynamic_parameters: [("env", "prod"), ("version", "v1")]
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .into(),
            })
            .into();
        request
    };
    let held = |m: &StreamMachine| -> Vec<(String, Option<String>)> {
        let status = m.status();
        let status = status.lock().unwrap();
        (status.types[0].resources.iter())
            .map(|r| {
                (
                    r.name.to_string(),
                    r.constraints.as_ref().map(|c| c.to_string()),
                )
            })
            .collect()
    };
    let accepted = |m: &StreamMachine| -> Vec<String> {
        (m.types[ROUTE].accepted_items())
            .map(|item| {
                route_tag(
                    &prost_types::Any::decode(item.variant().body.clone())
                        .unwrap()
                        .value,
                )
            })
            .collect()
    };
    let sotw_of = |response: &Response| match response {
        Response::Sotw(r) => r.clone(),
        Response::Delta(_) => panic!("expected SotW"),
    };
    let mut machines = [sotw_machine(), sotw_machine(), sotw_machine()];
    let mut sent = Vec::new();
    for m in &mut machines {
        m.on_sotw_request(request("", "")).unwrap();
        let responses = m.poll(&world.snapshot);
        assert_eq!(responses.len(), 1);
        sent.push(sotw_of(&responses[0]));
    }
    // The first response of a state is its stream's own; from the second on, it is shared.
    assert_eq!(sent[0], sent[1]);
    assert_eq!(sent[1], sent[2]);
    assert!(std::ptr::eq(
        sent[1].resources.as_ptr(),
        sent[2].resources.as_ptr()
    ));
    for (m, r) in machines.iter_mut().zip(&sent) {
        m.on_sotw_request(request(&r.nonce, &r.version_info))
            .unwrap();
        assert_eq!(accepted(m), ["all", "prod"]);
    }

    // web's env=prod variant splits by version: another key in the second place.
    let changed = split_prod_by_version(&mut world);
    let mut swapped = Vec::new();
    for m in &mut machines {
        m.on_changes(&changed);
        let responses = m.poll(&world.snapshot);
        assert_eq!(responses.len(), 1, "the swap goes in one response");
        swapped.push(sotw_of(&responses[0]));
        let decoded = sotw(&responses[0]);
        let tags: Vec<String> = (decoded.resources.iter())
            .map(|any| {
                route_tag(
                    &Resource::decode(any.value.as_slice())
                        .unwrap()
                        .resource
                        .unwrap()
                        .value,
                )
            })
            .collect();
        assert_eq!(tags, ["all", "prod-v1"]);
        assert_eq!(
            held(m),
            [
                ("api".to_owned(), None),
                (
                    "web".to_owned(),
                    Some(r#"env = "prod" && version = "v1""#.to_owned())
                )
            ]
        );
        // Not accepted before the client says so.
        assert_eq!(accepted(m), ["all", "prod"]);
    }
    assert!(std::ptr::eq(
        swapped[1].resources.as_ptr(),
        swapped[2].resources.as_ptr()
    ));
    // One accepts, the other refuses: each keeps its own.
    let [first, second, _] = &mut machines;
    first
        .on_sotw_request(request(&swapped[0].nonce, &swapped[0].version_info))
        .unwrap();
    assert_eq!(accepted(first), ["all", "prod-v1"]);
    let mut refusal = request(&swapped[1].nonce, &sent[1].version_info);
    refusal.error_detail = Some(RpcStatus {
        message: "no".into(),
        ..Default::default()
    });
    second.on_sotw_request(refusal).unwrap();
    assert_eq!(accepted(second), ["all", "prod"]);
}

#[test]
fn sotw_clients_matching_no_variant_see_the_resource_as_absent() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([
        put(
            "cluster",
            "only-prod",
            &[(r#"env = "prod""#, cluster("only-prod"))]
        ),
        put("cluster", "all", &[("*", cluster("all"))])
    ]));
    let mut m = sotw_machine();
    let mut request = sotw_request(CLUSTER, &[], "", "");
    request.node = Some(node_with(CLUSTER, &[("env", "qa")]));
    m.on_sotw_request(request).unwrap();
    assert_eq!(sotw_names(&sotw(&m.poll(&world.snapshot)[0])), ["all"]);
}
