//! Parsing a bundle (TOML, or JSON when it starts with `{`) and the checks across routes, with
//! errors that name the line, column and field.

use super::answers::Answers;
use super::{
    AdminConfig, Bundle, DetachedConfig, DuplicateResponse, Duration, FingerprintPart, Forward, GrpcConfig, KeyPolicy,
    KeyProtocol, KeySource, Matcher, MetricsConfig, Mode, PathTemplate, RedisConfig, Role, RoutePolicy, SharedConfig,
    Source, StoreKind, TokenPolicy, TokensConfig, Unmatched, MIN_TOKEN_SECRET,
};
use serde::{de, Deserialize, Deserializer};
use std::fmt;

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
/// `origin` names the source in errors (a file path, or "plugin configuration"). The first
/// error; [`parse_bundle_all`] gives every one.
pub fn parse_bundle(source: &str, origin: &str) -> Result<Bundle, PolicyError> {
    parse_bundle_all(source, origin).map_err(|errors| {
        let fallback =
            || PolicyError { origin: origin.to_string(), line: None, column: None, message: "invalid".into() };
        errors.into_iter().next().unwrap_or_else(fallback)
    })
}

/// [`parse_bundle`] with every error a bundle has, in the order of the source: a document that
/// does not parse is one error; one that does gets every top-level and every route's check (a
/// route reports its first error, so one typo does not come back as ten).
pub fn parse_bundle_all(source: &str, origin: &str) -> Result<Bundle, Vec<PolicyError>> {
    let raw: RawBundle = if source.trim_start().starts_with('{') {
        serde_json::from_str(source).map_err(|e| {
            let message = e.to_string().split(" at line ").next().unwrap_or("").to_string();
            let offset = offset_of(source, e.line(), e.column());
            vec![PolicyError {
                origin: origin.to_string(),
                line: Some(e.line()),
                column: Some(e.column()),
                message: name_field(message, json_field_before(source, offset)),
            }]
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
            vec![PolicyError { origin: origin.to_string(), line, column, message }]
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

/// A policy bundle: the plugin configuration idem reads (TOML, or JSON as control planes send it).
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(title = "idem policy bundle"))]
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
    /// The shape of the gateway's own answers, for every route without `[route.answers]`.
    #[serde(default)]
    answers: Option<Answers>,
    /// How detached requests reach the service.
    #[serde(default)]
    detached: DetachedConfig,
    /// How completed gRPC calls are replayed.
    #[serde(default)]
    grpc: GrpcConfig,
    /// How issued tokens are signed.
    #[serde(default)]
    tokens: TokensConfig,
    /// Which counters exist before their first count.
    #[serde(default)]
    metrics: MetricsConfig,
    /// `gateway` (default); `echo`: the instance in the internal listener gRPC replays go
    /// through, which answers them and nothing else; `admin`: the operator's listener.
    #[serde(default = "default_role")]
    role: Role,
    /// Who may use the operator's listener (`role = "admin"` only).
    #[serde(default)]
    admin: Option<AdminConfig>,
    /// Higress' per-route rules (its WasmPlugin `matchRules`, sent as `_rules_` with
    /// `_match_route_`): refused with what to write instead, not as an unknown field.
    #[serde(rename = "_rules_", default)]
    #[cfg_attr(feature = "schema", schemars(skip))]
    higress_rules: Option<serde::de::IgnoredAny>,
}

/// Why `_rules_` is refused, and what to write instead.
const HIGRESS_RULES: &str = "`_rules_` (Higress matchRules) is not supported: idem selects routes itself. Put the \
whole bundle in the WasmPlugin's defaultConfig and leave matchRules out; a `route` entry with `match` applies to \
that method and path, one without `match` to the Envoy route named like its `name` (docs/deploy.md: Deploy on Istio / Envoy Gateway / Higress)";

fn default_role() -> Role {
    Role::Gateway
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

/// One route's policy.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(rename = "Route"))]
#[serde(deny_unknown_fields)]
struct RawRoute {
    #[serde(deserialize_with = "super::fields::de_route_name")]
    name: String,
    #[serde(rename = "match", default)]
    matcher: Option<RawMatch>,
    #[serde(default = "default_mode")]
    mode: Mode,
    #[serde(default = "default_store")]
    store: StoreKind,
    #[serde(default, deserialize_with = "super::fields::de_opt_body_bytes")]
    max_body_bytes: Option<u32>,
    #[serde(default, deserialize_with = "super::fields::de_opt_response_bytes")]
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
    /// The shape of the gateway's own answers on this route.
    #[serde(default)]
    answers: Option<Answers>,
    /// Ask the service whether a first attempt whose outcome is unknown ran.
    #[serde(default)]
    reconcile: Option<super::Reconcile>,
}

fn default_mode() -> Mode {
    Mode::Key
}
fn default_store() -> StoreKind {
    StoreKind::Shared
}

/// `match = { route = … }` or `match = { method = …, path = … }`, validated as a whole.
struct RawMatch(Matcher);

/// The JSON Schema of a policy bundle, from the types the parser reads (feature `schema`).
#[cfg(feature = "schema")]
pub fn bundle_schema() -> schemars::Schema {
    schemars::schema_for!(RawBundle)
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for RawMatch {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Match".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Which requests the policy applies to: `route` (an Envoy route name), or `path` (a template, `{id}` for one segment) with an optional upper-case `method`.",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "route": { "type": "string", "minLength": 1 },
                "method": { "type": "string", "pattern": "^[A-Z]{1,16}$" },
                "path": { "type": "string", "pattern": "^/" }
            },
            "oneOf": [
                { "required": ["route"], "not": { "anyOf": [{ "required": ["method"] }, { "required": ["path"] }] } },
                { "required": ["path"], "not": { "required": ["route"] } }
            ]
        })
    }
}

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
    /// Every check, every error: the top-level ones, then each route's first (a route is checked
    /// against the routes before it that passed).
    fn validate(mut self, source: &str, origin: &str) -> Result<Bundle, Vec<PolicyError>> {
        let at = |needle: &str, message: String| {
            let at = source.find(needle).map(|offset| line_col(source, offset));
            PolicyError { origin: origin.to_string(), line: at.map(|(l, _)| l), column: at.map(|(_, c)| c), message }
        };
        let mut errors = Vec::new();
        if self.higress_rules.is_some() {
            errors.push(at("_rules_", HIGRESS_RULES.into()));
        }
        if self.role == Role::Echo && !self.route.is_empty() {
            errors.push(at(
                "role",
                "role = \"echo\" answers gRPC replays only: it takes no [[route]] (the gateway's bundle has them)"
                    .into(),
            ));
        }
        if let Err((needle, message)) = self.check_admin() {
            errors.push(at(needle, message));
        }
        if self
            .redis
            .as_ref()
            .is_some_and(|r| r.user.is_some() && r.password_env.is_none() && r.password_file.is_none())
        {
            errors.push(at(
                "user",
                "[redis] `user` needs `password_env` or `password_file` (Redis authenticates a user with its password)"
                    .into(),
            ));
        }
        if self.redis.as_ref().is_some_and(|r| (r.tls || r.tls_ca_file.is_some()) && r.direct.is_none()) {
            errors.push(at(
                "tls",
                "[redis] `tls` and `tls_ca_file` are for `direct` (the native build's own connections); the .wasm \
                 reaches Webdis through its Envoy cluster, whose transport_socket sets TLS"
                    .into(),
            ));
        }
        if self.redis.as_ref().is_some_and(|r| r.tls_ca_file.is_some() && !r.tls) {
            errors.push(at("tls_ca_file", "[redis] `tls_ca_file` needs `tls = true`".into()));
        }
        if self.redis.as_ref().is_some_and(|r| r.password_env.is_some() && r.password_file.is_some()) {
            errors.push(at(
                "password_file",
                "[redis] takes `password_env` or `password_file`, not both (which one would Redis be given?)".into(),
            ));
        }
        if self.redis.as_ref().is_some_and(|r| r.cluster.is_empty() && r.direct.is_none()) {
            errors.push(at(
                "[redis]",
                "[redis] needs `cluster` (the Envoy cluster of Webdis: how the .wasm reaches Redis) or `direct` \
                 (host:port of Redis, which the native build speaks to itself), or both for a fleet of both builds"
                    .into(),
            ));
        }
        if let Some(secret) = &self.tokens.secret {
            if secret.chars().count() < MIN_TOKEN_SECRET {
                errors.push(at(
                    "secret",
                    format!(
                        "[tokens] `secret` has {} characters; at least {MIN_TOKEN_SECRET} (random, e.g. `openssl rand -base64 32`)",
                        secret.chars().count()
                    ),
                ));
            }
        }
        let raw_routes = std::mem::take(&mut self.route);
        let mut routes: Vec<RoutePolicy> = Vec::with_capacity(raw_routes.len());
        let names: Vec<String> = raw_routes.iter().map(|r| r.name.clone()).collect();
        for (i, r) in raw_routes.into_iter().enumerate() {
            // Names are compared with every route before it, whether or not that one passed.
            let checked = match names.iter().take(i).position(|n| *n == r.name) {
                Some(first) => {
                    Err(format!("route {:?}: duplicate route name (route #{} already uses it)", r.name, first + 1))
                }
                None => self.route_policy(r, &routes),
            };
            match checked {
                Ok(route) => routes.push(route),
                Err(message) => {
                    let (line, column) = locate_route(source, i);
                    errors.push(PolicyError { origin: origin.to_string(), line, column, message });
                }
            }
        }
        if !errors.is_empty() {
            errors.sort_by_key(|e| (e.line.is_none(), e.line, e.column));
            return Err(errors);
        }
        Ok(Bundle {
            shared: self.shared,
            redis: self.redis,
            routes,
            unmatched: self.unmatched,
            answers: self.answers.unwrap_or_default(),
            detached: self.detached,
            grpc: self.grpc,
            tokens: self.tokens,
            metrics: self.metrics,
            role: self.role,
            admin: self.admin,
        })
    }

    /// One route, checked against the bundle's tables and the routes before it; the error names
    /// the route.
    fn route_policy(&self, r: RawRoute, before: &[RoutePolicy]) -> Result<RoutePolicy, String> {
        let name = &r.name;
        let matcher = match r.matcher {
            Some(RawMatch(m)) => m,
            None => Matcher::RouteName(r.name.clone()),
        };
        if let Some(other) = before.iter().find(|p| p.matcher.conflicts_with(&matcher)) {
            return Err(format!(
                "route {name:?}: conflicting matchers: it matches the same requests as route {:?}",
                other.name
            ));
        }
        let max_response_bytes = r.max_response_bytes.unwrap_or(self.shared.max_response_bytes);
        if max_response_bytes > self.shared.max_response_bytes {
            return Err(format!(
                "route {name:?}: max_response_bytes = {} exceeds [shared] max_response_bytes = {}",
                max_response_bytes, self.shared.max_response_bytes
            ));
        }
        let is_token = r.mode == Mode::Token;
        if is_token && r.key.is_some() {
            return Err(format!("route {name:?}: mode = \"token\" takes [route.token], not [route.key]"));
        }
        if !is_token && r.token.is_some() {
            return Err(format!("route {name:?}: [route.token] needs mode = \"token\""));
        }
        if r.store == StoreKind::Redis && self.redis.is_none() {
            return Err(format!(
                "route {name:?}: store = \"redis\" needs a top-level [redis] table naming the Webdis cluster, \
                 stated once for the bundle in any of its files (check a route file alone together with the file \
                 that states it: `idem-lint bundle ROUTE.toml REDIS.toml`)"
            ));
        }
        let mut key = r.key.unwrap_or_default();
        key.sources = key_sources(&key).map_err(|m| format!("route {name:?}: {m}"))?;
        let repeatable = key.protocol == KeyProtocol::RepeatableRequests;
        key.required = key.required_as_written.unwrap_or(!repeatable);
        // Two policies that say the same are equal, whether `required` was written or not.
        key.required_as_written = Some(key.required);
        let window = key.ttl.millis.saturating_sub(key.first_sent_skew.millis);
        if repeatable && window < super::MIN_REPEATABILITY_WINDOW.millis {
            return Err(format!(
                "route {name:?}: key.ttl minus key.first_sent_skew is the window Repeatability-First-Sent is checked \
                 against, and it is {} s; Microsoft's REST guidelines require a window of at least 5 minutes \
                 (raise key.ttl)",
                window / 1000
            ));
        }
        let token = r.token.unwrap_or_default();
        let template = match &matcher {
            Matcher::Request { path, .. } => Some(path),
            Matcher::RouteName(_) => None,
        };
        let fingerprint_values = key.fingerprint.iter().filter_map(|f| match f {
            FingerprintPart::Value(v) => Some(v),
            _ => None,
        });
        let mut read = key.sources.iter().chain(&key.scope).chain(fingerprint_values).chain(&token.scope);
        if let Some(Source::Path(p)) =
            read.find(|s| matches!(s, Source::Path(p) if !template.is_some_and(|t| t.has_param(p))))
        {
            return Err(format!(
                "route {name:?}: path:{p} names a parameter of the route's path template, and {}",
                match template {
                    Some(t) => format!("match.path {:?} has no {{{p}}}", t.source),
                    None => "this route has no match.path (it is matched by Envoy route name)".to_string(),
                }
            ));
        }
        if is_token && r.store == StoreKind::Redis && self.tokens.secret.is_none() {
            return Err(format!(
                "route {name:?}: a token route on the Redis store needs a top-level [tokens] `secret`, the same \
                 on every Envoy, so that each Envoy accepts the tokens the others issued"
            ));
        }
        if is_token {
            if !token.issue_path.starts_with('/') || token.issue_path.contains('?') {
                return Err(format!(
                    "route {name:?}: token.issue_path {:?} must be a path starting with '/'",
                    token.issue_path
                ));
            }
            if token.ttl.millis == 0 {
                return Err(format!("route {name:?}: token.ttl must be positive"));
            }
        }
        if r.forward == Forward::Detached && is_token {
            return Err(format!("route {name:?}: forward = \"detached\" applies to key routes, not mode = \"token\""));
        }
        if r.upstream_timeout.millis == 0 {
            return Err(format!("route {name:?}: upstream_timeout must be positive"));
        }
        if key.lock_ttl.millis == 0
            || key.ttl.millis == 0
            || key.wait_timeout.millis == 0
            || key.unknown_outcome_hold.is_some_and(|d| d.millis == 0)
        {
            return Err(format!(
                "route {name:?}: key.lock_ttl, key.ttl, key.wait_timeout and key.unknown_outcome_hold must be positive"
            ));
        }
        if let Some(reconcile) = &r.reconcile {
            if is_token {
                return Err(format!("route {name:?}: [route.reconcile] applies to key routes, not mode = \"token\""));
            }
            reconcile.check(key.sources.len()).map_err(|e| format!("route {name:?}: [route.reconcile] {e}"))?;
        }
        if let Some(body) = &r.duplicate.body {
            super::answers::check_body(body, &r.duplicate.content_type)
                .map_err(|e| format!("route {name:?}: [route.duplicate] `body` {e}"))?;
        }
        Ok(RoutePolicy {
            name: r.name,
            matcher,
            mode: r.mode,
            store: r.store,
            max_body_bytes: r.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES),
            max_response_bytes,
            key,
            token,
            duplicate: r.duplicate,
            answers: r.answers.or_else(|| self.answers.clone()).unwrap_or_default(),
            forward: r.forward,
            upstream_timeout: r.upstream_timeout,
            reconcile: r.reconcile,
        })
    }

    /// `role = "admin"`: no routes, and an `[admin]` secret long enough that it cannot be guessed;
    /// `[admin]` in any other bundle is a mistake.
    fn check_admin(&self) -> Result<(), (&'static str, String)> {
        let error = |needle: &'static str, message: String| (needle, message);
        match (self.role, &self.admin) {
            (Role::Admin, _) if !self.route.is_empty() => Err(error(
                "role",
                "role = \"admin\" serves the operator's listener only: it takes no [[route]] (the gateway's bundle has them)"
                    .into(),
            )),
            (Role::Admin, None) => Err(error(
                "role",
                "role = \"admin\" needs an [admin] table with a `secret` (at least 32 characters, e.g. `openssl rand -base64 32`)".into(),
            )),
            (Role::Admin, Some(a)) if a.secret.chars().count() < MIN_ADMIN_SECRET => Err(error(
                "secret",
                format!(
                    "[admin] `secret` has {} characters; at least {MIN_ADMIN_SECRET} (random, e.g. `openssl rand -base64 32`)",
                    a.secret.chars().count()
                ),
            )),
            (Role::Admin, Some(a)) if a.secret.bytes().any(|b| !b.is_ascii_graphic()) => Err(error(
                "secret",
                "[admin] `secret` must be printable ASCII without spaces: it travels in an `authorization: Bearer` header".into(),
            )),
            (Role::Gateway | Role::Echo, Some(_)) => Err(error(
                "[admin]",
                "[admin] belongs to the operator's listener: a bundle of its own with role = \"admin\" (docs/unknown-outcomes.md)".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// The shortest `[admin] secret`: 32 characters of a random secret cannot be guessed.
const MIN_ADMIN_SECRET: usize = 32;

/// The default `max_body_bytes`: Envoy's default buffer limit (`per_connection_buffer_limit_bytes`,
/// 1 MiB), the largest body Envoy buffers for a filter anyway; above it Envoy answers 413 itself.
const DEFAULT_MAX_BODY_BYTES: u32 = 1 << 20;

/// The longest composite key: more parts than this is a mistake, not a key.
const MAX_KEY_PARTS: usize = 8;

/// The key's parts (`key_sources_as_named`), none of them a header that Envoy or a proxy writes.
fn key_sources(key: &KeyPolicy) -> Result<Vec<Source>, String> {
    let sources = key_sources_as_named(key)?;
    for s in &sources {
        if let Source::Header(h) = s {
            if let Some(why) = super::generated_header(h) {
                let field = if key.parts.is_empty() { "key.name" } else { "key.parts" };
                return Err(format!(
                    "{field}: header {h:?} cannot be an idempotency key: it {why}, so it does not \
                     identify one intended action; key on a value the client sends again on every retry \
                     (Idempotency-Key)"
                ));
            }
        }
    }
    Ok(sources)
}

/// The key's parts: `key.parts`, or the one `key.from` + `key.name` name.
fn key_sources_as_named(key: &KeyPolicy) -> Result<Vec<Source>, String> {
    if key.protocol == KeyProtocol::RepeatableRequests {
        if key.from.is_some() || key.name.is_some() || !key.parts.is_empty() {
            return Err(format!(
                "key.protocol = \"repeatable-requests\" reads the key from the {} header: drop key.from, \
                 key.name and key.parts",
                super::REPEATABILITY_REQUEST_ID
            ));
        }
        return Ok(vec![Source::Header(super::REPEATABILITY_REQUEST_ID.to_string())]);
    }
    if !key.parts.is_empty() {
        if key.from.is_some() || key.name.is_some() {
            return Err("key.parts names every part of the key: drop key.from and key.name".into());
        }
        if key.parts.len() > MAX_KEY_PARTS {
            return Err(format!("key.parts has {} parts; at most {MAX_KEY_PARTS}", key.parts.len()));
        }
        if let Some((i, dup)) = key.parts.iter().enumerate().find(|(i, p)| key.parts[..*i].contains(p)) {
            return Err(format!(
                "key.parts names {dup} twice (parts #{} and #{})",
                key.parts[..i].iter().position(|p| p == dup).unwrap_or(0) + 1,
                i + 1
            ));
        }
        return Ok(key.parts.clone());
    }
    let from = key.from.unwrap_or(KeySource::Header);
    let name = key.name.as_deref().unwrap_or("Idempotency-Key");
    let source = match from {
        KeySource::Header => Source::Header(name.to_string()),
        KeySource::Query => Source::Query(name.to_string()),
        KeySource::Form => Source::Form(name.to_string()),
        KeySource::Body if name.starts_with('/') => Source::Body(name.to_string()),
        KeySource::Body => {
            return Err(format!(
                "key.name {name:?} must be a JSON pointer like \"/transaction_id\" when key.from = \"body\""
            ))
        }
        KeySource::Xml => Source::Xml(super::xml_path(name).map_err(|e| format!("key.name {name:?}: {e}"))?),
        KeySource::Path if super::is_param_name(name) => Source::Path(name.to_string()),
        KeySource::Path => {
            return Err(format!(
                "key.name {name:?} must be the name of a path template parameter when key.from = \"path\""
            ))
        }
        KeySource::Cloudevent => Source::parse(&format!("cloudevent:{name}")).map_err(|e| format!("key.name: {e}"))?,
    };
    Ok(vec![source])
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
