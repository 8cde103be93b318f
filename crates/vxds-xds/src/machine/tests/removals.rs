//! When a removal may go (A74): once every response sent up to the moment it became due is
//! answered — not while one is unanswered, nor while one is refused if the client's accepted
//! configuration still names it — and never held up by what is sent later or by a type the
//! client stopped watching.

use super::*;

fn nack_delta(m: &mut StreamMachine, response: &DeltaDiscoveryResponse) {
    let mut nack = delta_request(&response.type_url, &[], &[], &response.nonce);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "refused".into(),
        details: vec![],
    });
    m.on_delta_request(nack).unwrap();
}

fn ack_delta(m: &mut StreamMachine, response: &DeltaDiscoveryResponse) {
    m.on_delta_request(delta_request(&response.type_url, &[], &[], &response.nonce))
        .unwrap();
}

fn endpoint(cluster: &str, tag: &str) -> Value {
    json!({"@type": ENDPOINT, "cluster_name": cluster,
           "endpoints": [{"locality": {"zone": tag}}]})
}

/// A Delta client with the CDS wildcard (`old`, `keep`) and the endpoints `e`, all acknowledged.
fn delta_client(world: &mut World) -> StreamMachine {
    world.apply(json!([
        put("cluster", "old", &[("*", cluster("old"))]),
        put("cluster", "keep", &[("*", cluster("keep"))]),
        put("endpoint", "e", &[("*", endpoint("e", "1"))]),
    ]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    m.on_delta_request(delta_request(ENDPOINT, &["e"], &[], ""))
        .unwrap();
    for r in m.poll(&world.snapshot) {
        ack_delta(&mut m, &delta(&r));
    }
    m
}

#[test]
fn sotw_a_type_no_longer_watched_holds_nothing_back() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([
        put("cluster", "a", &[("*", cluster("a"))]),
        put("cluster", "b", &[("*", cluster("b"))])
    ]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let initial = m.poll(&world.snapshot);
    let mut route_nonce = String::new();
    for r in &initial {
        let r = sotw(r);
        let names: &[&str] = if r.type_url == ROUTE { &["web"] } else { &[] };
        if r.type_url == ROUTE {
            route_nonce = r.nonce.clone();
        }
        m.on_sotw_request(sotw_request(&r.type_url, names, &r.nonce, &r.version_info))
            .unwrap();
    }
    // Envoy drops its last route watch: a request with no names. It will never answer a
    // response for that type again, so none is sent, and nothing waits for one.
    m.on_sotw_request(sotw_request(ROUTE, &[], &route_nonce, ""))
        .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    let changed = world.apply(json!([delete("cluster", "a")]));
    m.on_changes(&changed);
    let removal = m.poll(&world.snapshot);
    assert_eq!(removal.len(), 1);
    assert_eq!(sotw_names(&sotw(&removal[0])), ["b"]);
}

#[test]
fn delta_a_type_no_longer_watched_holds_nothing_back() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    // An endpoint update in flight, then the client drops its last endpoint watch: it will
    // not answer that update.
    let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", "2"))])]));
    m.on_changes(&changed);
    assert_eq!(m.poll(&world.snapshot).len(), 1);
    m.on_delta_request(delta_request(ENDPOINT, &[], &["e"], ""))
        .unwrap();
    let changed = world.apply(json!([delete("cluster", "old")]));
    m.on_changes(&changed);
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["old"]);
}

#[test]
fn later_churn_on_another_type_does_not_starve_a_removal() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    // One revision: `keep` updated, `old` deleted. The update goes; the removal waits for it.
    let changed = world.apply(json!([
        put(
            "cluster",
            "keep",
            &[(
                "*",
                json!({"@type": CLUSTER, "name": "keep", "type": "EDS",
            "eds_cluster_config": {"eds_config": {"ads": {}}}, "connect_timeout": "2s"})
            )]
        ),
        delete("cluster", "old"),
    ]));
    m.on_changes(&changed);
    let make = m.poll(&world.snapshot);
    assert_eq!(make.len(), 1);
    let make = delta(&make[0]);
    assert!(make.removed_resources.is_empty());
    // Endpoints churn, unanswered, while the cluster update is acknowledged.
    for tag in ["2", "3"] {
        let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", tag))])]));
        m.on_changes(&changed);
        let responses = m.poll(&world.snapshot);
        assert_eq!(responses.len(), 1);
        assert_eq!(responses[0].type_url(), ENDPOINT);
    }
    ack_delta(&mut m, &make);
    // Every response sent before the removal became due is accepted: it goes, although
    // endpoint updates sent later are still in flight.
    let removal = m.poll(&world.snapshot);
    assert_eq!(removal.len(), 1);
    assert_eq!(delta(&removal[0]).removed_resources, ["old"]);
}

#[test]
fn a_removal_waits_for_updates_sent_before_it_became_due() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    // An endpoint update goes out (unanswered); a later revision deletes `old`.
    let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", "2"))])]));
    m.on_changes(&changed);
    let update = delta(&m.poll(&world.snapshot)[0]);
    let changed = world.apply(json!([delete("cluster", "old")]));
    m.on_changes(&changed);
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "the update is in flight"
    );
    ack_delta(&mut m, &update);
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["old"]);
}

fn route_to(name: &str, cluster: &str) -> Value {
    json!({"@type": ROUTE, "name": name, "virtual_hosts": [{"name": "v", "domains": ["*"],
           "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]})
}

/// Issue 20, finding 5: a refused update on one type never holds back a removal that nothing
/// the client accepted names.
#[test]
fn a_refused_update_never_holds_back_a_removal_nothing_accepted_needs() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    world.apply(json!([put("route", "r", &[("*", route_to("r", "keep"))])]));
    m.on_delta_request(delta_request(ROUTE, &["r"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &r);
    // A route update is refused, for good (an extension missing from the client's build).
    let changed = world.apply(json!([put("route", "r", &[("*", route_to("r", "keep2"))])]));
    m.on_changes(&changed);
    let refused = delta(&m.poll(&world.snapshot)[0]);
    nack_delta(&mut m, &refused);
    // `old` is deleted: no accepted route names it, so it goes at once.
    let changed = world.apply(json!([delete("cluster", "old")]));
    m.on_changes(&changed);
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["old"]);
    ack_delta(&mut m, &removal);
    // `keep` is named by the accepted route: deleted, it stays while the refusal stands.
    let changed = world.apply(json!([delete("cluster", "keep")]));
    m.on_changes(&changed);
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "the accepted route needs it"
    );
    // The route is fixed and accepted, naming something else: now `keep` may go.
    let changed = world.apply(json!([put("route", "r", &[("*", route_to("r", "other"))])]));
    m.on_changes(&changed);
    let fixed = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &fixed);
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["keep"]);
}

#[test]
fn a_removal_the_accepted_configuration_needs_waits_for_a_later_acceptance() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    world.apply(json!([put("route", "r", &[("*", route_to("r", "old"))])]));
    m.on_delta_request(delta_request(ROUTE, &["r"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &r);
    // One revision moves the route away from `old` and deletes it; the route is refused.
    let changed = world.apply(json!([
        put("route", "r", &[("*", route_to("r", "keep"))]),
        delete("cluster", "old"),
    ]));
    m.on_changes(&changed);
    let make = m.poll(&world.snapshot);
    assert_eq!(make.len(), 1);
    nack_delta(&mut m, &delta(&make[0]));
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "the accepted route names old"
    );
    let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", "2"))])]));
    m.on_changes(&changed);
    let other = m.poll(&world.snapshot);
    assert_eq!(other.len(), 1, "other updates still go: {other:?}");
    ack_delta(&mut m, &delta(&other[0]));
    assert!(m.poll(&world.snapshot).is_empty(), "still held back");
    // A later route update, accepted: now `old` may go.
    let changed = world.apply(json!([put("route", "r", &[("*", route_to("r", "newer"))])]));
    m.on_changes(&changed);
    let fixed = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &fixed);
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["old"]);
}

#[test]
fn a_locator_that_stops_matching_is_reported_removed_once() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = delta_machine();
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.resource_locators_subscribe = vec![ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [("env".to_owned(), "prod".to_owned())].into(),
    }];
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &r);
    let changed = world.apply(json!([put(
        "route",
        "web",
        &[(r#"env = "test""#, route("web", "test"))]
    )]));
    m.on_changes(&changed);
    let mut removed = Vec::new();
    for _ in 0..3 {
        for response in m.poll(&world.snapshot) {
            let response = delta(&response);
            assert!(response.removed_resources.is_empty());
            removed.extend(response.removed_resource_names.clone());
            ack_delta(&mut m, &response);
        }
    }
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert!(removed[0].dynamic_parameter_constraints.is_some());
}

#[test]
fn sotw_a_refused_version_may_come_back_once_another_is_accepted() {
    let mut world = World::new();
    world.apply(json!([put("route", "web", &[("*", route("web", "v1"))])]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let v0 = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(ROUTE, &["web"], &v0.nonce, &v0.version_info))
        .unwrap();
    let bad =
        |world: &mut World| world.apply(json!([put("route", "web", &[("*", route("web", "v2"))])]));
    let changed = bad(&mut world);
    m.on_changes(&changed);
    let refused = sotw(&m.poll(&world.snapshot)[0]);
    let mut nack = sotw_request(ROUTE, &["web"], &refused.nonce, &v0.version_info);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "refused".into(),
        details: vec![],
    });
    m.on_sotw_request(nack).unwrap();
    let changed = world.apply(json!([put("route", "web", &[("*", route("web", "v3"))])]));
    m.on_changes(&changed);
    let accepted = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web"],
        &accepted.nonce,
        &accepted.version_info,
    ))
    .unwrap();
    // The operator returns to the content refused earlier (the client may accept it now).
    let changed = bad(&mut world);
    m.on_changes(&changed);
    let back = m.poll(&world.snapshot);
    assert_eq!(back.len(), 1);
    assert_eq!(sotw(&back[0]).version_info, refused.version_info);
}

#[test]
fn sotw_acks_that_lag_behind_churn_still_settle_removals() {
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "gone", &[("*", cluster("gone"))]),
        put("cluster", "keep", &[("*", cluster("keep"))]),
        put("endpoint", "e", &[("*", endpoint("e", "1"))]),
    ]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    m.on_sotw_request(sotw_request(ENDPOINT, &["e"], "", ""))
        .unwrap();
    let ack = |m: &mut StreamMachine, r: &DiscoveryResponse| {
        let names: &[&str] = if r.type_url == ENDPOINT { &["e"] } else { &[] };
        m.on_sotw_request(sotw_request(&r.type_url, names, &r.nonce, &r.version_info))
            .unwrap();
    };
    for r in m.poll(&world.snapshot) {
        ack(&mut m, &sotw(&r));
    }
    // One revision deletes `gone` and changes the endpoints.
    let changed = world.apply(json!([
        delete("cluster", "gone"),
        put("endpoint", "e", &[("*", endpoint("e", "2"))]),
    ]));
    m.on_changes(&changed);
    let make = m.poll(&world.snapshot);
    assert_eq!(
        make.len(),
        1,
        "endpoints only; the cluster state is unchanged"
    );
    let endpoints = sotw(&make[0]);
    // Endpoints churn faster than the client answers: its answer to the first update comes
    // after a second one superseded it.
    let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", "3"))])]));
    m.on_changes(&changed);
    let next = m.poll(&world.snapshot);
    assert_eq!(next.len(), 1);
    ack(&mut m, &endpoints);
    // That answer settled what the removal waited for: it goes with the next push, however
    // the endpoints keep churning.
    let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", "4"))])]));
    m.on_changes(&changed);
    let responses = m.poll(&world.snapshot);
    let types: Vec<&str> = responses.iter().map(Response::type_url).collect();
    assert_eq!(types, [ENDPOINT, CLUSTER]);
    assert_eq!(sotw_names(&sotw(&responses[1])), ["keep"]);
}

#[test]
fn delta_a_missing_locator_is_reported_while_another_variant_is_held() {
    let mut world = World::new();
    world.apply(json!([put(
        "route",
        "web",
        &[(r#"env = "prod""#, route("web", "prod"))]
    )]));
    let locator = |env: &str| ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [("env".to_owned(), env.to_owned())].into(),
    };
    let mut m = delta_machine();
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.resource_locators_subscribe = vec![locator("prod")];
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &r);
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.resource_locators_subscribe = vec![locator("test")];
    m.on_delta_request(request).unwrap();
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1, "{responses:?}");
    let r = delta(&responses[0]);
    assert_eq!(r.removed_resource_names.len(), 1);
    assert_eq!(r.removed_resource_names[0].name, "web");
    assert!(
        r.removed_resource_names[0]
            .dynamic_parameter_constraints
            .is_none()
    );
}

#[test]
fn delta_a_resubscribe_does_not_jump_a_pending_removal() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    m.on_delta_request(delta_request(CLUSTER, &["old"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &r);
    // An endpoint update in flight, then `old` is deleted: its removal waits for the update.
    let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", "2"))])]));
    m.on_changes(&changed);
    let update = delta(&m.poll(&world.snapshot)[0]);
    let changed = world.apply(json!([delete("cluster", "old")]));
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_delta_request(delta_request(CLUSTER, &["old"], &[], ""))
        .unwrap();
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "still waiting for the update"
    );
    ack_delta(&mut m, &update);
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["old"]);
}

/// Review finding 3: a heartbeat carries nothing new, so its ACK is no later acceptance: a
/// removal the accepted configuration needs stays held while the refusal stands.
#[test]
fn an_acknowledged_heartbeat_does_not_lift_a_refusal() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    let timed = |cluster: &str| {
        json!({"type": "route", "name": "r", "variants": [
        {"resource": route_to("r", cluster), "ttl": "2s"}]})
    };
    world.apply(json!([timed("old")]));
    m.on_delta_request(delta_request(ROUTE, &["r"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &r);
    // One revision moves the route away from `old` and deletes it; the route is refused.
    let changed = world.apply(json!([timed("keep"), delete("cluster", "old")]));
    m.on_changes(&changed);
    let make = m.poll(&world.snapshot);
    assert_eq!(make.len(), 1);
    nack_delta(&mut m, &delta(&make[0]));
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "the accepted route names old"
    );
    // The accepted route's heartbeat, acknowledged: the client still holds the route naming
    // `old`, so `old` stays.
    let beats = m.heartbeat(world.snapshot.revision, std::time::Instant::now());
    assert_eq!(beats.len(), 1);
    let beat = delta(&beats[0]);
    assert_eq!(beat.resources[0].version, r.resources[0].version);
    ack_delta(&mut m, &beat);
    assert!(m.poll(&world.snapshot).is_empty(), "still held back");
}

/// Review finding 4: a Delta client answering only every other response (in order) answers
/// the ones between too, so they hold back no removal; and a bogus nonce is no answer.
#[test]
fn delta_an_answer_settles_the_earlier_responses_and_a_bogus_nonce_nothing() {
    let mut world = World::new();
    let mut m = delta_client(&mut world);
    let mut last = None;
    for tag in ["2", "3"] {
        let changed = world.apply(json!([put("endpoint", "e", &[("*", endpoint("e", tag))])]));
        m.on_changes(&changed);
        last = Some(delta(&m.poll(&world.snapshot)[0]));
    }
    // A request with a nonce never sent answers nothing.
    m.on_delta_request(delta_request(ENDPOINT, &[], &[], "999999"))
        .unwrap();
    let changed = world.apply(json!([delete("cluster", "old")]));
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty(), "two updates unanswered");
    // Only the second update is answered: the first is settled with it.
    ack_delta(&mut m, last.as_ref().unwrap());
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["old"]);
}

/// Review finding 4: a request with a bogus nonce does not reset the unanswered count.
#[test]
fn a_bogus_nonce_does_not_reset_the_unanswered_bound() {
    let mut world = World::new();
    let config = MachineConfig {
        max_unanswered: 3,
        ..Default::default()
    };
    let mut m = StreamMachine::new(1, Protocol::Delta, &ADS, Arc::new(config));
    m.on_delta_request(delta_request(ENDPOINT, &["e"], &[], ""))
        .unwrap();
    for tag in 0..4 {
        let changed = world.apply(json!([put(
            "endpoint",
            "e",
            &[("*", endpoint("e", &tag.to_string()))]
        )]));
        m.on_changes(&changed);
        assert_eq!(m.poll(&world.snapshot).len(), 1);
        m.on_delta_request(delta_request(ENDPOINT, &[], &[], "bogus"))
            .unwrap();
    }
    let status = m.check_backlog().unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
}
