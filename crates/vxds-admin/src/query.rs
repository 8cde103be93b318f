//! Query strings and path parameters, with failures as problem documents rather than axum's
//! plain-text rejections.

use std::collections::HashMap;

use axum::extract::{FromRequestParts, RawPathParams};
use axum::http::request::Parts;
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

/// Path parameters, percent-decoded.
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
        let raw = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::Internal)?;
        let mut params = HashMap::new();
        for (name, value) in &raw {
            let decoded = percent_encoding::percent_decode_str(value)
                .decode_utf8()
                .map_err(|_| {
                    ApiError::bad_parameter(
                        name,
                        "invalid_encoding",
                        "percent-escapes do not decode to UTF-8",
                    )
                })?;
            params.insert(name.to_owned(), decoded.into_owned());
        }
        Ok(Self(params))
    }
}
