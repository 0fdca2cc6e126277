//! The request fingerprint: what must be identical for a repeat to count as the same request.

use crate::key::{put, RequestView};
use crate::policy::{FingerprintBody, FingerprintPart, KeyPolicy};
use sha2::{Digest, Sha256};

/// SHA-256 over the configured parts; all zeros when the policy turns the check off. `path` is
/// the request path as the route's matcher names it ([`crate::policy::Matcher::canonical_path`]),
/// so two aliases of one endpoint are one request.
pub fn fingerprint(policy: &KeyPolicy, req: &dyn RequestView, path: &str) -> [u8; 32] {
    if policy.fingerprint.is_empty() {
        return [0; 32];
    }
    let mut h = Sha256::new();
    let query = req.path().split_once('?').map(|(_, q)| q).unwrap_or("");
    for part in &policy.fingerprint {
        match part {
            FingerprintPart::Method => put(&mut h, req.method().as_bytes()),
            FingerprintPart::Path => put(&mut h, path.as_bytes()),
            FingerprintPart::Query => put(&mut h, query.as_bytes()),
            FingerprintPart::Header(name) => {
                let values = req.header_values(name);
                h.update((values.len() as u64).to_le_bytes());
                for v in values {
                    put(&mut h, v);
                }
            }
            FingerprintPart::Body => {
                let body = req.body().unwrap_or_default();
                match policy.fingerprint_body {
                    FingerprintBody::Raw => put(&mut h, body),
                    FingerprintBody::CanonicalJson => put(&mut h, &canonical_json(body)),
                }
            }
        }
    }
    h.finalize().into()
}

/// JSON re-serialized with object keys sorted and no insignificant whitespace; arrays keep their
/// order. A body that is not JSON is hashed as it is.
pub fn canonical_json(body: &[u8]) -> Vec<u8> {
    // serde_json's map is a BTreeMap (no `preserve_order`), so serialization sorts keys.
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => serde_json::to_vec(&v).unwrap_or_else(|_| body.to_vec()),
        Err(_) => body.to_vec(),
    }
}
