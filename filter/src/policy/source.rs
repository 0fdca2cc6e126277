//! Where a value of the request comes from: `header:<name>`, `query:<name>`, `cookie:<name>`,
//! `metadata:<filter>/<field>/…`, `body:<JSON pointer>`, `form:<field>`, `xml:/<element>/…` and
//! `path:<template parameter>`. Key parts, scope parts and fingerprint parts all name their
//! values this way; what each role does with a value is in [`crate::key`] and
//! [`crate::fingerprint`].
//!
//! Two forms take part of a value or stand for it:
//! - `<source> ~ <regex>`: the regex's one capture group, found exactly once in the value
//!   (`header:authorization ~ Credential=([A-Z0-9]+)/`: a SigV4 caller's access key id, stable
//!   across the retries it signs anew). Named extractors for the common schemes:
//!   `sigv4:access_key_id`, `wechatpay:mchid` and `azurehmac:credential`.
//! - `sha256:<source>`: the value's SHA-256 (hex) stands for it, so a stable value of any length
//!   can identify a request (WeChat Pay v2's encrypted `req_info`, 1 KB and more).

use serde::{de, Deserialize, Deserializer};
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A request header (its name as written; compared, hashed and shown in lower case where
    /// it matters: header names are case-insensitive).
    Header(String),
    /// A query-string parameter (decoded).
    Query(String),
    /// A cookie of the `Cookie` header (session-cookie callers).
    Cookie(String),
    /// A value an earlier Envoy filter verified and wrote to the request's dynamic metadata,
    /// e.g. `metadata:envoy.filters.http.jwt_authn/jwt_payload/sub` (a JWT's subject stays the
    /// same when the client refreshes its token).
    Metadata(Vec<String>),
    /// A member of the JSON body, by JSON pointer (`/transaction_id`).
    Body(String),
    /// A field of an `application/x-www-form-urlencoded` body (Alipay's notify).
    Form(String),
    /// The text of an element of a plain XML body, by its path from the root (WeChat Pay v2's
    /// `/xml/transaction_id`).
    Xml(Vec<String>),
    /// A `{param}` of the route's path template (`path:order_id` for `/orders/{order_id}/pay`).
    Path(String),
    /// A CloudEvents attribute, wherever the event's mode puts it: the `ce-<attribute>` header in
    /// binary mode, the member of the JSON body in structured mode (`cloudevent:id`,
    /// `cloudevent:source`); `cloudevent:data` is the event's data in either mode.
    CloudEvent(String),
    /// A field of a unary gRPC call's request message, by field numbers from the top message down
    /// (`proto:2`, `proto:4.1`): AIP-155's `request_id`, read without the schema
    /// ([`crate::protobuf`]).
    Proto(Vec<u32>),
    /// Part of another source's value: the capture group of a pattern found once in it.
    Capture(Box<Source>, Pattern),
    /// Another source's value by its SHA-256 (lower-case hex).
    Digest(Box<Source>),
}

/// A regex with exactly one capture group, compared and hashed by its text.
#[derive(Debug, Clone)]
pub struct Pattern {
    text: String,
    regex: regex_lite::Regex,
}

impl Pattern {
    /// The longest pattern accepted: enough for any scheme's token, short enough to read.
    const MAX_LEN: usize = 512;

    pub fn parse(text: &str) -> Result<Pattern, String> {
        if text.len() > Pattern::MAX_LEN {
            return Err(format!("the pattern is {} bytes long; at most {}", text.len(), Pattern::MAX_LEN));
        }
        let regex = regex_lite::RegexBuilder::new(text).size_limit(1 << 20).build().map_err(|e| {
            format!("the pattern {text:?} is not a regex this gateway runs ({e}); no backreferences or look-around")
        })?;
        let groups = regex.captures_len() - 1;
        if groups != 1 {
            return Err(format!(
                "the pattern {text:?} has {groups} capture groups; it needs exactly one, around the part to keep"
            ));
        }
        Ok(Pattern { text: text.to_string(), regex })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The capture of the one match in `value`: `Ok(None)` without a match, `Err(n)` when the
    /// pattern matches `n > 1` times (which one identifies the caller would be a guess).
    pub fn capture<'v>(&self, value: &'v str) -> Result<Option<&'v str>, usize> {
        let mut found = self.regex.captures_iter(value).filter_map(|c| c.get(1));
        let Some(first) = found.next() else {
            return Ok(None);
        };
        match found.count() {
            0 => Ok(Some(first.as_str())),
            more => Err(more + 1),
        }
    }
}

impl PartialEq for Pattern {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}
impl Eq for Pattern {}
impl std::hash::Hash for Pattern {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state);
    }
}

/// The named extractors: a scheme's stable caller id inside a value signed anew per request.
const EXTRACTORS: &[(&str, &str, &str)] = &[
    // AWS Signature V4: `Authorization: AWS4-HMAC-SHA256 Credential=AKIA…/20261202/us-east-1/ec2/aws4_request, …`
    ("sigv4:access_key_id", "header:authorization", r"\bCredential=([A-Za-z0-9]+)/"),
    // WeChat Pay API v3: `Authorization: WECHATPAY2-SHA256-RSA2048 mchid="1900000001",nonce_str=…`
    ("wechatpay:mchid", "header:authorization", r#"\bmchid="([0-9A-Za-z_-]+)""#),
    // Azure's HMAC (App Configuration and the services that follow it):
    // `Authorization: HMAC-SHA256 Credential=<access key id>&SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature=…`
    ("azurehmac:credential", "header:authorization", r"\bCredential=([^&\s,;]+)&"),
];

impl Source {
    /// Whether reading it needs the request body.
    pub fn reads_body(&self) -> bool {
        match self {
            Source::Capture(inner, _) | Source::Digest(inner) => inner.reads_body(),
            _ => matches!(
                self,
                Source::Body(_) | Source::Form(_) | Source::Xml(_) | Source::CloudEvent(_) | Source::Proto(_)
            ),
        }
    }

    /// The source whose value this one reads (itself, or what a capture or digest reads).
    pub fn base(&self) -> &Source {
        match self {
            Source::Capture(inner, _) | Source::Digest(inner) => inner.base(),
            other => other,
        }
    }

    /// Parses `kind:argument`, `<source> ~ <regex>`, `sha256:<source>` or a named extractor.
    pub fn parse(s: &str) -> Result<Source, String> {
        if let Some(inner) = s.strip_prefix("sha256:") {
            let inner = Source::parse(inner)?;
            if matches!(inner, Source::Digest(_)) {
                return Err(format!("invalid source {s:?}: one sha256: is enough"));
            }
            return Ok(Source::Digest(Box::new(inner)));
        }
        if let Some((inner, pattern)) = s.split_once(" ~ ") {
            let inner = Source::parse(inner.trim())?;
            if !matches!(
                inner,
                Source::Header(_)
                    | Source::Query(_)
                    | Source::Cookie(_)
                    | Source::Form(_)
                    | Source::Body(_)
                    | Source::Xml(_)
                    | Source::Metadata(_)
            ) {
                return Err(format!("invalid source {s:?}: a pattern applies to one value: header, query, cookie, form, body, xml or metadata"));
            }
            let pattern = Pattern::parse(pattern.trim()).map_err(|e| format!("invalid source {s:?}: {e}"))?;
            return Ok(Source::Capture(Box::new(inner), pattern));
        }
        if let Some((_, base, pattern)) = EXTRACTORS.iter().find(|(name, _, _)| *name == s) {
            let inner = Source::parse(base)?;
            return Ok(Source::Capture(Box::new(inner), Pattern::parse(pattern)?));
        }
        let bad = |why: &str| format!("invalid source {s:?}: {why}; expected {EXPECTED}");
        let (kind, arg) = s.split_once(':').ok_or_else(|| bad("no `kind:`"))?;
        if arg.is_empty() {
            return Err(bad("nothing after the colon"));
        }
        match kind {
            "header" => Ok(Source::Header(arg.to_string())),
            "query" => Ok(Source::Query(arg.to_string())),
            "cookie" => Ok(Source::Cookie(arg.to_string())),
            "form" => Ok(Source::Form(arg.to_string())),
            "path" if is_param_name(arg) => Ok(Source::Path(arg.to_string())),
            "path" => Err(bad("a path parameter is a name like `order_id`")),
            "body" if arg.starts_with('/') => Ok(Source::Body(arg.to_string())),
            "body" => Err(bad("a body source is a JSON pointer like `body:/transaction_id`")),
            "xml" => xml_path(arg).map(Source::Xml).map_err(|why| bad(&why)),
            // CloudEvents attribute names: lower-case letters and digits (spec v1.0 §3.1.1).
            "cloudevent" if arg.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()) => {
                Ok(Source::CloudEvent(arg.to_string()))
            }
            "cloudevent" => Err(bad("a CloudEvents attribute name is lower-case letters and digits, like `id`")),
            "proto" => arg
                .split('.')
                .map(|n| n.parse::<u32>().ok().filter(|n| (1..=536_870_911).contains(n)))
                .collect::<Option<Vec<u32>>>()
                .filter(|path| path.len() <= 16)
                .map(Source::Proto)
                .ok_or_else(|| bad("a message field is its field numbers, 1 to 536870911, dotted into nested messages, like `proto:2` or `proto:4.1`")),
            "metadata" => {
                let path: Vec<String> = arg.split('/').map(str::to_string).collect();
                if path.len() < 2 || path.iter().any(String::is_empty) {
                    return Err(bad("metadata needs a filter and a field, like `metadata:envoy.filters.http.jwt_authn/jwt_payload/sub`"));
                }
                Ok(Source::Metadata(path))
            }
            _ => Err(bad(&format!("unknown kind `{kind}`"))),
        }
    }
}

const EXPECTED: &str =
    "header:<name>, query:<name>, cookie:<name>, metadata:<filter>/<field>[/…], body:/<JSON pointer>, \
form:<field>, xml:/<element>[/…], path:<template parameter>, cloudevent:<attribute> or proto:<field>[.<field>…]; part of one: `<source> ~ <regex with one group>`, \
sigv4:access_key_id, wechatpay:mchid or azurehmac:credential; by digest: sha256:<source>";

/// `/xml/transaction_id` → `["xml", "transaction_id"]`: element names (XML `Name`s without a
/// namespace prefix), from the root.
pub fn xml_path(arg: &str) -> Result<Vec<String>, String> {
    let Some(rest) = arg.strip_prefix('/') else {
        return Err("an XML source is an element path from the root, like `xml:/xml/transaction_id`".into());
    };
    let names: Vec<String> = rest.split('/').map(str::to_string).collect();
    let valid = |n: &str| {
        n.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
            && n.chars().all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'))
    };
    if let Some(bad) = names.iter().find(|n| !valid(n)) {
        return Err(format!("`{bad}` is not an element name"));
    }
    Ok(names)
}

/// Why a header cannot be an idempotency key, when Envoy, a tracer or a proxy writes it: a value
/// generated per request (or per attempt) never repeats on a retry, so `required = true` never
/// fires and every retry runs as a new request. `None` for a header only the client writes.
pub fn generated_header(name: &str) -> Option<&'static str> {
    let n = name.trim().to_ascii_lowercase();
    const TRACE: &str = "is a tracing header, written anew by a tracer or Envoy for every attempt";
    match n.as_str() {
        "x-request-id" => Some("is generated by Envoy for every request that lacks one"),
        "traceparent"
        | "tracestate"
        | "b3"
        | "x-b3-traceid"
        | "x-b3-spanid"
        | "x-b3-parentspanid"
        | "x-b3-sampled"
        | "x-b3-flags"
        | "x-ot-span-context"
        | "uber-trace-id"
        | "x-datadog-trace-id"
        | "x-datadog-parent-id"
        | "x-amzn-trace-id"
        | "x-cloud-trace-context"
        | "grpc-trace-bin"
        | "sw8"
        | "sw8-correlation" => Some(TRACE),
        "x-forwarded-for" | "x-forwarded-proto" | "x-forwarded-host" | "x-forwarded-port" | "x-real-ip"
        | "forwarded" | "via" => Some("is written by the proxies on the way, not by the client"),
        "grpc-timeout" => Some("is the call's remaining deadline, different on every attempt"),
        _ if n.starts_with("x-envoy-") => Some("is set or removed by Envoy itself"),
        _ if n.starts_with(':') => Some("is an HTTP/2 pseudo-header, the same for every request to the route"),
        _ => None,
    }
}

/// A template parameter name: `{order_id}`'s `order_id`.
pub fn is_param_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Written as it is when already lower case (the usual case, hashed into every scoped id).
            Source::Header(h) if !h.bytes().any(|b| b.is_ascii_uppercase()) => write!(f, "header:{h}"),
            Source::Header(h) => write!(f, "header:{}", h.to_ascii_lowercase()),
            Source::Query(q) => write!(f, "query:{q}"),
            Source::Cookie(c) => write!(f, "cookie:{c}"),
            Source::Metadata(path) => write!(f, "metadata:{}", path.join("/")),
            Source::Body(p) => write!(f, "body:{p}"),
            Source::Form(n) => write!(f, "form:{n}"),
            Source::Xml(path) => write!(f, "xml:/{}", path.join("/")),
            Source::Path(p) => write!(f, "path:{p}"),
            Source::CloudEvent(a) => write!(f, "cloudevent:{a}"),
            Source::Proto(path) => {
                let numbers: Vec<String> = path.iter().map(u32::to_string).collect();
                write!(f, "proto:{}", numbers.join("."))
            }
            Source::Capture(inner, p) => {
                match EXTRACTORS.iter().find(|(_, b, pat)| *pat == p.as_str() && inner.to_string() == *b) {
                    Some((name, _, _)) => write!(f, "{name}"),
                    None => write!(f, "{inner} ~ {}", p.as_str()),
                }
            }
            Source::Digest(inner) => write!(f, "sha256:{inner}"),
        }
    }
}

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Source::parse(&s).map_err(de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Source {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Source".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Where a value of the request comes from: header:<name>, query:<name>, cookie:<name>, metadata:<filter>/<field>[/…], body:/<JSON pointer>, form:<field>, xml:/<element>[/…], path:<template parameter>, cloudevent:<attribute> or proto:<field>[.<field>…] (a gRPC request message's field); part of a value: `<source> ~ <regex with one capture group>`, sigv4:access_key_id, wechatpay:mchid, azurehmac:credential; a value by its SHA-256: sha256:<source>.",
            "type": "string",
            "pattern": "^(sha256:)?((header:.+|query:.+|cookie:.+|form:.+|metadata:[^/]+(/[^/]+)+|body:/.*|xml:(/[^/]+)+|path:[A-Za-z0-9_.-]+|cloudevent:[a-z0-9]+)( ~ .+)?|proto:[0-9]+([.][0-9]+)*|sigv4:access_key_id|wechatpay:mchid|azurehmac:credential)$"
        })
    }
}
