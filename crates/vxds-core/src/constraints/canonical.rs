//! The canonical form of constraints, and the stable identifier derived from it.
//!
//! Spellings that differ only in child order, AND-in-AND / OR-in-OR nesting, duplicate children,
//! double negation, single-child lists or empty messages map to one value. The identifier hashes
//! the canonical text, so it is the same on every machine, in every run and for every protobuf
//! library version.

use std::fmt;

use sha2::{Digest, Sha256};

use super::{Constraint, Constraints};
use crate::params::Params;

/// Constraints in canonical form, with their identifier. Build with [`Constraints::canonical`].
///
/// Equality and hashing are by the canonical form; the keys as written (see
/// [`written_keys`](Self::written_keys)) do not take part.
#[derive(Clone, Debug)]
pub struct CanonicalConstraints {
    constraints: Constraints,
    id: ConstraintsId,
    /// Keys the constraints were written with that constant folding removed, sorted; `None`
    /// when there are none (the usual case).
    folded_keys: Option<Box<[String]>>,
}

impl PartialEq for CanonicalConstraints {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.constraints == other.constraints
    }
}

impl Eq for CanonicalConstraints {}

impl std::hash::Hash for CanonicalConstraints {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.constraints.hash(state);
        self.id.hash(state);
    }
}

impl CanonicalConstraints {
    pub(super) fn of(written: &Constraints) -> Self {
        let root = written
            .root()
            .map(canonicalize)
            .and_then(|root| match root {
                // A tautology is the same variant as no constraints at all.
                Constraint::And(ref children) if children.is_empty() => None,
                root => Some(root),
            });
        let constraints = Constraints { root };
        let id = ConstraintsId::of(&constraints);
        let kept = constraints.keys();
        let folded: Box<[String]> = written
            .keys()
            .difference(&kept)
            .map(|k| (*k).to_owned())
            .collect();
        Self {
            constraints,
            id,
            folded_keys: (!folded.is_empty()).then_some(folded),
        }
    }

    pub fn id(&self) -> ConstraintsId {
        self.id
    }

    pub fn constraints(&self) -> &Constraints {
        &self.constraints
    }

    pub fn root(&self) -> Option<&Constraint> {
        self.constraints.root()
    }

    pub fn is_unconstrained(&self) -> bool {
        self.constraints.is_unconstrained()
    }

    pub fn matches<P: Params + ?Sized>(&self, params: &P) -> bool {
        self.constraints.matches(params)
    }

    pub fn keys(&self) -> std::collections::BTreeSet<&str> {
        self.constraints.keys()
    }

    /// The keys of the constraints as written, before constant folding: a superset of
    /// [`keys`](Self::keys). `env = "a" && (v = "1" || *)` is `env = "a"` in canonical form,
    /// but was written with `v`. (Constraints read back from their canonical text have
    /// nothing folded left.)
    pub fn written_keys(&self) -> std::collections::BTreeSet<&str> {
        let mut keys = self.keys();
        keys.extend(self.folded_keys.iter().flatten().map(String::as_str));
        keys
    }
}

impl fmt::Display for CanonicalConstraints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.constraints, f)
    }
}

/// The identity of a variant within its resource: 64 bits of SHA-256 over the canonical text,
/// shown as 16 lower-case hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConstraintsId([u8; 8]);

impl ConstraintsId {
    /// Bumped if the canonical form ever changes, so old and new identities cannot collide.
    const DOMAIN: &'static [u8] = b"vxds.constraints.v1\n";

    fn of(canonical: &Constraints) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(Self::DOMAIN);
        hasher.update(canonical.to_string().as_bytes());
        let digest = hasher.finalize();
        let mut id = [0u8; 8];
        id.copy_from_slice(&digest[..8]);
        Self(id)
    }

    /// The least and the greatest identities, bounds for range queries over maps keyed by them.
    pub const MIN: Self = Self([0; 8]);
    pub const MAX: Self = Self([u8::MAX; 8]);

    pub fn as_bytes(&self) -> &[u8; 8] {
        &self.0
    }
}

impl fmt::Display for ConstraintsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl std::str::FromStr for ConstraintsId {
    type Err = InvalidConstraintsId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 16 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(InvalidConstraintsId(s.to_owned()));
        }
        let mut id = [0u8; 8];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| InvalidConstraintsId(s.to_owned()))?;
        }
        Ok(Self(id))
    }
}

impl serde::Serialize for ConstraintsId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a variant id (16 hex digits)")]
pub struct InvalidConstraintsId(String);

const TRUE: Constraint = Constraint::And(Vec::new());
const FALSE: Constraint = Constraint::Or(Vec::new());

fn is_true(c: &Constraint) -> bool {
    matches!(c, Constraint::And(children) if children.is_empty())
}

fn is_false(c: &Constraint) -> bool {
    matches!(c, Constraint::Or(children) if children.is_empty())
}

/// Bottom-up: constants are folded so they survive only at the root (`TRUE` = `And([])`,
/// `FALSE` = `Or([])`), lists are flattened, sorted (by first key, then structure) and
/// deduplicated, double negation cancels.
fn canonicalize(c: &Constraint) -> Constraint {
    match c {
        Constraint::Equals { .. } | Constraint::Exists { .. } => c.clone(),
        Constraint::Any => TRUE,
        Constraint::Not(inner) => match canonicalize(inner) {
            Constraint::Not(inner) => *inner,
            inner if is_true(&inner) => FALSE,
            inner if is_false(&inner) => TRUE,
            inner => Constraint::not(inner),
        },
        Constraint::And(children) => canonical_list(children, true),
        Constraint::Or(children) => canonical_list(children, false),
    }
}

type Predicate = fn(&Constraint) -> bool;

/// The smallest key an expression mentions (`""` for none).
fn first_key(c: &Constraint) -> &str {
    match c {
        Constraint::Equals { key, .. } | Constraint::Exists { key } => key,
        Constraint::Not(inner) => first_key(inner),
        Constraint::And(children) | Constraint::Or(children) => {
            children.iter().map(first_key).min().unwrap_or("")
        }
        Constraint::Any => "",
    }
}

fn canonical_list(children: &[Constraint], is_and: bool) -> Constraint {
    // For AND the identity element is TRUE and the absorbing one FALSE; for OR the reverse.
    let (identity, absorbing): (Predicate, Predicate) = if is_and {
        (is_true, is_false)
    } else {
        (is_false, is_true)
    };
    let mut flat = Vec::with_capacity(children.len());
    for child in children.iter().map(canonicalize) {
        if absorbing(&child) {
            return child;
        }
        if identity(&child) {
            continue;
        }
        match child {
            Constraint::And(grandchildren) if is_and => flat.extend(grandchildren),
            Constraint::Or(grandchildren) if !is_and => flat.extend(grandchildren),
            child => flat.push(child),
        }
    }
    // Grouped by the first key each child mentions, so `env != "prod" && version = "v1"` reads
    // as written; the derived order breaks ties.
    flat.sort_by(|a, b| (first_key(a), a).cmp(&(first_key(b), b)));
    flat.dedup();
    match flat.len() {
        1 => flat.pop().unwrap_or(TRUE),
        _ if is_and => Constraint::And(flat),
        _ => Constraint::Or(flat),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::constraints::Limits;

    fn canon(text: &str) -> CanonicalConstraints {
        Constraints::parse(text, &Limits::DEFAULT)
            .unwrap()
            .canonical()
    }

    #[test]
    fn order_nesting_and_duplicates_do_not_change_identity() {
        let a = canon(r#"env = "prod" && version = "v1" && zone = "a""#);
        let b = canon(r#"(zone = "a" && version = "v1") && env = "prod" && env = "prod""#);
        let c = canon(r#"all(version = "v1", all(zone = "a", all(env = "prod")))"#);
        assert_eq!(a, b);
        assert_eq!(a, c);
        assert_eq!(
            a.to_string(),
            r#"env = "prod" && version = "v1" && zone = "a""#
        );

        let or1 = canon(r#"env = "test" || (env = "prod" || env = "qa")"#);
        let or2 = canon(r#"env in ("qa", "prod", "test", "prod")"#);
        assert_eq!(or1.id(), or2.id());
        assert_eq!(or1.to_string(), r#"env in ("prod", "qa", "test")"#);
    }

    #[test]
    fn children_are_grouped_by_key() {
        assert_eq!(
            canon(r#"version = "v1" && env != "prod""#).to_string(),
            r#"env != "prod" && version = "v1""#
        );
        assert_eq!(
            canon(r#"!exists(zone) || (b = "1" && a = "2")"#).to_string(),
            r#"(a = "2" && b = "1") || !exists(zone)"#
        );
    }

    #[test]
    fn constants_fold_and_negations_cancel() {
        assert!(canon("*").is_unconstrained());
        assert!(canon("all()").is_unconstrained());
        assert!(canon("!any()").is_unconstrained());
        assert!(canon(r#"all(*, *)"#).is_unconstrained());
        assert_eq!(canon(r#"!!(env = "prod")"#), canon(r#"env = "prod""#));
        assert_eq!(canon(r#"env = "prod" && *"#), canon(r#"env = "prod""#));
        assert_eq!(canon(r#"env = "prod" || any()"#), canon(r#"env = "prod""#));
        assert_eq!(canon(r#"env = "prod" && any()"#).to_string(), "any()");
        assert_eq!(canon(r#"env = "prod" || !any()"#), canon("*"));
    }

    #[test]
    fn different_meanings_get_different_ids() {
        assert_ne!(
            canon(r#"env = "prod""#).id(),
            canon(r#"env != "prod""#).id()
        );
        assert_ne!(
            canon(r#"env = "prod""#).id(),
            canon(r#"env = "prod" && exists(v)"#).id()
        );
        assert_ne!(canon("*").id(), canon("any()").id());
    }

    #[test]
    fn id_is_stable_across_runs_and_machines() {
        // Pinned: a change here changes every stored variant's identity.
        assert_eq!(canon("*").id().to_string(), "216889067e0b90e4");
        assert_eq!(
            canon(r#"env = "prod""#).id().to_string(),
            "16a17203f0484fd2"
        );
        let id = canon(r#"env = "prod""#).id();
        assert_eq!(id.to_string().parse::<ConstraintsId>().unwrap(), id);
        assert!("xyz".parse::<ConstraintsId>().is_err());
    }
}
