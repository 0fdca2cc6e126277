//! The proxy-wasm glue: Envoy callbacks in, [`Engine`] decisions out. No policy logic here.
//!
//! Hostcalls go through `proxy_wasm::hostcalls`, which return `Result`; the SDK trait helpers that
//! `unwrap()` are never used, and clippy denies `unwrap`/`expect`/`panic` in this crate.

use crate::engine::{Action as Do, Ending, Engine, Outcome, Verdict};
use crate::host::{Host, HostError};
use crate::key::{truncated, RequestView};
use crate::policy::parse_bundle;
use crate::store::Ticket;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use std::rc::Rc;
use std::time::UNIX_EPOCH;

proxy_wasm::main! {{
    std::panic::set_hook(Box::new(|info| {
        let _ = hostcalls::log(LogLevel::Critical, &format!("idem: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { state: None }) });
}}

/// [`Host`] on Envoy's hostcalls.
struct Envoy;

impl Host for Envoy {
    fn now_ms(&self) -> u64 {
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(v), Some(cas))) => Ok(Some((v, cas))),
            Ok(_) => Ok(None),
            Err(s) => Err(HostError::Failed(format!("get_shared_data: {s:?}"))),
        }
    }
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(HostError::CasMismatch),
            Err(s) => Err(HostError::Failed(format!("set_shared_data: {s:?}"))),
        }
    }
    fn random_u64(&self) -> Result<u64, HostError> {
        getrandom::u64().map_err(|e| HostError::Failed(format!("random_get: {e}")))
    }
}

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// What every HTTP context of this worker shares: the engine and the counter ids.
struct State {
    engine: Engine,
    /// `counters[route][outcome.index()]`
    counters: Vec<Vec<Option<u32>>>,
}

impl State {
    fn count(&self, route: usize, outcome: Outcome) {
        if let Some(Some(id)) = self.counters.get(route).and_then(|c| c.get(outcome.index())) {
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }
}

struct Root {
    state: Option<Rc<State>>,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => Vec::new(),
            Err(s) => {
                log(LogLevel::Critical, &format!("idem: invalid policy: cannot read plugin configuration: {s:?}"));
                return false;
            }
        };
        let text = match String::from_utf8(config) {
            Ok(t) => t,
            Err(e) => {
                log(LogLevel::Critical, &format!("idem: invalid policy: plugin configuration is not UTF-8: {e}"));
                return false;
            }
        };
        let bundle = match parse_bundle(&text, "plugin configuration") {
            Ok(b) => b,
            Err(e) => {
                log(LogLevel::Critical, &format!("idem: invalid policy: {e}"));
                return false;
            }
        };
        let engine = Engine::new(bundle);
        match engine.initialise(&Envoy) {
            Ok(created) => log(
                LogLevel::Info,
                &format!(
                    "idem: loaded {} route policies; shared store {} buckets × {} entries ({} created)",
                    engine.bundle.routes.len(),
                    engine.bundle.shared.buckets,
                    engine.bundle.shared.entries_per_bucket,
                    created
                ),
            ),
            Err(e) => {
                log(LogLevel::Critical, &format!("idem: cannot initialise the shared store: {e}"));
                return false;
            }
        }
        let counters = engine
            .bundle
            .routes
            .iter()
            .map(|r| {
                Outcome::ALL
                    .iter()
                    .map(|o| {
                        hostcalls::define_metric(MetricType::Counter, &format!("idem.{}.{}", r.name, o.name())).ok()
                    })
                    .collect()
            })
            .collect();
        self.state = Some(Rc::new(State { engine, counters }));
        true
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let state = self.state.clone()?;
        Some(Box::new(Request {
            state,
            route: None,
            method: String::new(),
            path: String::new(),
            body: None,
            decided: false,
            ticket: None,
            response: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The response being captured for a claimed request.
struct Capture {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    overflow: bool,
    details: String,
}

struct Request {
    state: Rc<State>,
    route: Option<usize>,
    method: String,
    path: String,
    body: Option<Vec<u8>>,
    decided: bool,
    ticket: Option<Ticket>,
    response: Option<Capture>,
}

impl RequestView for Request {
    fn method(&self) -> &str {
        &self.method
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn header(&self, name: &str) -> Option<String> {
        hostcalls::get_map_value(MapType::HttpRequestHeaders, name).ok().flatten()
    }
    fn body(&self) -> Option<&[u8]> {
        self.body.as_deref()
    }
}

impl Request {
    /// Counts, logs and carries out a verdict; returns what to tell Envoy.
    fn apply(&mut self, route: usize, v: Verdict) -> Action {
        self.decided = true;
        self.state.count(route, v.outcome);
        let name = self.state.engine.policy(route).map(|p| p.name.as_str()).unwrap_or("?");
        let key = v.key.as_deref().map(truncated).unwrap_or_else(|| "-".into());
        let level = if v.outcome == Outcome::Forwarded { LogLevel::Debug } else { LogLevel::Info };
        log(level, &format!("idem: {} route={} key={} cause={}", v.outcome.name(), name, key, v.cause));
        match v.action {
            Do::Forward(ticket) => {
                self.ticket = ticket;
                Action::Continue
            }
            Do::Reply(r) => {
                let headers: Vec<(&str, &str)> = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                if let Err(s) = hostcalls::send_http_response(u32::from(r.status), headers, Some(&r.body)) {
                    log(LogLevel::Error, &format!("idem: send_http_response failed: {s:?}"));
                }
                Action::Pause
            }
        }
    }

    fn decide(&mut self, route: usize) -> Action {
        match self.state.engine.decide(&Envoy, route, self) {
            Some(v) => self.apply(route, v),
            None => Action::Continue,
        }
    }

    fn finish(&mut self, ending: Ending) {
        let (Some(route), Some(ticket)) = (self.route, self.ticket.take()) else {
            return;
        };
        let (outcome, cause) = self.state.engine.finish(&Envoy, route, &ticket, ending);
        self.state.count(route, outcome);
        if outcome != Outcome::Stored {
            let name = self.state.engine.policy(route).map(|p| p.name.as_str()).unwrap_or("?");
            log(LogLevel::Info, &format!("idem: {} route={} cause={}", outcome.name(), name, cause));
        }
    }

    fn finish_capture(&mut self) {
        if let Some(c) = self.response.take() {
            let body = if c.overflow { None } else { Some(c.body) };
            self.finish(Ending::Response { status: c.status, headers: c.headers, body, details: c.details });
        }
    }
}

impl Context for Request {}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let header = |n: &str| hostcalls::get_map_value(MapType::HttpRequestHeaders, n).ok().flatten();
        self.method = header(":method").unwrap_or_default();
        self.path = header(":path").unwrap_or_default();
        let route_name = || {
            hostcalls::get_property(vec!["xds", "route_name"]).ok().flatten().and_then(|b| String::from_utf8(b).ok())
        };
        let Some(route) = self.state.engine.bundle.find(&self.method, &self.path, route_name) else {
            return Action::Continue;
        };
        self.route = Some(route);
        if let Some(v) = self.state.engine.precheck(route, self) {
            return self.apply(route, v);
        }
        let needs_body = self.state.engine.policy(route).is_some_and(|p| p.needs_body());
        if needs_body && !end_of_stream {
            // With allow_on_headers_stop_iteration, the body still reaches on_http_request_body.
            return Action::Pause;
        }
        self.decide(route)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(route) = self.route else {
            return Action::Continue;
        };
        if self.decided {
            return Action::Continue;
        }
        let limit = self.state.engine.policy(route).map(|p| p.max_body_bytes as usize).unwrap_or(0);
        if body_size > limit {
            return match self.state.engine.body_too_large(route) {
                Some(v) => self.apply(route, v),
                None => Action::Continue,
            };
        }
        if !end_of_stream {
            // Envoy buffers and calls again with the cumulative size.
            return Action::Pause;
        }
        self.body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size).ok().flatten();
        self.decide(route)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        match self.route {
            Some(route) if !self.decided => {
                self.body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, usize::MAX).ok().flatten();
                self.decide(route)
            }
            _ => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.ticket.is_none() {
            return Action::Continue;
        }
        let status = hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.parse::<u16>().ok())
            .unwrap_or(0);
        let details = if status >= 500 {
            hostcalls::get_property(vec!["response", "code_details"])
                .ok()
                .flatten()
                .and_then(|b| String::from_utf8(b).ok())
                .unwrap_or_default()
        } else {
            String::new()
        };
        let headers = hostcalls::get_map(MapType::HttpResponseHeaders).unwrap_or_default();
        self.response = Some(Capture { status, headers, body: Vec::new(), overflow: false, details });
        if end_of_stream {
            self.finish_capture();
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let limit =
            self.route.and_then(|r| self.state.engine.policy(r)).map(|p| p.max_response_bytes as usize).unwrap_or(0);
        if let Some(c) = self.response.as_mut() {
            if !c.overflow && body_size > 0 {
                // Not pausing: each call carries only the new chunk, and the client is not delayed.
                match hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size) {
                    Ok(Some(chunk)) if c.body.len() + chunk.len() <= limit => c.body.extend_from_slice(&chunk),
                    Ok(None) => {}
                    _ => {
                        c.overflow = true;
                        c.body = Vec::new();
                    }
                }
            }
        }
        if end_of_stream {
            self.finish_capture();
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.finish_capture();
        Action::Continue
    }

    fn on_log(&mut self) {
        if self.ticket.is_none() {
            return;
        }
        if self.response.is_some() {
            // Headers came back but the body was not seen to the end: the work was done.
            if let Some(c) = self.response.as_mut() {
                c.overflow = true;
            }
            self.finish_capture();
        } else {
            self.finish(Ending::NoResponse { forwarded: true });
        }
    }
}
