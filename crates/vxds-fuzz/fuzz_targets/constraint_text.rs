//! The compact constraint syntax (`env = "prod" && !exists(version)`), the canonical form and
//! the protobuf and proto3 JSON forms.
//!
//! Properties, for every text that parses: printing and parsing again gives the identical
//! tree; the canonical form is a fixed point (its text parses to itself, with the same id) and
//! means the same as the tree (both match the same parameter sets); the binary and JSON
//! protobuf forms give the tree back. For every text that does not: the error's position is a
//! character boundary of the input, with the line and column that position has.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use vxds_core::{Constraints, Limits};
use vxds_envoy::constraints as proto;
use vxds_envoy::pb::envoy::service::discovery::v3::DynamicParameterConstraints;
use vxds_fuzz::{named_values, parameter_sets};

/// Parameter sets compared per input: enough for every combination of three keys with a few
/// values each.
const MAX_PARAMETER_SETS: usize = 256;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let limits = Limits::DEFAULT;
    let parsed = match Constraints::parse(text, &limits) {
        Ok(parsed) => parsed,
        Err(e) => {
            assert!(text.is_char_boundary(e.offset), "{text:?}: {e:?}");
            let before = &text[..e.offset];
            assert_eq!(e.line, before.matches('\n').count() + 1, "{text:?}: {e:?}");
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            assert_eq!(e.column, before[line_start..].chars().count() + 1, "{e:?}");
            return;
        }
    };

    let printed = parsed.to_string();
    let reparsed = Constraints::parse(&printed, &limits)
        .unwrap_or_else(|e| panic!("{text:?} prints as {printed:?}, which does not parse: {e}"));
    assert_eq!(reparsed, parsed, "{text:?} -> {printed:?}");
    assert_eq!(reparsed.to_string(), printed, "{text:?}");

    let canonical = parsed.canonical();
    let canonical_text = canonical.to_string();
    let from_canonical = Constraints::parse(&canonical_text, &limits)
        .unwrap_or_else(|e| panic!("{text:?}: canonical {canonical_text:?} does not parse: {e}"));
    assert_eq!(&from_canonical, canonical.constraints(), "{text:?}");
    let recanonical = from_canonical.canonical();
    assert_eq!(
        recanonical, canonical,
        "{text:?}: canonical form is not a fixed point"
    );
    assert_eq!(recanonical.id(), canonical.id(), "{text:?}");
    assert_eq!(recanonical.to_string(), canonical_text, "{text:?}");
    assert!(canonical.keys().is_subset(&parsed.keys()), "{text:?}");
    assert_eq!(canonical.written_keys(), parsed.keys(), "{text:?}");

    if let Some(root) = parsed.root() {
        for params in parameter_sets(&named_values(root), MAX_PARAMETER_SETS) {
            assert_eq!(
                canonical.matches(&params),
                parsed.matches(&params),
                "{text:?} and its canonical form {canonical_text:?} disagree on {params:?}"
            );
        }
    }

    // Binary protobuf, as the ADS server sends it, and proto3 JSON, as changesets may carry it.
    let message = proto::constraints_to_proto(&parsed);
    let bytes = message.as_ref().map(Message::encode_to_vec);
    let decoded = bytes.map(|b| {
        DynamicParameterConstraints::decode(b.as_slice())
            .unwrap_or_else(|e| panic!("{text:?}: encoded message is refused: {e}"))
    });
    let from_proto = proto::constraints_from_proto(decoded.as_ref(), &limits)
        .unwrap_or_else(|e| panic!("{text:?}: from protobuf: {e}"));
    assert_eq!(from_proto, parsed, "{text:?}");
    let json = proto::constraints_to_json(&parsed);
    let from_json = proto::constraints_from_json(&json, &limits)
        .unwrap_or_else(|e| panic!("{text:?}: from {json}: {e}"));
    assert_eq!(from_json, parsed, "{text:?}");
});
