//! Secret key material is shown only to callers that may see secrets (a `secrets` token, or
//! no tokens configured at all): for everyone else, every answer that carries key material
//! (resources, revision bodies, diffs, resolve, changeset answers, the export; the console
//! reads these) has its private keys, session ticket keys, passwords and generic secrets
//! replaced by [`REDACTED`] — wherever the message that holds them is: in a `Secret`, and
//! inline in a listener's or cluster's TLS context (`tls_certificates`, `session_ticket_keys`).
//! The marker is a string where a `DataSource` object belongs, so a redacted document applied
//! back is refused rather than written as a key. An answer that cannot be redacted is refused
//! (500), never sent as it is.

use axum::body::Body;
use axum::http::header;
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::Value;

/// Marks an answer that cannot hold key material (built from names, versions, counts and
/// problem texts, never from a resource's body): it is passed on as it streams, not collected
/// and searched.
#[derive(Clone, Copy, Debug)]
pub struct HoldsNoKeyMaterial;

/// What stands in for redacted key material.
pub const REDACTED: &str = "<redacted: needs a secrets token>";

/// The fields that hold key material, by the field that holds their message (a
/// `TlsCertificate` in a `Secret` or, repeated, in a `CommonTlsContext`; `TlsSessionTicketKeys`
/// in a `Secret` or a `DownstreamTlsContext`; a `GenericSecret`), in both proto3 JSON spellings.
const KEY_FIELDS: &[(&[&str], &[&str])] = &[
    (
        &[
            "tls_certificate",
            "tlsCertificate",
            "tls_certificates",
            "tlsCertificates",
        ],
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

/// Names that appear in every answer holding key material: an answer without any of them has
/// nothing to redact, and is passed on without being parsed.
const KEY_NAMES: &[&str] = &[
    "private_key",
    "privateKey",
    "pkcs12",
    "password",
    "session_ticket_keys",
    "sessionTicketKeys",
    "generic_secret",
    "genericSecret",
];

/// Redacts the key material in `value`, however deep, in whatever message holds it. Returns
/// whether it changed anything.
pub fn redact_secrets(value: &mut Value) -> bool {
    match value {
        Value::Object(object) => {
            let mut changed = false;
            for (holders, fields) in KEY_FIELDS {
                for holder in *holders {
                    let held: Vec<&mut Value> = match object.get_mut(*holder) {
                        Some(Value::Array(items)) => items.iter_mut().collect(),
                        Some(v @ Value::Object(_)) => vec![v],
                        _ => continue,
                    };
                    for inner in held {
                        let Value::Object(inner) = inner else {
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
    if response.extensions().get::<HoldsNoKeyMaterial>().is_some() {
        return response;
    }
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
        Err(_) => return unredactable(),
    };
    // Most answers hold no key material: leave their bytes alone.
    if !KEY_NAMES
        .iter()
        .any(|name| contains(&bytes, name.as_bytes()))
    {
        return Response::from_parts(parts, Body::from(bytes));
    }
    // Fail closed: an answer that holds key material and cannot be read is not sent.
    let Ok(mut value) = serde_json::from_slice::<Value>(&bytes) else {
        return unredactable();
    };
    if !redact_secrets(&mut value) {
        return Response::from_parts(parts, Body::from(bytes));
    }
    let body = serde_json::to_vec(&value).unwrap_or_default();
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, Body::from(body))
}

/// The answer when redaction could not run: nothing of the original body.
fn unredactable() -> Response {
    let mut response = Response::new(Body::from(
        r#"{"type":"urn:vxds:problem:internal","title":"Internal Server Error","status":500,"detail":"the answer could not be redacted for this token, so it is not sent","code":"redaction_failed"}"#,
    ));
    *response.status_mut() = axum::http::StatusCode::INTERNAL_SERVER_ERROR;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/problem+json"),
    );
    response
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
    }

    const SECRET_TYPE: &str =
        "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";

    #[test]
    fn inline_keys_of_listeners_and_clusters_are_replaced_too() {
        let tls = |context: &str| {
            json!({"name": "envoy.transport_sockets.tls", "typed_config": {
                "@type": format!("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.{context}"),
                "common_tls_context": {"tls_certificates": [{
                    "certificate_chain": {"inline_string": "CERT"},
                    "private_key": {"inline_string": "LISTENER-KEY"}}]},
                "sessionTicketKeys": {"keys": [{"inline_bytes": "TICKETS"}]}}})
        };
        let mut listener = json!({"resource": {
            "@type": "type.googleapis.com/envoy.config.listener.v3.Listener",
            "filter_chains": [{"transport_socket": tls("DownstreamTlsContext")}]}});
        let mut cluster = json!({"resource": {
            "@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            "transportSocket": {"name": "tls", "typedConfig": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "commonTlsContext": {"tlsCertificates": [{"privateKey": {"filename": "/k.pem"},
                    "password": {"inline_string": "PW"}}]}}}}});
        assert!(redact_secrets(&mut listener));
        assert!(redact_secrets(&mut cluster));
        let text = format!("{listener}{cluster}");
        for hidden in ["LISTENER-KEY", "TICKETS", "/k.pem", "\"PW\""] {
            assert!(!text.contains(hidden), "{text}");
        }
        assert!(text.contains("CERT"), "{text}");
    }
}
