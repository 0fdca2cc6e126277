//! What one worker's contexts share, how it is set up when the plugin configures, and the root
//! context's events.

use super::body_gate::{BodyGate, BODY_CHECK_MS};
use super::capture::HeldResponses;
use super::claims::{ClaimBatch, Claims};
use super::detached::{Detached, DetachedCalls};
use super::early::Early;
use super::ended_calls::EndedCalls;
use super::fate::Fates;
use super::handoff::Handoffs;
use super::leases::{LeaseOwner, Leases};
use super::metrics::Metrics;
use super::replay::Replays;
use super::waiters::{Poll, Waiters};
use super::writes::{Job, Outbox};
use super::POLL_MS;
use super::{Map, Set};
use crate::engine::{Action, Engine, Outcome, Verdict};
use crate::host::{Host, Level, Setup};
use crate::key::{push_truncated, truncated};
use crate::policy::RouteId;
use crate::policy::{parse_bundle_all, Role, StoreKind};
use crate::response::LocalReply;
use crate::store::replay::ReplaySlots;
use crate::store::{redis, StoreError};
use std::cell::{Cell, RefCell};

/// The most path patterns a worker warns about as unmatched (then it stops: the counter goes on).
const MAX_UNMATCHED_WARNINGS: usize = 64;

/// What every context of one worker shares.
pub struct Worker {
    pub engine: Engine,
    /// Counters and histograms (see `metrics`).
    pub(super) metrics: Metrics,
    /// Envoy's log level for the `wasm` component when the plugin configured, so debug lines
    /// are not even formatted when they would be dropped.
    log_level: u32,
    /// The root context's id: after acting on a stream with `set_effective_context`, the root
    /// switches back to itself, or its next callout would belong to that stream (and be
    /// cancelled with it — Envoy crashed on exactly that).
    root_id: u32,
    /// The headers of every Webdis call (made once; each call writes its own tag into its
    /// `:path`, in place).
    redis_headers: RefCell<Vec<(String, String)>>,
    /// The tag of each Webdis call out, by token: its reply must carry it (`redis::untag`).
    webdis_tags: RefCell<Map<u32, u64>>,
    /// The last tag given (starts at random: tags of two workers, or of a restarted one, differ).
    last_tag: Cell<u64>,
    /// A reply with another call's tag was logged (once per worker).
    mistagged_logged: Cell<bool>,
    /// This worker's wake-up queue: a stream enqueues, the root's queue event sends.
    wake_queue: Option<u32>,
    /// Held duplicates (see `waiters`).
    pub(super) waiters: Waiters,
    /// What the root did with paused streams, for them to pick up (see `handoff`).
    pub(super) handoffs: Handoffs,
    /// Redis writes waiting for the root context (see `writes`).
    pub(super) outbox: Outbox,
    /// Redis is a cluster: a batch of writes or claims holds one hash slot's keys.
    pub(super) batch_per_slot: Cell<bool>,
    /// Group commit of claims (see `claims`).
    pub(super) claims: Claims,

    /// Detached upstream calls waiting to be sent by the root context (see `detached`).
    pub(super) detached: DetachedCalls,
    /// Claims whose requests wait for the upstream, renewed by the root every third of their
    /// lease: while this gateway lives, a slow request is never taken over (see `leases`).
    pub(super) leases: Leases,
    /// The calls the root context has out, by callout token: what each answer is for.
    pub(super) calls: RefCell<Map<u32, RootCall>>,
    /// The calls streams have out (their own claim, token use or issue), by callout token: the
    /// stream each answer is for. With `calls`, the one owner table every reply is routed by.
    stream_calls: RefCell<Map<u32, u32>>,
    /// Calls of streams that ended with them out, whose late replies are expected (see
    /// `ended_calls`).
    pub(super) ended_calls: EndedCalls,
    /// Replies that reached no owner (see [`Worker::stray_reply`]), and whether one was logged.
    stray_logged: Cell<bool>,
    /// A lookup (`[route.reconcile]`) could not be sent: logged once.
    pub(super) lookup_logged: Cell<bool>,
    /// Streams that have not ended (created, `on_log` not seen yet), and what became of each
    /// one's request (see `fate`). The root acts on a stream only while it is here: Envoy may
    /// still accept `set_effective_context` for a stream whose client reset it, but a local
    /// reply sent there calls back into a context the SDK has deleted, and the SDK panics
    /// ("invalid context_id") — found by `make bench`.
    pub(super) fates: Fates,
    /// Whether Envoy passes the body while the headers are paused (see `body_gate`).
    pub(super) body_gate: BodyGate,
    /// Answers that wait for their request's end (see `early`).
    pub(super) early: Early,
    /// Responses whose headers wait for their ticket's write (see `capture`).
    pub(super) held_responses: HeldResponses,
    /// Whether the streaming-gRPC warning was logged.
    pub(super) streaming_logged: Cell<bool>,
    /// The path patterns of requests that passed unmatched, each warned about once.
    unmatched_seen: RefCell<Set<u64>>,
    /// Where gRPC replays wait for the echo (see `replay`).
    pub(super) replay_slots: ReplaySlots,
    /// Streams replaying a gRPC answer through the echo (see `replay`).
    pub(super) replays: Replays,
    /// Whether Redis was asked if it evicts keys (see `eviction`).
    pub(super) eviction: Cell<super::eviction::Probe>,
}

impl Worker {
    /// Sets the worker up from the plugin configuration: parses and validates the policy bundle,
    /// creates the shared store's buckets, defines the counters, starts the timer and the
    /// wake-up queue. `Err` is the log line for a plugin that must refuse to load.
    pub fn configure(setup: &dyn Setup, host: &dyn Host, root_id: u32, config: &[u8]) -> Result<Worker, String> {
        let text = std::str::from_utf8(config)
            .map_err(|e| format!("idem: invalid policy: plugin configuration is not UTF-8: {e}"))?;
        let mut bundle = parse_bundle_all(text, "plugin configuration").map_err(|errors| {
            // Every error in one log line: Envoy logs the refusal once.
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("idem: invalid policy: {}", all.join("; "))
        })?;
        if bundle.redis.as_ref().is_some_and(|r| r.cluster.is_empty()) && !host.speaks_resp() {
            return Err("idem: invalid policy: [redis] names only `direct`, the Redis the native build speaks to \
                        itself; this build reaches Redis through Webdis: add `cluster` (the Envoy cluster of Webdis)"
                .into());
        }
        if bundle.shared.namespace.is_none() {
            bundle.shared.namespace = Some(default_namespace(host.property(&["plugin_name"])));
        }
        let replay_slots = ReplaySlots::new(bundle.shared.namespace.as_deref().unwrap_or("idem"));

        let mut engine = Engine::new(bundle);
        // The admin instance reads the store the gateway created, in its shape, and the echo
        // instance uses replay slots only: neither creates or resizes a bucket. Their own
        // [shared] sizes may differ from the gateway's in the same namespace, and a bucket
        // rewritten in another shape loses the gateway's claims in flight.
        let created = match engine.bundle.role {
            Role::Admin | Role::Echo => 0,
            _ => engine.initialise(host).map_err(|e| format!("idem: cannot initialise the shared store: {e}"))?,
        };
        // Which instance this is: Envoy runs one per listener that has the filter (the gateway,
        // the echo of gRPC replays, the operator's listener), and "0 route policies" is right for
        // two of them.
        let plugin = super::stream::text(host.property(&["plugin_name"]));
        let role = match engine.bundle.role {
            Role::Gateway => "gateway",
            Role::Echo => "echo",
            Role::Admin => "admin",
        };
        host.log(
            Level::Info,
            &format!(
                "idem: plugin {plugin:?} ({role}) loaded {} route policies; shared store {} buckets × {} entries \
                 ({} created) in namespace {}",
                engine.bundle.routes.len(),
                engine.bundle.shared.buckets,
                engine.bundle.shared.entries_per_bucket,
                created,
                engine.bundle.shared.namespace.as_deref().unwrap_or_default(),
            ),
        );
        let uses_root = engine.bundle.routes.iter().any(|r| r.store == StoreKind::Redis) || engine.has_detached();
        // The tick polls held duplicates, sends and retries queued writes, renews leases, and
        // finds out whether Envoy withholds bodies from paused requests.
        let tick_ms = if engine.has_waiters() || uses_root {
            Some(POLL_MS)
        } else {
            let lease_ms = engine.min_lock_ttl_ms().map(|l| (l / 3).clamp(POLL_MS, 1000));
            let body_ms = engine.bundle.routes.iter().any(|r| r.needs_body()).then_some(BODY_CHECK_MS);
            lease_ms.into_iter().chain(body_ms).min()
        };
        if let Some(ms) = tick_ms {
            setup.start_ticks(ms).map_err(|e| format!("idem: cannot start the root timer: {e:?}"))?;
        }
        // A queue of this worker's own (unique name): enqueueing wakes this root promptly.
        let wake_queue = match uses_root {
            true => setup.register_queue(&format!("idem-finish-{:016x}", host.random_u64().unwrap_or(0))),
            false => None,
        };
        let metrics = Metrics::define(setup, &engine.bundle);
        let redis_headers = engine.redis().map(|s| s.headers()).unwrap_or_default();
        Ok(Worker {
            engine,
            metrics,
            log_level: setup.log_level(),
            redis_headers: RefCell::new(redis_headers),
            webdis_tags: RefCell::default(),
            last_tag: Cell::new(host.random_u64().unwrap_or(0)),
            mistagged_logged: Cell::new(false),
            root_id,
            wake_queue,
            waiters: Waiters::default(),
            handoffs: Handoffs::default(),
            outbox: Outbox::default(),
            batch_per_slot: Cell::new(false),
            claims: Claims::default(),

            detached: DetachedCalls::default(),
            leases: Leases::default(),
            calls: RefCell::new(Map::default()),
            stream_calls: RefCell::new(Map::default()),
            ended_calls: EndedCalls::default(),
            stray_logged: Cell::new(false),
            lookup_logged: Cell::new(false),
            fates: Fates::default(),
            body_gate: BodyGate::default(),
            early: Early::default(),
            held_responses: HeldResponses::default(),
            streaming_logged: Cell::new(false),
            unmatched_seen: RefCell::new(Set::default()),
            replay_slots,
            replays: Replays::default(),
            eviction: super::eviction::probe(),
        })
    }

    /// A stream begins (Envoy created its context).
    pub fn stream_started(&self, context: u32) {
        self.fates.started(context);
    }

    /// A stream ended (`on_log`): the root no longer acts on it, and nothing waits for it —
    /// no held duplicate, body watch, queued claim or lease.
    pub(super) fn stream_ended(&self, context: u32) {
        self.fates.ended(context);
        self.waiters.forget(context);
        self.handoffs.forget(context);
        self.body_gate.forget(context);
        self.claims.forget(context);
        self.early.forget(context);
        self.held_responses.release(context);
        self.leases.forget(LeaseOwner::Stream(context));
    }

    /// Redis is a cluster (a batch was refused `CROSSSLOT`): batches hold one hash slot's keys
    /// from now on. Logged once per worker.
    pub(super) fn batching_per_slot(&self, host: &dyn Host) {
        let line = "idem: Redis is a cluster: claims and writes are batched per hash slot from now on";
        self.log_once(host, &self.batch_per_slot, Level::Info, line);
    }

    /// A request on a route with the filter on that no policy matched passed unprotected: warned
    /// once per method and path pattern (digits collapsed: `/refund/123` and `/refund/456` are
    /// one), at most [`MAX_UNMATCHED_WARNINGS`] patterns per worker. A policy path that differs
    /// from the route's (`/refund` under an Envoy route `/refunds`) otherwise fails open silently.
    pub(super) fn warn_unmatched(&self, host: &dyn Host, method: &str, path: &str) {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        let pattern: String = bare.chars().filter(|c| !c.is_ascii_digit()).collect::<String>();
        let mut h = std::hash::BuildHasher::build_hasher(&foldhash::fast::FixedState::default());
        std::hash::Hasher::write(&mut h, method.as_bytes());
        std::hash::Hasher::write(&mut h, pattern.as_bytes());
        let key = std::hash::Hasher::finish(&h);
        let mut seen = self.unmatched_seen.borrow_mut();
        if seen.len() >= MAX_UNMATCHED_WARNINGS || !seen.insert(key) {
            return;
        }
        drop(seen);
        let route = host.property(&["xds", "route_name"]).map(|b| String::from_utf8_lossy(&b).into_owned());
        host.log(
            Level::Warn,
            &format!(
                "idem: no policy matches {method} {} on Envoy route {:?}: it passed unprotected (unmatched = \
                 \"pass\"). Give the route a policy whose match.path is the route's path, or set unmatched = \
                 \"reject\" so such requests are refused (docs/deploy.md); logged once per path",
                bare.chars().take(200).collect::<String>(),
                route.unwrap_or_default()
            ),
        );
    }

    /// Logs `line` the first time only (per worker), as `logged` records.
    pub(super) fn log_once(&self, host: &dyn Host, logged: &Cell<bool>, level: Level, line: &str) {
        if !logged.replace(true) {
            host.log(level, line);
        }
    }

    // ---- counting and logging

    pub(super) fn count(&self, host: &dyn Host, route: RouteId, outcome: Outcome) {
        self.metrics.count(host, route, self.route_name(route), outcome);
    }

    pub(super) fn route_name(&self, route: RouteId) -> &str {
        &self.engine.policy(route).name
    }

    pub(super) fn enabled(&self, level: Level) -> bool {
        level as u32 >= self.log_level
    }

    /// Counts and logs a verdict (one log line per interception).
    pub(super) fn record(&self, host: &dyn Host, route: RouteId, v: &Verdict) {
        self.count(host, route, v.outcome);
        // The common case is quiet (a first request, a token): a held duplicate taking the key
        // over is forwarded too, and worth a line.
        let quiet = match v.outcome {
            Outcome::Forwarded => v.cause == "first",
            Outcome::TokenConsumed | Outcome::TokenIssued => true,
            _ => matches!(v.action, Action::Wait { .. }),
        };
        let level = if quiet { Level::Debug } else { Level::Info };
        if !self.enabled(level) {
            return;
        }
        host.log(level, &self.decision_line(v.outcome, route, v.key.as_deref(), &v.cause));
    }

    /// `idem: <outcome> route=… key=<first 8 characters>… cause=… key_digest=…`: one line per
    /// decision or finish. The digest ([`crate::key::key_digest`], which `idem-admin show` prints)
    /// matches a line to a key without the line holding the whole key.
    fn decision_line(&self, outcome: Outcome, route: RouteId, key: Option<&str>, cause: &str) -> String {
        let name = self.route_name(route);
        let shown = key.map(truncated).unwrap_or_else(|| "-".into());
        let mut line = format!("idem: {} route={name} key={shown} cause={cause}", outcome.name());
        if let Some(k) = key {
            line.push_str(" key_digest=");
            line.push_str(&crate::key::key_digest(name, k));
        }
        line
    }

    /// The decision for Envoy's access log: one filter state, `wasm.idem` (one host call where a
    /// property per field took four), read as `%FILTER_STATE(wasm.idem:PLAIN)%`:
    /// `idem_route=… idem_outcome=… idem_cause=… [idem_key=<the key's first 8 characters>]`.
    /// Stream context only (or the root acting on a stream).
    pub(super) fn annotate(&self, host: &dyn Host, route: RouteId, v: &Verdict) {
        let (name, outcome) = (self.route_name(route), v.outcome.name());
        let mut line = String::with_capacity(64 + name.len() + v.cause.len());
        for (label, value) in [("idem_route=", name), (" idem_outcome=", outcome), (" idem_cause=", &v.cause)] {
            line.push_str(label);
            line.push_str(value);
        }
        if let Some(k) = v.key.as_deref() {
            line.push_str(" idem_key=");
            push_truncated(&mut line, k);
        }
        host.set_property("idem", line.as_bytes());
    }

    pub(super) fn record_finish(
        &self,
        host: &dyn Host,
        route: RouteId,
        outcome: Option<Outcome>,
        key: Option<&str>,
        cause: &str,
    ) {
        let Some(o) = outcome else {
            return;
        };
        self.count(host, route, o);
        let level = match o {
            Outcome::Stored => return,
            Outcome::StoreError | Outcome::WriteDropped => Level::Error,
            Outcome::WriteRetried | Outcome::LeaseLost => Level::Warn,
            _ => Level::Info,
        };
        host.log(level, &self.decision_line(o, route, key, cause));
    }

    // ---- the store

    /// Sends a command to Redis: in RESP to `[redis] direct` where the host speaks it (the
    /// native build), else through Webdis, the `[redis]` cluster. Its answer reads the same.
    pub(super) fn dispatch(&self, host: &dyn Host, cmd: &redis::Command) -> Result<u32, StoreError> {
        let Some(cfg) = self.engine.bundle.redis.as_ref() else {
            return Err(StoreError::Host("no [redis] table".into()));
        };
        let timeout_ms = cfg.timeout.millis.max(1);
        if let Some(address) = cfg.direct.as_ref().filter(|_| host.speaks_resp()) {
            return host
                .redis_direct(cfg, cmd.body.as_bytes(), timeout_ms)
                .map_err(|e| StoreError::Host(format!("redis command to {address}: {e:?}")));
        }
        let tag = self.last_tag.get().wrapping_add(1);
        self.last_tag.set(tag);
        let Ok(mut headers) = self.redis_headers.try_borrow_mut() else {
            return Err(StoreError::Host("a Webdis call was sent while another was being sent".into()));
        };
        if let Some((_, path)) = headers.iter_mut().find(|(name, _)| name == ":path") {
            redis::write_tagged_path(path, tag);
        }
        let token = host
            .dispatch(&cfg.cluster, &headers, cmd.body.as_bytes(), timeout_ms)
            .map_err(|e| StoreError::Host(format!("dispatch_http_call to cluster {}: {e:?}", cfg.cluster)))?;
        drop(headers);
        self.webdis_tags.borrow_mut().insert(token, tag);
        Ok(token)
    }

    /// The reply of call `token` as its owner reads it: a Webdis reply with its tag taken off,
    /// and one that carries another call's tag (or none) as a failed call, never as this call's
    /// reply (see [`redis::write_tagged_path`]). Other calls' replies are untouched.
    pub fn checked_reply(
        &self,
        host: &dyn Host,
        token: u32,
        headers: crate::pairs::Headers,
        mut body: Vec<u8>,
    ) -> (crate::pairs::Headers, Vec<u8>) {
        let Some(tag) = self.webdis_tags.borrow_mut().remove(&token) else {
            return (headers, body);
        };
        // Webdis tags what it answers 200 (Redis errors included); its own refusals (403, 503)
        // and Envoy's failures carry no JSON to tag.
        if status_of(&headers) != 200 || redis::untag(tag, &mut body) {
            return (headers, body);
        }
        let line = format!(
            "idem: a Webdis reply did not carry its call's tag (i{tag:016x}): it is another command's, \
             which Webdis wrote into this connection after that command's client left (a callout that \
             timed out); the call is treated as failed, never as that reply (logged once per worker)"
        );
        self.log_once(host, &self.mistagged_logged, Level::Error, &line);
        (crate::pairs::Headers::default(), Vec::new())
    }

    /// A call's reply will not be read (its owner ended, or nobody owns it): its tag goes.
    pub(super) fn forget_tag(&self, token: u32) {
        self.webdis_tags.borrow_mut().remove(&token);
    }

    /// Wakes the root context (it sends what was queued for it).
    pub(super) fn wake(&self, host: &dyn Host) {
        if let Some(q) = self.wake_queue {
            host.enqueue(q);
        }
    }

    // ---- acting on streams from the root

    /// Acts on a stream from the root context, if it is still live, then makes the root the
    /// effective context again.
    pub(super) fn on_stream(&self, host: &dyn Host, context: u32, act: impl FnOnce()) {
        if self.fates.is_live(context) && host.set_effective_context(context).is_ok() {
            act();
            let _ = host.set_effective_context(self.root_id);
        }
    }

    // ---- the root context's events

    /// The root's queue was signalled: send what streams queued.
    pub fn on_queue_ready(&self, host: &dyn Host) {
        self.send_claims(host);
        self.send_queued(host);
    }

    /// What streams handed to the root to send: detached calls, then the writes in the outbox.
    pub(super) fn send_queued(&self, host: &dyn Host) {
        self.send_detached(host);
        self.send_outbox(host);
    }

    /// The root's timer: the eviction probe, the body-delivery check, queued claims and
    /// writes, lease renewals, held duplicates, and answers overdue for their request's end.
    pub fn on_tick(&self, host: &dyn Host) {
        self.send_overdue_answers(host);
        self.probe_eviction(host);
        self.check_body_delivery(host);
        self.send_claims(host);
        self.send_queued(host);
        self.renew_leases(host);
        self.recheck_waiters(host);
        self.forget_ended_calls(host);
    }

    /// The answer of a call the root owns (a claim batch, a write, a renewal, a detached call, a
    /// poll, the eviction probe).
    pub fn on_call_response(&self, host: &dyn Host, token: u32, num_headers: usize, body_size: usize) {
        match self.reply_owner(token) {
            ReplyTo::Root => {}
            ReplyTo::Ended => {
                self.forget_tag(token);
                return self.ended_calls.answered(token);
            }
            _ => return self.stray_reply(host, self.root_id, token, "no call of the root has that token"),
        }
        let (headers, body) = host.call_response(num_headers, body_size);
        let (headers, body) = self.checked_reply(host, token, headers, body);
        self.on_reply(host, token, headers, body);
    }

    /// The reply (already read where Envoy delivered it) of the root's call `token`.
    pub fn on_reply(&self, host: &dyn Host, token: u32, headers: crate::pairs::Headers, body: Vec<u8>) {
        let Some(call) = self.calls.borrow_mut().remove(&token) else {
            return self.stray_reply(host, self.root_id, token, "no call of the root has that token");
        };
        let status = status_of(&headers);
        match call {
            RootCall::Claims(batch) => self.claims_answered(host, batch, status, &body),
            RootCall::Writes(batch) => {
                self.batch_finished(host, batch, status, &body);
                self.send_queued(host);
            }
            RootCall::Renewal(owner) => {
                let renewed = self.engine.redis().map(|s| s.parse_update(status, &body));
                self.renewed(owner, renewed.unwrap_or(Ok(true)));
            }
            RootCall::Detached(call) => {
                self.detached_answered(host, call, status, headers.to_pairs(), body);
                self.send_queued(host);
            }
            RootCall::Poll(poll) => self.polled(host, poll, status, &body),
            RootCall::EvictionProbe => self.eviction_answered(host, status, &body),
        }
    }

    /// Who a reply is for: the owner its token was recorded with when the call was sent.
    pub fn reply_owner(&self, token: u32) -> ReplyTo {
        if self.calls.borrow().contains_key(&token) {
            return ReplyTo::Root;
        }
        match self.stream_calls.borrow().get(&token) {
            Some(ctx) => ReplyTo::Stream(*ctx),
            None if self.ended_calls.contains(token) => ReplyTo::Ended,
            None => ReplyTo::Nobody,
        }
    }

    /// A stream sent a call: its reply is this stream's.
    pub(super) fn stream_call_out(&self, token: u32, ctx: u32) {
        self.stream_calls.borrow_mut().insert(token, ctx);
    }

    /// A stream's call was answered or abandoned (the stream ended): its token is forgotten.
    pub(super) fn stream_call_done(&self, token: u32) {
        self.stream_calls.borrow_mut().remove(&token);
    }

    /// A reply nobody is waiting for under its token (its stream ended, or a token nobody
    /// recorded): never read, counted and logged once per worker with where it arrived.
    pub fn stray_reply(&self, host: &dyn Host, delivered_to: u32, token: u32, why: &str) {
        self.forget_tag(token);
        self.metrics.count_stray_reply(host);
        let line = format!(
            "idem: a callout reply was delivered to context {delivered_to} under token {token}, which no \
             waiting call owns ({why}); it is dropped unread (idem_stray_replies_total counts them)"
        );
        self.log_once(host, &self.stray_logged, Level::Warn, &line);
    }

    /// Remembers a call the root sent, for its answer.
    pub(super) fn call_out(&self, token: u32, call: RootCall) {
        self.calls.borrow_mut().insert(token, call);
    }

    /// Write calls out, and the writes they carry.
    pub(super) fn writes_out(&self) -> (usize, usize) {
        let calls = self.calls.borrow();
        let batches = calls.values().filter_map(|c| match c {
            RootCall::Writes(b) => Some(b.len()),
            _ => None,
        });
        batches.fold((0, 0), |(n, jobs), len| (n + 1, jobs + len))
    }
}

/// A call the root context owns: what its answer is for.
pub(super) enum RootCall {
    /// Claims sent together (group commit).
    Claims(ClaimBatch),
    /// Completions, releases and token restores: one, or a batch.
    Writes(Vec<Job>),
    /// A lease renewal.
    Renewal(LeaseOwner),
    /// A request sent upstream by the root (`forward = "detached"`).
    Detached(Detached),
    /// A Webdis poll of a group of held duplicates.
    Poll(Poll),
    /// The question whether Redis evicts keys (see `eviction`).
    EvictionProbe,
}

/// Where a callout's reply goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyTo {
    Root,
    Stream(u32),
    /// The call of a stream that ended with it out (Envoy 1.40 still answers it): dropped
    /// unread, as expected.
    Ended,
    /// No call out has this token.
    Nobody,
}

/// The shared-data namespace of a bundle that names none: the plugin's name with what a
/// namespace may not hold replaced by `_` (Envoy Gateway's names hold `/`), or `idem`.
fn default_namespace(plugin_name: Option<Vec<u8>>) -> String {
    let name: String = plugin_name
        .unwrap_or_default()
        .iter()
        .take(128)
        .map(|&b| if b.is_ascii_alphanumeric() || b"._-".contains(&b) { char::from(b) } else { '_' })
        .collect();
    if name.is_empty() {
        "idem".into()
    } else {
        name
    }
}

/// Sends `r` (moved to the host, which may keep it until the hook returns).
pub(super) fn send(host: &dyn Host, r: LocalReply) {
    let r = if r.request_id { with_request_id(host, r) } else { r };
    if let Err(e) = host.send_reply(r) {
        host.log(Level::Error, &format!("idem: send_local_response failed: {e:?}"));
    }
}

/// The answer with `{{request_id}}` filled in: the stream's `x-request-id` (Envoy's, or a trusted
/// caller's), kept only when it is a plain id (letters, digits, `-_.:`, at most 128), so it needs
/// no escaping wherever the template put it; empty otherwise.
fn with_request_id(host: &dyn Host, mut r: LocalReply) -> LocalReply {
    let id = host
        .request_header("x-request-id")
        .filter(|v| v.len() <= 128 && v.iter().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(b)))
        .unwrap_or_default();
    let mark = crate::answers::REQUEST_ID_MARK.as_bytes();
    let fill = |bytes: &[u8]| -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len());
        let mut rest = bytes;
        while let Some(i) = rest.windows(mark.len()).position(|w| w == mark) {
            out.extend_from_slice(rest.get(..i).unwrap_or_default());
            out.extend_from_slice(&id);
            rest = rest.get(i + mark.len()..).unwrap_or_default();
        }
        out.extend_from_slice(rest);
        out
    };
    r.body = fill(&r.body);
    for (_, v) in &mut r.headers {
        *v = fill(v);
    }
    r.request_id = false;
    r
}

/// `:status` of a header map, 0 when absent (a failed callout has no headers).
pub(super) fn status_of(headers: &crate::pairs::Headers) -> u16 {
    parse_status(headers.get(b":status"))
}

/// A `:status` value as a number, 0 when absent or not one.
pub(super) fn parse_status(value: Option<&[u8]>) -> u16 {
    value.and_then(|v| std::str::from_utf8(v).ok()).and_then(|s| s.parse().ok()).unwrap_or(0)
}
