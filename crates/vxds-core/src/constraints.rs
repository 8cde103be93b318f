//! Dynamic parameter constraints (xRFC TP2): the model, its hard limits and its evaluation.
//!
//! [`Constraint`] mirrors `envoy.service.discovery.v3.DynamicParameterConstraints` node for node,
//! so the conversion to and from the protobuf message (in `vxds-envoy`) is lossless. A variant's
//! constraints are a [`Constraints`]: unconstrained, or one validated expression. Their
//! [`canonical`] form is the variant's identity; [`text`] is the compact syntax operators write.
//!
//! Semantics, including the corners TP2 leaves open:
//! - `key = value` matches when the parameter is present with exactly that value;
//! - `exists(key)` matches any value, but not absence;
//! - AND of no children matches everything, OR of no children matches nothing;
//! - a message with no constraint set ([`Constraint::Any`]) matches everything;
//! - keys the constraints do not mention never prevent a match.

mod canonical;
mod text;

use std::collections::BTreeSet;
use std::fmt;

pub use canonical::{CanonicalConstraints, ConstraintsId};
pub use text::ParseError;

use crate::params::Params;

/// One node of a constraint expression.
///
/// The derived order is what the canonical form sorts children by, so it is part of the variant
/// identity: do not reorder the variants of this enum.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Constraint {
    /// `key = "value"`: the parameter is present with exactly this value.
    Equals { key: String, value: String },
    /// `exists(key)`: the parameter is present, with any value.
    Exists { key: String },
    /// Every child matches. With no children it matches everything.
    And(Vec<Constraint>),
    /// At least one child matches. With no children it matches nothing.
    Or(Vec<Constraint>),
    /// The child does not match.
    Not(Box<Constraint>),
    /// A constraints message with no constraint set: matches everything.
    Any,
}

impl Constraint {
    pub fn equals(key: impl Into<String>, value: impl Into<String>) -> Self {
        Constraint::Equals {
            key: key.into(),
            value: value.into(),
        }
    }

    pub fn exists(key: impl Into<String>) -> Self {
        Constraint::Exists { key: key.into() }
    }

    #[allow(clippy::should_implement_trait)] // `!` on an owned tree would hide the allocation
    pub fn not(inner: Constraint) -> Self {
        Constraint::Not(Box::new(inner))
    }

    /// Whether a client with these parameters matches.
    pub fn matches<P: Params + ?Sized>(&self, params: &P) -> bool {
        match self {
            Constraint::Equals { key, value } => params.get(key) == Some(value.as_str()),
            Constraint::Exists { key } => params.get(key).is_some(),
            Constraint::And(children) => children.iter().all(|c| c.matches(params)),
            Constraint::Or(children) => children.iter().any(|c| c.matches(params)),
            Constraint::Not(inner) => !inner.matches(params),
            Constraint::Any => true,
        }
    }

    /// Every key this expression mentions.
    pub fn keys(&self) -> BTreeSet<&str> {
        let mut keys = BTreeSet::new();
        self.collect_keys(&mut keys);
        keys
    }

    fn collect_keys<'a>(&'a self, keys: &mut BTreeSet<&'a str>) {
        match self {
            Constraint::Equals { key, .. } | Constraint::Exists { key } => {
                keys.insert(key.as_str());
            }
            Constraint::And(children) | Constraint::Or(children) => {
                children.iter().for_each(|c| c.collect_keys(keys))
            }
            Constraint::Not(inner) => inner.collect_keys(keys),
            Constraint::Any => {}
        }
    }

    /// Number of nodes in the expression.
    pub fn node_count(&self) -> usize {
        match self {
            Constraint::And(children) | Constraint::Or(children) => {
                1 + children.iter().map(Constraint::node_count).sum::<usize>()
            }
            Constraint::Not(inner) => 1 + inner.node_count(),
            _ => 1,
        }
    }

    /// Checks the hard limits; the error carries a JSON pointer (protobuf field names) to the
    /// offending node. Recursion stops at the depth limit, so hostile trees cannot overflow the
    /// stack here.
    pub fn validate(&self, limits: &Limits) -> Result<(), ConstraintError> {
        let mut nodes = 0;
        let mut path = String::new();
        self.validate_at(limits, 1, &mut nodes, &mut path)
    }

    fn validate_at(
        &self,
        limits: &Limits,
        depth: usize,
        nodes: &mut usize,
        path: &mut String,
    ) -> Result<(), ConstraintError> {
        if depth > limits.max_depth {
            return Err(ConstraintError::new(
                path,
                ConstraintErrorKind::TooDeep {
                    limit: limits.max_depth,
                },
            ));
        }
        *nodes += 1;
        if *nodes > limits.max_nodes {
            return Err(ConstraintError::new(
                path,
                ConstraintErrorKind::TooManyNodes {
                    limit: limits.max_nodes,
                },
            ));
        }
        let len = path.len();
        match self {
            Constraint::Equals { key, value } => {
                path.push_str("/constraint");
                check_key(key, limits, path)?;
                check_value(value, limits, path)?;
            }
            Constraint::Exists { key } => {
                path.push_str("/constraint");
                check_key(key, limits, path)?;
            }
            Constraint::And(children) | Constraint::Or(children) => {
                path.push_str(if matches!(self, Constraint::And(_)) {
                    "/and_constraints/constraints/"
                } else {
                    "/or_constraints/constraints/"
                });
                let prefix = path.len();
                for (i, child) in children.iter().enumerate() {
                    path.truncate(prefix);
                    path.push_str(&i.to_string());
                    child.validate_at(limits, depth + 1, nodes, path)?;
                }
            }
            Constraint::Not(inner) => {
                path.push_str("/not_constraints");
                inner.validate_at(limits, depth + 1, nodes, path)?;
            }
            Constraint::Any => {}
        }
        path.truncate(len);
        Ok(())
    }
}

fn check_key(key: &str, limits: &Limits, path: &str) -> Result<(), ConstraintError> {
    let at = |kind| Err(ConstraintError::new(&format!("{path}/key"), kind));
    if key.is_empty() {
        return at(ConstraintErrorKind::EmptyKey);
    }
    if key.len() > limits.max_key_len {
        return at(ConstraintErrorKind::KeyTooLong {
            len: key.len(),
            limit: limits.max_key_len,
        });
    }
    if let Some(c) = key.chars().find(|c| c.is_control()) {
        return at(ConstraintErrorKind::ControlCharacter {
            what: "key",
            code: c as u32,
        });
    }
    Ok(())
}

fn check_value(value: &str, limits: &Limits, path: &str) -> Result<(), ConstraintError> {
    let at = |kind| Err(ConstraintError::new(&format!("{path}/value"), kind));
    if value.len() > limits.max_value_len {
        return at(ConstraintErrorKind::ValueTooLong {
            len: value.len(),
            limit: limits.max_value_len,
        });
    }
    if let Some(c) = value.chars().find(|c| c.is_control()) {
        return at(ConstraintErrorKind::ControlCharacter {
            what: "value",
            code: c as u32,
        });
    }
    Ok(())
}

/// Hard limits on one constraint expression, so that hostile input can neither overflow the
/// stack nor burn CPU in the exclusivity analysis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Nesting depth; the root is depth 1.
    pub max_depth: usize,
    /// Nodes in the whole expression.
    pub max_nodes: usize,
    /// Bytes in a key.
    pub max_key_len: usize,
    /// Bytes in a value.
    pub max_value_len: usize,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_depth: 32,
        max_nodes: 512,
        max_key_len: 256,
        max_value_len: 1024,
    };
}

impl Default for Limits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A constraint expression broke a rule; `path` is a JSON pointer (protobuf field names) from the
/// root of the constraints message to the offending node or field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}: {kind}", if path.is_empty() { "constraints" } else { path.as_str() })]
pub struct ConstraintError {
    pub path: String,
    pub kind: ConstraintErrorKind,
}

impl ConstraintError {
    pub fn new(path: &str, kind: ConstraintErrorKind) -> Self {
        Self {
            path: path.to_owned(),
            kind,
        }
    }

    /// A stable, machine-readable code for API error lists.
    pub fn code(&self) -> &'static str {
        self.kind.code()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintErrorKind {
    #[error("constraints nest deeper than {limit} levels")]
    TooDeep { limit: usize },
    #[error("constraints have more than {limit} nodes")]
    TooManyNodes { limit: usize },
    #[error("key must not be empty")]
    EmptyKey,
    #[error("key is {len} bytes long; the limit is {limit}")]
    KeyTooLong { len: usize, limit: usize },
    #[error("value is {len} bytes long; the limit is {limit}")]
    ValueTooLong { len: usize, limit: usize },
    #[error("{what} contains the control character U+{code:04X}")]
    ControlCharacter { what: &'static str, code: u32 },
    #[error("a single constraint needs either `value` or `exists`")]
    MissingConstraintType,
}

impl ConstraintErrorKind {
    pub fn code(&self) -> &'static str {
        match self {
            ConstraintErrorKind::TooDeep { .. } => "constraints_too_deep",
            ConstraintErrorKind::TooManyNodes { .. } => "constraints_too_large",
            ConstraintErrorKind::EmptyKey => "empty_key",
            ConstraintErrorKind::KeyTooLong { .. } => "key_too_long",
            ConstraintErrorKind::ValueTooLong { .. } => "value_too_long",
            ConstraintErrorKind::ControlCharacter { .. } => "control_character",
            ConstraintErrorKind::MissingConstraintType => "missing_constraint_type",
        }
    }
}

/// The constraints of one variant: unconstrained, or one validated expression.
///
/// A top-level empty message ([`Constraint::Any`]) is stored as unconstrained: both mean "every
/// client matches", and the protobuf field is then left unset.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Constraints {
    root: Option<Constraint>,
}

impl Constraints {
    /// No constraints: every client matches.
    pub fn unconstrained() -> Self {
        Self { root: None }
    }

    /// Validates `root` against `limits`.
    pub fn new(root: Constraint, limits: &Limits) -> Result<Self, ConstraintError> {
        Self::from_root(Some(root), limits)
    }

    pub fn from_root(root: Option<Constraint>, limits: &Limits) -> Result<Self, ConstraintError> {
        match root {
            None | Some(Constraint::Any) => Ok(Self::unconstrained()),
            Some(root) => {
                root.validate(limits)?;
                Ok(Self { root: Some(root) })
            }
        }
    }

    /// Parses the compact text syntax (see [`text`]).
    pub fn parse(input: &str, limits: &Limits) -> Result<Self, ParseError> {
        text::parse(input, limits)
    }

    pub fn root(&self) -> Option<&Constraint> {
        self.root.as_ref()
    }

    pub fn into_root(self) -> Option<Constraint> {
        self.root
    }

    pub fn is_unconstrained(&self) -> bool {
        self.root.is_none()
    }

    pub fn matches<P: Params + ?Sized>(&self, params: &P) -> bool {
        self.root.as_ref().is_none_or(|root| root.matches(params))
    }

    pub fn keys(&self) -> BTreeSet<&str> {
        self.root.as_ref().map(Constraint::keys).unwrap_or_default()
    }

    /// The canonical form: the variant's identity.
    pub fn canonical(&self) -> CanonicalConstraints {
        CanonicalConstraints::of(self)
    }
}

/// The compact text syntax; `*` when unconstrained. Parses back to an equal value.
impl fmt::Display for Constraints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.root {
            None => f.write_str("*"),
            Some(root) => fmt::Display::fmt(root, f),
        }
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        text::write(self, f)
    }
}

impl std::str::FromStr for Constraints {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s, &Limits::DEFAULT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::ParamSet;

    fn params(pairs: &[(&str, &str)]) -> ParamSet {
        pairs.iter().copied().collect()
    }

    #[test]
    fn unmentioned_keys_never_prevent_a_match() {
        let c = Constraint::equals("env", "prod");
        assert!(c.matches(&params(&[
            ("env", "prod"),
            ("version", "v9"),
            ("zone", "a")
        ])));
        assert!(!c.matches(&params(&[("env", "test"), ("version", "v9")])));
    }

    #[test]
    fn exists_matches_any_value_but_not_absence() {
        let c = Constraint::exists("version");
        assert!(c.matches(&params(&[("version", "")])));
        assert!(c.matches(&params(&[("version", "v1")])));
        assert!(!c.matches(&params(&[("env", "prod")])));
        assert!(Constraint::not(c).matches(&params(&[])));
    }

    #[test]
    fn empty_and_matches_everything_empty_or_matches_nothing() {
        assert!(Constraint::And(vec![]).matches(&params(&[])));
        assert!(!Constraint::Or(vec![]).matches(&params(&[("env", "prod")])));
        assert!(Constraint::Any.matches(&params(&[])));
        assert!(Constraints::unconstrained().matches(&params(&[("x", "y")])));
    }

    #[test]
    fn top_level_empty_message_is_unconstrained() {
        let c = Constraints::new(Constraint::Any, &Limits::DEFAULT).unwrap();
        assert!(c.is_unconstrained());
    }

    #[test]
    fn limits_name_the_offending_field() {
        let deep = (0..40).fold(Constraint::exists("k"), |c, _| Constraint::not(c));
        let err = deep.validate(&Limits::DEFAULT).unwrap_err();
        assert_eq!(err.kind, ConstraintErrorKind::TooDeep { limit: 32 });
        assert!(err.path.starts_with("/not_constraints/not_constraints"));

        let c = Constraint::And(vec![Constraint::exists("a"), Constraint::equals("", "x")]);
        let err = c.validate(&Limits::DEFAULT).unwrap_err();
        assert_eq!(err.path, "/and_constraints/constraints/1/constraint/key");
        assert_eq!(err.kind, ConstraintErrorKind::EmptyKey);
        assert_eq!(
            err.to_string(),
            "/and_constraints/constraints/1/constraint/key: key must not be empty"
        );

        let long = Constraint::equals("k", "v".repeat(2000));
        let err = long.validate(&Limits::DEFAULT).unwrap_err();
        assert_eq!(err.path, "/constraint/value");
        assert_eq!(err.code(), "value_too_long");

        let wide = Constraint::Or(
            (0..600)
                .map(|i| Constraint::equals("k", i.to_string()))
                .collect(),
        );
        assert_eq!(
            wide.validate(&Limits::DEFAULT).unwrap_err().code(),
            "constraints_too_large"
        );

        let ctl = Constraint::equals("k", "a\u{0}b");
        assert_eq!(
            ctl.validate(&Limits::DEFAULT).unwrap_err().code(),
            "control_character"
        );
    }

    #[test]
    fn very_deep_trees_fail_fast_without_overflowing() {
        // Deeper than any stack could hold if validation recursed to the bottom.
        let mut deep = Constraint::exists("k");
        for _ in 0..200_000 {
            deep = Constraint::And(vec![deep]);
        }
        assert_eq!(
            deep.validate(&Limits::DEFAULT).unwrap_err().code(),
            "constraints_too_deep"
        );
        // Dropping a 200k-deep Box chain recursively would overflow; unwind it by hand.
        let mut node = deep;
        while let Constraint::And(mut children) = node {
            node = children.pop().unwrap_or(Constraint::Any);
        }
    }
}
