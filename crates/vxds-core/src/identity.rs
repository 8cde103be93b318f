//! Identity templates: how a client's authenticated identity (its certificate's SPIFFE ID or
//! DNS name) becomes trusted dynamic parameters.
//!
//! A template such as `spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}` is literal
//! text with `{name}` placeholders. An identity matches when the literals line up; each
//! placeholder takes a non-empty run of the characters SPIFFE path segments and DNS labels
//! allow (ASCII letters and digits, `.`, `-`, `_`). An identity that fits in more than one way
//! (`{namespace}-{env}` against `team-a-prod`) is refused rather than split by guesswork: a
//! wrong split would hand one tenant another's parameters.
//! Trusted parameters override whatever the client claims for the same keys (TP2: parameters
//! that decide access must not come from the client).

use std::collections::HashMap;
use std::fmt;

use crate::variants::{VariantLimits, VariantSetError, check_mutual_exclusivity};
use crate::{CanonicalConstraints, Constraint, Constraints, Limits, ParamSet};

/// A parsed identity template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityTemplate {
    text: String,
    parts: Vec<Part>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    Literal(String),
    Placeholder(String),
}

/// Why a template is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("identity template {template:?}: {reason}")]
pub struct TemplateError {
    pub template: String,
    pub reason: String,
}

/// Why an identity does not fit the template.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityMismatch {
    #[error("the client presented no certificate identity (URI or DNS SAN)")]
    Missing,
    #[error("identity {identity:?} does not match the template {template:?}")]
    NoMatch { identity: String, template: String },
    #[error(
        "identity {identity:?} fits the template {template:?} in more than one way, so its \
         parameters are ambiguous"
    )]
    Ambiguous { identity: String, template: String },
}

impl IdentityTemplate {
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let refuse = |reason: String| TemplateError {
            template: text.to_owned(),
            reason,
        };
        if text.is_empty() {
            return Err(refuse("it is empty".into()));
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            match c {
                '{' => {
                    let end = rest
                        .find('}')
                        .ok_or_else(|| refuse("a `{` is never closed".into()))?;
                    let name = &rest[1..end];
                    if !valid_name(name) {
                        return Err(refuse(format!(
                            "placeholder {{{name}}} is not a parameter name (letters, digits, \
                             `_`, `-` and `.`, starting with a letter or `_`)"
                        )));
                    }
                    if literal.is_empty() && matches!(parts.last(), Some(Part::Placeholder(_))) {
                        return Err(refuse(format!(
                            "placeholder {{{name}}} follows another with nothing between them, \
                             so the identity cannot be split"
                        )));
                    }
                    if parts
                        .iter()
                        .any(|p| matches!(p, Part::Placeholder(n) if n == name))
                    {
                        return Err(refuse(format!("placeholder {{{name}}} appears twice")));
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Placeholder(name.to_owned()));
                    rest = &rest[end + 1..];
                }
                '}' => return Err(refuse("a `}` has no `{` before it".into())),
                c => {
                    literal.push(c);
                    rest = &rest[c.len_utf8()..];
                }
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Self {
            text: text.to_owned(),
            parts,
        })
    }

    /// The keys the template makes trusted, in template order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Placeholder(name) => Some(name.as_str()),
            Part::Literal(_) => None,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The trusted parameters `identity` carries, or why it does not fit.
    pub fn trusted_params(&self, identity: Option<&str>) -> Result<ParamSet, IdentityMismatch> {
        let identity = identity.ok_or(IdentityMismatch::Missing)?;
        let mut memo = HashMap::new();
        match self.fits(0, identity, 0, &mut memo) {
            1 => {}
            0 => {
                return Err(IdentityMismatch::NoMatch {
                    identity: identity.to_owned(),
                    template: self.text.clone(),
                });
            }
            _ => {
                return Err(IdentityMismatch::Ambiguous {
                    identity: identity.to_owned(),
                    template: self.text.clone(),
                });
            }
        }
        // Exactly one way fits: follow it.
        let mut params = ParamSet::new();
        let mut at = 0;
        for (i, part) in self.parts.iter().enumerate() {
            match part {
                Part::Literal(text) => at += text.len(),
                Part::Placeholder(name) => {
                    let end = (at + 1..=identity.len())
                        .find(|&end| {
                            identity.is_char_boundary(end)
                                && identity[at..end].chars().all(value_char)
                                && self.fits(i + 1, identity, end, &mut memo) == 1
                        })
                        .expect("the one fit");
                    params.insert(name.clone(), &identity[at..end]);
                    at = end;
                }
            }
        }
        Ok(params)
    }

    /// How many ways `identity[at..]` fits `parts[i..]`: 0, 1, or 2 for "more than one".
    /// Memoized on the position, so it costs parts × length², whatever the identity.
    fn fits(
        &self,
        i: usize,
        identity: &str,
        at: usize,
        memo: &mut HashMap<(usize, usize), u8>,
    ) -> u8 {
        if let Some(&known) = memo.get(&(i, at)) {
            return known;
        }
        let rest = &identity[at..];
        let count = match self.parts.get(i) {
            None => u8::from(rest.is_empty()),
            Some(Part::Literal(text)) => match rest.starts_with(text.as_str()) {
                true => self.fits(i + 1, identity, at + text.len(), memo),
                false => 0,
            },
            Some(Part::Placeholder(_)) => {
                let longest = rest.find(|c: char| !value_char(c)).unwrap_or(rest.len());
                let mut count = 0;
                for end in 1..=longest {
                    count += self.fits(i + 1, identity, at + end, memo);
                    if count > 1 {
                        break;
                    }
                }
                count.min(2)
            }
        };
        memo.insert((i, at), count);
        count
    }
}

/// What a placeholder's value may hold: SPIFFE path segments' and DNS labels' characters.
fn value_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')
}

impl fmt::Display for IdentityTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

/// A value no identity yields (placeholders take name characters only).
const UNISSUED: &str = "<no identity>";

/// Whether a client whose identity gives none of the values `constraints` names can still
/// match it — whatever untrusted parameters it claims. `Some(witness)`: such a client's
/// parameters, e.g. `namespace != "shop"` or `namespace = "shop" || env = "dev"` with
/// `{env=dev, namespace=<no identity>}`. `None` when the constraints hold only for identities
/// they name, or when the analysis gave up within its budget.
pub fn open_to_any_identity(
    constraints: &CanonicalConstraints,
    trusted_keys: &[String],
    limits: &VariantLimits,
) -> Option<ParamSet> {
    if trusted_keys.is_empty() {
        return None;
    }
    let unissued = Constraint::And(
        trusted_keys
            .iter()
            .map(|key| Constraint::equals(key.clone(), UNISSUED))
            .collect(),
    );
    // Limits are the constraint model's own; the probe is small and always within them.
    let unissued = Constraints::new(unissued, &Limits::DEFAULT)
        .ok()?
        .canonical();
    let pair = [constraints.clone(), unissued];
    check_mutual_exclusivity(&pair, limits)
        .into_iter()
        .find_map(|error| match error {
            VariantSetError::Overlap { witness, .. } => Some(witness),
            VariantSetError::DuplicateVariant { witness, .. } => witness,
            _ => None,
        })
}

/// Whether `constraints` hold only for identities they name: no client whose identity gives
/// none of their values can match them, whatever untrusted parameters it claims. Unlike
/// [`open_to_any_identity`], an analysis that gives up within its budget answers `false`:
/// this decides what is served, and what cannot be shown bound is not. Without trusted keys
/// nothing is bound.
pub fn bound_to_identity(
    constraints: &CanonicalConstraints,
    trusted_keys: &[String],
    limits: &VariantLimits,
) -> bool {
    if trusted_keys.is_empty() {
        return false;
    }
    let unissued = Constraint::And(
        trusted_keys
            .iter()
            .map(|key| Constraint::equals(key.clone(), UNISSUED))
            .collect(),
    );
    let Ok(unissued) = Constraints::new(unissued, &Limits::DEFAULT) else {
        return false;
    };
    check_mutual_exclusivity(&[constraints.clone(), unissued.canonical()], limits).is_empty()
}

/// `client` with every trusted key set to its trusted value: the client cannot override them,
/// and cannot hide them by leaving them out.
pub fn overlay_trusted(mut client: ParamSet, trusted: &ParamSet) -> ParamSet {
    for (key, value) in trusted.iter() {
        client.insert(key, value);
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPIFFE: &str = "spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}";

    #[test]
    fn spiffe_ids_become_parameters() {
        let template = IdentityTemplate::parse(SPIFFE).unwrap();
        assert_eq!(
            template.keys().collect::<Vec<_>>(),
            ["trust_domain", "namespace", "service_account"]
        );
        assert_eq!(
            template.trusted_params(Some("spiffe://example.org/ns/shop/sa/cart")),
            Ok(ParamSet::new()
                .with("trust_domain", "example.org")
                .with("namespace", "shop")
                .with("service_account", "cart"))
        );
    }

    #[test]
    fn identities_that_do_not_fit_are_refused() {
        let template = IdentityTemplate::parse(SPIFFE).unwrap();
        for identity in [
            "spiffe://example.org/ns/shop/sa/cart/extra",
            "spiffe://example.org/ns//sa/cart",
            "spiffe://example.org/ns/shop/sa/",
            "spiffe://example.org/namespace/shop/sa/cart",
            "https://example.org/ns/shop/sa/cart",
            "envoy.shop.svc",
        ] {
            assert!(
                matches!(
                    template.trusted_params(Some(identity)),
                    Err(IdentityMismatch::NoMatch { .. })
                ),
                "{identity}"
            );
        }
        assert_eq!(
            template.trusted_params(None),
            Err(IdentityMismatch::Missing)
        );
    }

    #[test]
    fn dns_templates_split_where_only_one_way_fits() {
        let template = IdentityTemplate::parse("{service}.{namespace}.svc").unwrap();
        assert_eq!(
            template.trusted_params(Some("api.shop.svc")),
            Ok(ParamSet::new()
                .with("service", "api")
                .with("namespace", "shop"))
        );
        assert!(matches!(
            template.trusted_params(Some("api.shop.prod.svc")),
            Err(IdentityMismatch::Ambiguous { .. })
        ));
        let template = IdentityTemplate::parse("spiffe://td/{namespace}-{env}").unwrap();
        assert!(matches!(
            template.trusted_params(Some("spiffe://td/team-a-prod")),
            Err(IdentityMismatch::Ambiguous { .. })
        ));
        assert_eq!(
            template.trusted_params(Some("spiffe://td/team-prod")),
            Ok(ParamSet::new()
                .with("namespace", "team")
                .with("env", "prod"))
        );
    }

    #[test]
    fn values_hold_only_name_characters() {
        let template = IdentityTemplate::parse("spiffe://td/ns/{namespace}").unwrap();
        for identity in [
            "spiffe://td/ns/shop?x=1",
            "spiffe://td/ns/shop#frag",
            "spiffe://td/ns/sh%6Fp",
            "spiffe://td/ns/shop/extra",
        ] {
            assert!(
                template.trusted_params(Some(identity)).is_err(),
                "{identity}"
            );
        }
    }

    #[test]
    fn bad_templates_are_refused_with_the_reason() {
        for (text, reason) in [
            ("", "empty"),
            ("spiffe://{td/ns", "never closed"),
            ("spiffe://td}/ns", "no `{`"),
            ("spiffe://{td}{ns}", "nothing between"),
            ("spiffe://{td}/ns/{td}", "twice"),
            ("spiffe://{1td}/ns", "not a parameter name"),
            ("spiffe://{}/ns", "not a parameter name"),
        ] {
            let error = IdentityTemplate::parse(text).unwrap_err();
            assert!(error.to_string().contains(reason), "{text}: {error}");
        }
    }

    #[test]
    fn constraints_open_to_any_identity_are_found() {
        let keys = vec!["namespace".to_owned()];
        let open = |text: &str| {
            let constraints = Constraints::parse(text, &Limits::DEFAULT)
                .unwrap()
                .canonical();
            open_to_any_identity(&constraints, &keys, &VariantLimits::DEFAULT)
        };
        assert_eq!(open(r#"namespace = "shop""#), None);
        assert_eq!(open(r#"namespace = "shop" && env = "dev""#), None);
        assert_eq!(open(r#"namespace in (shop, bank)"#), None);
        for text in [
            "*",
            r#"env = "dev""#,
            r#"namespace != "shop""#,
            "exists(namespace)",
            r#"namespace = "shop" || env = "dev""#,
        ] {
            let witness = open(text).unwrap_or_else(|| panic!("{text} is open"));
            assert_eq!(
                witness.0.get("namespace").map(String::as_str),
                Some(UNISSUED),
                "{text}"
            );
        }
    }

    #[test]
    fn only_constraints_shown_bound_are_bound() {
        let keys = vec!["namespace".to_owned()];
        let bound = |text: &str, keys: &[String]| {
            let constraints = Constraints::parse(text, &Limits::DEFAULT)
                .unwrap()
                .canonical();
            bound_to_identity(&constraints, keys, &VariantLimits::DEFAULT)
        };
        assert!(bound(r#"namespace = "shop""#, &keys));
        assert!(bound(r#"namespace in (shop, bank) && env = "dev""#, &keys));
        for open in ["*", r#"env = "dev""#, r#"namespace != "shop""#] {
            assert!(!bound(open, &keys), "{open}");
        }
        // No trusted keys: nothing is bound to an identity.
        assert!(!bound(r#"namespace = "shop""#, &[]));
        // Undecided within the budget: not bound.
        let tiny = VariantLimits {
            analysis_budget: 1,
            ..VariantLimits::DEFAULT
        };
        let constraints = Constraints::parse(r#"namespace = "shop""#, &Limits::DEFAULT)
            .unwrap()
            .canonical();
        assert!(!bound_to_identity(&constraints, &keys, &tiny));
    }

    #[test]
    fn trusted_keys_override_and_cannot_be_dropped() {
        let trusted = ParamSet::new().with("namespace", "shop");
        let claimed = ParamSet::new()
            .with("namespace", "admin")
            .with("env", "prod");
        assert_eq!(
            overlay_trusted(claimed, &trusted),
            ParamSet::new()
                .with("namespace", "shop")
                .with("env", "prod")
        );
        assert_eq!(overlay_trusted(ParamSet::new(), &trusted), trusted);
    }
}
