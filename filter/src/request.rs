//! The request as keys and fingerprints read it: a view any host provides, the error a key
//! read gives, and the one way a header that carries a key is read (sent once, an sf-string or
//! a bare token). Below `key` and `cloudevents`, which both read through it.

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// No key where the policy says it is.
    Missing(String),
    /// A key that is present but unusable (also: not UTF-8, sent twice, ambiguous).
    Invalid(String),
    /// The caller scope the policy names is absent: without it, callers would share keys.
    ScopeMissing(String),
    /// The request carries its key in a form this route does not read (a batch of CloudEvents).
    Unsupported(String),
}

/// The request as the key and fingerprint code sees it. Header values are bytes: Envoy passes
/// whatever the client sent, and a non-UTF-8 byte must be an answer, not a crash.
pub trait RequestView {
    fn method(&self) -> &str;
    /// `:path` including the query string.
    fn path(&self) -> &str;
    /// Every value of a request header, in order, by name compared ASCII case-insensitively (as
    /// HTTP header names are): callers pass a policy's spelling as written, without a lower-cased copy.
    fn header_values(&self, name: &str) -> Vec<&[u8]>;
    /// The first value of a request header (a content type, an encoding), without collecting
    /// the others.
    fn first_header_value(&self, name: &str) -> Option<&[u8]> {
        self.header_values(name).first().copied()
    }
    /// The whole request body, when buffered.
    fn body(&self) -> Option<&[u8]>;
    /// A value Envoy computed for this request, by property path (e.g. the `jwt_authn`
    /// filter's dynamic metadata). `None` when absent or not available.
    fn property(&self, _path: &[&str]) -> Option<Vec<u8>> {
        None
    }
}

/// A request held as plain parts: what a client sends, as far as keys and scopes go. The
/// operator's tool computes a key's identity from one (`idem-admin show`), and the core's tests
/// build their requests with it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlainRequest {
    pub method: String,
    pub path: String,
    /// Names in lower case, values as bytes.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Option<Vec<u8>>,
    /// Values an Envoy filter verified, by metadata path (`filter`, `field`, …).
    pub metadata: Vec<(Vec<String>, Vec<u8>)>,
}

impl PlainRequest {
    /// A `POST` of `path`, without headers or body.
    pub fn post(path: &str) -> Self {
        PlainRequest { method: "POST".into(), path: path.into(), ..Default::default() }
    }
    pub fn header(self, name: &str, value: &str) -> Self {
        self.raw_header(name, value.as_bytes())
    }
    /// A header value as bytes, not necessarily UTF-8 (what Envoy hands over).
    pub fn raw_header(mut self, name: &str, value: &[u8]) -> Self {
        self.headers.push((name.to_ascii_lowercase(), value.to_vec()));
        self
    }
    /// The `Idempotency-Key` header.
    pub fn key(self, key: &str) -> Self {
        self.header("idempotency-key", key)
    }
    pub fn body(mut self, body: &str) -> Self {
        self.body = Some(body.as_bytes().to_vec());
        self
    }
}

impl RequestView for PlainRequest {
    fn method(&self) -> &str {
        &self.method
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice()).collect()
    }
    fn body(&self) -> Option<&[u8]> {
        self.body.as_deref()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let rest = path.strip_prefix(&["metadata", "filter_metadata"])?;
        let found = self.metadata.iter().find(|(p, _)| p.iter().map(String::as_str).eq(rest.iter().copied()));
        found.map(|(_, v)| v.clone())
    }
}

/// An Item-typed header (the IETF `Idempotency-Key`, our token header): sent once, UTF-8, a
/// bare token or an sf-string. Two values are ambiguous — the gateway and the upstream
/// framework could each pick another one — so they are refused, as is a comma-joined list.
pub fn single_header(req: &dyn RequestView, name: &str) -> Result<Option<String>, KeyError> {
    let values = req.header_values(name);
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

/// A header sent once, as text exactly as sent (no structured-field parsing).
pub(crate) fn raw_single_header(req: &dyn RequestView, name: &str) -> Result<Option<String>, KeyError> {
    match req.header_values(name).as_slice() {
        [] => Ok(None),
        [one] => std::str::from_utf8(one)
            .map(|v| Some(v.to_string()))
            .map_err(|_| KeyError::Invalid(format!("header {name} is not valid UTF-8"))),
        many => Err(KeyError::Invalid(format!("header {name} was sent {} times; send it exactly once", many.len()))),
    }
}

/// Accepts a bare token or an IETF structured-field string (`"..."` with `\"` and `\\` escapes).
fn parse_sf_string(value: &str) -> Result<String, KeyError> {
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
