//! What one worker's contexts share: the engine, counters, held duplicates, and the Redis
//! writes and detached upstream calls the root context sends for requests.

use super::abi;
use super::envoy::{log, Envoy, Level};
use crate::engine::{
    self, Action as Do, Ending, Engine, Finish, Outcome, Prepared, StoreOp, StoreTicket, Ticket, Verdict,
};
use crate::host::Host;
use crate::key::truncated;
use crate::pairs::Pair;
use crate::policy::StoreKind;
use crate::response::LocalReply;
use crate::store::{redis, shared, Completion, StoreError};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};

/// A held duplicate, polled by the root context.
pub(super) struct Waiter {
    pub(super) prepared: Prepared,
    pub(super) deadline_ms: u64,
    /// A Webdis poll is on its way (Redis routes).
    pub(super) polling: bool,
}

/// Pending Redis writes per worker are bounded: a long Redis outage must not grow a worker's
/// memory without limit. Past either bound the oldest queued write is dropped (counted, logged).
const MAX_PENDING_WRITES: usize = 1024;
const MAX_PENDING_BYTES: usize = 16 << 20;
/// Backoff of a refused write: 100 ms, doubling, at most 2 s between attempts.
const RETRY_FIRST_MS: u64 = 100;
const RETRY_MAX_MS: u64 = 2000;

/// What every context of this worker shares.
pub(super) struct State {
    pub(super) engine: Engine,
    /// `counters[route][outcome.index()]`
    pub(super) counters: Vec<Vec<Option<u32>>>,
    /// `idem._unmatched.passed` and `idem._unmatched.rejected`.
    pub(super) unmatched_counters: [Option<u32>; 2],
    /// Held duplicates by HTTP context id.
    pub(super) waiters: RefCell<HashMap<u32, Waiter>>,
    /// Root-context Webdis polls: callout token → (HTTP context id, route, the poll's claim ticket).
    pub(super) polls: RefCell<HashMap<u32, (u32, usize, redis::Ticket)>>,
    /// Envoy's log level for the `wasm` component when the plugin configured, so debug lines
    /// are not even formatted when they would be dropped.
    pub(super) log_level: u32,
    /// Tickets (and keys) won by a waiter on the root's tick, picked up by its HTTP context.
    pub(super) handoff: RefCell<HashMap<u32, (Ticket, String)>>,
    /// Redis writes waiting to be sent (or re-sent) by the root context, oldest first.
    pub(super) outbox: RefCell<VecDeque<Job>>,
    /// Root-context Webdis calls in flight: callout token → job.
    pub(super) finishing: RefCell<HashMap<u32, Job>>,
    /// Detached upstream calls waiting to be sent by the root context.
    pub(super) detached_out: RefCell<Vec<Detached>>,
    /// Detached upstream calls in flight: callout token → call.
    pub(super) detached: RefCell<HashMap<u32, Detached>>,
    /// This worker's wake-up queue: an HTTP context enqueues, the root's on_queue_ready sends.
    pub(super) wake_queue: Option<u32>,
    /// The root context's id: after acting on an HTTP context with `set_effective_context`, the
    /// root switches back to itself, or its next callout would belong to that request (and be
    /// cancelled with it — Envoy crashed on exactly that).
    pub(super) root_id: u32,
    /// Claims whose requests wait for the upstream, renewed by the root context every third of
    /// their lease: while this gateway lives, a slow request is never taken over. Only a gateway
    /// that died stops renewing (the one way left to a second execution).
    pub(super) leases: RefCell<HashMap<LeaseOwner, Lease>>,
    /// Root-context Webdis renewals in flight: callout token → whose lease.
    pub(super) renewals: RefCell<HashMap<u32, LeaseOwner>>,
    /// HTTP contexts whose stream has not ended (created, and `on_log` not seen yet). The root
    /// acts on a request only while it is here: Envoy may still accept `set_effective_context`
    /// for a stream its client reset, but a local reply sent there calls back into a context the
    /// SDK has deleted, and the SDK panics ("invalid context_id").
    pub(super) live: RefCell<HashSet<u32>>,
}

/// Who holds a forwarded claim: a request's own stream, or the root's detached call for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum LeaseOwner {
    Request(u32),
    Detached(u32),
}

pub(super) struct Lease {
    pub(super) route: usize,
    pub(super) ticket: StoreTicket,
    pub(super) renew_at_ms: u64,
}

/// A Redis write finishing a ticket, sent by the root context so it completes even though the
/// request's stream (and any callout the stream owns) is gone by then. A write the store refuses
/// is retried with backoff until it lands, is fenced out, or `deadline_ms` passes.
pub(super) struct Job {
    pub(super) route: usize,
    pub(super) key: Option<String>,
    /// What to do for the client once the first attempt is answered (landed or not).
    pub(super) after: After,
    pub(super) cmd: redis::Command,
    pub(super) kind: FinishKind,
    pub(super) cause: String,
    pub(super) attempts: u32,
    pub(super) next_at_ms: u64,
    pub(super) deadline_ms: u64,
    /// The Redis key, marked in this process' shared store while its answer is not written.
    pub(super) redis_key: String,
    pub(super) mark: Option<shared::Ticket>,
}

/// The client side of a finished write.
pub(super) enum After {
    Nothing,
    /// Resume the held response of this HTTP context.
    Resume(u32),
    /// Answer this (paused) HTTP context with a local reply: a detached call's answer.
    Deliver(u32, LocalReply),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FinishKind {
    Release,
    /// A claim that may have been applied after its request stopped caring (callout timed out,
    /// client gone): released if it is ours.
    ReleaseOrphan,
    Complete {
        tombstone: bool,
    },
    Restore,
    HoldUnknown,
}

/// A claimed request sent upstream by the root context (`forward = "detached"`).
pub(super) struct Detached {
    pub(super) ctx: u32,
    pub(super) route: usize,
    pub(super) ticket: Ticket,
    pub(super) key: Option<String>,
    pub(super) cluster: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
    pub(super) first_seen_ms: u64,
}

impl State {
    /// Starts renewing a forwarded claim's lease (key claims only; tokens have no lease).
    pub(super) fn hold_lease(&self, owner: LeaseOwner, route: usize, ticket: &Ticket) {
        let Ticket::Claim(st) = ticket else {
            return;
        };
        let renew_at_ms = Envoy.now_ms().saturating_add(self.renew_every(route));
        self.leases.borrow_mut().insert(owner, Lease { route, ticket: st.clone(), renew_at_ms });
    }

    pub(super) fn drop_lease(&self, owner: LeaseOwner) {
        self.leases.borrow_mut().remove(&owner);
    }

    fn renew_every(&self, route: usize) -> u64 {
        self.engine.policy(route).map(|p| p.key.lock_ttl.millis / 3).unwrap_or(1000).max(1)
    }

    /// Renews the leases that are due (root context, on its tick).
    pub(super) fn renew_leases(&self) {
        let now = Envoy.now_ms();
        let due: Vec<(LeaseOwner, usize, StoreTicket)> = self
            .leases
            .borrow()
            .iter()
            .filter(|(_, l)| l.renew_at_ms <= now)
            .map(|(o, l)| (*o, l.route, l.ticket.clone()))
            .collect();
        for (owner, route, ticket) in due {
            let next = now.saturating_add(self.renew_every(route));
            if let Some(l) = self.leases.borrow_mut().get_mut(&owner) {
                l.renew_at_ms = next;
            }
            match &ticket {
                StoreTicket::Shared(t) => {
                    if let Ok(false) = self.engine.renew_shared(&Envoy, route, t) {
                        self.drop_lease(owner); // taken over meanwhile: nothing left to renew
                    }
                }
                StoreTicket::Redis(t) => {
                    let (Some(store), Some(policy)) = (self.engine.redis(), self.engine.policy(route)) else {
                        continue;
                    };
                    if let Ok(token) = self.dispatch(&store.renew(t, policy.key.lock_ttl.millis)) {
                        self.renewals.borrow_mut().insert(token, owner);
                    }
                }
            }
        }
    }

    /// A Webdis renewal's reply: a lease that is no longer ours is not renewed again.
    pub(super) fn renewed(&self, owner: LeaseOwner, status: u16, body: &[u8]) {
        if let (Some(store), true) = (self.engine.redis(), status != 0) {
            if let Ok(false) = store.parse_update(status, body) {
                self.drop_lease(owner);
            }
        }
    }

    pub(super) fn count(&self, route: usize, outcome: Outcome) {
        if let Some(Some(id)) = self.counters.get(route).and_then(|c| c.get(outcome.index())) {
            abi::increment(*id, 1);
        }
    }

    pub(super) fn count_unmatched(&self, rejected: bool) {
        if let Some(id) = self.unmatched_counters[usize::from(rejected)] {
            abi::increment(id, 1);
        }
    }

    pub(super) fn route_name(&self, route: usize) -> &str {
        self.engine.policy(route).map(|p| p.name.as_str()).unwrap_or("?")
    }

    pub(super) fn enabled(&self, level: Level) -> bool {
        level as u32 >= self.log_level
    }

    /// Counts and logs a verdict (one log line per interception).
    pub(super) fn record(&self, route: usize, v: &Verdict) {
        self.count(route, v.outcome);
        let quiet = matches!(v.outcome, Outcome::Forwarded | Outcome::TokenConsumed | Outcome::TokenIssued)
            || matches!(v.action, Do::Wait { .. });
        let level = if quiet { Level::Debug } else { Level::Info };
        if !self.enabled(level) {
            return;
        }
        let key = v.key.as_deref().map(truncated).unwrap_or_else(|| "-".into());
        log(
            level,
            &format!("idem: {} route={} key={} cause={}", v.outcome.name(), self.route_name(route), key, v.cause),
        );
    }

    pub(super) fn record_finish(&self, route: usize, outcome: Option<Outcome>, key: Option<&str>, cause: &str) {
        if let Some(o) = outcome {
            self.count(route, o);
            let level = match o {
                Outcome::Stored => return,
                Outcome::StoreError | Outcome::WriteDropped => Level::Error,
                Outcome::WriteRetried | Outcome::LeaseLost => Level::Warn,
                _ => Level::Info,
            };
            let key = key.map(truncated).unwrap_or_else(|| "-".into());
            log(level, &format!("idem: {} route={} key={} cause={}", o.name(), self.route_name(route), key, cause));
        }
    }

    /// Whether a route keeps its claims and tokens in Redis.
    pub(super) fn redis_route(&self, route: usize) -> bool {
        self.engine.policy(route).is_some_and(|p| p.store == StoreKind::Redis)
    }

    /// The Webdis call for a prepared claim or token use, with a fresh owner, and its ticket.
    pub(super) fn redis_op(&self, p: &Prepared, now: u64) -> Option<(redis::Command, redis::Ticket)> {
        let store = self.engine.redis()?;
        let owner = Envoy.random_u64().unwrap_or(now);
        Some(match &p.op {
            StoreOp::Claim { id, fingerprint } => {
                let lock_ttl = self.engine.policy(p.route).map(|r| r.key.lock_ttl.millis).unwrap_or(1);
                store.claim(id, fingerprint, owner, now, lock_ttl)
            }
            StoreOp::UseToken { id } => store.use_token(id, owner, now),
        })
    }

    /// Sends a Webdis command through the `[redis]` cluster.
    pub(super) fn dispatch(&self, cmd: &redis::Command) -> Result<u32, StoreError> {
        let (Some(cfg), Some(store)) = (self.engine.bundle.redis.as_ref(), self.engine.redis()) else {
            return Err(StoreError::Host("no [redis] table".into()));
        };
        abi::dispatch(&cfg.cluster, &store.headers(), cmd.body.as_bytes(), cfg.timeout.millis)
            .map_err(|s| StoreError::Host(format!("dispatch_http_call to cluster {}: status {s}", cfg.cluster)))
    }

    /// Wakes the root context (it sends what was queued for it).
    pub(super) fn wake(&self) {
        if let Some(q) = self.wake_queue {
            let _ = abi::enqueue(q, b"1");
        }
    }

    /// Finishes a ticket with how its request ended: at once on the shared store, through a
    /// queued Redis write otherwise. A queued write carries `after` out itself (root context,
    /// when the first attempt is answered) and `None` is returned; a finish done at once returns
    /// `after` for the caller, who knows which context it runs in.
    #[must_use]
    pub(super) fn finish_ticket(
        &self,
        route: usize,
        ticket: &Ticket,
        key: Option<String>,
        ending: Ending,
        after: After,
    ) -> Option<After> {
        let (Ticket::Claim(st) | Ticket::Token(st)) = ticket;
        let rt = match st {
            StoreTicket::Shared(_) => {
                let (outcome, cause) = self.engine.finish_shared(&Envoy, route, ticket, ending);
                self.record_finish(route, outcome, key.as_deref(), &cause);
                return Some(after);
            }
            StoreTicket::Redis(rt) => rt,
        };
        let (Some(store), Some(policy)) = (self.engine.redis(), self.engine.policy(route)) else {
            return Some(after);
        };
        let now = Envoy.now_ms();
        let lease = policy.key.lock_ttl.millis;
        let (cmd, kind, cause, lasts_ms) = match self.engine.plan_finish(route, ticket, &ending) {
            Finish::Nothing { outcome, cause } => {
                self.record_finish(route, outcome, key.as_deref(), &cause);
                return Some(after);
            }
            Finish::Release { cause } => (store.release(rt), FinishKind::Release, cause, lease),
            Finish::RestoreToken { cause } => {
                (store.restore_token(rt), FinishKind::Restore, cause, policy.token.ttl.millis)
            }
            Finish::Complete { response, max_response_bytes, ttl_ms, cause } => {
                let (cmd, tombstone) = store.complete(rt, &response, max_response_bytes, ttl_ms, lease);
                (cmd, FinishKind::Complete { tombstone }, cause, ttl_ms)
            }
            Finish::HoldUnknown { hold_ms, cause } => {
                (store.hold_unknown(rt, hold_ms, now, lease), FinishKind::HoldUnknown, cause, hold_ms)
            }
        };
        let deadline_ms = rt.first_seen_ms.saturating_add(lasts_ms).max(now.saturating_add(lease));
        let redis_key = rt.key.clone();
        self.queue(Job {
            route,
            key,
            after,
            cmd,
            kind,
            cause,
            attempts: 0,
            next_at_ms: now,
            deadline_ms,
            redis_key,
            mark: None,
        });
        None
    }

    /// An owner-checked release of a claim that may have been applied although its request no
    /// longer waits for it (a timed-out callout, a client gone while the claim was out).
    pub(super) fn release_orphan(&self, route: usize, key: Option<String>, ticket: &redis::Ticket) {
        let Some(store) = self.engine.redis() else {
            return;
        };
        let now = Envoy.now_ms();
        let lease = self.engine.policy(route).map(|p| p.key.lock_ttl.millis).unwrap_or(1);
        self.queue(Job {
            route,
            key,
            after: After::Nothing,
            cmd: store.release(ticket),
            kind: FinishKind::ReleaseOrphan,
            cause: "orphaned_claim".into(),
            attempts: 0,
            next_at_ms: now,
            deadline_ms: ticket.first_seen_ms.saturating_add(lease),
            redis_key: ticket.key.clone(),
            mark: None,
        });
    }

    /// Queues a write for the root context, within the per-worker bounds.
    fn queue(&self, job: Job) {
        let mut outbox = self.outbox.borrow_mut();
        outbox.push_back(job);
        let in_flight = self.finishing.borrow().len();
        let mut bytes: usize = outbox.iter().map(|j| j.cmd.body.len()).sum();
        let mut dropped = Vec::new();
        while outbox.len() + in_flight > MAX_PENDING_WRITES || bytes > MAX_PENDING_BYTES {
            let Some(old) = outbox.pop_front() else {
                break;
            };
            bytes -= old.cmd.body.len();
            dropped.push(old);
        }
        drop(outbox);
        for old in dropped {
            let cause = format!(
                "{}; pending writes over the bound ({MAX_PENDING_WRITES} or {MAX_PENDING_BYTES} bytes)",
                old.cause
            );
            self.record_finish(old.route, Some(Outcome::WriteDropped), old.key.as_deref(), &cause);
            self.carry_out(old.after);
        }
        self.wake();
    }

    /// Sends the writes and detached calls that are due (root context only: the callouts then
    /// belong to the root and survive the request).
    pub(super) fn send_outbox(&self) {
        self.send_detached();
        let now = Envoy.now_ms();
        let due: Vec<Job> = {
            let mut outbox = self.outbox.borrow_mut();
            let (due, later): (VecDeque<Job>, VecDeque<Job>) = outbox.drain(..).partition(|j| j.next_at_ms <= now);
            *outbox = later;
            due.into()
        };
        for job in due {
            match self.dispatch(&job.cmd) {
                Ok(token) => {
                    self.finishing.borrow_mut().insert(token, job);
                }
                Err(e) => self.write_failed(job, e, now),
            }
        }
    }

    /// The reply to a write.
    pub(super) fn finished(&self, job: Job, status: u16, body: &[u8]) {
        let Some(store) = self.engine.redis() else {
            return;
        };
        let applied = match store.parse_update(status, body) {
            Ok(applied) => applied,
            Err(e) => return self.write_failed(job, e, Envoy.now_ms()),
        };
        let ok = Ok(applied);
        let (outcome, cause) = match job.kind {
            FinishKind::Release => engine::released(ok, job.cause),
            FinishKind::ReleaseOrphan => match applied {
                true => (Some(Outcome::OrphanReleased), job.cause),
                false => (None, job.cause),
            },
            FinishKind::Restore => engine::restored(ok, job.cause),
            FinishKind::HoldUnknown => engine::held(ok, job.cause),
            FinishKind::Complete { tombstone } => {
                let done = match (applied, tombstone) {
                    (false, _) => Completion::LostOwnership,
                    (true, true) => Completion::Tombstoned,
                    (true, false) => Completion::Stored,
                };
                engine::completed(Ok(done), job.cause)
            }
        };
        let cause = if job.attempts > 0 { format!("{cause}; after {} retries", job.attempts) } else { cause };
        self.record_finish(job.route, outcome, job.key.as_deref(), &cause);
        if let Some(mark) = &job.mark {
            self.engine.unmark_unwritten(&Envoy, mark);
        }
        // The client gets its answer only now, so its next retry finds the record written.
        self.carry_out(job.after);
    }

    /// A write the store refused or did not answer: retried with backoff until its deadline.
    /// The client is not kept waiting meanwhile (its answer goes out after the first attempt);
    /// a retry from it finds the claim still ours (the write extends the lease) and gets 409.
    fn write_failed(&self, mut job: Job, e: StoreError, now: u64) {
        let after = std::mem::replace(&mut job.after, After::Nothing);
        self.carry_out(after);
        if now >= job.deadline_ms {
            let cause = format!("{}; gave up after {} attempts: {e}", job.cause, job.attempts + 1);
            if let Some(mark) = &job.mark {
                self.engine.unmark_unwritten(&Envoy, mark);
            }
            return self.record_finish(job.route, Some(Outcome::StoreError), job.key.as_deref(), &cause);
        }
        if job.mark.is_none() && matches!(job.kind, FinishKind::Complete { .. } | FinishKind::HoldUnknown) {
            job.mark = self.engine.mark_unwritten(&Envoy, &job.redis_key, job.deadline_ms);
        }
        let backoff = RETRY_FIRST_MS.saturating_mul(1 << job.attempts.min(5)).min(RETRY_MAX_MS);
        job.attempts += 1;
        job.next_at_ms = now.saturating_add(backoff);
        let cause = format!("{}; attempt {} refused ({e}); retrying in {backoff} ms", job.cause, job.attempts);
        self.record_finish(job.route, Some(Outcome::WriteRetried), job.key.as_deref(), &cause);
        self.outbox.borrow_mut().push_back(job);
    }

    /// Sends queued detached upstream calls.
    fn send_detached(&self) {
        let calls: Vec<Detached> = self.detached_out.borrow_mut().drain(..).collect();
        for call in calls {
            let timeout = self.engine.policy(call.route).map(|p| p.upstream_timeout.millis).unwrap_or(15_000);
            match abi::dispatch(&call.cluster, &call.headers, &call.body, timeout) {
                Ok(token) => {
                    self.hold_lease(LeaseOwner::Detached(call.ctx), call.route, &call.ticket);
                    self.detached.borrow_mut().insert(token, call);
                }
                Err(s) => {
                    let cause = format!("detached call to cluster {} not sent: status {s}", call.cluster);
                    log(Level::Error, &format!("idem: {cause}"));
                    let reply = crate::response::json_reply(
                        503,
                        "IDEMPOTENCY_UPSTREAM_UNAVAILABLE",
                        "the request could not be sent upstream; retry later",
                        &[],
                    );
                    let ending = Ending::NoResponse { forwarded: false };
                    let after = After::Deliver(call.ctx, reply);
                    if let Some(after) = self.finish_ticket(call.route, &call.ticket, call.key, ending, after) {
                        self.carry_out(after);
                    }
                }
            }
        }
    }

    /// A detached call's answer: store it, then give it to the client if it is still there.
    pub(super) fn detached_answered(&self, call: Detached, status: u16, headers: Vec<Pair>, body: Vec<u8>) {
        self.drop_lease(LeaseOwner::Detached(call.ctx));
        let Some(policy) = self.engine.policy(call.route) else {
            return;
        };
        let hold_until = Envoy.now_ms().saturating_add(policy.key.unknown_hold_ms());
        let reply = crate::forward::answer(status, &headers, &body, call.first_seen_ms, hold_until);
        let ending = crate::forward::ending(status, headers, body, policy.max_response_bytes as usize);
        if let Some(after) =
            self.finish_ticket(call.route, &call.ticket, call.key, ending, After::Deliver(call.ctx, reply))
        {
            self.carry_out(after);
        }
    }

    /// A held request's verdict, acted on from the root context.
    pub(super) fn resolve_waiter(&self, ctx: u32, v: Verdict) {
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
        if !self.live.borrow().contains(&ctx) || abi::set_effective_context(ctx).is_err() {
            return;
        }
        match v.action {
            Do::Forward(ticket) => {
                if let Some(t) = ticket {
                    self.handoff.borrow_mut().insert(ctx, (t, v.key.unwrap_or_default()));
                }
                let _ = abi::resume_request();
            }
            Do::Reply(r) => send(&r),
            Do::Wait { .. } => {}
        }
        let _ = abi::set_effective_context(self.root_id);
    }
}

impl State {
    /// Carries out the client side of a finished write (root context only), then makes the root
    /// the effective context again.
    fn carry_out(&self, after: After) {
        let live = |ctx: &u32| self.live.borrow().contains(ctx);
        match after {
            After::Nothing => return,
            After::Resume(ctx) => {
                if live(&ctx) && abi::set_effective_context(ctx).is_ok() {
                    let _ = abi::resume_response();
                }
            }
            After::Deliver(ctx, reply) => {
                // Not when the client left: its retry will find the stored answer instead.
                if live(&ctx) && abi::set_effective_context(ctx).is_ok() {
                    send(&reply);
                }
            }
        }
        let _ = abi::set_effective_context(self.root_id);
    }
}

pub(super) fn send(r: &LocalReply) {
    if let Err(s) = abi::send_response(r.status, &r.headers, &r.body) {
        log(Level::Error, &format!("idem: send_local_response failed: status {s}"));
    }
}

/// The callout reply being handled: HTTP status (0 when the callout failed), headers and body.
pub(super) fn call_response(num_headers: usize, body_size: usize) -> (u16, Vec<Pair>, Vec<u8>) {
    let headers =
        if num_headers == 0 { Vec::new() } else { abi::headers(abi::map::CALL_RESPONSE_HEADERS).unwrap_or_default() };
    let status = headers
        .iter()
        .find(|(n, _)| n == b":status")
        .and_then(|(_, v)| std::str::from_utf8(v).ok())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = abi::buffer(abi::buffer::CALL_RESPONSE_BODY, 0, body_size).ok().flatten().unwrap_or_default();
    (status, headers, body)
}
