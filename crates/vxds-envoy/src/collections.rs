//! TP1 beyond singletons and globs: list collections (`<T>Collection` messages of
//! `xds.core.v3.CollectionEntry`), server redirects (a body that is an
//! `xds.core.v3.ResourceLocator`), and the processing directives in names the server hands out.
//!
//! Each rule a write must meet is one function here, called by changeset validation (REST, CLI
//! and fixtures alike); the one rule across the store (a redirect is one hop) is
//! [`check_redirect_graph`], which the store runs inside its write transaction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use envoy_types::pb::xds::core::v3::resource_locator::{self, directive};
use envoy_types::pb::xds::core::v3::{
    CollectionEntry, ContextParams, ResourceLocator, collection_entry,
};
use prost::Message;
use prost_reflect::{DynamicMessage, Kind, ReflectMessage, Value as ReflectValue};
use vxds_core::xdstp::{Directive, XdstpUrl, XdstpUrn};

use crate::descriptors;
use crate::pointer::Pointer;
use crate::resource::TYPE_URL_PREFIX;

/// The message a redirect's body holds.
pub const RESOURCE_LOCATOR: &str = "xds.core.v3.ResourceLocator";
pub const RESOURCE_LOCATOR_TYPE_URL: &str = "type.googleapis.com/xds.core.v3.ResourceLocator";
/// The client feature a subscriber advertises (`node.client_features`) to receive list
/// collections with inline entries instead of locators.
pub const INLINE_ENTRIES_FEATURE: &str = "xds.collections.inline-entries";

/// The stored setting of a list collection, named by the collection's URN.
pub const LIST_COLLECTION_OPTIONS: &str = "vxds.config.v1.ListCollectionOptions";
pub const LIST_COLLECTION_OPTIONS_TYPE_URL: &str =
    "type.googleapis.com/vxds.config.v1.ListCollectionOptions";

/// Whether a `ListCollectionOptions` body (an encoded `Any`) asks for inline entries.
pub fn options_inline(any_bytes: &[u8]) -> bool {
    #[derive(Clone, PartialEq, prost::Message)]
    struct ListCollectionOptions {
        #[prost(bool, tag = "1")]
        inline_entries: bool,
    }
    prost_types::Any::decode(any_bytes)
        .ok()
        .filter(|any| any.type_url == LIST_COLLECTION_OPTIONS_TYPE_URL)
        .and_then(|any| ListCollectionOptions::decode(any.value.as_slice()).ok())
        .is_some_and(|o| o.inline_entries)
}

/// The name rule of a `ListCollectionOptions` resource: the URN of a list collection.
pub fn check_options_name(urn: &XdstpUrn) -> Result<(), RuleError> {
    if member_type(urn.resource_type()).is_some() {
        return Ok(());
    }
    Err(RuleError::new(
        Pointer::root(),
        "not_a_list_collection",
        format!(
            "collection options are named by a list collection's URN \
             (`xdstp://<authority>/<T>Collection/<path>`); `{}` is not a list collection type",
            urn.resource_type()
        ),
    ))
}

/// A rule broken, relative to the body (or the name) it concerns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub pointer: Pointer,
    pub code: &'static str,
    pub message: String,
}

impl RuleError {
    fn new(pointer: Pointer, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            pointer,
            code,
            message: message.into(),
        }
    }
}

// ---- list collections -------------------------------------------------------------------

/// The member type of a list collection type: `envoy.config.listener.v3.Listener` for
/// `envoy.config.listener.v3.ListenerCollection`, when both are messages of the API and the
/// collection's `entries` field holds `xds.core.v3.CollectionEntry`.
pub fn member_type(collection_type: &str) -> Option<&str> {
    let message = collection_type
        .strip_prefix(TYPE_URL_PREFIX)
        .unwrap_or(collection_type);
    let member = message.strip_suffix("Collection")?;
    descriptors::message(member)?;
    let collection = descriptors::message(message)?;
    let entries = collection.get_field(1)?;
    match entries.kind() {
        Kind::Message(m) if m.full_name() == "xds.core.v3.CollectionEntry" => Some(member),
        _ => None,
    }
}

/// A list collection a client asks for by name: which members it stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListCollection {
    /// The collection's URN in normal form, directives dropped.
    pub urn: XdstpUrn,
    /// `type.googleapis.com/<T>Collection`.
    pub collection_type_url: String,
    /// `type.googleapis.com/<T>`.
    pub member_type_url: String,
    /// `xdstp://A/<T>/<path>/*?<ctx>`: exactly the members the glob would deliver.
    pub members: XdstpUrl,
    /// `#entry=`: one inline entry, by name.
    pub entry: Option<String>,
}

impl ListCollection {
    /// `name` as a list collection, if it is an `xdstp://` name of a `<T>Collection` type.
    pub fn parse(name: &str) -> Option<Self> {
        if !vxds_core::xdstp::is_xdstp(name) {
            return None;
        }
        let url = XdstpUrl::parse(name).ok()?;
        if url.is_glob() {
            return None;
        }
        let member = member_type(url.resource_type())?;
        let entry = url.entry().map(str::to_owned);
        let urn = url.without_directives().into_urn().ok()?;
        // A member one segment below the collection's path; its collection is the glob.
        let probe = XdstpUrn::new(
            urn.authority(),
            member,
            if urn.id().is_empty() {
                "x".to_owned()
            } else {
                format!("{}/x", urn.id())
            },
            urn.context().clone(),
        )
        .ok()?;
        Some(Self {
            collection_type_url: format!("{TYPE_URL_PREFIX}{}", urn.resource_type()),
            member_type_url: format!("{TYPE_URL_PREFIX}{member}"),
            members: probe.collection()?,
            urn,
            entry,
        })
    }

    /// The name an inline entry carries for a member: its id's last segment.
    pub fn entry_name(member: &XdstpUrn) -> &str {
        member.id().rsplit('/').next().unwrap_or_default()
    }
}

/// TP1's inline entry name pattern, `^[0-9a-zA-Z_\-\.~:]+$`.
pub fn is_entry_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-.~:".contains(c))
}

/// One entry of a collection being built.
#[derive(Clone, Copy, Debug)]
pub enum Entry<'a> {
    Locator(&'a str),
    Inline {
        name: &'a str,
        version: &'a str,
        /// The member's encoded `google.protobuf.Any`.
        body: &'a [u8],
    },
}

/// Encodes a `<T>Collection` as an encoded `google.protobuf.Any`. Every collection message has
/// its entries at field 1; they are written as a repeated field, as TP1 defines the message
/// (Envoy's `ClusterCollection` declares the field singular, a known slip in its API).
pub fn encode_collection(collection_type_url: &str, entries: &[Entry<'_>]) -> Vec<u8> {
    let mut value = Vec::new();
    for entry in entries {
        let message = match entry {
            Entry::Locator(locator) => CollectionEntry {
                resource_specifier: Some(collection_entry::ResourceSpecifier::Locator(
                    locator_message(locator),
                )),
            },
            Entry::Inline {
                name,
                version,
                body,
            } => CollectionEntry {
                resource_specifier: Some(collection_entry::ResourceSpecifier::InlineEntry(
                    collection_entry::InlineEntry {
                        name: (*name).to_owned(),
                        version: (*version).to_owned(),
                        resource: envoy_types::pb::google::protobuf::Any::decode(*body).ok(),
                    },
                )),
            },
        };
        prost::encoding::message::encode(1, &message, &mut value);
    }
    prost_types::Any {
        type_url: collection_type_url.to_owned(),
        value,
    }
    .encode_to_vec()
}

/// An inline entry of a stored collection, by name: its version and encoded `Any`.
pub fn find_inline_entry(collection_any: &[u8], entry: &str) -> Option<(String, Vec<u8>)> {
    let any = prost_types::Any::decode(collection_any).ok()?;
    decode_entries(&any.value)
        .into_iter()
        .find_map(|e| match e.resource_specifier? {
            collection_entry::ResourceSpecifier::InlineEntry(inline) if inline.name == entry => {
                Some((inline.version, inline.resource?.encode_to_vec()))
            }
            _ => None,
        })
}

/// Field 1 of a collection message, read as repeated `CollectionEntry` whatever the message
/// declares.
fn decode_entries(value: &[u8]) -> Vec<CollectionEntry> {
    #[derive(Clone, PartialEq, prost::Message)]
    struct Entries {
        #[prost(message, repeated, tag = "1")]
        entries: Vec<CollectionEntry>,
    }
    Entries::decode(value)
        .map(|e| e.entries)
        .unwrap_or_default()
}

/// The rules of a stored list collection (a body of a `<T>Collection` type): entry names
/// unique and of TP1's pattern, locators well-formed `xdstp://` URLs of the member type,
/// inline bodies of the member type. (That inline bodies parse is the body's own check.)
pub fn check_stored_collection(message: &DynamicMessage, member_type: &str) -> Vec<RuleError> {
    let mut errors = Vec::new();
    let encoded = message.encode_to_vec();
    let entries = decode_entries(&encoded);
    let field = message
        .descriptor()
        .get_field(1)
        .map_or_else(|| "entries".to_owned(), |f| f.name().to_owned());
    let mut names: BTreeMap<String, usize> = BTreeMap::new();
    for (k, entry) in entries.iter().enumerate() {
        let at = Pointer::root().push(&field).push(k);
        match &entry.resource_specifier {
            None => errors.push(RuleError::new(
                at,
                "empty_collection_entry",
                "an entry needs a `locator` or an `inline_entry`",
            )),
            Some(collection_entry::ResourceSpecifier::Locator(locator)) => {
                let at = at.push("locator");
                match locator_url(locator) {
                    Ok(url) if url.resource_type() != member_type => errors.push(RuleError::new(
                        at,
                        "locator_type_mismatch",
                        format!(
                            "the locator names a `{}`; entries of this collection are `{member_type}`",
                            url.resource_type()
                        ),
                    )),
                    Ok(_) => {}
                    Err(message) => errors.push(RuleError::new(at, "invalid_locator", message)),
                }
            }
            Some(collection_entry::ResourceSpecifier::InlineEntry(inline)) => {
                let at = at.push("inline_entry");
                if !inline.name.is_empty() {
                    if !is_entry_name(&inline.name) {
                        errors.push(RuleError::new(
                            at.push("name"),
                            "invalid_entry_name",
                            format!(
                                "entry name `{}` must match ^[0-9a-zA-Z_\\-\\.~:]+$",
                                inline.name
                            ),
                        ));
                    } else if let Some(first) = names.insert(inline.name.clone(), k) {
                        errors.push(RuleError::new(
                            at.push("name"),
                            "duplicate_entry_name",
                            format!(
                                "entry name `{}` is already used by entry {first}",
                                inline.name
                            ),
                        ));
                    }
                }
                match &inline.resource {
                    None => errors.push(RuleError::new(
                        at.push("resource"),
                        "missing_entry_body",
                        "an inline entry needs its `resource`",
                    )),
                    Some(any) if any.type_url == format!("{TYPE_URL_PREFIX}{member_type}") => {
                        let at = at.push("resource");
                        let ty = crate::resource::ResourceType::resolve(member_type).ok();
                        let body = ty.as_ref().map(|ty| {
                            crate::resource::Body::from_any_bytes(any.encode_to_vec(), ty)
                        });
                        match body {
                            Some(Ok(body)) if member_type == crate::resource::CLUSTER => {
                                for e in crate::rules::check_cluster(&body).errors {
                                    errors.push(RuleError::new(
                                        at.join(&e.pointer),
                                        e.code,
                                        e.message,
                                    ));
                                }
                            }
                            Some(Err(e)) => {
                                errors.push(RuleError::new(at.join(&e.pointer), e.code, e.message))
                            }
                            _ => {}
                        }
                    }
                    Some(any) => errors.push(RuleError::new(
                        at.push("resource").push("@type"),
                        "entry_type_mismatch",
                        format!(
                            "the entry holds `{}`; entries of this collection are `{member_type}`",
                            any.type_url
                        ),
                    )),
                }
            }
        }
    }
    errors
}

// ---- redirects ---------------------------------------------------------------------------

/// A `ResourceLocator` message for an `xdstp://` URL (the caller checked it parses).
pub fn locator_message(url: &str) -> ResourceLocator {
    match XdstpUrl::parse(url) {
        Ok(url) => url_to_locator(&url),
        Err(_) => ResourceLocator::default(),
    }
}

fn url_to_locator(url: &XdstpUrl) -> ResourceLocator {
    let context: HashMap<String, String> = url
        .context()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    ResourceLocator {
        scheme: resource_locator::Scheme::Xdstp as i32,
        id: url.id().to_owned(),
        authority: url.authority().to_owned(),
        resource_type: url.resource_type().to_owned(),
        directives: url
            .directives()
            .iter()
            .map(|d| resource_locator::Directive {
                directive: Some(match d {
                    Directive::Alt(alt) => directive::Directive::Alt(url_to_locator(alt)),
                    Directive::Entry(e) => directive::Directive::Entry(e.clone()),
                }),
            })
            .collect(),
        context_param_specifier: (!context.is_empty()).then_some(
            resource_locator::ContextParamSpecifier::ExactContext(ContextParams {
                params: context,
            }),
        ),
    }
}

/// The `xdstp://` URL a `ResourceLocator` message stands for, or why it stands for none.
pub fn locator_url(locator: &ResourceLocator) -> Result<XdstpUrl, String> {
    if locator.scheme != resource_locator::Scheme::Xdstp as i32 {
        return Err("only `xdstp` locators are served".into());
    }
    let context = match &locator.context_param_specifier {
        Some(resource_locator::ContextParamSpecifier::ExactContext(c)) => c
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        None => BTreeMap::new(),
    };
    let directives = locator
        .directives
        .iter()
        .map(|d| match &d.directive {
            Some(directive::Directive::Alt(alt)) => {
                locator_url(alt).map(|u| Directive::Alt(Box::new(u)))
            }
            Some(directive::Directive::Entry(e)) => Ok(Directive::Entry(e.clone())),
            None => Err("an empty directive".to_owned()),
        })
        .collect::<Result<Vec<_>, _>>()?;
    let urn = XdstpUrn::new(
        locator.authority.clone(),
        locator.resource_type.clone(),
        locator.id.clone(),
        context,
    )
    .map_err(|e| e.to_string())?;
    // Round trip through the text form, so that directives get the parser's checks too.
    let url = XdstpUrl::from_urn(urn, directives);
    XdstpUrl::parse(&url.to_string()).map_err(|e| e.to_string())
}

/// The encoded `Any` of a redirect to `url`.
pub fn redirect_body(url: &XdstpUrl) -> Vec<u8> {
    prost_types::Any {
        type_url: RESOURCE_LOCATOR_TYPE_URL.to_owned(),
        value: url_to_locator(url).encode_to_vec(),
    }
    .encode_to_vec()
}

/// Whether an encoded `Any` is a redirect.
pub fn is_redirect_body(any_bytes: &[u8]) -> bool {
    prost_types::Any::decode(any_bytes).is_ok_and(|any| any.type_url == RESOURCE_LOCATOR_TYPE_URL)
}

/// A redirect body's target as text, or `None` for a body that is not a redirect.
pub fn redirect_target(any_bytes: &[u8]) -> Option<String> {
    let any = prost_types::Any::decode(any_bytes).ok()?;
    if any.type_url != RESOURCE_LOCATOR_TYPE_URL {
        return None;
    }
    let locator = ResourceLocator::decode(any.value.as_slice()).ok()?;
    locator_url(&locator).ok().map(|u| u.to_string())
}

/// A redirect on its own: from an `xdstp://` resource (not a glob collection: TP1 lets only
/// list collections and single resources be redirected), to a well-formed `xdstp://` URL of
/// the same type that is not a glob and not the resource itself. Returns the target's URN (what
/// the one-hop rule keys on).
pub fn check_redirect(
    resource_message: &str,
    name: &str,
    target: &str,
) -> Result<XdstpUrn, RuleError> {
    let fail = |code, message: String| RuleError::new(Pointer::root(), code, message);
    // TP1 redirects live among xdstp:// names; a client that subscribes by a plain name (or
    // by wildcard) decodes what it gets as the resource, and would refuse the whole update.
    if !vxds_core::xdstp::is_xdstp(name) {
        return Err(fail(
            "redirect_of_opaque_name",
            format!("only xdstp:// resources can be redirected; `{name}` is a plain name"),
        ));
    }
    let url = XdstpUrl::parse(target).map_err(|e| {
        fail(
            "invalid_redirect",
            format!("`{target}` is not an xdstp:// URL: {e}"),
        )
    })?;
    if url.is_glob() {
        return Err(fail(
            "invalid_redirect",
            "a redirect points to one resource or list collection, not a glob".into(),
        ));
    }
    if url.resource_type() != resource_message {
        return Err(fail(
            "redirect_type_mismatch",
            format!(
                "the redirect points to a `{}`; this resource is a `{resource_message}`",
                url.resource_type()
            ),
        ));
    }
    let urn = url
        .without_directives()
        .into_urn()
        .map_err(|e| fail("invalid_redirect", e.to_string()))?;
    if urn.to_string() == name {
        return Err(fail(
            "redirect_cycle",
            "the resource redirects to itself".into(),
        ));
    }
    Ok(urn)
}

/// A redirect edge the one-hop rule found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedirectProblem {
    /// The resource (type URL, name) whose write is refused.
    pub source: (String, String),
    pub code: &'static str,
    pub message: String,
}

/// The one-hop rule over every redirect after a changeset (`(type URL, name)` → targets):
/// no redirect may point to a resource that redirects itself, which also rules out cycles.
/// Only edges touching `changed` are reported, at the changed resource.
pub fn check_redirect_graph(
    edges: &BTreeMap<(String, String), BTreeSet<String>>,
    changed: &BTreeSet<(String, String)>,
) -> Vec<RedirectProblem> {
    let mut problems = Vec::new();
    for ((type_url, name), targets) in edges {
        for target in targets {
            let target_key = (type_url.clone(), target.clone());
            let Some(next) = edges.get(&target_key) else {
                continue;
            };
            let source = (type_url.clone(), name.clone());
            let (at, code, message) = if next.contains(name) {
                (
                    if changed.contains(&source) {
                        source.clone()
                    } else {
                        target_key.clone()
                    },
                    "redirect_cycle",
                    format!("`{name}` and `{target}` redirect to each other"),
                )
            } else {
                (
                    if changed.contains(&source) {
                        source.clone()
                    } else {
                        target_key.clone()
                    },
                    "redirect_chain",
                    format!(
                        "`{name}` redirects to `{target}`, which redirects again (to {}); a \
                         redirect is one hop",
                        next.iter()
                            .map(|t| format!("`{t}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            };
            if changed.contains(&source) || changed.contains(&target_key) {
                problems.push(RedirectProblem {
                    source: at,
                    code,
                    message,
                });
            }
        }
    }
    problems.dedup();
    problems
}

// ---- names the server hands out ------------------------------------------------------------

/// Every `xdstp://` name in a body with a processing directive is well-formed, and each
/// `#alt=` names a resource of the same type as the URL it is the fallback for.
pub fn check_handed_out_names(message: &DynamicMessage) -> Vec<RuleError> {
    let mut errors = Vec::new();
    walk_strings(message, &Pointer::root(), &mut |at, text| {
        if !vxds_core::xdstp::is_xdstp(text) || !text.contains('#') {
            return;
        }
        match XdstpUrl::parse(text) {
            Err(e) => errors.push(RuleError::new(
                at.clone(),
                "invalid_directive",
                format!("`{text}`: {e}"),
            )),
            Ok(url) => check_alts(&url, at, &mut errors),
        }
    });
    errors
}

fn check_alts(url: &XdstpUrl, at: &Pointer, errors: &mut Vec<RuleError>) {
    for directive in url.directives() {
        if let Directive::Alt(alt) = directive {
            if alt.resource_type() != url.resource_type() {
                errors.push(RuleError::new(
                    at.clone(),
                    "alt_type_mismatch",
                    format!(
                        "`#alt=` names a `{}`, but the URL it stands in for names a `{}`",
                        alt.resource_type(),
                        url.resource_type()
                    ),
                ));
            }
            check_alts(alt, at, errors);
        }
    }
}

fn walk_strings(message: &DynamicMessage, at: &Pointer, visit: &mut impl FnMut(&Pointer, &str)) {
    // An `Any` (a filter's typed_config, say) is looked into as the message it holds.
    if message.descriptor().full_name() == "google.protobuf.Any" {
        if let Some(inner) = unpack_any(message) {
            walk_strings(&inner, at, visit);
        }
        return;
    }
    for (field, value) in message.fields() {
        walk_value(value, &at.push(field.name()), visit);
    }
}

fn unpack_any(any: &DynamicMessage) -> Option<DynamicMessage> {
    let any: prost_types::Any = any.transcode_to().ok()?;
    let name = any.type_url.rsplit('/').next()?;
    let descriptor = descriptors::message(name)?;
    DynamicMessage::decode(descriptor, any.value.as_slice()).ok()
}

fn walk_value(value: &ReflectValue, at: &Pointer, visit: &mut impl FnMut(&Pointer, &str)) {
    match value {
        ReflectValue::String(s) => visit(at, s),
        ReflectValue::Message(m) => walk_strings(m, at, visit),
        ReflectValue::List(items) => {
            for (k, item) in items.iter().enumerate() {
                walk_value(item, &at.push(k), visit);
            }
        }
        ReflectValue::Map(map) => {
            for (key, item) in map {
                let key = match key {
                    prost_reflect::MapKey::String(s) => s.clone(),
                    other => format!("{other:?}"),
                };
                walk_value(item, &at.push(&key), visit);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collection_types_are_the_api_messages_of_collection_entries() {
        assert_eq!(
            member_type("envoy.config.listener.v3.ListenerCollection"),
            Some("envoy.config.listener.v3.Listener")
        );
        assert_eq!(
            member_type("type.googleapis.com/envoy.config.cluster.v3.ClusterCollection"),
            Some("envoy.config.cluster.v3.Cluster")
        );
        assert_eq!(member_type("envoy.config.listener.v3.Listener"), None);
        assert_eq!(
            member_type("envoy.config.route.v3.RouteConfigurationCollection"),
            None
        );
    }

    #[test]
    fn a_list_collection_stands_for_its_glob() {
        let list = ListCollection::parse(
            "xdstp://a/envoy.config.listener.v3.ListenerCollection/foo?b=2&a=1#entry=bar",
        )
        .unwrap();
        assert_eq!(
            list.members.to_string(),
            "xdstp://a/envoy.config.listener.v3.Listener/foo/*?a=1&b=2"
        );
        assert_eq!(list.entry.as_deref(), Some("bar"));
        assert_eq!(
            list.urn.to_string(),
            "xdstp://a/envoy.config.listener.v3.ListenerCollection/foo?a=1&b=2"
        );
        let root =
            ListCollection::parse("xdstp://a/envoy.config.listener.v3.ListenerCollection").unwrap();
        assert_eq!(
            root.members.to_string(),
            "xdstp://a/envoy.config.listener.v3.Listener/*"
        );
        assert!(ListCollection::parse("xdstp://a/envoy.config.listener.v3.Listener/foo").is_none());
    }

    #[test]
    fn locators_round_trip() {
        for text in [
            "xdstp://a/envoy.config.listener.v3.Listener/x/y?k=v",
            "xdstp://a/envoy.config.listener.v3.Listener/x#alt=xdstp://b/envoy.config.listener.v3.Listener/z",
            "xdstp://a/envoy.config.listener.v3.ListenerCollection/c#entry=e",
        ] {
            let url = XdstpUrl::parse(text).unwrap();
            assert_eq!(
                redirect_target(&redirect_body(&url)).unwrap(),
                url.to_string()
            );
        }
    }

    #[test]
    fn redirects_stay_within_their_type_and_one_hop() {
        let l = "envoy.config.listener.v3.Listener";
        let me = "xdstp://a/envoy.config.listener.v3.Listener/me";
        assert!(check_redirect(l, me, "xdstp://a/envoy.config.listener.v3.Listener/other").is_ok());
        assert_eq!(
            check_redirect(l, me, "xdstp://a/envoy.config.cluster.v3.Cluster/x")
                .unwrap_err()
                .code,
            "redirect_type_mismatch"
        );
        assert_eq!(
            check_redirect(l, me, me).unwrap_err().code,
            "redirect_cycle"
        );
        assert_eq!(
            check_redirect(l, me, "xdstp://a/envoy.config.listener.v3.Listener/x/*")
                .unwrap_err()
                .code,
            "invalid_redirect"
        );
        assert_eq!(
            check_redirect(l, me, "nope").unwrap_err().code,
            "invalid_redirect"
        );
        assert_eq!(
            check_redirect(l, "plain", "xdstp://a/envoy.config.listener.v3.Listener/x")
                .unwrap_err()
                .code,
            "redirect_of_opaque_name"
        );

        let key = |n: &str| ("t".to_owned(), n.to_owned());
        let mut edges = BTreeMap::new();
        edges.insert(key("a"), BTreeSet::from(["b".to_owned()]));
        edges.insert(key("b"), BTreeSet::from(["c".to_owned()]));
        let problems = check_redirect_graph(&edges, &BTreeSet::from([key("a")]));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].code, "redirect_chain");
        edges.insert(key("b"), BTreeSet::from(["a".to_owned()]));
        let problems = check_redirect_graph(&edges, &BTreeSet::from([key("b")]));
        assert!(
            problems
                .iter()
                .all(|p| p.code == "redirect_cycle" && p.source == key("b"))
        );
        edges.remove(&key("b"));
        assert!(check_redirect_graph(&edges, &BTreeSet::from([key("a")])).is_empty());
    }
}
