//! TTL'd variants: wrapped in `Resource` with `ttl`, kept alive by heartbeats that carry no
//! body in Delta and the unchanged state in SotW, and never sent to a stream holding none.

use std::time::Duration;

use super::*;

/// `web` with a TTL per variant: 2s for env=prod, 5s for env=test; `plain` has none.
fn ttl_routes(world: &mut World) {
    let variant = |c: &str, tag: &str, ttl: &str| json!({"constraints": c, "resource": route("web", tag), "ttl": ttl});
    world.apply(json!([
        {"type": "route", "name": "web", "variants": [
            variant(r#"env = "prod""#, "prod", "2s"),
            variant(r#"env = "test""#, "test", "5s"),
        ]},
        put("route", "plain", &[("*", route("plain", "plain"))]),
    ]));
}

fn delta_subscriber(
    world: &World,
    env: &str,
    names: &[&str],
) -> (StreamMachine, DeltaDiscoveryResponse) {
    let mut m = delta_machine();
    let mut request = delta_request(ROUTE, names, &[], "");
    request.node = Some(node_with(ROUTE, &[("env", env)]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    (m, r)
}

fn ttl_of(r: &Resource) -> Option<Duration> {
    r.ttl
        .map(|d| Duration::new(d.seconds as u64, d.nanos as u32))
}

#[test]
fn delta_ttl_and_heartbeats_follow_each_subscribers_variant() {
    let mut world = World::new();
    ttl_routes(&mut world);
    for (env, ttl) in [("prod", 2), ("test", 5)] {
        let (mut m, r) = delta_subscriber(&world, env, &["web"]);
        let web = &r.resources[0];
        assert_eq!(route_tag(&web.resource.as_ref().unwrap().value), env);
        assert_eq!(ttl_of(web), Some(Duration::from_secs(ttl)));
        assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(ttl)));
        // The heartbeat: name, the variant's version, the TTL, no body.
        let beats = m.heartbeat(world.snapshot.revision);
        assert_eq!(beats.len(), 1);
        let beat = delta(&beats[0]);
        assert_eq!(beat.resources.len(), 1);
        let h = &beat.resources[0];
        assert_eq!(
            (h.name.as_str(), h.version.as_str()),
            ("web", web.version.as_str())
        );
        assert!(h.resource.is_none());
        assert_eq!(ttl_of(h), Some(Duration::from_secs(ttl)));
        assert!(beat.removed_resources.is_empty());
        // Accepted; it changed nothing, so nothing follows it.
        m.on_delta_request(delta_request(ROUTE, &[], &[], &beat.nonce))
            .unwrap();
        assert!(m.poll(&world.snapshot).is_empty());
    }
}

#[test]
fn no_heartbeat_for_a_stream_without_ttl() {
    let mut world = World::new();
    ttl_routes(&mut world);
    let (mut m, r) = delta_subscriber(&world, "prod", &["plain"]);
    assert_eq!(r.resources[0].ttl, None);
    assert_eq!(m.shortest_ttl(), None);
    assert!(m.heartbeat(world.snapshot.revision).is_empty());
    // A TTL'd resource that goes away takes its heartbeats with it.
    let (mut m, _) = delta_subscriber(&world, "prod", &["web"]);
    let changed = world.apply(json!([put(
        "route",
        "web",
        &[("*", route("web", "untimed"))]
    )]));
    m.on_changes(&changed);
    let r = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(r.resources[0].ttl, None);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    assert_eq!(m.shortest_ttl(), None);
    assert!(m.heartbeat(world.snapshot.revision).is_empty());
}

#[test]
fn sotw_ttl_is_wrapped_and_heartbeats_resend_the_state_unchanged() {
    let mut world = World::new();
    ttl_routes(&mut world);
    for (env, ttl) in [("prod", 2), ("test", 5)] {
        let mut m = sotw_machine();
        let mut request = sotw_request(ROUTE, &["web", "plain"], "", "");
        request.node = Some(node_with(ROUTE, &[("env", env)]));
        m.on_sotw_request(request).unwrap();
        let r = sotw(&m.poll(&world.snapshot)[0]);
        let wrapped: Vec<Resource> = r
            .resources
            .iter()
            .filter(|any| any.type_url == crate::types::RESOURCE_WRAPPER)
            .map(|any| Resource::decode(any.value.as_slice()).unwrap())
            .collect();
        // Only the TTL'd resource is wrapped; the other stays bare.
        assert_eq!(wrapped.len(), 1);
        assert_eq!(r.resources.len(), 2);
        assert_eq!(wrapped[0].name, "web");
        assert_eq!(ttl_of(&wrapped[0]), Some(Duration::from_secs(ttl)));
        assert_eq!(route_tag(&wrapped[0].resource.as_ref().unwrap().value), env);
        m.on_sotw_request(sotw_request(
            ROUTE,
            &["web", "plain"],
            &r.nonce,
            &r.version_info,
        ))
        .unwrap();
        assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(ttl)));
        // The heartbeat: the same state at the same version, so nothing is taken as removed.
        let beats = m.heartbeat(world.snapshot.revision);
        assert_eq!(beats.len(), 1);
        let beat = sotw(&beats[0]);
        assert_eq!(beat.version_info, r.version_info);
        assert_ne!(beat.nonce, r.nonce);
        assert_eq!(beat.resources, r.resources);
        m.on_sotw_request(sotw_request(
            ROUTE,
            &["web", "plain"],
            &beat.nonce,
            &beat.version_info,
        ))
        .unwrap();
        assert!(m.poll(&world.snapshot).is_empty());
    }
    // A SotW stream holding nothing with a TTL is never sent a heartbeat.
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["plain"], "", ""))
        .unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(ROUTE, &["plain"], &r.nonce, &r.version_info))
        .unwrap();
    assert_eq!(m.shortest_ttl(), None);
    assert!(m.heartbeat(world.snapshot.revision).is_empty());
}
