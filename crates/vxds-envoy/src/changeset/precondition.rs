//! What an operation requires of its resource's current state, checked by the store under its
//! write lock: `expected_version` (one version, any of several, or `*` for any) or, for a put,
//! `must_not_exist`. REST's `If-Match` and `If-None-Match: *` are these same fields.

use serde::{Deserialize, Serialize};

use super::Problem;
use crate::pointer::Pointer;

/// `expected_version`: a version, or a list of which any will do; `*` stands for any version
/// (the resource must exist).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ExpectedVersion {
    One(String),
    AnyOf(Vec<String>),
}

/// The `expected_version` that any existing version satisfies.
pub const ANY_VERSION: &str = "*";

/// What an operation requires, once checked.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Precondition {
    #[default]
    None,
    /// At any version.
    Exists,
    /// At one of these versions.
    AnyOf(Vec<String>),
    /// Not at all (a create-only put).
    Absent,
}

/// Which request field a precondition came from, for pointers.
pub const EXPECTED_VERSION: &str = "expected_version";
pub const MUST_NOT_EXIST: &str = "must_not_exist";

impl Precondition {
    /// The rule: at most one of the two fields, and a list that names at least one version.
    /// `at` points at the operation.
    pub fn from_request(
        expected: Option<&ExpectedVersion>,
        must_not_exist: bool,
        at: &Pointer,
    ) -> Result<Self, Box<Problem>> {
        let versions: Vec<&str> = match expected {
            None => Vec::new(),
            Some(ExpectedVersion::One(v)) => vec![v.as_str()],
            Some(ExpectedVersion::AnyOf(list)) => list.iter().map(String::as_str).collect(),
        };
        match (expected, must_not_exist) {
            (Some(_), true) => Err(Box::new(Problem::new(
                at.push(MUST_NOT_EXIST),
                "contradictory_preconditions",
                "`must_not_exist` and `expected_version` cannot both hold; give one",
            ))),
            (None, true) => Ok(Precondition::Absent),
            (None, false) => Ok(Precondition::None),
            (Some(_), false) if versions.is_empty() => Err(Box::new(Problem::new(
                at.push(EXPECTED_VERSION),
                "empty_expected_version",
                "`expected_version` lists no version; give at least one, or `*` for any",
            ))),
            (Some(_), false) if versions.contains(&ANY_VERSION) => Ok(Precondition::Exists),
            (Some(_), false) => Ok(Precondition::AnyOf(
                versions.into_iter().map(str::to_owned).collect(),
            )),
        }
    }

    /// Whether a resource named `name`, at `current` (`None`: absent), satisfies it; if not,
    /// the field at fault and why.
    pub fn check(&self, name: &str, current: Option<&str>) -> Result<(), (&'static str, String)> {
        let failed = |message: String| Err((EXPECTED_VERSION, message));
        match (self, current) {
            (Precondition::None, _)
            | (Precondition::Exists, Some(_))
            | (Precondition::Absent, None) => Ok(()),
            (Precondition::AnyOf(versions), Some(v)) if versions.iter().any(|e| e == v) => Ok(()),
            (Precondition::Absent, Some(v)) => Err((
                MUST_NOT_EXIST,
                format!("`{name}` already exists (at version {v})"),
            )),
            (Precondition::Exists, None) => failed(format!("`{name}` does not exist")),
            (Precondition::AnyOf(versions), None) => failed(format!(
                "`{name}` does not exist, so it is not at version {}",
                versions.join(" or ")
            )),
            (Precondition::AnyOf(versions), Some(v)) => failed(format!(
                "`{name}` is at version {v}, not {}",
                versions.join(" or ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(
        expected: Option<ExpectedVersion>,
        must_not_exist: bool,
    ) -> Result<Precondition, String> {
        Precondition::from_request(expected.as_ref(), must_not_exist, &Pointer::root())
            .map_err(|p| p.code)
    }

    #[test]
    fn the_fields_make_one_precondition() {
        let one = |v: &str| Some(ExpectedVersion::One(v.into()));
        let many = |v: &[&str]| {
            Some(ExpectedVersion::AnyOf(
                v.iter().map(|s| (*s).into()).collect(),
            ))
        };
        assert_eq!(from(None, false), Ok(Precondition::None));
        assert_eq!(from(None, true), Ok(Precondition::Absent));
        assert_eq!(from(one("*"), false), Ok(Precondition::Exists));
        assert_eq!(from(many(&["a", "*"]), false), Ok(Precondition::Exists));
        assert_eq!(
            from(many(&["a", "b"]), false),
            Ok(Precondition::AnyOf(vec!["a".into(), "b".into()]))
        );
        assert_eq!(from(many(&[]), false), Err("empty_expected_version".into()));
        assert_eq!(
            from(one("a"), true),
            Err("contradictory_preconditions".into())
        );
    }

    #[test]
    fn checks() {
        let any_of = Precondition::AnyOf(vec!["a".into(), "b".into()]);
        assert!(any_of.check("r", Some("b")).is_ok());
        assert_eq!(
            any_of.check("r", Some("c")).unwrap_err().0,
            EXPECTED_VERSION
        );
        assert!(any_of.check("r", None).is_err());
        assert!(Precondition::Exists.check("r", Some("x")).is_ok());
        assert!(Precondition::Exists.check("r", None).is_err());
        assert!(Precondition::Absent.check("r", None).is_ok());
        assert_eq!(
            Precondition::Absent.check("r", Some("x")).unwrap_err().0,
            MUST_NOT_EXIST
        );
    }
}
