//! Request bodies: JSON (`Content-Type: application/json`) or YAML (`application/yaml`),
//! within a size limit, turned into typed values with a JSON pointer for whatever does not fit.
//! A body without a Content-Type is refused (415) rather than guessed at.

mod yaml;

use axum::extract::{FromRequest, Request};
use axum::http::header;
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
        _ => Err(ApiError::UnsupportedMediaType(format!(
            "`{content_type}` is not supported; send application/json or application/yaml"
        ))),
    }
}

impl<T: DeserializeOwned> FromRequest<AdminState> for Payload<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AdminState) -> Result<Self, Self::Rejection> {
        let content_type = match request.headers().get(header::CONTENT_TYPE) {
            None => None,
            Some(v) => Some(v.to_str().map_err(|_| {
                ApiError::UnsupportedMediaType(
                    "the `Content-Type` header is not ASCII; send application/json or application/yaml"
                        .into(),
                )
            })?),
        };
        let format = format_of(content_type)?;
        let limit = state.body_limit;
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        let bytes = axum::body::to_bytes(request.into_body(), limit)
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
            })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Err(ApiError::BadRequest {
                detail: "the request needs a body".into(),
                errors: vec![],
            });
        }
        let value: Value = match format {
            Format::Json => serde_json::from_slice(&bytes).map_err(|e| ApiError::BadRequest {
                detail: format!("the body is not valid JSON: {e}"),
                errors: vec![ProblemItem::new("", "invalid_json", e.to_string())],
            })?,
            Format::Yaml => yaml::to_value(&bytes).map_err(|e| ApiError::BadRequest {
                detail: e.to_string(),
                errors: vec![ProblemItem::new("", e.code(), e.to_string())],
            })?,
        };
        parse_value(value).map(Payload)
    }
}

/// `T` from a JSON value; a mismatch is a 400 naming the field.
pub fn parse_value<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let pointer = pointer_from_serde_path(e.path()).to_string();
        let message = e.inner().to_string();
        ApiError::BadRequest {
            detail: format!("the body does not have the expected shape at `{pointer}`: {message}"),
            errors: vec![ProblemItem::new(pointer, "malformed", message)],
        }
    })
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
        assert!(matches!(
            format_of(Some("application/x-www-form-urlencoded")),
            Err(ApiError::UnsupportedMediaType(_))
        ));
    }
}
