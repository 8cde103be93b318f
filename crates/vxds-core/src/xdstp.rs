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
mod tests;
