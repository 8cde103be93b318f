//! Changeset bodies (`POST /v1/changesets`) as the admin API reads them — JSON, YAML, or JSON
//! sent as a form — and the stateless validation every write goes through.
//!
//! The first byte picks the `Content-Type`, the rest is the body. Properties: a body is either
//! read or refused with a 400 or 415 whose pointers are RFC 6901 pointers into the body; a
//! body that is read serialises and reads back as the same request; validating it never
//! panics, and every error and warning carries a pointer that resolves in the request (at
//! least up to its last segment, which may name a missing field), inside the operation and
//! variant it names; what validates is keyed by names in normal form.
#![no_main]

use axum::body::Bytes;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use vxds_admin::{ApiError, ProblemItem, read_body};
use vxds_core::xdstp;
use vxds_envoy::changeset::{
    ChangesetRequest, OperationRequest, Problem, ValidationConfig, validate_standalone,
};
use vxds_fuzz::{is_json_pointer, resolved_depth, segments, starts_with};
use vxds_store::ApplyError;

const CONTENT_TYPES: [&str; 3] = [
    "application/json",
    "application/yaml",
    "application/x-www-form-urlencoded",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let content_type = CONTENT_TYPES[usize::from(selector) % CONTENT_TYPES.len()];
    match read_body::<ChangesetRequest>(Some(content_type), Bytes::copy_from_slice(body)) {
        Ok(request) => check_request(request),
        Err(error) => check_refusal(error, content_type, body),
    }
});

fn check_refusal(error: ApiError, content_type: &str, body: &[u8]) {
    let problem = error.body();
    assert!(
        matches!(problem.status, 400 | 415),
        "a body is refused with {}: {problem:?}",
        problem.status
    );
    // The document as JSON, where it is JSON, to resolve the pointers in.
    let doc = (content_type != "application/yaml")
        .then(|| serde_json::from_slice::<Value>(body).ok())
        .flatten();
    for item in &problem.errors {
        check_pointer(&item.pointer, doc.as_ref(), item);
    }
}

fn check_pointer(pointer: &str, doc: Option<&Value>, item: &ProblemItem) {
    assert!(is_json_pointer(pointer), "not a JSON pointer: {item:?}");
    if let Some(doc) = doc {
        let depth = segments(pointer).len();
        assert!(
            resolved_depth(doc, pointer) + 1 >= depth,
            "{item:?} points past what {doc} holds"
        );
    }
}

fn check_request(request: ChangesetRequest) {
    let doc = serde_json::to_value(&request).expect("a request serialises");
    // What was read is what it writes back as.
    let text = serde_json::to_vec(&request).expect("a request serialises");
    let again: ChangesetRequest = read_body(Some("application/json"), Bytes::from(text))
        .unwrap_or_else(|e| panic!("{request:?} does not read back: {:?}", e.body()));
    assert_eq!(again, request);

    let config = ValidationConfig {
        trusted_keys: vec!["identity".into()],
        ..ValidationConfig::default()
    };
    match validate_standalone(&request, &config) {
        Ok(validated) => {
            validated
                .warnings
                .iter()
                .for_each(|p| check_problem(p, &request, &doc));
            for op in &validated.changeset.operations {
                let asked = match &request.operations[op.index] {
                    OperationRequest::Put(put) => &put.name,
                    OperationRequest::Delete(delete) => &delete.name,
                };
                let normal = xdstp::normalize(&op.key.name)
                    .unwrap_or_else(|e| panic!("stored name {:?} is refused: {e}", op.key.name));
                assert_eq!(normal, op.key.name.as_str(), "not in normal form");
                assert_eq!(
                    xdstp::normalize(asked).ok().as_deref(),
                    Some(op.key.name.as_str()),
                    "operation {} asked for {asked:?}",
                    op.index
                );
            }
        }
        Err(invalid) => {
            assert!(!invalid.errors.is_empty(), "refused without an error");
            for p in invalid.errors.iter().chain(&invalid.warnings) {
                check_problem(p, &request, &doc);
            }
            // The problem document the API answers with.
            let body = ApiError::from_apply(ApplyError::Invalid(invalid), None).body();
            assert_eq!(body.status, 422);
            serde_json::to_string(&body).expect("a problem document serialises");
        }
    }
}

fn check_problem(problem: &Problem, request: &ChangesetRequest, doc: &Value) {
    let pointer = problem.pointer.as_str();
    assert!(is_json_pointer(pointer), "not a JSON pointer: {problem:?}");
    if let Some(i) = problem.operation {
        let op = request
            .operations
            .get(i)
            .unwrap_or_else(|| panic!("{problem:?} names a missing operation"));
        let index = i.to_string();
        assert!(
            starts_with(pointer, &["operations", &index]),
            "{problem:?} is not inside its operation"
        );
        if let Some(j) = problem.variant {
            let OperationRequest::Put(put) = op else {
                panic!("{problem:?} names a variant of a delete");
            };
            assert!(
                j < put.variants.len(),
                "{problem:?} names a missing variant"
            );
            let variant = j.to_string();
            assert!(
                starts_with(pointer, &["operations", &index, "variants", &variant]),
                "{problem:?} is not inside its variant"
            );
        }
    }
    let depth = segments(pointer).len();
    assert!(
        resolved_depth(doc, pointer) + 1 >= depth,
        "{problem:?} points past what {doc} holds"
    );
}
