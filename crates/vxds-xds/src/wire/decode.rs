//! Requests read by hand when they are answers (an ACK, or a NACK without its detail), else
//! by prost: what is accepted and every error are prost's.

use bytes::Buf;
use prost::encoding::WireType;
use prost::{DecodeError, Message};

use vxds_envoy::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};

/// Requests read by hand when they have the shape of an answer (an ACK or a NACK without its
/// detail): the type, the nonce and, on SotW, the version and names. Prost's generated decoder
/// builds the whole message field by field through `Buf` (every string cleared, reserved, copied
/// chunk by chunk and checked), which cost about as much per ACK as the rest of reading it.
/// Anything else — another field, a wire type or length that does not fit, text that is not
/// UTF-8 — is decoded by prost from the start, so what is accepted and every error are prost's.
pub trait FastDecode: Message + Default + Sized {
    /// The message in `bytes` when every field is one this reads; `None` otherwise.
    fn decode_answer(bytes: &[u8]) -> Option<Self>;
}

/// A varint of at most five bytes (every key and length of a request this reads); `None` for
/// a longer or truncated one, which prost then reads.
#[inline]
fn small_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in 0..5 {
        let b = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << (7 * shift);
        if b < 0x80 {
            return Some(value);
        }
    }
    None
}

/// The fields of `bytes`, each `(key, text)` of a length-delimited field holding UTF-8, to
/// `take`, which says whether it reads that key; `None` as soon as one is not.
#[inline]
fn answer_fields<'a>(bytes: &'a [u8], mut take: impl FnMut(u64, &'a str) -> bool) -> Option<()> {
    let mut at = 0;
    while at < bytes.len() {
        let key = small_varint(bytes, &mut at)?;
        if key & 7 != WireType::LengthDelimited as u64 {
            return None;
        }
        let len = usize::try_from(small_varint(bytes, &mut at)?).ok()?;
        let end = at.checked_add(len).filter(|&end| end <= bytes.len())?;
        let text = std::str::from_utf8(&bytes[at..end]).ok()?;
        if !take(key >> 3, text) {
            return None;
        }
        at = end;
    }
    Some(())
}

/// Prost's string merge: a repeated occurrence replaces the value (allocated to size: no
/// reserve and growth, as a `clear` and `push_str` would take).
fn set(field: &mut String, text: &str) {
    *field = text.to_owned();
}

impl FastDecode for DeltaDiscoveryRequest {
    fn decode_answer(bytes: &[u8]) -> Option<Self> {
        let mut request = DeltaDiscoveryRequest::default();
        answer_fields(bytes, |tag, text| {
            match tag {
                2 => set(&mut request.type_url, text),
                6 => set(&mut request.response_nonce, text),
                _ => return false,
            }
            true
        })?;
        Some(request)
    }
}

impl FastDecode for DiscoveryRequest {
    fn decode_answer(bytes: &[u8]) -> Option<Self> {
        let mut request = DiscoveryRequest::default();
        answer_fields(bytes, |tag, text| {
            match tag {
                1 => set(&mut request.version_info, text),
                3 => request.resource_names.push(text.to_owned()),
                4 => set(&mut request.type_url, text),
                5 => set(&mut request.response_nonce, text),
                _ => return false,
            }
            true
        })?;
        Some(request)
    }
}

/// Decodes a request from `buf` (all of it): by hand when it is an answer, else by prost.
pub fn decode_request<T: FastDecode>(buf: &mut impl Buf) -> Result<T, DecodeError> {
    let whole = buf.chunk();
    if whole.len() == buf.remaining()
        && let Some(request) = T::decode_answer(whole)
    {
        buf.advance(whole.len());
        return Ok(request);
    }
    T::decode(buf)
}

#[cfg(test)]
mod tests;
