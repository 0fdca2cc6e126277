//! The request fingerprint: what must be identical for a repeat to count as the same request.

use crate::key::{self, put, KeyError, RequestView};
use crate::policy::{FingerprintBody, FingerprintPart, KeyPolicy, PathTemplate, Source};
use sha2::{Digest, Sha256};

/// SHA-256 over the configured parts; all zeros when the policy turns the check off. `path` is
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
    if policy.fingerprint.is_empty() {
        return Ok([0; 32]);
    }
    let mut h = Sha256::new();
    let query = req.path().split_once('?').map(|(_, q)| q).unwrap_or("");
    for part in &policy.fingerprint {
        match part {
            FingerprintPart::Method => put(&mut h, req.method().to_ascii_uppercase().as_bytes()),
            FingerprintPart::Path => put(&mut h, path.as_bytes()),
            FingerprintPart::Query => put(&mut h, query.as_bytes()),
            FingerprintPart::Header(name) => {
                let values = req.header_values(name);
                h.update((values.len() as u64).to_le_bytes());
                for v in values {
                    put(&mut h, v);
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
                put(&mut h, &messages);
            }
            FingerprintPart::Body => {
                let body = req.body().unwrap_or_default();
                match policy.fingerprint_body {
                    FingerprintBody::Raw => put(&mut h, body),
                    FingerprintBody::CanonicalJson => match crate::json::canonical(body) {
                        Ok(c) => put(&mut h, &c),
                        // Not JSON: hashed as it is.
                        Err(crate::json::PointerError::NotJson(_)) => put(&mut h, body),
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
                        h.update([1]);
                        put(&mut h, &v);
                    }
                    None => h.update([0]),
                }
            }
        }
    }
    Ok(h.finalize().into())
}

fn ambiguous(member: &str, pointer: &str) -> KeyError {
    KeyError::Invalid(format!(
        "the JSON body names {member:?} twice{}; which one counts is ambiguous",
        if pointer.is_empty() { String::new() } else { format!(" under {pointer}") }
    ))
}
