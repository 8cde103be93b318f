//! Unit tests of TP1 names: parsing, printing, the normal form and collections.

use super::*;

const LISTENER: &str = "envoy.config.listener.v3.Listener";

fn urn(s: &str) -> XdstpUrn {
    XdstpUrn::parse(s).unwrap()
}

fn url(s: &str) -> XdstpUrl {
    XdstpUrl::parse(s).unwrap()
}

#[test]
fn parses_the_tp1_example() {
    let n = urn(
        "xdstp://some.control.plane/envoy.config.route.v3.RouteConfiguration/foo/bar?shard_id=1234&direction=inbound",
    );
    assert_eq!(n.authority(), "some.control.plane");
    assert_eq!(
        n.resource_type(),
        "envoy.config.route.v3.RouteConfiguration"
    );
    assert_eq!(n.id(), "foo/bar");
    assert_eq!(
        n.context().get("shard_id").map(String::as_str),
        Some("1234")
    );
    assert_eq!(
        n.to_string(),
        "xdstp://some.control.plane/envoy.config.route.v3.RouteConfiguration/foo/bar?direction=inbound&shard_id=1234"
    );
}

#[test]
fn normal_form_ignores_context_order_and_escaping_spelling() {
    let a = urn(&format!("xdstp://auth/{LISTENER}/foo?b=2&a=1"));
    let b = urn(&format!("xdstp://auth/{LISTENER}/f%6Fo?a=1&b=2"));
    assert_eq!(a, b);
    assert_eq!(a.to_string(), b.to_string());
    assert_eq!(
        normalize(&format!("xdstp://auth/{LISTENER}/foo?b=2&a=1")).unwrap(),
        format!("xdstp://auth/{LISTENER}/foo?a=1&b=2")
    );
    // Already normal: borrowed, untouched.
    assert!(matches!(
        normalize(&a.to_string()).unwrap(),
        Cow::Borrowed(_)
    ));
    // `%2F` and `/` are the same id, as in Envoy.
    assert_eq!(
        urn(&format!("xdstp://a/{LISTENER}/x%2Fy")),
        urn(&format!("xdstp://a/{LISTENER}/x/y"))
    );
}

#[test]
fn encodes_like_envoy() {
    // Envoy's decode/encode vectors (test/common/config/xds_resource_test.cc): decoding and
    // re-encoding with sorted context parameters gives the input back, byte for byte.
    let escaped = "xdstp://f123%25%2F%3F%23o/envoy.config.listener.v3.Listener/b%25%3A%3F%23%5B%5Dar//baz?%25%23%5B%5D%26%3Dab=cde%25%23%5B%5D%26%3Df";
    let many = "xdstp://f123%25%2F%3F%23o/envoy.config.listener.v3.Listener/b%25%3A%3F%23%5B%5Dar//baz?%25%23%5B%5D%26%3D=bar&%25%23%5B%5D%26%3Dab=cde%25%23%5B%5D%26%3Df&foo=%25%23%5B%5D%26%3D";
    for name in [
        "xdstp:///envoy.config.listener.v3.Listener",
        "xdstp://foo/envoy.config.listener.v3.Listener",
        "xdstp://foo/envoy.config.listener.v3.Listener/bar",
        "xdstp://foo/envoy.config.listener.v3.Listener/bar/baz",
        "xdstp://foo/envoy.config.listener.v3.Listener/bar////baz",
        "xdstp://foo/envoy.config.listener.v3.Listener?ab=cde",
        "xdstp://foo/envoy.config.listener.v3.Listener/bar/baz?ab=",
        "xdstp://foo/envoy.config.listener.v3.Listener/bar/baz?=cd",
        "xdstp://foo/envoy.config.listener.v3.Listener/bar/baz?ab=cde&ba=edc&z=f",
        escaped,
        many,
    ] {
        assert_eq!(urn(name).to_string(), name);
    }
    let n = urn(many);
    assert_eq!(n.authority(), "f123%/?#o");
    assert_eq!(n.id(), "b%:?#[]ar//baz");
    assert_eq!(n.context().get("%#[]&=").map(String::as_str), Some("bar"));
    assert_eq!(n.context().get("foo").map(String::as_str), Some("%#[]&="));
    // Envoy's encoder escapes `:` in ids, so the unescaped spelling normalises to `%3A`.
    let loose = escaped.replace("%3A", ":");
    assert_eq!(urn(&loose).to_string(), escaped);
    let odd = XdstpUrn::new("a", LISTENER, "caf\u{e9} ~x", BTreeMap::new()).unwrap();
    assert_eq!(
        odd.to_string(),
        format!("xdstp://a/{LISTENER}/caf%C3%A9 %7Ex")
    );
}

#[test]
fn empty_authority_and_empty_id() {
    let n = urn(&format!("xdstp:///{LISTENER}/foo"));
    assert_eq!(n.authority(), "");
    assert_eq!(n.to_string(), format!("xdstp:///{LISTENER}/foo"));
    let n = urn(&format!("xdstp://a/{LISTENER}"));
    assert_eq!(n.id(), "");
    assert_eq!(n.to_string(), format!("xdstp://a/{LISTENER}"));
}

#[test]
fn rejects_malformed_names_with_the_component() {
    let cases = [
        ("xdstp:/a/T/x", Component::Scheme),
        ("xdstp://authority-only", Component::ResourceType),
        ("xdstp://a//x", Component::ResourceType),
        ("xdstp://a/not a type/x", Component::ResourceType),
        ("xdstp://a/envoy.1bad/x", Component::ResourceType),
        ("xdstp://a/T/x%ff", Component::Id),
        ("xdstp://a/T/x?k=%C3", Component::ContextParams),
        ("xdstp://a/T/x/*", Component::Id),
        ("xdstp://a/T/x#entry=e", Component::Directives),
        ("xdstp://a/T/x%00", Component::Id),
    ];
    for (name, component) in cases {
        let err = XdstpUrn::parse(name).unwrap_err();
        assert_eq!(err.component, component, "{name}: {err}");
        assert_eq!(err.code(), "invalid_xdstp_name");
    }
    let long = format!("xdstp://a/T/{}", "x".repeat(MAX_NAME_LEN));
    assert_eq!(
        XdstpUrn::parse(&long).unwrap_err().component,
        Component::Name
    );
}

#[test]
fn the_normal_form_keeps_within_the_length_limit() {
    // Found by the fuzz target `xdstp_name`: a name within the limit whose normal form is
    // not (each `~` becomes `%7E`) was accepted, so the name it was stored under, and the
    // one Envoy sends back, could not be parsed again.
    let prefix = format!("xdstp://a/{LISTENER}/");
    let fill = "x".repeat(MAX_NAME_LEN - prefix.len() - 8);
    let name = format!("{prefix}{fill}{}", "~".repeat(8));
    assert_eq!(name.len(), MAX_NAME_LEN);
    for err in [
        XdstpUrn::parse(&name).unwrap_err(),
        XdstpUrl::parse(&name).unwrap_err(),
        normalize(&name).unwrap_err(),
        XdstpUrn::new("a", LISTENER, format!("{fill}~~~~~~~~"), BTreeMap::new()).unwrap_err(),
    ] {
        assert_eq!(err.component, Component::Name, "{err}");
        assert_eq!(err.code(), "invalid_xdstp_name");
        assert!(
            err.to_string()
                .contains("normal form is 8208 bytes long; the limit is 8192"),
            "{err}"
        );
    }
    // Where the normal form just fits, it parses back to the same name.
    let fits = format!("{prefix}{fill}~~");
    let normal = normalize(&fits).unwrap();
    assert_eq!(normal.len(), MAX_NAME_LEN - 2);
    assert_eq!(urn(&normal), urn(&fits));
}

#[test]
fn accepts_the_xds_context_params_envoy_sends() {
    // Envoy's XdsTpAdsIntegrationTest.Basic: a CDS glob with the node's context parameters
    // and a member with the same ones.
    let glob = url(
        "xdstp://test/envoy.config.cluster.v3.Cluster/foo-cluster/*?xds.node.cluster=cluster_name&xds.node.id=node_name",
    );
    let member = urn(
        "xdstp://test/envoy.config.cluster.v3.Cluster/foo-cluster/baz?xds.node.cluster=cluster_name&xds.node.id=node_name",
    );
    assert_eq!(
        member.context().get("xds.node.id").map(String::as_str),
        Some("node_name")
    );
    assert!(glob.glob_matches(&member));
    assert!(matches!(
        SubscriptionName::parse(&glob.to_string()).unwrap(),
        SubscriptionName::Glob(_)
    ));
    // TP1: context parameters must be equal, `xds.*` ones included.
    let bare = urn("xdstp://test/envoy.config.cluster.v3.Cluster/foo-cluster/baz");
    assert!(!glob.glob_matches(&bare));
    let other_node = urn(
        "xdstp://test/envoy.config.cluster.v3.Cluster/foo-cluster/baz?xds.node.cluster=cluster_name&xds.node.id=other",
    );
    assert!(!glob.glob_matches(&other_node));
    // Envoy's GrpcMuxImplTest.XdstpWithContextParams, and the other `xds.*` families.
    let listeners = url("xdstp://test/envoy.config.listener.v3.Listener/*?xds.node.id=node_name");
    assert!(listeners.glob_matches(&urn(
        "xdstp://test/envoy.config.listener.v3.Listener/x?xds.node.id=node_name"
    )));
    for name in [
        "xdstp://test/envoy.config.cluster.v3.Cluster/x?xds.node.id=node_name",
        "xdstp://a/T/x?xds.node.locality.zone=z1&xds.node.metadata.team=t",
        "xdstp://a/T/x?xds.client_feature.envoy.lb.does_not_support_overprovisioning=true",
        "xdstp://a/T/x?xds.resource.vip=1.2.3.4",
    ] {
        assert_eq!(normalize(name).unwrap(), name);
    }
    let stored = XdstpUrn::new(
        "test",
        "envoy.config.cluster.v3.Cluster",
        "foo-cluster/baz",
        BTreeMap::from([("xds.node.id".to_owned(), "node_name".to_owned())]),
    );
    assert!(stored.is_ok());
}

#[test]
fn parses_what_envoy_parses() {
    // Spelt loosely; each normal form is what Envoy's decode and sorted encode give (most are
    // Envoy's own DecodeEncode vectors).
    let base = "xdstp://foo/envoy.config.listener.v3.Listener/bar/baz";
    for (loose, envoy) in [
        // A parameter without `=` has an empty value.
        (format!("{base}?ab"), format!("{base}?ab=")),
        // Nothing follows a final `&`.
        (format!("{base}?ab=cde&"), format!("{base}?ab=cde")),
        (
            format!("{base}?z=f&ba=edc&ab=cde&"),
            format!("{base}?ab=cde&ba=edc&z=f"),
        ),
        // Of a repeated key, the first value counts.
        (format!("{base}?ab=cde&ab=xyz"), format!("{base}?ab=cde")),
        // A `%` that starts no escape is a literal `%` (and normalises to `%25`).
        (
            "xdstp://f123%/envoy.config.listener.v3.Listener/b%:ar//baz".to_owned(),
            "xdstp://f123%25/envoy.config.listener.v3.Listener/b%25%3Aar//baz".to_owned(),
        ),
    ] {
        assert_eq!(normalize(&loose).unwrap(), envoy, "{loose}");
    }
    // `&&` is an empty key with an empty value, as Envoy reads it.
    let n = urn(&format!("{base}?ab=cde&&z=f"));
    assert_eq!(n.context().get("").map(String::as_str), Some(""));
    assert_eq!(n.to_string(), format!("{base}?=&ab=cde&z=f"));
    // Two spellings of one key: Envoy decodes in raw-key order, so `a` (after `%61`) wins.
    assert_eq!(
        urn("xdstp://a/T/x?a=2&%61=1")
            .context()
            .get("a")
            .map(String::as_str),
        Some("2")
    );
    // `%` then non-hex, and `%` too close to the end, stay literal; `%%41` is `%A`.
    assert_eq!(urn("xdstp://a/T/50%zz%4").id(), "50%zz%4");
    assert_eq!(urn("xdstp://a/T/%%41").id(), "%A");
    // `*` is a glob only as the last segment; elsewhere it is part of the id.
    let starred = urn(&format!("xdstp://foo/{LISTENER}/bar/*/baz"));
    assert_eq!(starred.id(), "bar/*/baz");
    assert_eq!(
        starred.to_string(),
        format!("xdstp://foo/{LISTENER}/bar/*/baz")
    );
    assert!(url(&format!("xdstp://foo/{LISTENER}/bar/*/*")).glob_matches(&starred));
    assert!(XdstpUrn::parse(&format!("xdstp://foo/{LISTENER}/bar/*")).is_err());
}

#[test]
fn urls_carry_globs_and_directives() {
    let u = url(&format!(
        "xdstp://a/{LISTENER}/foo/*?k=v#alt=xdstp://b/{LISTENER}/bar,entry=e.1"
    ));
    assert!(u.is_glob());
    assert_eq!(u.directives().len(), 2);
    assert!(matches!(&u.directives()[0], Directive::Alt(alt) if alt.authority() == "b"));
    assert_eq!(u.directives()[1], Directive::Entry("e.1".into()));
    assert_eq!(url(&u.to_string()), u);

    for bad in [
        "xdstp://a/T/x#alt=xdstp://b/T/y,alt=xdstp://c/T/z",
        "xdstp://a/T/x#entry=a,entry=b",
        "xdstp://a/T/x#entry=bad name",
        "xdstp://a/T/x#mirror=1",
        "xdstp://a/T/x#alt=http://b/T/y",
    ] {
        assert_eq!(
            XdstpUrl::parse(bad).unwrap_err().component,
            Component::Directives,
            "{bad}"
        );
    }
}

#[test]
fn glob_matches_direct_members_with_the_same_context() {
    let glob = url(&format!("xdstp://a/{LISTENER}/foo/*?k=v"));
    assert!(glob.glob_matches(&urn(&format!("xdstp://a/{LISTENER}/foo/bar?k=v"))));
    assert!(!glob.glob_matches(&urn(&format!("xdstp://a/{LISTENER}/foo/bar/baz?k=v"))));
    assert!(!glob.glob_matches(&urn(&format!("xdstp://a/{LISTENER}/foo/bar"))));
    assert!(!glob.glob_matches(&urn(&format!("xdstp://a/{LISTENER}/foo/bar?k=v&x=y"))));
    assert!(!glob.glob_matches(&urn(&format!("xdstp://b/{LISTENER}/foo/bar?k=v"))));
    assert!(!glob.glob_matches(&urn(
        "xdstp://a/envoy.config.cluster.v3.Cluster/foo/bar?k=v"
    )));
    assert!(!glob.glob_matches(&urn(&format!("xdstp://a/{LISTENER}/foobar?k=v"))));
    let root = url(&format!("xdstp://a/{LISTENER}/*"));
    assert!(root.glob_matches(&urn(&format!("xdstp://a/{LISTENER}/x"))));
    assert!(!root.glob_matches(&urn(&format!("xdstp://a/{LISTENER}/x/y"))));

    let member = urn(&format!("xdstp://a/{LISTENER}/foo/bar?k=v"));
    assert_eq!(member.collection().unwrap(), glob);
    assert!(member.collection().unwrap().glob_matches(&member));
}

#[test]
fn glob_membership_is_envoys() {
    // Envoy's NewGrpcMuxImplTest.XdsTpGlobCollection: the glob (node context `foo=bar`
    // added, parameters sorted) and the member it delivers.
    let cla = "xdstp://foo/envoy.config.endpoint.v3.ClusterLoadAssignment";
    let ctx = "?foo=bar&some=thing&thing=some";
    let glob = url(&format!("{cla}/bar/*{ctx}"));
    let member = urn(&format!("{cla}/bar/a{ctx}"));
    assert!(glob.glob_matches(&member));
    assert_eq!(member.collection(), Some(glob.clone()));
    // Envoy's WatchMap replaces what follows the id's last `/` with `*`: a trailing `/`
    // leaves an empty last segment, still a member.
    let trailing = urn(&format!("{cla}/bar/{ctx}"));
    assert!(glob.glob_matches(&trailing));
    assert_eq!(trailing.collection(), Some(glob.clone()));
    // An id without `/`, even an empty one, is in the type's root collection.
    let root = url(&format!("{cla}/*{ctx}"));
    for id in ["", "/bar", "/a"] {
        let n = urn(&format!("{cla}{id}{ctx}"));
        assert!(root.glob_matches(&n), "{n}");
        assert_eq!(n.collection(), Some(root.clone()), "{n}");
        assert!(!glob.glob_matches(&n), "{n}");
    }
    // `.../bar` is in the root collection, not in `.../bar/*`; `.../bar//a` is in `bar//*`.
    let deeper = urn(&format!("{cla}/bar//a{ctx}"));
    assert!(!glob.glob_matches(&deeper));
    assert_eq!(
        deeper.collection().unwrap().to_string(),
        format!("{cla}/bar//*{ctx}")
    );
}

#[test]
fn subscriptions_drop_directives() {
    // Envoy's XdsResourceLocatorTest.Schemes locator, and a glob beside it.
    let Ok(SubscriptionName::Urn(n)) =
        SubscriptionName::parse("xdstp://foo/bar/baz/blah?a=b#entry=m")
    else {
        panic!("a URN with a directive is the URN");
    };
    assert_eq!(n.to_string(), "xdstp://foo/bar/baz/blah?a=b");
    let Ok(SubscriptionName::Glob(g)) = SubscriptionName::parse(
        "xdstp://foo/bar/baz/*?a=b#alt=xdstp://fallback/bar/baz/*?a=b,entry=m",
    ) else {
        panic!("a glob with directives is the glob");
    };
    assert!(g.directives().is_empty());
    // The key the registry indexes streams by is the members' collection.
    let member = urn("xdstp://foo/bar/baz/blah?a=b");
    assert_eq!(g.to_string(), "xdstp://foo/bar/baz/*?a=b");
    assert_eq!(member.collection().unwrap().to_string(), g.to_string());
    assert!(g.glob_matches(&member));
    // Dropped, but only once valid; and a stored name still may not carry any.
    assert_eq!(
        SubscriptionName::parse("xdstp://foo/bar/baz/*#mirror=1")
            .unwrap_err()
            .component,
        Component::Directives
    );
    assert!(XdstpUrn::parse("xdstp://foo/bar/baz/blah?a=b#entry=m").is_err());
}

#[test]
fn type_segment_is_checked_against_the_resource_type() {
    let n = urn("xdstp://a/envoy.config.cluster.v3.Cluster/c1");
    assert!(
        n.check_type("type.googleapis.com/envoy.config.cluster.v3.Cluster")
            .is_ok()
    );
    assert!(n.check_type("envoy.config.cluster.v3.Cluster").is_ok());
    let err = n
        .check_type("type.googleapis.com/envoy.config.listener.v3.Listener")
        .unwrap_err();
    assert_eq!(err.code(), "xdstp_type_mismatch");
    assert!(
        err.to_string()
            .contains("does not match the resource's type")
    );
}

#[test]
fn authorities_are_checked_when_configured() {
    let n = urn("xdstp://a.example/T/x");
    assert!(n.check_authority(&[]).is_ok());
    assert!(n.check_authority(&["a.example".into()]).is_ok());
    assert_eq!(
        n.check_authority(&["b.example".into()]).unwrap_err().code(),
        "unknown_authority"
    );
}

#[test]
fn opaque_names_are_untouched() {
    for name in [
        "listener_0",
        "route/with?odd#chars",
        "XDSTP://not/structured",
        "",
    ] {
        assert_eq!(normalize(name).unwrap(), name);
        assert_eq!(
            ResourceName::parse(name).unwrap(),
            ResourceName::Opaque(name.into())
        );
    }
    assert!(matches!(
        SubscriptionName::parse("xdstp://a/T/x/*").unwrap(),
        SubscriptionName::Glob(_)
    ));
    assert!(matches!(
        SubscriptionName::parse("xdstp://a/T/x").unwrap(),
        SubscriptionName::Urn(_)
    ));
}
