//! Idempotency keys: where they come from, what a valid one is, and the scoped hash that is the
//! only form a key ever takes in the store.

use crate::policy::{KeyPolicy, KeySource, ScopePart};
use sha2::{Digest, Sha256};

/// The longest key accepted, in bytes (Stripe and the IETF draft use the same bound).
pub const MAX_KEY_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// No key where the policy says it is.
    Missing(String),
    /// A key that is present but unusable.
    Invalid(String),
}

/// The request as the key and fingerprint code sees it.
pub trait RequestView {
    fn method(&self) -> &str;
    /// `:path` including the query string.
    fn path(&self) -> &str;
    /// A request header by lower-case name.
    fn header(&self, name: &str) -> Option<String>;
    /// The whole request body, when buffered.
    fn body(&self) -> Option<&[u8]>;
}

/// Extracts and validates the client's key. Body keys need the body.
pub fn extract(policy: &KeyPolicy, req: &dyn RequestView) -> Result<String, KeyError> {
    let raw = match policy.from {
        KeySource::Header => {
            let v = req
                .header(&policy.name.to_ascii_lowercase())
                .ok_or_else(|| KeyError::Missing(format!("header {} is missing", policy.name)))?;
            parse_sf_string(&v)?
        }
        KeySource::Query => query_param(req.path(), &policy.name)
            .ok_or_else(|| KeyError::Missing(format!("query parameter {} is missing", policy.name)))?,
        KeySource::Body => body_key(req.body(), &policy.name)?,
    };
    validate(&raw)?;
    Ok(raw)
}

/// Accepts a bare token or an IETF structured-field string (`"..."` with `\"` and `\\` escapes).
pub fn parse_sf_string(value: &str) -> Result<String, KeyError> {
    let v = value.trim_matches([' ', '\t']);
    let Some(inner) = v.strip_prefix('"') else {
        return Ok(v.to_string());
    };
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                return if chars.as_str().is_empty() {
                    Ok(out)
                } else {
                    Err(KeyError::Invalid("text after the closing quote of the structured-field string".into()))
                };
            }
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return Err(KeyError::Invalid("bad escape in structured-field string".into())),
            },
            c if (' '..='~').contains(&c) => out.push(c),
            _ => return Err(KeyError::Invalid("structured-field strings allow printable ASCII only".into())),
        }
    }
    Err(KeyError::Invalid("unterminated structured-field string".into()))
}

/// Length 1..=255 bytes and no control characters.
pub fn validate(key: &str) -> Result<(), KeyError> {
    if key.is_empty() {
        return Err(KeyError::Invalid("the key is empty".into()));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(KeyError::Invalid(format!("the key is {} bytes long, the limit is {MAX_KEY_LEN}", key.len())));
    }
    if key.chars().any(char::is_control) {
        return Err(KeyError::Invalid("the key contains control characters".into()));
    }
    Ok(())
}

/// The decoded value of a query parameter in `path` (`/x?a=1&b=2`).
pub fn query_param(path: &str, name: &str) -> Option<String> {
    let query = path.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or(query);
    form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

fn body_key(body: Option<&[u8]>, pointer: &str) -> Result<String, KeyError> {
    let missing = || KeyError::Missing(format!("the JSON body has no string or number at {pointer}"));
    let body = body.ok_or_else(missing)?;
    let json: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| KeyError::Missing(format!("the body is not JSON ({e}), so {pointer} cannot be read")))?;
    match json.pointer(pointer) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
        _ => Err(missing()),
    }
}

/// The stored identity of a claim: SHA-256 over the route, the caller scope and the key.
/// Raw keys never reach the store, and the same key from another caller is another claim.
pub fn scoped_id(route: &str, scope: &[ScopePart], key: &str, req: &dyn RequestView) -> [u8; 32] {
    let mut h = Sha256::new();
    put(&mut h, route.as_bytes());
    for ScopePart::Header(name) in scope {
        put(&mut h, name.as_bytes());
        put(&mut h, req.header(name).unwrap_or_default().as_bytes());
    }
    put(&mut h, key.as_bytes());
    h.finalize().into()
}

/// Length-prefixed so that no two different inputs hash the same byte stream.
pub(crate) fn put(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

/// The first characters of a key for log lines; keys are never logged in full.
pub fn truncated(key: &str) -> String {
    let mut chars = key.chars();
    let head: String = chars.by_ref().take(8).collect();
    if chars.next().is_some() {
        format!("{head}…")
    } else {
        head
    }
}
