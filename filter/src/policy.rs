//! The policy model: the `[[route]]` schema of `policies/README.md`, parsed from TOML or JSON and
//! validated with errors that name the file, line, column and field.
//!
//! Field-level checks (durations, statuses, names, matcher shape) live in the `Deserialize` impls
//! so that the parser attaches the position; checks across routes (duplicate names, conflicting
//! matchers) locate the offending route in the source text afterwards.

use serde::{de, Deserialize, Deserializer};
use std::fmt;

/// A validated bundle: the filter's whole plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    pub shared: SharedConfig,
    /// The `[redis]` table; required when a route uses `store = "redis"`.
    pub redis: Option<RedisConfig>,
    pub routes: Vec<RoutePolicy>,
    /// What a request on a filter-enabled Envoy route that no policy matches gets.
    pub unmatched: Unmatched,
}

/// `unmatched`: a request the filter sees that no policy matches (an alias path such as
/// `/api/order/Create/` the upstream framework still routes, or a route nobody wrote a policy for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unmatched {
    /// Forward it untouched (counted as `idem._unmatched.passed`, logged at debug).
    Pass,
    /// Refuse non-safe methods with 400 `IDEMPOTENCY_NO_POLICY` (fail closed).
    Reject,
}

/// `[redis]`: how the filter reaches Redis (through Webdis, as an Envoy cluster).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// The Envoy cluster name of Webdis.
    #[serde(deserialize_with = "de_nonempty")]
    pub cluster: String,
    /// `:authority` of the callouts.
    #[serde(default = "default_authority")]
    pub authority: String,
    /// `user:password` for Webdis HTTP basic auth (its ACL), if set.
    #[serde(default)]
    pub basic_auth: Option<String>,
    /// Callout timeout.
    #[serde(default = "default_redis_timeout")]
    pub timeout: Duration,
    /// Prefix of every Redis key the filter writes.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// What to do when Redis or Webdis fails: `reject` (503) or `allow` (forward unprotected).
    #[serde(default = "default_on_store_error")]
    pub on_store_error: OnStoreError,
}

fn default_authority() -> String {
    "webdis".into()
}
fn default_redis_timeout() -> Duration {
    Duration { millis: 500 }
}
fn default_prefix() -> String {
    "idem:".into()
}
fn default_on_store_error() -> OnStoreError {
    OnStoreError::Reject
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnStoreError {
    Reject,
    Allow,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedConfig {
    #[serde(deserialize_with = "de_buckets")]
    pub buckets: u32,
    #[serde(deserialize_with = "de_entries")]
    pub entries_per_bucket: u32,
    #[serde(deserialize_with = "de_response_bytes")]
    pub max_response_bytes: u32,
}

impl Default for SharedConfig {
    fn default() -> Self {
        SharedConfig { buckets: 1024, entries_per_bucket: 8, max_response_bytes: 65536 }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoutePolicy {
    pub name: String,
    pub matcher: Matcher,
    pub mode: Mode,
    pub store: StoreKind,
    pub max_body_bytes: u32,
    pub max_response_bytes: u32,
    pub key: KeyPolicy,
    pub token: TokenPolicy,
    pub duplicate: DuplicateResponse,
    pub forward: Forward,
    /// Timeout of the upstream call when `forward = "detached"`.
    pub upstream_timeout: Duration,
}

/// How a claimed request reaches the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Forward {
    /// Through Envoy's router, as any request: streaming, retries, header mutations.
    Inline,
    /// Sent by the filter itself from the worker's root context (`dispatch_http_call` to the
    /// route's cluster), so a client that leaves cannot cancel it: the answer is always known
    /// and stored, and the client's retry gets it.
    Detached,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// Matches the Envoy route whose `name` is this (`xds.route_name`).
    RouteName(String),
    /// Matches a method (or any) and a path template.
    Request { method: Option<String>, path: PathTemplate },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Key,
    Token,
    Shadow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Shared,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeySource {
    Header,
    Query,
    Body,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnInFlight {
    Reject,
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnCompleted {
    Replay,
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FingerprintBody {
    Raw,
    CanonicalJson,
}

/// One input to the request fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FingerprintPart {
    Method,
    Path,
    Query,
    Body,
    Header(String),
}

/// One entry of the caller scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopePart {
    /// `header:<name>`: every value of a request header.
    Header(String),
    /// `cookie:<name>`: a cookie of the `Cookie` header (session-cookie callers).
    Cookie(String),
    /// `metadata:<filter>/<field>/…`: a value an earlier Envoy filter verified and wrote to the
    /// request's dynamic metadata, e.g. `metadata:envoy.filters.http.jwt_authn/jwt_payload/sub`
    /// (a JWT's subject stays the same when the client refreshes its token).
    Metadata(Vec<String>),
}

impl fmt::Display for ScopePart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopePart::Header(h) => write!(f, "header:{h}"),
            ScopePart::Cookie(c) => write!(f, "cookie:{c}"),
            ScopePart::Metadata(path) => write!(f, "metadata:{}", path.join("/")),
        }
    }
}

/// What a request lacking its caller scope gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Anonymous {
    /// 400 `IDEMPOTENCY_SCOPE_MISSING`: never let callers without identity share keys.
    Reject,
    /// Callers without the scope share one scope, on purpose (apart from every identified caller).
    Shared,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeyPolicy {
    pub from: KeySource,
    #[serde(deserialize_with = "de_nonempty")]
    pub name: String,
    pub required: bool,
    pub scope: Vec<ScopePart>,
    pub anonymous: Anonymous,
    pub fingerprint: Vec<FingerprintPart>,
    pub fingerprint_body: FingerprintBody,
    pub lock_ttl: Duration,
    pub ttl: Duration,
    /// How long a claim whose outcome is unknown (forwarded, no answer) is held; `ttl` if unset.
    pub unknown_outcome_hold: Option<Duration>,
    pub on_in_flight: OnInFlight,
    /// How long a held duplicate waits (`on_in_flight = "wait"`) before it gets 409.
    pub wait_timeout: Duration,
    pub on_completed: OnCompleted,
    pub remember: Vec<StatusSet>,
    pub forget: Vec<StatusSet>,
}

/// `[route.token]`: the article's token mechanism, served and enforced by the filter.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenPolicy {
    /// The request header that carries the token.
    #[serde(deserialize_with = "de_nonempty")]
    pub header: String,
    /// `POST` here issues a token for this route; the upstream never sees these requests.
    pub issue_path: String,
    /// How long an issued token stays valid.
    pub ttl: Duration,
    /// An upstream 5xx puts the token back (with its remaining TTL) so the user's retry can pass.
    pub restore_on_failure: bool,
    /// Caller identity the token is bound to, besides the route.
    pub scope: Vec<ScopePart>,
    pub anonymous: Anonymous,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        TokenPolicy {
            header: "Idempotency-Token".into(),
            issue_path: "/api/idempotent/token".into(),
            ttl: Duration::from_secs(600),
            restore_on_failure: true,
            scope: vec![ScopePart::Header("authorization".to_string())],
            anonymous: Anonymous::Reject,
        }
    }
}

impl Default for KeyPolicy {
    fn default() -> Self {
        KeyPolicy {
            from: KeySource::Header,
            name: "Idempotency-Key".to_string(),
            required: true,
            scope: vec![ScopePart::Header("authorization".to_string())],
            anonymous: Anonymous::Reject,
            fingerprint: vec![
                FingerprintPart::Method,
                FingerprintPart::Path,
                FingerprintPart::Query,
                FingerprintPart::Body,
            ],
            fingerprint_body: FingerprintBody::Raw,
            lock_ttl: Duration::from_secs(30),
            ttl: Duration::from_secs(24 * 3600),
            unknown_outcome_hold: None,
            on_in_flight: OnInFlight::Reject,
            wait_timeout: Duration::from_secs(5),
            on_completed: OnCompleted::Replay,
            remember: vec![StatusSet::Class(2), StatusSet::Class(3), StatusSet::Class(4)],
            forget: [408, 409, 425, 429].into_iter().map(StatusSet::Code).collect(),
        }
    }
}

impl KeyPolicy {
    /// Whether a response with this status is remembered (otherwise the claim is released).
    pub fn remembers(&self, status: u16) -> bool {
        self.remember.iter().any(|s| s.contains(status)) && !self.forget.iter().any(|s| s.contains(status))
    }

    /// How long an unknown outcome holds the key.
    pub fn unknown_hold_ms(&self) -> u64 {
        self.unknown_outcome_hold.unwrap_or(self.ttl).millis
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DuplicateResponse {
    #[serde(deserialize_with = "de_duplicate_status")]
    pub status: u16,
    #[serde(deserialize_with = "de_nonempty")]
    pub code: String,
    pub message: String,
}

impl Default for DuplicateResponse {
    fn default() -> Self {
        DuplicateResponse {
            status: 409,
            code: "DUPLICATE_REQUEST".to_string(),
            message: "duplicate request".to_string(),
        }
    }
}

/// A status class (`"2xx"`) or one status code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusSet {
    Class(u16),
    Code(u16),
}

impl StatusSet {
    pub fn contains(&self, status: u16) -> bool {
        match *self {
            StatusSet::Class(c) => status / 100 == c,
            StatusSet::Code(c) => status == c,
        }
    }
}

/// A duration in milliseconds, written `"250ms"`, `"30s"`, `"10m"`, `"24h"`, `"7d"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Duration {
    pub millis: u64,
}

impl Duration {
    pub const fn from_secs(s: u64) -> Self {
        Duration { millis: s * 1000 }
    }
}

/// A path template: literal segments and `{param}` segments that match one non-empty segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    pub source: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Param,
}

impl PathTemplate {
    pub fn parse(source: &str) -> Result<Self, String> {
        if !source.starts_with('/') {
            return Err(format!("path {source:?} must start with '/'"));
        }
        if source.contains('?') || source.contains('#') {
            return Err(format!("path {source:?} must not contain a query or fragment"));
        }
        let mut segments = Vec::new();
        for seg in source.split('/').filter(|s| !s.is_empty()) {
            if seg.starts_with('{') && seg.ends_with('}') && seg.len() > 2 {
                segments.push(Segment::Param);
            } else if seg.contains('{') || seg.contains('}') {
                return Err(format!(
                    "path {source:?}: a template parameter must be a whole segment, like /orders/{{id}}"
                ));
            } else {
                segments.push(Segment::Literal(seg.to_string()));
            }
        }
        Ok(PathTemplate { source: source.to_string(), segments })
    }

    pub fn is_exact(&self) -> bool {
        self.segments.iter().all(|s| matches!(s, Segment::Literal(_)))
    }

    /// Matches a request path (without the query string), after [`normalize_path`]: literal
    /// segments compare ignoring ASCII case, since many frameworks route `/Create` and `/create/`
    /// to the same handler, and a policy that such an alias slips past runs the business twice.
    pub fn matches(&self, path: &str) -> bool {
        let segments = normalize_path(path);
        segments.len() == self.segments.len()
            && self.segments.iter().zip(&segments).all(|(seg, p)| match seg {
                Segment::Literal(lit) => lit.eq_ignore_ascii_case(p),
                Segment::Param => !p.is_empty(),
            })
    }

    /// The shape used to detect two templates that match the same paths.
    fn shape(&self) -> Vec<Option<String>> {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => Some(l.to_ascii_lowercase()),
                Segment::Param => None,
            })
            .collect()
    }
}

/// A request path as the policy matcher sees it: its segments, with percent-encoded unreserved
/// characters decoded (`%63reate` is `create`), empty segments dropped (`//` and a trailing `/`)
/// and `.`/`..` resolved. Envoy's `normalize_path` and `merge_slashes` do the same before routing;
/// doing it here too keeps a policy from being bypassed where the listener lacks them.
pub fn normalize_path(path: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for raw in path.split('/') {
        let seg = decode_unreserved(raw);
        match seg.as_str() {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(seg),
        }
    }
    out
}

/// Decodes `%XX` only where it stands for an unreserved character (RFC 3986 §2.3); other escapes
/// (`%2F`, `%20`, …) stay as they are, as Envoy's normalisation keeps them.
fn decode_unreserved(seg: &str) -> String {
    if !seg.contains('%') {
        return seg.to_string();
    }
    let bytes = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| seg.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
        match decoded {
            Some(b) => {
                out.push(char::from(b));
                i += 3;
            }
            None => {
                let ch_len = seg.get(i..).and_then(|r| r.chars().next()).map_or(1, char::len_utf8);
                out.push_str(seg.get(i..i + ch_len).unwrap_or(""));
                i += ch_len;
            }
        }
    }
    out
}

/// A policy error, with where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyError {
    pub origin: String,
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{}:{}: {}", self.origin, l, c, self.message),
            (Some(l), None) => write!(f, "{}:{}: {}", self.origin, l, self.message),
            _ => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for PolicyError {}

/// Parses a bundle from TOML, or from JSON when the document starts with `{`.
/// `origin` names the source in errors (a file path, or "plugin configuration").
pub fn parse_bundle(source: &str, origin: &str) -> Result<Bundle, PolicyError> {
    let raw: RawBundle = if source.trim_start().starts_with('{') {
        serde_json::from_str(source).map_err(|e| {
            let message = e.to_string().split(" at line ").next().unwrap_or("").to_string();
            let offset = offset_of(source, e.line(), e.column());
            PolicyError {
                origin: origin.to_string(),
                line: Some(e.line()),
                column: Some(e.column()),
                message: name_field(message, json_field_before(source, offset)),
            }
        })?
    } else {
        toml::from_str(source).map_err(|e| {
            let (line, column, field) = match e.span() {
                Some(span) => {
                    let (l, c) = line_col(source, span.start);
                    (Some(l), Some(c), toml_field_before(source, span.start))
                }
                None => (None, None, None),
            };
            let message = name_field(e.message().trim().to_string(), field);
            PolicyError { origin: origin.to_string(), line, column, message }
        })?
    };
    raw.validate(source, origin)
}

/// Prefixes a value error with the field it belongs to, unless the message names it already.
fn name_field(message: String, field: Option<&str>) -> String {
    match field {
        Some(f) if !message.contains(&format!("`{f}`")) => format!("`{f}`: {message}"),
        _ => message,
    }
}

/// The key of the `key = value` whose value starts at `offset` (TOML, same line, inline tables too).
fn toml_field_before(source: &str, offset: usize) -> Option<&str> {
    let before = source.get(..offset)?;
    let line = before.rsplit('\n').next()?;
    let key = line.trim_end().strip_suffix('=')?.trim_end();
    let name = key.rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')).next()?;
    Some(name).filter(|k| !k.is_empty())
}

/// The last `"key":` before `offset` (JSON).
fn json_field_before(source: &str, offset: usize) -> Option<&str> {
    let before = source.get(..offset)?;
    let (head, _) = before.rsplit_once(':')?;
    let key = head.trim_end().strip_suffix('"')?;
    let (_, name) = key.rsplit_once('"')?;
    Some(name).filter(|k| !k.is_empty())
}

/// Byte offset of a 1-based line and column (serde_json's position: characters).
fn offset_of(source: &str, line: usize, column: usize) -> usize {
    let line_start: usize = source.split_inclusive('\n').take(line.saturating_sub(1)).map(str::len).sum();
    let rest = source.get(line_start..).unwrap_or("");
    line_start + rest.char_indices().nth(column.saturating_sub(1)).map(|(i, _)| i).unwrap_or(rest.len())
}

/// 1-based line and column (in characters) of a byte offset.
pub fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let before = source.get(..offset).unwrap_or(source);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    (line, column)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBundle {
    #[serde(default)]
    shared: SharedConfig,
    #[serde(default)]
    redis: Option<RedisConfig>,
    #[serde(default)]
    route: Vec<RawRoute>,
    #[serde(default = "default_unmatched")]
    unmatched: Unmatched,
}

fn default_unmatched() -> Unmatched {
    Unmatched::Pass
}
fn default_forward() -> Forward {
    Forward::Inline
}
fn default_upstream_timeout() -> Duration {
    Duration::from_secs(15)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    #[serde(deserialize_with = "de_route_name")]
    name: String,
    #[serde(rename = "match", default)]
    matcher: Option<RawMatch>,
    #[serde(default = "default_mode")]
    mode: Mode,
    #[serde(default = "default_store")]
    store: StoreKind,
    #[serde(default, deserialize_with = "de_opt_body_bytes")]
    max_body_bytes: Option<u32>,
    #[serde(default, deserialize_with = "de_opt_response_bytes")]
    max_response_bytes: Option<u32>,
    #[serde(default)]
    key: Option<KeyPolicy>,
    #[serde(default = "default_forward")]
    forward: Forward,
    #[serde(default = "default_upstream_timeout")]
    upstream_timeout: Duration,
    #[serde(default)]
    token: Option<TokenPolicy>,
    #[serde(default)]
    duplicate: DuplicateResponse,
}

fn default_mode() -> Mode {
    Mode::Key
}
fn default_store() -> StoreKind {
    StoreKind::Shared
}

/// `match = { route = … }` or `match = { method = …, path = … }`, validated as a whole.
struct RawMatch(Matcher);

impl<'de> Deserialize<'de> for RawMatch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            route: Option<String>,
            method: Option<String>,
            path: Option<String>,
        }
        let f = Fields::deserialize(d)?;
        match (f.route, f.method, f.path) {
            (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
                Err(de::Error::custom("conflicting matchers: `route` cannot be combined with `method` or `path`"))
            }
            (Some(route), None, None) if !route.is_empty() => Ok(RawMatch(Matcher::RouteName(route))),
            (Some(_), None, None) => Err(de::Error::custom("`route` must not be empty")),
            (None, _, None) => Err(de::Error::custom("`match` needs `route`, or `path` (with an optional `method`)")),
            (None, method, Some(path)) => {
                let method = match method {
                    Some(m) if is_method(&m) => Some(m),
                    Some(m) => {
                        return Err(de::Error::custom(format!(
                            "invalid method {m:?}: expected an upper-case HTTP method such as \"POST\""
                        )))
                    }
                    None => None,
                };
                let path = PathTemplate::parse(&path).map_err(de::Error::custom)?;
                Ok(RawMatch(Matcher::Request { method, path }))
            }
        }
    }
}

fn is_method(m: &str) -> bool {
    !m.is_empty() && m.len() <= 16 && m.bytes().all(|b| b.is_ascii_uppercase())
}

impl RawBundle {
    fn validate(self, source: &str, origin: &str) -> Result<Bundle, PolicyError> {
        let mut routes: Vec<RoutePolicy> = Vec::with_capacity(self.route.len());
        for (i, r) in self.route.into_iter().enumerate() {
            let error = |message: String| {
                let (line, column) = locate_route(source, i);
                PolicyError { origin: origin.to_string(), line, column, message }
            };
            if let Some(first) = routes.iter().position(|p| p.name == r.name) {
                return Err(error(format!(
                    "route {:?}: duplicate route name (route #{} already uses it)",
                    r.name,
                    first + 1
                )));
            }
            let matcher = match r.matcher {
                Some(RawMatch(m)) => m,
                None => Matcher::RouteName(r.name.clone()),
            };
            if let Some(other) = routes.iter().find(|p| p.matcher.conflicts_with(&matcher)) {
                return Err(error(format!(
                    "route {:?}: conflicting matchers: it matches the same requests as route {:?}",
                    r.name, other.name
                )));
            }
            let max_response_bytes = r.max_response_bytes.unwrap_or(self.shared.max_response_bytes);
            if max_response_bytes > self.shared.max_response_bytes {
                return Err(error(format!(
                    "route {:?}: max_response_bytes = {} exceeds [shared] max_response_bytes = {}",
                    r.name, max_response_bytes, self.shared.max_response_bytes
                )));
            }
            let is_token = r.mode == Mode::Token;
            if is_token && r.key.is_some() {
                return Err(error(format!(
                    "route {:?}: mode = \"token\" takes [route.token], not [route.key]",
                    r.name
                )));
            }
            if !is_token && r.token.is_some() {
                return Err(error(format!("route {:?}: [route.token] needs mode = \"token\"", r.name)));
            }
            if r.store == StoreKind::Redis && self.redis.is_none() {
                return Err(error(format!(
                    "route {:?}: store = \"redis\" needs a top-level [redis] table naming the Webdis cluster",
                    r.name
                )));
            }
            let key = r.key.unwrap_or_default();
            let token = r.token.unwrap_or_default();
            if is_token {
                if !token.issue_path.starts_with('/') || token.issue_path.contains('?') {
                    return Err(error(format!(
                        "route {:?}: token.issue_path {:?} must be a path starting with '/'",
                        r.name, token.issue_path
                    )));
                }
                if token.ttl.millis == 0 {
                    return Err(error(format!("route {:?}: token.ttl must be positive", r.name)));
                }
            }
            if key.from == KeySource::Body && !key.name.starts_with('/') {
                return Err(error(format!(
                    "route {:?}: key.name {:?} must be a JSON pointer like \"/transaction_id\" when key.from = \"body\"",
                    r.name, key.name
                )));
            }
            if r.forward == Forward::Detached && is_token {
                return Err(error(format!(
                    "route {:?}: forward = \"detached\" applies to key routes, not mode = \"token\"",
                    r.name
                )));
            }
            if r.upstream_timeout.millis == 0 {
                return Err(error(format!("route {:?}: upstream_timeout must be positive", r.name)));
            }
            if key.lock_ttl.millis == 0
                || key.ttl.millis == 0
                || key.wait_timeout.millis == 0
                || key.unknown_outcome_hold.is_some_and(|d| d.millis == 0)
            {
                return Err(error(format!(
                    "route {:?}: key.lock_ttl, key.ttl, key.wait_timeout and key.unknown_outcome_hold must be positive",
                    r.name
                )));
            }
            routes.push(RoutePolicy {
                name: r.name,
                matcher,
                mode: r.mode,
                store: r.store,
                max_body_bytes: r.max_body_bytes.unwrap_or(65536),
                max_response_bytes,
                key,
                token,
                duplicate: r.duplicate,
                forward: r.forward,
                upstream_timeout: r.upstream_timeout,
            });
        }
        Ok(Bundle { shared: self.shared, redis: self.redis, routes, unmatched: self.unmatched })
    }
}

/// Line and column of the `i`-th `[[route]]` header (TOML), or of the `"name"` member of the
/// `i`-th object of the `route` array (JSON; a `"name"` nested deeper, such as `key.name`, is not it).
fn locate_route(source: &str, i: usize) -> (Option<usize>, Option<usize>) {
    let offset = if source.trim_start().starts_with('{') {
        json_route_name_offset(source, i)
    } else {
        source.match_indices("[[route]]").nth(i).map(|(o, _)| o)
    };
    match offset {
        Some(o) => {
            let (l, c) = line_col(source, o);
            (Some(l), Some(c))
        }
        None => (None, None),
    }
}

/// Byte offset of `"name"` directly inside the `i`-th element of the top-level `"route"` array.
/// A small scanner over strings and nesting: the document already parsed, so it is valid JSON.
fn json_route_name_offset(source: &str, i: usize) -> Option<usize> {
    let bytes = source.as_bytes();
    let mut depth = 0usize;
    let mut route_array_depth: Option<usize> = None;
    let mut element = 0usize;
    let mut pos = 0;
    let mut last_string: Option<(usize, usize)> = None;
    while pos < bytes.len() {
        match bytes[pos] {
            b'"' => {
                let start = pos;
                pos += 1;
                while pos < bytes.len() && bytes[pos] != b'"' {
                    pos += if bytes[pos] == b'\\' { 2 } else { 1 };
                }
                last_string = Some((start, pos + 1));
            }
            b':' => {
                if let Some((s, e)) = last_string.take() {
                    let name = source.get(s..e);
                    if depth == 1 && name == Some("\"route\"") {
                        route_array_depth = Some(2);
                        element = 0;
                    } else if route_array_depth.is_some_and(|d| depth == d + 1)
                        && name == Some("\"name\"")
                        && element == i
                    {
                        return Some(s);
                    }
                }
            }
            b'{' | b'[' => {
                depth += 1;
                last_string = None;
            }
            b'}' | b']' => {
                if route_array_depth == Some(depth) {
                    route_array_depth = None;
                }
                depth = depth.saturating_sub(1);
                last_string = None;
            }
            b',' => {
                if route_array_depth == Some(depth) {
                    element += 1;
                }
                last_string = None;
            }
            _ => {}
        }
        pos += 1;
    }
    None
}

// ---- field deserializers: each validates and lets the parser attach the position ----

fn de_route_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(s)
    } else {
        Err(de::Error::custom(format!("invalid route name {s:?}: use 1 to 64 lower-case letters, digits, '-' or '_'")))
    }
}

fn de_nonempty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        Err(de::Error::custom("must not be empty"))
    } else {
        Ok(s)
    }
}

fn ranged<'de, D: Deserializer<'de>>(d: D, min: u64, max: u64, what: &str) -> Result<u32, D::Error> {
    let v = u64::deserialize(d)?;
    if (min..=max).contains(&v) {
        Ok(v as u32)
    } else {
        Err(de::Error::custom(format!("{what} must be between {min} and {max}, got {v}")))
    }
}

fn de_buckets<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, 1, 65536, "buckets")
}
fn de_entries<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, 1, 64, "entries_per_bucket")
}
fn de_response_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, 0, 16 << 20, "max_response_bytes")
}
fn de_opt_body_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    ranged(d, 0, 16 << 20, "max_body_bytes").map(Some)
}
fn de_opt_response_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    de_response_bytes(d).map(Some)
}

fn de_duplicate_status<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    let v = u64::deserialize(d)?;
    if (200..=499).contains(&v) {
        Ok(v as u16)
    } else {
        Err(de::Error::custom(format!(
            "invalid duplicate status {v}: a duplicate is a business outcome, use 200-499 (never a 5xx)"
        )))
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(de::Error::custom)
    }
}

/// Parses `"250ms"`, `"30s"`, `"10m"`, `"24h"`, `"7d"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {s:?}: expected a number and a unit, like \"250ms\", \"30s\", \"10m\", \"24h\" or \"7d\""
        )
    };
    let digits = s.bytes().take_while(|b| b.is_ascii_digit()).count();
    let (number, unit) = s.split_at(digits);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let factor = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(factor).map(|millis| Duration { millis }).ok_or_else(bad)
}

impl<'de> Deserialize<'de> for StatusSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Code(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Code(c) if (100..=599).contains(&c) => Ok(StatusSet::Code(c as u16)),
            Raw::Code(c) => Err(de::Error::custom(format!("invalid status {c}: expected 100-599"))),
            Raw::Text(t) => match t.as_bytes() {
                [c @ b'1'..=b'5', b'x', b'x'] => Ok(StatusSet::Class(u16::from(c - b'0'))),
                _ => Err(de::Error::custom(format!(
                    "invalid status {t:?}: expected a code like 404 or a class like \"2xx\""
                ))),
            },
        }
    }
}

impl<'de> Deserialize<'de> for FingerprintPart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "method" => Ok(FingerprintPart::Method),
            "path" => Ok(FingerprintPart::Path),
            "query" => Ok(FingerprintPart::Query),
            "body" => Ok(FingerprintPart::Body),
            _ => match s.strip_prefix("header:") {
                Some(h) if !h.is_empty() => Ok(FingerprintPart::Header(h.to_ascii_lowercase())),
                _ => Err(de::Error::custom(format!(
                    "invalid fingerprint part {s:?}: expected method, path, query, body or header:<name>"
                ))),
            },
        }
    }
}

impl<'de> Deserialize<'de> for ScopePart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let bad = || {
            de::Error::custom(format!(
                "invalid scope part {s:?}: expected header:<name>, cookie:<name> or metadata:<filter>/<field>[/<field>…]"
            ))
        };
        let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
        match kind {
            "header" if !rest.is_empty() => Ok(ScopePart::Header(rest.to_ascii_lowercase())),
            "cookie" if !rest.is_empty() => Ok(ScopePart::Cookie(rest.to_string())),
            "metadata" => {
                let path: Vec<String> = rest.split('/').map(str::to_string).collect();
                if path.len() < 2 || path.iter().any(String::is_empty) {
                    return Err(bad());
                }
                Ok(ScopePart::Metadata(path))
            }
            _ => Err(bad()),
        }
    }
}

impl Bundle {
    /// The policy for a request, by Envoy route name first, then exact paths, then templates.
    /// `method` and `route_name` are only asked for when a candidate needs them: a request that
    /// no policy can match costs one look at its path.
    pub fn find(
        &self,
        method: impl FnOnce() -> String,
        path: &str,
        route_name: impl FnOnce() -> Option<String>,
    ) -> Option<usize> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        if self.routes.iter().any(|r| matches!(r.matcher, Matcher::RouteName(_))) {
            if let Some(name) = route_name() {
                let hit = self.routes.iter().position(|r| matches!(&r.matcher, Matcher::RouteName(n) if *n == name));
                if hit.is_some() {
                    return hit;
                }
            }
        }
        let mut method = Some(method);
        let mut actual: Option<String> = None;
        for exact in [true, false] {
            for (i, r) in self.routes.iter().enumerate() {
                let Matcher::Request { method: wanted, path: t } = &r.matcher else {
                    continue;
                };
                if t.is_exact() != exact || !t.matches(path) {
                    continue;
                }
                let Some(wanted) = wanted else {
                    return Some(i);
                };
                if actual.is_none() {
                    actual = method.take().map(|f| f());
                }
                if actual.as_deref() == Some(wanted.as_str()) {
                    return Some(i);
                }
            }
        }
        None
    }
}

impl Matcher {
    /// The request path as the fingerprint sees it: [`normalize_path`]'s segments, with the
    /// segments a template names literally written as the template writes them. Aliases of one
    /// endpoint (`/Create/`, `%63reate`) are the same request; parameter values keep their case.
    pub fn canonical_path(&self, path: &str) -> String {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        let mut segments = normalize_path(bare);
        if let Matcher::Request { path: t, .. } = self {
            if t.matches(bare) {
                for (seg, lit) in segments.iter_mut().zip(&t.segments) {
                    if let Segment::Literal(l) = lit {
                        seg.clone_from(l);
                    }
                }
            }
        }
        let mut out = String::with_capacity(bare.len());
        for seg in &segments {
            out.push('/');
            out.push_str(seg);
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }

    /// Whether two matchers match the same requests (two such routes cannot share a bundle).
    pub fn conflicts_with(&self, other: &Matcher) -> bool {
        match (self, other) {
            (Matcher::RouteName(x), Matcher::RouteName(y)) => x == y,
            (Matcher::Request { method: ma, path: pa }, Matcher::Request { method: mb, path: pb }) => {
                let methods_overlap = match (ma, mb) {
                    (Some(x), Some(y)) => x == y,
                    _ => true,
                };
                methods_overlap && pa.shape() == pb.shape()
            }
            _ => false,
        }
    }
}

impl RoutePolicy {
    /// Whether the decision needs the request body (a body key or a body fingerprint).
    pub fn needs_body(&self) -> bool {
        if self.mode == Mode::Token {
            return false;
        }
        self.forward == Forward::Detached
            || self.key.from == KeySource::Body
            || self.key.fingerprint.contains(&FingerprintPart::Body)
    }
}
