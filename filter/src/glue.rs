//! The proxy-wasm glue: Envoy callbacks in, [`Engine`] decisions out, Webdis calls carried. No
//! policy logic here.
//!
//! Hostcalls go through `proxy_wasm::hostcalls`, which return `Result`; the SDK trait helpers that
//! `unwrap()` are never used, and clippy denies `unwrap`/`expect`/`panic` in this crate.
//!
//! Held duplicates (`on_in_flight = "wait"`) have no timer of their own: the root context polls
//! the store for them on its tick and acts on the held request with `set_effective_context`.

use crate::engine::{
    Action as Do, Begin, Ending, Engine, Finish, Issue, Outcome, Prepared, StoreOp, StoreTicket, Ticket, Verdict,
};
use crate::host::{Host, HostError};
use crate::key::{truncated, RequestView};
use crate::policy::{parse_bundle, StoreKind};
use crate::store::{redis, StoreError};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType, Status};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

proxy_wasm::main! {{
    std::panic::set_hook(Box::new(|info| {
        let _ = hostcalls::log(LogLevel::Critical, &format!("idem: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { state: None }) });
}}

/// How often held duplicates are re-checked.
const WAIT_POLL: Duration = Duration::from_millis(20);

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
    /// Owner ids need to be unique across workers, not secret: SplitMix64 seeded once per VM
    /// from WASI `random_get`, instead of a host call per claim.
    fn random_u64(&self) -> Result<u64, HostError> {
        OWNER_SEED.with(|seed| {
            let mut s = seed.get();
            if s == 0 {
                s = getrandom::u64().map_err(|e| HostError::Failed(format!("random_get: {e}")))? | 1;
            }
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            seed.set(s);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            Ok(z ^ (z >> 31))
        })
    }
}

thread_local! {
    static OWNER_SEED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// A held duplicate, polled by the root context.
struct Waiter {
    prepared: Prepared,
    deadline_ms: u64,
    /// A Webdis poll is on its way (Redis routes).
    polling: bool,
}

/// What every context of this worker shares.
struct State {
    engine: Engine,
    /// `counters[route][outcome.index()]`
    counters: Vec<Vec<Option<u32>>>,
    /// Held duplicates by HTTP context id.
    waiters: RefCell<HashMap<u32, Waiter>>,
    /// Root-context Webdis polls: callout token → (HTTP context id, the poll's claim ticket).
    polls: RefCell<HashMap<u32, (u32, redis::Ticket)>>,
    /// Envoy's log level for the `wasm` component when the plugin configured (as u32), so
    /// debug lines are not even formatted when they would be dropped.
    log_level: u32,
    /// Tickets (and keys) won by a waiter on the root's tick, picked up by its HTTP context.
    handoff: RefCell<HashMap<u32, (Ticket, String)>>,
    /// Redis completions, releases and restores waiting to be sent by the root context.
    outbox: RefCell<Vec<Job>>,
    /// Root-context Webdis calls finishing a request: callout token → job.
    finishing: RefCell<HashMap<u32, Job>>,
    /// This worker's wake-up queue: an HTTP context enqueues, the root's on_queue_ready sends.
    wake_queue: Option<u32>,
}

/// Finishing a Redis ticket: sent by the root context, so it completes even though the
/// request's stream (and with it any callout the stream owns) is gone by then.
struct Job {
    route: usize,
    key: Option<String>,
    /// The HTTP context whose response is held until this job is done.
    resume: Option<u32>,
    cmd: redis::Command,
    kind: FinishKind,
    cause: String,
}

impl State {
    fn count(&self, route: usize, outcome: Outcome) {
        if let Some(Some(id)) = self.counters.get(route).and_then(|c| c.get(outcome.index())) {
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }

    fn route_name(&self, route: usize) -> &str {
        self.engine.policy(route).map(|p| p.name.as_str()).unwrap_or("?")
    }

    /// Counts and logs a verdict (one log line per interception).
    fn record(&self, route: usize, v: &Verdict) {
        self.count(route, v.outcome);
        let quiet = matches!(v.outcome, Outcome::Forwarded | Outcome::TokenConsumed | Outcome::TokenIssued)
            || matches!(v.action, Do::Wait { .. });
        let level = if quiet { LogLevel::Debug } else { LogLevel::Info };
        if (level as u32) < self.log_level {
            return;
        }
        let key = v.key.as_deref().map(truncated).unwrap_or_else(|| "-".into());
        log(
            level,
            &format!("idem: {} route={} key={} cause={}", v.outcome.name(), self.route_name(route), key, v.cause),
        );
    }

    fn record_finish(&self, route: usize, outcome: Option<Outcome>, key: Option<&str>, cause: &str) {
        if let Some(o) = outcome {
            self.count(route, o);
            if o != Outcome::Stored {
                let key = key.map(truncated).unwrap_or_else(|| "-".into());
                log(
                    LogLevel::Info,
                    &format!("idem: {} route={} key={} cause={}", o.name(), self.route_name(route), key, cause),
                );
            }
        }
    }

    /// Sends a Webdis command through the `[redis]` cluster.
    fn dispatch(&self, cmd: &redis::Command) -> Result<u32, StoreError> {
        let (Some(cfg), Some(store)) = (self.engine.bundle.redis.as_ref(), self.engine.redis()) else {
            return Err(StoreError::Host("no [redis] table".into()));
        };
        let headers = store.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        hostcalls::dispatch_http_call(
            &cfg.cluster,
            headers,
            Some(cmd.body.as_bytes()),
            vec![],
            Duration::from_millis(cfg.timeout.millis.max(1)),
        )
        .map_err(|s| StoreError::Host(format!("dispatch_http_call to cluster {}: {s:?}", cfg.cluster)))
    }

    /// Sends queued finish jobs (root context only: the callouts belong to the root).
    fn send_outbox(&self) {
        let jobs: Vec<Job> = self.outbox.borrow_mut().drain(..).collect();
        for job in jobs {
            match self.dispatch(&job.cmd) {
                Ok(token) => {
                    self.finishing.borrow_mut().insert(token, job);
                }
                Err(e) => {
                    let cause = format!("{}; {e}", job.cause);
                    self.record_finish(job.route, Some(Outcome::StoreError), job.key.as_deref(), &cause);
                    if let Some(ctx) = job.resume {
                        if hostcalls::set_effective_context(ctx).is_ok() {
                            let _ = hostcalls::resume_http_response();
                        }
                    }
                }
            }
        }
    }

    /// The reply to a finish job.
    fn finished(&self, job: Job, status: u16, body: &[u8]) {
        let Some(store) = self.engine.redis() else {
            return;
        };
        let applied = store.parse_update(status, body);
        let (outcome, cause) = match job.kind {
            FinishKind::Release => crate::engine::released(applied, job.cause),
            FinishKind::Restore => crate::engine::restored(applied, job.cause),
            FinishKind::Complete { tombstone } => {
                let done = applied.map(|ok| match (ok, tombstone) {
                    (false, _) => crate::store::Completion::LostOwnership,
                    (true, true) => crate::store::Completion::Tombstoned,
                    (true, false) => crate::store::Completion::Stored,
                });
                crate::engine::completed(done, job.cause)
            }
        };
        self.record_finish(job.route, outcome, job.key.as_deref(), &cause);
        if let Some(ctx) = job.resume {
            // The client gets its answer only now, so its next retry finds the record written.
            if hostcalls::set_effective_context(ctx).is_ok() {
                let _ = hostcalls::resume_http_response();
            }
        }
    }

    /// A held request's verdict, acted on from the root context.
    fn resolve_waiter(&self, ctx: u32, v: Verdict) {
        let route = {
            let mut waiters = self.waiters.borrow_mut();
            match &v.action {
                Do::Wait { .. } => {
                    if let Some(w) = waiters.get_mut(&ctx) {
                        w.polling = false;
                    }
                    return;
                }
                _ => match waiters.remove(&ctx) {
                    Some(w) => w.prepared.route,
                    None => return, // the client went away meanwhile
                },
            }
        };
        self.record(route, &v);
        if hostcalls::set_effective_context(ctx).is_err() {
            return;
        }
        match v.action {
            Do::Forward(ticket) => {
                if let Some(t) = ticket {
                    self.handoff.borrow_mut().insert(ctx, (t, v.key.unwrap_or_default()));
                }
                let _ = hostcalls::resume_http_request();
            }
            Do::Reply(r) => send(&r),
            Do::Wait { .. } => {}
        }
    }
}

fn send(r: &crate::response::LocalReply) {
    let headers: Vec<(&str, &str)> = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    if let Err(s) = hostcalls::send_http_response(u32::from(r.status), headers, Some(&r.body)) {
        log(LogLevel::Error, &format!("idem: send_http_response failed: {s:?}"));
    }
}

/// The callout reply being handled: HTTP status (0 when the callout failed) and body.
fn call_response(num_headers: usize, body_size: usize) -> (u16, Vec<u8>) {
    let status = if num_headers == 0 {
        0
    } else {
        hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default();
    (status, body)
}

struct Root {
    state: Option<Rc<State>>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        let Some(state) = self.state.clone() else {
            return;
        };
        let job = state.finishing.borrow_mut().remove(&token);
        if let Some(job) = job {
            let (status, body) = call_response(num_headers, body_size);
            state.finished(job, status, &body);
            return;
        }
        let Some((ctx, ticket)) = state.polls.borrow_mut().remove(&token) else {
            return;
        };
        let (status, body) = call_response(num_headers, body_size);
        let pending = state.waiters.borrow().get(&ctx).map(|w| (w.prepared.clone(), w.deadline_ms));
        let (Some((prepared, deadline)), Some(store)) = (pending, state.engine.redis()) else {
            return;
        };
        let StoreOp::Claim { fingerprint, .. } = &prepared.op else {
            return;
        };
        let claim = store.parse_claim(ticket, fingerprint, status, &body).map(|c| c.map(StoreTicket::Redis));
        let v = state.engine.after_claim(&prepared, claim, Envoy.now_ms(), Some(deadline));
        state.resolve_waiter(ctx, v);
    }
}

impl RootContext for Root {
    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue_id) {}
        if let Some(state) = self.state.clone() {
            state.send_outbox();
        }
    }

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
        let uses_redis = engine.bundle.routes.iter().any(|r| r.store == StoreKind::Redis);
        if engine.has_waiters() || uses_redis {
            // Polls held duplicates; for Redis also a backstop that sends queued finish jobs.
            if let Err(s) = hostcalls::set_tick_period(WAIT_POLL) {
                log(LogLevel::Critical, &format!("idem: cannot start the root timer: {s:?}"));
                return false;
            }
        }
        // A queue of this worker's own (unique name): enqueueing wakes this root promptly.
        let wake_queue = if uses_redis {
            let name = format!("idem-finish-{:016x}", Envoy.random_u64().unwrap_or(0));
            hostcalls::register_shared_queue(&name).ok()
        } else {
            None
        };
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
        let log_level = hostcalls::get_log_level().map(|l| l as u32).unwrap_or(0);
        self.state = Some(Rc::new(State {
            engine,
            counters,
            log_level,
            waiters: RefCell::new(HashMap::new()),
            polls: RefCell::new(HashMap::new()),
            handoff: RefCell::new(HashMap::new()),
            outbox: RefCell::new(Vec::new()),
            finishing: RefCell::new(HashMap::new()),
            wake_queue,
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(state) = self.state.clone() else {
            return;
        };
        state.send_outbox();
        let due: Vec<(u32, Prepared, u64)> = state
            .waiters
            .borrow()
            .iter()
            .filter(|(_, w)| !w.polling)
            .map(|(ctx, w)| (*ctx, w.prepared.clone(), w.deadline_ms))
            .collect();
        for (ctx, prepared, deadline) in due {
            let redis_route = state.engine.policy(prepared.route).is_some_and(|p| p.store == StoreKind::Redis);
            if !redis_route {
                let v = state.engine.run_shared(&Envoy, &prepared, Some(deadline));
                state.resolve_waiter(ctx, v);
                continue;
            }
            let (Some(store), StoreOp::Claim { id, fingerprint }) = (state.engine.redis(), &prepared.op) else {
                continue;
            };
            let now = Envoy.now_ms();
            let owner = Envoy.random_u64().unwrap_or(now);
            let lock_ttl = state.engine.policy(prepared.route).map(|p| p.key.lock_ttl.millis).unwrap_or(1);
            let (cmd, ticket) = store.claim(id, fingerprint, owner, now, lock_ttl);
            match state.dispatch(&cmd) {
                Ok(token) => {
                    state.polls.borrow_mut().insert(token, (ctx, ticket));
                    if let Some(w) = state.waiters.borrow_mut().get_mut(&ctx) {
                        w.polling = true;
                    }
                }
                Err(e) => {
                    let v = state.engine.after_claim(&prepared, Err(e), now, Some(deadline));
                    state.resolve_waiter(ctx, v);
                }
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let state = self.state.clone()?;
        Some(Box::new(Request {
            state,
            context_id,
            route: None,
            method: String::new(),
            path: String::new(),
            body: None,
            decided: false,
            forwarded: false,
            ticket: None,
            key: None,
            pending: None,
            response: None,
            holding: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// The response being captured for a request that holds a ticket.
struct Capture {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    overflow: bool,
    details: String,
}

/// A Webdis call this HTTP context is waiting for.
enum Pending {
    Claim { prepared: Prepared, ticket: redis::Ticket },
    UseToken { prepared: Prepared, ticket: redis::Ticket },
    Issue { route: usize, token: String },
}

enum FinishKind {
    Release,
    Complete { tombstone: bool },
    Restore,
}

struct Request {
    state: Rc<State>,
    context_id: u32,
    route: Option<usize>,
    method: String,
    path: String,
    body: Option<Vec<u8>>,
    decided: bool,
    forwarded: bool,
    ticket: Option<Ticket>,
    /// The client's key or token, for log lines when the request finishes.
    key: Option<String>,
    pending: Option<Pending>,
    response: Option<Capture>,
    /// The response is held until the root context has written the outcome (Redis).
    holding: bool,
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
    fn redis_route(&self, route: usize) -> bool {
        self.state.engine.policy(route).is_some_and(|p| p.store == StoreKind::Redis)
    }

    /// Counts, logs and carries out a verdict. `paused` says the request is already paused (a
    /// callout answered), so forwarding means resuming it.
    fn apply(&mut self, route: usize, v: Verdict, paused: bool) -> Action {
        self.decided = true;
        self.state.record(route, &v);
        self.key = v.key.clone();
        match v.action {
            Do::Forward(ticket) => {
                self.ticket = ticket;
                self.forwarded = true;
                if paused {
                    let _ = hostcalls::resume_http_request();
                }
                Action::Continue
            }
            Do::Reply(r) => {
                send(&r);
                Action::Pause
            }
            Do::Wait { prepared, deadline_ms } => {
                let w = Waiter { prepared: *prepared, deadline_ms, polling: false };
                self.state.waiters.borrow_mut().insert(self.context_id, w);
                Action::Pause
            }
        }
    }

    /// Decides with the key (and body) at hand: synchronously on the shared store, or by
    /// sending one Webdis call and pausing.
    fn decide(&mut self, route: usize) -> Action {
        // Decided once: body chunks that arrive while a Webdis call is out must not decide again.
        self.decided = true;
        let Some(begin) = self.state.engine.begin(route, self) else {
            return Action::Continue;
        };
        let prepared = match begin {
            Begin::Done(v) => return self.apply(route, v, false),
            Begin::Store(p) => p,
        };
        if !self.redis_route(route) {
            let v = self.state.engine.run_shared(&Envoy, &prepared, None);
            return self.apply(route, v, false);
        }
        let Some(store) = self.state.engine.redis() else {
            return Action::Continue;
        };
        let now = Envoy.now_ms();
        let owner = Envoy.random_u64().unwrap_or(now);
        let (cmd, pending) = match &prepared.op {
            StoreOp::Claim { id, fingerprint } => {
                let lock_ttl = self.state.engine.policy(route).map(|p| p.key.lock_ttl.millis).unwrap_or(1);
                let (cmd, ticket) = store.claim(id, fingerprint, owner, now, lock_ttl);
                (cmd, Pending::Claim { prepared: prepared.clone(), ticket })
            }
            StoreOp::UseToken { id } => {
                let (cmd, ticket) = store.use_token(id, owner, now);
                (cmd, Pending::UseToken { prepared: prepared.clone(), ticket })
            }
        };
        match self.state.dispatch(&cmd) {
            Ok(_) => {
                self.pending = Some(pending);
                Action::Pause
            }
            Err(e) => {
                let v = match prepared.op {
                    StoreOp::Claim { .. } => self.state.engine.after_claim(&prepared, Err(e), now, None),
                    StoreOp::UseToken { .. } => self.state.engine.after_token(&prepared, Err(e)),
                };
                self.apply(route, v, false)
            }
        }
    }

    /// Serves the token issue endpoint, if this request is for it.
    fn issue(&mut self) -> Option<Action> {
        let mut random = [0u8; 16];
        if getrandom::fill(&mut random).is_err() {
            log(LogLevel::Error, "idem: random_get failed; cannot issue tokens");
            return None;
        }
        match self.state.engine.issue(&self.method, &self.path, self, random)? {
            Issue::Reply { route, reply, cause } => {
                if let Some(r) = route {
                    self.state.count(r, Outcome::TokenRejected);
                }
                log(LogLevel::Info, &format!("idem: token_issue_refused path={} cause={cause}", self.path));
                send(&reply);
                Some(Action::Pause)
            }
            Issue::Token { route, token, id } => {
                self.route = Some(route);
                self.decided = true;
                if !self.redis_route(route) {
                    let stored = self.state.engine.issue_shared(&Envoy, route, &id);
                    let v = self.state.engine.issued(route, &token, Envoy.now_ms(), stored);
                    return Some(self.apply(route, v, false));
                }
                let ttl = self.state.engine.policy(route).map(|p| p.token.ttl.millis).unwrap_or(1);
                let cmd = self.state.engine.redis().map(|s| s.issue_token(&id, Envoy.now_ms(), ttl));
                match cmd.map(|c| self.state.dispatch(&c)) {
                    Some(Ok(_)) => {
                        self.pending = Some(Pending::Issue { route, token });
                        Some(Action::Pause)
                    }
                    Some(Err(e)) => {
                        let v = self.state.engine.issued(route, &token, Envoy.now_ms(), Err(e));
                        Some(self.apply(route, v, false))
                    }
                    None => None,
                }
            }
        }
    }

    /// Reports how the forwarded request ended. On Redis the write is handed to the root
    /// context (a callout owned by this stream would be cancelled if the client went away).
    /// Returns `Pause` when the response is held until the root has written the outcome.
    fn finish(&mut self, ending: Ending) -> Action {
        let (Some(route), Some(ticket)) = (self.route, self.ticket.take()) else {
            return Action::Continue;
        };
        let store_ticket = match &ticket {
            Ticket::Claim(t) | Ticket::Token(t) => t,
        };
        let StoreTicket::Redis(rt) = store_ticket else {
            let (outcome, cause) = self.state.engine.finish_shared(&Envoy, route, &ticket, ending);
            self.state.record_finish(route, outcome, self.key.as_deref(), &cause);
            return Action::Continue;
        };
        let Some(store) = self.state.engine.redis() else {
            return Action::Continue;
        };
        let (cmd, kind, cause) = match self.state.engine.plan_finish(route, &ticket, &ending) {
            Finish::Nothing { outcome, cause } => {
                self.state.record_finish(route, outcome, self.key.as_deref(), &cause);
                return Action::Continue;
            }
            Finish::Release { cause } => (store.release(rt), FinishKind::Release, cause),
            Finish::RestoreToken { cause } => (store.restore_token(rt), FinishKind::Restore, cause),
            Finish::Complete { response, max_response_bytes, ttl_ms, cause } => {
                let (cmd, tombstone) = store.complete(rt, &response, max_response_bytes, ttl_ms);
                (cmd, FinishKind::Complete { tombstone }, cause)
            }
        };
        let resume = if self.holding { Some(self.context_id) } else { None };
        self.holding = false;
        self.state.outbox.borrow_mut().push(Job { route, key: self.key.clone(), resume, cmd, kind, cause });
        if let Some(q) = self.state.wake_queue {
            let _ = hostcalls::enqueue_shared_queue(q, Some(b"1"));
        }
        if resume.is_some() {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn finish_capture(&mut self) -> Action {
        match self.response.take() {
            Some(c) => {
                let body = if c.overflow { None } else { Some(c.body) };
                self.finish(Ending::Response { status: c.status, headers: c.headers, body, details: c.details })
            }
            None => Action::Continue,
        }
    }

    fn take_handoff(&mut self) {
        if self.ticket.is_none() {
            if let Some((t, key)) = self.state.handoff.borrow_mut().remove(&self.context_id) {
                self.ticket = Some(t);
                self.key = Some(key);
                self.forwarded = true;
            }
        }
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        let (status, body) = call_response(num_headers, body_size);
        let Some(store) = self.state.engine.redis() else {
            return;
        };
        let now = Envoy.now_ms();
        match self.pending.take() {
            Some(Pending::Claim { prepared, ticket }) => {
                let fp = match &prepared.op {
                    StoreOp::Claim { fingerprint, .. } => *fingerprint,
                    StoreOp::UseToken { .. } => [0; 32],
                };
                let claim = store.parse_claim(ticket, &fp, status, &body).map(|c| c.map(StoreTicket::Redis));
                let v = self.state.engine.after_claim(&prepared, claim, now, None);
                self.apply(prepared.route, v, true);
            }
            Some(Pending::UseToken { prepared, ticket }) => {
                let used = store.parse_use_token(ticket, status, &body).map(|u| u.map(StoreTicket::Redis));
                let v = self.state.engine.after_token(&prepared, used);
                self.apply(prepared.route, v, true);
            }
            Some(Pending::Issue { route, token }) => {
                let stored = store.parse_ok(status, &body);
                let v = self.state.engine.issued(route, &token, now, stored);
                self.apply(route, v, true);
            }
            None => {}
        }
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let header = |n: &str| hostcalls::get_map_value(MapType::HttpRequestHeaders, n).ok().flatten();
        self.path = header(":path").unwrap_or_default();
        if self.state.engine.is_issue_path(&self.path) {
            self.method = header(":method").unwrap_or_default();
            if let Some(action) = self.issue() {
                return action;
            }
        }
        let route_name = || {
            hostcalls::get_property(vec!["xds", "route_name"]).ok().flatten().and_then(|b| String::from_utf8(b).ok())
        };
        let method = || header(":method").unwrap_or_default();
        let Some(route) = self.state.engine.bundle.find(method, &self.path, route_name) else {
            return Action::Continue;
        };
        self.route = Some(route);
        if self.method.is_empty() {
            self.method = header(":method").unwrap_or_default();
        }
        if let Some(v) = self.state.engine.precheck(route, self) {
            return self.apply(route, v, false);
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
            return if self.pending.is_some() { Action::Pause } else { Action::Continue };
        }
        let limit = self.state.engine.policy(route).map(|p| p.max_body_bytes as usize).unwrap_or(0);
        if body_size > limit {
            return match self.state.engine.body_too_large(route) {
                Some(v) => self.apply(route, v, false),
                None => Action::Continue,
            };
        }
        if !end_of_stream {
            // Envoy buffers and calls again with the cumulative size.
            return Action::Pause;
        }
        self.body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size).ok().flatten();
        self.decided = true;
        self.decide(route)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        match self.route {
            Some(route) if !self.decided => {
                self.body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, usize::MAX).ok().flatten();
                self.decided = true;
                self.decide(route)
            }
            _ => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.take_handoff();
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
        // On Redis the response is held (buffered) until the outcome is written, so a retry
        // after the client got its answer always finds it.
        self.holding =
            matches!(self.ticket, Some(Ticket::Claim(StoreTicket::Redis(_)) | Ticket::Token(StoreTicket::Redis(_))));
        if end_of_stream {
            return self.finish_capture();
        }
        if self.holding {
            Action::Pause
        } else {
            Action::Continue
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let limit =
            self.route.and_then(|r| self.state.engine.policy(r)).map(|p| p.max_response_bytes as usize).unwrap_or(0);
        if self.holding {
            // Envoy buffers and calls again with the cumulative size; read the whole body once.
            if body_size > limit {
                // Too large to remember (a tombstone): stop holding, let it stream.
                self.holding = false;
                if let Some(c) = self.response.as_mut() {
                    c.overflow = true;
                }
            } else if !end_of_stream {
                return Action::Pause;
            } else {
                if let Some(c) = self.response.as_mut() {
                    let body = hostcalls::get_buffer(BufferType::HttpResponseBody, 0, body_size).ok().flatten();
                    c.body = body.unwrap_or_default();
                }
                return self.finish_capture();
            }
        }
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
            return self.finish_capture();
        }
        Action::Continue
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        self.finish_capture()
    }

    fn on_log(&mut self) {
        self.state.waiters.borrow_mut().remove(&self.context_id);
        self.take_handoff();
        if self.ticket.is_none() {
            return;
        }
        if self.response.is_some() {
            // Headers came back but the body was not seen to the end: the work was done.
            if let Some(c) = self.response.as_mut() {
                c.overflow = true;
            }
            self.holding = false;
            self.finish_capture();
        } else {
            self.finish(Ending::NoResponse { forwarded: self.forwarded });
        }
    }
}
