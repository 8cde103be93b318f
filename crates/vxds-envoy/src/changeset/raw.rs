//! [`RawJson`]: a JSON value kept as its text. A request holds its resource bodies this way
//! rather than as `serde_json::Value` trees, which take about fifteen times the memory of the
//! text (a tree node per value, a map allocation per object); each body is parsed once, into
//! its protobuf message, when it is validated.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON value as text: as it was written in a JSON request, or compact JSON when it came from
/// YAML or a `Value`.
#[derive(Clone)]
pub struct RawJson(Box<RawValue>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// The value as a tree.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

/// Absent: JSON `null`.
impl Default for RawJson {
    fn default() -> Self {
        Self(null())
    }
}

impl RawJson {
    pub fn is_null(&self) -> bool {
        self.get().trim() == "null"
    }
}

impl From<Value> for RawJson {
    fn from(value: Value) -> Self {
        Self::from(&value)
    }
}

impl From<&Value> for RawJson {
    fn from(value: &Value) -> Self {
        // A `Value` always serializes.
        let text = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
        Self(RawValue::from_string(text).unwrap_or_else(|_| null()))
    }
}

fn null() -> Box<RawValue> {
    RawValue::from_string("null".into()).expect("null is JSON")
}

/// Equal when the values are, however they were spelt.
impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get() || self.to_value() == other.to_value()
    }
}

impl fmt::Debug for RawJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.get())
    }
}

impl Serialize for RawJson {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Box::<RawValue>::deserialize(deserializer).map(Self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keeps_text_and_compares_values() {
        let spelt: RawJson = serde_json::from_str(r#"{ "b": 1, "a": [true] }"#).unwrap();
        assert_eq!(spelt.get(), r#"{ "b": 1, "a": [true] }"#);
        assert_eq!(spelt, RawJson::from(json!({"a": [true], "b": 1})));
        assert_ne!(spelt, RawJson::from(json!({"a": [false], "b": 1})));
        // From a tree (YAML documents arrive as one) too.
        let from_tree: RawJson = serde_json::from_value(json!({"x": "y"})).unwrap();
        assert_eq!(from_tree.to_value(), json!({"x": "y"}));
        assert_eq!(serde_json::to_string(&spelt).unwrap(), spelt.get());
    }
}
