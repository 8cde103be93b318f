//! Parsing `xdstp:` names the way Envoy's `XdsResourceIdentifier::decodeUrl` does, and the
//! rules on decoded parts that parsing and [`XdstpUrn::new`](super::XdstpUrn::new) share.

use std::borrow::Cow;
use std::collections::BTreeMap;

use percent_encoding::percent_decode_str;

use super::{Component, Directive, MAX_NAME_LEN, NameError, Parts, SCHEME, XdstpUrl};

/// How deeply `alt=` directives may nest.
const MAX_ALT_DEPTH: usize = 4;

pub(super) fn parse_url(name: &str, alt_depth: usize) -> Result<XdstpUrl, NameError> {
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::malformed(
            Component::Name,
            format!("{} bytes long; the limit is {MAX_NAME_LEN}", name.len()),
        ));
    }
    let rest = name.strip_prefix(SCHEME).ok_or_else(|| {
        NameError::malformed(Component::Scheme, "an xdstp name starts with `xdstp://`")
    })?;
    let rest = rest
        .strip_prefix("//")
        .ok_or_else(|| NameError::malformed(Component::Scheme, "expected `//` after `xdstp:`"))?;
    let (rest, fragment) = match rest.split_once('#') {
        Some((rest, fragment)) => (rest, Some(fragment)),
        None => (rest, None),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = rest.split_once('/').ok_or_else(|| {
        NameError::malformed(
            Component::ResourceType,
            "missing: expected `xdstp://authority/resource.Type/id`",
        )
    })?;
    let (resource_type, id) = path.split_once('/').unwrap_or((path, ""));
    let parts = Parts {
        authority: decode(authority, Component::Authority)?,
        resource_type: resource_type.to_owned(),
        id: decode(id, Component::Id)?,
        context: parse_context(query.unwrap_or(""))?,
    };
    check_decoded(&parts)?;
    let directives = match fragment {
        Some(fragment) => parse_directives(fragment, alt_depth)?,
        None => Vec::new(),
    };
    let url = XdstpUrl { parts, directives };
    check_normal_len(&url)?;
    Ok(url)
}

/// The limit holds for the normal form too: escaping can make it longer than the name as
/// given (`~` is `%7E`, `é` is `%C3%A9`), and a name vxds keys or sends in normal form must
/// parse again.
pub(super) fn check_normal_len(name: &impl std::fmt::Display) -> Result<(), NameError> {
    /// Counts what is written, so the check builds no string.
    struct Count(usize);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len();
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail.
    let _ = std::fmt::write(&mut count, format_args!("{name}"));
    if count.0 > MAX_NAME_LEN {
        return Err(NameError::malformed(
            Component::Name,
            format!(
                "its normal form is {} bytes long; the limit is {MAX_NAME_LEN}",
                count.0
            ),
        ));
    }
    Ok(())
}

/// Rules on decoded parts, shared by parsing and [`XdstpUrn::new`].
pub(super) fn check_decoded(parts: &Parts) -> Result<(), NameError> {
    check_message_name(&parts.resource_type)?;
    no_controls(&parts.authority, Component::Authority)?;
    no_controls(&parts.id, Component::Id)?;
    // No `xds.*` ban here: TP1 keeps that namespace out of a client's *configured* locator only.
    // The names a client sends carry it (Envoy adds `xds.node.*` and `xds.client_feature.*` to
    // every collection subscription), and so must the resources an operator stores to match them.
    for (key, value) in &parts.context {
        no_controls(key, Component::ContextParams)?;
        no_controls(value, Component::ContextParams)?;
    }
    // A `*` segment anywhere but last is an opaque part of the id (TP1: only a trailing `/*` is
    // a glob), as it is to Envoy.
    Ok(())
}

fn check_message_name(name: &str) -> Result<(), NameError> {
    let valid_ident = |s: &str| {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if name.is_empty() {
        return Err(NameError::malformed(Component::ResourceType, "missing"));
    }
    if !name.split('.').all(valid_ident) {
        return Err(NameError::malformed(
            Component::ResourceType,
            format!(
                "`{name}` is not a protobuf message name like `envoy.config.cluster.v3.Cluster`"
            ),
        ));
    }
    Ok(())
}

fn no_controls(s: &str, component: Component) -> Result<(), NameError> {
    match s.chars().find(|c| c.is_control()) {
        Some(c) => Err(NameError::malformed(
            component,
            format!("contains the control character U+{:04X}", c as u32),
        )),
        None => Ok(()),
    }
}

/// Percent-decoding as Envoy's `PercentEncoding::decode`: `%` and two hex digits is a byte, any
/// other `%` is itself. Unlike Envoy the result must be UTF-8, as proto3 strings are.
fn decode(s: &str, component: Component) -> Result<String, NameError> {
    percent_decode_str(s)
        .decode_utf8()
        .map(Cow::into_owned)
        .map_err(|_| NameError::malformed(component, "percent-escapes do not decode to UTF-8"))
}

/// The query as Envoy's `QueryParamsMulti::parseQueryString` and `decodeQueryParams` read it.
/// TP1 says nothing of these corners; Envoy is what sends and compares the names, so they are
/// its: `k` alone is `k=` (empty value); nothing follows a final `&` (but `&&` is an empty
/// key); of a repeated key the first value counts. Envoy groups by the *raw* key and then
/// decodes in raw-key byte order, so of two spellings of one key (`%61=1&a=2`) the later in
/// that order wins; so here.
fn parse_context(query: &str) -> Result<BTreeMap<String, String>, NameError> {
    let mut raw: BTreeMap<&str, &str> = BTreeMap::new();
    let mut rest = query;
    while !rest.is_empty() {
        let (param, tail) = rest.split_once('&').unwrap_or((rest, ""));
        let (key, value) = param.split_once('=').unwrap_or((param, ""));
        raw.entry(key).or_insert(value);
        rest = tail;
    }
    let mut context = BTreeMap::new();
    for (key, value) in raw {
        context.insert(
            decode(key, Component::ContextParams)?,
            decode(value, Component::ContextParams)?,
        );
    }
    Ok(context)
}

fn parse_directives(fragment: &str, alt_depth: usize) -> Result<Vec<Directive>, NameError> {
    let mut directives = Vec::new();
    let (mut seen_alt, mut seen_entry) = (false, false);
    for component in fragment.split(',') {
        if let Some(alt) = component.strip_prefix("alt=") {
            if std::mem::replace(&mut seen_alt, true) {
                return Err(NameError::malformed(
                    Component::Directives,
                    "`alt` appears twice",
                ));
            }
            if alt_depth >= MAX_ALT_DEPTH {
                return Err(NameError::malformed(
                    Component::Directives,
                    format!("`alt` nests deeper than {MAX_ALT_DEPTH} levels"),
                ));
            }
            let alt = decode(alt, Component::Directives)?;
            let url = parse_url(&alt, alt_depth + 1)
                .map_err(|e| NameError::malformed(Component::Directives, format!("`alt`: {e}")))?;
            directives.push(Directive::Alt(Box::new(url)));
        } else if let Some(entry) = component.strip_prefix("entry=") {
            if std::mem::replace(&mut seen_entry, true) {
                return Err(NameError::malformed(
                    Component::Directives,
                    "`entry` appears twice",
                ));
            }
            let entry = decode(entry, Component::Directives)?;
            let valid = !entry.is_empty()
                && entry
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-./~:".contains(c));
            if !valid {
                return Err(NameError::malformed(
                    Component::Directives,
                    format!("entry `{entry}` must match [a-zA-Z0-9_\\-./~:]+"),
                ));
            }
            directives.push(Directive::Entry(entry));
        } else {
            return Err(NameError::malformed(
                Component::Directives,
                format!("unknown directive `{component}` (expected `alt=` or `entry=`)"),
            ));
        }
    }
    Ok(directives)
}
