//! The policy model: the `[[route]]` schema of `policies/README.md` (this file), parsed from TOML
//! or JSON and validated with errors that name the file, line, column and field ([`parse`]),
//! and how a request finds its route ([`matcher`]).
//!
//! Field-level checks (durations, statuses, names, matcher shape) live in the `Deserialize` impls
//! so that the parser attaches the position; checks across routes (duplicate names, conflicting
//! matchers) locate the offending route in the source text afterwards.

pub mod answers;
mod fields;
mod matcher;
pub mod native_build;
mod parse;
mod reconcile;
mod route_id;
mod source;

pub use fields::{addresses, parse_duration, split_address};
pub use matcher::{normalize_path, percent_decode, percent_encode_into, Matcher, PathTemplate};
#[cfg(feature = "schema")]
pub use parse::bundle_schema;
pub use parse::{line_col, parse_bundle, parse_bundle_all, PolicyError};
pub use reconcile::{Found, LookupPath, Reconcile, MAX_LOOKUP_TIMEOUT_MS};
pub use route_id::RouteId;
pub use source::{generated_header, is_param_name, xml_path, Source};

use serde::Deserialize;

/// Between the parts of a composite key. Every part is free of control characters
/// (`key::validate`), so the joined key reads back into its parts one way only.
pub const PART_SEPARATOR: char = '\u{1f}';

/// A validated bundle: the filter's whole plugin configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    pub shared: SharedConfig,
    /// The shape of the gateway's own answers (`[answers]`), for routes without their own.
    pub answers: super::answers::Answers,
    /// How detached requests reach the service (`[detached]`).
    pub detached: DetachedConfig,
    /// How completed gRPC calls are replayed (`[grpc]`).
    pub grpc: GrpcConfig,
    /// What this filter instance is: the gateway (the default), or the echo of the internal
    /// listener gRPC replays go through (`role = "echo"`).
    pub role: Role,
    /// The `[redis]` table; required when a route uses `store = "redis"`.
    pub redis: Option<RedisConfig>,
    /// The `[admin]` table of a `role = "admin"` bundle.
    pub admin: Option<AdminConfig>,
    /// How issued tokens are signed (`[tokens]`).
    pub tokens: TokensConfig,
    /// Which counters exist before their first count (`[metrics]`).
    pub metrics: MetricsConfig,
    pub routes: Vec<RoutePolicy>,
    /// What a request on a filter-enabled Envoy route that no policy matches gets.
    pub unmatched: Unmatched,
}

/// `unmatched`: a request the filter sees that no policy matches (an alias path such as
/// `/api/order/Create/` the upstream framework still routes, or a route nobody wrote a policy for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Unmatched {
    /// Forward it untouched (counted as `idem_unmatched_total{outcome="passed"}`, logged at debug).
    Pass,
    /// Refuse non-safe methods with 400 `IDEMPOTENCY_NO_POLICY` (fail closed).
    Reject,
}

/// `[redis]`: how the filter reaches Redis (through Webdis, as an Envoy cluster).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// The Envoy cluster name of Webdis (how the `.wasm` reaches Redis; the native build too,
    /// unless `direct` is set). Required unless `direct` is.
    #[serde(default, deserialize_with = "fields::de_nonempty")]
    pub cluster: String,
    /// `host:port` of Redis, spoken to in RESP by the native build itself (no Webdis); for a Redis
    /// Cluster, one or more of its nodes separated by commas (the others are learnt from Redis:
    /// `MOVED`, `CLUSTER SLOTS`). The `.wasm` reads `cluster` instead, so one bundle with both
    /// serves a fleet mixing the two builds.
    #[serde(default, deserialize_with = "fields::de_opt_address")]
    pub direct: Option<String>,
    /// The Redis ACL user of `direct` (`AUTH user password`); `default` when unset.
    #[serde(default, deserialize_with = "fields::de_opt_nonempty")]
    pub user: Option<String>,
    /// The environment variable of Envoy's process holding the password of `direct`, read at
    /// each connection and checked present when the config loads (a password is never written
    /// in the policy).
    #[serde(default, deserialize_with = "fields::de_opt_nonempty")]
    pub password_env: Option<String>,
    /// A file holding the password of `direct` (a mounted secret: Kubernetes, Docker, systemd
    /// credentials), read at each connection, one trailing newline dropped, and checked readable
    /// when the config loads. Not with `password_env`.
    #[serde(default, deserialize_with = "fields::de_opt_nonempty")]
    pub password_file: Option<String>,
    /// Speak TLS to `direct` (Redis' `tls-port`; managed Redis services): the server's certificate
    /// checked against the system's roots, or `tls_ca_file`'s, and its name against `direct`'s host.
    #[serde(default)]
    pub tls: bool,
    /// A PEM file of the certificate authorities that sign `direct`'s certificate (a private CA),
    /// in place of the system's roots; read and checked when the config loads. Needs `tls`.
    #[serde(default, deserialize_with = "fields::de_opt_nonempty")]
    pub tls_ca_file: Option<String>,
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
    /// How long each Envoy keeps a completed answer it wrote or read, to answer repeats of the
    /// key without a Redis round trip (never past the record's expiry); `"0s"` turns it off.
    #[serde(default = "default_answer_cache")]
    pub answer_cache: Duration,
}

fn default_authority() -> String {
    "webdis".into()
}
fn default_redis_timeout() -> Duration {
    Duration { millis: 500 }
}
fn default_answer_cache() -> Duration {
    Duration { millis: 60_000 }
}
fn default_prefix() -> String {
    "idem:".into()
}
fn default_on_store_error() -> OnStoreError {
    OnStoreError::Reject
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnStoreError {
    Reject,
    Allow,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct SharedConfig {
    #[serde(deserialize_with = "fields::de_buckets")]
    pub buckets: u32,
    #[serde(deserialize_with = "fields::de_entries")]
    pub entries_per_bucket: u32,
    #[serde(deserialize_with = "fields::de_response_bytes")]
    pub max_response_bytes: u32,
    /// The shared-data key space of this plugin. Envoy shares one namespace between every plugin
    /// without a `vm_id` (Istio's and Higress' WasmPlugins set none), so two idem plugins in one
    /// Envoy must not read each other's buckets. Default: the plugin's name (Envoy's
    /// `plugin_name`, e.g. Istio's `<namespace>.<WasmPlugin name>`), stable across policy edits.
    #[serde(deserialize_with = "fields::de_opt_namespace")]
    pub namespace: Option<String>,
}

impl Default for SharedConfig {
    fn default() -> Self {
        SharedConfig { buckets: 1024, entries_per_bucket: 8, max_response_bytes: 65536, namespace: None }
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
    /// The shape of the gateway's own answers on this route (`[route.answers]`, else `[answers]`).
    pub answers: super::answers::Answers,
    pub forward: Forward,
    /// Timeout of the upstream call when `forward = "detached"`.
    pub upstream_timeout: Duration,
    /// `[route.reconcile]`: how a repeat that meets an unknown outcome asks the service.
    pub reconcile: Option<Reconcile>,
}

/// `[detached]`: how the root context sends a detached request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct DetachedConfig {
    /// `reentry`: through Envoy again, by an internal listener with the same routes, so the route's
    /// rewrites, header mutations, filters after idem, timeout and retries apply as inline.
    /// `cluster`: straight to the route's cluster, without any of them.
    pub via: DetachedVia,
    /// The Envoy cluster whose endpoint is that internal listener.
    #[serde(deserialize_with = "fields::de_nonempty")]
    pub reentry_cluster: String,
}

impl Default for DetachedConfig {
    fn default() -> Self {
        DetachedConfig { via: DetachedVia::Reentry, reentry_cluster: "idem_reentry".into() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum DetachedVia {
    Reentry,
    Cluster,
}

/// `[tokens]`: the key issued tokens are signed with, so a token the gateway never issued
/// (mistyped, cut short, made up, another route's) is told apart from a used one.
#[derive(Clone, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct TokensConfig {
    /// At least 32 characters, the same on every Envoy that shares a Redis store. Without it,
    /// a secret drawn once per Envoy process (enough for the shared store, which is per process
    /// too); token routes on Redis require it.
    #[cfg_attr(feature = "schema", schemars(length(min = 32)))]
    pub secret: Option<String>,
}

impl std::fmt::Debug for TokensConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokensConfig").field("secret", &self.secret.as_ref().map(|_| "<redacted>")).finish()
    }
}

/// `[metrics]`: which `idem_requests_total{route,outcome}` series exist before their first count.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    pub zero_series: ZeroSeries,
}

/// `[metrics] zero_series`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum ZeroSeries {
    /// The outcomes the shipped alert rules and dashboard read, per route (a counter that
    /// appears with its first count hides that count from `increase()`); the rest on first use.
    #[default]
    Alerted,
    /// Every route × outcome from the start (29 series per route).
    All,
    /// None: every series appears with its first count.
    None,
}

/// The shortest `[tokens] secret`: 32 characters carry enough entropy when they are random.
pub const MIN_TOKEN_SECRET: usize = 32;

/// `[grpc]`: how a completed gRPC call is replayed.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    /// `echo`: the stored message and trailers, through the echo listener (a local reply to a gRPC
    /// call can only be trailers-only, so the replay takes one hop through Envoy). `duplicate`:
    /// the route's duplicate response as a trailers-only answer (`ALREADY_EXISTS`), no message.
    pub replay: GrpcReplay,
    /// The path a replay is sent to: a route to the echo listener's cluster.
    #[serde(deserialize_with = "fields::de_nonempty")]
    pub echo_path: String,
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig { replay: GrpcReplay::Echo, echo_path: "/.idem/replay".into() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum GrpcReplay {
    Echo,
    Duplicate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Gateway,
    Echo,
    /// The operator's listener: lists, releases and resolves the shared store's unknown
    /// outcomes (`[admin]`), and answers nothing else.
    Admin,
}

/// `[admin]` of a `role = "admin"` bundle: who may use the operator's listener.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The bearer secret every call carries (`authorization: Bearer <secret>`); at least 32
    /// characters.
    pub secret: String,
}

/// How a claimed request reaches the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Forward {
    /// Through Envoy's router, as any request: streaming, retries, header mutations.
    Inline,
    /// Sent by the filter itself from the worker's root context (`dispatch_http_call` to the
    /// route's cluster), so a client that leaves cannot cancel it: the answer is always known
    /// and stored, and the client's retry gets it.
    Detached,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Key,
    Token,
    Shadow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Shared,
    Redis,
}

/// `key.from`: where a one-part key is (`key.name` says which one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum KeySource {
    Header,
    Query,
    /// A JSON body member, `name` a JSON pointer.
    Body,
    /// An `application/x-www-form-urlencoded` body field.
    Form,
    /// A plain XML body element, `name` its path from the root (`/xml/transaction_id`).
    Xml,
    /// A `{param}` of the route's path template.
    Path,
    /// A CloudEvents attribute (`name = "id"`), from the headers or the body by the event's mode.
    Cloudevent,
}

/// The header that is the key of a Repeatable Requests route.
pub const REPEATABILITY_REQUEST_ID: &str = "Repeatability-Request-ID";
/// The shortest window (`key.ttl`) of a Repeatable Requests route: Microsoft's REST guidelines
/// say the tracked window "MUST be at least 5 minutes".
pub const MIN_REPEATABILITY_WINDOW: Duration = Duration::from_secs(300);

/// `key.protocol`: the retry protocol the route's callers speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum KeyProtocol {
    /// A key where `key.from`/`key.name`/`key.parts` say (Stripe's and the IETF draft's
    /// `Idempotency-Key` by default).
    #[default]
    IdempotencyKey,
    /// OASIS Repeatable Requests 1.0 (Microsoft's REST guidelines, Azure's SDKs): the key is
    /// `Repeatability-Request-ID`, `Repeatability-First-Sent` is checked against `key.ttl`, and
    /// answers carry `Repeatability-Result` ([`crate::repeatability`]).
    RepeatableRequests,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnInFlight {
    Reject,
    Wait,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OnCompleted {
    Replay,
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
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
    /// The whole query string.
    Query,
    /// The whole body.
    Body,
    /// Every value of a header.
    Header(String),
    /// One value: a body member (its canonical JSON, objects included: `body:/data`), a form
    /// field, an XML element, a query parameter, a path parameter.
    Value(Source),
}

/// What a request lacking its caller scope gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Anonymous {
    /// 400 `IDEMPOTENCY_SCOPE_MISSING`: never let callers without identity share keys.
    Reject,
    /// Callers without the scope share one scope, on purpose (apart from every identified caller).
    Shared,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct KeyPolicy {
    /// The retry protocol (`idempotency-key`, or `repeatable-requests`: OASIS, the key and the
    /// window from its headers).
    pub protocol: KeyProtocol,
    /// Repeatable Requests: how far ahead of this gateway's clock a `Repeatability-First-Sent`
    /// may be (a client whose clock runs ahead) before the request is refused with 412.
    pub first_sent_skew: Duration,
    /// Where a one-part key is (default `header`); not with `parts`.
    pub from: Option<KeySource>,
    /// Which header, parameter, pointer, field, element or path parameter (default
    /// `Idempotency-Key`); not with `parts`.
    #[serde(deserialize_with = "fields::de_opt_nonempty")]
    pub name: Option<String>,
    /// A key made of several values, in order (`["form:app_id", "form:out_trade_no"]`); not with
    /// `from`/`name`.
    pub parts: Vec<Source>,
    /// The key's parts as the filter reads them: `parts`, or the one `from` + `name` names.
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub sources: Vec<Source>,
    /// `required` as written: unset, it is `true`, and `false` for Repeatable Requests (a request
    /// without its headers is an ordinary one, OASIS §5). Once parsed, the value in force.
    #[serde(rename = "required")]
    pub required_as_written: Option<bool>,
    /// Whether a request without the key is refused (resolved from `required`).
    #[serde(skip)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    pub required: bool,
    pub scope: Vec<Source>,
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
    /// A provider callback's success marker: an answer is remembered only when its body holds
    /// this text (Alipay's `success`, WeChat Pay v2's `SUCCESS`); any other answer releases the
    /// key, so the provider's re-delivery runs again — as it would without the gateway.
    #[serde(deserialize_with = "fields::de_opt_nonempty")]
    pub success_body_contains: Option<String>,
    /// gRPC calls: the `grpc-status` codes that are remembered (the service's final answer).
    pub grpc_remember: Vec<u32>,
    /// gRPC calls: the codes after which the outcome is unknown (held, never taken over).
    /// Every other code releases the claim (the call failed and a retry may run).
    pub grpc_unknown: Vec<u32>,
}

/// `[route.token]`: the token mechanism (issue a one-time token, consume it once), served and
/// enforced by the filter.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct TokenPolicy {
    /// The request header that carries the token.
    #[serde(deserialize_with = "fields::de_nonempty")]
    pub header: String,
    /// `POST` here issues a token for this route; the upstream never sees these requests.
    pub issue_path: String,
    /// How long an issued token stays valid.
    pub ttl: Duration,
    /// An upstream 5xx puts the token back (with its remaining TTL) so the user's retry can pass.
    pub restore_on_failure: bool,
    /// Caller identity the token is bound to, besides the route.
    pub scope: Vec<Source>,
    pub anonymous: Anonymous,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        TokenPolicy {
            header: "Idempotency-Token".into(),
            issue_path: "/api/idempotent/token".into(),
            ttl: Duration::from_secs(600),
            restore_on_failure: true,
            scope: vec![Source::Header("authorization".to_string())],
            anonymous: Anonymous::Reject,
        }
    }
}

impl Default for KeyPolicy {
    fn default() -> Self {
        KeyPolicy {
            protocol: KeyProtocol::IdempotencyKey,
            first_sent_skew: Duration::from_secs(300),
            from: None,
            name: None,
            parts: Vec::new(),
            sources: vec![Source::Header("Idempotency-Key".to_string())],
            required_as_written: None,
            required: true,
            scope: vec![Source::Header("authorization".to_string())],
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
            success_body_contains: None,
            // OK, and the service's own final answers: INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS,
            // PERMISSION_DENIED, FAILED_PRECONDITION, OUT_OF_RANGE, UNIMPLEMENTED, UNAUTHENTICATED.
            grpc_remember: vec![0, 3, 5, 6, 7, 9, 11, 12, 16],
            // CANCELLED, DEADLINE_EXCEEDED: the service may have done the work.
            grpc_unknown: vec![1, 4],
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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct DuplicateResponse {
    #[serde(deserialize_with = "fields::de_duplicate_status")]
    pub status: u16,
    #[serde(deserialize_with = "fields::de_nonempty")]
    pub code: String,
    pub message: String,
    /// The duplicate answer's own body (a template), instead of the route's answer shape: a
    /// provider's exact success answer (Alipay's `success`, WeChat Pay's `{"code":"SUCCESS"}`).
    pub body: Option<super::answers::Template>,
    /// The content type of `body`.
    pub content_type: String,
}

impl Default for DuplicateResponse {
    fn default() -> Self {
        DuplicateResponse {
            status: 409,
            code: "DUPLICATE_REQUEST".to_string(),
            message: "duplicate request".to_string(),
            body: None,
            content_type: "text/plain; charset=utf-8".to_string(),
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

impl KeyPolicy {
    /// Whether reading the key (not its scope or fingerprint) needs the request body.
    pub fn key_reads_body(&self) -> bool {
        self.sources.iter().any(Source::reads_body)
    }
}

impl FingerprintPart {
    fn reads_body(&self) -> bool {
        match self {
            FingerprintPart::Body => true,
            FingerprintPart::Value(s) => s.reads_body(),
            _ => false,
        }
    }
}

impl RoutePolicy {
    /// The route's path template, when it is matched by one (`path:` sources read it).
    pub fn template(&self) -> Option<&PathTemplate> {
        match &self.matcher {
            Matcher::Request { path, .. } => Some(path),
            Matcher::RouteName(_) => None,
        }
    }

    /// Whether the decision needs the request body (a body key, scope or fingerprint part).
    pub fn needs_body(&self) -> bool {
        if self.mode == Mode::Token {
            return self.token.scope.iter().any(Source::reads_body);
        }
        self.forward == Forward::Detached
            || self.key.key_reads_body()
            || self.key.scope.iter().any(Source::reads_body)
            || self.key.fingerprint.iter().any(FingerprintPart::reads_body)
    }
}
