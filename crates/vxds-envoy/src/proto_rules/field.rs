//! One field's `(validate.rules)` (a `validate.FieldRules` message, read by reflection) applied
//! to its value, with protoc-gen-validate's semantics: scalar rules apply to proto3 defaults
//! too unless `ignore_empty`; message-typed rules (durations, `Any`, wrappers) only when the
//! field is set, except `required`.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};

use prost_reflect::{
    DynamicMessage, EnumDescriptor, FieldDescriptor, Kind, MapKey, ReflectMessage, Value,
};
use regex::Regex;

use super::{Found, Path, Segment};

/// A field's rules, with what every check asks of them read once.
pub(super) struct Compiled {
    /// `message.required`.
    required: bool,
    /// `message.skip`: the message is not looked inside.
    pub(super) skip: bool,
    /// The rules of the field's kind (`uint32`, `string`, `repeated`, …), if any.
    kind: Option<(&'static str, DynamicMessage)>,
}

impl Compiled {
    pub(super) fn new(rules: DynamicMessage) -> Self {
        let message_rules = get(&rules, "message");
        let message_flag = |name: &str| match message_rules.as_deref() {
            Some(Value::Message(m)) => flag(m, name),
            _ => false,
        };
        Self {
            required: message_flag("required"),
            skip: message_flag("skip"),
            kind: type_rules(&rules),
        }
    }
}

/// Applies a field's rules to its value.
pub(super) fn check(
    field: &FieldDescriptor,
    value: &Value,
    set: bool,
    rules: &Compiled,
    at: &Path,
    found: &mut Found,
) {
    check_value(field, value, set, rules, false, at, found)
}

/// `element`: `value` is one item of a repeated field or one key or value of a map, checked
/// against `items`, `keys` or `values` rules.
fn check_value(
    field: &FieldDescriptor,
    value: &Value,
    set: bool,
    rules: &Compiled,
    element: bool,
    at: &Path,
    found: &mut Found,
) {
    let name = field.name();
    if rules.required && !set {
        found.push(
            at,
            format!("`{name}` is required (Envoy's rule: message.required)"),
        );
    }
    let Some((kind, type_rules)) = &rules.kind else {
        return;
    };
    let kind = *kind;
    let enum_type = match field.kind() {
        Kind::Enum(e) => Some(e),
        _ => None,
    };
    let rule = Rule {
        name,
        kind,
        rules: type_rules,
        enum_type: enum_type.as_ref(),
    };
    match kind {
        "repeated" => repeated(&rule, field, value, at, found),
        "map" => map(&rule, field, value, at, found),
        _ if !element && (field.is_list() || field.is_map()) => {}
        "duration" | "timestamp" | "any" if !set => {
            if flag(type_rules, "required") {
                found.push(
                    at,
                    format!("`{name}` is required (Envoy's rule: {kind}.required)"),
                );
            }
        }
        "duration" => duration(&rule, value, at, found),
        "any" => any(&rule, value, at, found),
        "timestamp" => {} // the Envoy API sets no timestamp bounds
        _ => match value {
            // A wrapper (`google.protobuf.UInt32Value`, …) carries its type's rules; PGV
            // applies them to the wrapped value when the field is set.
            Value::Message(wrapper) if set => {
                if let Some(inner) = wrapper.get_field_by_name("value") {
                    scalar(&rule, &inner, at, found);
                }
            }
            Value::Message(_) => {}
            _ => scalar(&rule, value, at, found),
        },
    }
}

/// The rules of one kind (`uint32`, `string`, `repeated`, …) for one field.
struct Rule<'a> {
    name: &'a str,
    kind: &'static str,
    rules: &'a DynamicMessage,
    enum_type: Option<&'a EnumDescriptor>,
}

impl Rule<'_> {
    fn broken(&self, at: &Path, found: &mut Found, what: String, rule: &str) {
        found.push(
            at,
            format!(
                "`{}` {what} (Envoy's rule: {}.{rule})",
                self.name, self.kind
            ),
        );
    }
}

const KINDS: &[&str] = &[
    "float",
    "double",
    "int32",
    "int64",
    "uint32",
    "uint64",
    "sint32",
    "sint64",
    "fixed32",
    "fixed64",
    "sfixed32",
    "sfixed64",
    "bool",
    "string",
    "bytes",
    "enum",
    "repeated",
    "map",
    "any",
    "duration",
    "timestamp",
];

fn type_rules(rules: &DynamicMessage) -> Option<(&'static str, DynamicMessage)> {
    KINDS
        .iter()
        .find_map(|kind| match get(rules, kind).as_deref() {
            Some(Value::Message(m)) => Some((*kind, m.clone())),
            _ => None,
        })
}

/// A rule field's value, only when the rule sets it (validate.proto is proto2: presence is
/// what says a bound applies).
fn get<'a>(message: &'a DynamicMessage, name: &str) -> Option<Cow<'a, Value>> {
    let field = message.descriptor().get_field_by_name(name)?;
    message.has_field(&field).then(|| message.get_field(&field))
}

fn flag(message: &DynamicMessage, name: &str) -> bool {
    get(message, name)
        .and_then(|v| v.as_bool())
        .unwrap_or(false)
}

fn unsigned(message: &DynamicMessage, name: &str) -> Option<u64> {
    get(message, name).and_then(|v| v.as_u64())
}

fn repeated(rule: &Rule, field: &FieldDescriptor, value: &Value, at: &Path, found: &mut Found) {
    let Some(items) = value.as_list() else { return };
    let n = items.len() as u64;
    if n == 0 && flag(rule.rules, "ignore_empty") {
        return;
    }
    if let Some(min) = unsigned(rule.rules, "min_items")
        && n < min
    {
        rule.broken(
            at,
            found,
            format!("needs at least {min} items, has {n}"),
            "min_items",
        );
    }
    if let Some(max) = unsigned(rule.rules, "max_items")
        && n > max
    {
        rule.broken(
            at,
            found,
            format!("takes at most {max} items, has {n}"),
            "max_items",
        );
    }
    if flag(rule.rules, "unique") {
        let mut seen = HashSet::new();
        for (i, item) in items.iter().enumerate() {
            if !seen.insert(format!("{item:?}")) {
                rule.broken(
                    &at.child(Segment::Index(i)),
                    found,
                    "repeats an earlier item".into(),
                    "unique",
                );
            }
        }
    }
    if let Some(Value::Message(item_rules)) = get(rule.rules, "items").as_deref() {
        let item_rules = Compiled::new(item_rules.clone());
        for (i, item) in items.iter().enumerate() {
            let at = at.child(Segment::Index(i));
            check_value(field, item, true, &item_rules, true, &at, found);
        }
    }
}

fn map(rule: &Rule, field: &FieldDescriptor, value: &Value, at: &Path, found: &mut Found) {
    let Some(entries) = value.as_map() else {
        return;
    };
    let n = entries.len() as u64;
    if n == 0 && flag(rule.rules, "ignore_empty") {
        return;
    }
    if let Some(min) = unsigned(rule.rules, "min_pairs")
        && n < min
    {
        rule.broken(
            at,
            found,
            format!("needs at least {min} entries, has {n}"),
            "min_pairs",
        );
    }
    if let Some(max) = unsigned(rule.rules, "max_pairs")
        && n > max
    {
        rule.broken(
            at,
            found,
            format!("takes at most {max} entries, has {n}"),
            "max_pairs",
        );
    }
    let Kind::Message(entry) = field.kind() else {
        return;
    };
    let compiled = |name: &str| match get(rule.rules, name).as_deref() {
        Some(Value::Message(r)) => Some(Compiled::new(r.clone())),
        _ => None,
    };
    let (key_rules, value_rules) = (compiled("keys"), compiled("values"));
    for (key, item) in entries {
        let at = at.child(Segment::Key(key));
        if let Some(r) = &key_rules {
            let key_field = entry.map_entry_key_field();
            check_value(&key_field, &map_key_value(key), true, r, true, &at, found);
        }
        if let Some(r) = &value_rules {
            let value_field = entry.map_entry_value_field();
            check_value(&value_field, item, true, r, true, &at, found);
        }
    }
}

fn map_key_value(key: &MapKey) -> Value {
    match key {
        MapKey::Bool(b) => Value::Bool(*b),
        MapKey::I32(n) => Value::I32(*n),
        MapKey::I64(n) => Value::I64(*n),
        MapKey::U32(n) => Value::U32(*n),
        MapKey::U64(n) => Value::U64(*n),
        MapKey::String(s) => Value::String(s.clone()),
    }
}

fn any(rule: &Rule, value: &Value, at: &Path, found: &mut Found) {
    let Some(any) = value.as_message() else {
        return;
    };
    let type_url = any
        .get_field_by_name("type_url")
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    let listed = |name: &str| -> Option<Vec<String>> {
        let list = get(rule.rules, name)?;
        let items: Vec<String> = list
            .as_list()?
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        (!items.is_empty()).then_some(items)
    };
    if let Some(allowed) = listed("in")
        && !allowed.contains(&type_url)
    {
        rule.broken(
            at,
            found,
            format!("must hold one of {}", allowed.join(", ")),
            "in",
        );
    }
    if let Some(refused) = listed("not_in")
        && refused.contains(&type_url)
    {
        rule.broken(at, found, format!("must not hold `{type_url}`"), "not_in");
    }
}

/// Nanoseconds of a `google.protobuf.Duration`.
fn nanos(duration: &DynamicMessage) -> i128 {
    let seconds = duration
        .get_field_by_name("seconds")
        .and_then(|v| v.as_i64())
        .unwrap_or(0);
    let nanos = duration
        .get_field_by_name("nanos")
        .and_then(|v| v.as_i32())
        .unwrap_or(0);
    i128::from(seconds) * 1_000_000_000 + i128::from(nanos)
}

fn duration_text(nanos: i128) -> String {
    let sign = if nanos < 0 { "-" } else { "" };
    let nanos = nanos.abs();
    let (seconds, fraction) = (nanos / 1_000_000_000, nanos % 1_000_000_000);
    if fraction == 0 {
        format!("{sign}{seconds}s")
    } else {
        let fraction = format!("{fraction:09}");
        format!("{sign}{seconds}.{}s", fraction.trim_end_matches('0'))
    }
}

fn duration(rule: &Rule, value: &Value, at: &Path, found: &mut Found) {
    let Some(message) = value.as_message() else {
        return;
    };
    let value = Num::I(nanos(message));
    let bound = |name: &str| match get(rule.rules, name).as_deref() {
        Some(Value::Message(m)) => Some(Num::I(nanos(m))),
        _ => None,
    };
    let listed = |name: &str| -> Vec<Num> {
        get(rule.rules, name)
            .and_then(|list| {
                list.as_list().map(|items| {
                    items
                        .iter()
                        .filter_map(|v| v.as_message().map(|m| Num::I(nanos(m))))
                        .collect()
                })
            })
            .unwrap_or_default()
    };
    let text = |n: &Num| match n {
        Num::I(n) => duration_text(*n),
        Num::F(f) => f.to_string(),
    };
    bounds(
        rule,
        &value,
        Bounds {
            constant: bound("const"),
            lt: bound("lt"),
            lte: bound("lte"),
            gt: bound("gt"),
            gte: bound("gte"),
            within: listed("in"),
            outside: listed("not_in"),
        },
        &text,
        at,
        found,
    );
}

/// A number of any protobuf numeric type, compared exactly where integers are concerned.
#[derive(Clone, Copy, Debug)]
enum Num {
    I(i128),
    F(f64),
}

impl Num {
    fn of(value: &Value) -> Option<Num> {
        Some(match value {
            Value::I32(n) => Num::I((*n).into()),
            Value::I64(n) => Num::I((*n).into()),
            Value::U32(n) => Num::I((*n).into()),
            Value::U64(n) => Num::I((*n).into()),
            Value::EnumNumber(n) => Num::I((*n).into()),
            Value::F32(f) => Num::F((*f).into()),
            Value::F64(f) => Num::F(*f),
            _ => return None,
        })
    }

    fn cmp(&self, other: &Num) -> Option<Ordering> {
        match (self, other) {
            (Num::I(a), Num::I(b)) => Some(a.cmp(b)),
            (a, b) => a.float().partial_cmp(&b.float()),
        }
    }

    fn float(&self) -> f64 {
        match self {
            Num::I(n) => *n as f64,
            Num::F(f) => *f,
        }
    }

    fn is_zero(&self) -> bool {
        match self {
            Num::I(n) => *n == 0,
            Num::F(f) => *f == 0.0,
        }
    }
}

impl std::fmt::Display for Num {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Num::I(n) => write!(f, "{n}"),
            Num::F(x) => write!(f, "{x}"),
        }
    }
}

struct Bounds {
    constant: Option<Num>,
    lt: Option<Num>,
    lte: Option<Num>,
    gt: Option<Num>,
    gte: Option<Num>,
    within: Vec<Num>,
    outside: Vec<Num>,
}

/// PGV's numeric rules: `const`, the bounds (a lower bound above the upper one asks for a
/// value *outside* the range), `in` and `not_in`.
fn bounds(
    rule: &Rule,
    value: &Num,
    b: Bounds,
    text: &dyn Fn(&Num) -> String,
    at: &Path,
    found: &mut Found,
) {
    let is = |o: Option<Ordering>, want: &[Ordering]| o.is_some_and(|o| want.contains(&o));
    use Ordering::{Equal, Greater, Less};
    if let Some(c) = &b.constant
        && !is(value.cmp(c), &[Equal])
    {
        rule.broken(at, found, format!("must be {}", text(c)), "const");
    }
    let lower =
        b.gt.map(|g| (g, is(value.cmp(&g), &[Greater]), "greater than", "gt"))
            .or(b
                .gte
                .map(|g| (g, is(value.cmp(&g), &[Greater, Equal]), "at least", "gte")));
    let upper =
        b.lt.map(|l| (l, is(value.cmp(&l), &[Less]), "less than", "lt"))
            .or(b
                .lte
                .map(|l| (l, is(value.cmp(&l), &[Less, Equal]), "at most", "lte")));
    match (lower, upper) {
        (Some((lo, lo_ok, lo_says, lo_rule)), Some((hi, hi_ok, hi_says, hi_rule))) => {
            // PGV: a lower bound at or above the upper one asks for a value outside them.
            let exclusive = is(lo.cmp(&hi), &[Greater, Equal]);
            let ok = if exclusive {
                lo_ok || hi_ok
            } else {
                lo_ok && hi_ok
            };
            if !ok && exclusive {
                rule.broken(
                    at,
                    found,
                    format!("must be {lo_says} {} or {hi_says} {}", text(&lo), text(&hi)),
                    &format!("{lo_rule}+{hi_rule}"),
                );
            } else if !ok {
                rule.broken(
                    at,
                    found,
                    format!(
                        "must be {lo_says} {} and {hi_says} {}",
                        text(&lo),
                        text(&hi)
                    ),
                    &format!("{lo_rule}+{hi_rule}"),
                );
            }
        }
        (Some((lo, false, says, name)), None) | (None, Some((lo, false, says, name))) => {
            rule.broken(at, found, format!("must be {says} {}", text(&lo)), name);
        }
        _ => {}
    }
    if !b.within.is_empty() && !b.within.iter().any(|w| is(value.cmp(w), &[Equal])) {
        let list: Vec<_> = b.within.iter().map(text).collect();
        rule.broken(
            at,
            found,
            format!("must be one of {}", list.join(", ")),
            "in",
        );
    }
    if b.outside.iter().any(|w| is(value.cmp(w), &[Equal])) {
        rule.broken(at, found, format!("must not be {}", text(value)), "not_in");
    }
}

fn numbers(rules: &DynamicMessage, name: &str) -> Vec<Num> {
    get(rules, name)
        .and_then(|list| {
            list.as_list()
                .map(|items| items.iter().filter_map(Num::of).collect())
        })
        .unwrap_or_default()
}

fn strings(rules: &DynamicMessage, name: &str) -> Vec<String> {
    get(rules, name)
        .and_then(|list| {
            list.as_list().map(|items| {
                items
                    .iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
        })
        .unwrap_or_default()
}

fn scalar(rule: &Rule, value: &Value, at: &Path, found: &mut Found) {
    match (rule.kind, value) {
        ("string", Value::String(s)) => string(rule, s, at, found),
        ("bytes", Value::Bytes(b)) => bytes(rule, b, at, found),
        ("bool", Value::Bool(v)) => {
            if let Some(want) = get(rule.rules, "const").and_then(|c| c.as_bool())
                && *v != want
            {
                rule.broken(at, found, format!("must be {want}"), "const");
            }
        }
        ("enum", Value::EnumNumber(n)) => {
            if flag(rule.rules, "defined_only")
                && rule.enum_type.is_some_and(|e| e.get_value(*n).is_none())
            {
                rule.broken(
                    at,
                    found,
                    format!("has no value numbered {n}"),
                    "defined_only",
                );
            }
            let value = Num::I((*n).into());
            let text = |n: &Num| {
                let name = match n {
                    Num::I(i) => rule
                        .enum_type
                        .and_then(|e| e.get_value(i32::try_from(*i).ok()?))
                        .map(|v| v.name().to_owned()),
                    Num::F(_) => None,
                };
                name.unwrap_or_else(|| n.to_string())
            };
            enum_or_number(rule, &value, &text, at, found);
        }
        (_, value) => {
            if let Some(n) = Num::of(value) {
                if n.is_zero() && flag(rule.rules, "ignore_empty") {
                    return;
                }
                enum_or_number(rule, &n, &|n: &Num| n.to_string(), at, found);
            }
        }
    }
}

fn enum_or_number(
    rule: &Rule,
    value: &Num,
    text: &dyn Fn(&Num) -> String,
    at: &Path,
    found: &mut Found,
) {
    let one = |name: &str| get(rule.rules, name).and_then(|v| Num::of(&v));
    bounds(
        rule,
        value,
        Bounds {
            constant: one("const"),
            lt: one("lt"),
            lte: one("lte"),
            gt: one("gt"),
            gte: one("gte"),
            within: numbers(rule.rules, "in"),
            outside: numbers(rule.rules, "not_in"),
        },
        text,
        at,
        found,
    );
}

/// PGV's `well_known_regex` values.
const HTTP_HEADER_NAME: i32 = 1;
const HTTP_HEADER_VALUE: i32 = 2;

fn string(rule: &Rule, s: &str, at: &Path, found: &mut Found) {
    if s.is_empty() && flag(rule.rules, "ignore_empty") {
        return;
    }
    let chars = s.chars().count() as u64;
    let bytes = s.len() as u64;
    let mut broken = |what: String, name: &str| rule.broken(at, found, what, name);
    if let Some(c) = get(rule.rules, "const")
        && c.as_str() != Some(s)
    {
        broken(
            format!("must be `{}`", c.as_str().unwrap_or_default()),
            "const",
        );
    }
    type Limit = (&'static str, fn(u64, u64) -> bool, &'static str, u64);
    let limits: [Limit; 6] = [
        ("len", |n, l| n == l, "characters exactly", chars),
        ("min_len", |n, l| n >= l, "characters at least", chars),
        ("max_len", |n, l| n <= l, "characters at most", chars),
        ("len_bytes", |n, l| n == l, "bytes exactly", bytes),
        ("min_bytes", |n, l| n >= l, "bytes at least", bytes),
        ("max_bytes", |n, l| n <= l, "bytes at most", bytes),
    ];
    for (name, ok, says, n) in limits {
        if let Some(limit) = unsigned(rule.rules, name)
            && !ok(n, limit)
        {
            let (unit, how) = says.split_once(' ').unwrap_or((says, ""));
            broken(format!("must be {how} {limit} {unit} long, is {n}"), name);
        }
    }
    if let Some(pattern) = get(rule.rules, "pattern").and_then(|p| p.as_str().map(str::to_owned)) {
        // A pattern that does not compile here (RE2 and Rust's regex agree on almost all of
        // RE2) is not held against the body.
        if let Some(re) = regex(&pattern)
            && !re.is_match(s)
        {
            broken(format!("must match `{pattern}`"), "pattern");
        }
    }
    for (name, ok, says) in [
        (
            "prefix",
            (|s, p| s.starts_with(p)) as fn(&str, &str) -> bool,
            "start with",
        ),
        ("suffix", |s, p| s.ends_with(p), "end with"),
        ("contains", |s, p| s.contains(p), "contain"),
    ] {
        if let Some(part) = get(rule.rules, name).and_then(|p| p.as_str().map(str::to_owned))
            && !ok(s, &part)
        {
            broken(format!("must {says} `{part}`"), name);
        }
    }
    if let Some(part) = get(rule.rules, "not_contains").and_then(|p| p.as_str().map(str::to_owned))
        && s.contains(&part)
    {
        broken(format!("must not contain `{part}`"), "not_contains");
    }
    let within = strings(rule.rules, "in");
    if !within.is_empty() && !within.iter().any(|w| w == s) {
        broken(format!("must be one of {}", within.join(", ")), "in");
    }
    if strings(rule.rules, "not_in").iter().any(|w| w == s) {
        broken(format!("must not be `{s}`"), "not_in");
    }
    if let Some(which) = get(rule.rules, "well_known_regex").and_then(|v| v.as_enum_number()) {
        // `strict` defaults to true.
        let strict = get(rule.rules, "strict")
            .and_then(|v| v.as_bool())
            .unwrap_or(true);
        let ok = match (which, strict) {
            (HTTP_HEADER_NAME, true) => header_name(s),
            (HTTP_HEADER_VALUE, true) => s.chars().all(|c| !(c < ' ' && c != '\t') && c != '\x7f'),
            (HTTP_HEADER_NAME | HTTP_HEADER_VALUE, false) => !s.contains(['\0', '\n', '\r']),
            _ => true,
        };
        if !ok {
            let what = if which == HTTP_HEADER_NAME {
                "an HTTP header name"
            } else {
                "an HTTP header value"
            };
            broken(format!("must be {what}"), "well_known_regex");
        }
    }
    if flag(rule.rules, "ip") && s.parse::<std::net::IpAddr>().is_err() {
        broken("must be an IP address".into(), "ip");
    }
    if flag(rule.rules, "ipv4") && s.parse::<std::net::Ipv4Addr>().is_err() {
        broken("must be an IPv4 address".into(), "ipv4");
    }
    if flag(rule.rules, "ipv6") && s.parse::<std::net::Ipv6Addr>().is_err() {
        broken("must be an IPv6 address".into(), "ipv6");
    }
}

/// PGV's strict header name: `^:?[0-9a-zA-Z!#$%&'*+-.^_|~\x60]+$`.
fn header_name(s: &str) -> bool {
    let s = s.strip_prefix(':').unwrap_or(s);
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_|~`".contains(c))
}

fn bytes(rule: &Rule, b: &[u8], at: &Path, found: &mut Found) {
    if b.is_empty() && flag(rule.rules, "ignore_empty") {
        return;
    }
    let n = b.len() as u64;
    for (name, ok, says) in [
        ("len", (|n, l| n == l) as fn(u64, u64) -> bool, "exactly"),
        ("min_len", |n, l| n >= l, "at least"),
        ("max_len", |n, l| n <= l, "at most"),
    ] {
        if let Some(limit) = unsigned(rule.rules, name)
            && !ok(n, limit)
        {
            rule.broken(
                at,
                found,
                format!("must be {says} {limit} bytes long, is {n}"),
                name,
            );
        }
    }
    if let Some(Value::Bytes(prefix)) = get(rule.rules, "prefix").as_deref()
        && !b.starts_with(prefix)
    {
        rule.broken(
            at,
            found,
            "must start with the rule's prefix".into(),
            "prefix",
        );
    }
}

/// Compiled patterns, shared: the API has a handful.
fn regex(pattern: &str) -> Option<Arc<Regex>> {
    static CACHE: LazyLock<Mutex<HashMap<String, Option<Arc<Regex>>>>> =
        LazyLock::new(Default::default);
    let mut cache = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    cache
        .entry(pattern.to_owned())
        .or_insert_with(|| Regex::new(pattern).ok().map(Arc::new))
        .clone()
}
