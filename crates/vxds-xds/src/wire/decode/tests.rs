//! Requests read by hand against prost's generated decoder: the same message, or the same
//! error.

use super::*;
use prost::encoding::{encode_key, encode_varint};
use vxds_envoy::pb::envoy::config::core::v3::Node;
use vxds_envoy::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DiscoveryRequest, ResourceLocator,
};

/// What prost's generated decoder makes of `bytes`, and what `decode_request` does:
/// the same message, or the same error text.
fn same<T: FastDecode + std::fmt::Debug + PartialEq>(bytes: &[u8]) -> Option<T> {
    let by_prost = T::decode(bytes).map_err(|e| e.to_string());
    let mut buf = bytes;
    let by_hand = decode_request::<T>(&mut buf).map_err(|e| e.to_string());
    assert_eq!(by_hand, by_prost, "{bytes:?}");
    if by_hand.is_ok() {
        assert!(buf.is_empty(), "all of it read");
    }
    by_hand.ok()
}

fn key(tag: u32, wire: WireType) -> Vec<u8> {
    let mut b = Vec::new();
    encode_key(tag, wire, &mut b);
    b
}

fn field(tag: u32, bytes: &[u8]) -> Vec<u8> {
    let mut b = key(tag, WireType::LengthDelimited);
    encode_varint(bytes.len() as u64, &mut b);
    b.extend_from_slice(bytes);
    b
}

const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";

#[test]
fn answers_are_read_by_hand_as_prost_reads_them() {
    let delta = DeltaDiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: "42".into(),
        ..Default::default()
    };
    let bytes = delta.encode_to_vec();
    assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_some());
    assert_eq!(same::<DeltaDiscoveryRequest>(&bytes), Some(delta));
    let sotw = DiscoveryRequest {
        version_info: "7".into(),
        resource_names: vec!["a".into(), String::new(), "c".into()],
        type_url: CDS.into(),
        response_nonce: "43".into(),
        ..Default::default()
    };
    let bytes = sotw.encode_to_vec();
    assert!(DiscoveryRequest::decode_answer(&bytes).is_some());
    assert_eq!(same::<DiscoveryRequest>(&bytes), Some(sotw));
    // Empty, and fields written with their default (prost skips them; a client may not).
    assert_eq!(same::<DiscoveryRequest>(&[]), Some(Default::default()));
    let mut bytes = field(2, b"");
    bytes.extend(field(6, b""));
    assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_some());
    assert_eq!(
        same::<DeltaDiscoveryRequest>(&bytes),
        Some(Default::default())
    );
}

#[test]
fn a_repeated_field_replaces_and_names_accumulate() {
    let mut bytes = field(2, b"first");
    bytes.extend(field(6, b"1"));
    bytes.extend(field(2, CDS.as_bytes()));
    bytes.extend(field(6, b"2"));
    let request = same::<DeltaDiscoveryRequest>(&bytes).unwrap();
    assert_eq!(
        (request.type_url.as_str(), request.response_nonce.as_str()),
        (CDS, "2")
    );
    let mut bytes = field(3, b"x");
    bytes.extend(field(1, b"v1"));
    bytes.extend(field(3, b"y"));
    bytes.extend(field(1, b"v2"));
    let request = same::<DiscoveryRequest>(&bytes).unwrap();
    assert_eq!(request.resource_names, vec!["x".to_owned(), "y".to_owned()]);
    assert_eq!(request.version_info, "v2");
}

#[test]
fn a_non_minimal_varint_reads_the_same() {
    // Key 18 (field 2, length-delimited) and length 3, each in two bytes.
    let bytes = [0x92, 0x00, 0x83, 0x00, b'a', b'b', b'c'];
    assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_some());
    assert_eq!(
        same::<DeltaDiscoveryRequest>(&bytes).unwrap().type_url,
        "abc"
    );
}

#[test]
fn other_fields_and_unknown_ones_go_to_prost() {
    let full = DeltaDiscoveryRequest {
        node: Some(Node {
            id: "n".into(),
            ..Default::default()
        }),
        type_url: CDS.into(),
        resource_names_subscribe: vec!["a".into()],
        resource_names_unsubscribe: vec!["b".into()],
        initial_resource_versions: [("a".to_owned(), "1".to_owned())].into(),
        response_nonce: "3".into(),
        error_detail: Some(vxds_envoy::pb::google::rpc::Status {
            code: 3,
            message: "no".into(),
            details: vec![],
        }),
        resource_locators_subscribe: vec![ResourceLocator {
            name: "c".into(),
            dynamic_parameters: [("k".to_owned(), "v".to_owned())].into(),
        }],
        resource_locators_unsubscribe: vec![],
    };
    let bytes = full.encode_to_vec();
    assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_none());
    assert_eq!(same::<DeltaDiscoveryRequest>(&bytes), Some(full));
    let full = DiscoveryRequest {
        version_info: "1".into(),
        node: Some(Node {
            id: "n".into(),
            ..Default::default()
        }),
        resource_names: vec!["a".into()],
        resource_locators: vec![ResourceLocator {
            name: "c".into(),
            ..Default::default()
        }],
        type_url: CDS.into(),
        response_nonce: "2".into(),
        error_detail: None,
    };
    let bytes = full.encode_to_vec();
    assert!(DiscoveryRequest::decode_answer(&bytes).is_none());
    assert_eq!(same::<DiscoveryRequest>(&bytes), Some(full));
    // Unknown fields of every wire type, before and after the ones read: skipped.
    let mut bytes = field(2, CDS.as_bytes());
    bytes.extend(key(100, WireType::Varint));
    encode_varint(300, &mut bytes);
    bytes.extend(field(101, b"unknown"));
    bytes.extend(key(102, WireType::ThirtyTwoBit));
    bytes.extend([1, 2, 3, 4]);
    bytes.extend(key(103, WireType::SixtyFourBit));
    bytes.extend([1, 2, 3, 4, 5, 6, 7, 8]);
    bytes.extend(field(6, b"9"));
    assert!(DeltaDiscoveryRequest::decode_answer(&bytes).is_none());
    let request = same::<DeltaDiscoveryRequest>(&bytes).unwrap();
    assert_eq!(
        (request.type_url.as_str(), request.response_nonce.as_str()),
        (CDS, "9")
    );
    // A field read by hand, with another wire type: prost's error.
    let mut bytes = key(2, WireType::Varint);
    encode_varint(1, &mut bytes);
    assert!(same::<DeltaDiscoveryRequest>(&bytes).is_none());
    // A packed-looking repeated string (one length-delimited run): a single name.
    let bytes = field(3, b"\x01a\x01b");
    assert_eq!(
        same::<DiscoveryRequest>(&bytes).unwrap().resource_names,
        vec!["\u{1}a\u{1}b".to_owned()]
    );
}

#[test]
fn malformed_input_fails_as_prost_fails() {
    let good = DeltaDiscoveryRequest {
        type_url: CDS.into(),
        response_nonce: "12345".into(),
        ..Default::default()
    }
    .encode_to_vec();
    // Every truncation: a length past the end, a varint cut short.
    for end in 0..good.len() {
        same::<DeltaDiscoveryRequest>(&good[..end]);
        same::<DiscoveryRequest>(&good[..end]);
    }
    let cases: Vec<Vec<u8>> = vec![
        field(2, b"\xff\xfe"), // not UTF-8
        field(4, b"\xc3"),     // not UTF-8, SotW's type
        vec![
            0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ], // bad varint
        vec![0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01], // a six-byte length
        vec![0x02, 0x00],      // field 0
        vec![0x12, 0x05, b'a'], // length past the end
        vec![0x0f],            // wire type 7
        vec![0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80], // endless key
    ];
    for bytes in &cases {
        assert!(same::<DeltaDiscoveryRequest>(bytes).is_none(), "{bytes:?}");
        same::<DiscoveryRequest>(bytes);
    }
}

#[test]
fn random_bytes_decode_as_prost_decodes_them() {
    // A fixed pseudo-random walk over short messages of the fields read by hand and a
    // few others, mutated byte by byte.
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let pieces: Vec<Vec<u8>> = vec![
        field(1, b"v"),
        field(2, CDS.as_bytes()),
        field(3, b"name"),
        field(4, b"t"),
        field(5, b"5"),
        field(6, b"6"),
        field(7, b""),
        field(9, b"\xc3\xa9"),
    ];
    for _ in 0..20_000 {
        let mut bytes = Vec::new();
        for _ in 0..(next() % 4) {
            bytes.extend(&pieces[(next() % pieces.len() as u64) as usize]);
        }
        for _ in 0..(next() % 3) {
            if !bytes.is_empty() {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
        }
        same::<DeltaDiscoveryRequest>(&bytes);
        same::<DiscoveryRequest>(&bytes);
    }
}
