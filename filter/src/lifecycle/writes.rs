//! Finishing a claim or token through the route's store: at once on the shared store; on Redis,
//! a write the root context sends, retries with backoff while the store refuses it (its key
//! marked unwritten in the answer cache meanwhile), and bounds per worker.

use super::replay::Answered;
use super::slots::{batches, several_slots};
use super::worker::{RootCall, Worker};
use crate::engine::{self, Ending, Finish, Outcome, StoreTicket, Ticket};
use crate::host::Host;
use crate::policy::RouteId;
use crate::response::{LocalReply, StoredResponse};
use crate::store::redis::{self, Released};
use crate::store::remote::Unanswered;
use crate::store::{shared, Answer, Call, Claim, Step, StoreError, Write, WriteKind, Written};
use std::cell::RefCell;
use std::collections::VecDeque;

/// Pending Redis writes per worker are bounded: a long Redis outage must not grow a worker's
/// memory without limit. Past either bound the oldest queued write is dropped (counted, logged).
const MAX_PENDING_WRITES: usize = 1024;
const MAX_PENDING_BYTES: usize = 16 << 20;
/// Backoff of a refused write: 100 ms, doubling, at most 2 s between attempts.
const RETRY_FIRST_MS: u64 = 100;
const RETRY_MAX_MS: u64 = 2000;
/// An orphaned claim not found yet is looked for again at most this far apart, so a late claim
/// is freed within about a second of landing.
const ORPHAN_RECHECK_MAX_MS: u64 = 1000;
/// The most writes one batch carries, and the most bytes of commands (Webdis reads a request
/// body whole).
const MAX_BATCH_WRITES: usize = 64;
const MAX_BATCH_BYTES: usize = 1 << 20;
/// Write calls a worker keeps out before due writes wait for a batch (as for claims: light load
/// pays no wait).
const WRITE_CALLS_OUT: usize = 4;

/// A Redis write finishing a ticket, sent by the root context so it completes even though the
/// request's stream (and any callout the stream owns) is gone by then. A write the store refuses
/// is retried with backoff until it lands, is fenced out, or `deadline_ms` passes.
pub(super) struct Job {
    route: RouteId,
    key: Option<String>,
    /// What to do for the client once the first attempt is answered (landed or not).
    after: After,
    cmd: redis::Command,
    kind: FinishKind,
    cause: String,
    attempts: u32,
    next_at_ms: u64,
    deadline_ms: u64,
    /// The Redis key's scoped id: its entry in this process' shared store is marked while its
    /// answer is not written, then holds the answer.
    redis_id: [u8; 32],
    /// The claim's fingerprint (first half) and first-seen time, for the answer kept here.
    fingerprint: [u8; 16],
    first_seen_ms: u64,
    mark: Option<shared::Ticket>,
    /// When the current attempt was sent (for `idem_store_call_time`).
    sent_ms: u64,
    /// The answer a completion writes, kept in this process once Redis has it: status and
    /// response (`None` for a tombstone).
    answer: Option<(u16, Option<StoredResponse>)>,
}

impl Job {
    /// A write fenced by `t`, due now, tried until `deadline_ms`; nothing to do for the client
    /// after it and no answer to keep unless set.
    #[allow(clippy::too_many_arguments)]
    fn new(
        route: RouteId,
        key: Option<String>,
        cmd: redis::Command,
        kind: FinishKind,
        cause: String,
        t: &redis::Ticket,
        now: u64,
        deadline_ms: u64,
    ) -> Job {
        Job {
            route,
            key,
            after: After::Nothing,
            cmd,
            kind,
            cause,
            attempts: 0,
            next_at_ms: now,
            deadline_ms,
            redis_id: t.id(),
            fingerprint: t.fingerprint16(),
            first_seen_ms: t.first_seen_ms,
            mark: None,
            sent_ms: now,
            answer: None,
        }
    }
}

/// The client side of a finish.
pub(super) enum After {
    Nothing,
    /// Resume the held response of this stream.
    Resume(u32),
    /// Answer this (paused) stream with a local reply: a detached call's answer.
    Deliver {
        ctx: u32,
        route: RouteId,
        reply: LocalReply,
        grpc: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FinishKind {
    Release,
    /// A claim that may have been applied after its request stopped caring (callout timed out,
    /// client gone): released if it is ours.
    ReleaseOrphan,
    Complete {
        tombstone: bool,
    },
    Restore,
    HoldUnknown,
    /// A lookup's answer written as the key's (or, without one, the unknown outcome given back):
    /// counted with the lookup (`reconciled_ran`, `reconcile_failed`), not again here.
    Lookup,
}

/// Redis writes waiting to be sent (or sent again) by the root context, oldest first: this
/// concern's state.
#[derive(Default)]
pub(super) struct Outbox {
    jobs: RefCell<VecDeque<Job>>,
}

impl Outbox {
    /// Queues a write, within the per-worker bounds ([`MAX_PENDING_WRITES`] counting the
    /// `in_flight` writes, [`MAX_PENDING_BYTES`]): the oldest queued writes past them are
    /// dropped, and returned to be counted.
    fn push(&self, job: Job, in_flight: usize) -> Vec<Job> {
        let mut jobs = self.jobs.borrow_mut();
        jobs.push_back(job);
        let mut bytes: usize = jobs.iter().map(|j| j.cmd.body.len()).sum();
        let mut dropped = Vec::new();
        while jobs.len() + in_flight > MAX_PENDING_WRITES || bytes > MAX_PENDING_BYTES {
            let Some(old) = jobs.pop_front() else {
                break;
            };
            bytes -= old.cmd.body.len();
            dropped.push(old);
        }
        dropped
    }

    /// The writes due at `now`, oldest first; the others stay.
    fn take_due(&self, now: u64) -> Vec<Job> {
        let mut jobs = self.jobs.borrow_mut();
        let (due, later): (VecDeque<Job>, VecDeque<Job>) = jobs.drain(..).partition(|j| j.next_at_ms <= now);
        *jobs = later;
        due.into()
    }

    /// A write to try again at its `next_at_ms`.
    fn retry(&self, job: Job) {
        self.jobs.borrow_mut().push_back(job);
    }

    /// Writes of a batch Redis Cluster refused (`CROSSSLOT`, nothing of it ran) go first again.
    fn requeue_first(&self, batch: Vec<Job>) {
        let mut jobs = self.jobs.borrow_mut();
        for job in batch.into_iter().rev() {
            jobs.push_front(job);
        }
    }
}

impl Worker {
    /// Finishes a ticket with how its request ended, through the route's store: at once on the
    /// shared store, through a queued Redis write otherwise. A queued write carries `after` out
    /// itself (root context, when the first attempt is answered) and `None` is returned; a
    /// finish done at once returns `after` for the caller, who knows which context it runs in.
    #[must_use]
    pub(super) fn finish_ticket(
        &self,
        host: &dyn Host,
        route: RouteId,
        ticket: &Ticket,
        key: Option<String>,
        ending: Ending,
        after: After,
    ) -> Option<After> {
        let st = ticket.store_ticket();
        let (write, cause) = match self.engine.plan_finish(route, ticket, ending, key.as_deref()) {
            Finish::Nothing { outcome, cause } => {
                self.record_finish(host, route, outcome, key.as_deref(), &cause);
                return Some(after);
            }
            Finish::Write { write, cause } => (write, cause),
        };
        if let Write::HoldUnknown { .. } = write {
            self.report_unknown(host, route, st, key.as_deref(), &cause);
        }
        let now = host.now_ms();
        let policy = self.engine.policy(route);
        let lease = policy.key.lock_ttl.millis;
        let call = match self.engine.store(route).write(host, st, &write, lease, now) {
            Step::Now(written) => {
                let (outcome, cause) = engine::finished(write.kind(), written, cause);
                self.record_finish(host, route, outcome, key.as_deref(), &cause);
                return Some(after);
            }
            Step::Call(call) => call,
        };
        let StoreTicket::Redis(rt) = st else {
            return Some(after);
        };
        let (kind, lasts_ms) = match &write {
            Write::Release => (FinishKind::Release, lease),
            Write::RestoreToken => (FinishKind::Restore, policy.token.ttl.millis),
            Write::HoldUnknown { hold_ms, .. } => (FinishKind::HoldUnknown, *hold_ms),
            Write::Complete { ttl_ms, .. } => (FinishKind::Complete { tombstone: call.tombstone }, *ttl_ms),
            Write::LookupRan { .. } | Write::LookupGivenBack => (FinishKind::Lookup, lease),
        };
        let answer = match (write, ticket) {
            (Write::Complete { response, .. }, Ticket::Claim(_)) => {
                Some((response.status, (!call.tombstone).then_some(response)))
            }
            _ => None,
        };
        let deadline_ms = rt.first_seen_ms.saturating_add(lasts_ms).max(now.saturating_add(lease));
        let mut job = Job::new(route, key, call.cmd, kind, cause, rt, now, deadline_ms);
        job.after = after;
        job.answer = answer;
        self.queue(host, job);
        None
    }

    /// One structured line per request whose outcome is unknown (forwarded, no answer): exactly
    /// the requests a reconciliation job must check. JSON after the `idem: unknown_outcome ` tag,
    /// with the store key an operator releases or resolves (`idem-admin`) once the business
    /// effect is checked.
    fn report_unknown(&self, host: &dyn Host, route: RouteId, ticket: &StoreTicket, key: Option<&str>, cause: &str) {
        let now = host.now_ms();
        let hold = self.engine.policy(route).key.unknown_hold_ms();
        let (store, store_key) = ticket.operator_key();
        let first_seen_ms = ticket.first_seen_ms();
        let mut line = serde_json::Map::new();
        line.insert("route".into(), self.route_name(route).into());
        line.insert("key_prefix".into(), key.map(crate::key::truncated).into());
        line.insert("key_digest".into(), key.map(|k| crate::key::key_digest(self.route_name(route), k)).into());
        line.insert("store".into(), store.into());
        line.insert("store_key".into(), store_key.into());
        line.insert("first_seen_at".into(), crate::response::rfc3339(first_seen_ms).into());
        line.insert("held_until".into(), crate::response::rfc3339(now.saturating_add(hold)).into());
        line.insert("cause".into(), cause.into());
        let json = serde_json::Value::Object(line).to_string();
        host.log(crate::host::Level::Warn, &format!("idem: unknown_outcome {json}"));
    }

    /// An owner-checked release of a claim that may have been applied although its request no
    /// longer waits for it (a timed-out callout, a client gone while the claim was out).
    pub(super) fn release_orphan(&self, host: &dyn Host, route: RouteId, key: Option<String>, ticket: &redis::Ticket) {
        let Some(store) = self.engine.redis() else {
            return;
        };
        let now = host.now_ms();
        // Looked for until a lease from now: a claim landing later than that is not expected.
        let deadline_ms = now.saturating_add(self.engine.lock_ttl_ms(route));
        let cause = "orphaned_claim".to_string();
        let job =
            Job::new(route, key, store.release(ticket), FinishKind::ReleaseOrphan, cause, ticket, now, deadline_ms);
        self.queue(host, job);
    }

    /// A claim's reply read: a reply that says nothing (a timeout — Envoy answers it 504 —, a
    /// reset, an unreadable record) leaves a `SET` that may still land with nobody to finish
    /// it, released here if it does.
    pub(super) fn unless_unanswered(
        &self,
        host: &dyn Host,
        route: RouteId,
        key: Option<&str>,
        found: Result<Claim<StoreTicket>, Unanswered>,
    ) -> Result<Claim<StoreTicket>, StoreError> {
        found.map_err(|Unanswered { error, ticket }| {
            self.release_orphan(host, route, key.map(str::to_string), &ticket);
            error
        })
    }

    /// Queues the Webdis call of what a lookup's answer writes, fenced by the lookup's ticket:
    /// the answer as the key's (it ran; kept in the answer cache too once written), or the
    /// unknown outcome given back without the lookup's lease (nothing settled, or the request
    /// left). `after` is carried out once the first attempt is answered, so the client's next
    /// repeat finds the write.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue_lookup_call(
        &self,
        host: &dyn Host,
        route: RouteId,
        key: Option<String>,
        lookup: &StoreTicket,
        write: &Write,
        call: Call,
        after: After,
    ) {
        let StoreTicket::Redis(t) = lookup else {
            return;
        };
        let now = host.now_ms();
        let (cause, answer) = match write {
            Write::LookupRan { response, .. } => {
                ("lookup_ran", Some((response.status, (!call.tombstone).then(|| response.clone()))))
            }
            _ => ("lookup_given_back", None),
        };
        let deadline_ms = now.saturating_add(self.engine.lock_ttl_ms(route));
        let mut job = Job::new(route, key, call.cmd, FinishKind::Lookup, cause.into(), t, now, deadline_ms);
        job.after = after;
        job.answer = answer;
        self.queue(host, job);
    }

    /// Gives a lookup up (it settled nothing, or its request left), fenced by its ticket, so the
    /// next repeat may ask: at once, or through a queued write.
    pub(super) fn give_back_lookup(&self, host: &dyn Host, route: RouteId, key: Option<String>, lookup: &StoreTicket) {
        let write = Write::LookupGivenBack;
        let lease = self.engine.lock_ttl_ms(route);
        if let Step::Call(call) = self.engine.store(route).write(host, lookup, &write, lease, host.now_ms()) {
            self.queue_lookup_call(host, route, key, lookup, &write, call, After::Nothing);
        }
    }

    /// Queues a write for the root context, within the per-worker bounds.
    fn queue(&self, host: &dyn Host, job: Job) {
        for old in self.outbox.push(job, self.writes_out().1) {
            let cause = format!(
                "{}; pending writes over the bound ({MAX_PENDING_WRITES} or {MAX_PENDING_BYTES} bytes)",
                old.cause
            );
            self.record_finish(host, old.route, Some(Outcome::WriteDropped), old.key.as_deref(), &cause);
            self.carry_out(host, old.after);
        }
        self.wake(host);
    }

    /// Sends the writes and detached calls that are due (root context only: the callouts then
    /// belong to the root and survive the request).
    ///
    /// Group commit: while [`WRITE_CALLS_OUT`] write calls are out, due writes wait, and go out
    /// together in one call (one script over their keys, [`redis::BATCH`]) when one returns.
    /// Below that a write goes at once, alone; under load, batches grow with the load. On Redis Cluster
    /// (found when a batch is refused `CROSSSLOT`) a batch holds the keys of one slot.
    pub(super) fn send_outbox(&self, host: &dyn Host) {
        if self.writes_out().0 >= WRITE_CALLS_OUT {
            return;
        }
        let now = host.now_ms();
        let due = self.outbox.take_due(now);
        // At most MAX_BATCH_WRITES writes and MAX_BATCH_BYTES per call, per slot on a cluster; a
        // write that cannot be a step goes alone.
        let per_slot = self.batch_per_slot.get();
        for batch in batches(due, per_slot, MAX_BATCH_WRITES, MAX_BATCH_BYTES, step_key, |j| j.cmd.body.len()) {
            self.send_batch(host, batch, now);
        }
    }

    /// Sends one batch: a lone write as its own command, several as one [`redis::BATCH`] call.
    fn send_batch(&self, host: &dyn Host, mut batch: Vec<Job>, now: u64) {
        for job in &mut batch {
            job.sent_ms = now;
        }
        // A lone write goes as its own command, sent from its job (which keeps it for a retry).
        let batched;
        let cmd = match batch.as_slice() {
            [one] => Some(&one.cmd),
            many => {
                batched = self.engine.redis().and_then(|s| s.batch(&many.iter().map(|j| &j.cmd).collect::<Vec<_>>()));
                batched.as_ref()
            }
        };
        let sent = match cmd {
            Some(cmd) => self.dispatch(host, cmd),
            None => Err(StoreError::Host("writes that cannot be batched were grouped".into())),
        };
        match sent {
            Ok(token) => {
                self.call_out(token, RootCall::Writes(batch));
            }
            Err(e) => {
                for job in batch {
                    self.write_failed(host, job, e.clone(), now);
                }
            }
        }
    }

    /// The reply to a write call: one write's, or a batch's, taken apart into each write's.
    pub(super) fn batch_finished(&self, host: &dyn Host, batch: Vec<Job>, status: u16, body: &[u8]) {
        let Some(store) = self.engine.redis() else {
            return;
        };
        if batch.len() == 1 {
            for job in batch {
                self.finished(host, job, redis::reply("EVAL", status, body));
            }
            return;
        }
        match store.parse_batch(batch.len(), status, body) {
            Ok(replies) => {
                for (job, reply) in batch.into_iter().zip(replies) {
                    self.finished(host, job, reply);
                }
            }
            Err(StoreError::CrossSlot(_))
                if several_slots(batch.iter().filter_map(|j| j.cmd.step.as_ref()).map(|s| s.key.as_str())) =>
            {
                // Redis Cluster: nothing of the batch ran; from now on a batch holds one slot's keys.
                self.batching_per_slot(host);
                self.outbox.requeue_first(batch);
            }
            Err(e) => {
                let now = host.now_ms();
                for job in batch {
                    self.write_failed(host, job, e.clone(), now);
                }
            }
        }
    }

    /// The reply to one write.
    fn finished(&self, host: &dyn Host, job: Job, reply: redis::StepReply) {
        let now = host.now_ms();
        self.metrics.store_call_took(host, job.route, job.sent_ms, now);
        if matches!(job.kind, FinishKind::Release | FinishKind::ReleaseOrphan) {
            return self.release_answered(host, job, reply, now);
        }
        let applied = match reply.and_then(redis::read_update) {
            Ok(applied) => applied,
            Err(e) => return self.write_failed(host, job, e, now),
        };
        let written = if applied { Written::Applied } else { Written::NotOurs };
        let (outcome, cause) = match job.kind {
            FinishKind::Release | FinishKind::ReleaseOrphan => (None, job.cause),
            FinishKind::Restore => engine::finished(WriteKind::RestoreToken, Ok(written), job.cause),
            FinishKind::Lookup => engine::finished(WriteKind::Lookup, Ok(written), job.cause),
            FinishKind::HoldUnknown => engine::finished(WriteKind::HoldUnknown, Ok(written), job.cause),
            FinishKind::Complete { tombstone } => {
                let written = if applied && tombstone { Written::Tombstoned } else { written };
                engine::finished(WriteKind::Complete, Ok(written), job.cause)
            }
        };
        let cause = if job.attempts > 0 { format!("{cause}; after {} retries", job.attempts) } else { cause };
        self.record_finish(host, job.route, outcome, job.key.as_deref(), &cause);
        self.unmark(host, job.mark.as_ref());
        let stored = matches!(outcome, Some(Outcome::Stored | Outcome::Tombstoned))
            || (job.kind == FinishKind::Lookup && applied);
        if let (Some((status, response)), true, Some(remote)) = (&job.answer, stored, self.engine.remote()) {
            let answer = Answer {
                fingerprint: job.fingerprint,
                first_seen_ms: job.first_seen_ms,
                status: *status,
                response: response.as_ref(),
            };
            let retain = self.engine.policy(job.route).key.ttl.millis;
            remote.cache.remember(host, &job.redis_id, &answer, retain);
        }
        // The client gets its answer only now, so its next retry finds the record written.
        self.carry_out(host, job.after);
    }

    /// The reply to a release. An orphaned claim that is not there (yet) is looked for again
    /// until `lock_ttl` has passed: the `SET` of a callout that timed out may land after the
    /// first release, and would otherwise lock the key for its whole lease.
    fn release_answered(&self, host: &dyn Host, mut job: Job, reply: redis::StepReply, now: u64) {
        let released = match reply.and_then(redis::read_release) {
            Ok(r) => r,
            Err(e) => return self.write_failed(host, job, e, now),
        };
        let (outcome, cause) = match (job.kind, released) {
            (FinishKind::ReleaseOrphan, Released::Absent) if now < job.deadline_ms => {
                let gap = backoff_ms(job.attempts, ORPHAN_RECHECK_MAX_MS);
                job.attempts += 1;
                job.next_at_ms = now.saturating_add(gap);
                self.outbox.retry(job);
                return;
            }
            (FinishKind::ReleaseOrphan, Released::Deleted) => (Some(Outcome::OrphanReleased), job.cause),
            (FinishKind::ReleaseOrphan, _) => (None, job.cause),
            // Absent: the lease ran out and nobody took the key; it is free all the same.
            (_, Released::Deleted | Released::Absent) => {
                engine::finished(WriteKind::Release, Ok(Written::Applied), job.cause)
            }
            (_, Released::NotOurs) => engine::finished(WriteKind::Release, Ok(Written::NotOurs), job.cause),
        };
        self.record_finish(host, job.route, outcome, job.key.as_deref(), &cause);
        self.carry_out(host, job.after);
    }

    /// A write the store refused or did not answer: retried with backoff until its deadline.
    /// The client is not kept waiting meanwhile (its answer goes out after the first attempt);
    /// a retry from it finds the key marked unwritten in this process and gets 409.
    fn write_failed(&self, host: &dyn Host, mut job: Job, e: StoreError, now: u64) {
        let after = std::mem::replace(&mut job.after, After::Nothing);
        self.carry_out(host, after);
        if now >= job.deadline_ms {
            let cause = format!("{}; gave up after {} attempts: {e}", job.cause, job.attempts + 1);
            self.unmark(host, job.mark.as_ref());
            return self.record_finish(host, job.route, Some(Outcome::StoreError), job.key.as_deref(), &cause);
        }
        if job.mark.is_none() && matches!(job.kind, FinishKind::Complete { .. } | FinishKind::HoldUnknown) {
            job.mark = self.engine.remote().and_then(|r| r.cache.mark_unwritten(host, &job.redis_id, job.deadline_ms));
        }
        let backoff = backoff_ms(job.attempts, RETRY_MAX_MS);
        job.attempts += 1;
        job.next_at_ms = now.saturating_add(backoff);
        let cause = format!("{}; attempt {} refused ({e}); retrying in {backoff} ms", job.cause, job.attempts);
        self.record_finish(host, job.route, Some(Outcome::WriteRetried), job.key.as_deref(), &cause);
        self.outbox.retry(job);
    }

    /// The write's key is no longer marked unwritten in the answer cache.
    fn unmark(&self, host: &dyn Host, mark: Option<&shared::Ticket>) {
        if let (Some(mark), Some(remote)) = (mark, self.engine.remote()) {
            remote.cache.unmark(host, mark);
        }
    }

    /// Carries out the client side of a finish (root context only).
    pub(super) fn carry_out(&self, host: &dyn Host, after: After) {
        match after {
            After::Nothing => {}
            After::Resume(ctx) => {
                self.held_responses.release(ctx);
                self.on_stream(host, ctx, || {
                    let _ = host.resume_response();
                });
            }
            // Not when the client left: its retry will find the stored answer instead.
            After::Deliver { ctx, route, reply, grpc } => self.on_stream(host, ctx, || {
                if self.answer(host, ctx, route, reply, grpc) == Answered::ToEcho {
                    self.release(host, ctx);
                }
            }),
        }
    }
}

/// The wait before attempt `attempts + 1`: [`RETRY_FIRST_MS`], doubling, at most `cap_ms`.
fn backoff_ms(attempts: u32, cap_ms: u64) -> u64 {
    RETRY_FIRST_MS.saturating_mul(1 << attempts.min(5)).min(cap_ms)
}

/// The key a write touches as a step of a batch (`None`: it cannot be one, and goes alone).
fn step_key(job: &Job) -> Option<&str> {
    job.cmd.step.as_ref().map(|s| s.key.as_str())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic)]
    use super::*;

    fn job(n: u64, bytes: usize) -> Job {
        let bundle = crate::policy::parse_bundle("[[route]]\nname = \"r\"\nmatch = { path = \"/r\" }\n", "t");
        let Some(route) = bundle.ok().and_then(|b| b.route_ids().next()) else {
            panic!("a bundle of one route");
        };
        let cmd = redis::Command { name: "EVAL", body: "x".repeat(bytes), step: None };
        let ticket = redis::Ticket { key: "k".into(), record: "r".into(), first_seen_ms: n };
        Job::new(route, None, cmd, FinishKind::Release, format!("j{n}"), &ticket, n, n + 1000)
    }

    fn causes(jobs: &[Job]) -> Vec<&str> {
        jobs.iter().map(|j| j.cause.as_str()).collect()
    }

    #[test]
    fn past_its_bounds_the_outbox_drops_its_oldest_writes() {
        let outbox = Outbox::default();
        for n in 0..MAX_PENDING_WRITES as u64 {
            assert!(outbox.push(job(n, 10), 0).is_empty(), "within the bound");
        }
        assert_eq!(causes(&outbox.push(job(5000, 10), 0)), vec!["j0"], "one over: the oldest goes");
        assert_eq!(causes(&outbox.push(job(5001, 10), 2)), vec!["j1", "j2", "j3"], "writes in flight count");
        let dropped = outbox.push(job(5002, MAX_PENDING_BYTES), 0);
        assert_eq!(dropped.len(), MAX_PENDING_WRITES - 2, "over the bytes: all the older ones go");
        assert_eq!(causes(&outbox.take_due(u64::MAX)), vec!["j5002"]);
    }

    #[test]
    fn only_due_writes_leave_and_a_refused_batch_goes_first_again() {
        let outbox = Outbox::default();
        for n in [30, 10, 20] {
            outbox.push(job(n, 1), 0);
        }
        assert_eq!(causes(&outbox.take_due(20)), vec!["j10", "j20"], "due ones, in queue order");
        outbox.requeue_first(vec![job(1, 1), job(2, 1)]);
        assert_eq!(causes(&outbox.take_due(u64::MAX)), vec!["j1", "j2", "j30"]);
    }
}
