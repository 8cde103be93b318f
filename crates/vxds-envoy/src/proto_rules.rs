//! Envoy's own proto validation rules, checked on write.
//!
//! The Envoy API annotates its fields with protoc-gen-validate (PGV) rules: a cluster's
//! `connect_timeout` must be `gt: 0s`, a `port_value` `lte: 65535`, a route needs an action.
//! Envoy checks every resource it receives against them and NACKs what breaks one, so such a
//! body, once committed, is refused by the whole fleet. The rules travel in the descriptor set
//! that `envoy-types` ships (`validate/validate.proto` and the `(validate.rules)` options on
//! every field); this module reads them from the pool by reflection and evaluates them as PGV
//! does, on the body and inside every `google.protobuf.Any` the pool can unpack (Envoy
//! validates a `typed_config` when it unpacks it), with the JSON pointer of each field.
//!
//! Why not `prost-reflect-validate`: it generates its rule types with `protoc` at build time,
//! which would make `protoc` a requirement of building vxds; it also stops at the first broken
//! rule, reports a field's full name instead of where it is, and does not look inside `Any`.
//!
//! Every rule kind the Envoy API uses is evaluated (see `docs/architecture.md`, Validation);
//! the few PGV rules it never uses (`timestamp` bounds, `email`, `uri`, …) are not.

mod field;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, RwLock};

use prost_reflect::{
    DynamicMessage, ExtensionDescriptor, FieldDescriptor, Kind, MapKey, MessageDescriptor,
    OneofDescriptor, ReflectMessage, Value,
};

use crate::descriptors;
use crate::pointer::Pointer;

const ANY: &str = "google.protobuf.Any";
const LISTENER: &str = "envoy.config.listener.v3.Listener";

/// Nesting beyond this is not followed (prost already refuses bodies nested deeper than 100;
/// this only bounds the work of `Any`s packed in `Any`s).
const MAX_DEPTH: usize = 100;

/// Problems reported per body at most; the rest are counted in the last one's message.
const MAX_PROBLEMS: usize = 20;

/// A broken protoc-gen-validate rule; `pointer` is relative to the body and names the field
/// in protobuf spelling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoRuleProblem {
    pub pointer: Pointer,
    pub code: &'static str,
    pub message: String,
    /// Inside a listener's `api_listener`: the form gRPC clients read, and they do not apply
    /// Envoy's proto rules (a gRPC `HttpConnectionManager` has no `stat_prefix`, say). Such a
    /// problem is a warning, not a refusal.
    pub grpc_only: bool,
}

/// Where a value is, built into a [`Pointer`] only when a problem is reported there (most
/// values break no rule, and a pointer per visited field would cost more than the rules).
#[derive(Clone, Copy)]
pub(super) struct Path<'a> {
    parent: Option<&'a Path<'a>>,
    segment: Segment<'a>,
}

#[derive(Clone, Copy)]
pub(super) enum Segment<'a> {
    Root,
    Name(&'a str),
    Index(usize),
    Key(&'a MapKey),
}

impl<'a> Path<'a> {
    const ROOT: Path<'static> = Path {
        parent: None,
        segment: Segment::Root,
    };

    pub(super) fn child(&'a self, segment: Segment<'a>) -> Path<'a> {
        Path {
            parent: Some(self),
            segment,
        }
    }

    pub(super) fn pointer(&self) -> Pointer {
        let mut segments = Vec::new();
        let mut node = Some(self);
        while let Some(path) = node {
            segments.push(path.segment);
            node = path.parent;
        }
        segments
            .into_iter()
            .rev()
            .fold(Pointer::root(), |pointer, segment| match segment {
                Segment::Root => pointer,
                Segment::Name(name) => pointer.push(name),
                Segment::Index(i) => pointer.push(i),
                Segment::Key(key) => pointer.push(map_key(key)),
            })
    }
}

/// Every rule that Envoy would apply to `message`, and to the messages in the `Any`s inside it,
/// that the message breaks.
pub fn check(message: &DynamicMessage) -> Vec<ProtoRuleProblem> {
    let mut found = Found::default();
    check_message(message, &Path::ROOT, 0, &mut found);
    if found.dropped > 0
        && let Some(last) = found.problems.last_mut()
    {
        last.message
            .push_str(&format!(" (and {} more broken rules)", found.dropped));
    }
    found.problems
}

#[derive(Default)]
struct Found {
    problems: Vec<ProtoRuleProblem>,
    dropped: usize,
    /// Below `Listener.api_listener`.
    in_api_listener: bool,
}

impl Found {
    pub(super) fn push(&mut self, at: &Path, message: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(ProtoRuleProblem {
                pointer: at.pointer(),
                code: "proto_rule",
                message,
                grpc_only: self.in_api_listener,
            });
        } else {
            self.dropped += 1;
        }
    }
}

fn check_message(message: &DynamicMessage, at: &Path, depth: usize, found: &mut Found) {
    if depth > MAX_DEPTH {
        return;
    }
    let descriptor = message.descriptor();
    if descriptor.full_name() == ANY {
        if let Some(inner) = unpack(message) {
            // proto3 JSON writes an `Any`'s fields inline, beside `@type`.
            check_message(&inner, at, depth + 1, found);
        }
        return;
    }
    let rules = rules_of(&descriptor);
    // TP1's containers (`xds.core.v3`: locators, collection entries) are checked by vxds's
    // own collection rules, which follow TP1 where the annotations are stricter than the
    // spec (an inline entry's name is optional); what they hold is checked here.
    let own_rules = !descriptor.package_name().starts_with("xds.");
    for oneof in rules.required_oneofs.iter().filter(|_| own_rules) {
        if !oneof.fields().any(|f| message.has_field(&f)) {
            let names: Vec<_> = oneof.fields().map(|f| format!("`{}`", f.name())).collect();
            found.push(
                at,
                format!(
                    "one of {} is required (Envoy's rule: oneof `{}` required)",
                    names.join(", "),
                    oneof.name()
                ),
            );
        }
    }
    if own_rules {
        for (field, field_rules) in &rules.ruled {
            let set = message.has_field(field);
            // PGV checks a member of a oneof, or a proto3 `optional` field, only when set.
            if !set && field.containing_oneof().is_some() {
                continue;
            }
            let value = message.get_field(field);
            field::check(
                field,
                &value,
                set,
                field_rules,
                &at.child(Segment::Name(field.name())),
                found,
            );
        }
    }
    for (field, value) in message.fields() {
        if !matches!(field.kind(), Kind::Message(_))
            || (own_rules && rules.skipped.contains(&field.number()))
        {
            continue;
        }
        let api_listener = descriptor.full_name() == LISTENER && field.name() == "api_listener";
        let outer = found.in_api_listener;
        found.in_api_listener |= api_listener;
        for_each_message(
            value,
            &at.child(Segment::Name(field.name())),
            &mut |m, at| check_message(m, at, depth + 1, found),
        );
        found.in_api_listener = outer;
    }
}

/// Calls `f` with every message in a field's value (a message, list items, map values).
fn for_each_message(value: &Value, at: &Path, f: &mut dyn FnMut(&DynamicMessage, &Path)) {
    match value {
        Value::Message(m) => f(m, at),
        Value::List(items) => {
            for (i, item) in items.iter().enumerate() {
                if let Value::Message(m) = item {
                    f(m, &at.child(Segment::Index(i)));
                }
            }
        }
        Value::Map(entries) => {
            for (key, item) in entries {
                if let Value::Message(m) = item {
                    f(m, &at.child(Segment::Key(key)));
                }
            }
        }
        _ => {}
    }
}

/// The message an `Any` holds, when its type is in the pool and its bytes decode. Anything
/// else is left to the body rules that refuse undecodable bodies.
fn unpack(any: &DynamicMessage) -> Option<DynamicMessage> {
    let any: prost_types::Any = any.transcode_to().ok()?;
    let name = any.type_url.rsplit('/').next()?;
    let descriptor = descriptors::message(name)?;
    DynamicMessage::decode(descriptor, any.value.as_slice()).ok()
}

fn map_key(key: &MapKey) -> String {
    match key {
        MapKey::Bool(b) => b.to_string(),
        MapKey::I32(n) => n.to_string(),
        MapKey::I64(n) => n.to_string(),
        MapKey::U32(n) => n.to_string(),
        MapKey::U64(n) => n.to_string(),
        MapKey::String(s) => s.clone(),
    }
}

/// A message type's rules, read from its descriptor's options once.
struct MessageRules {
    /// The fields with `(validate.rules)`, and them compiled.
    ruled: Vec<(FieldDescriptor, field::Compiled)>,
    /// Numbers of the message fields not to look inside (`message.skip`).
    skipped: Vec<u32>,
    /// Oneofs marked `(validate.required) = true`.
    required_oneofs: Vec<OneofDescriptor>,
}

struct Extensions {
    field_rules: Option<ExtensionDescriptor>,
    oneof_required: Option<ExtensionDescriptor>,
}

static EXTENSIONS: LazyLock<Extensions> = LazyLock::new(|| Extensions {
    field_rules: descriptors::pool().get_extension_by_name("validate.rules"),
    oneof_required: descriptors::pool().get_extension_by_name("validate.required"),
});

static RULES: LazyLock<RwLock<HashMap<String, Arc<MessageRules>>>> =
    LazyLock::new(Default::default);

fn rules_of(descriptor: &MessageDescriptor) -> Arc<MessageRules> {
    if let Some(rules) = RULES
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(descriptor.full_name())
    {
        return rules.clone();
    }
    let extensions = &*EXTENSIONS;
    let ruled: Vec<(FieldDescriptor, field::Compiled)> = descriptor
        .fields()
        .filter_map(|field| {
            let ext = extensions.field_rules.as_ref()?;
            let options = field.options();
            if !options.has_extension(ext) {
                return None;
            }
            match options.get_extension(ext).into_owned() {
                Value::Message(rules) => Some((field, field::Compiled::new(rules))),
                _ => None,
            }
        })
        .collect();
    let skipped = ruled
        .iter()
        .filter(|(_, rules)| rules.skip)
        .map(|(field, _)| field.number())
        .collect();
    let required_oneofs = descriptor
        .oneofs()
        .filter(|oneof| {
            extensions.oneof_required.as_ref().is_some_and(|ext| {
                let options = oneof.options();
                options.has_extension(ext) && options.get_extension(ext).as_bool() == Some(true)
            })
        })
        .collect();
    let rules = Arc::new(MessageRules {
        ruled,
        skipped,
        required_oneofs,
    });
    RULES
        .write()
        .unwrap_or_else(|e| e.into_inner())
        .insert(descriptor.full_name().to_owned(), rules.clone());
    rules
}

#[cfg(test)]
mod tests;
