//! What the fuzz targets share: JSON pointers (RFC 6901) checked against the documents they
//! point into, and the parameter sets that compare two constraint expressions' meanings.
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use vxds_core::ParamSet;

/// Whether `pointer` is an RFC 6901 JSON pointer: empty, or `/`-separated segments in which
/// every `~` is followed by `0` or `1`.
pub fn is_json_pointer(pointer: &str) -> bool {
    if pointer.is_empty() {
        return true;
    }
    let Some(rest) = pointer.strip_prefix('/') else {
        return false;
    };
    rest.split('/').all(|segment| {
        let mut chars = segment.chars();
        while let Some(c) = chars.next() {
            if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
                return false;
            }
        }
        true
    })
}

/// The segments of a pointer, unescaped (`~1` is `/`, `~0` is `~`).
pub fn segments(pointer: &str) -> Vec<String> {
    if pointer.is_empty() {
        return Vec::new();
    }
    pointer
        .trim_start_matches('/')
        .split('/')
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect()
}

/// How many of `pointer`'s leading segments name a value that exists in `doc`.
pub fn resolved_depth(doc: &Value, pointer: &str) -> usize {
    let mut node = doc;
    let mut depth = 0;
    for segment in segments(pointer) {
        let next = match node {
            Value::Object(map) => map.get(&segment),
            Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(next) => {
                node = next;
                depth += 1;
            }
            None => break,
        }
    }
    depth
}

/// Whether `pointer` starts with the segments `prefix`.
pub fn starts_with(pointer: &str, prefix: &[&str]) -> bool {
    let segments = segments(pointer);
    segments.len() >= prefix.len() && segments.iter().zip(prefix).all(|(s, p)| s == p)
}

/// Parameter sets that tell two expressions over `values` (key → the values the expression
/// names) apart if anything can: every key absent, at one of its named values, or at a value
/// it does not name. At most `cap` sets, walked in a fixed order.
pub fn parameter_sets(values: &BTreeMap<String, BTreeSet<String>>, cap: usize) -> Vec<ParamSet> {
    // Per key: absent (None), each named value, and one more value that none of them is.
    let choices: Vec<(&String, Vec<Option<String>>)> = values
        .iter()
        .map(|(key, named)| {
            let mut other = String::from("~other");
            while named.contains(&other) {
                other.push('~');
            }
            let mut options: Vec<Option<String>> = vec![None, Some(other)];
            options.extend(named.iter().cloned().map(Some));
            (key, options)
        })
        .collect();
    let mut sets = Vec::new();
    let mut counter = vec![0usize; choices.len()];
    loop {
        let mut set = ParamSet::new();
        for ((key, options), &at) in choices.iter().zip(&counter) {
            if let Some(value) = &options[at] {
                set.insert(key.as_str(), value.as_str());
            }
        }
        sets.push(set);
        if sets.len() >= cap {
            return sets;
        }
        // The next combination, as a mixed-radix counter; done when it wraps.
        let mut digit = 0;
        loop {
            let Some((_, options)) = choices.get(digit) else {
                return sets;
            };
            counter[digit] += 1;
            if counter[digit] < options.len() {
                break;
            }
            counter[digit] = 0;
            digit += 1;
        }
    }
}

/// Every key `c` mentions, with the values it compares the key with.
pub fn named_values(c: &vxds_core::Constraint) -> BTreeMap<String, BTreeSet<String>> {
    use vxds_core::Constraint;
    fn walk(c: &Constraint, out: &mut BTreeMap<String, BTreeSet<String>>) {
        match c {
            Constraint::Equals { key, value } => {
                out.entry(key.clone()).or_default().insert(value.clone());
            }
            Constraint::Exists { key } => {
                out.entry(key.clone()).or_default();
            }
            Constraint::And(children) | Constraint::Or(children) => {
                children.iter().for_each(|child| walk(child, out))
            }
            Constraint::Not(inner) => walk(inner, out),
            Constraint::Any => {}
        }
    }
    let mut out = BTreeMap::new();
    walk(c, &mut out);
    out
}
