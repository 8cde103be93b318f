//! Conditional requests (RFC 9110 §13): `If-Match` and `If-None-Match` parsed strictly, every
//! entity-tag of every field line counted. Writes hand their conditions to the store as the
//! operation's precondition (`expected_version`, `must_not_exist`), so they are checked under
//! its write lock, not before it.

use axum::http::{HeaderMap, HeaderName};
use vxds_envoy::changeset::{ANY_VERSION, ExpectedVersion};

use crate::problem::ApiError;

/// What ends the entity-tag of a representation with its secret key material redacted
/// (`"<version>;redacted"`): it differs from the full representation's `"<version>"`, as RFC 9110
/// §8.8.3 asks of two representations. A write's `If-Match` takes either: both name the version.
pub const REDACTED_TAG_SUFFIX: &str = ";redacted";

/// The entity-tags of a condition header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tags {
    /// `*`
    Any,
    List(Vec<EntityTag>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntityTag {
    pub weak: bool,
    pub opaque: String,
}

/// The header's entity-tags; `None` if absent. Not ASCII, malformed, or `*` among tags: a 400
/// naming the header.
pub fn parse(headers: &HeaderMap, name: &HeaderName) -> Result<Option<Tags>, ApiError> {
    let display = display_name(name);
    let mut lines = Vec::new();
    for value in headers.get_all(name) {
        let text = value.to_str().map_err(|_| {
            ApiError::bad_header(display, "invalid_header", "the value is not ASCII")
        })?;
        lines.push(text.trim().to_owned());
    }
    if lines.is_empty() {
        return Ok(None);
    }
    // Field lines of a list combine into one list (RFC 9110 §5.3).
    let value = lines.join(", ");
    if value.trim() == "*" {
        return Ok(Some(Tags::Any));
    }
    parse_list(&value)
        .map(|tags| Some(Tags::List(tags)))
        .map_err(|why| ApiError::bad_header(display, "malformed_entity_tag", why))
}

fn display_name(name: &HeaderName) -> &'static str {
    if name == axum::http::header::IF_NONE_MATCH {
        "If-None-Match"
    } else {
        "If-Match"
    }
}

/// `#entity-tag`: `[W/]"etagc*"` separated by commas and optional whitespace.
fn parse_list(value: &str) -> Result<Vec<EntityTag>, String> {
    let mut tags = Vec::new();
    let mut rest = value.trim_start_matches([' ', '\t', ',']);
    while !rest.is_empty() {
        let (weak, after) = match rest.strip_prefix("W/") {
            Some(after) => (true, after),
            None => (false, rest),
        };
        let quoted = after.strip_prefix('"').ok_or_else(|| {
            format!("expected `*` or a quoted entity-tag such as \"abc\" at `{rest}`")
        })?;
        let end = quoted
            .find('"')
            .ok_or_else(|| format!("the entity-tag at `{rest}` has no closing quote"))?;
        let opaque = &quoted[..end];
        // etagc: visible characters but `"` (and obs-text, already refused as not ASCII).
        if let Some(c) = opaque.chars().find(|c| !c.is_ascii_graphic()) {
            return Err(format!("the entity-tag at `{rest}` holds {c:?}"));
        }
        tags.push(EntityTag {
            weak,
            opaque: opaque.to_owned(),
        });
        let after_tag = quoted[end + 1..].trim_start_matches([' ', '\t']);
        rest = match after_tag.strip_prefix(',') {
            Some(next) => next.trim_start_matches([' ', '\t', ',']),
            None if after_tag.is_empty() => after_tag,
            None => return Err(format!("expected `,` before `{after_tag}`")),
        };
    }
    if tags.is_empty() {
        return Err("the header lists no entity-tag".into());
    }
    Ok(tags)
}

/// What `If-Match` asks of a write, as the store's `expected_version`; `Err` with the 412 when
/// no tag can ever match (weak tags never match `If-Match`: it compares strongly).
pub fn if_match_expectation(tags: Option<Tags>) -> Result<Option<ExpectedVersion>, ApiError> {
    match tags {
        None => Ok(None),
        Some(Tags::Any) => Ok(Some(ExpectedVersion::One(ANY_VERSION.to_owned()))),
        Some(Tags::List(tags)) => {
            let strong: Vec<String> = tags
                .into_iter()
                // A quoted "*" is a tag, not the wildcard; no version is spelt so.
                .filter(|t| !t.weak && t.opaque != ANY_VERSION)
                // The redacted representation's tag names the same version.
                .map(|t| match t.opaque.strip_suffix(REDACTED_TAG_SUFFIX) {
                    Some(version) => version.to_owned(),
                    None => t.opaque,
                })
                .collect();
            if strong.is_empty() {
                return Err(precondition_failed(
                    "If-Match",
                    "`If-Match` lists only weak entity-tags, which never match a write; send the \
                     `ETag` as given"
                        .into(),
                ));
            }
            Ok(Some(ExpectedVersion::AnyOf(strong)))
        }
    }
}

/// Whether `If-None-Match` holds against `version` for a read (weak comparison: `W/"v"`
/// matches `"v"`). `true` means "not modified".
pub fn none_match_hits(tags: &Tags, version: &str) -> bool {
    match tags {
        Tags::Any => true,
        Tags::List(tags) => tags.iter().any(|t| t.opaque == version),
    }
}

/// Whether `If-Match` holds for a read of a resource at `version` (`None`: there is none):
/// strong comparison, and `*` needs the resource to exist (RFC 9110 §13.1.1).
pub fn match_holds(tags: &Tags, version: Option<&str>) -> bool {
    match (tags, version) {
        (_, None) => false,
        (Tags::Any, Some(_)) => true,
        (Tags::List(tags), Some(version)) => tags.iter().any(|t| !t.weak && t.opaque == version),
    }
}

/// The 412 for a read whose `If-Match` failed.
pub fn read_precondition_failed(message: String) -> ApiError {
    ApiError::PreconditionFailed {
        detail: message.clone(),
        errors: vec![crate::problem::ProblemItem::header(
            "If-Match",
            "precondition_failed",
            message,
        )],
    }
}

/// The 412 for a failed condition, naming its header.
pub fn precondition_failed(header: &str, message: String) -> ApiError {
    ApiError::PreconditionFailed {
        detail: format!("{message}; nothing was written"),
        errors: vec![crate::problem::ProblemItem::header(
            header,
            "precondition_failed",
            message,
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use axum::http::header::IF_MATCH;

    fn tags(values: &[&[u8]]) -> Result<Option<Tags>, ApiError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(IF_MATCH, HeaderValue::from_bytes(v).unwrap());
        }
        parse(&headers, &IF_MATCH)
    }

    fn tag(weak: bool, opaque: &str) -> EntityTag {
        EntityTag {
            weak,
            opaque: opaque.into(),
        }
    }

    #[test]
    fn lists_of_tags() {
        assert_eq!(tags(&[]).unwrap(), None);
        assert_eq!(tags(&[b" * "]).unwrap(), Some(Tags::Any));
        assert_eq!(
            tags(&[br#""a", W/"b""#, br#""c""#]).unwrap(),
            Some(Tags::List(vec![
                tag(false, "a"),
                tag(true, "b"),
                tag(false, "c")
            ]))
        );
        for bad in [
            &b"abc"[..],
            br#""a" "b""#,
            br#""a"#,
            b"*, \"a\"",
            b",",
            "\"é\"".as_bytes(),
        ] {
            assert!(
                matches!(tags(&[bad]), Err(ApiError::BadHeader { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn if_match_on_a_read_compares_strongly_and_needs_the_resource() {
        let list = Tags::List(vec![tag(false, "v1"), tag(true, "v2")]);
        assert!(match_holds(&list, Some("v1")));
        assert!(!match_holds(&list, Some("v2")), "weak tags never match");
        assert!(!match_holds(&list, Some("v3")));
        assert!(match_holds(&Tags::Any, Some("v3")));
        assert!(!match_holds(&Tags::Any, None));
    }

    #[test]
    fn weak_tags_never_match_writes() {
        let weak = Some(Tags::List(vec![tag(true, "a")]));
        assert!(matches!(
            if_match_expectation(weak),
            Err(ApiError::PreconditionFailed { .. })
        ));
        let mixed = Some(Tags::List(vec![
            tag(true, "a"),
            tag(false, "b"),
            tag(false, "c"),
        ]));
        assert_eq!(
            if_match_expectation(mixed).unwrap(),
            Some(ExpectedVersion::AnyOf(vec!["b".into(), "c".into()]))
        );
        // The tag of a redacted representation names the version it shows.
        let redacted = Some(Tags::List(vec![tag(false, "v7;redacted")]));
        assert_eq!(
            if_match_expectation(redacted).unwrap(),
            Some(ExpectedVersion::AnyOf(vec!["v7".into()]))
        );
        assert!(none_match_hits(&Tags::List(vec![tag(true, "a")]), "a"));
        assert!(!none_match_hits(&Tags::List(vec![tag(false, "a")]), "b"));
    }
}
