//! Identity templates: how a client's authenticated identity (its certificate's SPIFFE ID or
//! DNS name) becomes trusted dynamic parameters.
//!
//! A template such as `spiffe://{trust_domain}/ns/{namespace}/sa/{service_account}` is literal
//! text with `{name}` placeholders. An identity matches when the literals line up; each
//! placeholder takes a non-empty run of characters that holds no `/` and not the character the
//! next literal starts with, so `{service}.{namespace}.svc` splits `api.shop.svc` one way only.
//! Trusted parameters override whatever the client claims for the same keys (TP2: parameters
//! that decide access must not come from the client).

use std::fmt;

use crate::ParamSet;

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
        let mismatch = || IdentityMismatch::NoMatch {
            identity: identity.to_owned(),
            template: self.text.clone(),
        };
        let mut params = ParamSet::new();
        let mut rest = identity;
        for (i, part) in self.parts.iter().enumerate() {
            match part {
                Part::Literal(text) => {
                    rest = rest.strip_prefix(text.as_str()).ok_or_else(mismatch)?
                }
                Part::Placeholder(name) => {
                    let stop = match self.parts.get(i + 1) {
                        Some(Part::Literal(next)) => next.chars().next(),
                        _ => None,
                    };
                    let end = rest
                        .find(|c: char| c == '/' || Some(c) == stop)
                        .unwrap_or(rest.len());
                    if end == 0 {
                        return Err(mismatch());
                    }
                    params.insert(name.clone(), &rest[..end]);
                    rest = &rest[end..];
                }
            }
        }
        if !rest.is_empty() {
            return Err(mismatch());
        }
        Ok(params)
    }
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
    fn dns_templates_split_on_the_next_literal() {
        let template = IdentityTemplate::parse("{service}.{namespace}.svc").unwrap();
        assert_eq!(
            template.trusted_params(Some("api.shop.svc")),
            Ok(ParamSet::new()
                .with("service", "api")
                .with("namespace", "shop"))
        );
        assert!(template.trusted_params(Some("api.shop.prod.svc")).is_err());
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
