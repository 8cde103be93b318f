//! What the machine tells rollout tracking: what the resources it sends name that the client
//! does not hold and fetches next, the removals it holds back by name, and what a Delta client
//! unsubscribed from.

use super::*;
use crate::rollout::Subscriptions;

/// A route configuration routing everything to `cluster`.
fn route_to(name: &str, cluster: &str) -> Value {
    json!({"@type": ROUTE, "name": name, "virtual_hosts": [{"name": "all", "domains": ["*"],
           "routes": [{"match": {"prefix": "/"}, "route": {"cluster": cluster}}]}]})
}

/// `(from type, from name, type, name, in flight)` of each dependency.
fn named(m: &StreamMachine) -> Vec<(String, String, &'static str, String, bool)> {
    m.dependencies()
        .iter()
        .map(|d| {
            (
                d.from_type.clone(),
                d.from_name.to_string(),
                d.type_url,
                d.name.to_string(),
                d.nonce.is_some(),
            )
        })
        .collect()
}

fn ack_sotw(m: &mut StreamMachine, response: &Response, names: &[&str]) {
    let r = sotw(response);
    m.on_sotw_request(sotw_request(&r.type_url, names, &r.nonce, &r.version_info))
        .unwrap();
}

#[test]
fn a_new_listener_names_the_route_the_client_fetches_next() {
    let mut world = World::new();
    world.apply(json!([put("cluster", "c", &[("*", cluster("c"))])]));
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    m.on_sotw_request(sotw_request(LISTENER, &[], "", ""))
        .unwrap();
    for r in m.poll(&world.snapshot) {
        ack_sotw(&mut m, &r, &[]);
    }
    let changed = world.apply(json!([
        put("listener", "l", &[("*", listener("l", "r1"))]),
        put("route", "r1", &[("*", route_to("r1", "c"))]),
        // Named by nothing the client holds: not its to fetch.
        put("route", "r9", &[("*", route_to("r9", "c"))]),
    ]));
    m.on_changes(&changed);
    // Not asked: nothing looked for.
    let sent = m.poll(&world.snapshot);
    assert!(m.dependencies().is_empty());
    ack_sotw(&mut m, &sent[0], &[]);
    let changed = world.apply(json!([put("listener", "k", &[("*", listener("k", "r1"))])]));
    m.on_changes(&changed);
    m.follow_references(true);
    let lds = m.poll(&world.snapshot);
    // The SotW response carries l again, unchanged: only what changed is looked at.
    assert_eq!(
        named(&m),
        [(LISTENER.into(), "k".into(), ROUTE, "r1".into(), false)]
    );
    assert!(!m.subscribes(ROUTE, "r1"));
    ack_sotw(&mut m, &lds[0], &[]);
    // Envoy subscribes to r1; the route's cluster is held (a wildcard): nothing more.
    m.on_sotw_request(sotw_request(ROUTE, &["r1"], "", ""))
        .unwrap();
    m.follow_references(true);
    let rds = m.poll(&world.snapshot);
    assert_eq!(rds[0].type_url(), ROUTE);
    assert!(m.dependencies().is_empty());
    assert!(m.subscribes(ROUTE, "r1"));
    assert!(m.still_names(LISTENER, &"l".into(), ROUTE, "r1"));
    assert!(!m.still_names(LISTENER, &"l".into(), ROUTE, "r9"));
    // Another listener naming r1 while its response is in flight: that response answers.
    let changed = world.apply(json!([put("listener", "m", &[("*", listener("m", "r1"))])]));
    m.on_changes(&changed);
    m.follow_references(true);
    m.poll(&world.snapshot);
    assert_eq!(
        named(&m),
        [(LISTENER.into(), "m".into(), ROUTE, "r1".into(), true)]
    );
    // Accepted: named again, nothing to wait for.
    ack_sotw(&mut m, &rds[0], &["r1"]);
    let changed = world.apply(json!([put("listener", "n", &[("*", listener("n", "r1"))])]));
    m.on_changes(&changed);
    m.follow_references(true);
    m.poll(&world.snapshot);
    assert!(m.dependencies().is_empty());
}

/// Envoy fetches no cluster by a route's reference (it holds every cluster, or its own static
/// ones, or fetches one on demand when traffic asks for it); gRPC asks only for the clusters
/// of the virtual host its target matches. A cluster is followed only when the client already
/// subscribes to it by name and a response in flight carries it.
#[test]
fn a_route_names_clusters_only_to_a_client_that_asks_for_them_by_name() {
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "c", &[("*", cluster("c"))]),
        put("cluster", "d", &[("*", cluster("d"))]),
        put("route", "r", &[("*", route_to("r", "c"))]),
    ]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(ROUTE, &["r"], &[], ""))
        .unwrap();
    for r in m.poll(&world.snapshot) {
        m.on_delta_request(delta_request(ROUTE, &[], &[], r.nonce()))
            .unwrap();
    }
    let changed = world.apply(json!([put("route", "r", &[("*", route_to("r", "d"))])]));
    m.on_changes(&changed);
    m.follow_references(true);
    let sent = m.poll(&world.snapshot);
    assert!(m.dependencies().is_empty());
    m.on_delta_request(delta_request(ROUTE, &[], &[], sent[0].nonce()))
        .unwrap();
    // Clusters asked for by name (gRPC): the route's next one is to be fetched.
    m.on_delta_request(delta_request(CLUSTER, &["d"], &[], ""))
        .unwrap();
    for r in m.poll(&world.snapshot) {
        m.on_delta_request(delta_request(CLUSTER, &[], &[], r.nonce()))
            .unwrap();
    }
    // c, not asked for by name (another virtual host's, or on demand): not waited for.
    let changed = world.apply(json!([put("route", "r", &[("*", route_to("r", "c"))])]));
    m.on_changes(&changed);
    m.follow_references(true);
    let sent = m.poll(&world.snapshot);
    assert!(m.dependencies().is_empty());
    m.on_delta_request(delta_request(ROUTE, &[], &[], sent[0].nonce()))
        .unwrap();
    // e asked for by name, and named while the response carrying it is in flight: followed.
    m.on_delta_request(delta_request(CLUSTER, &["e"], &[], ""))
        .unwrap();
    let changed = world.apply(json!([
        put("cluster", "e", &[("*", cluster("e"))]),
        put("route", "r", &[("*", route_to("r", "e"))]),
    ]));
    m.on_changes(&changed);
    m.follow_references(true);
    m.poll(&world.snapshot);
    assert_eq!(
        named(&m),
        [(ROUTE.into(), "r".into(), CLUSTER, "e".into(), true)]
    );
}

/// On a per-type service (no ADS), what a resource names is fetched on another stream: the
/// LDS stream's listeners name routes it never carries. Nothing is followed there.
#[test]
fn references_are_followed_only_on_ads_streams() {
    let mut world = World::new();
    let lds = &crate::types::SERVICES[1];
    assert_eq!(lds.type_url, Some(LISTENER));
    let mut m = StreamMachine::new(1, Protocol::Sotw, lds, Arc::new(MachineConfig::default()));
    m.on_sotw_request(sotw_request(LISTENER, &[], "", ""))
        .unwrap();
    for r in m.poll(&world.snapshot) {
        ack_sotw(&mut m, &r, &[]);
    }
    let changed = world.apply(json!([
        put("listener", "l", &[("*", listener("l", "r1"))]),
        put("route", "r1", &[("*", route_to("r1", "c"))]),
    ]));
    m.on_changes(&changed);
    m.follow_references(true);
    let sent = m.poll(&world.snapshot);
    assert_eq!(sent[0].type_url(), LISTENER);
    assert!(m.dependencies().is_empty());
}

/// Envoy holds clusters by wildcard: a route naming many clusters costs no look-up of each.
#[test]
fn a_route_naming_clusters_held_by_wildcard_follows_none() {
    let n = 2000;
    let mut world = World::new();
    let clusters: Vec<Value> = (0..n)
        .map(|i| {
            put(
                "cluster",
                &format!("c{i}"),
                &[("*", cluster(&format!("c{i}")))],
            )
        })
        .collect();
    world.apply(Value::Array(clusters));
    let mut routes: Vec<Value> = (0..n)
        .map(|i| json!({"match": {"prefix": format!("/{i}")}, "route": {"cluster": format!("c{i}")}}))
        .collect();
    routes.push(json!({"match": {"prefix": "/new"}, "route": {"cluster": "new"}}));
    let route = json!({"@type": ROUTE, "name": "r", "virtual_hosts": [{"name": "all", "domains": ["*"], "routes": routes}]});
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    m.on_sotw_request(sotw_request(ROUTE, &["r"], "", ""))
        .unwrap();
    for r in m.poll(&world.snapshot) {
        let names: &[&str] = if r.type_url() == ROUTE { &["r"] } else { &[] };
        ack_sotw(&mut m, &r, names);
    }
    // A cluster the client holds by wildcard and has not accepted (new, in flight).
    let changed = world.apply(json!([
        put("cluster", "new", &[("*", cluster("new"))]),
        put("route", "r", &[("*", route)]),
    ]));
    m.on_changes(&changed);
    m.follow_references(true);
    m.poll(&world.snapshot);
    assert!(m.dependencies().is_empty());
}

#[test]
fn removals_held_back_are_reported_by_name_with_when_they_became_due() {
    let mut world = World::new();
    world.apply(json!([
        put("cluster", "a", &[("*", cluster("a"))]),
        put("cluster", "b", &[("*", cluster("b"))]),
        put("cluster", "c", &[("*", cluster("c"))]),
    ]));
    let mut m = delta_machine();
    m.on_delta_request(delta_request(CLUSTER, &[], &[], ""))
        .unwrap();
    let first = m.poll(&world.snapshot);
    // Unanswered: a removal waits for it.
    let changed = world.apply(json!([delete("cluster", "a")]));
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty());
    let held: Vec<(&str, String, bool)> = m
        .held_removals()
        .iter()
        .map(|h| (h.type_url, h.name.to_string(), h.due_now))
        .collect();
    assert_eq!(held, [(CLUSTER, "a".to_owned(), true)]);
    let changed = world.apply(json!([delete("cluster", "b")]));
    m.on_changes(&changed);
    assert!(m.poll(&world.snapshot).is_empty());
    let held: Vec<(&str, String, bool)> = m
        .held_removals()
        .iter()
        .map(|h| (h.type_url, h.name.to_string(), h.due_now))
        .collect();
    assert_eq!(
        held,
        [
            (CLUSTER, "a".to_owned(), false),
            (CLUSTER, "b".to_owned(), true)
        ]
    );
    m.on_delta_request(delta_request(CLUSTER, &[], &[], first[0].nonce()))
        .unwrap();
    let removals = delta(&m.poll(&world.snapshot)[0]);
    assert_eq!(removals.removed_resources, ["a", "b"]);
    assert!(m.held_removals().is_empty());
}

#[test]
fn delta_unsubscriptions_are_reported() {
    let mut world = World::new();
    world.apply(json!([put("route", "r", &[("*", route_to("r", "c"))])]));
    let mut m = delta_machine();
    let outcome = m
        .on_delta_request(delta_request(ROUTE, &["r"], &[], ""))
        .unwrap();
    assert_eq!(outcome.unsubscribed, None);
    m.poll(&world.snapshot);
    let outcome = m
        .on_delta_request(delta_request(ROUTE, &[], &["r"], ""))
        .unwrap();
    assert_eq!(outcome.unsubscribed, Some((ROUTE, vec!["r".to_owned()])));
}
