//! One request's way through the filter, as a state machine: find its policy, read the key (and
//! body), decide on the shared store or through one Webdis call, capture the response, and
//! report how it ended.

use super::admin;
use super::body_gate::BodyDelivery;
use super::capture::Capture;
use super::claims::QueuedClaim;
use super::detached::{Detached, Outbound};
use super::handoff::Resumed;
use super::leases::LeaseOwner;
use super::lookup::{Looking, Settled};
use super::replay::{self, Answered};
use super::waiters::Waiter;
use super::worker::{send, status_of, Worker};
use super::writes::After;
use super::Flow;
use crate::codes::ErrorCode;
use crate::engine::{Action, Begin, Ending, Issue, Outcome, Prepared, StoreOp, StoreTicket, Ticket, Verdict};
use crate::host::{Host, Level};
use crate::key::RequestView;
use crate::pairs::Headers;
use crate::policy::RouteId;
use crate::policy::{DetachedVia, Forward, Role, Unmatched};
use crate::response::{json_reply, Header, LocalReply};
use crate::store::{redis, Call, Claim, Step, StoreError};
use std::rc::Rc;

/// Where a request is. Each phase holds only what that phase needs.
pub(super) enum Phase {
    /// Nothing to do: no request headers yet, no policy, answered locally, or finished.
    Idle,
    /// A policy matched; the body is being buffered for the decision.
    ReadingBody { route: RouteId },
    /// A Webdis call decides (claim, token use, token issue), sent at `.1` with callout token
    /// `.2`; the request is paused.
    AwaitingStore(Pending, u64, u32),
    /// Held as a duplicate (`on_in_flight = "wait"`), or its claim queued for the next batch:
    /// the root decides for it and resumes or answers it (a [`Resumed`] picked up in the
    /// stream's next callback).
    Held { route: RouteId },
    /// Sent upstream by the root context (`forward = "detached"`); the root answers it.
    Detached,
    /// Forwarded with a ticket: its response is awaited.
    Forwarded { route: RouteId, ticket: Ticket, key: Option<String> },
    /// Response headers seen: the answer is being captured.
    Capturing { route: RouteId, ticket: Ticket, key: Option<String>, capture: Capture },
    /// A gRPC answer replayed through the echo listener: these trailers end it.
    Replaying { trailers: Vec<Header> },
    /// A lookup asks the service whether the first attempt of an unknown outcome ran; the
    /// request is paused.
    Looking(Box<Looking>),
    /// A call to the admin listener (`role = "admin"`) whose body is still arriving.
    Admin,
}

/// A Webdis call the stream waits for.
pub(super) enum Pending {
    /// A claim, with its request's fingerprint (what the record found is compared with).
    Claim {
        prepared: Prepared,
        ticket: redis::Ticket,
        fingerprint: [u8; 32],
    },
    UseToken {
        prepared: Prepared,
        ticket: redis::Ticket,
    },
    Issue {
        route: RouteId,
        token: String,
    },
    /// Taking the lookup of an unknown outcome on Redis (`[route.reconcile]`): `lookup` is its
    /// ticket once the write lands.
    TakeLookup {
        prepared: Prepared,
        lookup: redis::Ticket,
        unknown: LocalReply,
    },
    /// The lookup said the first attempt did not run: the key becoming this request's `claim`.
    LookupAbsent {
        prepared: Prepared,
        lookup: StoreTicket,
        claim: redis::Ticket,
        unknown: LocalReply,
        status: u16,
    },
}

impl Pending {
    fn route(&self) -> RouteId {
        match self {
            Pending::Claim { prepared, .. }
            | Pending::UseToken { prepared, .. }
            | Pending::TakeLookup { prepared, .. }
            | Pending::LookupAbsent { prepared, .. } => prepared.route,
            Pending::Issue { route, .. } => *route,
        }
    }
}

impl Request {
    /// The request's `:authority`, exactly.
    pub(super) fn authority(&self) -> String {
        header_text(&self.headers, b":authority")
    }
}

/// The request's data the decision needs, read once.
#[derive(Default)]
pub(super) struct Request {
    method: String,
    path: String,
    headers: Headers,
    body: Option<Vec<u8>>,
    /// A gRPC call (`content-type: application/grpc…`): its outcome is its `grpc-status`.
    pub(super) grpc: bool,
}

/// The request as the key and fingerprint code reads it: the stream's data, and properties
/// read from the host on demand (dynamic metadata for `metadata:` scopes).
pub(super) struct WithHost<'a> {
    pub(super) req: &'a Request,
    pub(super) host: &'a dyn Host,
}

impl RequestView for WithHost<'_> {
    fn method(&self) -> &str {
        &self.req.method
    }
    fn path(&self) -> &str {
        &self.req.path
    }
    fn header_values(&self, name: &str) -> Vec<&[u8]> {
        let headers = self.req.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()));
        headers.map(|(_, v)| v).collect()
    }
    fn first_header_value(&self, name: &str) -> Option<&[u8]> {
        self.req.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes())).map(|(_, v)| v)
    }
    fn body(&self) -> Option<&[u8]> {
        self.req.body.as_deref()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.host.property(path)
    }
}

pub(super) fn text(bytes: Option<Vec<u8>>) -> String {
    bytes.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

/// A header's (first) value, as text: exactly, never lossily — bytes that are not UTF-8 are
/// percent-encoded (`caf\xE9` becomes `caf%E9`, which a query key then refuses as not UTF-8)
/// rather than merged into one replacement character with every other such byte.
fn header_text(headers: &Headers, name: &[u8]) -> String {
    headers.get(name).map(exact_text).unwrap_or_default()
}

/// `bytes` as text, with each byte of an invalid UTF-8 sequence as `%XX`.
pub(super) fn exact_text(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One request's state machine.
pub struct Stream {
    pub(super) worker: Rc<Worker>,
    pub(super) context: u32,
    pub(super) phase: Phase,
    pub(super) request: Request,
}

impl Drop for Stream {
    /// A stream Envoy deleted without `on_log` (it always logs first) leaves nothing behind.
    fn drop(&mut self) {
        if let Some(token) = self.call_out() {
            self.worker.stream_call_done(token);
        }
    }
}

impl Stream {
    pub fn new(worker: Rc<Worker>, context: u32) -> Self {
        worker.stream_started(context);
        Stream { worker, context, phase: Phase::Idle, request: Request::default() }
    }

    /// The callout token of this stream's own Webdis call out, if one is.
    pub fn call_out(&self) -> Option<u32> {
        match &self.phase {
            Phase::AwaitingStore(_, _, token) => Some(*token),
            Phase::Looking(looking) => Some(looking.token),
            _ => None,
        }
    }

    /// The request headers arrived.
    pub fn on_request_headers(&mut self, host: &dyn Host, end_of_stream: bool) -> Flow {
        let flow = self.request_headers(host, end_of_stream);
        self.worker.request_flow(host, self.context, flow, false)
    }

    fn request_headers(&mut self, host: &dyn Host, end_of_stream: bool) -> Flow {
        let w = Rc::clone(&self.worker);
        if w.engine.bundle.role == Role::Echo {
            // The echo listener's instance: it answers gRPC replays, and nothing else passes.
            w.echo(host, self.context, host.request_header(replay::REPLAY_HEADER).as_deref());
            self.phase = Phase::Idle;
            return Flow::Pause;
        }
        if w.engine.bundle.role == Role::Admin {
            // The operator's listener answers every call itself, once the call has ended.
            self.request.headers = host.request_headers();
            self.phase = Phase::Admin;
            if end_of_stream {
                self.answer_admin(host, Vec::new());
            }
            return Flow::Pause;
        }
        if !end_of_stream {
            // An answer decided before the body has all arrived waits for it (see `early`).
            w.early.set_uploading(self.context, true);
        }
        // Every header in one host call: the path, then the method and the key, would be more.
        self.request.headers = host.request_headers();
        self.request.path = header_text(&self.request.headers, b":path");
        self.request.method = header_text(&self.request.headers, b":method");
        if w.engine.is_issue_path(&self.request.path) {
            if let Some(flow) = self.issue(host) {
                return flow;
            }
        }
        let route_name = || host.property(&["xds", "route_name"]).map(|b| text(Some(b)));
        let method = || self.request.method.clone();
        let Some(route) = w.engine.bundle.find(method, &self.request.path, route_name) else {
            self.phase = Phase::Idle;
            return self.unmatched(host);
        };
        self.request.grpc = self
            .request
            .headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case(b"content-type") && crate::grpc::is_grpc_content_type(v));
        let needs_body = w.engine.policy(route).needs_body();
        if needs_body && !end_of_stream {
            // Refuse a missing or malformed key now, not after the body arrived.
            if let Some(v) = w.engine.precheck(route, &WithHost { req: &self.request, host }, || host.now_ms()) {
                return self.apply(host, route, v, false);
            }
            // With allow_on_headers_stop_iteration, the body still reaches on_request_body;
            // without it, it never does while we pause (see `body_gate`).
            if w.body_gate.delivery() == BodyDelivery::Withheld {
                let v = w.engine.body_withheld(route);
                return self.apply(host, route, v, false);
            }
            w.await_body(host, self.context, route);
            self.phase = Phase::ReadingBody { route };
            return Flow::Pause;
        }
        self.decide(host, route)
    }

    fn answer_admin(&mut self, host: &dyn Host, body: Vec<u8>) {
        self.phase = Phase::Idle;
        let bundle = &self.worker.engine.bundle;
        match &bundle.admin {
            Some(cfg) => admin::answer(host, cfg, &bundle.shared, &self.request.headers, &body),
            None => send(host, json_reply(503, "NOT_CONFIGURED", "role = \"admin\" without [admin]", &[])),
        }
    }

    /// A request body chunk arrived; `size` is what Envoy has buffered so far (this chunk alone
    /// after a chunk was held or dropped).
    pub fn on_request_body(&mut self, host: &dyn Host, size: usize, end_of_stream: bool) -> Flow {
        let flow = self.request_body(host, size, end_of_stream);
        self.worker.request_flow(host, self.context, flow, true)
    }

    fn request_body(&mut self, host: &dyn Host, size: usize, end_of_stream: bool) -> Flow {
        if matches!(self.phase, Phase::Admin) {
            if size > admin::MAX_ADMIN_BODY {
                self.phase = Phase::Idle;
                send(host, json_reply(413, "BODY_TOO_LARGE", "an admin call's body is at most 1 MiB", &[]));
            } else if end_of_stream {
                self.answer_admin(host, host.request_body(size).unwrap_or_default());
            }
            return Flow::Pause;
        }
        if end_of_stream {
            self.worker.early.set_uploading(self.context, false);
        }
        self.take_handoff(host);
        if let Some(flow) = self.worker.parked_chunk(host, self.context, size, end_of_stream) {
            return flow;
        }
        match self.read_body(host, size, end_of_stream) {
            // Answered while the body still arrives: the rest is dropped, not buffered.
            Flow::Pause if self.worker.early.is_parked(self.context) => Flow::Discard,
            flow => flow,
        }
    }

    fn read_body(&mut self, host: &dyn Host, size: usize, end_of_stream: bool) -> Flow {
        let route = match self.phase {
            Phase::ReadingBody { .. } if self.worker.body_gate.take_passthrough(self.context) => {
                self.phase = Phase::Idle;
                return Flow::Continue;
            }
            Phase::ReadingBody { route } => {
                self.worker.body_gate.delivered();
                route
            }
            // Chunks that arrive while a decision made without them is out (a Webdis call, a
            // held duplicate, a queued claim, a lookup, an answer waiting for its write) wait,
            // with flow control rather than against the buffer limit: continuing would send the
            // request upstream undecided, and buffering would turn a large body into Envoy's
            // own 413. Once decided, they follow the request or are dropped under its answer.
            _ => return self.worker.after_decision(self.context),
        };
        let limit = self.worker.engine.policy(route).max_body_bytes as usize;
        if size > limit {
            let v = self.worker.engine.body_too_large(route);
            return self.apply(host, route, v, false);
        }
        if self.request.grpc {
            let body = host.request_body(size);
            if body.as_deref().is_some_and(|b| crate::grpc::complete_messages(b) > 1) {
                return self.pass_streaming_call(host, route);
            }
            if !end_of_stream {
                return Flow::Pause;
            }
            self.request.body = body;
            return self.decide(host, route);
        }
        if !end_of_stream {
            // Envoy buffers and calls again with the cumulative size.
            return Flow::Pause;
        }
        self.request.body = host.request_body(size);
        self.decide(host, route)
    }

    /// A gRPC call sending more than one message (client or bidi streaming) goes on unprotected
    /// and counted (`outcome="unprotected"`): holding an open-ended stream until its half-close
    /// would stall a bidi call, and a part-protected stream would promise what it cannot keep.
    fn pass_streaming_call(&mut self, host: &dyn Host, route: RouteId) -> Flow {
        let w = Rc::clone(&self.worker);
        w.count(host, route, Outcome::Unprotected);
        w.body_gate.forget(self.context);
        w.log_once(host, &w.streaming_logged, Level::Warn, STREAMING_LOG);
        self.phase = Phase::Idle;
        Flow::Continue
    }

    /// Request trailers arrived (the body is complete).
    pub fn on_request_trailers(&mut self, host: &dyn Host) -> Flow {
        let flow = self.request_trailers(host);
        self.worker.request_flow(host, self.context, flow, false)
    }

    fn request_trailers(&mut self, host: &dyn Host) -> Flow {
        self.worker.early.set_uploading(self.context, false);
        self.take_handoff(host);
        if self.worker.parked_chunk(host, self.context, 0, true).is_some() {
            return Flow::Pause;
        }
        match self.phase {
            Phase::ReadingBody { .. } if self.worker.body_gate.take_passthrough(self.context) => {
                self.phase = Phase::Idle;
                Flow::Continue
            }
            Phase::ReadingBody { route } => {
                self.worker.body_gate.delivered();
                self.request.body = host.request_body(usize::MAX);
                self.decide(host, route)
            }
            _ => match self.worker.after_decision(self.context) {
                Flow::Continue => Flow::Continue,
                _ => Flow::Pause,
            },
        }
    }

    /// The answer of this stream's Webdis call under callout `token`, read from the host. A
    /// reply under any other token is never read as this stream's.
    pub fn on_call_response(&mut self, host: &dyn Host, token: u32, num_headers: usize, body_size: usize) {
        if self.owns_call(host, token) {
            let (headers, body) = host.call_response(num_headers, body_size);
            let (headers, body) = self.worker.checked_reply(host, token, headers, body);
            self.on_reply(host, token, &headers, &body);
        }
    }

    /// Whether `token` is this stream's call out; if not, the reply is a stray (counted, logged).
    fn owns_call(&self, host: &dyn Host, token: u32) -> bool {
        let sent = self.call_out();
        if sent == Some(token) {
            return true;
        }
        let why = match sent {
            Some(sent) => format!("stream {} waits for token {sent}", self.context),
            None => format!("stream {} waits for no call", self.context),
        };
        self.worker.stray_reply(host, self.context, token, &why);
        false
    }

    /// The reply (already read where Envoy delivered it) of this stream's call `token`.
    pub fn on_reply(&mut self, host: &dyn Host, token: u32, headers: &crate::pairs::Headers, body: &[u8]) {
        if !self.owns_call(host, token) {
            return;
        }
        if let Phase::Looking(_) = self.phase {
            return self.on_lookup_reply(host, headers, body);
        }
        let w = Rc::clone(&self.worker);
        let Phase::AwaitingStore(pending, sent_ms, _) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        w.stream_call_done(token);
        if let Pending::Claim { .. } = pending {
            w.claim_returned(host);
        }
        let now = host.now_ms();
        w.metrics.store_call_took(host, pending.route(), sent_ms, now);
        let Some(store) = w.engine.remote() else {
            return;
        };
        let status = status_of(headers);
        match pending {
            Pending::Claim { prepared, ticket, fingerprint } => {
                let retain = w.engine.policy(prepared.route).key.ttl.millis;
                let reply = store.redis.claim_reply(status, body);
                let found = store.claim_answered(host, ticket, &fingerprint, reply, retain, now);
                let found = w.unless_unanswered(host, prepared.route, Some(&prepared.key), found);
                self.claim_found(host, prepared, found, now, true);
            }
            Pending::UseToken { prepared, ticket } => {
                let used = store.redis.parse_use_token(ticket, status, body).map(|u| u.map(StoreTicket::Redis));
                let v = w.engine.after_token(&prepared, used);
                self.apply(host, prepared.route, v, true);
            }
            Pending::Issue { route, token: issued } => {
                let v = w.engine.issued(route, &issued, now, store.redis.parse_ok(status, body));
                self.apply(host, route, v, true);
            }
            Pending::TakeLookup { prepared, lookup, unknown } => {
                let first_seen_ms = lookup.first_seen_ms;
                match store.read_taken(lookup.clone(), status, body) {
                    Err(e) => {
                        // The write may have landed: given back (fenced).
                        let settled = Settled::Nothing(format!("lookup_not_taken: {e}"));
                        self.settle_lookup(host, &prepared, &StoreTicket::Redis(lookup), settled, unknown, true);
                    }
                    taken => {
                        self.lookup_taken(host, prepared, unknown, first_seen_ms, taken, true);
                    }
                }
            }
            Pending::LookupAbsent { prepared, lookup, claim, unknown, status: answered } => {
                let written = store.read_taken(claim.clone(), status, body);
                if written.is_err() {
                    // Either write may have landed: the claim is released, the lookup given back.
                    w.release_orphan(host, prepared.route, Some(prepared.key.clone()), &claim);
                }
                self.absent_written(host, prepared, &lookup, unknown, answered, written);
            }
        }
    }

    /// The stream ended (Envoy's `on_log`): whatever it still holds is finished.
    pub fn on_log(&mut self, host: &dyn Host) {
        let w = Rc::clone(&self.worker);
        self.take_handoff(host);
        self.abandon_lookup(host);
        w.stream_ended(self.context);
        if let Phase::AwaitingStore(_, _, token) = self.phase {
            // Its reply may still come (Envoy 1.40 keeps the call on the root context): nobody's.
            w.stream_call_ended(host, token);
        }
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::AwaitingStore(Pending::Claim { prepared, ticket, .. }, _, _) => {
                // The client left while its claim was out: the claim may land with nobody to
                // finish it. Its call ends with the stream: the next batch need not wait for it.
                w.claim_returned(host);
                w.release_orphan(host, prepared.route, Some(prepared.key), &ticket);
            }
            // A lookup taken, or a claim after a lookup, with nobody to carry it on: given back
            // (each write is fenced, so one that did not land changes nothing).
            Phase::AwaitingStore(Pending::TakeLookup { prepared, lookup, .. }, _, _) => {
                w.give_back_lookup(host, prepared.route, Some(prepared.key), &StoreTicket::Redis(lookup));
            }
            Phase::AwaitingStore(Pending::LookupAbsent { prepared, claim, .. }, _, _) => {
                w.release_orphan(host, prepared.route, Some(prepared.key), &claim);
            }
            Phase::Capturing { route, ticket, key, capture } => {
                // Headers came back but the body was not seen to the end (the upstream reset it,
                // or the client left): what the service answered is lost — an unknown outcome.
                self.finish(host, route, ticket, key, capture.into_ending(true), false);
            }
            Phase::Forwarded { route, ticket, key } => {
                self.finish(host, route, ticket, key, Ending::NoResponse { forwarded: true }, false);
            }
            _ => {}
        }
    }

    // ---- decisions

    /// Counts, logs and carries out a verdict. `paused` says the request is already paused (a
    /// callout answered), so forwarding means resuming it.
    pub(super) fn apply(&mut self, host: &dyn Host, route: RouteId, v: Verdict, paused: bool) -> Flow {
        if let Action::Reconcile { prepared, held, unknown } = v.action {
            return self.reconcile(host, *prepared, held, unknown, paused);
        }
        let w = Rc::clone(&self.worker);
        w.record(host, route, &v);
        if !matches!(v.action, Action::Wait { .. }) {
            w.annotate(host, route, &v);
        }
        let key = v.key.clone();
        match v.action {
            Action::Forward(Some(ticket)) if w.engine.policy(route).forward == Forward::Detached => {
                self.hand_to_root(host, route, ticket, key)
            }
            Action::Forward(ticket) => {
                self.phase = match ticket {
                    Some(ticket) => {
                        w.hold_lease(host, LeaseOwner::Stream(self.context), route, &ticket);
                        Phase::Forwarded { route, ticket, key }
                    }
                    None => Phase::Idle,
                };
                if paused {
                    w.release(host, self.context);
                }
                Flow::Continue
            }
            Action::Reply(r) => {
                self.phase = Phase::Idle;
                match w.answer(host, self.context, route, r, self.request.grpc) {
                    Answered::Replied => Flow::Pause,
                    // A gRPC replay goes on to the echo listener.
                    Answered::ToEcho if paused => {
                        w.release(host, self.context);
                        Flow::Continue
                    }
                    Answered::ToEcho => Flow::Continue,
                }
            }
            Action::Reconcile { .. } => Flow::Pause,
            Action::Wait { prepared, deadline_ms } => {
                // On a detached route, a held duplicate that takes the key over is sent by the
                // root too: it keeps its request for that.
                let detached = w.engine.policy(route).forward == Forward::Detached;
                let outbound = match detached.then(|| self.outbound(host, route)).transpose() {
                    Ok(o) => o,
                    Err(mut reply) => {
                        w.mark_repeatability(route, &mut reply);
                        w.send_when_read(host, self.context, reply);
                        self.phase = Phase::Idle;
                        return Flow::Pause;
                    }
                };
                let waiter = Waiter::new(*prepared, deadline_ms, host.now_ms(), outbound, self.request.grpc);
                w.waiters.hold(self.context, waiter);
                self.phase = Phase::Held { route };
                Flow::Pause
            }
        }
    }

    /// Decides with the key (and body) at hand: at once when the route's store answers at once
    /// (the shared store, Redis' answer cache), else by sending its Webdis call and pausing.
    fn decide(&mut self, host: &dyn Host, route: RouteId) -> Flow {
        let w = Rc::clone(&self.worker);
        self.phase = Phase::Idle;
        let view = WithHost { req: &self.request, host };
        let now = host.now_ms();
        let Some(begin) = w.engine.begin(route, &view, now) else {
            return Flow::Continue;
        };
        let prepared = match begin {
            Begin::Done(v) => return self.apply(host, route, v, false),
            Begin::Store(p) => p,
        };
        let store = w.engine.store(route);
        match prepared.op {
            StoreOp::Claim { id, fingerprint } => {
                let key = &w.engine.policy(route).key;
                match store.claim(host, &id, &fingerprint, key.lock_ttl.millis, key.ttl.millis, now) {
                    Step::Now(found) => self.claim_found(host, prepared, found, now, false),
                    Step::Call(call) => self.send_claim(host, prepared, fingerprint, call, now),
                }
            }
            StoreOp::UseToken { id } => match store.use_token(host, &id, now) {
                Step::Now(used) => {
                    let v = w.engine.after_token(&prepared, used);
                    self.apply(host, route, v, false)
                }
                Step::Call(Call { cmd, ticket: Some(ticket), .. }) => match w.dispatch(host, &cmd) {
                    Ok(token) => {
                        w.stream_call_out(token, self.context);
                        self.phase = Phase::AwaitingStore(Pending::UseToken { prepared, ticket }, now, token);
                        Flow::Pause
                    }
                    Err(e) => {
                        let v = w.engine.after_token(&prepared, Err(e));
                        self.apply(host, route, v, false)
                    }
                },
                Step::Call(_) => Flow::Continue,
            },
        }
    }

    /// What a claim found — at once, or in its call's reply (`paused`) — carried out: a record
    /// written before fingerprints were xxh3 is settled with the request's SHA-256 here.
    fn claim_found(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        found: Result<Claim<StoreTicket>, StoreError>,
        now: u64,
        paused: bool,
    ) -> Flow {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let view = WithHost { req: &self.request, host };
        let found = found.map(|c| c.resolve_legacy(|| w.engine.legacy_fingerprint(route, &view)));
        let v = w.engine.after_claim(&prepared, found, now, None);
        self.apply(host, route, v, paused)
    }

    /// Sends a claim's call, or queues it for the next batch while enough claim calls are out.
    fn send_claim(&mut self, host: &dyn Host, prepared: Prepared, fingerprint: [u8; 32], call: Call, now: u64) -> Flow {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let Some(ticket) = call.ticket else {
            return Flow::Continue;
        };
        // A detached route's claim goes out alone: its stream hands the request to the root once
        // claimed, which a batch resolved from the root would have to carry for every member. So
        // does a route that looks unknown outcomes up: the lookup is the stream's own call, which
        // a claim decided from the root could not send (it would answer the 409 instead).
        let policy = w.engine.policy(route);
        let alone = policy.forward == Forward::Detached || policy.reconcile.is_some();
        if !alone && w.claims.calls_full() {
            // Group commit: it goes with the next batch, when a claim call out returns.
            let request = std::mem::take(&mut self.request);
            self.request.grpc = request.grpc;
            let queued_ms = now;
            w.claims.queue(QueuedClaim { ctx: self.context, prepared, ticket, fingerprint, request, queued_ms });
            self.phase = Phase::Held { route };
            return Flow::Pause;
        }
        match w.dispatch(host, &call.cmd) {
            Ok(token) => {
                w.stream_call_out(token, self.context);
                w.claims.sent();
                self.phase = Phase::AwaitingStore(Pending::Claim { prepared, ticket, fingerprint }, now, token);
                Flow::Pause
            }
            Err(e) => self.claim_found(host, prepared, Err(e), now, false),
        }
    }

    /// Serves the token issue endpoint, if this request is for it.
    fn issue(&mut self, host: &dyn Host) -> Option<Flow> {
        let w = Rc::clone(&self.worker);
        let random = match host.random_token() {
            Ok(r) => r,
            Err(e) => {
                host.log(Level::Error, &format!("idem: random_get failed; cannot issue tokens: {e:?}"));
                return None;
            }
        };
        let view = WithHost { req: &self.request, host };
        match w.engine.issue(&self.request.method, &self.request.path, &view, random)? {
            Issue::Reply { route, reply, cause } => {
                if let Some(r) = route {
                    w.count(host, r, Outcome::TokenRejected);
                }
                let line = format!("idem: token_issue_refused path={} cause={cause}", self.request.path);
                host.log(crate::host::Level::Info, &line);
                w.send_when_read(host, self.context, reply);
                self.phase = Phase::Idle;
                Some(Flow::Pause)
            }
            Issue::Token { route, token, id } => {
                let now = host.now_ms();
                let ttl = w.engine.policy(route).token.ttl.millis;
                let sent = match w.engine.store(route).issue_token(host, &id, ttl, now) {
                    Step::Now(stored) => Err(stored),
                    Step::Call(call) => w.dispatch(host, &call.cmd).map_err(Err),
                };
                match sent {
                    Ok(call) => {
                        w.stream_call_out(call, self.context);
                        self.phase = Phase::AwaitingStore(Pending::Issue { route, token }, now, call);
                        Some(Flow::Pause)
                    }
                    Err(stored) => {
                        let v = w.engine.issued(route, &token, now, stored);
                        Some(self.apply(host, route, v, false))
                    }
                }
            }
        }
    }

    /// What the filter does with a request no policy matched (`unmatched` in the bundle).
    fn unmatched(&mut self, host: &dyn Host) -> Flow {
        let w = &self.worker;
        if w.engine.bundle.unmatched == Unmatched::Pass {
            // The cheap common case: one counter, and a warning the first time a path is seen.
            w.metrics.count_unmatched(host, false);
            // A safe method needs no policy: nothing to warn about.
            if !crate::engine::is_safe_method(&self.request.method) {
                w.warn_unmatched(host, &self.request.method, &self.request.path);
            }
            return Flow::Continue;
        }
        let method = &self.request.method;
        let Some(reply) = w.engine.unmatched(method) else {
            w.metrics.count_unmatched(host, false);
            return Flow::Continue;
        };
        w.metrics.count_unmatched(host, true);
        let line = format!("idem: no_policy method={method} path={} cause=unmatched_rejected", self.request.path);
        host.log(crate::host::Level::Info, &line);
        w.send_when_read(host, self.context, reply);
        Flow::Pause
    }

    /// The request as the root context sends it upstream, or the 400 for a header it cannot
    /// carry (the callout API takes text).
    fn outbound(&mut self, host: &dyn Host, route: RouteId) -> Result<Outbound, LocalReply> {
        let detached = &self.worker.engine.bundle.detached;
        let headers = crate::forward::upstream_headers(self.request.headers.iter(), detached.via).map_err(|name| {
            let answers = &self.worker.engine.policy(route).answers;
            crate::replies::error(
                answers,
                ErrorCode::HeaderInvalid,
                &format!("header {name} is not valid UTF-8, which detached forwarding cannot send"),
            )
        })?;
        // Through re-entry, the internal listener's routes pick the cluster, as inline.
        let cluster = match detached.via {
            DetachedVia::Reentry => detached.reentry_cluster.clone(),
            DetachedVia::Cluster => text(host.property(&["xds", "cluster_name"])),
        };
        Ok(Outbound { cluster, headers, body: self.request.body.take().unwrap_or_default(), grpc: self.request.grpc })
    }

    /// Hands a claimed request to the root context, which sends it upstream itself; this
    /// request stays paused until the root answers it (or its client leaves).
    fn hand_to_root(&mut self, host: &dyn Host, route: RouteId, ticket: Ticket, key: Option<String>) -> Flow {
        let w = Rc::clone(&self.worker);
        let first_seen_ms = ticket.first_seen_ms();
        let request = match self.outbound(host, route) {
            Ok(r) => r,
            Err(mut reply) => {
                let ending = Ending::NoResponse { forwarded: false };
                let _ = w.finish_ticket(host, route, &ticket, key, ending, After::Nothing);
                w.mark_repeatability(route, &mut reply);
                w.send_when_read(host, self.context, reply);
                self.phase = Phase::Idle;
                return Flow::Pause;
            }
        };
        w.detach(host, Detached { ctx: self.context, route, ticket, key, request, first_seen_ms });
        self.phase = Phase::Detached;
        Flow::Pause
    }

    /// What the root did with this stream while it was held (a held duplicate's verdict, a
    /// batched claim's), picked up here: the phase it goes on in.
    pub(super) fn take_handoff(&mut self, host: &dyn Host) {
        let Phase::Held { route } = self.phase else {
            return;
        };
        let Some(resumed) = self.worker.handoffs.take(self.context) else {
            return;
        };
        self.phase = match resumed {
            Resumed::Forwarded(ticket, key) => {
                self.worker.hold_lease(host, LeaseOwner::Stream(self.context), route, &ticket);
                Phase::Forwarded { route, ticket, key: Some(key) }
            }
            Resumed::Passed | Resumed::Answered => Phase::Idle,
        };
    }
}

/// Logged once per worker when a policy route sees a streaming gRPC call.
const STREAMING_LOG: &str = "idem: a gRPC call on a policy route sent more than one message (client or bidi \
streaming); streaming calls pass through unprotected (idem_requests_total{outcome=\"unprotected\"}). \
Key streaming methods in the service, or leave them out of the policy routes (docs/grpc.md).";
