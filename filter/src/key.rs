//! Idempotency keys: where they come from, what a valid one is, and the scoped hash that is the
//! only form a key ever takes in the store.

pub use crate::policy::PART_SEPARATOR;
use crate::policy::{Anonymous, KeyPolicy, PathTemplate, Source};
use crate::request::raw_single_header;
pub use crate::request::{single_header, KeyError, RequestView};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::fmt::Write as _;

/// The longest key accepted, in bytes (Stripe and the IETF draft use the same bound).
const MAX_KEY_LEN: usize = 255;

/// Extracts and validates the client's key: one part, or the parts of a composite key joined
/// with [`PART_SEPARATOR`]. `template` is the route's path template (for `path:` parts); body
/// parts need the body.
pub fn extract(policy: &KeyPolicy, template: Option<&PathTemplate>, req: &dyn RequestView) -> Result<String, KeyError> {
    if let [one] = policy.sources.as_slice() {
        let key = read(one, template, req)?.ok_or_else(|| missing(one))?;
        validate(&key)?;
        return Ok(key);
    }
    let mut key = String::new();
    for (i, part) in policy.sources.iter().enumerate() {
        let value = read(part, template, req)?.ok_or_else(|| missing(part))?;
        validate(&value).map_err(|e| match e {
            KeyError::Invalid(why) => KeyError::Invalid(format!("key part {part}: {why}")),
            other => other,
        })?;
        if i > 0 {
            key.push(PART_SEPARATOR);
        }
        key.push_str(&value);
    }
    Ok(key)
}

fn missing(source: &Source) -> KeyError {
    let what = match source {
        Source::Header(n) => format!("header {n} is missing"),
        Source::Query(n) => format!("query parameter {n} is missing"),
        Source::Cookie(n) => format!("cookie {n} is missing"),
        Source::Metadata(_) => format!("{source} is not in the request's metadata"),
        Source::Body(p) => format!("the JSON body has no string or number at {p}"),
        Source::Form(n) => format!("the form body has no field {n}"),
        Source::Xml(_) => format!("the XML body has no element {}", source.to_string().trim_start_matches("xml:")),
        Source::Path(n) => format!("the path has no {{{n}}}"),
        Source::CloudEvent(a) => {
            format!("the CloudEvent has no {a} (header ce-{a} in binary mode, member {a} in structured mode)")
        }
        Source::Proto(_) => format!("the gRPC request message has no {source} (or it is empty)"),
        Source::Capture(..) | Source::Digest(_) => return missing(source.base()),
    };
    KeyError::Missing(what)
}

/// The one value a source takes in this request: exact text, `Ok(None)` when absent. A value
/// sent twice (a header, a query parameter, a form field, an XML element, a JSON member on the
/// way) is ambiguous — the gateway and the upstream could each read another one.
pub fn read(
    source: &Source,
    template: Option<&PathTemplate>,
    req: &dyn RequestView,
) -> Result<Option<String>, KeyError> {
    match source {
        Source::Header(name) => single_header(req, name),
        Source::Query(name) => query_param(req.path(), name),
        Source::Cookie(name) => match cookies(req, name).as_slice() {
            [] => Ok(None),
            [one] => text(one.to_vec(), source).map(Some),
            many => Err(KeyError::Invalid(format!("cookie {name} was sent {} times", many.len()))),
        },
        Source::Metadata(path) => {
            let mut full = vec!["metadata", "filter_metadata"];
            full.extend(path.iter().map(String::as_str));
            req.property(&full).map(|v| text(v, source)).transpose()
        }
        Source::Body(pointer) => body_key(req.body(), pointer),
        Source::Form(name) => match crate::form::field(req.body().unwrap_or_default(), name) {
            Ok(v) => Ok(v),
            Err(crate::form::FormError::Ambiguous) => Err(KeyError::Invalid(format!(
                "the form body sends field {name} more than once; which one is the key is ambiguous"
            ))),
            Err(crate::form::FormError::NotUtf8) => {
                Err(KeyError::Invalid(format!("form field {name} is not UTF-8 once percent-decoded")))
            }
        },
        Source::Xml(path) => match crate::xml::element_text(req.body().unwrap_or_default(), path) {
            Ok(v) => Ok(v),
            Err(crate::xml::XmlError::NotXml(e)) => {
                Err(KeyError::Missing(format!("the body is not XML ({e}), so {source} cannot be read")))
            }
            Err(crate::xml::XmlError::Refused(what)) => Err(KeyError::Invalid(format!(
                "the XML body holds {what}; DTDs, entities and processing instructions are refused, never expanded"
            ))),
            Err(crate::xml::XmlError::Ambiguous) => Err(KeyError::Invalid(format!(
                "the XML body holds {source} more than once; which one is the key is ambiguous"
            ))),
            Err(crate::xml::XmlError::NotText) => {
                Err(KeyError::Invalid(format!("{source} holds other elements, not text")))
            }
        },
        Source::CloudEvent(name) => crate::cloudevents::attribute(req, name),
        Source::Proto(path) => crate::protobuf::field(req.body().unwrap_or_default(), path)
            .map(|v| v.filter(|v| !v.is_empty()))
            .map_err(|e| KeyError::Invalid(format!("{source}: {e}"))),
        Source::Capture(inner, pattern) => {
            let value = match inner.as_ref() {
                // A signed header is a list (`Credential=…, SignedHeaders=…, Signature=…`): read
                // as sent, not as one structured-field key.
                Source::Header(name) => raw_single_header(req, name)?,
                other => read(other, template, req)?,
            };
            let Some(value) = value else {
                return Ok(None);
            };
            match pattern.capture(&value) {
                Ok(Some(part)) => Ok(Some(part.to_string())),
                Ok(None) => Err(KeyError::Invalid(format!(
                    "{inner} does not match the pattern {} of {source}",
                    pattern.as_str()
                ))),
                Err(n) => Err(KeyError::Invalid(format!(
                    "the pattern {} of {source} matches {inner} {n} times; which one identifies the request is ambiguous",
                    pattern.as_str()
                ))),
            }
        }
        Source::Digest(inner) => Ok(read(inner, template, req)?.map(|v| {
            use std::fmt::Write;
            Sha256::digest(v.as_bytes()).iter().fold(String::with_capacity(64), |mut hex, b| {
                let _ = write!(hex, "{b:02x}");
                hex
            })
        })),
        Source::Path(name) => match template.map(|t| t.param(req.path(), name)) {
            Some(Ok(v)) => Ok(v),
            Some(Err(_)) => {
                Err(KeyError::Invalid(format!("path parameter {{{name}}} is not UTF-8 once percent-decoded")))
            }
            None => Ok(None),
        },
    }
}

fn text(bytes: Vec<u8>, source: &Source) -> Result<String, KeyError> {
    String::from_utf8(bytes).map_err(|_| KeyError::Invalid(format!("{source} is not valid UTF-8")))
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

/// The decoded value of a query parameter in `path` (`/x?a=1&b=2`), decoded exactly (`+` a
/// space, `%XX` a byte): a value that is not UTF-8 once decoded is refused, never turned into
/// replacement characters (`caf%E9` and `caf%E8` would be one key). Twice is ambiguous.
pub fn query_param(path: &str, name: &str) -> Result<Option<String>, KeyError> {
    let Some((_, query)) = path.split_once('?') else {
        return Ok(None);
    };
    let query = query.split('#').next().unwrap_or(query);
    match crate::form::field(query.as_bytes(), name) {
        Ok(v) => Ok(v),
        Err(crate::form::FormError::Ambiguous) => {
            Err(KeyError::Invalid(format!("query parameter {name} was sent more than once; send it exactly once")))
        }
        Err(crate::form::FormError::NotUtf8) => {
            Err(KeyError::Invalid(format!("query parameter {name} is not UTF-8 once percent-decoded")))
        }
    }
}

fn body_key(body: Option<&[u8]>, pointer: &str) -> Result<Option<String>, KeyError> {
    let Some(body) = body else {
        return Ok(None);
    };
    match crate::json::at_pointer(body, pointer) {
        Ok(Some(crate::json::Leaf::String(s))) => Ok(Some(s)),
        Ok(Some(crate::json::Leaf::Number(n))) => Ok(Some(n)),
        Ok(None) => Ok(None),
        Err(crate::json::PointerError::NotJson(e)) => {
            Err(KeyError::Missing(format!("the body is not JSON ({e}), so {pointer} cannot be read")))
        }
        Err(crate::json::PointerError::Ambiguous(member)) => Err(KeyError::Invalid(format!(
            "the JSON body names {member:?} twice on the way to {pointer}; which one is the key is ambiguous"
        ))),
    }
}

/// A digest of a route's key for log lines (12 hex digits): a line and a key an operator holds
/// (`idem-admin show` prints the same) can be matched without the line holding the whole key.
/// The caller's scope is not in it: the same key of two callers has one digest. xxh3, not
/// SHA-256: it names a key in a log (a short key's first 8 characters are logged anyway), and a
/// logged decision must not pay a second SHA-256 block (+7 k instructions natively on a replay).
pub fn key_digest(route: &str, key: &str) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3Default::new();
    h.update(&(route.len() as u64).to_le_bytes());
    h.update(route.as_bytes());
    h.update(key.as_bytes());
    format!("{:012x}", h.digest() >> 16)
}

/// The stored identity of a claim: SHA-256 over the route, the caller scope and the key.
/// Raw keys never reach the store, and the same key from another caller is another claim.
///
/// A scope part the request lacks is an error unless `anonymous` is [`Anonymous::Shared`]: a
/// missing `Authorization` must not turn every cookie-session user into one caller.
pub fn scoped_id(
    route: &str,
    scope: &[Source],
    anonymous: Anonymous,
    key: &str,
    template: Option<&PathTemplate>,
    req: &dyn RequestView,
) -> Result<[u8; 32], KeyError> {
    let mut h = Sha256::new();
    put(&mut h, route.as_bytes());
    for part in scope {
        put_display(&mut h, part);
        let values = scope_values(part, template, req)?;
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

/// The non-empty values a scope part takes for this request: every value of a header or cookie
/// (a caller's identity may span several), the one value of any other source.
fn scope_values<'a>(
    part: &Source,
    template: Option<&PathTemplate>,
    req: &'a dyn RequestView,
) -> Result<Vec<Cow<'a, [u8]>>, KeyError> {
    let values: Vec<Cow<[u8]>> = match part {
        Source::Header(name) => req.header_values(name).into_iter().map(Cow::Borrowed).collect(),
        Source::Cookie(name) => cookies(req, name).into_iter().map(Cow::Borrowed).collect(),
        Source::Metadata(path) => {
            let mut full = vec!["metadata", "filter_metadata"];
            full.extend(path.iter().map(String::as_str));
            req.property(&full).into_iter().map(Cow::Owned).collect()
        }
        _ => read(part, template, req)?.map(|v| Cow::Owned(v.into_bytes())).into_iter().collect(),
    };
    Ok(values.into_iter().filter(|v| !v.is_empty()).collect())
}

/// Every value of cookie `name` across the `Cookie` headers (a browser may send two).
fn cookies<'a>(req: &'a dyn RequestView, name: &str) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    for header in req.header_values("cookie") {
        for pair in header.split(|&b| b == b';') {
            let pair = pair.trim_ascii();
            if let Some(value) = pair.strip_prefix(name.as_bytes()).and_then(|rest| rest.strip_prefix(b"=")) {
                out.push(value);
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

/// [`put`] of a value's `Display` text, written into the hash as it is formatted (no string is
/// built: a scope part's name is hashed on every claim). The text is formatted twice, once to
/// count its bytes for the length prefix.
fn put_display(h: &mut Sha256, value: &impl std::fmt::Display) {
    struct Count(u64);
    impl std::fmt::Write for Count {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0 += s.len() as u64;
            Ok(())
        }
    }
    struct Absorb<'a>(&'a mut Sha256);
    impl std::fmt::Write for Absorb<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.update(s.as_bytes());
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing into these never fails: their `write_str` always returns Ok.
    let _ = write!(count, "{value}");
    h.update(count.0.to_le_bytes());
    let _ = write!(Absorb(h), "{value}");
}

/// The first characters of a key for log lines; keys are never logged in full.
pub fn truncated(key: &str) -> String {
    let mut out = String::with_capacity(12);
    push_truncated(&mut out, key);
    out
}

/// Appends [`truncated`]`(key)` to `out`.
pub fn push_truncated(out: &mut String, key: &str) {
    match key.char_indices().nth(8).and_then(|(end, _)| key.get(..end)) {
        Some(head) => {
            out.push_str(head);
            out.push('…');
        }
        None => out.push_str(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stored claim's id must not change when the module is upgraded: a scope part's name
    /// hashed as it is formatted gives the bytes its formatted string gave (a mixed-case header
    /// name, which `Display` lower-cases, and a multi-byte metadata path).
    #[test]
    fn a_scope_part_hashes_as_its_formatted_text() {
        let parts = [Source::Header("X-Tenant-ID".into()), Source::Metadata(vec!["jwt_authn".into(), "süb".into()])];
        for part in parts {
            let mut streamed = Sha256::new();
            put_display(&mut streamed, &part);
            let mut from_string = Sha256::new();
            put(&mut from_string, part.to_string().as_bytes());
            assert_eq!(streamed.finalize(), from_string.finalize(), "{part}");
        }
    }
}
