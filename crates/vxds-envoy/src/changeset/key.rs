//! What identifies a resource: [`ResourceKey`], its type URL shared ([`TypeUrl`]).
//!
//! A write of 100,000 resources holds several copies of every key at once (the changeset, the
//! commit's change list, the index's list of what changed). The type URL is the longer half of
//! a key (52 bytes for a cluster) and the same in nearly all of them: it is one shared string,
//! and a copy of a key copies its name only.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::{Arc, LazyLock};

use serde::Serialize;

use crate::resource::{ALIASES, TYPE_URL_PREFIX};

/// What identifies a resource: its type URL and its name (xdstp names in normal form).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ResourceKey {
    pub type_url: TypeUrl,
    pub name: String,
}

/// A type URL (`type.googleapis.com/envoy.config.cluster.v3.Cluster`). The types xDS serves
/// (those with an alias) are one allocation for the whole process; any other is allocated once
/// per key made from a string and shared by that key's copies. It compares, hashes and
/// serialises as the string.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TypeUrl(Arc<str>);

/// The type URLs of the types with an alias, allocated once.
static SERVED: LazyLock<Vec<Arc<str>>> = LazyLock::new(|| {
    ALIASES
        .iter()
        .map(|(_, message)| Arc::from(format!("{TYPE_URL_PREFIX}{message}")))
        .collect()
});

impl TypeUrl {
    pub fn new(type_url: &str) -> Self {
        match SERVED.iter().find(|served| ***served == *type_url) {
            Some(served) => Self(served.clone()),
            None => Self(Arc::from(type_url)),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Deref for TypeUrl {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for TypeUrl {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for TypeUrl {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for TypeUrl {
    fn from(type_url: &str) -> Self {
        Self::new(type_url)
    }
}

impl From<String> for TypeUrl {
    fn from(type_url: String) -> Self {
        Self::new(&type_url)
    }
}

impl From<&String> for TypeUrl {
    fn from(type_url: &String) -> Self {
        Self::new(type_url)
    }
}

impl From<TypeUrl> for String {
    fn from(type_url: TypeUrl) -> Self {
        type_url.0.to_string()
    }
}

impl From<TypeUrl> for Arc<str> {
    fn from(type_url: TypeUrl) -> Self {
        type_url.0
    }
}

impl PartialEq<str> for TypeUrl {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for TypeUrl {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<String> for TypeUrl {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Debug for TypeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for TypeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for TypeUrl {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_of_a_served_type_share_one_string() {
        let a = TypeUrl::new("type.googleapis.com/envoy.config.cluster.v3.Cluster");
        let b = TypeUrl::from(String::from(
            "type.googleapis.com/envoy.config.cluster.v3.Cluster",
        ));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a, b);
    }

    #[test]
    fn another_type_is_kept_as_given_and_compares_as_its_string() {
        let other = TypeUrl::new("type.googleapis.com/envoy.config.core.v3.Address");
        assert_eq!(other, "type.googleapis.com/envoy.config.core.v3.Address");
        assert_eq!(
            serde_json::to_string(&other).unwrap(),
            "\"type.googleapis.com/envoy.config.core.v3.Address\""
        );
        let mut sorted = [
            TypeUrl::new("b"),
            TypeUrl::new("type.googleapis.com/envoy.config.cluster.v3.Cluster"),
            TypeUrl::new("a"),
        ];
        sorted.sort();
        let sorted: Vec<&str> = sorted.iter().map(TypeUrl::as_str).collect();
        assert_eq!(
            sorted,
            [
                "a",
                "b",
                "type.googleapis.com/envoy.config.cluster.v3.Cluster"
            ]
        );
    }
}
