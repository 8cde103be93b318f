//! TP1 list collections, `#entry=`, stored collections and redirects, SotW and Delta.

use vxds_envoy::pb::envoy::config::listener::v3::{Listener, ListenerCollection};
use vxds_envoy::pb::xds::core::v3::ResourceLocator as CoreLocator;
use vxds_envoy::pb::xds::core::v3::collection_entry::ResourceSpecifier;

use super::*;

const LISTENER_COLLECTION: &str = "type.googleapis.com/envoy.config.listener.v3.ListenerCollection";
const EDGE: &str = "xdstp://auth/envoy.config.listener.v3.ListenerCollection/edge?zone=eu";

fn member(id: &str) -> String {
    format!("xdstp://auth/envoy.config.listener.v3.Listener/edge/{id}?zone=eu")
}

/// `edge/a` has a variant per env; `edge/b` one for everyone; `edge/deep/c` and a `zone=us`
/// listener are not members of `edge?zone=eu`.
fn edge_listeners(world: &mut World) {
    let a = member("a");
    let b = member("b");
    let deep = member("deep/c");
    let us = "xdstp://auth/envoy.config.listener.v3.Listener/edge/d?zone=us";
    world.apply(json!([
        put(
            "listener",
            &a,
            &[
                (r#"env = "prod""#, listener(&a, "prod")),
                (r#"env = "test""#, listener(&a, "test")),
            ]
        ),
        put("listener", &b, &[("*", listener(&b, "b"))]),
        put("listener", &deep, &[("*", listener(&deep, "c"))]),
        put("listener", us, &[("*", listener(us, "d"))]),
    ]));
}

fn inline_node(params: &[(&str, &str)]) -> Node {
    let mut node = node_with(LISTENER_COLLECTION, params);
    node.client_features
        .push(vxds_envoy::collections::INLINE_ENTRIES_FEATURE.into());
    node
}

fn collection_of(resource: &Resource) -> ListenerCollection {
    let any = resource.resource.as_ref().unwrap();
    assert_eq!(any.type_url, LISTENER_COLLECTION);
    ListenerCollection::decode(any.value.as_slice()).unwrap()
}

/// Each entry as `locator` or `name=route` (the route an inline listener points to).
fn entries(collection: &ListenerCollection) -> Vec<String> {
    collection
        .entries
        .iter()
        .map(|e| match e.resource_specifier.as_ref().unwrap() {
            ResourceSpecifier::Locator(l) => format!(
                "xdstp://{}/{}/{}?{}",
                l.authority,
                l.resource_type,
                l.id,
                match &l.context_param_specifier {
                    Some(vxds_envoy::pb::xds::core::v3::resource_locator::ContextParamSpecifier::ExactContext(c)) =>
                        c.params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&"),
                    None => String::new(),
                }
            ),
            ResourceSpecifier::InlineEntry(inline) => {
                let any = inline.resource.as_ref().unwrap();
                assert_eq!(any.type_url, LISTENER);
                assert!(!inline.version.is_empty());
                format!("{}={}", inline.name, route_of(&any.value))
            }
        })
        .collect()
}

/// The route name a test listener's HTTP connection manager points to.
fn route_of(listener_bytes: &[u8]) -> String {
    let listener = Listener::decode(listener_bytes).unwrap();
    let any = listener.filter_chains[0].filters[0]
        .config_type
        .as_ref()
        .map(|c| match c {
            vxds_envoy::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any) => {
                any.clone()
            }
            _ => panic!("typed config"),
        })
        .unwrap();
    let hcm = vxds_envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager::decode(any.value.as_slice()).unwrap();
    match hcm.route_specifier.unwrap() {
        vxds_envoy::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager::RouteSpecifier::Rds(rds) => rds.route_config_name,
        _ => panic!("rds"),
    }
}

#[test]
fn delta_list_collections_list_the_globs_members_as_locators() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let mut m = delta_machine();
    let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
    request.node = Some(node_with(LISTENER_COLLECTION, &[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.type_url, LISTENER_COLLECTION);
    assert_eq!(r.resources.len(), 1);
    // Named exactly as requested, context parameters included.
    assert_eq!(r.resources[0].name, EDGE);
    assert_eq!(
        entries(&collection_of(&r.resources[0])),
        [member("a"), member("b")]
    );
}

/// Two subscribers with different parameters get different inline bodies in the same
/// collection; one whose parameters match no variant of `a` gets `b` alone.
#[test]
fn delta_inline_entries_carry_each_subscribers_variant() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let collection_for = |params: &[(&str, &str)]| {
        let mut m = delta_machine();
        let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
        request.node = Some(inline_node(params));
        m.on_delta_request(request).unwrap();
        let r = delta(&m.poll(&world.snapshot)[0]);
        entries(&collection_of(&r.resources[0]))
    };
    assert_eq!(collection_for(&[("env", "prod")]), ["a=prod", "b=b"]);
    assert_eq!(collection_for(&[("env", "test")]), ["a=test", "b=b"]);
    assert_eq!(collection_for(&[("env", "dev")]), ["b=b"]);
}

/// A member's change re-sends the collection once per revision; membership changes too; a
/// change that does not touch what this subscriber gets sends nothing; when no member is left
/// the collection is removed.
#[test]
fn delta_collections_follow_their_members() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let mut m = delta_machine();
    let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
    request.node = Some(inline_node(&[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    let first_version = r.resources[0].version.clone();
    m.on_delta_request(delta_request(LISTENER_COLLECTION, &[], &[], &r.nonce))
        .unwrap();

    // The test variant of `a` changes: not this subscriber's, nothing to send.
    let a = member("a");
    let changed = world.apply(json!([put(
        "listener",
        &a,
        &[
            (r#"env = "prod""#, listener(&a, "prod")),
            (r#"env = "test""#, listener(&a, "test-2")),
        ]
    )]));
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty());

    // Its prod variant changes and a member is added, in one revision: one response.
    let e = member("e");
    let changed = world.apply(json!([
        put(
            "listener",
            &a,
            &[
                (r#"env = "prod""#, listener(&a, "prod-2")),
                (r#"env = "test""#, listener(&a, "test-2")),
            ]
        ),
        put("listener", &e, &[("*", listener(&e, "e"))]),
    ]));
    m.on_changes(&changed);
    let responses = m.poll(&world.snapshot);
    assert_eq!(responses.len(), 1);
    let r = delta(&responses[0]);
    assert_ne!(r.resources[0].version, first_version);
    assert_eq!(
        entries(&collection_of(&r.resources[0])),
        ["a=prod-2", "b=b", "e=e"]
    );
    m.on_delta_request(delta_request(LISTENER_COLLECTION, &[], &[], &r.nonce))
        .unwrap();

    // Every member goes: the collection does not exist any more.
    let changed = world.apply(json!([
        delete("listener", &a),
        delete("listener", &member("b")),
        delete("listener", &e),
    ]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, [EDGE]);
}

#[test]
fn sotw_list_collections() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let mut m = sotw_machine();
    let mut request = sotw_request(LISTENER_COLLECTION, &[EDGE], "", "");
    request.node = Some(inline_node(&[("env", "test")]));
    m.on_sotw_request(request).unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.type_url, LISTENER_COLLECTION);
    assert_eq!(r.resources.len(), 1);
    let any = &r.resources[0];
    assert_eq!(any.type_url, LISTENER_COLLECTION);
    let collection = ListenerCollection::decode(any.value.as_slice()).unwrap();
    assert_eq!(entries(&collection), ["a=test", "b=b"]);
    // A member change: the whole state again, with the new collection.
    m.on_sotw_request(sotw_request(
        LISTENER_COLLECTION,
        &[EDGE],
        &r.nonce,
        &r.version_info,
    ))
    .unwrap();
    let b = member("b");
    let changed = world.apply(json!([put("listener", &b, &[("*", listener(&b, "b-2"))])]));
    m.on_changes(&changed);
    let r = sotw(&m.poll(&world.snapshot)[0]);
    let collection = ListenerCollection::decode(r.resources[0].value.as_slice()).unwrap();
    assert_eq!(entries(&collection), ["a=test", "b=b-2"]);
}

/// `#entry=` names one entry: the member's body, under the name the client asked for.
#[test]
fn delta_entry_directive_resolves_one_entry() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let mut m = delta_machine();
    let name = format!("{EDGE}#entry=a");
    let mut request = delta_request(LISTENER, &[&name, &format!("{EDGE}#entry=zz")], &[], "");
    request.node = Some(node_with(LISTENER, &[("env", "test")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources.len(), 1);
    assert_eq!(r.resources[0].name, name);
    let any = r.resources[0].resource.as_ref().unwrap();
    assert_eq!(any.type_url, LISTENER);
    assert_eq!(route_of(&any.value), "test");
    assert_eq!(r.removed_resources, [format!("{EDGE}#entry=zz")]);
}

/// An entry is a member: on the collection type's stream it does not exist (its `Any` would
/// be a member's, which the client refuses on that stream); the collection itself does.
#[test]
fn entries_do_not_exist_on_the_collection_types_stream() {
    let mut world = World::new();
    edge_listeners(&mut world);
    for protocol in [Protocol::Sotw, Protocol::Delta] {
        let mut m = StreamMachine::new(1, protocol, &ADS, Arc::new(MachineConfig::default()));
        let entry = format!("{EDGE}#entry=b");
        let names = [entry.as_str(), EDGE];
        match protocol {
            Protocol::Sotw => m.on_sotw_request(sotw_request(LISTENER_COLLECTION, &names, "", "")),
            Protocol::Delta => {
                m.on_delta_request(delta_request(LISTENER_COLLECTION, &names, &[], ""))
            }
        }
        .unwrap();
        let responses = m.poll(&world.snapshot);
        assert_eq!(responses.len(), 1);
        let (types, names, removed): (Vec<String>, Vec<String>, Vec<String>) = match protocol {
            Protocol::Sotw => {
                let r = sotw(&responses[0]);
                let types = r.resources.iter().map(|a| a.type_url.clone()).collect();
                (types, vec![EDGE.to_owned()], vec![])
            }
            Protocol::Delta => {
                let r = delta(&responses[0]);
                let types = r
                    .resources
                    .iter()
                    .map(|x| x.resource.as_ref().unwrap().type_url.clone())
                    .collect();
                let names = r.resources.iter().map(|x| x.name.clone()).collect();
                (types, names, r.removed_resources)
            }
        };
        assert_eq!(types, [LISTENER_COLLECTION], "{protocol:?}");
        assert_eq!(names, [EDGE]);
        if protocol == Protocol::Delta {
            assert_eq!(removed, [entry.as_str()]);
        }
    }
}

/// An operator's stored collection is served as written, and its inline entries can be named.
#[test]
fn stored_collections_are_served_as_written() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let x = member("x");
    world.apply(json!([put(
        "envoy.config.listener.v3.ListenerCollection",
        EDGE,
        &[(
            "*",
            json!({"@type": LISTENER_COLLECTION, "entries": [
                {"locator": {"authority": "auth", "resource_type": "envoy.config.listener.v3.Listener", "id": "elsewhere"}},
                {"inline_entry": {"name": "x", "version": "7", "resource": listener(&x, "hand")}},
            ]})
        )]
    )]));
    let mut m = delta_machine();
    let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
    request.node = Some(inline_node(&[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        entries(&collection_of(&r.resources[0])),
        [
            "xdstp://auth/envoy.config.listener.v3.Listener/elsewhere?".to_owned(),
            "x=hand".to_owned()
        ]
    );
    let mut m = delta_machine();
    m.on_delta_request(delta_request(
        LISTENER,
        &[&format!("{EDGE}#entry=x")],
        &[],
        "",
    ))
    .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert!(!r.resources[0].version.is_empty());
    assert_eq!(
        route_of(&r.resources[0].resource.as_ref().unwrap().value),
        "hand"
    );
}

/// A redirect reaches the client as a `Resource` wrapping an `xds.core.v3.ResourceLocator`,
/// in both protocols; in a list collection, a redirected member is listed where it points.
#[test]
fn redirects_are_sent_as_resource_locators() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let b = member("b");
    let target = "xdstp://auth/envoy.config.listener.v3.Listener/canonical";
    world.apply(json!([{"type": "listener", "name": b, "variants": [{"redirect": target}]}]));

    let mut m = delta_machine();
    m.on_delta_request(delta_request(LISTENER, &[&b], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    let any = r.resources[0].resource.as_ref().unwrap();
    assert_eq!(
        any.type_url,
        vxds_envoy::collections::RESOURCE_LOCATOR_TYPE_URL
    );
    let locator = CoreLocator::decode(any.value.as_slice()).unwrap();
    assert_eq!(
        (locator.authority.as_str(), locator.id.as_str()),
        ("auth", "canonical")
    );

    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(LISTENER, &[&b], "", ""))
        .unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].type_url, crate::types::RESOURCE_WRAPPER);
    let wrapped = Resource::decode(r.resources[0].value.as_slice()).unwrap();
    assert_eq!(wrapped.name, b);
    assert_eq!(
        wrapped.resource.unwrap().type_url,
        vxds_envoy::collections::RESOURCE_LOCATOR_TYPE_URL
    );

    let mut m = delta_machine();
    let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
    request.node = Some(inline_node(&[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(
        entries(&collection_of(&r.resources[0])),
        ["a=prod".to_owned(), format!("{target}?")]
    );
}

/// The operator's `ListCollectionOptions` turns inline entries on, per variant: subscribers
/// matching its `inline_entries: true` variant get bodies, the others locators; changing it
/// re-sends the collection.
#[test]
fn stored_options_serve_a_collection_inline() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let options = |prod_inline: bool| {
        json!([put(
            "vxds.config.v1.ListCollectionOptions",
            EDGE,
            &[
                (
                    r#"env = "prod""#,
                    json!({"@type": "type.googleapis.com/vxds.config.v1.ListCollectionOptions", "inline_entries": prod_inline})
                ),
                (
                    r#"env != "prod""#,
                    json!({"@type": "type.googleapis.com/vxds.config.v1.ListCollectionOptions"})
                ),
            ]
        )])
    };
    world.apply(options(true));
    let subscribe = |env: &str| {
        let mut m = delta_machine();
        let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
        request.node = Some(node_with(LISTENER_COLLECTION, &[("env", env)]));
        m.on_delta_request(request).unwrap();
        m
    };
    let mut prod = subscribe("prod");
    let r = delta(&prod.poll(&world.snapshot)[0]);
    assert_eq!(entries(&collection_of(&r.resources[0])), ["a=prod", "b=b"]);
    prod.on_delta_request(delta_request(LISTENER_COLLECTION, &[], &[], &r.nonce))
        .unwrap();
    let mut test = subscribe("test");
    let r = delta(&test.poll(&world.snapshot)[0]);
    assert_eq!(
        entries(&collection_of(&r.resources[0])),
        [member("a"), member("b")]
    );

    let changed = world.apply(options(false));
    prod.on_changes(&changed);
    let r = delta(&prod.poll(&world.snapshot)[0]);
    assert_eq!(
        entries(&collection_of(&r.resources[0])),
        [member("a"), member("b")]
    );
}

/// A locator collection lists where members are, not what they hold: a body change within a
/// member's variant is not the collection's change; a different variant for the subscriber is.
#[test]
fn locator_collections_change_with_variants_not_bodies() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let mut m = delta_machine();
    let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
    request.node = Some(node_with(LISTENER_COLLECTION, &[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    m.on_delta_request(delta_request(LISTENER_COLLECTION, &[], &[], &r.nonce))
        .unwrap();
    let b = member("b");
    let changed = world.apply(json!([put("listener", &b, &[("*", listener(&b, "b-2"))])]));
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty());
    // `b` splits by env: this subscriber now holds another variant of it.
    let changed = world.apply(json!([put(
        "listener",
        &b,
        &[
            (r#"env = "prod""#, listener(&b, "b-prod")),
            (r#"env != "prod""#, listener(&b, "b-rest")),
        ]
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, EDGE);
}

/// A collection is answered on its own type's stream or its members' (TP1 asks for a
/// ListenerCollection on LDS); on another type's stream it does not exist. Members resolve
/// with the member type's parameters when the node gives none for the collection type.
#[test]
fn collections_live_on_their_own_or_their_members_stream() {
    let mut world = World::new();
    edge_listeners(&mut world);
    let mut m = delta_machine();
    m.on_delta_request(delta_request(LISTENER, &[EDGE], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].name, EDGE);
    assert_eq!(entries(&collection_of(&r.resources[0])), [member("b")]);
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[EDGE], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert!(r.resources.is_empty());
    assert_eq!(r.removed_resources, [EDGE]);

    let mut m = delta_machine();
    let mut request = delta_request(LISTENER_COLLECTION, &[EDGE], &[], "");
    let mut node = node_with(LISTENER, &[("env", "test")]);
    node.client_features
        .push(vxds_envoy::collections::INLINE_ENTRIES_FEATURE.into());
    request.node = Some(node);
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(entries(&collection_of(&r.resources[0])), ["a=test", "b=b"]);
}

/// A resource with an empty id (`xdstp://A/T?ctx`) is a member of the root glob `xdstp://A/T/*?ctx`
/// (as Envoy's `WatchMap` counts it): delivered whether it was written before the subscription
/// or after, on a glob and in a list collection alike.
#[test]
fn a_root_globs_empty_id_member_is_delivered_whatever_the_write_order() {
    let root = "xdstp://auth/envoy.config.listener.v3.Listener?zone=eu";
    let glob = "xdstp://auth/envoy.config.listener.v3.Listener/*?zone=eu";
    let list = "xdstp://auth/envoy.config.listener.v3.ListenerCollection?zone=eu";
    let put_root = || json!([put("listener", root, &[("*", listener(root, "r"))])]);
    for written_first in [true, false] {
        let mut world = World::new();
        if written_first {
            world.apply(put_root());
        }
        let mut m = delta_machine();
        m.on_delta_request(delta_request(LISTENER, &[glob, list], &[], ""))
            .unwrap();
        let mut received = m.poll(&world.snapshot);
        if !written_first {
            let changed = world.apply(put_root());
            m.on_changes(&changed);
            received.extend(m.poll(&world.snapshot));
        }
        let mut names: Vec<String> = received
            .iter()
            .flat_map(|r| delta(r).resources)
            .map(|r| r.name)
            .collect();
        names.sort();
        assert_eq!(names, [root, list], "written first: {written_first}");
        let collection = received
            .iter()
            .flat_map(|r| delta(r).resources)
            .find(|r| r.name == list)
            .unwrap();
        // `entries` prints a locator as `…/{type}/{id}?{ctx}`: the id is empty.
        assert_eq!(
            entries(&collection_of(&collection)),
            ["xdstp://auth/envoy.config.listener.v3.Listener/?zone=eu"]
        );
    }
}
