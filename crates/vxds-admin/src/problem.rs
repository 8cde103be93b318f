//! Errors as RFC 9457 problem details (`application/problem+json`). This is the one place
//! where errors become HTTP statuses. Database error text never reaches a client: it is logged
//! here and replaced by a generic detail.

use std::collections::BTreeMap;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tracing::error;
use utoipa::ToSchema;
use vxds_envoy::changeset::Problem;
use vxds_store::{ApplyError, RestoreError, StoreError};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// `Retry-After` on a 503, in seconds: a store found down is probed twice a second
/// ([`vxds_store::PROBE_PERIOD`]), so by then the answer may well be different.
pub const RETRY_AFTER_SECS: u64 = 1;

/// An RFC 9457 problem document.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct ProblemBody {
    /// A URI naming the kind of problem, e.g. `urn:vxds:problem:validation-failed`.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Every problem found, each pointing at the part of the request it is about.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ProblemItem>,
    /// Things that did not refuse the request but deserve a look.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<ProblemItem>,
}

/// The problems every endpoint that reads the store may answer with (OpenAPI only).
#[derive(Debug, utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "describes responses for the OpenAPI document; never built"
)]
pub enum ReadProblems {
    #[response(
        status = 401,
        description = "No valid token",
        content_type = "application/problem+json"
    )]
    Unauthorized(ProblemBody),
    #[response(
        status = 421,
        description = "`Host` is not a name this server answers to (`--admin-allowed-hosts`)",
        content_type = "application/problem+json"
    )]
    Misdirected(ProblemBody),
    #[response(
        status = 503,
        description = "The store is unavailable; `Retry-After` says when to try again",
        content_type = "application/problem+json"
    )]
    Unavailable(ProblemBody),
}

/// The problems every endpoint that writes with a request body may answer with (OpenAPI only).
#[derive(Debug, utoipa::IntoResponses)]
#[allow(
    dead_code,
    reason = "describes responses for the OpenAPI document; never built"
)]
pub enum WriteProblems {
    #[response(
        status = 400,
        description = "Malformed",
        content_type = "application/problem+json"
    )]
    Malformed(ProblemBody),
    #[response(
        status = 401,
        description = "No valid token",
        content_type = "application/problem+json"
    )]
    Unauthorized(ProblemBody),
    #[response(
        status = 403,
        description = "A read-only token, or a page of another origin (`Origin`)",
        content_type = "application/problem+json"
    )]
    Forbidden(ProblemBody),
    #[response(
        status = 413,
        description = "The body is too large",
        content_type = "application/problem+json"
    )]
    TooLarge(ProblemBody),
    #[response(
        status = 415,
        description = "No `Content-Type`, or neither JSON nor YAML. A JSON body sent as `application/x-www-form-urlencoded` (what `curl -d` sends) is read as JSON, and the answer carries `Warning: 299 - \"...\"`",
        content_type = "application/problem+json"
    )]
    UnsupportedMediaType(ProblemBody),
    #[response(
        status = 421,
        description = "`Host` is not a name this server answers to (`--admin-allowed-hosts`)",
        content_type = "application/problem+json"
    )]
    Misdirected(ProblemBody),
    #[response(
        status = 503,
        description = "The store is unavailable; `Retry-After` says when to try again",
        content_type = "application/problem+json"
    )]
    Unavailable(ProblemBody),
}

/// One problem with a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub struct ProblemItem {
    /// JSON pointer into the request body (`/operations/2/variants/1/constraints`); empty for
    /// the whole body or when `parameter` names the culprit.
    pub pointer: String,
    /// The path or query parameter at fault, if it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter: Option<String>,
    /// The request header at fault, if it is one (`If-Match`, `Host`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// A stable, machine-readable code, e.g. `overlapping_variants`.
    pub code: String,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub operation: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub variant: Option<usize>,
    /// For overlapping variants: a parameter set both match.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub witness: Option<BTreeMap<String, String>>,
}

impl ProblemItem {
    pub fn new(
        pointer: impl Into<String>,
        code: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            pointer: pointer.into(),
            parameter: None,
            header: None,
            code: code.into(),
            message: message.into(),
            operation: None,
            variant: None,
            witness: None,
        }
    }

    /// A problem with a path or query parameter.
    pub fn parameter(name: &str, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            parameter: Some(name.to_owned()),
            ..Self::new("", code, message)
        }
    }

    /// A problem with a request header.
    pub fn header(name: &str, code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            header: Some(name.to_owned()),
            ..Self::new("", code, message)
        }
    }

    /// From a validation problem, with its pointer made relative: `strip` is removed from its
    /// front (a PUT body is one operation of a changeset), and pointers at the type and name
    /// of a PUT or DELETE name the path parameters instead.
    pub fn from_problem(problem: Problem, strip: Option<&str>) -> Self {
        let mut pointer = problem.pointer.to_string();
        let mut parameter = None;
        if let Some(prefix) = strip {
            if let Some(rest) = pointer.strip_prefix(prefix) {
                pointer = rest.to_owned();
            }
            if pointer == "/type" || pointer == "/name" {
                parameter = Some(pointer[1..].to_owned());
                pointer.clear();
            }
        }
        Self {
            pointer,
            parameter,
            header: None,
            code: problem.code,
            message: problem.message,
            operation: if strip.is_some() {
                None
            } else {
                problem.operation
            },
            variant: problem.variant,
            witness: problem.witness.map(|w| w.0),
        }
    }
}

/// Every way a request can fail.
#[derive(Debug)]
pub enum ApiError {
    BadRequest {
        detail: String,
        errors: Vec<ProblemItem>,
    },
    /// A request header that is malformed: 400 naming it.
    BadHeader {
        header: &'static str,
        code: &'static str,
        message: String,
    },
    Unauthorized(String),
    Forbidden(String),
    /// A write from another origin: 403 naming `Origin`.
    CrossOrigin(String),
    NotFound(String),
    /// A revision the history retention pruned: 410, naming the oldest kept one.
    HistoryPruned(String),
    /// 405, with the methods the path allows for `Allow`.
    MethodNotAllowed {
        allow: String,
    },
    Conflict {
        detail: String,
        errors: Vec<ProblemItem>,
    },
    /// A failed `If-Match` or `If-None-Match`: 412.
    PreconditionFailed {
        detail: String,
        errors: Vec<ProblemItem>,
    },
    /// A `Host` this server does not answer to: 421 naming `Host`.
    MisdirectedHost(String),
    PayloadTooLarge {
        limit: usize,
    },
    UnsupportedMediaType(String),
    Invalid {
        detail: String,
        errors: Vec<ProblemItem>,
        warnings: Vec<ProblemItem>,
    },
    Unavailable,
    /// 503 for a reason other than the store: `code` names it; with `Retry-After`.
    Busy {
        code: &'static str,
        detail: String,
    },
    Internal,
}

impl ApiError {
    pub fn bad_parameter(name: &str, code: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        ApiError::BadRequest {
            detail: format!("parameter `{name}`: {message}"),
            errors: vec![ProblemItem::parameter(name, code, message)],
        }
    }

    pub fn bad_header(
        header: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError::BadHeader {
            header,
            code,
            message: message.into(),
        }
    }

    /// From a failed changeset; `strip` as in [`ProblemItem::from_problem`].
    pub fn from_apply(error: ApplyError, strip: Option<&str>) -> Self {
        match error {
            ApplyError::Invalid(invalid) => {
                let count = invalid.errors.len();
                ApiError::Invalid {
                    detail: format!(
                        "the request breaks {count} rule{}; nothing was written",
                        if count == 1 { "" } else { "s" }
                    ),
                    errors: invalid
                        .errors
                        .into_iter()
                        .map(|p| ProblemItem::from_problem(p, strip))
                        .collect(),
                    warnings: invalid
                        .warnings
                        .into_iter()
                        .map(|p| ProblemItem::from_problem(p, strip))
                        .collect(),
                }
            }
            ApplyError::Conflict(conflict) => {
                let mut pointer = conflict.pointer.to_string();
                if let Some(rest) = strip.and_then(|prefix| pointer.strip_prefix(prefix)) {
                    pointer = rest.to_owned();
                }
                let item = ProblemItem {
                    operation: if strip.is_some() {
                        None
                    } else {
                        conflict.operation
                    },
                    ..ProblemItem::new(pointer, "conflict", conflict.message.clone())
                };
                ApiError::Conflict {
                    detail: format!("{}; nothing was written", conflict.message),
                    errors: vec![item],
                }
            }
            ApplyError::Store(e) => e.into(),
        }
    }

    fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::BadHeader { .. } => StatusCode::BAD_REQUEST,
            ApiError::Forbidden(_) | ApiError::CrossOrigin(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::HistoryPruned(_) => StatusCode::GONE,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::Conflict { .. } => StatusCode::CONFLICT,
            ApiError::PreconditionFailed { .. } => StatusCode::PRECONDITION_FAILED,
            ApiError::MisdirectedHost(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::Unavailable | ApiError::Busy { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::BadRequest { .. } => "bad-request",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::BadHeader { .. } => "bad-header",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::CrossOrigin(_) => "cross-origin",
            ApiError::NotFound(_) => "not-found",
            ApiError::HistoryPruned(_) => "history-pruned",
            ApiError::MethodNotAllowed { .. } => "method-not-allowed",
            ApiError::Conflict { .. } => "conflict",
            ApiError::PreconditionFailed { .. } => "precondition-failed",
            ApiError::MisdirectedHost(_) => "misdirected-host",
            ApiError::PayloadTooLarge { .. } => "payload-too-large",
            ApiError::UnsupportedMediaType(_) => "unsupported-media-type",
            ApiError::Invalid { .. } => "validation-failed",
            ApiError::Unavailable | ApiError::Busy { .. } => "unavailable",
            ApiError::Internal => "internal",
        }
    }

    pub fn body(self) -> ProblemBody {
        let status = self.status();
        let problem_type = format!("urn:vxds:problem:{}", self.kind());
        let title = status.canonical_reason().unwrap_or("Error").to_owned();
        let (detail, errors, warnings) = match self {
            ApiError::BadRequest { detail, errors }
            | ApiError::Conflict { detail, errors }
            | ApiError::PreconditionFailed { detail, errors } => (detail, errors, vec![]),
            ApiError::BadHeader {
                header,
                code,
                message,
            } => (
                format!("header `{header}`: {message}"),
                vec![ProblemItem::header(header, code, message)],
                vec![],
            ),
            ApiError::HistoryPruned(detail) => {
                let item = ProblemItem::new("", "history_pruned", detail.clone());
                (detail, vec![item], vec![])
            }
            ApiError::CrossOrigin(detail) => {
                let item = ProblemItem::header("Origin", "cross_origin", detail.clone());
                (detail, vec![item], vec![])
            }
            ApiError::MisdirectedHost(detail) => {
                let item = ProblemItem::header("Host", "host_not_allowed", detail.clone());
                (detail, vec![item], vec![])
            }
            ApiError::UnsupportedMediaType(detail) => {
                let item =
                    ProblemItem::header("Content-Type", "unsupported_media_type", detail.clone());
                (detail, vec![item], vec![])
            }
            ApiError::Invalid {
                detail,
                errors,
                warnings,
            } => (detail, errors, warnings),
            ApiError::Unauthorized(detail)
            | ApiError::Forbidden(detail)
            | ApiError::NotFound(detail) => (detail, vec![], vec![]),
            ApiError::MethodNotAllowed { allow } => (
                format!("this method is not allowed on this path; it allows {allow}"),
                vec![],
                vec![],
            ),
            ApiError::PayloadTooLarge { limit } => (
                format!("the request body is larger than the limit of {limit} bytes"),
                vec![],
                vec![],
            ),
            ApiError::Unavailable => ("the store is unavailable; try again".into(), vec![], vec![]),
            ApiError::Busy { code, detail } => {
                let item = ProblemItem::new("", code, detail.clone());
                (detail, vec![item], vec![])
            }
            ApiError::Internal => (
                "an internal error occurred; it has been logged".into(),
                vec![],
                vec![],
            ),
        };
        ProblemBody {
            problem_type,
            title,
            status: status.as_u16(),
            detail,
            errors,
            warnings,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let unauthorized = matches!(self, ApiError::Unauthorized(_));
        let unavailable = matches!(self, ApiError::Unavailable | ApiError::Busy { .. });
        let allow = match &self {
            ApiError::MethodNotAllowed { allow } => HeaderValue::from_str(allow).ok(),
            _ => None,
        };
        let mut response = (status, axum::Json(self.body())).into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(allow) = allow {
            response.headers_mut().insert(header::ALLOW, allow);
        }
        if unavailable {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        }
        if unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(r#"Bearer realm="vxds""#),
            );
        }
        response
    }
}

impl From<RestoreError> for ApiError {
    fn from(e: RestoreError) -> Self {
        match e {
            RestoreError::NoSuchRevision(_) => ApiError::NotFound(e.to_string()),
            RestoreError::HistoryNotKept { .. } => ApiError::Invalid {
                detail: format!("{e}; nothing was written"),
                errors: vec![ProblemItem::new("", "history_not_kept", e.to_string())],
                warnings: Vec::new(),
            },
            RestoreError::Apply(e) => ApiError::from_apply(e, None),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if let StoreError::HistoryPruned { .. } = e {
            // The client's answer, not a failure.
            return ApiError::HistoryPruned(e.to_string());
        }
        // The chain (with the database's own words) goes to the log only.
        let mut chain = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            chain.push_str(": ");
            chain.push_str(&s.to_string());
            source = s.source();
        }
        match e {
            // Said once when the store went down, not once per refused request.
            StoreError::Down => tracing::debug!(error = %chain, "store down"),
            _ => error!(error = %chain, "store error"),
        }
        match e {
            StoreError::Unavailable(_) | StoreError::Down => ApiError::Unavailable,
            _ => ApiError::Internal,
        }
    }
}
