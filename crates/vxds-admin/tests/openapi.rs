//! `api/openapi.yaml` is the document the code generates; this fails when they drift.
//! Regenerate with `VXDS_UPDATE_OPENAPI=1 cargo test -p vxds-admin --test openapi` (or
//! `vxds openapi > api/openapi.yaml`).

use std::path::Path;

#[test]
fn the_checked_in_document_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../api/openapi.yaml");
    let generated = vxds_admin::openapi_yaml();
    if std::env::var_os("VXDS_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).expect("writing api/openapi.yaml");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "api/openapi.yaml has drifted from the code; regenerate it with \
         `VXDS_UPDATE_OPENAPI=1 cargo test -p vxds-admin --test openapi`"
    );
}

#[test]
fn every_operation_has_a_unique_id_and_documents_its_errors() {
    let doc = serde_json::to_value(vxds_admin::openapi()).expect("the document serializes");
    let mut ids = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("path item") {
            let id = operation["operationId"].as_str().expect("an operationId");
            assert!(
                ids.insert(id.to_owned()),
                "{method} {path}: duplicate operationId {id}"
            );
            let responses = operation["responses"].as_object().expect("responses");
            assert!(
                responses.keys().any(|s| s.starts_with('2')),
                "{method} {path}: no success response"
            );
        }
    }
    assert_eq!(ids.len(), 21);
}
