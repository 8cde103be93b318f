//! TTL'd variants: wrapped in `Resource` with `ttl`, kept alive by heartbeats of what the
//! client accepted (bodiless in Delta, with bodies in SotW), each at its own pace, and never
//! sent to a stream holding none.

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
        let beats = m.heartbeat(world.snapshot.revision, std::time::Instant::now());
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
    assert!(
        m.heartbeat(world.snapshot.revision, std::time::Instant::now())
            .is_empty()
    );
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
    assert!(
        m.heartbeat(world.snapshot.revision, std::time::Instant::now())
            .is_empty()
    );
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
        // The heartbeat: RDS responses need not be complete, so only the TTL'd resource, with
        // its body (Envoy's legacy mux renews no TTL from a bodiless one), at the accepted
        // version.
        let beats = m.heartbeat(world.snapshot.revision, std::time::Instant::now());
        assert_eq!(beats.len(), 1);
        let beat = sotw(&beats[0]);
        assert_eq!(beat.version_info, r.version_info);
        assert_ne!(beat.nonce, r.nonce);
        assert_eq!(sotw_names(&beat), ["web"]);
        let web = r
            .resources
            .iter()
            .find(|any| any.type_url == crate::types::RESOURCE_WRAPPER)
            .unwrap();
        assert_eq!(&beat.resources[0], web);
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
    assert!(
        m.heartbeat(world.snapshot.revision, std::time::Instant::now())
            .is_empty()
    );
}

fn now() -> std::time::Instant {
    std::time::Instant::now()
}

fn nack_delta(type_url: &str, nonce: &str) -> DeltaDiscoveryRequest {
    let mut request = delta_request(type_url, &[], &[], nonce);
    request.error_detail = Some(RpcStatus {
        code: 3,
        message: "refused".into(),
        details: vec![],
    });
    request
}

/// Issue 20, finding 1: Envoy takes a bodiless resource as a heartbeat only for names it
/// subscribed to by name (or under the wildcard); a glob member gets none.
#[test]
fn delta_glob_members_get_no_heartbeats_named_and_wildcard_ones_do() {
    let mut world = World::new();
    let name = "xdstp://auth/envoy.config.cluster.v3.Cluster/edge/a";
    world.apply(json!([
        {"type": "cluster", "name": name, "variants": [{"resource": cluster(name), "ttl": "2s"}]},
    ]));
    for (subscribe, beats) in [
        (
            vec!["xdstp://auth/envoy.config.cluster.v3.Cluster/edge/*"],
            0,
        ),
        (vec![name], 1),
        (vec!["*"], 1),
    ] {
        let mut m = delta_machine();
        m.on_delta_request(delta_request(CLUSTER, &subscribe, &[], ""))
            .unwrap();
        let r = delta(&m.poll(&world.snapshot)[0]);
        assert_eq!(r.resources[0].name, name);
        m.on_delta_request(delta_request(CLUSTER, &[], &[], &r.nonce))
            .unwrap();
        let sent = m.heartbeat(world.snapshot.revision, now());
        assert_eq!(sent.len(), beats, "{subscribe:?}");
        assert_eq!(m.shortest_ttl().is_some(), beats == 1, "{subscribe:?}");
    }
}

/// Issue 20, finding 2: what a reconnecting client reports at the server's version is held
/// and heartbeated, though nothing is sent again. Its TTL ran while it was away: the first
/// renewal carries the body (a bodiless one of what has lapsed is refused), later ones none.
#[test]
fn delta_reported_versions_are_heartbeated_after_a_reconnect() {
    let mut world = World::new();
    ttl_routes(&mut world);
    let (_, first) = delta_subscriber(&world, "prod", &["web"]);
    let mut again = delta_machine();
    let mut request = delta_request(ROUTE, &["web"], &[], "");
    request.node = Some(node_with(ROUTE, &[("env", "prod")]));
    request.initial_resource_versions =
        [("web".to_owned(), first.resources[0].version.clone())].into();
    again.on_delta_request(request).unwrap();
    assert!(again.poll(&world.snapshot).is_empty());
    assert_eq!(again.shortest_ttl(), Some(Duration::from_secs(2)));
    let beat = delta(&again.heartbeat(world.snapshot.revision, now())[0]);
    assert_eq!(beat.resources[0].version, first.resources[0].version);
    assert_eq!(beat.resources[0].resource, first.resources[0].resource);
    assert_eq!(ttl_of(&beat.resources[0]), Some(Duration::from_secs(2)));
    again
        .on_delta_request(delta_request(ROUTE, &[], &[], &beat.nonce))
        .unwrap();
    let later = now() + Duration::from_secs(2);
    let beat = delta(&again.heartbeat(world.snapshot.revision, later)[0]);
    assert_eq!(beat.resources[0].version, first.resources[0].version);
    assert!(beat.resources[0].resource.is_none());
}

/// A refused Delta heartbeat: the client's TTL ran out before it came (Envoy dropped the
/// resource and refuses a bodiless renewal of it). What it renewed is sent again in full at
/// once, nothing is held back for the refusal, and later changes flow as before.
#[test]
fn delta_a_refused_heartbeat_sends_what_lapsed_again_in_full() {
    let mut world = World::new();
    ttl_routes(&mut world);
    let (mut m, first) = delta_subscriber(&world, "prod", &["web", "plain"]);
    let beat = delta(&m.heartbeat(world.snapshot.revision, now())[0]);
    assert!(beat.resources.iter().all(|r| r.resource.is_none()));
    m.on_delta_request(nack_delta(ROUTE, &beat.nonce)).unwrap();
    let again = delta(&m.poll(&world.snapshot)[0]);
    let web = first.resources.iter().find(|r| r.name == "web").unwrap();
    assert_eq!(again.resources.len(), 1, "{again:?}");
    assert_eq!(again.resources[0].name, "web");
    assert_eq!(again.resources[0].resource, web.resource);
    assert_eq!(again.resources[0].version, web.version);
    assert_eq!(ttl_of(&again.resources[0]), Some(Duration::from_secs(2)));
    m.on_delta_request(delta_request(ROUTE, &[], &[], &again.nonce))
        .unwrap();
    // Renewed without its body again, and a change is not held back by the refusal.
    let later = now() + Duration::from_secs(2);
    let beat = delta(&m.heartbeat(world.snapshot.revision, later)[0]);
    assert!(beat.resources[0].resource.is_none());
    m.on_delta_request(delta_request(ROUTE, &[], &[], &beat.nonce))
        .unwrap();
    let changed = world.apply(json!([put(
        "route",
        "plain",
        &[("*", route("plain", "changed"))]
    )]));
    m.on_changes(&changed);
    let update = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(update.resources[0].name, "plain");
    assert_eq!(
        route_tag(&update.resources[0].resource.as_ref().unwrap().value),
        "changed"
    );
}

/// Issue 20, finding 3 (Delta): a refused update leaves the client at the version it
/// accepted, and the heartbeats carry that one.
#[test]
fn delta_heartbeats_carry_the_accepted_version_after_a_nack() {
    let mut world = World::new();
    ttl_routes(&mut world);
    let (mut m, first) = delta_subscriber(&world, "prod", &["web"]);
    let changed = world.apply(json!([
        {"type": "route", "name": "web", "variants": [
            {"constraints": r#"env = "prod""#, "resource": route("web", "refused"), "ttl": "2s"},
        ]},
    ]));
    m.on_changes(&changed);
    let update = delta(&m.poll(&world.snapshot)[0]);
    assert_ne!(update.resources[0].version, first.resources[0].version);
    // While the update is unanswered, no heartbeat overtakes it.
    assert!(m.heartbeat(world.snapshot.revision, now()).is_empty());
    m.on_delta_request(nack_delta(ROUTE, &update.nonce))
        .unwrap();
    for _ in 0..3 {
        let beat = delta(&m.heartbeat(world.snapshot.revision, now())[0]);
        assert_eq!(beat.resources[0].version, first.resources[0].version);
        m.on_delta_request(delta_request(ROUTE, &[], &[], &beat.nonce))
            .unwrap();
    }
}

/// Issue 20, finding 3 (SotW): after a refused state, the accepted one keeps being renewed.
#[test]
fn sotw_heartbeats_go_on_with_the_accepted_state_after_a_nack() {
    let mut world = World::new();
    ttl_routes(&mut world);
    let mut m = sotw_machine();
    let mut request = sotw_request(ROUTE, &["web"], "", "");
    request.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_sotw_request(request).unwrap();
    let first = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["web"],
        &first.nonce,
        &first.version_info,
    ))
    .unwrap();
    let changed = world.apply(json!([
        {"type": "route", "name": "web", "variants": [
            {"constraints": r#"env = "prod""#, "resource": route("web", "refused"), "ttl": "2s"},
        ]},
    ]));
    m.on_changes(&changed);
    let refused = sotw(&m.poll(&world.snapshot)[0]);
    let mut nack = sotw_request(ROUTE, &["web"], &refused.nonce, &first.version_info);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "refused".into(),
        details: vec![],
    });
    m.on_sotw_request(nack).unwrap();
    let beat = sotw(&m.heartbeat(world.snapshot.revision, now())[0]);
    assert_eq!(beat.version_info, first.version_info);
    assert_eq!(beat.resources, first.resources);
}

/// Issue 20, finding 4: SotW heartbeats of a type whose responses need not be complete carry
/// only the TTL'd resources; each resource is renewed at its own TTL's pace.
#[test]
fn heartbeats_renew_each_resource_at_its_own_pace() {
    let mut world = World::new();
    world.apply(json!([
        {"type": "route", "name": "fast", "variants": [{"resource": route("fast", "f"), "ttl": "2s"}]},
        {"type": "route", "name": "slow", "variants": [{"resource": route("slow", "s"), "ttl": "20s"}]},
        put("route", "plain", &[("*", route("plain", "plain"))]),
    ]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ROUTE, &["fast", "slow", "plain"], &[], ""))
        .unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    let start = now();
    let names = |m: &mut StreamMachine, at: Duration| -> Vec<String> {
        let beats = m.heartbeat(1, start + at);
        let Some(beat) = beats.first() else {
            return vec![];
        };
        let beat = delta(beat);
        m.on_delta_request(delta_request(ROUTE, &[], &[], &beat.nonce))
            .unwrap();
        beat.resources.into_iter().map(|r| r.name).collect()
    };
    // Woken every second (half the shortest TTL): `fast` each time, `slow` every ~9 s (its
    // TTL restarted when it was accepted, so not at once).
    assert_eq!(names(&mut m, Duration::ZERO), ["fast"]);
    let mut slow = 0;
    for second in 1..=18 {
        let sent = names(&mut m, Duration::from_secs(second));
        assert!(sent.contains(&"fast".to_owned()), "{second}: {sent:?}");
        slow += sent.iter().filter(|n| *n == "slow").count();
    }
    assert_eq!(slow, 2);

    // SotW: RDS heartbeats carry the due TTL'd routes only.
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["fast", "slow", "plain"], "", ""))
        .unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["fast", "slow", "plain"],
        &r.nonce,
        &r.version_info,
    ))
    .unwrap();
    let beat = sotw(&m.heartbeat(1, start)[0]);
    assert_eq!(sotw_names(&beat), ["fast"]);
    m.on_sotw_request(sotw_request(
        ROUTE,
        &["fast", "slow", "plain"],
        &beat.nonce,
        &beat.version_info,
    ))
    .unwrap();
    let beat = sotw(&m.heartbeat(1, start + Duration::from_secs(9))[0]);
    assert_eq!(sotw_names(&beat), ["fast", "slow"]);
}

/// Issue 20, findings 5 and 8: a client that never answers gets no heartbeats past a small
/// backlog, keeps nothing per heartbeat, and is ended past the limit.
#[test]
fn a_client_that_never_answers_is_bounded_then_ended() {
    let mut world = World::new();
    ttl_routes(&mut world);
    let config = MachineConfig {
        max_unanswered: 10,
        ..Default::default()
    };
    let mut m = StreamMachine::new(1, Protocol::Delta, &ADS, Arc::new(config));
    let mut request = delta_request(ROUTE, &["web"], &[], "");
    request.node = Some(node_with(ROUTE, &[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let r = delta(&m.poll(&world.snapshot)[0]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
        .unwrap();
    let start = now();
    let mut beats = 0;
    for second in 0..100 {
        beats += m.heartbeat(1, start + Duration::from_secs(second)).len();
    }
    assert_eq!(beats, type_state::heartbeat::HEARTBEAT_BACKLOG);
    assert!(m.check_backlog().is_ok());
    // Updates still go out; past the limit the stream is ended.
    for i in 0..10 {
        let changed = world.apply(json!([put(
            "route",
            "other",
            &[("*", route("other", &i.to_string()))]
        )]));
        m.on_changes(&changed);
        m.on_delta_request(delta_request(ROUTE, &["other"], &[], ""))
            .unwrap();
        m.poll(&world.snapshot);
    }
    let status = m.check_backlog().unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status.message().contains("limit is 10"),
        "{}",
        status.message()
    );
}

/// Review finding 1: only EDS and RDS take a partial SotW response as it is. Envoy's unified
/// mux gives every other watch of the type an empty update, which RTDS (and SDS, ECDS) refuse
/// and SRDS, LDS and CDS take as "remove all", so their heartbeat is the whole accepted state.
#[test]
fn sotw_heartbeats_of_types_other_than_eds_and_rds_carry_the_whole_accepted_state() {
    let mut world = World::new();
    let layer =
        |name: &str| json!({"@type": crate::types::RUNTIME, "name": name, "layer": {"k": name}});
    world.apply(json!([
        {"type": "runtime", "name": "fast", "variants": [{"resource": layer("fast"), "ttl": "2s"}]},
        {"type": "runtime", "name": "slow", "variants": [{"resource": layer("slow"), "ttl": "20s"}]},
        put("runtime", "plain", &[("*", layer("plain"))]),
    ]));
    let names = ["fast", "plain", "slow"];
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(crate::types::RUNTIME, &names, "", ""))
        .unwrap();
    let r = sotw(&m.poll(&world.snapshot)[0]);
    assert_eq!(sotw_names(&r), names);
    m.on_sotw_request(sotw_request(
        crate::types::RUNTIME,
        &names,
        &r.nonce,
        &r.version_info,
    ))
    .unwrap();
    // Only `fast` is due, but every layer the client accepted goes with it, unchanged.
    let beat = sotw(&m.heartbeat(1, now())[0]);
    assert_eq!(beat.version_info, r.version_info);
    assert_eq!(sotw_names(&beat), names);
    assert_eq!(beat.resources, r.resources);
}

/// Review finding 2: a lagging SotW client ACKs a superseded response (a stale nonce), then
/// NACKs the latest. It holds the superseded state: heartbeats renew that one, at its version,
/// not the one it held before.
#[test]
fn sotw_a_stale_ack_is_what_the_client_holds_after_it_refuses_the_latest() {
    let mut world = World::new();
    let web = |tag: &str| {
        json!([{"type": "route", "name": "web", "variants": [
        {"resource": route("web", tag), "ttl": "2s"}]}])
    };
    world.apply(web("a"));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(ROUTE, &["web"], "", ""))
        .unwrap();
    let a = sotw(&m.poll(&world.snapshot)[0]);
    m.on_sotw_request(sotw_request(ROUTE, &["web"], &a.nonce, &a.version_info))
        .unwrap();
    let changed = world.apply(web("b"));
    m.on_changes(&changed);
    let b = sotw(&m.poll(&world.snapshot)[0]);
    let changed = world.apply(web("c"));
    m.on_changes(&changed);
    let c = sotw(&m.poll(&world.snapshot)[0]);
    assert_ne!(b.version_info, c.version_info);
    // ACK of b (stale: c superseded it), then NACK of c.
    m.on_sotw_request(sotw_request(ROUTE, &["web"], &b.nonce, &b.version_info))
        .unwrap();
    let mut nack = sotw_request(ROUTE, &["web"], &c.nonce, &b.version_info);
    nack.error_detail = Some(RpcStatus {
        code: 3,
        message: "refused".into(),
        details: vec![],
    });
    m.on_sotw_request(nack).unwrap();
    let beat = sotw(&m.heartbeat(world.snapshot.revision, now())[0]);
    assert_eq!(beat.version_info, b.version_info);
    assert_eq!(beat.resources, b.resources);
}

/// Issue 20: the shortest TTL comes from the accepted TTL'd items kept in TTL order, and that
/// order follows every change the client accepts: a TTL lengthened, a resource deleted, a TTL
/// dropped, a new shorter one, beside items that have none.
#[test]
fn the_shortest_ttl_follows_what_the_client_accepts() {
    let mut world = World::new();
    let timed = |name: &str, ttl: Option<&str>| {
        let mut variant = json!({"resource": route(name, name)});
        if let Some(ttl) = ttl {
            variant["ttl"] = json!(ttl);
        }
        json!({"type": "route", "name": name, "variants": [variant]})
    };
    let mut ops = vec![timed("a", Some("2s")), timed("b", Some("5s"))];
    ops.extend((0..50).map(|i| timed(&format!("plain{i}"), None)));
    world.apply(Value::Array(ops));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ROUTE, &["*"], &[], ""))
        .unwrap();
    let accept = |m: &mut StreamMachine, world: &World| {
        for response in m.poll(&world.snapshot) {
            let r = delta(&response);
            m.on_delta_request(delta_request(ROUTE, &[], &[], &r.nonce))
                .unwrap();
        }
    };
    accept(&mut m, &world);
    assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(2)));
    // `a` now lives 9 s: `b` is the shortest.
    let changed = world.apply(json!([timed("a", Some("9s"))]));
    m.on_changes(&changed);
    let sent = m.poll(&world.snapshot);
    // Not yet accepted: the client still holds `a` at 2 s.
    assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(2)));
    for response in sent {
        m.on_delta_request(delta_request(ROUTE, &[], &[], &delta(&response).nonce))
            .unwrap();
    }
    assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(5)));
    let changed = world.apply(json!([delete("route", "b")]));
    m.on_changes(&changed);
    accept(&mut m, &world);
    assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(9)));
    let changed = world.apply(json!([timed("a", None)]));
    m.on_changes(&changed);
    accept(&mut m, &world);
    assert_eq!(m.shortest_ttl(), None);
    let changed = world.apply(json!([timed("plain7", Some("3s")), timed("c", Some("4s"))]));
    m.on_changes(&changed);
    accept(&mut m, &world);
    assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(3)));
    // Unsubscribed (the wildcard left for `c` alone): what it dropped is not renewed.
    m.on_delta_request(delta_request(ROUTE, &["c"], &["*"], ""))
        .unwrap();
    accept(&mut m, &world);
    assert_eq!(m.shortest_ttl(), Some(Duration::from_secs(4)));
}

/// A refused heartbeat renewed what a later update already carries: that update delivers
/// it, it is not sent twice; and what was deleted meanwhile is not sent back.
#[test]
fn delta_a_refused_heartbeat_spares_what_is_in_flight_or_gone() {
    let mut world = World::new();
    ttl_routes(&mut world);
    let (mut m, _) = delta_subscriber(&world, "prod", &["web"]);
    let beat = delta(&m.heartbeat(world.snapshot.revision, now())[0]);
    let changed = world.apply(json!([
        {"type": "route", "name": "web", "variants": [
            {"constraints": r#"env = "prod""#, "resource": route("web", "newer"), "ttl": "2s"},
        ]},
    ]));
    m.on_changes(&changed);
    let update = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(update.resources[0].name, "web");
    m.on_delta_request(nack_delta(ROUTE, &beat.nonce)).unwrap();
    assert!(m.poll(&world.snapshot).is_empty(), "sent twice");
    m.on_delta_request(delta_request(ROUTE, &[], &[], &update.nonce))
        .unwrap();
    // Renewed at the update's version from then on.
    let later = now() + Duration::from_secs(2);
    let beat = delta(&m.heartbeat(world.snapshot.revision, later)[0]);
    assert_eq!(beat.resources[0].version, update.resources[0].version);

    // Deleted while a heartbeat of it is unanswered (the removal waits for its answer): the
    // refusal says the client dropped it, so nothing is sent back; the name it subscribed to
    // is reported missing.
    let gone = world.apply(json!([delete("route", "web")]));
    m.on_changes(&gone);
    assert!(m.poll(&world.snapshot).is_empty());
    m.on_delta_request(nack_delta(ROUTE, &beat.nonce)).unwrap();
    let missing = delta(&m.poll(&world.snapshot)[0]);
    assert!(missing.resources.is_empty());
    assert_eq!(missing.removed_resources, vec!["web".to_owned()]);
    m.on_delta_request(delta_request(ROUTE, &[], &[], &missing.nonce))
        .unwrap();
    // Put back as it was (the same version): the client has none, so it is sent.
    let back = world.apply(json!([
        {"type": "route", "name": "web", "variants": [
            {"constraints": r#"env = "prod""#, "resource": route("web", "newer"), "ttl": "2s"},
        ]},
    ]));
    m.on_changes(&back);
    let again = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(again.resources[0].version, update.resources[0].version);
    assert!(again.resources[0].resource.is_some());
}
