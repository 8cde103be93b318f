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
}
