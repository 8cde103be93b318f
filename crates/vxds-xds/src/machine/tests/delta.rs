//! Delta, and where a subscription's parameters come from: subscription changes with stale
//! nonces, initial versions, missing resources, locators' constraints and atomic variant
//! swaps, wildcards, glob collections.

use super::*;

// ---- parameters --------------------------------------------------------------------------

#[test]
fn parameters_come_from_locators_then_node_then_metadata() {
    let mut world = World::new();
    env_routes(&mut world);
    let config = MachineConfig {
        node_metadata_params: vec!["env".into()],
        ..Default::default()
    };
    let mut m = StreamMachine::new(1, Protocol::Sotw, &ADS, Arc::new(config));
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    let node = Node {
        metadata: Some(vxds_envoy::pb::google::protobuf::Struct {
            fields: [(
                "env".to_owned(),
                vxds_envoy::pb::google::protobuf::Value {
                    kind: Some(vxds_envoy::pb::google::protobuf::value::Kind::StringValue(
                        "test".into(),
                    )),
                },
            )]
            .into(),
        }),
        ..Default::default()
    };
    request.node = Some(node);
    m.on_sotw_request(request).unwrap();
    let from_metadata = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(route_tag(&from_metadata.resources[0].value), "test");
    assert_eq!(
        m.status().lock().unwrap().types[0].params.0,
        BTreeMap::from([("env".to_owned(), "test".to_owned())])
    );
}

// ---- Delta --------------------------------------------------------------------------------

#[test]
fn delta_honours_subscription_changes_with_a_stale_nonce() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put(
        "route",
        "other",
        &[("*", route("other", "x"))]
    )]));
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let r1 = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r1.resources[0].name, "web");
    m.on_delta_request(delta_request(ROUTE, &["other"], &[], "999"))
        .unwrap();
    let r2 = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        r2.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["other"]
    );
    assert_ne!(r1.nonce, r2.nonce);
}

#[test]
fn delta_initial_versions_spare_what_the_client_has() {
    let mut world = World::new();
    env_routes(&mut world);
    world.apply(json!([put("route", "b", &[("*", route("b", "b"))])]));
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web", "b"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let sent = delta(&m.poll(&world.snapshot)[0]);
    let versions: BTreeMap<String, String> = sent
        .resources
        .iter()
        .map(|r| (r.name.clone(), r.version.clone()))
        .collect();

    // Reconnect: the client already has web (current) and an outdated b.
    let mut again = delta_machine();
    let mut request = delta_request(ROUTE, &["web", "b"], &[], "");
    request.node = Some(node_with(ROUTE, &[("env", "prod")]));
    request.initial_resource_versions = [
        ("web".to_owned(), versions["web"].clone()),
        ("b".to_owned(), "stale".to_owned()),
    ]
    .into();
    again.on_delta_request(request).unwrap();
    let response = delta(&again.poll(&world.snapshot)[0]);
    assert_eq!(
        response
            .resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    // Versions are content hashes: the same on any stream, any replica.
    assert_eq!(response.resources[0].version, versions["b"]);
}

#[test]
fn delta_reports_missing_resources_then_sends_them_when_they_appear() {
    let mut world = World::new();
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ROUTE, &["later"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.removed_resources, ["later"]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    assert!(
        m.poll(&world.snapshot).is_empty(),
        "reported once, not in a loop"
    );
    let changed = world.apply(json!([put(
        "route",
        "later",
        &[("*", route("later", "x"))]
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, "later");
    assert!(r.removed_resources.is_empty());
}

#[test]
fn delta_wraps_locators_with_constraints_and_replaces_variants_atomically() {
    let mut world = World::new();
    world.apply(json!([put(
        "route",
        "web",
        &[
            (r#"env = "prod""#, route("web", "prod")),
            (r#"env != "prod""#, route("web", "rest"))
        ]
    )]));
    let mut m = delta_machine();
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.resource_locators_subscribe = vec![ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [
            ("env".to_owned(), "prod".to_owned()),
            ("version".to_owned(), "v1".to_owned()),
        ]
        .into(),
    }];
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    let name = r.resources[0].resource_name.clone().unwrap();
    assert_eq!(name.name, "web");
    assert!(r.resources[0].name.is_empty());
    let old_constraints = name.dynamic_parameter_constraints.clone().unwrap();
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();

    // TP2's transition: env=prod splits by version. One revision...
    let changed = split_prod_by_version(&mut world);
    m.on_changes(&changed);
    let responses = m.poll(&world.snapshot);
    // ... one response: the old variant's removal and the new variant together.
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    assert_eq!(r.removed_resource_names.len(), 1);
    assert_eq!(r.removed_resource_names[0].name, "web");
    assert_eq!(
        r.removed_resource_names[0].dynamic_parameter_constraints,
        Some(old_constraints)
    );
    assert_eq!(r.resources.len(), 1);
    assert_eq!(
        route_tag(&r.resources[0].resource.as_ref().unwrap().value),
        "prod-v1"
    );
    let new: DynamicParameterConstraints = r.resources[0]
        .resource_name
        .clone()
        .unwrap()
        .dynamic_parameter_constraints
        .unwrap();
    assert_eq!(
        new,
        vxds_envoy::constraints::constraints_to_proto(
            &r#"env = "prod" && version = "v1""#.parse().unwrap()
        )
        .unwrap()
    );
}

#[test]
fn delta_variant_changes_of_plain_name_subscriptions_are_plain_updates() {
    let mut world = World::new();
    world.apply(json!([put("route", "web", &[("*", route("web", "all"))])]));
    let mut m = delta_machine();
    let mut first = delta_request(ROUTE, &["web"], &[], "");
    first.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(first).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    let changed = world.apply(json!([put(
        "route",
        "web",
        &[
            (r#"env = "prod""#, route("web", "prod")),
            (r#"env != "prod""#, route("web", "rest"))
        ]
    )]));
    m.on_changes(&changed);
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    // Never the same name twice in one response: an update, not a removal plus an addition.
    assert!(r.removed_resources.is_empty());
    assert_eq!(r.resources.len(), 1);
    assert_eq!(
        (
            r.resources[0].name.as_str(),
            route_tag(&r.resources[0].resource.as_ref().unwrap().value).as_str()
        ),
        ("web", "prod")
    );
}

#[test]
fn delta_wildcards_legacy_and_explicit() {
    let mut world = World::new();
    world.apply(json!([put("cluster", "a", &[("*", cluster("a"))])]));
    // Legacy: a first CDS request with no names.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, "a");
    m.on_delta_request(delta_request(CLUSTER, &[], &[], &r.nonce))
        .unwrap();
    let changed = world.apply(json!([
        put("cluster", "b", &[("*", cluster("b"))]),
        delete("cluster", "a")
    ]));
    m.on_changes(&changed);
    let add = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        add.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );
    // The removal of `a` waits for the client to acknowledge the addition.
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_delta_request(delta_request(CLUSTER, &[], &[], &add.nonce))
        .unwrap();
    let removal = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removal.removed_resources, ["a"]);

    // Explicit: `*`, and not for routes unless asked.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ROUTE, &[], &[], ""))
        .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_delta_request(delta_request(CLUSTER, &["*"], &[], ""))
        .unwrap();
    assert_eq!(delta(&m.poll(&world.snapshot)[0]).resources[0].name, "b");
}

#[test]
fn delta_glob_collections() {
    let mut world = World::new();
    let l = |name: &str| json!({"type": "listener", "name": name, "variants": [{"resource": listener(name, "r")}]});
    world.apply(json!([
        l("xdstp://auth/envoy.config.listener.v3.Listener/edge/a?zone=eu"),
        l("xdstp://auth/envoy.config.listener.v3.Listener/edge/deep/b?zone=eu"),
        l("xdstp://auth/envoy.config.listener.v3.Listener/edge/c?zone=us"),
    ]));
    let glob = "xdstp://auth/envoy.config.listener.v3.Listener/edge/*?zone=eu";
    let mut m = delta_machine();
    m.on_delta_request(delta_request(LISTENER, &[glob], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        r.resources
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>(),
        ["xdstp://auth/envoy.config.listener.v3.Listener/edge/a?zone=eu"]
    );
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    // An addition to the collection is sent as it happens.
    let changed = world.apply(json!([l(
        "xdstp://auth/envoy.config.listener.v3.Listener/edge/d?zone=eu"
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        r.resources[0].name,
        "xdstp://auth/envoy.config.listener.v3.Listener/edge/d?zone=eu"
    );
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    // Removing every member: the members go, then the collection is reported empty by its name.
    let changed = world.apply(json!([
        delete(
            "listener",
            "xdstp://auth/envoy.config.listener.v3.Listener/edge/a?zone=eu"
        ),
        delete(
            "listener",
            "xdstp://auth/envoy.config.listener.v3.Listener/edge/d?zone=eu"
        ),
    ]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    let mut removed = r.removed_resources.clone();
    removed.sort();
    assert_eq!(removed.len(), 2);
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.removed_resources, [glob]);
    // A glob over nothing is reported at once.
    let mut m = delta_machine();
    m.on_delta_request(delta_request(
        LISTENER,
        &["xdstp://auth/envoy.config.listener.v3.Listener/none/*"],
        &[],
        "",
    ))
    .unwrap();
    assert_eq!(
        delta(&m.poll(&world.snapshot)[0]).removed_resources,
        ["xdstp://auth/envoy.config.listener.v3.Listener/none/*"]
    );
}

/// TP1: a glob collection with no members is answered with its URL in `removed_resources` —
/// also when members exist but none has a variant for this subscriber, and again when the
/// client subscribes to it again.
#[test]
fn delta_empty_glob_collections() {
    let mut world = World::new();
    let member = "xdstp://auth/envoy.config.listener.v3.Listener/edge/a";
    world.apply(json!([put(
        "listener",
        member,
        &[(r#"env = "prod""#, listener(member, "r"))]
    )]));
    let glob = "xdstp://auth/envoy.config.listener.v3.Listener/edge/*";
    let mut m = delta_machine();
    let mut request = delta_request(LISTENER, &[glob], &[], "");
    request.node = Some(node_with(LISTENER, &[("env", "test")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, [glob]);
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    assert!(m.poll(&world.snapshot).is_empty());
    // Subscribed again: answered again.
    m.on_delta_request(delta_request(LISTENER, &[glob], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.removed_resources, [glob]);
    m.on_delta_request(delta_request(LISTENER, &[], &[], &r.nonce))
        .unwrap();
    // A member for this subscriber's variant arrives: sent, and the glob is no longer empty.
    let changed = world.apply(json!([put(
        "listener",
        member,
        &[
            (r#"env = "prod""#, listener(member, "r")),
            (r#"env = "test""#, listener(member, "t"))
        ]
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, member);
    assert!(r.removed_resources.is_empty());
}

#[test]
fn never_the_same_name_twice_in_one_response() {
    let mut world = World::new();
    world.apply(json!([put("cluster", "a", &[("*", cluster("a"))])]));
    let mut m = delta_machine();
    // Subscribed by name and by wildcard at once.
    m.on_delta_request(delta_request(CLUSTER, &["a", "*", "a"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources.len(), 1);
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &["a", "*", "a"], "", ""))
        .unwrap();
    assert_eq!(sotw(&m.poll(&world.snapshot)[0]).resources.len(), 1);
}

/// Streams on one thread, one after another, resolve changed resources through a per-thread
/// memo keyed by the resource and their (shared) parameters: each still gets its own variant of
/// each resource — with repeated parameters (the memo answers), two resources changed in one
/// revision (a key of the parameters alone would mix them up), more parameter sets than the
/// memo has slots, and across a revision that changes the variants' contents.
#[test]
fn streams_resolving_one_after_another_each_get_their_own_variant() {
    let mut world = World::new();
    let envs: Vec<String> = (0..12).map(|i| format!("e{i}")).collect();
    let put_both = |world: &mut World, round: &str| {
        let ops: Vec<Value> = ["web", "api"]
            .iter()
            .map(|name| {
                // In opposite orders: an env's variant has another index in each.
                let mut order: Vec<&String> = envs.iter().collect();
                if *name == "api" {
                    order.reverse();
                }
                let variants: Vec<(String, Value)> = order
                    .into_iter()
                    .map(|e| {
                        let tag = format!("{name}-{e}-{round}");
                        (format!(r#"env = "{e}""#), route(name, &tag))
                    })
                    .collect();
                let variants: Vec<(&str, Value)> = variants
                    .iter()
                    .map(|(c, r)| (c.as_str(), r.clone()))
                    .collect();
                put("route", name, &variants)
            })
            .collect();
        world.apply(Value::Array(ops))
    };
    put_both(&mut world, "a");
    // Three streams per env, side by side (e0 e0 e0 e1 …): the second and third find the
    // first's answers.
    let mut streams: Vec<(String, StreamMachine)> = Vec::new();
    for e in &envs {
        for _ in 0..3 {
            let mut m = delta_machine();
            let mut first = delta_request(ROUTE, &["web", "api"], &[], "");
            first.node = Some(node_with(ROUTE, &[("env", e)]));
            m.on_delta_request(first).unwrap();
            streams.push((e.clone(), m));
        }
    }
    let tags = |sent: &DeltaDiscoveryResponse| -> Vec<(String, String)> {
        let mut tags: Vec<(String, String)> = (sent.resources.iter())
            .map(|r| {
                (
                    r.name.clone(),
                    route_tag(&r.resource.as_ref().unwrap().value),
                )
            })
            .collect();
        tags.sort();
        tags
    };
    let expected = |e: &str, round: &str| {
        vec![
            ("api".to_owned(), format!("api-{e}-{round}")),
            ("web".to_owned(), format!("web-{e}-{round}")),
        ]
    };
    for (e, m) in &mut streams {
        let sent = delta(&m.poll(&world.snapshot)[0]);
        assert_eq!(tags(&sent), expected(e, "a"));
        let nonce = sent.nonce.clone();
        m.on_delta_request(delta_request(ROUTE, &[], &[], &nonce))
            .unwrap();
    }
    let changed = put_both(&mut world, "b");
    for (e, m) in &mut streams {
        m.on_changes(&changed);
        let sent = delta(&m.poll(&world.snapshot)[0]);
        assert_eq!(tags(&sent), expected(e, "b"));
    }
}
