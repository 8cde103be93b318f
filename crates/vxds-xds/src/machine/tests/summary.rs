//! What a stream contributes to the client summary (impact preview): each subscription with the
//! parameters it resolves with, each item once.

use vxds_core::ParamSet;
use vxds_core::impact::Subscription;

use super::*;

/// What the stream's `type_url` subscriptions contribute, all under that type.
fn summary_of(m: &StreamMachine, type_url: &str) -> Vec<(Subscription, ParamSet)> {
    full_summary_of(m, type_url)
        .into_iter()
        .map(|(t, s, p)| {
            assert_eq!(t, type_url);
            (s, p)
        })
        .collect()
}

/// Every (type, subscription, parameters) of the stream's `type_url` status, sorted.
fn full_summary_of(m: &StreamMachine, type_url: &str) -> Vec<(String, Subscription, ParamSet)> {
    let status = m.status();
    let status = status.lock().unwrap();
    let groups = status
        .types
        .iter()
        .find(|t| t.type_url == type_url)
        .map(|t| t.summary.clone())
        .unwrap_or_default();
    let mut flat: Vec<(String, Subscription, ParamSet)> = groups
        .iter()
        .flat_map(|g| {
            g.subscriptions
                .iter()
                .map(|s| (g.type_url.clone(), s.clone(), (*g.params).clone()))
        })
        .collect();
    flat.sort();
    // Each group holds one parameter set of one type.
    let mut keys: Vec<(&String, &ParamSet)> =
        groups.iter().map(|g| (&g.type_url, &*g.params)).collect();
    keys.dedup();
    assert_eq!(keys.len(), groups.len(), "{groups:?}");
    flat
}

fn params(pairs: &[(&str, &str)]) -> ParamSet {
    pairs.iter().copied().collect()
}

#[test]
fn names_locators_and_globs_with_their_parameters() {
    let mut m = delta_machine();
    let glob = "xdstp://auth/envoy.config.route.v3.RouteConfiguration/edge/*";
    let mut request = delta_request(
        ROUTE,
        &[
            "web",
            glob,
            "xdstp://auth/envoy.config.route.v3.RouteConfiguration/edge/a",
            "other",
        ],
        &[],
        "",
    );
    request.node = Some(node_with(ROUTE, &[("env", "prod")]));
    request.resource_locators_subscribe = vec![ResourceLocator {
        name: "web".into(),
        dynamic_parameters: [("env".to_owned(), "test".to_owned())].into(),
    }];
    m.on_delta_request(request).unwrap();
    let prod = params(&[("env", "prod")]);
    assert_eq!(
        summary_of(&m, ROUTE),
        [
            (Subscription::Name("other".into()), prod.clone()),
            (Subscription::Name("web".into()), prod.clone()),
            // The locator resolves with its own parameters.
            (Subscription::Name("web".into()), params(&[("env", "test")])),
            // The glob covers `edge/a`, which is listed once, under the glob.
            (Subscription::Collection(glob.into()), prod.clone()),
        ]
    );

    // New node parameters re-resolve plain names and unconstrained globs.
    let mut request = delta_request(ROUTE, &[], &["other"], "");
    request.node = Some(node_with(ROUTE, &[("env", "dev")]));
    m.on_delta_request(request).unwrap();
    let dev = params(&[("env", "dev")]);
    assert_eq!(
        summary_of(&m, ROUTE),
        [
            (Subscription::Name("web".into()), dev.clone()),
            (Subscription::Name("web".into()), params(&[("env", "test")])),
            (Subscription::Collection(glob.into()), dev),
        ]
    );
}

#[test]
fn a_wildcard_covers_the_plain_names_it_includes() {
    let mut m = sotw_machine();
    let mut request = sotw_request(CLUSTER, &["*", "extra"], "", "");
    request.node = Some(node_with(CLUSTER, &[("zone", "eu")]));
    m.on_sotw_request(request).unwrap();
    assert_eq!(
        summary_of(&m, CLUSTER),
        [(Subscription::Wildcard, params(&[("zone", "eu")]))]
    );
    // Legacy wildcard (no names on CDS) too.
    let mut m = sotw_machine();
    m.on_sotw_request(sotw_request(CLUSTER, &[], "", ""))
        .unwrap();
    assert_eq!(
        summary_of(&m, CLUSTER),
        [(Subscription::Wildcard, ParamSet::new())]
    );
}

#[test]
fn a_list_collection_stands_for_its_stored_collection_and_its_members() {
    let list = "xdstp://auth/envoy.config.listener.v3.ListenerCollection/edge?zone=eu";
    let mut m = delta_machine();
    let mut request = delta_request(LISTENER, &[list], &[], "");
    request.node = Some(node_with(LISTENER, &[("env", "prod")]));
    m.on_delta_request(request).unwrap();
    let prod = params(&[("env", "prod")]);
    assert_eq!(
        full_summary_of(&m, LISTENER),
        [
            (
                LISTENER.to_owned(),
                Subscription::Collection(
                    "xdstp://auth/envoy.config.listener.v3.Listener/edge/*?zone=eu".into()
                ),
                prod.clone()
            ),
            (
                "type.googleapis.com/envoy.config.listener.v3.ListenerCollection".to_owned(),
                Subscription::Name(list.into()),
                prod
            ),
        ]
    );
}

#[test]
fn streams_that_subscribe_alike_share_their_summary_and_descriptions() {
    let subscribe = |env: &str| {
        let mut m = delta_machine();
        let mut request = delta_request(ROUTE, &["web"], &[], "");
        request.node = Some(node_with(ROUTE, &[("env", "prod")]));
        request.resource_locators_subscribe = vec![ResourceLocator {
            name: "api".into(),
            dynamic_parameters: [("env".to_owned(), env.to_owned())].into(),
        }];
        m.on_delta_request(request).unwrap();
        m
    };
    let (a, b, other) = (subscribe("test"), subscribe("test"), subscribe("dev"));
    let route = |m: &StreamMachine| {
        let status = m.status();
        let status = status.lock().unwrap();
        let t = status.types.iter().find(|t| t.type_url == ROUTE).unwrap();
        (
            t.summary.clone(),
            t.subscriptions.clone(),
            t.param_sources.clone(),
        )
    };
    let (a, b, other) = (route(&a), route(&b), route(&other));
    assert!(Arc::ptr_eq(&a.0, &b.0) && Arc::ptr_eq(&a.1, &b.1) && Arc::ptr_eq(&a.2, &b.2));
    // Other parameters: another summary and description, equal sources.
    assert!(!Arc::ptr_eq(&a.0, &other.0) && !Arc::ptr_eq(&a.1, &other.1));
    assert!(Arc::ptr_eq(&a.2, &other.2));
    assert_eq!(a.1.len(), 2, "{:?}", a.1);
}

/// The registry's summary follows every change of what it reads — a new subscription, the
/// node, another stream, one leaving — though it walks the streams only after such a change.
#[test]
fn the_registry_summary_follows_subscriptions_nodes_and_streams() {
    let registry = Arc::new(crate::Registry::new(Arc::new(Snapshot::default())));
    let entries = |registry: &crate::Registry| -> Vec<(Subscription, u64, Vec<String>)> {
        let summary = registry.summary();
        (summary.entries.iter())
            .map(|e| (e.subscription.clone(), e.streams, e.sample_nodes.clone()))
            .collect()
    };
    let web = Subscription::Name("web".into());
    let api = Subscription::Name("api".into());

    let mut m = delta_machine();
    let first = registry.register(1, m.status());
    assert_eq!(registry.summary().streams, 1);
    assert!(entries(&registry).is_empty());

    m.on_delta_request(delta_request(ROUTE, &["web"], &[], ""))
        .unwrap();
    assert_eq!(entries(&registry), [(web.clone(), 1, vec![])]);
    // Unchanged: the same summary again.
    assert_eq!(entries(&registry), [(web.clone(), 1, vec![])]);

    // The node alone, no subscription changed.
    let mut request = delta_request(ROUTE, &[], &[], "");
    request.node = Some(node_with(ROUTE, &[]));
    m.on_delta_request(request).unwrap();
    let node = m.status().lock().unwrap().node_id.clone();
    assert!(!node.is_empty());
    assert_eq!(entries(&registry), [(web.clone(), 1, vec![node.clone()])]);

    m.on_delta_request(delta_request(ROUTE, &["api"], &[], ""))
        .unwrap();
    let mut seen = entries(&registry);
    seen.sort();
    let mut want = vec![
        (api.clone(), 1, vec![node.clone()]),
        (web.clone(), 1, vec![node.clone()]),
    ];
    want.sort();
    assert_eq!(seen, want);

    let mut other = delta_machine();
    let second = registry.register(2, other.status());
    other
        .on_delta_request(delta_request(ROUTE, &["web"], &[], ""))
        .unwrap();
    assert_eq!(registry.summary().streams, 2);
    assert!(entries(&registry).contains(&(web.clone(), 2, vec![node.clone()])));

    drop(first);
    assert_eq!(registry.summary().streams, 1);
    assert_eq!(entries(&registry), [(web, 1, vec![])]);
    drop(second);
    assert_eq!(registry.summary().streams, 0);
}
