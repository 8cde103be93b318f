//! Query strings and path parameters, with failures as problem documents rather than axum's
//! plain-text rejections.

use std::collections::HashMap;

use axum::extract::rejection::RawPathParamsRejection;
use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::de::DeserializeOwned;

use crate::AdminState;
use crate::problem::{ApiError, ProblemItem};

/// The query string as `T`.
#[derive(Debug)]
pub struct Query<T>(pub T);

impl<T: DeserializeOwned> FromRequestParts<AdminState> for Query<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &AdminState,
    ) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        serde_urlencoded::from_str(query)
            .map(Query)
            .map_err(|e| ApiError::BadRequest {
                detail: format!("the query string is malformed: {e}"),
                errors: vec![ProblemItem::new("", "invalid_query", e.to_string())],
            })
    }
}

/// Unreserved characters (RFC 3986) stay; everything else in a path segment is escaped.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `value` as one path segment, percent-encoded: how clients (the CLI among them) put a name
/// into a path, so that [`PathParams`] gives back exactly `value`.
pub fn path_segment(value: &str) -> String {
    utf8_percent_encode(value, SEGMENT).to_string()
}

/// Path parameters, percent-decoded once. axum's router has already decoded them: decoding
/// again would make `r%2541` (the name `r%41`) address `rA`.
#[derive(Debug)]
pub struct PathParams(HashMap<String, String>);

impl PathParams {
    pub fn get(&self, name: &str) -> Result<&str, ApiError> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or(ApiError::Internal)
    }
}

impl FromRequestParts<AdminState> for PathParams {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AdminState,
    ) -> Result<Self, Self::Rejection> {
        match RawPathParams::from_request_parts(parts, state).await {
            Ok(raw) => Ok(Self(
                raw.iter()
                    .map(|(name, value)| (name.to_owned(), value.to_owned()))
                    .collect(),
            )),
            Err(RawPathParamsRejection::InvalidUtf8InPathParam(e)) => {
                Err(invalid_utf8(&e.body_text()))
            }
            // Only a route without parameters gets here: a bug, not the client's fault.
            Err(_) => Err(ApiError::Internal),
        }
    }
}

/// The 400 for a path parameter whose percent-escapes are not UTF-8. axum's rejection names
/// the parameter only in its text (`Invalid UTF-8 in `name``).
fn invalid_utf8(text: &str) -> ApiError {
    let name = text.split('`').nth(1).unwrap_or("path");
    ApiError::bad_parameter(
        name,
        "invalid_encoding",
        "percent-escapes do not decode to UTF-8",
    )
}

/// A list's `limit` parameter: `default` when absent, else 1 to 1,000 (a 400 naming `limit`).
pub fn page_limit(limit: Option<u32>, default: u32) -> Result<u32, ApiError> {
    let limit = limit.unwrap_or(default);
    if !(1..=1000).contains(&limit) {
        return Err(ApiError::bad_parameter(
            "limit",
            "invalid_limit",
            "limit must be between 1 and 1000",
        ));
    }
    Ok(limit)
}
