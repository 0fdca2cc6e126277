//! Group commit of Redis claims: while [`CLAIM_CALLS_OUT`] claim calls of this worker are out,
//! the next claims wait and go out together in one call when one returns ([`redis::CLAIM_BATCH`], sent by the root),
//! and the root carries out each claim's verdict on its stream, as it does for held duplicates.
//! Below that a claim goes out at once from its own stream, alone: no latency is added when
//! idle or lightly loaded, and under load a worker makes a few claim calls per Redis round trip,
//! whatever the number of requests. On Redis Cluster (a batch refused `CROSSSLOT`) a batch holds one hash
//! slot's keys, as for writes.

use super::slots::{batches, several_slots};
use super::stream::{Request, WithHost};
use super::waiters::Waiter;
use super::worker::{RootCall, Worker};
use crate::engine::{Action, Prepared, StoreTicket};
use crate::host::Host;
use crate::store::remote::Unanswered;
use crate::store::{redis, Claim, StoreError};
use std::cell::{Cell, RefCell};

/// The most claims one batch carries.
const MAX_BATCH_CLAIMS: usize = 64;
/// Claim calls a worker keeps out before the next claims wait for a batch: below it a claim
/// goes out at once, so light load (a few connections) pays no wait; above it, one call per
/// returning call carries everything that queued meanwhile.
const CLAIM_CALLS_OUT: u32 = 4;

/// One worker's claim calls out and the claims waiting for the next batch.
#[derive(Default)]
pub(super) struct Claims {
    /// Claim calls out now (a stream's own, or a root's batch).
    out: Cell<u32>,
    /// Claims waiting for the next batch, oldest first.
    queue: RefCell<Vec<QueuedClaim>>,
}

/// A claim waiting for the next batch; its stream is paused (`Phase::Held`).
pub(super) struct QueuedClaim {
    pub(super) ctx: u32,
    pub(super) prepared: Prepared,
    pub(super) ticket: redis::Ticket,
    /// The request's fingerprint, which the record found is compared with.
    pub(super) fingerprint: [u8; 32],
    /// The request, for a record written before fingerprints were xxh3: its SHA-256 decides.
    pub(super) request: Request,
    pub(super) queued_ms: u64,
}

/// Claims sent together, by the root.
pub(super) struct ClaimBatch {
    members: Vec<QueuedClaim>,
    sent_ms: u64,
}

impl Claims {
    /// Whether a claim waits for the next batch: [`CLAIM_CALLS_OUT`] claim calls are out.
    pub(super) fn calls_full(&self) -> bool {
        self.out.get() >= CLAIM_CALLS_OUT
    }

    /// A claim call went out (a stream's own, or a batch).
    pub(super) fn sent(&self) {
        self.out.set(self.out.get() + 1);
    }

    /// A claim call came back (or was cancelled with its stream): whether claims wait to go.
    pub(super) fn returned(&self) -> bool {
        self.out.set(self.out.get().saturating_sub(1));
        !self.queue.borrow().is_empty()
    }

    /// Queues a claim for the next batch.
    pub(super) fn queue(&self, claim: QueuedClaim) {
        self.queue.borrow_mut().push(claim);
    }

    /// The stream ended before its queued claim went out: it never will.
    pub(super) fn forget(&self, ctx: u32) {
        self.queue.borrow_mut().retain(|q| q.ctx != ctx);
    }

    /// The queued claims that go now, oldest first: every one, once fewer than
    /// [`CLAIM_CALLS_OUT`] claim calls are out — or once the oldest has waited `timeout_ms` (a
    /// whole callout timeout), so a call lost to the count never stalls the queue.
    pub(super) fn take_due(&self, now: u64, timeout_ms: u64) -> Vec<QueuedClaim> {
        let mut queue = self.queue.borrow_mut();
        let stale = queue.first().is_some_and(|q| q.queued_ms.saturating_add(timeout_ms) <= now);
        if self.calls_full() && !stale {
            return Vec::new();
        }
        std::mem::take(&mut *queue)
    }

    /// Claims of a batch Redis Cluster refused (`CROSSSLOT`, nothing of it ran) go first again.
    fn requeue_first(&self, members: Vec<QueuedClaim>) {
        let mut queue = self.queue.borrow_mut();
        let later = std::mem::take(&mut *queue);
        *queue = members.into_iter().chain(later).collect();
    }
}

impl Worker {
    /// A claim call came back (or was cancelled with its stream): queued claims may go.
    pub(super) fn claim_returned(&self, host: &dyn Host) {
        if self.claims.returned() {
            self.wake(host);
        }
    }

    /// Sends the queued claims (root context) once fewer than [`CLAIM_CALLS_OUT`] claim calls are
    /// out — or when the oldest has waited a whole callout timeout, so a call lost to the count
    /// never stalls the queue.
    pub(super) fn send_claims(&self, host: &dyn Host) {
        let now = host.now_ms();
        let Some(store) = self.engine.redis() else {
            return;
        };
        let queued = self.claims.take_due(now, self.engine.bundle.redis.as_ref().map_or(0, |r| r.timeout.millis));
        if queued.is_empty() {
            return;
        }
        let per_slot = self.batch_per_slot.get();
        let groups = batches(queued, per_slot, MAX_BATCH_CLAIMS, usize::MAX, |q| Some(q.ticket.key.as_str()), |_| 0);
        for members in groups {
            let claims: Vec<(&redis::Ticket, u64)> =
                members.iter().map(|q| (&q.ticket, self.engine.lock_ttl_ms(q.prepared.route))).collect();
            match self.dispatch(host, &store.claim_batch(&claims)) {
                Ok(token) => {
                    self.claims.sent();
                    self.call_out(token, RootCall::Claims(ClaimBatch { members, sent_ms: now }));
                }
                Err(e) => {
                    for q in members {
                        self.claim_unanswered(host, q, &e, now);
                    }
                }
            }
        }
    }

    /// A claim batch's reply (root context): each claim's verdict, carried out on its stream.
    pub(super) fn claims_answered(&self, host: &dyn Host, batch: ClaimBatch, status: u16, body: &[u8]) {
        self.claims.returned(); // this answer sends what waits, below
        let Some(store) = self.engine.remote() else {
            return;
        };
        match store.redis.parse_batch(batch.members.len(), status, body) {
            Ok(replies) => {
                let now = host.now_ms();
                for (q, reply) in batch.members.into_iter().zip(replies) {
                    let QueuedClaim { ctx, prepared, ticket, fingerprint, request, .. } = q;
                    let retain = self.engine.policy(prepared.route).key.ttl.millis;
                    let found = store.claim_answered(host, ticket, &fingerprint, reply, retain, now);
                    self.claim_resolved(host, ctx, prepared, request, found, batch.sent_ms);
                }
            }
            Err(StoreError::CrossSlot(_)) if several_slots(batch.members.iter().map(|q| q.ticket.key.as_str())) => {
                // Redis Cluster: nothing of the batch ran; from now on a batch holds one slot's
                // keys (batches sent before this answer came back are sent again too).
                self.batching_per_slot(host);
                self.claims.requeue_first(batch.members);
            }
            Err(e) => {
                for q in batch.members {
                    self.claim_unanswered(host, q, &e, batch.sent_ms);
                }
            }
        }
        self.send_claims(host);
    }

    /// One batched claim's answer: released when its client left or the answer is unreadable
    /// (the `SET` may have landed), else its verdict carried out on its stream.
    fn claim_resolved(
        &self,
        host: &dyn Host,
        ctx: u32,
        prepared: Prepared,
        request: Request,
        found: Result<Claim<StoreTicket>, Unanswered>,
        sent_ms: u64,
    ) {
        let route = prepared.route;
        let now = host.now_ms();
        self.metrics.store_call_took(host, route, sent_ms, now);
        let found = self.unless_unanswered(host, route, Some(&prepared.key), found);
        if !self.fates.is_live(ctx) {
            if let Ok(Claim::Claimed(StoreTicket::Redis(t))) = &found {
                self.release_orphan(host, route, Some(prepared.key.clone()), t);
            }
            return;
        }
        let view = WithHost { req: &request, host };
        let claim = found.map(|c| c.resolve_legacy(|| self.engine.legacy_fingerprint(route, &view)));
        let v = self.engine.after_claim(&prepared, claim, now, None);
        self.record(host, route, &v);
        match v.action {
            Action::Wait { prepared, deadline_ms } => {
                let waiter = Waiter::new(*prepared, deadline_ms, now, None, request.grpc);
                self.waiters.hold(ctx, waiter);
            }
            _ => self.act_from_root(host, ctx, route, v, None, request.grpc),
        }
    }

    /// A batched claim whose call got no readable answer (or was never sent): its `SET` may have
    /// landed, so it is released if it did, and its verdict is the store's error.
    fn claim_unanswered(&self, host: &dyn Host, q: QueuedClaim, e: &StoreError, sent_ms: u64) {
        let QueuedClaim { ctx, prepared, ticket, request, .. } = q;
        let found = Err(Unanswered { error: e.clone(), ticket });
        self.claim_resolved(host, ctx, prepared, request, found, sent_ms);
    }
}
