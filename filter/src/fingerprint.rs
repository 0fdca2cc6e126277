//! The request fingerprint: what must be identical for a repeat to count as the same request.
//!
//! The digest is xxh3-128, not a cryptographic hash: a fingerprint only tells two payloads of one
//! caller's key apart (the scope keeps callers apart, and a caller who forges a collision gets
//! its own first answer back), and xxh3 reads a body at memory speed where SHA-256 in Wasm took
//! ~2.7 ns a byte. Records written before hold SHA-256 ([`legacy_fingerprint`]), which is taken
//! only when such a record is found ([`crate::store::Claim::resolve_legacy`]).

use crate::key::{self, KeyError, RequestView};
use crate::policy::{FingerprintBody, FingerprintPart, KeyPolicy, PathTemplate, Source};
use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::Xxh3Default;

/// The fingerprint of nothing: a policy with `fingerprint = []` (every repeat is the same
/// request), a token lookup, a process-local mark. Stored records compare by it like any other.
pub const NONE: [u8; 32] = [0; 32];

/// A digest the parts are fed to.
trait Absorb: Sized {
    fn absorb(&mut self, bytes: &[u8]);
    fn finish(self) -> [u8; 32];
}

impl Absorb for Xxh3Default {
    fn absorb(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
    /// The 128-bit digest in the first 16 bytes (what records keep).
    fn finish(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out[..16].copy_from_slice(&self.digest128().to_le_bytes());
        out
    }
}

impl Absorb for Sha256 {
    fn absorb(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
    fn finish(self) -> [u8; 32] {
        self.finalize().into()
    }
}

/// A value, length first, so that parts never run into each other.
fn put(h: &mut impl Absorb, bytes: &[u8]) {
    h.absorb(&(bytes.len() as u64).to_le_bytes());
    h.absorb(bytes);
}

/// xxh3-128 over the configured parts (in the first 16 bytes); all zeros when the policy turns
/// the check off. `path` is
/// the request path as the route's matcher names it ([`crate::policy::Matcher::canonical_path`]),
/// so two aliases of one endpoint are one request. A JSON body (or part) that names a member
/// twice is ambiguous, as for body keys.
///
/// A gRPC call's body is its messages, decoded ([`crate::grpc::decoded_messages`]: frame headers
/// stripped, `gzip` decompressed, at most `max_body` bytes), so the same message sent compressed
/// or not is the same request.
pub fn fingerprint(
    policy: &KeyPolicy,
    template: Option<&PathTemplate>,
    req: &dyn RequestView,
    path: &str,
    max_body: usize,
) -> Result<[u8; 32], KeyError> {
    digest(Xxh3Default::new(), policy, template, req, path, max_body)
}

/// The SHA-256 fingerprint records of earlier versions hold (the same parts, the same framing):
/// taken only to compare with such a record.
pub fn legacy_fingerprint(
    policy: &KeyPolicy,
    template: Option<&PathTemplate>,
    req: &dyn RequestView,
    path: &str,
    max_body: usize,
) -> Result<[u8; 32], KeyError> {
    digest(Sha256::new(), policy, template, req, path, max_body)
}

/// The parts through `h`; all zeros when the policy turns the check off.
fn digest(
    mut h: impl Absorb,
    policy: &KeyPolicy,
    template: Option<&PathTemplate>,
    req: &dyn RequestView,
    path: &str,
    max_body: usize,
) -> Result<[u8; 32], KeyError> {
    if policy.fingerprint.is_empty() {
        return Ok(NONE);
    }
    absorb_parts(&mut h, policy, template, req, path, max_body)?;
    Ok(h.finish())
}

fn absorb_parts(
    h: &mut impl Absorb,
    policy: &KeyPolicy,
    template: Option<&PathTemplate>,
    req: &dyn RequestView,
    path: &str,
    max_body: usize,
) -> Result<(), KeyError> {
    let query = req.path().split_once('?').map(|(_, q)| q).unwrap_or("");
    for part in &policy.fingerprint {
        match part {
            FingerprintPart::Method => {
                // Methods arrive upper-case; the copy is made only for the odd one that is not.
                let method = req.method();
                if method.bytes().any(|b| b.is_ascii_lowercase()) {
                    put(h, method.to_ascii_uppercase().as_bytes())
                } else {
                    put(h, method.as_bytes())
                }
            }
            FingerprintPart::Path => put(h, path.as_bytes()),
            FingerprintPart::Query => put(h, query.as_bytes()),
            FingerprintPart::Header(name) => {
                let values = req.header_values(name);
                h.absorb(&(values.len() as u64).to_le_bytes());
                for v in values {
                    put(h, v);
                }
            }
            FingerprintPart::Body if crate::grpc::is_grpc(req) => {
                let messages = crate::grpc::decoded_messages(req, max_body).map_err(|e| {
                    KeyError::Invalid(match e {
                        crate::grpc::MessageError::Framing => "the gRPC body is not whole length-prefixed messages".into(),
                        crate::grpc::MessageError::Encoding(enc) => {
                            format!("a gRPC message is compressed with {enc}, which the gateway does not decode (gzip, identity)")
                        }
                        crate::grpc::MessageError::TooLarge => {
                            format!("the gRPC messages exceed {max_body} bytes once decompressed")
                        }
                    })
                })?;
                put(h, &messages);
            }
            FingerprintPart::Body => {
                let body = req.body().unwrap_or_default();
                match policy.fingerprint_body {
                    FingerprintBody::Raw => put(h, body),
                    FingerprintBody::CanonicalJson => match crate::json::canonical(body) {
                        Ok(c) => put(h, &c),
                        // Not JSON: hashed as it is.
                        Err(crate::json::PointerError::NotJson(_)) => put(h, body),
                        Err(crate::json::PointerError::Ambiguous(m)) => return Err(ambiguous(&m, "")),
                    },
                }
            }
            FingerprintPart::Value(source) => {
                let value = match source {
                    Source::CloudEvent(a) if a == "data" => crate::cloudevents::data(req)?,
                    // A body part is any JSON value, objects included, in canonical form.
                    Source::Body(pointer) => match crate::json::canonical_at(req.body().unwrap_or_default(), pointer) {
                        Ok(v) => v,
                        Err(crate::json::PointerError::NotJson(_)) => None,
                        Err(crate::json::PointerError::Ambiguous(m)) => return Err(ambiguous(&m, pointer)),
                    },
                    _ => key::read(source, template, req)?.map(String::into_bytes),
                };
                // Absent is hashed apart from every present value.
                match value {
                    Some(v) => {
                        h.absorb(&[1]);
                        put(h, &v);
                    }
                    None => h.absorb(&[0]),
                }
            }
        }
    }
    Ok(())
}

fn ambiguous(member: &str, pointer: &str) -> KeyError {
    KeyError::Invalid(format!(
        "the JSON body names {member:?} twice{}; which one counts is ambiguous",
        if pointer.is_empty() { String::new() } else { format!(" under {pointer}") }
    ))
}
