//! Secret key material is shown only to callers that may see secrets (a `secrets` token, or
//! no tokens configured at all): for everyone else, every answer that carries a secret's body
//! (resources, revision bodies, diffs, resolve, changeset answers, the export; the console
//! reads these) has its private keys, session ticket keys, passwords and generic secrets
//! replaced by [`REDACTED`]. The marker is a string where a `DataSource` object belongs, so a
//! redacted document applied back is refused rather than written as a key.

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::Value;

/// What stands in for redacted key material.
pub const REDACTED: &str = "<redacted: needs a secrets token>";

const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

/// The fields of a `Secret` that hold key material, by the message that holds them, in both
/// proto3 JSON spellings.
const KEY_FIELDS: &[(&[&str], &[&str])] = &[
    (
        &["tls_certificate", "tlsCertificate"],
        &[
            "private_key",
            "privateKey",
            "pkcs12",
            "password",
            "private_key_provider",
            "privateKeyProvider",
        ],
    ),
    (&["session_ticket_keys", "sessionTicketKeys"], &["keys"]),
    (&["generic_secret", "genericSecret"], &["secret", "secrets"]),
];

/// Redacts the key material of every secret body in `value`, however deep. Returns whether it
/// changed anything.
pub fn redact_secrets(value: &mut Value) -> bool {
    match value {
        Value::Object(object) => {
            let mut changed = false;
            if object.get("@type").and_then(Value::as_str) == Some(SECRET_TYPE) {
                for (holders, fields) in KEY_FIELDS {
                    for holder in *holders {
                        let Some(Value::Object(inner)) = object.get_mut(*holder) else {
                            continue;
                        };
                        for field in *fields {
                            if let Some(v) = inner.get_mut(*field) {
                                *v = Value::String(REDACTED.to_owned());
                                changed = true;
                            }
                        }
                    }
                }
            }
            for v in object.values_mut() {
                changed |= redact_secrets(v);
            }
            changed
        }
        Value::Array(items) => items.iter_mut().fold(false, |c, v| redact_secrets(v) | c),
        _ => false,
    }
}

/// `response` with secret key material redacted, if it is JSON that holds any. Other
/// responses (YAML exports redact as they write; event streams carry no bodies) pass as they
/// are.
pub async fn redact_response(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if !is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => return Response::from_parts(parts, Body::empty()),
    };
    // Most answers hold no secret: leave their bytes alone.
    if !contains(&bytes, SECRET_TYPE.as_bytes()) {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    if !redact_secrets(&mut value) {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let body = serde_json::to_vec(&value).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn key_material_is_replaced_wherever_a_secret_is() {
        let secret = json!({
            "@type": SECRET_TYPE, "name": "a",
            "tls_certificate": {
                "certificate_chain": {"inline_string": "CERT"},
                "private_key": {"inline_string": "KEY"},
            },
        });
        let mut answer = json!({"variants": [{"resource": secret}], "other": {
            "@type": SECRET_TYPE, "sessionTicketKeys": {"keys": [{"inline_bytes": "AAA"}]},
            "genericSecret": {"secret": {"inline_string": "pw"}},
        }});
        assert!(redact_secrets(&mut answer));
        let text = answer.to_string();
        for hidden in ["KEY", "AAA", "\"pw\""] {
            assert!(!text.contains(hidden), "{text}");
        }
        // What is not key material stays: the certificate chain is public.
        assert!(text.contains("CERT"), "{text}");
        assert_eq!(
            answer["variants"][0]["resource"]["tls_certificate"]["private_key"],
            REDACTED
        );
        // Other types are left alone, even with a field of that name.
        let mut cluster = json!({"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
                                 "tls_certificate": {"private_key": "x"}});
        assert!(!redact_secrets(&mut cluster));
    }
}
