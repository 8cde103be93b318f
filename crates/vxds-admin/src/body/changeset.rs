//! A changeset body, validated while it arrives: the bulk write path (`POST /v1/changesets`).
//!
//! A JSON body is not collected first. Its pieces go, as they arrive, over a bounded channel to
//! a blocking thread that decodes the changeset one operation at a time and hands each to the
//! stateless rules ([`Checker`]), which keep only what passed, in its validated form (each body
//! encoded once as an `Any`). So neither the body nor the decoded request is ever held whole:
//! a changeset of 100,000 resources costs about its validated form, not several copies of its
//! text. Its size limit is the changeset body limit (`--admin-changeset-body-limit`), larger
//! than other bodies'. A YAML body is read whole and then validated (see [`super::read_body`]).

use std::fmt;
use std::io::{self, Read};

use axum::body::Bytes;
use axum::extract::Request;
use http_body_util::BodyExt;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use tokio::sync::mpsc;
use vxds_envoy::changeset::{
    ChangesetHeader, ChangesetRequest, Checked, Checker, OperationRequest, ValidationConfig,
};

use super::{Format, ReadFormAsJson, format_of, invalid_json, shape_error};
use crate::AdminState;
use crate::problem::ApiError;

/// Pieces of body in flight between the connection and the decoder.
const PIECES_IN_FLIGHT: usize = 8;

/// A changeset request body, checked by every stateless rule.
pub async fn checked(request: Request, state: &AdminState) -> Result<Checked, ApiError> {
    let content_type = super::content_type(&request)?;
    let format = format_of(content_type.as_deref())?;
    let limit = state.changeset_body_limit;
    let marker = request.extensions().get::<ReadFormAsJson>().cloned();
    if super::declared_length(&request).is_some_and(|n| n > limit) {
        return Err(ApiError::PayloadTooLarge { limit });
    }
    let config = state.store.validation().clone();
    if format == Format::Yaml {
        let bytes = super::collect(request, limit).await?;
        let request: ChangesetRequest = super::read_body(content_type.as_deref(), bytes)?;
        return tokio::task::spawn_blocking(move || vxds_envoy::changeset::check(request, &config))
            .await
            .map_err(|_| ApiError::Internal);
    }

    let mut body = request.into_body();
    // The first piece that is not blank decides whether there is a body, and for a form-typed
    // one whether it holds JSON.
    let mut first = Vec::new();
    let mut received = 0usize;
    let first = loop {
        match body.frame().await {
            None => break None,
            Some(frame) => {
                let frame = frame.map_err(read_failed)?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                received += data.len();
                if received > limit {
                    return Err(ApiError::PayloadTooLarge { limit });
                }
                let blank = data.iter().all(u8::is_ascii_whitespace);
                first.push(data);
                if !blank {
                    break Some(first);
                }
            }
        }
    };
    let Some(first) = first else {
        return Err(ApiError::BadRequest {
            detail: "the request needs a body".into(),
            errors: vec![],
        });
    };
    let holds_json = first
        .iter()
        .flat_map(|b| b.iter())
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|b| matches!(b, b'{' | b'['));
    if format == Format::Form {
        if !holds_json {
            return Err(ApiError::UnsupportedMediaType(
                "an application/x-www-form-urlencoded body is read only when it holds JSON \
                 (what curl -d sends); send application/json or application/yaml"
                    .into(),
            ));
        }
        if let Some(marker) = marker {
            marker.mark();
        }
    }

    let (pieces, rx) = mpsc::channel::<Bytes>(PIECES_IN_FLIGHT);
    let decoder = tokio::task::spawn_blocking(move || decode(Pieces::new(rx), &config));
    // What went wrong on this side (the limit, the connection), which explains whatever the
    // decoder then says about a body that ended early.
    let mut failure = None;
    'feed: {
        for piece in first {
            if pieces.send(piece).await.is_err() {
                break 'feed; // the decoder stopped: it says why
            }
        }
        while let Some(frame) = body.frame().await {
            let data = match frame {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue,
                },
                Err(e) => {
                    failure = Some(read_failed(e));
                    break;
                }
            };
            received += data.len();
            if received > limit {
                failure = Some(ApiError::PayloadTooLarge { limit });
                break;
            }
            if pieces.send(data).await.is_err() {
                break;
            }
        }
    }
    drop(pieces);
    let decoded = decoder.await.map_err(|_| ApiError::Internal)?;
    match (failure, decoded) {
        (Some(failure), _) => Err(failure),
        (None, decoded) => decoded,
    }
}

fn read_failed(e: axum::Error) -> ApiError {
    ApiError::BadRequest {
        detail: format!("reading the request body failed: {e}"),
        errors: vec![],
    }
}

/// Decodes and checks a JSON changeset from `reader`.
fn decode(reader: impl Read, config: &ValidationConfig) -> Result<Checked, ApiError> {
    let mut json =
        serde_json::Deserializer::from_reader(io::BufReader::with_capacity(64 << 10, reader));
    let mut track = serde_path_to_error::Track::new();
    let seed = ChangesetSeed {
        checker: Checker::new(config),
    };
    let result = seed.deserialize(serde_path_to_error::Deserializer::new(
        &mut json, &mut track,
    ));
    let (header, checker) = match result {
        Ok(found) => found,
        Err(e) if e.is_data() => return Err(shape_error(&track.path(), e.to_string())),
        Err(e) => return Err(invalid_json(e)),
    };
    json.end().map_err(invalid_json)?;
    Ok(checker.finish(header))
}

/// The body's pieces as a [`Read`], for the decoder's blocking thread.
struct Pieces {
    rx: mpsc::Receiver<Bytes>,
    current: Bytes,
}

impl Pieces {
    fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self {
            rx,
            current: Bytes::new(),
        }
    }
}

impl Read for Pieces {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.rx.blocking_recv() {
                Some(piece) => self.current = piece,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current[..n]);
        let _ = self.current.split_to(n);
        Ok(n)
    }
}

/// The changeset's fields, as [`ChangesetRequest`] reads them.
const FIELDS: &[&str] = &["expected_revision", "dry_run", "message", "operations"];

/// Reads a changeset object, handing each operation to the checker as it is read.
struct ChangesetSeed<'a> {
    checker: Checker<'a>,
}

impl<'de, 'a> DeserializeSeed<'de> for ChangesetSeed<'a> {
    type Value = (ChangesetHeader, Checker<'a>);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_struct("ChangesetRequest", FIELDS, self)
    }
}

impl<'de, 'a> Visitor<'de> for ChangesetSeed<'a> {
    type Value = (ChangesetHeader, Checker<'a>);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("struct ChangesetRequest")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut header = ChangesetHeader::default();
        let mut seen = [false; 4];
        while let Some(key) = map.next_key::<String>()? {
            let Some(field) = FIELDS.iter().position(|f| *f == key) else {
                return Err(de::Error::unknown_field(&key, FIELDS));
            };
            if std::mem::replace(&mut seen[field], true) {
                return Err(de::Error::duplicate_field(FIELDS[field]));
            }
            match field {
                0 => header.expected_revision = map.next_value()?,
                // As the derived reading of `ChangesetRequest`: a boolean, never null.
                1 => header.dry_run = map.next_value::<bool>()?,
                2 => header.message = map.next_value()?,
                _ => map.next_value_seed(Operations {
                    checker: &mut self.checker,
                })?,
            }
        }
        if !seen[3] {
            return Err(de::Error::missing_field("operations"));
        }
        Ok((header, self.checker))
    }
}

/// The `operations` array: each element checked as soon as it is read, then dropped.
struct Operations<'c, 'a> {
    checker: &'c mut Checker<'a>,
}

impl<'de> DeserializeSeed<'de> for Operations<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Operations<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(op) = seq.next_element::<OperationRequest>()? {
            self.checker.push(op);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(text: &str) -> Result<Checked, ApiError> {
        decode(text.as_bytes(), &ValidationConfig::default())
    }

    #[test]
    fn decodes_and_checks_each_operation() {
        let checked = decoded(
            r#"{"operations": [
                {"op": "put", "type": "cluster", "name": "a", "variants": [{"resource":
                    {"@type": "type.googleapis.com/envoy.config.cluster.v3.Cluster", "name": "a"}}]},
                {"op": "delete", "type": "cluster", "name": "b"}
            ], "message": "m", "dry_run": true, "expected_revision": 3}"#,
        )
        .unwrap();
        assert!(checked.errors.is_empty(), "{:?}", checked.errors);
        assert_eq!(checked.changeset.operations.len(), 2);
        assert_eq!(checked.changeset.message.as_deref(), Some("m"));
        assert!(checked.changeset.dry_run);
        assert_eq!(checked.changeset.expected_revision, Some(3));
    }

    #[test]
    fn names_what_does_not_fit() {
        let shape = |text: &str| match decoded(text) {
            Err(ApiError::BadRequest { errors, .. }) => errors[0].pointer.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            shape(r#"{"operations": [{"op": "put", "type": "cluster", "name": 5}]}"#),
            "/operations/0/name"
        );
        for unknown_or_missing in [r#"{"operations": [], "extra": 1}"#, r#"{"message": "m"}"#] {
            match decoded(unknown_or_missing) {
                Err(ApiError::BadRequest { errors, .. }) => assert_eq!(errors[0].code, "malformed"),
                other => panic!("{other:?}"),
            }
        }
        match decoded(r#"{"operations": []"#) {
            Err(ApiError::BadRequest { errors, .. }) => assert_eq!(errors[0].code, "invalid_json"),
            other => panic!("{other:?}"),
        }
        // `dry_run: null` is no boolean: refused, as the YAML body, the CLI and fixtures do.
        match decoded(r#"{"dry_run": null, "operations": []}"#) {
            Err(ApiError::BadRequest { .. }) => {}
            other => panic!("{other:?}"),
        }
        match decoded(r#"{"operations": []} x"#) {
            Err(ApiError::BadRequest { errors, .. }) => assert_eq!(errors[0].code, "invalid_json"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn counts_past_the_operation_limit() {
        let config = ValidationConfig {
            max_operations: 2,
            ..ValidationConfig::default()
        };
        let op = r#"{"op": "delete", "type": "cluster", "name": "x"}"#;
        let text = format!(r#"{{"operations": [{op}, {op}, {op}]}}"#);
        let checked = decode(text.as_bytes(), &config).unwrap();
        assert_eq!(checked.errors.len(), 1);
        assert_eq!(checked.errors[0].code, "too_many_operations");
        assert!(checked.errors[0].message.starts_with("3 operations"));
        assert!(checked.changeset.operations.is_empty());
    }
}
