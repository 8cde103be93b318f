//! xdstp names beyond the plain ones (TP1): redirects, stored list collections and their
//! options, `#alt` directives, and names handed out inside typed configs and inline entries.

use super::*;

const L: &str = "xdstp://a/envoy.config.listener.v3.Listener/l";
const LC: &str = "type.googleapis.com/envoy.config.listener.v3.ListenerCollection";

#[test]
fn redirects_are_checked_on_their_own() {
    let redirect = |name: &str, target: &str| {
        op(json!({"type": "listener", "name": name, "variants": [{"redirect": target}]}))
    };
    let ok = run(vec![redirect(
        L,
        "xdstp://a/envoy.config.listener.v3.Listener/m",
    )])
    .unwrap();
    let Action::Put(resource) = &ok.changeset.operations[0].action else {
        panic!("put")
    };
    assert_eq!(
        resource.redirects,
        BTreeSet::from(["xdstp://a/envoy.config.listener.v3.Listener/m".to_owned()])
    );
    for (target, code) in [
        (
            "xdstp://a/envoy.config.cluster.v3.Cluster/c",
            "redirect_type_mismatch",
        ),
        (L, "redirect_cycle"),
        (
            "xdstp://a/envoy.config.listener.v3.Listener/g/*",
            "invalid_redirect",
        ),
        ("not a url", "invalid_redirect"),
    ] {
        assert_eq!(
            problems(vec![redirect(L, target)]),
            [(
                "/operations/0/variants/0/redirect".to_owned(),
                code.to_owned()
            )],
            "{target}"
        );
    }
    // TP1: a glob collection cannot be redirected.
    assert_eq!(
        problems(vec![redirect(
            "xdstp://a/envoy.config.listener.v3.Listener/g/*",
            "xdstp://a/envoy.config.listener.v3.Listener/m"
        )]),
        [(
            "/operations/0/name".to_owned(),
            "redirect_of_glob".to_owned()
        )]
    );
    // A body or a redirect, not both.
    let both = op(json!({"type": "listener", "name": L, "variants": [{
        "redirect": "xdstp://a/envoy.config.listener.v3.Listener/m",
        "resource": {"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": L}}]}));
    assert_eq!(problems(vec![both])[0].1, "redirect_with_body");
    // The stored form (a ResourceLocator body) is accepted as well, with the same checks.
    let body = |resource_type: &str| {
        op(
            json!({"type": "listener", "name": L, "variants": [{"resource": {
            "@type": "type.googleapis.com/xds.core.v3.ResourceLocator",
            "authority": "a", "resource_type": resource_type, "id": "m"}}]}),
        )
    };
    assert!(run(vec![body("envoy.config.listener.v3.Listener")]).is_ok());
    assert_eq!(
        problems(vec![body("envoy.config.cluster.v3.Cluster")])[0].1,
        "redirect_type_mismatch"
    );
}

#[test]
fn stored_list_collections_are_checked() {
    let listener =
        json!({"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": "x"});
    let cluster =
        json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "x"});
    let collection = |entries: Value| {
        op(
            json!({"type": "envoy.config.listener.v3.ListenerCollection",
                  "name": "xdstp://a/envoy.config.listener.v3.ListenerCollection/c",
                  "variants": [{"resource": {"@type": LC, "entries": entries}}]}),
        )
    };
    assert!(
        run(vec![collection(json!([
            {"locator": {"authority": "a", "resource_type": "envoy.config.listener.v3.Listener", "id": "l"}},
            {"inline_entry": {"name": "x", "version": "1", "resource": listener}},
            {"inline_entry": {"version": "2", "resource": listener}},
        ]))])
        .is_ok()
    );
    assert_eq!(
        problems(vec![collection(json!([
            {"inline_entry": {"name": "x", "resource": listener}},
            {"inline_entry": {"name": "x", "resource": listener}},
            {"inline_entry": {"name": "no spaces", "resource": listener}},
            {"inline_entry": {"name": "y", "resource": cluster}},
            {"inline_entry": {"name": "z"}},
            {"locator": {"authority": "a", "resource_type": "envoy.config.cluster.v3.Cluster", "id": "l"}},
            {},
        ]))]),
        [
            (
                "/operations/0/variants/0/resource/entries/1/inline_entry/name",
                "duplicate_entry_name"
            ),
            (
                "/operations/0/variants/0/resource/entries/2/inline_entry/name",
                "invalid_entry_name"
            ),
            (
                "/operations/0/variants/0/resource/entries/3/inline_entry/resource/@type",
                "entry_type_mismatch"
            ),
            (
                "/operations/0/variants/0/resource/entries/4/inline_entry/resource",
                "missing_entry_body"
            ),
            (
                "/operations/0/variants/0/resource/entries/5/locator",
                "locator_type_mismatch"
            ),
            (
                "/operations/0/variants/0/resource/entries/6",
                "empty_collection_entry"
            ),
        ]
        .map(|(p, c)| (p.to_owned(), c.to_owned()))
    );
}

#[test]
fn alt_directives_in_handed_out_names_keep_their_type() {
    let cluster = |service_name: &str| {
        op(
            json!({"type": "cluster", "name": "c", "variants": [{"resource": {
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "c", "type": "EDS",
            "eds_cluster_config": {"eds_config": {"ads": {}}, "service_name": service_name}}}]}),
        )
    };
    let cla = "xdstp://cloud/envoy.config.endpoint.v3.ClusterLoadAssignment/foo";
    assert!(
        run(vec![cluster(&format!(
            "{cla}#alt=xdstp://onprem/envoy.config.endpoint.v3.ClusterLoadAssignment/bar"
        ))])
        .is_ok()
    );
    assert_eq!(
        problems(vec![cluster(&format!(
            "{cla}#alt=xdstp://onprem/envoy.config.cluster.v3.Cluster/bar"
        ))]),
        [(
            "/operations/0/variants/0/resource/eds_cluster_config/service_name".to_owned(),
            "alt_type_mismatch".to_owned()
        )]
    );
    assert_eq!(
        problems(vec![cluster(&format!("{cla}#bogus=1"))])[0].1,
        "invalid_directive"
    );
}

#[test]
fn collection_options_are_named_by_a_list_collection() {
    let options = |name: &str| {
        op(
            json!({"type": "vxds.config.v1.ListCollectionOptions", "name": name, "variants": [{
            "resource": {"@type": "type.googleapis.com/vxds.config.v1.ListCollectionOptions", "inline_entries": true}}]}),
        )
    };
    assert!(
        run(vec![options(
            "xdstp://a/envoy.config.listener.v3.ListenerCollection/c"
        )])
        .is_ok()
    );
    for name in ["xdstp://a/envoy.config.listener.v3.Listener/c", "plain"] {
        assert_eq!(
            problems(vec![options(name)]),
            [(
                "/operations/0/name".to_owned(),
                "not_a_list_collection".to_owned()
            )]
        );
    }
}

#[test]
fn names_inside_typed_configs_and_inline_entries_are_checked_too() {
    // An RDS name in a listener's HTTP connection manager (an Any) with a mistyped #alt.
    let listener = json!({"@type": "type.googleapis.com/envoy.config.listener.v3.Listener", "name": L,
        "filter_chains": [{"filters": [{"name": "hcm", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": "x", "rds": {"config_source": {"ads": {}},
            "route_config_name": "xdstp://a/envoy.config.route.v3.RouteConfiguration/r#alt=xdstp://a/envoy.config.cluster.v3.Cluster/x"}}}]}]});
    let put = op(json!({"type": "listener", "name": L, "variants": [{"resource": listener}]}));
    assert_eq!(problems(vec![put])[0].1, "alt_type_mismatch");
    // An inline cluster of a stored collection meets the cluster rules.
    let bad_cluster = json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "c", "type": "EDS"});
    let put = op(json!({"type": "envoy.config.cluster.v3.ClusterCollection",
        "name": "xdstp://a/envoy.config.cluster.v3.ClusterCollection/c",
        "variants": [{"resource": {"@type": "type.googleapis.com/envoy.config.cluster.v3.ClusterCollection",
            "entries": {"inline_entry": {"name": "c", "resource": bad_cluster}}}}]}));
    let found = problems(vec![put]);
    assert!(!found.is_empty(), "{found:?}");
    assert!(
        found[0]
            .0
            .starts_with("/operations/0/variants/0/resource/entries/0/inline_entry/resource"),
        "{found:?}"
    );
}
