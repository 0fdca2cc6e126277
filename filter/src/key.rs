//! Idempotency keys: where they come from, what a valid one is, and the scoped hash that is the
//! only form a key ever takes in the store.

use crate::policy::{Anonymous, KeyPolicy, KeySource, ScopePart};
use sha2::{Digest, Sha256};

/// The longest key accepted, in bytes (Stripe and the IETF draft use the same bound).
pub const MAX_KEY_LEN: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// No key where the policy says it is.
    Missing(String),
    /// A key that is present but unusable (also: not UTF-8, sent twice, ambiguous).
    Invalid(String),
    /// The caller scope the policy names is absent: without it, callers would share keys.
    ScopeMissing(String),
}

/// The request as the key and fingerprint code sees it. Header values are bytes: Envoy passes
/// whatever the client sent, and a non-UTF-8 byte must be an answer, not a crash.
pub trait RequestView {
    fn method(&self) -> &str;
    /// `:path` including the query string.
    fn path(&self) -> &str;
    /// Every value of a request header, in order, by lower-case name.
    fn header_values(&self, name: &str) -> Vec<&[u8]>;
    /// The whole request body, when buffered.
    fn body(&self) -> Option<&[u8]>;
    /// A value Envoy computed for this request, by property path (e.g. the `jwt_authn`
    /// filter's dynamic metadata). `None` when absent or not available.
    fn property(&self, _path: &[&str]) -> Option<Vec<u8>> {
        None
    }
}

/// Extracts and validates the client's key. Body keys need the body.
pub fn extract(policy: &KeyPolicy, req: &dyn RequestView) -> Result<String, KeyError> {
    let raw = match policy.from {
        KeySource::Header => single_header(req, &policy.name)?
            .ok_or_else(|| KeyError::Missing(format!("header {} is missing", policy.name)))?,
        KeySource::Query => query_param(req.path(), &policy.name)
            .ok_or_else(|| KeyError::Missing(format!("query parameter {} is missing", policy.name)))?,
        KeySource::Body => body_key(req.body(), &policy.name)?,
    };
    validate(&raw)?;
    Ok(raw)
}

/// An Item-typed header (the IETF `Idempotency-Key`, our token header): sent once, UTF-8, a
/// bare token or an sf-string. Two values are ambiguous — the gateway and the upstream
/// framework could each pick another one — so they are refused, as is a comma-joined list.
pub fn single_header(req: &dyn RequestView, name: &str) -> Result<Option<String>, KeyError> {
    let values = req.header_values(&name.to_ascii_lowercase());
    let value = match values.as_slice() {
        [] => return Ok(None),
        [one] => *one,
        many => {
            return Err(KeyError::Invalid(format!("header {name} was sent {} times; send it exactly once", many.len())))
        }
    };
    let text =
        std::str::from_utf8(value).map_err(|_| KeyError::Invalid(format!("header {name} is not valid UTF-8")))?;
    let parsed = parse_sf_string(text)?;
    if !text.trim_start().starts_with('"') && parsed.contains(',') {
        return Err(KeyError::Invalid(format!(
            "header {name} holds a list (a comma outside quotes); send one key, or quote it as an sf-string"
        )));
    }
    Ok(Some(parsed))
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
    match crate::json::at_pointer(body, pointer) {
        Ok(Some(crate::json::Leaf::String(s))) => Ok(s),
        Ok(Some(crate::json::Leaf::Number(n))) => Ok(n),
        Ok(None) => Err(missing()),
        Err(crate::json::PointerError::NotJson(e)) => {
            Err(KeyError::Missing(format!("the body is not JSON ({e}), so {pointer} cannot be read")))
        }
        Err(crate::json::PointerError::Ambiguous(member)) => Err(KeyError::Invalid(format!(
            "the JSON body names {member:?} twice on the way to {pointer}; which one is the key is ambiguous"
        ))),
    }
}

/// The stored identity of a claim: SHA-256 over the route, the caller scope and the key.
/// Raw keys never reach the store, and the same key from another caller is another claim.
///
/// A scope part the request lacks is an error unless `anonymous` is [`Anonymous::Shared`]: a
/// missing `Authorization` must not turn every cookie-session user into one caller.
pub fn scoped_id(
    route: &str,
    scope: &[ScopePart],
    anonymous: Anonymous,
    key: &str,
    req: &dyn RequestView,
) -> Result<[u8; 32], KeyError> {
    let mut h = Sha256::new();
    put(&mut h, route.as_bytes());
    for part in scope {
        put(&mut h, part.to_string().as_bytes());
        let values = scope_values(part, req);
        if values.iter().any(|v| std::str::from_utf8(v).is_err()) {
            return Err(KeyError::Invalid(format!("the caller scope {part} is not valid UTF-8")));
        }
        match (values.is_empty(), anonymous) {
            (true, Anonymous::Reject) => {
                return Err(KeyError::ScopeMissing(format!(
                    "this route keeps keys per caller ({part}), and the request has none; \
                     send it (or ask the operator to set key.anonymous = \"shared\")"
                )))
            }
            // Absent is hashed apart from every present value (a count of zero).
            (true, Anonymous::Shared) => h.update(0u64.to_le_bytes()),
            (false, _) => {
                h.update((values.len() as u64).to_le_bytes());
                for v in &values {
                    put(&mut h, v);
                }
            }
        }
    }
    put(&mut h, key.as_bytes());
    Ok(h.finalize().into())
}

/// The non-empty values a scope part takes for this request.
fn scope_values(part: &ScopePart, req: &dyn RequestView) -> Vec<Vec<u8>> {
    let values = match part {
        ScopePart::Header(name) => req.header_values(name).into_iter().map(<[u8]>::to_vec).collect(),
        ScopePart::Cookie(name) => cookies(req, name),
        ScopePart::Metadata(path) => {
            let mut full = vec!["metadata", "filter_metadata"];
            full.extend(path.iter().map(String::as_str));
            req.property(&full).into_iter().collect()
        }
    };
    values.into_iter().filter(|v: &Vec<u8>| !v.is_empty()).collect()
}

/// Every value of cookie `name` across the `Cookie` headers (a browser may send two).
fn cookies(req: &dyn RequestView, name: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for header in req.header_values("cookie") {
        for pair in header.split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            if let Some(value) = pair.strip_prefix(name.as_bytes()).and_then(|rest| rest.strip_prefix(b"=")) {
                out.push(value.to_vec());
            }
        }
    }
    out
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
