//! YAML bodies as JSON values, with what aliases expand to bounded by the size of the body.
//!
//! An alias (`*a`) repeats the node its anchor (`&a`) names, so a few kilobytes of YAML can
//! stand for gigabytes of values ("billion laughs"). `serde_norway` expands aliases while it
//! deserializes and bounds only how often it follows them, not what they add up to. Here every
//! value built is charged against a budget of [`BUDGET_PER_BYTE`] units per body byte: a
//! value costs one unit and a string or key one more per byte. A document without aliases
//! never needs that much, so anchors and aliases keep working for what they are meant for,
//! while a document that expands past the budget is refused before it is built.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Units of budget per byte of body: a document without aliases spends at most about 1.5
/// (`{a, b}` is three values and two bytes of keys for six bytes of body).
pub const BUDGET_PER_BYTE: usize = 2;
/// Budget every body gets on top, so tiny documents are never refused.
const BUDGET_BASE: usize = 1024;

/// Why a YAML body was refused.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// Aliases expand the document past its budget.
    #[error(
        "the YAML document expands through aliases (`*name`) to more than {budget} units (values \
         and bytes of text; {BUDGET_PER_BYTE} per byte of body){at}; write the repeated parts out or \
         send fewer aliases"
    )]
    Expansion { budget: usize, at: String },
    #[error("the body is not valid YAML: {0}")]
    Syntax(serde_norway::Error),
}

impl YamlError {
    /// A stable code for the problem document.
    pub fn code(&self) -> &'static str {
        match self {
            YamlError::Expansion { .. } => "yaml_alias_expansion",
            YamlError::Syntax(_) => "invalid_yaml",
        }
    }
}

/// One YAML document as a JSON value, built within the budget `bytes.len()` allows.
pub fn to_value(bytes: &[u8]) -> Result<Value, YamlError> {
    let budget = bytes
        .len()
        .saturating_mul(BUDGET_PER_BYTE)
        .saturating_add(BUDGET_BASE);
    let state = Budget {
        remaining: Cell::new(budget),
        exhausted: Cell::new(false),
    };
    let deserializer = serde_norway::Deserializer::from_slice(bytes);
    ValueSeed(&state).deserialize(deserializer).map_err(|e| {
        if state.exhausted.get() {
            let at = e
                .location()
                .map(|l| format!(" (at line {} column {})", l.line(), l.column()))
                .unwrap_or_default();
            YamlError::Expansion { budget, at }
        } else {
            YamlError::Syntax(e)
        }
    })
}

#[derive(Debug)]
struct Budget {
    remaining: Cell<usize>,
    exhausted: Cell<bool>,
}

impl Budget {
    fn charge<E: de::Error>(&self, units: usize) -> Result<(), E> {
        match self.remaining.get().checked_sub(units) {
            Some(left) => {
                self.remaining.set(left);
                Ok(())
            }
            None => {
                self.exhausted.set(true);
                Err(E::custom("the document expands past its budget"))
            }
        }
    }
}

#[derive(Clone, Copy)]
struct ValueSeed<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON-like value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.0.charge(1)?;
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.0.charge(1)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.0.charge(1)?;
        Ok(Value::Number(v.into()))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Value, E> {
        match (i64::try_from(v), u64::try_from(v)) {
            (Ok(v), _) => self.visit_i64(v),
            (_, Ok(v)) => self.visit_u64(v),
            _ => self.visit_f64(v as f64),
        }
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Value, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => self.visit_f64(v as f64),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        self.0.charge(1)?;
        // As serde_json does: JSON has no NaN or infinity.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.0.charge(1 + v.len())?;
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.0.charge(1 + v.len())?;
        Ok(Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.0.charge(1)?;
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        self.0.charge(1)?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        self.0.charge(1)?;
        let mut object = Map::new();
        while let Some(key) = map.next_key_seed(KeySeed(self.0))? {
            let value = map.next_value_seed(self)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A mapping key: JSON keys are strings, so a scalar key is taken as its text.
struct KeySeed<'a>(&'a Budget);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        self.0.charge(1 + v.len())?;
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        self.0.charge(1 + v.len())?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_documents_fit_their_budget() {
        let text =
            "variants:\n- constraints: null\n  resource: {'@type': x, a: [1, 2.5, true, ~]}\n";
        let value = to_value(text.as_bytes()).unwrap();
        assert_eq!(
            value,
            serde_json::json!({"variants": [{"constraints": null, "resource": {"@type": "x", "a": [1, 2.5, true, null]}}]})
        );
        // Dense documents without aliases: many tiny values and keys.
        let dense = format!("[{}]", vec!["{a, b}"; 5000].join(","));
        assert!(to_value(dense.as_bytes()).is_ok());
        let dense = format!("[{}]", vec!["0"; 50_000].join(","));
        assert!(to_value(dense.as_bytes()).is_ok());
    }

    #[test]
    fn a_few_aliases_still_work() {
        let text = "base: &b {x: 1}\nfirst: *b\nsecond: *b\n";
        let value = to_value(text.as_bytes()).unwrap();
        assert_eq!(value["second"], serde_json::json!({"x": 1}));
    }

    #[test]
    fn expansion_past_the_budget_is_refused() {
        let list = vec!["0"; 1500].join(",");
        let aliases = vec!["*a"; 1500].join(",");
        let text = format!("a: &a [{list}]\nb: [{aliases}]\n");
        let err = to_value(text.as_bytes()).unwrap_err();
        assert_eq!(err.code(), "yaml_alias_expansion");
        assert!(err.to_string().contains("line "), "{err}");
    }

    #[test]
    fn syntax_errors_are_syntax_errors() {
        let err = to_value(b"a: [").unwrap_err();
        assert_eq!(err.code(), "invalid_yaml");
    }
}
