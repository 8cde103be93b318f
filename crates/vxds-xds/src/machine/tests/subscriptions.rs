//! Subscriptions as real clients change them mid-stream: Envoy's on-demand CDS on top of the
//! legacy wildcard, Delta re-subscribes, reconnects with locators, new dynamic parameters, and
//! variant switches in SotW.

use super::*;

fn locator(name: &str, params: &[(&str, &str)]) -> ResourceLocator {
    ResourceLocator {
        name: name.into(),
        dynamic_parameters: params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn delta_locators(subscribe: &[ResourceLocator], nonce: &str) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: ROUTE.into(),
        resource_locators_subscribe: subscribe.to_vec(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn ack_delta(m: &mut StreamMachine, response: &DeltaDiscoveryResponse) {
    m.on_delta_request(delta_request(&response.type_url, &[], &[], &response.nonce))
        .unwrap();
}

fn names(r: &DeltaDiscoveryResponse) -> Vec<String> {
    r.resources
        .iter()
        .map(|r| {
            r.resource_name
                .as_ref()
                .map_or(r.name.clone(), |n| n.name.clone())
        })
        .collect()
}

/// `web` split by env, to be split further by version.
fn prod_or_rest(world: &mut World) {
    world.apply(json!([put(
        "route",
        "web",
        &[
            (r#"env = "prod""#, route("web", "prod")),
            (r#"env != "prod""#, route("web", "rest"))
        ]
    )]));
}

#[test]
fn delta_legacy_wildcard_continues_when_names_are_subscribed() {
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "a", &[("*", cluster("a"))]),
        put("cluster", "b", &[("*", cluster("b"))])
    ]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let all = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(names(&all), ["a", "b"]);
    ack_delta(&mut m, &all);
    // Envoy's on-demand CDS: a name on top of the wildcard, not yet there.
    m.on_delta_request(delta_request(CLUSTER, &["od"], &[], ""))
        .unwrap();
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    assert_eq!(r.removed_resources, ["od"], "only the missing name");
    assert!(r.resources.is_empty());
    ack_delta(&mut m, &r);
    assert!(m.poll(&world.snapshot).is_empty());
    // Still a wildcard subscriber: new clusters arrive, nothing is taken away.
    let changed = world.apply(json!([put("cluster", "c", &[("*", cluster("c"))])]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(names(&r), ["c"]);
    assert!(r.removed_resources.is_empty());
    let status = m.status().lock().unwrap().types[0].clone();
    assert!(
        status
            .subscriptions
            .contains(&"* (legacy wildcard)".to_owned())
    );
    // Only unsubscribing `*` ends it.
    ack_delta(&mut m, &r);
    m.on_delta_request(delta_request(CLUSTER, &[], &["*"], ""))
        .unwrap();
    let status = m.status().lock().unwrap().types[0].clone();
    assert_eq!(*status.subscriptions, ["od"]);
}

fn abc(world: &mut World) {
    world.apply(json!([
        put("cluster", "a", &[("*", cluster("a"))]),
        put("cluster", "b", &[("*", cluster("b"))]),
        put("cluster", "c", &[("*", cluster("c"))]),
    ]));
}

/// xds_protocol: after a legacy wildcard, a SotW request that names resources (without `*`)
/// leaves the wildcard; the answer is exactly what it names.
#[test]
fn sotw_naming_resources_after_the_legacy_wildcard_leaves_it() {
    let mut world = World::new();
    abc(&mut world);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    let all = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(sotw_names(&all), ["a", "b", "c"]);
    m.on_sotw_request(sotw_request(CLUSTER, &["a"], &all.nonce, &all.version_info))
        .unwrap();
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let only = sotw(&responses[0]);
    assert_eq!(sotw_names(&only), ["a"]);
    m.on_sotw_request(sotw_request(
        CLUSTER,
        &["a"],
        &only.nonce,
        &only.version_info,
    ))
    .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    let status = m.status().lock().unwrap().types[0].clone();
    assert_eq!(*status.subscriptions, ["a"]);
    assert_eq!(status.resources.len(), 1);
    // No longer a wildcard subscriber: a new cluster does not concern it.
    let changed = world.apply(json!([put("cluster", "d", &[("*", cluster("d"))])]));
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty());
}

/// Envoy's `DeltaSubscriptionState` drops what the wildcard gave it when it unsubscribes `*`:
/// nothing is removed for it, and what it still names stays.
#[test]
fn delta_unsubscribing_the_wildcard_removes_nothing() {
    let mut world = World::new();
    abc(&mut world);
    for legacy in [true, false] {
        let mut m = delta_machine();
        let first: &[&str] = if legacy { &[] } else { &["*", "a"] };
        m.on_delta_request(delta_request(CLUSTER, first, &[], ""))
            .unwrap();
        let all = delta(&m.poll(&world.snapshot)[0]);
        assert_eq!(names(&all), ["a", "b", "c"]);
        ack_delta(&mut m, &all);
        if legacy {
            m.on_delta_request(delta_request(CLUSTER, &["a"], &[], ""))
                .unwrap();
            let again = delta(&m.poll(&world.snapshot)[0]);
            assert_eq!(names(&again), ["a"], "a subscribed name is answered");
            ack_delta(&mut m, &again);
        }
        // `b` is deleted as the client leaves the wildcard: no removal for it either.
        let changed = world.apply(json!([delete("cluster", "b")]));
        m.on_changes(&changed);
        m.on_delta_request(delta_request(CLUSTER, &[], &["*"], ""))
            .unwrap();
        assert!(m.poll(&world.snapshot).is_empty(), "legacy: {legacy}");
        let status = m.status().lock().unwrap().types[0].clone();
        assert_eq!(*status.subscriptions, ["a"]);
        let held: Vec<String> = status
            .resources
            .iter()
            .map(|r| r.name.to_string())
            .collect();
        assert_eq!(held, ["a"]);
        // `a`, still named, is removed when it goes.
        let changed = world.apply(json!([delete("cluster", "a")]));
        m.on_changes(&changed);
        let gone = delta(&m.poll(&world.snapshot)[0]);
        assert_eq!(gone.removed_resources, ["a"]);
        abc(&mut world);
    }
}

#[test]
fn delta_every_subscribed_name_is_answered_even_when_the_client_has_it() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put("cluster", "a", &[("*", cluster("a"))])]));
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web", "gone"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(names(&r), ["web"]);
    assert_eq!(r.removed_resources, ["gone"]);
    ack_delta(&mut m, &r);
    // Dropped and regained before the unsubscribe went out (DeltaSubscriptionState's
    // RemoveThenAdd): the server must answer both again.
    m.on_delta_request(delta_request(ROUTE, &["web", "gone"], &[], ""))
        .unwrap();
    let again = m.poll(&world.snapshot);
    assert_eq!(again.len(), 1, "{again:?}");
    let again = delta(&again[0]);
    assert_eq!(names(&again), ["web"]);
    assert_eq!(again.resources[0].version, r.resources[0].version);
    assert_eq!(again.removed_resources, ["gone"]);
    ack_delta(&mut m, &again);
    assert!(m.poll(&world.snapshot).is_empty());

    // A name the client holds through the wildcard, subscribed on demand: answered too.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &r);
    m.on_delta_request(delta_request(CLUSTER, &["a"], &[], ""))
        .unwrap();
    let again = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(names(&again), ["a"]);
    assert!(again.removed_resources.is_empty());
}

#[test]
fn delta_reconnect_with_locators_keeps_what_the_client_has() {
    let mut world = World::new();
    prod_or_rest(&mut world);
    let prod = [locator("web", &[("env", "prod"), ("version", "v1")])];
    let mut m = delta_machine();
    m.on_delta_request(delta_locators(&prod, "")).unwrap();
    let held = delta(&m.poll(&world.snapshot)[0]);
    let version = held.resources[0].version.clone();
    let constraints = held.resources[0]
        .resource_name
        .clone()
        .unwrap()
        .dynamic_parameter_constraints;

    // The stream is cut; the client reconnects and says what it holds, by name.
    let mut again = delta_machine();
    let mut request = delta_locators(&prod, "");
    request.initial_resource_versions = [("web".to_owned(), version.clone())].into();
    again.on_delta_request(request).unwrap();
    assert!(
        again.poll(&world.snapshot).is_empty(),
        "nothing sent again, nothing removed"
    );
    let status = again.status().lock().unwrap().types[0].clone();
    assert_eq!(status.resources.len(), 1);

    // It is held as the variant: a split replaces it atomically, named with its constraints.
    let changed = split_prod_by_version(&mut world);
    again.on_changes(&changed);
    let responses = again.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    assert!(r.removed_resources.is_empty());
    assert_eq!(r.removed_resource_names.len(), 1);
    assert_eq!(r.removed_resource_names[0].name, "web");
    assert_eq!(
        r.removed_resource_names[0].dynamic_parameter_constraints,
        constraints
    );
    assert_eq!(
        route_tag(&r.resources[0].resource.as_ref().unwrap().value),
        "prod-v1"
    );

    // A client holding an older version gets the current variant, and no bare removal.
    let mut stale = delta_machine();
    let mut request = delta_locators(&prod, "");
    request.initial_resource_versions = [("web".to_owned(), version)].into();
    stale.on_delta_request(request).unwrap();
    let responses = stale.poll(&world.snapshot);
    assert_eq!(responses.len(), 1, "{responses:?}");
    let r = delta(&responses[0]);
    assert_eq!(names(&r), ["web"]);
    assert!(r.removed_resources.is_empty());
    assert!(r.removed_resource_names.is_empty());
    ack_delta(&mut stale, &r);
    assert!(stale.poll(&world.snapshot).is_empty());
}

#[test]
fn delta_reconnect_with_plain_names_and_node_parameters_sends_nothing_again() {
    let mut world = World::new();
    env_routes(&mut world);
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    let mut again = delta_machine();
    let mut request = delta_request(ROUTE, &["web"], &[], "");
    request.node = Some(node_with(ROUTE, &[("env", "prod")]));
    request.initial_resource_versions = [("web".to_owned(), r.resources[0].version.clone())].into();
    again.on_delta_request(request).unwrap();
    assert!(again.poll(&world.snapshot).is_empty());
}

#[test]
fn new_dynamic_parameters_mid_stream_switch_the_variant() {
    let mut world = World::new();
    env_routes(&mut world);
    // SotW: Envoy re-sends the node with the latest nonce and the same names.
    let mut m = sotw_machine();
    let mut first = sotw_request(ROUTE, &["web"], "", "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_sotw_request(first).unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(route_tag(&r.resources[0].value), "prod");
    let mut ack = sotw_request(ROUTE, &["web"], &r.nonce, &r.version_info);
    ack.node = Some(node_with(ROUTE, &[("env", "test")]));
    m.on_sotw_request(ack).unwrap();
    let switched = m.poll(&world.snapshot);
    assert_eq!(switched.len(), 1);
    assert_eq!(route_tag(&sotw(&switched[0]).resources[0].value), "test");
    assert_eq!(
        m.status().lock().unwrap().types[0].params.0,
        BTreeMap::from([("env".to_owned(), "test".to_owned())])
    );
    // The same node again changes nothing.
    let r = sotw(&switched[0]);
    let mut ack = sotw_request(ROUTE, &["web"], &r.nonce, &r.version_info);
    ack.node = Some(node_with(ROUTE, &[("env", "test")]));
    m.on_sotw_request(ack).unwrap();
    assert!(m.poll(&world.snapshot).is_empty());

    // Delta: an update of the name, not a removal.
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    let mut ack = delta_request(ROUTE, &[], &[], &r.nonce);
    ack.node = Some(node_with(ROUTE, &[("env", "test")]));
    m.on_delta_request(ack).unwrap();
    let switched = m.poll(&world.snapshot);
    assert_eq!(switched.len(), 1);
    let r = delta(&switched[0]);
    assert_eq!(names(&r), ["web"]);
    assert!(r.removed_resources.is_empty());
    assert_eq!(
        route_tag(&r.resources[0].resource.as_ref().unwrap().value),
        "test"
    );
    assert_eq!(
        m.status().lock().unwrap().types[0].params.0,
        BTreeMap::from([("env".to_owned(), "test".to_owned())])
    );
}

#[test]
fn sotw_variant_switch_sends_the_name_once() {
    let mut world = World::new();
    prod_or_rest(&mut world);
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &[], "", "");
    request.resource_locators = vec![locator("web", &[("env", "prod"), ("version", "v1")])];
    m.on_sotw_request(request.clone()).unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    request.response_nonce = r.nonce.clone();
    request.version_info = r.version_info.clone();
    m.on_sotw_request(request).unwrap();
    let changed = split_prod_by_version(&mut world);
    m.on_changes(&changed);
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let r = sotw(&responses[0]);
    assert_eq!(sotw_names(&r), ["web"], "only the new variant");
    let wrapped = Resource::decode(r.resources[0].value.as_slice()).unwrap();
    assert_eq!(route_tag(&wrapped.resource.unwrap().value), "prod-v1");
    assert!(m.poll(&world.snapshot).is_empty());
}

#[test]
fn srds_starts_as_a_legacy_wildcard() {
    let mut world = World::new();
    world.apply(json!([put(
        "scoped_route",
        "s",
        &[(
            "*",
            json!({"@type": crate::types::SCOPED_ROUTE, "name": "s", "route_configuration_name": "r",
                   "key": {"fragments": [{"string_key": "x"}]}})
        )]
    )]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(crate::types::SCOPED_ROUTE, &[], &[], ""))
        .unwrap();
    assert_eq!(names(&delta(&m.poll(&world.snapshot)[0])), ["s"]);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(crate::types::SCOPED_ROUTE, &[], "", ""))
        .unwrap();
    assert_eq!(sotw(&m.poll(&world.snapshot)[0]).resources.len(), 1);
}

#[test]
fn delta_a_wildcard_matching_nothing_is_answered_at_once() {
    let mut world = World::new();
    // A cluster, but only for env=prod: the env=test node's wildcard matches nothing.
    world.apply(json!([put(
        "cluster",
        "a",
        &[(r#"env = "prod""#, cluster("a"))]
    )]));
    let empty = World::new();
    for (snapshot, explicit) in [
        (&empty.snapshot, false),
        (&world.snapshot, false),
        (&world.snapshot, true),
    ] {
        let mut m = delta_machine();
        let subscribe: &[&str] = if explicit { &["*"] } else { &[] };
        let mut request = delta_request(CLUSTER, subscribe, &[], "");
        request.node = Some(node_with(CLUSTER, &[("env", "test")]));
        m.on_delta_request(request).unwrap();
        let responses = m.poll(snapshot);
        assert_eq!(responses.len(), 1, "an empty response, not silence");
        let response = delta(&responses[0]);
        assert!(response.resources.is_empty() && response.removed_resources.is_empty());
        // Answered once: its ACK gets nothing more.
        m.on_delta_request(delta_request(CLUSTER, &[], &[], &response.nonce))
            .unwrap();
        assert!(m.poll(snapshot).is_empty());
    }
    // A wildcard that matches something is answered with it, once.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let responses = m.poll(&empty.snapshot);
    assert_eq!(responses.len(), 1);
    // A reconnect that reports what it holds (all of it, unchanged) is sent nothing.
    let mut world = World::new();
    world.apply(json!([put("cluster", "a", &[("*", cluster("a"))])]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let held = delta(&m.poll(&world.snapshot)[0]);
    let mut m = delta_machine();
    let mut reconnect = delta_request(CLUSTER, &[], &[], "");
    reconnect
        .initial_resource_versions
        .insert("a".into(), held.resources[0].version.clone());
    m.on_delta_request(reconnect).unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    // Not a wildcard (EDS by name, on demand): no empty answer for an empty first request.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ENDPOINT, &[], &[], ""))
        .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
}

#[test]
fn unknown_type_urls_are_ignored_and_the_stream_lives() {
    let mut world = World::new();
    world.apply(json!([put("cluster", "c1", &[("*", cluster("c1"))])]));
    for protocol in [Protocol::Sotw, Protocol::Delta] {
        let mut m = StreamMachine::new(1, protocol, &ADS, Arc::new(MachineConfig::default()));
        let unknown = "type.googleapis.com/no.such.Type";
        let request = |m: &mut StreamMachine, type_url: &str| match protocol {
            Protocol::Sotw => m.on_sotw_request(sotw_request(type_url, &[], "", "")),
            Protocol::Delta => m.on_delta_request(delta_request(type_url, &[], &[], "")),
        };
        request(&mut m, CLUSTER).unwrap();
        assert_eq!(m.poll(&world.snapshot).len(), 1);
        // Not answered, not an error: reported once, counted each time.
        let outcome = request(&mut m, unknown).unwrap();
        let first = outcome.unknown_type.unwrap();
        assert_eq!((first.type_url.as_str(), first.first), (unknown, true));
        assert!(
            !request(&mut m, unknown)
                .unwrap()
                .unknown_type
                .unwrap()
                .first
        );
        // Without the prefix it names no message either.
        let bare = request(&mut m, "envoy.config.cluster.v3.Cluster").unwrap();
        assert!(bare.unknown_type.unwrap().first);
        assert!(m.poll(&world.snapshot).is_empty());
        let status = m.status().lock().unwrap().clone();
        assert_eq!(
            status.unknown_types,
            [unknown, "envoy.config.cluster.v3.Cluster"]
        );
        assert_eq!(status.types.len(), 1, "no state for an unknown type");
        // The known types keep working.
        let name = format!("{protocol:?}");
        let changed = world.apply(json!([put("cluster", &name, &[("*", cluster(&name))])]));
        m.on_changes(&changed);
        assert_eq!(m.poll(&world.snapshot).len(), 1);
        // Any message of the API is a type the server can hold.
        let runtime = request(&mut m, crate::types::RUNTIME).unwrap();
        assert!(runtime.unknown_type.is_none());
        // What the client cannot mean stays an error.
        assert_eq!(
            request(&mut m, "").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}

#[test]
fn unknown_types_recorded_per_stream_are_bounded() {
    let mut m = delta_machine();
    let long = format!("type.googleapis.com/{}", "x".repeat(1000));
    for i in 0..40 {
        let type_url = format!("{long}{i}");
        let outcome = m
            .on_delta_request(delta_request(&type_url, &[], &[], ""))
            .unwrap();
        assert_eq!(outcome.unknown_type.unwrap().first, i == 0);
    }
    let status = m.status().lock().unwrap().clone();
    assert_eq!(status.unknown_types.len(), 1, "cut to one spelling");
    assert!(status.unknown_types[0].len() <= crate::status::MAX_UNKNOWN_TYPE_LEN);
    for i in 0..40 {
        let type_url = format!("type.googleapis.com/no.such.Type{i}");
        m.on_delta_request(delta_request(&type_url, &[], &[], ""))
            .unwrap();
    }
    let status = m.status().lock().unwrap().clone();
    assert_eq!(status.unknown_types.len(), crate::status::MAX_UNKNOWN_TYPES);
}

const GLOB: &str = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r/*";
const MEMBER: &str = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/r/web";

fn glob_world() -> World {
    let mut world = World::new();
    world.apply(json!([put(
        "route",
        MEMBER,
        &[
            (r#"env = "prod""#, route(MEMBER, "prod")),
            (r#"env != "prod""#, route(MEMBER, "rest"))
        ]
    )]));
    world
}

#[test]
fn delta_reconnect_with_a_glob_by_locator_keeps_its_members() {
    let world = glob_world();
    let glob = [locator(GLOB, &[("env", "prod")])];
    let mut m = delta_machine();
    m.on_delta_request(delta_locators(&glob, "")).unwrap();
    let held = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(names(&held), [MEMBER]);
    let mut again = delta_machine();
    let mut request = delta_locators(&glob, "");
    request.initial_resource_versions =
        [(MEMBER.to_owned(), held.resources[0].version.clone())].into();
    again.on_delta_request(request).unwrap();
    assert!(again.poll(&world.snapshot).is_empty());
}

#[test]
fn delta_reconnect_with_changed_parameters_swaps_the_held_variant_atomically() {
    let mut world = World::new();
    prod_or_rest(&mut world);
    let mut m = delta_machine();
    m.on_delta_request(delta_locators(&[locator("web", &[("env", "prod")])], ""))
        .unwrap();
    let held = delta(&m.poll(&world.snapshot)[0]);
    let old = held.resources[0].resource_name.clone().unwrap();
    // Reconnected with other parameters: the variant it holds is replaced, by constraints.
    let mut again = delta_machine();
    let mut request = delta_locators(&[locator("web", &[("env", "test")])], "");
    request.initial_resource_versions =
        [("web".to_owned(), held.resources[0].version.clone())].into();
    again.on_delta_request(request).unwrap();
    let responses = again.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    assert!(r.removed_resources.is_empty());
    assert_eq!(r.removed_resource_names.len(), 1);
    assert_eq!(
        r.removed_resource_names[0].dynamic_parameter_constraints,
        old.dynamic_parameter_constraints
    );
    assert_eq!(
        route_tag(&r.resources[0].resource.as_ref().unwrap().value),
        "rest"
    );
}

#[test]
fn delta_a_glob_by_locator_unsubscribed_and_subscribed_again_is_sent_again() {
    let world = glob_world();
    let glob = [locator(GLOB, &[("env", "prod")])];
    let mut m = delta_machine();
    m.on_delta_request(delta_locators(&glob, "")).unwrap();
    let held = delta(&m.poll(&world.snapshot)[0]);
    ack_delta(&mut m, &held);
    let mut unsubscribe = delta_request(ROUTE, &[], &[], "");
    unsubscribe.resource_locators_unsubscribe = glob.to_vec();
    m.on_delta_request(unsubscribe).unwrap();
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "the client drops them itself"
    );
    assert!(m.status().lock().unwrap().types[0].resources.is_empty());
    m.on_delta_request(delta_locators(&glob, "")).unwrap();
    let again = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(names(&again), [MEMBER]);
}

#[test]
fn sotw_two_locators_of_one_name_get_both_variants() {
    let mut world = World::new();
    prod_or_rest(&mut world);
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &[], "", "");
    request.resource_locators = vec![
        locator("web", &[("env", "prod")]),
        locator("web", &[("env", "test")]),
    ];
    m.on_sotw_request(request).unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    let mut tags: Vec<String> = r
        .resources
        .iter()
        .map(|any| {
            let wrapped = Resource::decode(any.value.as_slice()).unwrap();
            route_tag(&wrapped.resource.unwrap().value)
        })
        .collect();
    tags.sort();
    assert_eq!(tags, ["prod", "rest"]);
}

/// A locator spelled with its xdstp context parameters out of order is kept by its spelling and
/// found by its normal form: it gets its variant, follows changes and is forgotten when
/// unsubscribed; a second locator with equal parameters on another stream gets the same.
#[test]
fn delta_locators_spelled_out_of_normal_form_follow_their_resource() {
    let normal = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/web?a=1&b=2";
    let spelled = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/web?b=2&a=1";
    let routes = |world: &mut World, tag: &str| {
        world.apply(json!([put(
            "route",
            normal,
            &[
                (r#"env = "prod""#, route(normal, &format!("prod-{tag}"))),
                (r#"env = "test""#, route(normal, &format!("test-{tag}"))),
            ]
        )]))
    };
    let mut world = World::new();
    routes(&mut world, "1");
    let prod = [locator(spelled, &[("env", "prod")])];
    let mut streams = [delta_machine(), delta_machine()];
    for m in &mut streams {
        m.on_delta_request(delta_locators(&prod, "")).unwrap();
        let first = delta(&m.poll(&world.snapshot)[0]);
        assert_eq!(names(&first), [spelled]);
        let body = &first.resources[0].resource.as_ref().unwrap().value;
        assert_eq!(route_tag(body), "prod-1");
        ack_delta(m, &first);
    }
    let changed = routes(&mut world, "2");
    for m in &mut streams {
        m.on_changes(&changed);
        let update = delta(&m.poll(&world.snapshot)[0]);
        assert_eq!(names(&update), [spelled]);
        let body = &update.resources[0].resource.as_ref().unwrap().value;
        assert_eq!(route_tag(body), "prod-2");
        ack_delta(m, &update);
    }
    let m = &mut streams[0];
    let mut unsubscribe = delta_locators(&[], "");
    unsubscribe.resource_locators_unsubscribe = prod.to_vec();
    m.on_delta_request(unsubscribe).unwrap();
    assert!(m.interest()[ROUTE].names.is_empty());
    let changed = routes(&mut world, "3");
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty(), "forgotten, not updated");
}
