//! gRPC on a policy route: a call's outcome is its `grpc-status` (in the headers of a
//! trailers-only answer, else in the trailers), not the HTTP status, which is 200 for failures
//! too; the gateway's own answers are trailers-only gRPC answers with a fitting code; the
//! fingerprint covers the decoded messages, not their framing or compression.

use crate::policy::KeyPolicy;
use crate::request::RequestView;
use std::io::Read;

pub use crate::codes::grpc_code as code;

/// Whether a request is gRPC: `content-type: application/grpc` (`+proto`, `+json`, …).
pub fn is_grpc(req: &dyn RequestView) -> bool {
    req.first_header_value("content-type").is_some_and(is_grpc_content_type)
}

pub fn is_grpc_content_type(value: &[u8]) -> bool {
    let v = value.trim_ascii();
    let prefix = b"application/grpc";
    v.len() >= prefix.len()
        && v[..prefix.len()].eq_ignore_ascii_case(prefix)
        && matches!(v.get(prefix.len()), None | Some(b'+' | b';'))
}

/// What a call's `grpc-status` does to its claim, by the policy's lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Remembered and replayed (OK, and answers that are the service's final word).
    Completed,
    /// The call failed and did not happen (UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, …): released.
    Failed,
    /// It may have happened (DEADLINE_EXCEEDED, CANCELLED after forwarding): held as unknown.
    Unknown,
}

pub fn outcome(policy: &KeyPolicy, status: u32) -> Outcome {
    if policy.grpc_unknown.contains(&status) {
        Outcome::Unknown
    } else if policy.grpc_remember.contains(&status) {
        Outcome::Completed
    } else {
        Outcome::Failed
    }
}

/// The gRPC code of one of the gateway's own answers (its stable code and HTTP status): never
/// `UNKNOWN`, and `INTERNAL` only for the gateway's own misconfiguration.
pub fn status_for(code: &str, http_status: u16) -> u32 {
    match crate::codes::ErrorCode::parse(code) {
        // Retryable ones are UNAVAILABLE (grpc-retry-pushback-ms says when); ones a caller must
        // check first FAILED_PRECONDITION, not retried by common retry policies.
        Some(ours) => ours.grpc(),
        None if code.starts_with("IDEMPOTENCY_") => code::INVALID_ARGUMENT,
        // The route's duplicate response (its own code).
        None if http_status < 300 => code::OK,
        None => code::ALREADY_EXISTS,
    }
}

/// `grpc-status-details-bin`: a `google.rpc.Status` with one `google.rpc.ErrorInfo` (reason: the
/// stable code, domain `idem`, metadata such as `first_seen_at`), protobuf-encoded, base64
/// (unpadded, as gRPC writes binary metadata).
pub fn status_details(status: u32, message: &str, reason: &str, metadata: &[(&str, String)]) -> String {
    let mut info = Vec::new();
    put_bytes(&mut info, 1, reason.as_bytes());
    put_bytes(&mut info, 2, b"idem");
    for (k, v) in metadata {
        let mut entry = Vec::new();
        put_bytes(&mut entry, 1, k.as_bytes());
        put_bytes(&mut entry, 2, v.as_bytes());
        put_bytes(&mut info, 3, &entry);
    }
    let mut any = Vec::new();
    put_bytes(&mut any, 1, b"type.googleapis.com/google.rpc.ErrorInfo");
    put_bytes(&mut any, 2, &info);
    let mut out = Vec::new();
    if status != 0 {
        out.push(0x08); // field 1, varint
        put_varint(&mut out, u64::from(status));
    }
    put_bytes(&mut out, 2, message.as_bytes());
    put_bytes(&mut out, 3, &any);
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD_NO_PAD.encode(out)
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field.
fn put_bytes(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    put_varint(out, u64::from(field << 3 | 2));
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// How many complete messages a (possibly partial) request body holds: a second one means a
/// client- or bidi-streaming call, which the gateway passes through unprotected rather than hold
/// an open-ended stream until its half-close.
pub fn complete_messages(body: &[u8]) -> usize {
    let mut count = 0;
    let mut rest = body;
    while let Some((head, tail)) = rest.split_at_checked(5) {
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let Some((_, tail)) = tail.split_at_checked(len) else {
            break;
        };
        count += 1;
        rest = tail;
    }
    count
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageError {
    /// A frame's length runs past the body, or the body ends inside a frame header.
    Framing,
    /// A compressed frame in an encoding the gateway does not decode (only `gzip`, and
    /// `identity`), or one that does not decompress.
    Encoding(String),
    /// The decoded messages exceed the route's body limit.
    TooLarge,
}

/// The request's messages, decoded: frame headers stripped, `gzip` frames decompressed, each
/// message length-prefixed, so the fingerprint sees what the service will read, however it was
/// framed or compressed. Bounded by `limit` bytes in all.
pub fn decoded_messages(req: &dyn RequestView, limit: usize) -> Result<Vec<u8>, MessageError> {
    let body = req.body().unwrap_or_default();
    let encoding = req.first_header_value("grpc-encoding").map(|v| String::from_utf8_lossy(v).to_ascii_lowercase());
    let mut out = Vec::with_capacity(body.len());
    let mut rest = body;
    while !rest.is_empty() {
        let (head, tail) = rest.split_at_checked(5).ok_or(MessageError::Framing)?;
        let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
        let (frame, tail) = tail.split_at_checked(len).ok_or(MessageError::Framing)?;
        let message = match (head[0], encoding.as_deref()) {
            (0, _) => frame.to_vec(),
            (1, Some("gzip")) => {
                let mut decoded = Vec::new();
                let room = limit.saturating_sub(out.len()) as u64 + 1;
                flate2::read::GzDecoder::new(frame)
                    .take(room)
                    .read_to_end(&mut decoded)
                    .map_err(|e| MessageError::Encoding(format!("gzip: {e}")))?;
                decoded
            }
            (1, other) => return Err(MessageError::Encoding(other.unwrap_or("none").to_string())),
            (flag, _) => return Err(MessageError::Encoding(format!("compressed flag {flag}"))),
        };
        out.extend_from_slice(&(message.len() as u64).to_le_bytes());
        out.extend_from_slice(&message);
        if out.len() > limit {
            return Err(MessageError::TooLarge);
        }
        rest = tail;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn content_types() {
        for yes in [&b"application/grpc"[..], b"application/grpc+proto", b"Application/GRPC; charset=x"] {
            assert!(is_grpc_content_type(yes), "{yes:?}");
        }
        for no in [&b"application/grpc-web"[..], b"application/json", b"application/grpcx"] {
            assert!(!is_grpc_content_type(no), "{no:?}");
        }
    }

    #[test]
    fn complete_messages_counts_whole_frames_only() {
        let frame = |n: u8| [&[0u8, 0, 0, 0, n][..], &vec![7u8; n as usize]].concat();
        assert_eq!(complete_messages(b""), 0);
        assert_eq!(complete_messages(&frame(3)), 1);
        assert_eq!(complete_messages(&[frame(3), frame(0)].concat()), 2);
        // A second frame still arriving is not counted yet.
        assert_eq!(complete_messages(&[frame(3), frame(4)[..6].to_vec()].concat()), 1);
        assert_eq!(complete_messages(&frame(4)[..3]), 0);
    }

    #[test]
    fn details_are_a_google_rpc_status() {
        use base64::Engine as _;
        let d = status_details(6, "dup", "DUPLICATE_REQUEST", &[("first_seen_at", "t".into())]);
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD.decode(d).unwrap();
        assert_eq!(&bytes[..2], &[0x08, 6]);
        let url = b"type.googleapis.com/google.rpc.ErrorInfo";
        assert!(bytes.windows(url.len()).any(|w| w == url));
        assert!(bytes.windows(17).any(|w| w == b"DUPLICATE_REQUEST"));
    }
}
