//! `xdstp://` structured resource names (xRFC TP1): parsing, validation, the normal form, type
//! checks and glob collections.
//!
//! `xdstp://[authority]/{resource type}/{id/*}?{context params}#{directives}`
//!
//! - A URN ([`XdstpUrn`]) names one resource: no glob, no directives.
//! - A URL ([`XdstpUrl`]) locates resources: it may end in a `/*` glob (a collection of the
//!   resources directly under that path) and carry the directives `alt=` and `entry=`.
//!
//! Glob membership is Envoy's: a URN belongs to the one collection its id names once everything
//! after the last `/` is replaced by `*` (`foo/` is in `foo/*`; an id without `/`, even an empty
//! one, is in `T/*`), with the same authority, type and context parameters.
//! [`XdstpUrn::collection`] and [`XdstpUrl::glob_matches`] are the two faces of that one rule.
//!
//! Components are percent-decoded on parse. The normal form re-encodes them exactly as Envoy's
//! `XdsResourceIdentifier::encodeUrn` does with sorted context parameters, so a name vxds sends
//! is byte-for-byte the name an Envoy client computes. As in Envoy's model the id is a single
//! string, so `%2F` and `/` in it are the same. Names that do not start with `xdstp:` are opaque
//! and never touched.
//!
//! Directives are the client's business (TP1: they tell the client how to interpret a URL), so
//! a subscription's directives are dropped by [`SubscriptionName::parse`]: `.../foo/*#alt=...`
//! subscribes to the glob `.../foo/*`, keyed, woken and matched as that glob, and
//! `.../x#entry=e` to the URN `.../x`. The server answers with the client's own spelling,
//! which its caller keeps. A stored resource's name is a URN and may carry none.
//!
//! Context parameters may be in the `xds.*` namespace. TP1 forbids it only in a client's
//! configured locator, which vxds never parses; Envoy adds `xds.node.*` and
//! `xds.client_feature.*` to every collection subscription, and a stored resource is a member
//! of a glob only with exactly the glob's context parameters, those included.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

mod parse;

/// The scheme prefix that makes a name structured; anything else is opaque.
pub const SCHEME: &str = "xdstp:";
/// Longest name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 8192;

// Envoy escapes bytes below 0x20 and from `~` (0x7E) up, plus per-component reserved sets.
const ALWAYS: &AsciiSet = &CONTROLS.add(b'~').add(b'%');
const AUTHORITY: &AsciiSet = &ALWAYS.add(b'/').add(b'?').add(b'#');
const ID: &AsciiSet = &ALWAYS.add(b':').add(b'?').add(b'#').add(b'[').add(b']');
const PARAM: &AsciiSet = &ALWAYS.add(b'#').add(b'[').add(b']').add(b'&').add(b'=');
const DIRECTIVE: &AsciiSet = &ALWAYS.add(b'#').add(b'[').add(b']').add(b',');

/// Whether `name` is structured (starts with `xdstp:`) rather than opaque.
pub fn is_xdstp(name: &str) -> bool {
    name.starts_with(SCHEME)
}

/// The normal form of a resource name: opaque names as they are, `xdstp:` names as a URN in
/// normal form (or an error, for a malformed one).
pub fn normalize(name: &str) -> Result<Cow<'_, str>, NameError> {
    if !is_xdstp(name) {
        return Ok(Cow::Borrowed(name));
    }
    let urn = XdstpUrn::parse(name)?;
    let normal = urn.to_string();
    Ok(if normal == name {
        Cow::Borrowed(name)
    } else {
        Cow::Owned(normal)
    })
}

/// A resource name as stored: opaque, or a structured URN.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceName {
    Opaque(String),
    Xdstp(XdstpUrn),
}

impl ResourceName {
    pub fn parse(name: &str) -> Result<Self, NameError> {
        if is_xdstp(name) {
            XdstpUrn::parse(name).map(ResourceName::Xdstp)
        } else {
            Ok(ResourceName::Opaque(name.to_owned()))
        }
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourceName::Opaque(name) => f.write_str(name),
            ResourceName::Xdstp(urn) => urn.fmt(f),
        }
    }
}

/// What a client may subscribe to: a resource by name, or (Delta, xdstp) a glob collection.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum SubscriptionName {
    Opaque(String),
    Urn(XdstpUrn),
    /// Never with directives: its `Display` is the collection's key.
    Glob(XdstpUrl),
}

impl SubscriptionName {
    /// Parses a name a client subscribes to. Directives are validated and then dropped (see the
    /// module header): `.../foo/*#alt=...` is the glob `.../foo/*`, `.../x#entry=e` the URN
    /// `.../x`. The caller keeps the client's spelling for its responses.
    pub fn parse(name: &str) -> Result<Self, NameError> {
        if !is_xdstp(name) {
            return Ok(SubscriptionName::Opaque(name.to_owned()));
        }
        let mut url = XdstpUrl::parse(name)?;
        url.directives.clear();
        if url.is_glob() {
            return Ok(SubscriptionName::Glob(url));
        }
        url.into_urn().map(SubscriptionName::Urn)
    }
}

/// Which part of a name is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Component {
    Scheme,
    Authority,
    ResourceType,
    Id,
    ContextParams,
    Directives,
    Name,
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Component::Scheme => "scheme",
            Component::Authority => "authority",
            Component::ResourceType => "resource type",
            Component::Id => "id",
            Component::ContextParams => "context parameters",
            Component::Directives => "directives",
            Component::Name => "name",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("xdstp name: {component}: {reason}")]
pub struct NameError {
    pub component: Component,
    pub reason: String,
    pub kind: NameErrorKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameErrorKind {
    Malformed,
    /// The type segment is not the resource's type.
    TypeMismatch,
    /// The authority is not one this server serves.
    UnknownAuthority,
}

impl NameError {
    fn malformed(component: Component, reason: impl Into<String>) -> Self {
        Self {
            component,
            reason: reason.into(),
            kind: NameErrorKind::Malformed,
        }
    }

    pub fn code(&self) -> &'static str {
        match self.kind {
            NameErrorKind::Malformed => "invalid_xdstp_name",
            NameErrorKind::TypeMismatch => "xdstp_type_mismatch",
            NameErrorKind::UnknownAuthority => "unknown_authority",
        }
    }
}

/// The parts every `xdstp:` name has, decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Parts {
    authority: String,
    resource_type: String,
    id: String,
    context: BTreeMap<String, String>,
}

/// The accessors URNs and URLs share, over their decoded [`Parts`].
macro_rules! part_accessors {
    () => {
        pub fn authority(&self) -> &str {
            &self.parts.authority
        }

        /// The protobuf message name of the resource, e.g. `envoy.config.cluster.v3.Cluster`.
        pub fn resource_type(&self) -> &str {
            &self.parts.resource_type
        }

        /// The id, decoded: `foo/bar` for `.../foo/bar`.
        pub fn id(&self) -> &str {
            &self.parts.id
        }

        /// The context parameters, decoded.
        pub fn context(&self) -> &BTreeMap<String, String> {
            &self.parts.context
        }
    };
}

/// A structured resource name: `xdstp://authority/type/id?context`. Equality ignores the order
/// of context parameters; `Display` gives the normal form.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct XdstpUrn {
    parts: Parts,
}

impl XdstpUrn {
    pub fn parse(name: &str) -> Result<Self, NameError> {
        XdstpUrl::parse(name)?.into_urn()
    }

    /// Builds a URN from decoded parts, with the same validation as parsing.
    pub fn new(
        authority: impl Into<String>,
        resource_type: impl Into<String>,
        id: impl Into<String>,
        context: BTreeMap<String, String>,
    ) -> Result<Self, NameError> {
        let parts = Parts {
            authority: authority.into(),
            resource_type: resource_type.into(),
            id: id.into(),
            context,
        };
        parse::check_decoded(&parts)?;
        if is_glob_id(&parts.id) {
            return Err(NameError::malformed(
                Component::Id,
                "a resource name cannot be a glob",
            ));
        }
        let urn = Self { parts };
        parse::check_normal_len(&urn)?;
        Ok(urn)
    }

    part_accessors!();

    /// The type segment names the resource's type; `type_url` may be a full type URL
    /// (`type.googleapis.com/envoy.config.cluster.v3.Cluster`) or a message name.
    pub fn check_type(&self, type_url: &str) -> Result<(), NameError> {
        let expected = type_url.rsplit('/').next().unwrap_or(type_url);
        if self.parts.resource_type == expected {
            return Ok(());
        }
        Err(NameError {
            component: Component::ResourceType,
            reason: format!(
                "`{}` does not match the resource's type `{expected}`",
                self.parts.resource_type
            ),
            kind: NameErrorKind::TypeMismatch,
        })
    }

    /// The authority is among `allowed`; an empty list allows every authority.
    pub fn check_authority(&self, allowed: &[String]) -> Result<(), NameError> {
        if allowed.is_empty() || allowed.contains(&self.parts.authority) {
            return Ok(());
        }
        Err(NameError {
            component: Component::Authority,
            reason: format!(
                "`{}` is not an authority this server serves ({})",
                self.parts.authority,
                allowed.join(", ")
            ),
            kind: NameErrorKind::UnknownAuthority,
        })
    }

    /// The glob collection this resource is a direct member of, as Envoy's `WatchMap` computes
    /// it: everything after the id's last `/` becomes `*` (`.../foo/*?ctx` for
    /// `.../foo/bar?ctx`, and for `.../foo/?ctx`), and an id without `/`, even an empty one,
    /// belongs to `.../T/*?ctx`. [`XdstpUrl::glob_matches`] agrees exactly.
    ///
    /// Always `Some`, since every URN has a collection; the `Option` stays so callers need not
    /// change.
    pub fn collection(&self) -> Option<XdstpUrl> {
        let parent = self
            .parts
            .id
            .rfind('/')
            .map_or("", |i| &self.parts.id[..=i]);
        let mut parts = self.parts.clone();
        parts.id = format!("{parent}*");
        Some(XdstpUrl {
            parts,
            directives: Vec::new(),
        })
    }
}

impl fmt::Display for XdstpUrn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_parts(&self.parts, f)
    }
}

impl std::str::FromStr for XdstpUrn {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// A processing directive in a URL's fragment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Directive {
    /// A fallback locator.
    Alt(Box<XdstpUrl>),
    /// An entry of a list collection, by name.
    Entry(String),
}

/// A resource locator: a URN, or a `/*` glob collection, with optional directives.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct XdstpUrl {
    parts: Parts,
    directives: Vec<Directive>,
}

impl XdstpUrl {
    pub fn parse(name: &str) -> Result<Self, NameError> {
        parse::parse_url(name, 0)
    }

    part_accessors!();

    pub fn directives(&self) -> &[Directive] {
        &self.directives
    }

    /// Whether this names a glob collection (`.../*`).
    pub fn is_glob(&self) -> bool {
        is_glob_id(&self.parts.id)
    }

    /// Whether `urn` is a direct member of this glob collection: same authority, type and
    /// context parameters, and an id one segment below the glob's path, that segment possibly
    /// empty (`.../foo/` is in `.../foo/*`, as in Envoy). Exactly when `urn.collection()` is
    /// this URL without its directives.
    pub fn glob_matches(&self, urn: &XdstpUrn) -> bool {
        if !self.is_glob()
            || self.parts.authority != urn.parts.authority
            || self.parts.resource_type != urn.parts.resource_type
            || self.parts.context != urn.parts.context
        {
            return false;
        }
        let prefix = &self.parts.id[..self.parts.id.len() - 1];
        urn.parts
            .id
            .strip_prefix(prefix)
            .is_some_and(|rest| !rest.contains('/'))
    }

    /// A locator for `urn` with `directives` (a redirect's target, built from its parts).
    pub fn from_urn(urn: XdstpUrn, directives: Vec<Directive>) -> Self {
        Self {
            parts: urn.parts,
            directives,
        }
    }

    /// The same locator without its directives, which are not part of a resource's identity.
    pub fn without_directives(&self) -> Self {
        Self {
            parts: self.parts.clone(),
            directives: Vec::new(),
        }
    }

    /// The `#entry=` directive's entry name, if any.
    pub fn entry(&self) -> Option<&str> {
        self.directives.iter().find_map(|d| match d {
            Directive::Entry(e) => Some(e.as_str()),
            Directive::Alt(_) => None,
        })
    }

    /// The URN this URL names, when it has neither glob nor directives.
    pub fn into_urn(self) -> Result<XdstpUrn, NameError> {
        if self.is_glob() {
            return Err(NameError::malformed(
                Component::Id,
                "a resource name cannot be a glob (`/*` is for collection locators)",
            ));
        }
        if !self.directives.is_empty() {
            return Err(NameError::malformed(
                Component::Directives,
                "a resource name cannot carry processing directives (`#...`)",
            ));
        }
        Ok(XdstpUrn { parts: self.parts })
    }
}

impl fmt::Display for XdstpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_parts(&self.parts, f)?;
        for (i, directive) in self.directives.iter().enumerate() {
            f.write_str(if i == 0 { "#" } else { "," })?;
            match directive {
                Directive::Alt(url) => write!(
                    f,
                    "alt={}",
                    utf8_percent_encode(&url.to_string(), DIRECTIVE)
                )?,
                Directive::Entry(entry) => {
                    write!(f, "entry={}", utf8_percent_encode(entry, DIRECTIVE))?
                }
            }
        }
        Ok(())
    }
}

fn is_glob_id(id: &str) -> bool {
    id == "*" || id.ends_with("/*")
}

fn write_parts(parts: &Parts, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    write!(
        f,
        "xdstp://{}/{}",
        utf8_percent_encode(&parts.authority, AUTHORITY),
        parts.resource_type
    )?;
    if !parts.id.is_empty() {
        write!(f, "/{}", utf8_percent_encode(&parts.id, ID))?;
    }
    // Envoy sorts the encoded `key=value` strings; so do we, for identical bytes.
    let mut params: Vec<String> = parts
        .context
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                utf8_percent_encode(k, PARAM),
                utf8_percent_encode(v, PARAM)
            )
        })
        .collect();
    params.sort();
    for (i, param) in params.iter().enumerate() {
        f.write_str(if i == 0 { "?" } else { "&" })?;
        f.write_str(param)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
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
        let listeners =
            url("xdstp://test/envoy.config.listener.v3.Listener/*?xds.node.id=node_name");
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
}
