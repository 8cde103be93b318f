//! Dynamic parameters: the key/value pairs a client subscribes with (TP2).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;

/// Read access to a client's dynamic parameters. Evaluation only ever looks keys up, so any map
/// works; a key that is not present is *absent*, which `exists` tells apart from every value.
pub trait Params {
    fn get(&self, key: &str) -> Option<&str>;
}

impl<S: BuildHasher> Params for HashMap<String, String, S> {
    fn get(&self, key: &str) -> Option<&str> {
        HashMap::get(self, key).map(String::as_str)
    }
}

impl Params for BTreeMap<String, String> {
    fn get(&self, key: &str) -> Option<&str> {
        BTreeMap::get(self, key).map(String::as_str)
    }
}

impl Params for ParamSet {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }
}

impl<P: Params + ?Sized> Params for &P {
    fn get(&self, key: &str) -> Option<&str> {
        (**self).get(key)
    }
}

/// A concrete, ordered parameter set, e.g. a witness `{env=test}` that matches two variants.
/// Ordered so that its bytes and its display are deterministic.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct ParamSet(pub BTreeMap<String, String>);

impl ParamSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.0.insert(key.into(), value.into());
        self
    }

    pub fn insert(&mut self, key: impl Into<String>, value: impl Into<String>) {
        self.0.insert(key.into(), value.into());
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for ParamSet {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(
            iter.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
}

impl From<BTreeMap<String, String>> for ParamSet {
    fn from(map: BTreeMap<String, String>) -> Self {
        Self(map)
    }
}

/// `{env=test, version=v1}`; `{}` for the empty set (every key absent).
impl fmt::Display for ParamSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={v}")?;
        }
        f.write_str("}")
    }
}
