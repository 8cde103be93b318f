//! Core constraints <-> `envoy.service.discovery.v3.DynamicParameterConstraints`, in binary
//! (prost) and proto3 JSON form.
//!
//! The mapping is node for node, so it is lossless both ways: an empty message is
//! [`Constraint::Any`], an empty list stays an empty list. At the top level an absent message,
//! JSON `null` and an empty message all mean unconstrained. Decoding enforces the core
//! [`Limits`] as it goes, so a hostile message cannot overflow the stack here either.

use envoy_types::pb::envoy::service::discovery::v3::DynamicParameterConstraints as Pb;
use envoy_types::pb::envoy::service::discovery::v3::dynamic_parameter_constraints::{
    ConstraintList, SingleConstraint, Type, single_constraint,
};
use prost_reflect::{DeserializeOptions, DynamicMessage, SerializeOptions};
use vxds_core::constraints::{ConstraintError, ConstraintErrorKind};
use vxds_core::{Constraint, Constraints, Limits};

use crate::descriptors;

const MESSAGE: &str = "envoy.service.discovery.v3.DynamicParameterConstraints";

/// The protobuf message for one node.
pub fn to_proto(c: &Constraint) -> Pb {
    let list = |children: &[Constraint]| ConstraintList {
        constraints: children.iter().map(to_proto).collect(),
    };
    let r#type = match c {
        Constraint::Equals { key, value } => Some(Type::Constraint(SingleConstraint {
            key: key.clone(),
            constraint_type: Some(single_constraint::ConstraintType::Value(value.clone())),
        })),
        Constraint::Exists { key } => Some(Type::Constraint(SingleConstraint {
            key: key.clone(),
            constraint_type: Some(single_constraint::ConstraintType::Exists(
                single_constraint::Exists {},
            )),
        })),
        Constraint::And(children) => Some(Type::AndConstraints(list(children))),
        Constraint::Or(children) => Some(Type::OrConstraints(list(children))),
        Constraint::Not(inner) => Some(Type::NotConstraints(Box::new(to_proto(inner)))),
        Constraint::Any => None,
    };
    Pb { r#type }
}

/// A variant's constraints as the optional field `ResourceName.dynamic_parameter_constraints`.
pub fn constraints_to_proto(c: &Constraints) -> Option<Pb> {
    c.root().map(to_proto)
}

/// The node for a protobuf message, checked against `limits`. Errors carry a JSON pointer
/// (protobuf field names) from the message root.
pub fn from_proto(p: &Pb, limits: &Limits) -> Result<Constraint, ConstraintError> {
    let mut decoder = Decoder {
        limits,
        nodes: 0,
        path: String::new(),
    };
    let c = decoder.decode(p, 1)?;
    c.validate(limits)?;
    Ok(c)
}

/// A variant's constraints from the optional protobuf field.
pub fn constraints_from_proto(
    p: Option<&Pb>,
    limits: &Limits,
) -> Result<Constraints, ConstraintError> {
    match p {
        None => Ok(Constraints::unconstrained()),
        Some(p) => Constraints::from_root(Some(from_proto(p, limits)?), limits),
    }
}

struct Decoder<'a> {
    limits: &'a Limits,
    nodes: usize,
    path: String,
}

impl Decoder<'_> {
    fn fail(&self, kind: ConstraintErrorKind) -> ConstraintError {
        ConstraintError::new(&self.path, kind)
    }

    fn decode(&mut self, p: &Pb, depth: usize) -> Result<Constraint, ConstraintError> {
        if depth > self.limits.max_depth {
            return Err(self.fail(ConstraintErrorKind::TooDeep {
                limit: self.limits.max_depth,
            }));
        }
        self.nodes += 1;
        if self.nodes > self.limits.max_nodes {
            return Err(self.fail(ConstraintErrorKind::TooManyNodes {
                limit: self.limits.max_nodes,
            }));
        }
        let len = self.path.len();
        let c = match &p.r#type {
            None => Constraint::Any,
            Some(Type::Constraint(single)) => match &single.constraint_type {
                Some(single_constraint::ConstraintType::Value(value)) => Constraint::Equals {
                    key: single.key.clone(),
                    value: value.clone(),
                },
                Some(single_constraint::ConstraintType::Exists(_)) => Constraint::Exists {
                    key: single.key.clone(),
                },
                None => {
                    self.path.push_str("/constraint");
                    return Err(self.fail(ConstraintErrorKind::MissingConstraintType));
                }
            },
            Some(Type::AndConstraints(list)) => {
                Constraint::And(self.decode_list(list, "/and_constraints/constraints/", depth)?)
            }
            Some(Type::OrConstraints(list)) => {
                Constraint::Or(self.decode_list(list, "/or_constraints/constraints/", depth)?)
            }
            Some(Type::NotConstraints(inner)) => {
                self.path.push_str("/not_constraints");
                Constraint::not(self.decode(inner, depth + 1)?)
            }
        };
        self.path.truncate(len);
        Ok(c)
    }

    fn decode_list(
        &mut self,
        list: &ConstraintList,
        field: &str,
        depth: usize,
    ) -> Result<Vec<Constraint>, ConstraintError> {
        let len = self.path.len();
        let mut children = Vec::with_capacity(list.constraints.len().min(self.limits.max_nodes));
        for (i, child) in list.constraints.iter().enumerate() {
            self.path.truncate(len);
            self.path.push_str(field);
            self.path.push_str(&i.to_string());
            children.push(self.decode(child, depth + 1)?);
        }
        self.path.truncate(len);
        Ok(children)
    }
}

/// Constraints in proto3 JSON could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintsJsonError {
    /// Not a `DynamicParameterConstraints` message (unknown field, wrong type, ...).
    #[error("not a DynamicParameterConstraints message: {0}")]
    Json(String),
    #[error(transparent)]
    Invalid(#[from] ConstraintError),
}

impl ConstraintsJsonError {
    pub fn code(&self) -> &'static str {
        match self {
            ConstraintsJsonError::Json(_) => "invalid_constraints",
            ConstraintsJsonError::Invalid(e) => e.code(),
        }
    }
}

/// Constraints from their proto3 JSON form (either field-name spelling); `null` and `{}` are
/// unconstrained.
pub fn constraints_from_json(
    json: &serde_json::Value,
    limits: &Limits,
) -> Result<Constraints, ConstraintsJsonError> {
    if json.is_null() {
        return Ok(Constraints::unconstrained());
    }
    let descriptor =
        descriptors::message(MESSAGE).expect("DynamicParameterConstraints is in the pool");
    let message = DynamicMessage::deserialize_with_options(
        descriptor,
        json,
        &DeserializeOptions::new().deny_unknown_fields(true),
    )
    .map_err(|e| ConstraintsJsonError::Json(e.to_string()))?;
    let p: Pb = message
        .transcode_to()
        .map_err(|e| ConstraintsJsonError::Json(e.to_string()))?;
    Ok(constraints_from_proto(Some(&p), limits)?)
}

/// Proto3 JSON of one node, with protobuf field names as Envoy's own config dumps use.
pub fn constraint_to_json(c: &Constraint) -> serde_json::Value {
    let descriptor =
        descriptors::message(MESSAGE).expect("DynamicParameterConstraints is in the pool");
    let mut message = DynamicMessage::new(descriptor);
    message
        .transcode_from(&to_proto(c))
        .expect("the generated type matches its descriptor");
    message
        .serialize_with_options(
            serde_json::value::Serializer,
            &SerializeOptions::new().use_proto_field_name(true),
        )
        .expect("a message always serializes to JSON")
}

/// Proto3 JSON of a variant's constraints; `null` when unconstrained.
pub fn constraints_to_json(c: &Constraints) -> serde_json::Value {
    c.root().map_or(serde_json::Value::Null, constraint_to_json)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;
    use serde_json::json;

    fn text(t: &str) -> Constraints {
        Constraints::parse(t, &Limits::DEFAULT).unwrap()
    }

    #[test]
    fn reads_tp2_json_in_either_spelling() {
        let expected = text(r#"env = "prod" && !exists(version)"#);
        let snake = json!({"and_constraints": {"constraints": [
            {"constraint": {"key": "env", "value": "prod"}},
            {"not_constraints": {"constraint": {"key": "version", "exists": {}}}}
        ]}});
        let camel = json!({"andConstraints": {"constraints": [
            {"constraint": {"key": "env", "value": "prod"}},
            {"notConstraints": {"constraint": {"key": "version", "exists": {}}}}
        ]}});
        assert_eq!(
            constraints_from_json(&snake, &Limits::DEFAULT).unwrap(),
            expected
        );
        assert_eq!(
            constraints_from_json(&camel, &Limits::DEFAULT).unwrap(),
            expected
        );
        assert_eq!(constraints_to_json(&expected), snake);
    }

    #[test]
    fn null_and_empty_are_unconstrained() {
        assert!(
            constraints_from_json(&json!(null), &Limits::DEFAULT)
                .unwrap()
                .is_unconstrained()
        );
        assert!(
            constraints_from_json(&json!({}), &Limits::DEFAULT)
                .unwrap()
                .is_unconstrained()
        );
        assert_eq!(
            constraints_to_json(&Constraints::unconstrained()),
            json!(null)
        );
        assert_eq!(constraints_to_proto(&Constraints::unconstrained()), None);
    }

    #[test]
    fn bad_json_names_the_problem() {
        let e = constraints_from_json(
            &json!({"constraint": {"key": "env", "valu": "x"}}),
            &Limits::DEFAULT,
        )
        .unwrap_err();
        assert_eq!(e.code(), "invalid_constraints");
        assert!(e.to_string().contains("valu"), "{e}");

        let e = constraints_from_json(
            &json!({"or_constraints": {"constraints": [{"constraint": {"key": "env"}}]}}),
            &Limits::DEFAULT,
        )
        .unwrap_err();
        assert_eq!(e.code(), "missing_constraint_type");
        assert_eq!(
            e.to_string(),
            "/or_constraints/constraints/0/constraint: a single constraint needs either `value` or `exists`"
        );

        let e = constraints_from_json(
            &json!({"constraint": {"key": "", "value": "x"}}),
            &Limits::DEFAULT,
        )
        .unwrap_err();
        assert_eq!(e.code(), "empty_key");
        assert!(e.to_string().starts_with("/constraint/key"));

        let e = constraints_from_json(&json!("env = prod"), &Limits::DEFAULT).unwrap_err();
        assert_eq!(e.code(), "invalid_constraints");
    }

    #[test]
    fn deep_messages_stop_at_the_depth_limit() {
        let mut p = to_proto(&Constraint::exists("k"));
        for _ in 0..90 {
            p = Pb {
                r#type: Some(Type::NotConstraints(Box::new(p))),
            };
        }
        // Through the wire, as a client would send it.
        let decoded = Pb::decode(p.encode_to_vec().as_slice()).unwrap();
        let e = from_proto(&decoded, &Limits::DEFAULT).unwrap_err();
        assert_eq!(e.code(), "constraints_too_deep");
    }

    fn constraint() -> impl Strategy<Value = Constraint> {
        let key = "[a-z]{1,3}";
        let leaf = prop_oneof![
            (key, "[a-z0-9 ]{0,3}").prop_map(|(k, v)| Constraint::equals(k, v)),
            key.prop_map(Constraint::exists),
            Just(Constraint::Any),
        ];
        leaf.prop_recursive(4, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Constraint::And),
                prop::collection::vec(inner.clone(), 0..4).prop_map(Constraint::Or),
                inner.prop_map(Constraint::not),
            ]
        })
    }

    proptest! {
        #[test]
        fn proto_and_json_round_trip_losslessly(c in constraint()) {
            let p = to_proto(&c);
            prop_assert_eq!(&from_proto(&p, &Limits::DEFAULT).unwrap(), &c);
            // Binary and back, through prost.
            let wire = Pb::decode(p.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(&wire, &p);
            // JSON and back, through the descriptor pool.
            let json = constraint_to_json(&c);
            let back = constraints_from_json(&json, &Limits::DEFAULT).unwrap();
            match back.root() {
                Some(root) => prop_assert_eq!(root, &c),
                None => prop_assert_eq!(&c, &Constraint::Any),
            }
        }
    }
}
