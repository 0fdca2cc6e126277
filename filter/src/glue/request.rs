//! The HTTP context: one request's way through the filter — find its policy, read the key
//! (and body), decide on the shared store or through one Webdis call, capture the response,
//! and report how it ended.

use super::abi;
use super::envoy::{log, Envoy, Level};
use super::state::{send, After, Detached, LeaseOwner, State, Waiter};
use crate::engine::{Action as Do, Begin, Ending, Issue, Outcome, Prepared, StoreOp, StoreTicket, Ticket, Verdict};
use crate::host::Host;
use crate::key::RequestView;
use crate::pairs::Pair;
use crate::policy::Forward;
use crate::response::Header;
use crate::store::redis;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;
use std::rc::Rc;

/// The response being captured for a request that holds a ticket.
pub(super) struct Capture {
    pub(super) status: u16,
    pub(super) headers: Vec<Header>,
    pub(super) body: Vec<u8>,
    /// Not storable whole (too large, trailers, not seen to the end): a tombstone is stored.
    pub(super) incomplete: bool,
    pub(super) details: String,
}

/// A Webdis call this HTTP context is waiting for.
pub(super) enum Pending {
    Claim { prepared: Prepared, ticket: redis::Ticket },
    UseToken { prepared: Prepared, ticket: redis::Ticket },
    Issue { route: usize, token: String },
}

pub(super) struct Request {
    pub(super) state: Rc<State>,
    pub(super) context_id: u32,
    pub(super) route: Option<usize>,
    pub(super) method: String,
    pub(super) path: String,
    /// The request headers, read once (as bytes) when a policy matched.
    pub(super) headers: Vec<Pair>,
    pub(super) body: Option<Vec<u8>>,
    pub(super) decided: bool,
    pub(super) forwarded: bool,
    pub(super) ticket: Option<Ticket>,
    /// The client's key or token, for log lines when the request finishes.
    pub(super) key: Option<String>,
    pub(super) pending: Option<Pending>,
    pub(super) response: Option<Capture>,
    /// The response is held until the root context has written the outcome (Redis).
    pub(super) holding: bool,
}

impl Request {
    pub(super) fn new(state: Rc<State>, context_id: u32) -> Self {
        Request {
            state,
            context_id,
            route: None,
            method: String::new(),
            path: String::new(),
            headers: Vec::new(),
            body: None,
            decided: false,
            forwarded: false,
            ticket: None,
            key: None,
            pending: None,
            response: None,
            holding: false,
        }
    }
}

impl RequestView for Request {
    fn method(&self) -> &str {
        &self.method
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v.as_slice())
            .collect()
    }
    fn body(&self) -> Option<&[u8]> {
        self.body.as_deref()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        abi::property(path).ok().flatten()
    }
}

fn text(bytes: Option<Vec<u8>>) -> String {
    bytes.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

impl Request {
    /// Counts, logs and carries out a verdict. `paused` says the request is already paused (a
    /// callout answered), so forwarding means resuming it.
    pub(super) fn apply(&mut self, route: usize, v: Verdict, paused: bool) -> Action {
        self.decided = true;
        self.state.record(route, &v);
        self.key = v.key.clone();
        match v.action {
            Do::Forward(Some(ticket)) if self.detached(route) => self.send_detached(route, ticket),
            Do::Forward(ticket) => {
                if let Some(t) = &ticket {
                    self.state.hold_lease(LeaseOwner::Request(self.context_id), route, t);
                }
                self.ticket = ticket;
                self.forwarded = true;
                if paused {
                    let _ = abi::resume_request();
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

    fn detached(&self, route: usize) -> bool {
        self.state.engine.policy(route).is_some_and(|p| p.forward == Forward::Detached)
    }

    /// Hands a claimed request to the root context, which sends it upstream itself; this
    /// request stays paused until the root answers it (or its client leaves).
    fn send_detached(&mut self, route: usize, ticket: Ticket) -> Action {
        let (Ticket::Claim(st) | Ticket::Token(st)) = &ticket;
        let first_seen_ms = match st {
            StoreTicket::Shared(t) => t.first_seen_ms,
            StoreTicket::Redis(t) => t.first_seen_ms,
        };
        let cluster = text(abi::property(&["xds", "cluster_name"]).ok().flatten());
        let headers = match crate::forward::upstream_headers(&self.headers) {
            Ok(h) => h,
            Err(name) => {
                let reply = crate::response::json_reply(
                    400,
                    "IDEMPOTENCY_HEADER_INVALID",
                    &format!("header {name} is not valid UTF-8, which detached forwarding cannot send"),
                    &[],
                );
                let ending = Ending::NoResponse { forwarded: false };
                let _ = self.state.finish_ticket(route, &ticket, self.key.clone(), ending, After::Nothing);
                send(&reply);
                return Action::Pause;
            }
        };
        let call = Detached {
            ctx: self.context_id,
            route,
            ticket,
            key: self.key.clone(),
            cluster,
            headers,
            body: self.body.take().unwrap_or_default(),
            first_seen_ms,
        };
        self.state.detached_out.borrow_mut().push(call);
        self.state.wake();
        Action::Pause
    }

    /// Decides with the key (and body) at hand: synchronously on the shared store, or by
    /// sending one Webdis call and pausing.
    pub(super) fn decide(&mut self, route: usize) -> Action {
        // Decided once: body chunks that arrive while a Webdis call is out must not decide again.
        self.decided = true;
        let Some(begin) = self.state.engine.begin(route, self) else {
            return Action::Continue;
        };
        let prepared = match begin {
            Begin::Done(v) => return self.apply(route, v, false),
            Begin::Store(p) => p,
        };
        if !self.state.redis_route(route) {
            let v = self.state.engine.run_shared(&Envoy, &prepared, None);
            return self.apply(route, v, false);
        }
        let now = Envoy.now_ms();
        let Some((cmd, ticket)) = self.state.redis_op(&prepared, now) else {
            return Action::Continue;
        };
        if let Some(v) = self.state.engine.unwritten(&Envoy, &prepared, &ticket.key) {
            return self.apply(route, v, false);
        }
        match self.state.dispatch(&cmd) {
            Ok(_) => {
                self.pending = Some(match prepared.op {
                    StoreOp::Claim { .. } => Pending::Claim { prepared, ticket },
                    StoreOp::UseToken { .. } => Pending::UseToken { prepared, ticket },
                });
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
    pub(super) fn issue(&mut self) -> Option<Action> {
        let mut random = [0u8; 16];
        if getrandom::fill(&mut random).is_err() {
            log(Level::Error, "idem: random_get failed; cannot issue tokens");
            return None;
        }
        self.headers = abi::headers(abi::map::REQUEST_HEADERS).unwrap_or_default();
        match self.state.engine.issue(&self.method, &self.path, self, random)? {
            Issue::Reply { route, reply, cause } => {
                if let Some(r) = route {
                    self.state.count(r, Outcome::TokenRejected);
                }
                log(Level::Info, &format!("idem: token_issue_refused path={} cause={cause}", self.path));
                send(&reply);
                Some(Action::Pause)
            }
            Issue::Token { route, token, id } => {
                self.route = Some(route);
                self.decided = true;
                if !self.state.redis_route(route) {
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
    pub(super) fn finish(&mut self, ending: Ending) -> Action {
        let (Some(route), Some(ticket)) = (self.route, self.ticket.take()) else {
            return Action::Continue;
        };
        self.state.drop_lease(LeaseOwner::Request(self.context_id));
        let held = self.holding;
        self.holding = false;
        let after = if held { After::Resume(self.context_id) } else { After::Nothing };
        match self.state.finish_ticket(route, &ticket, self.key.clone(), ending, after) {
            // Written (or nothing to write): this callback lets the response go on.
            Some(_) => Action::Continue,
            // Queued: a held response waits for the root to resume it.
            None if held => Action::Pause,
            None => Action::Continue,
        }
    }

    pub(super) fn finish_capture(&mut self) -> Action {
        match self.response.take() {
            Some(c) => {
                let body = if c.incomplete { None } else { Some(c.body) };
                self.finish(Ending::Response { status: c.status, headers: c.headers, body, details: c.details })
            }
            None => Action::Continue,
        }
    }

    pub(super) fn take_handoff(&mut self) {
        if self.ticket.is_none() {
            let handed = self.state.handoff.borrow_mut().remove(&self.context_id);
            if let Some((t, key)) = handed {
                if let Some(route) = self.route {
                    self.state.hold_lease(LeaseOwner::Request(self.context_id), route, &t);
                }
                self.ticket = Some(t);
                self.key = Some(key);
                self.forwarded = true;
            }
        }
    }

    /// What the filter does with a request no policy matched (`unmatched` in the bundle).
    fn unmatched(&mut self) -> Action {
        if self.state.engine.bundle.unmatched == crate::policy::Unmatched::Pass {
            // The cheap common case: one counter, no more host calls.
            self.state.count_unmatched(false);
            return Action::Continue;
        }
        let method = text(abi::header(abi::map::REQUEST_HEADERS, ":method").ok().flatten());
        match self.state.engine.unmatched(&method) {
            Some(reply) => {
                self.state.count_unmatched(true);
                log(
                    Level::Info,
                    &format!("idem: no_policy method={method} path={} cause=unmatched_rejected", self.path),
                );
                send(&reply);
                Action::Pause
            }
            None => {
                self.state.count_unmatched(false);
                if self.state.enabled(Level::Debug) {
                    log(
                        Level::Debug,
                        &format!("idem: no_policy method={method} path={} cause=unmatched_passed", self.path),
                    );
                }
                Action::Continue
            }
        }
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        let (status, _, body) = super::state::call_response(num_headers, body_size);
        let Some(store) = self.state.engine.redis() else {
            return;
        };
        let now = Envoy.now_ms();
        match self.pending.take() {
            Some(Pending::Claim { prepared, ticket }) => {
                let StoreOp::Claim { fingerprint, .. } = &prepared.op else {
                    return;
                };
                if status == 0 {
                    // The SET may still reach Redis after the timeout: free it if it did.
                    self.state.release_orphan(prepared.route, Some(prepared.key.clone()), &ticket);
                }
                let claim = store.parse_claim(ticket, fingerprint, status, &body).map(|c| c.map(StoreTicket::Redis));
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
        let header = |n: &str| text(abi::header(abi::map::REQUEST_HEADERS, n).ok().flatten());
        self.path = header(":path");
        if self.state.engine.is_issue_path(&self.path) {
            self.method = header(":method");
            if let Some(action) = self.issue() {
                return action;
            }
        }
        let route_name = || abi::property(&["xds", "route_name"]).ok().flatten().map(|b| text(Some(b)));
        // The method is read only if a policy's path matches, and then only once.
        let mut method = None;
        let read_method = || method.insert(header(":method")).clone();
        let found = self.state.engine.bundle.find(read_method, &self.path, route_name);
        let Some(route) = found else {
            return self.unmatched();
        };
        self.route = Some(route);
        self.headers = abi::headers(abi::map::REQUEST_HEADERS).unwrap_or_default();
        self.method = match method {
            Some(m) => m,
            None => header(":method"),
        };
        let needs_body = self.state.engine.policy(route).is_some_and(|p| p.needs_body());
        if needs_body && !end_of_stream {
            // Refuse a missing or malformed key now, not after the body arrived.
            if let Some(v) = self.state.engine.precheck(route, self) {
                return self.apply(route, v, false);
            }
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
        self.body = abi::buffer(abi::buffer::REQUEST_BODY, 0, body_size).ok().flatten();
        self.decide(route)
    }

    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        match self.route {
            Some(route) if !self.decided => {
                self.body = abi::buffer(abi::buffer::REQUEST_BODY, 0, usize::MAX).ok().flatten();
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
        let pairs = abi::headers(abi::map::RESPONSE_HEADERS).unwrap_or_default();
        let status = pairs
            .iter()
            .find(|(n, _)| n == b":status")
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<u16>().ok())
            .unwrap_or(0);
        let details = if status >= 500 {
            text(abi::property(&["response", "code_details"]).ok().flatten())
        } else {
            String::new()
        };
        let headers = pairs.into_iter().map(|(n, v)| (String::from_utf8_lossy(&n).to_ascii_lowercase(), v)).collect();
        self.response = Some(Capture { status, headers, body: Vec::new(), incomplete: false, details });
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
                    c.incomplete = true;
                }
            } else if !end_of_stream {
                return Action::Pause;
            } else {
                if let Some(c) = self.response.as_mut() {
                    let body = abi::buffer(abi::buffer::RESPONSE_BODY, 0, body_size).ok().flatten();
                    c.body = body.unwrap_or_default();
                }
                return self.finish_capture();
            }
        }
        if let Some(c) = self.response.as_mut() {
            if !c.incomplete && body_size > 0 {
                // Not pausing: each call carries only the new chunk, and the client is not delayed.
                match abi::buffer(abi::buffer::RESPONSE_BODY, 0, body_size) {
                    Ok(Some(chunk)) if c.body.len() + chunk.len() <= limit => c.body.extend_from_slice(&chunk),
                    Ok(None) => {}
                    _ => {
                        c.incomplete = true;
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
        // An answer with trailers (gRPC's status lives there) is not stored whole: a tombstone
        // (status only) is stored instead, so a repeat gets the duplicate answer — never a
        // replay without its trailers.
        if let Some(c) = self.response.as_mut() {
            c.incomplete = true;
            c.details = "trailers".into();
        }
        self.finish_capture()
    }

    fn on_log(&mut self) {
        self.state.live.borrow_mut().remove(&self.context_id);
        self.state.waiters.borrow_mut().remove(&self.context_id);
        self.state.drop_lease(LeaseOwner::Request(self.context_id));
        if let Some(Pending::Claim { prepared, ticket }) = self.pending.take() {
            // The client left while its claim was out: the claim may land with nobody to finish it.
            self.state.release_orphan(prepared.route, Some(prepared.key), &ticket);
        }
        self.take_handoff();
        if self.ticket.is_none() {
            return;
        }
        if self.response.is_some() {
            // Headers came back but the body was not seen to the end: the work was done.
            if let Some(c) = self.response.as_mut() {
                c.incomplete = true;
            }
            self.holding = false;
            self.finish_capture();
        } else {
            self.finish(Ending::NoResponse { forwarded: self.forwarded });
        }
    }
}
