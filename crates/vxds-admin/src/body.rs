//! Request bodies: JSON (`Content-Type: application/json`) or YAML (`application/yaml`),
//! within a size limit, turned into typed values with a JSON pointer for whatever does not fit.
//! A body without a Content-Type is refused (415) rather than guessed at. One exception, so
//! that `curl -d '{...}'` works as typed: a body sent as `application/x-www-form-urlencoded`
//! (curl's default) that holds JSON is read as JSON, and the answer carries a `Warning` header
//! saying so. Cross-origin pages can send that type without a preflight, but writes from
//! other origins are refused before this ([`crate::origin`]).

pub mod changeset;
mod yaml;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::Response;
use serde::de::DeserializeOwned;
use serde_json::Value;
use vxds_envoy::pointer::pointer_from_serde_path;

use crate::AdminState;
use crate::problem::{ApiError, ProblemItem};

/// A request body of type `T`.
#[derive(Debug)]
pub struct Payload<T>(pub T);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    Json,
    Yaml,
    /// `application/x-www-form-urlencoded`: JSON, if it holds JSON.
    Form,
}

/// What the answer to a form-typed JSON body says.
pub const FORM_JSON_WARNING: &str = "299 - \"the body was read as JSON although its Content-Type \
    is application/x-www-form-urlencoded (what curl -d sends); send Content-Type: application/json\"";

/// Set by [`Payload`] when it read a form-typed body as JSON; [`warn_form_json`] answers it.
#[derive(Clone, Debug, Default)]
struct ReadFormAsJson(Arc<AtomicBool>);

impl ReadFormAsJson {
    fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Middleware: adds the `Warning` header to the answer to a form-typed JSON body.
pub async fn warn_form_json(mut request: Request, next: Next) -> Response {
    let marker = ReadFormAsJson::default();
    request.extensions_mut().insert(marker.clone());
    let mut response = next.run(request).await;
    if marker.0.load(Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::WARNING, HeaderValue::from_static(FORM_JSON_WARNING));
    }
    response
}

fn format_of(content_type: Option<&str>) -> Result<Format, ApiError> {
    let Some(content_type) = content_type else {
        return Err(ApiError::UnsupportedMediaType(
            "the request has no `Content-Type` header; send application/json or application/yaml"
                .into(),
        ));
    };
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "application/json" => Ok(Format::Json),
        e if e.starts_with("application/") && e.ends_with("+json") => Ok(Format::Json),
        "application/yaml" | "application/x-yaml" | "text/yaml" | "text/x-yaml" => Ok(Format::Yaml),
        "application/x-www-form-urlencoded" => Ok(Format::Form),
        _ => Err(ApiError::UnsupportedMediaType(format!(
            "`{content_type}` is not supported; send application/json or application/yaml"
        ))),
    }
}

/// The request's `Content-Type`, if it has one; 415 if it is not ASCII.
fn content_type(request: &Request) -> Result<Option<String>, ApiError> {
    match request.headers().get(header::CONTENT_TYPE) {
        None => Ok(None),
        Some(v) => v.to_str().map(|v| Some(v.to_owned())).map_err(|_| {
            ApiError::UnsupportedMediaType(
                "the `Content-Type` header is not ASCII; send application/json or application/yaml"
                    .into(),
            )
        }),
    }
}

/// The body size the request declares (`Content-Length`).
fn declared_length(request: &Request) -> Option<usize> {
    request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

/// The whole body, refused (413) as soon as it crosses `limit`.
async fn collect(request: Request, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(request.into_body(), limit)
        .await
        .map_err(|e| {
            if is_length_limit(&e) {
                ApiError::PayloadTooLarge { limit }
            } else {
                ApiError::BadRequest {
                    detail: format!("reading the request body failed: {e}"),
                    errors: vec![],
                }
            }
        })
}

impl<T: DeserializeOwned> FromRequest<AdminState> for Payload<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AdminState) -> Result<Self, Self::Rejection> {
        let content_type = content_type(&request)?;
        let format = format_of(content_type.as_deref())?;
        let marker = request.extensions().get::<ReadFormAsJson>().cloned();
        let limit = state.body_limit;
        if declared_length(&request).is_some_and(|n| n > limit) {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        let bytes = collect(request, limit).await?;
        if format == Format::Form
            && holds_json(&bytes)
            && let Some(marker) = marker
        {
            marker.mark();
        }
        read_body(content_type.as_deref(), bytes).map(Payload)
    }
}

/// `T` from a whole request body of `content_type`: what every endpoint that takes a body
/// does once the bytes are in (and what the fuzz target `changeset_body` drives). The body is
/// dropped as soon as it is no longer needed.
pub fn read_body<T: DeserializeOwned>(
    content_type: Option<&str>,
    bytes: Bytes,
) -> Result<T, ApiError> {
    let format = format_of(content_type)?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::BadRequest {
            detail: "the request needs a body".into(),
            errors: vec![],
        });
    }
    if format == Format::Form && !holds_json(&bytes) {
        return Err(ApiError::UnsupportedMediaType(
            "an application/x-www-form-urlencoded body is read only when it holds JSON \
             (what curl -d sends); send application/json or application/yaml"
                .into(),
        ));
    }
    match format {
        // Straight from the text into `T`: no tree of the whole document, whose nodes
        // would take many times the body's size.
        Format::Json | Format::Form => parse_json(&bytes),
        Format::Yaml => {
            let value = yaml::to_value(&bytes).map_err(|e| ApiError::BadRequest {
                detail: e.to_string(),
                errors: vec![ProblemItem::new("", e.code(), e.to_string())],
            })?;
            drop(bytes);
            parse_value(value)
        }
    }
}

/// Whether a form-typed body is JSON (an object or an array), as `curl -d '{...}'` sends it.
fn holds_json(bytes: &[u8]) -> bool {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    matches!(first, Some(b'{' | b'['))
}

/// `T` from JSON text: a syntax error is a 400 `invalid_json`, a mismatch a 400 naming the
/// field.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let invalid = invalid_json;
    let mut json = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut json).map_err(|e| {
        if e.inner().is_data() {
            shape_error(e.path(), e.inner().to_string())
        } else {
            invalid(e.into_inner())
        }
    })?;
    json.end().map_err(invalid)?;
    Ok(value)
}

/// A 400 `invalid_json`, for JSON that is not well-formed.
fn invalid_json(e: serde_json::Error) -> ApiError {
    ApiError::BadRequest {
        detail: format!("the body is not valid JSON: {e}"),
        errors: vec![ProblemItem::new("", "invalid_json", e.to_string())],
    }
}

/// `T` from a JSON value; a mismatch is a 400 naming the field.
pub fn parse_value<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value)
        .map_err(|e| shape_error(e.path(), e.inner().to_string()))
}

fn shape_error(path: &serde_path_to_error::Path, message: String) -> ApiError {
    let pointer = pointer_from_serde_path(path).to_string();
    ApiError::BadRequest {
        detail: format!("the body does not have the expected shape at `{pointer}`: {message}"),
        errors: vec![ProblemItem::new(pointer, "malformed", message)],
    }
}

fn is_length_limit(e: &axum::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        assert!(matches!(
            format_of(None),
            Err(ApiError::UnsupportedMediaType(_))
        ));
        assert_eq!(
            format_of(Some("application/json; charset=utf-8")).unwrap(),
            Format::Json
        );
        assert_eq!(
            format_of(Some("application/merge-patch+json")).unwrap(),
            Format::Json
        );
        assert_eq!(format_of(Some("application/yaml")).unwrap(), Format::Yaml);
        assert_eq!(format_of(Some("text/yaml")).unwrap(), Format::Yaml);
        assert!(matches!(
            format_of(Some("text/plain")),
            Err(ApiError::UnsupportedMediaType(_))
        ));
        assert_eq!(
            format_of(Some("application/x-www-form-urlencoded")).unwrap(),
            Format::Form
        );
    }
}
