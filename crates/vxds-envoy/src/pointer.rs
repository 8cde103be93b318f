//! JSON pointers (RFC 6901) into request documents, so that every error names its field.

use std::fmt;

/// `""` is the whole document; `/operations/2/variants/1/constraints` a field in it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Pointer(String);

impl Pointer {
    pub fn root() -> Self {
        Self(String::new())
    }

    /// This pointer with one more segment, escaped (`~` → `~0`, `/` → `~1`).
    pub fn push(&self, segment: impl fmt::Display) -> Self {
        let segment = segment.to_string().replace('~', "~0").replace('/', "~1");
        Self(format!("{}/{segment}", self.0))
    }

    /// `other`, taken relative to this pointer.
    pub fn join(&self, other: &Pointer) -> Self {
        Self(format!("{}{}", self.0, other.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Parses an already-escaped pointer (`""` or starting with `/`).
    pub fn parse(s: &str) -> Option<Self> {
        (s.is_empty() || s.starts_with('/')).then(|| Self(s.to_owned()))
    }
}

impl Pointer {
    /// This pointer (protobuf field names, as the rules write them) as `doc` spells its fields:
    /// proto3 JSON takes `lbPolicy` as well as `lb_policy`, and a pointer must name the key
    /// the request holds. Segments past what `doc` holds are kept as they are.
    pub fn spelled_as_in(&self, doc: &serde_json::Value) -> Self {
        use serde_json::Value;
        if self.0.is_empty() {
            return self.clone();
        }
        let mut node = Some(doc);
        let mut spelled = Pointer::root();
        for segment in self.0[1..].split('/') {
            let field = segment.replace("~1", "/").replace("~0", "~");
            let (key, next) = match node {
                Some(Value::Object(map)) if !map.contains_key(&field) => {
                    let json_name = json_name(&field);
                    match map.get(&json_name) {
                        Some(next) => (json_name, Some(next)),
                        None => (field, None),
                    }
                }
                Some(Value::Object(map)) => {
                    let next = map.get(&field);
                    (field, next)
                }
                Some(Value::Array(items)) => {
                    let next = field.parse::<usize>().ok().and_then(|i| items.get(i));
                    (field, next)
                }
                _ => (field, None),
            };
            spelled = spelled.push(key);
            node = next;
        }
        spelled
    }
}

/// A protobuf field's proto3 JSON name: `lb_policy` is `lbPolicy` (protoc's rule).
fn json_name(field: &str) -> String {
    let mut name = String::with_capacity(field.len());
    let mut upper = false;
    for c in field.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                name.extend(c.to_uppercase());
                upper = false;
            }
            c => name.push(c),
        }
    }
    name
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl serde::Serialize for Pointer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Where `serde_path_to_error` stopped, as a pointer.
pub fn pointer_from_serde_path(path: &serde_path_to_error::Path) -> Pointer {
    use serde_path_to_error::Segment;
    path.iter()
        .fold(Pointer::root(), |pointer, segment| match segment {
            Segment::Seq { index } => pointer.push(index),
            Segment::Map { key } => pointer.push(key),
            Segment::Enum { variant } => pointer.push(variant),
            Segment::Unknown => pointer,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_segments() {
        let p = Pointer::root().push("operations").push(2).push("a/b~c");
        assert_eq!(p.to_string(), "/operations/2/a~1b~0c");
        assert_eq!(Pointer::root().join(&p), p);
        assert_eq!(Pointer::parse("x"), None);
    }

    #[test]
    fn spelled_as_the_document_spells_its_fields() {
        // Found by the fuzz target `changeset_body`: constraints written as
        // `{"notConstraints": ...}` were refused with a pointer at `/not_constraints/...`,
        // a key the request does not hold.
        let doc = serde_json::json!({
            "notConstraints": {"constraint": {"key": "k", "value": "v"}},
            "lb_policy": "RANDOM",
            "list": [{"clusterName": "c"}],
        });
        let at = |s: &str| Pointer::parse(s).unwrap().spelled_as_in(&doc).to_string();
        assert_eq!(
            at("/not_constraints/constraint/value"),
            "/notConstraints/constraint/value"
        );
        assert_eq!(at("/lb_policy"), "/lb_policy");
        assert_eq!(at("/list/0/cluster_name"), "/list/0/clusterName");
        // What the document does not hold stays as the rule named it.
        assert_eq!(
            at("/not_constraints/missing_field/x_y"),
            "/notConstraints/missing_field/x_y"
        );
        assert_eq!(at("/list/7/cluster_name"), "/list/7/cluster_name");
        assert_eq!(at(""), "");
        let escaped = Pointer::root().push("a/b").push("c_d");
        let doc = serde_json::json!({"a/b": {"cD": 1}});
        assert_eq!(escaped.spelled_as_in(&doc).to_string(), "/a~1b/cD");
    }
}
