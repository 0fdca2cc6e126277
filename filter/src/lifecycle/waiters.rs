//! Held duplicates (`on_in_flight = "wait"`): the root context re-checks them on its tick until
//! the first request's answer is there, their wait times out, or the key is free again.
//!
//! Held requests for the same key and payload are re-checked as one group, through the route's
//! store: on the shared store a local read, every tick. On Redis a Webdis call, so a burst of
//! held duplicates must not become a storm of calls: one poll per group, backing off from
//! [`POLL_MS`] to [`MAX_POLL_GAP_MS`]. Between polls the store's answer cache is looked at every
//! tick: an answer written by this Envoy wakes its duplicates on the next tick without asking
//! Redis.

use super::detached::Outbound;
use super::worker::{RootCall, Worker};
use super::Map;
use super::POLL_MS;
use crate::engine::{Action, Prepared, StoreOp, StoreTicket, Verdict};
use crate::host::Host;
use crate::policy::RouteId;
use crate::store::{redis, Claim, Payload, Step, StoreError};
use std::cell::RefCell;
use std::collections::HashMap;

/// The longest gap between two Webdis polls of one group of held duplicates.
const MAX_POLL_GAP_MS: u64 = 500;

/// Held duplicates: this concern's state.
#[derive(Default)]
pub(super) struct Waiters {
    /// Held duplicates by stream context id.
    held: RefCell<Map<u32, Waiter>>,
}

/// A held duplicate.
pub(super) struct Waiter {
    pub(super) prepared: Prepared,
    pub(super) deadline_ms: u64,
    /// When it was held (for `idem_wait_time`).
    pub(super) since_ms: u64,
    /// A Webdis poll for it (its group) is on its way (Redis routes).
    pub(super) polling: bool,
    /// Webdis polls so far, and when the next may go (Redis routes).
    pub(super) polls: u32,
    pub(super) next_poll_ms: u64,
    /// On a detached route: the request, sent by the root if this waiter takes the key over.
    pub(super) outbound: Option<Outbound>,
    /// A gRPC call: answered in gRPC's form.
    pub(super) grpc: bool,
}

impl Waiter {
    pub(super) fn new(prepared: Prepared, deadline_ms: u64, now: u64, outbound: Option<Outbound>, grpc: bool) -> Self {
        // The claim that held it was the first look; the first poll follows one tick later.
        let next_poll_ms = now + POLL_MS;
        Waiter { prepared, deadline_ms, since_ms: now, polling: false, polls: 0, next_poll_ms, outbound, grpc }
    }
}

/// A Webdis poll for a group of held duplicates (same route, key and payload).
pub(super) struct Poll {
    members: Vec<u32>,
    route: RouteId,
    ticket: redis::Ticket,
    /// The group's fingerprint, which the record found is compared with.
    fingerprint: [u8; 32],
    sent_ms: u64,
}

/// The gap before the next poll of a group that polled `polls` times: doubling, capped.
fn poll_gap_ms(polls: u32) -> u64 {
    POLL_MS.saturating_mul(1 << polls.min(10)).min(MAX_POLL_GAP_MS)
}

impl Waiters {
    /// Holds a paused stream until the root decides for it.
    pub(super) fn hold(&self, ctx: u32, waiter: Waiter) {
        self.held.borrow_mut().insert(ctx, waiter);
    }

    /// A held stream ended: it waits no more.
    pub(super) fn forget(&self, ctx: u32) {
        self.held.borrow_mut().remove(&ctx);
    }

    /// The held duplicates not being polled, in groups of the same route, key and payload,
    /// oldest context first (a held request is always a key's claim: a token is used once,
    /// never held).
    fn groups(&self) -> Vec<(Group, Vec<u32>)> {
        let mut groups: HashMap<Group, Vec<u32>> = HashMap::new();
        for (ctx, w) in self.held.borrow().iter().filter(|(_, w)| !w.polling) {
            if let StoreOp::Claim { id, fingerprint } = &w.prepared.op {
                groups
                    .entry(Group { route: w.prepared.route, id: *id, fingerprint: *fingerprint })
                    .or_default()
                    .push(*ctx);
            }
        }
        let mut groups: Vec<(Group, Vec<u32>)> = groups.into_iter().collect();
        for (_, members) in &mut groups {
            // The oldest takes the key over, if it is free again.
            members.sort_unstable();
        }
        groups
    }

    /// Whether a member's next poll (or its deadline) has come.
    fn due(&self, members: &[u32], now: u64) -> bool {
        let held = self.held.borrow();
        members.iter().filter_map(|c| held.get(c)).any(|w| now >= w.next_poll_ms.min(w.deadline_ms))
    }

    /// A poll for `members` went out.
    fn polling(&self, members: &[u32]) {
        let mut held = self.held.borrow_mut();
        for ctx in members {
            if let Some(w) = held.get_mut(ctx) {
                w.polling = true;
                w.polls += 1;
            }
        }
    }

    /// The members still held, with what each asked and until when it waits.
    fn still_held(&self, members: &[u32]) -> Vec<(u32, Prepared, u64)> {
        let held = self.held.borrow();
        let live = members.iter().filter_map(|c| held.get(c).map(|w| (*c, w)));
        live.map(|(c, w)| (c, w.prepared.clone(), w.deadline_ms)).collect()
    }

    /// A member keeps waiting: its next poll after the backoff from `now`.
    fn wait_on(&self, ctx: u32, now: u64) {
        if let Some(w) = self.held.borrow_mut().get_mut(&ctx) {
            w.polling = false;
            w.next_poll_ms = now.saturating_add(poll_gap_ms(w.polls));
        }
    }

    /// A member is decided for: no longer held (`None` when its client went away meanwhile).
    fn release(&self, ctx: u32) -> Option<Waiter> {
        self.held.borrow_mut().remove(&ctx)
    }
}

/// What held duplicates are grouped by: the same route, key and payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Group {
    route: RouteId,
    id: [u8; 32],
    fingerprint: [u8; 32],
}

impl Worker {
    /// The tick's re-check of every held duplicate not being polled already, group by group.
    pub(super) fn recheck_waiters(&self, host: &dyn Host) {
        for (group, members) in self.waiters.groups() {
            self.recheck_group(host, members, group);
        }
    }

    /// One group of held duplicates: the route's store asked once for all of them — at once on
    /// the shared store and from Redis' answer cache every tick, by a Webdis poll when due.
    fn recheck_group(&self, host: &dyn Host, members: Vec<u32>, group: Group) {
        let now = host.now_ms();
        let due = self.waiters.due(&members, now);
        let Group { route, id, fingerprint } = group;
        let key = &self.engine.policy(route).key;
        let call =
            match self.engine.store(route).claim(host, &id, &fingerprint, key.lock_ttl.millis, key.ttl.millis, now) {
                // Held duplicates keep no body to take a SHA-256 fingerprint of: a record written
                // before fingerprints were xxh3 (only one in flight across the upgrade) counts as
                // different.
                Step::Now(found) => {
                    return self.group_found(host, &members, found.map(|c| c.resolve_legacy(|| None)), now)
                }
                Step::Call(call) if due => call,
                Step::Call(_) => return,
            };
        let Some(ticket) = call.ticket else {
            return;
        };
        match self.dispatch(host, &call.cmd) {
            Ok(token) => {
                self.waiters.polling(&members);
                let poll = Poll { members, route, ticket, fingerprint, sent_ms: now };
                self.call_out(token, RootCall::Poll(poll));
            }
            Err(e) => self.group_found(host, &members, Err(e), now),
        }
    }

    /// A group's poll answered: each member's verdict; with nobody left, a claim it won is
    /// released.
    pub(super) fn polled(&self, host: &dyn Host, poll: Poll, status: u16, body: &[u8]) {
        let now = host.now_ms();
        self.metrics.store_call_took(host, poll.route, poll.sent_ms, now);
        let Some(store) = self.engine.remote() else {
            return;
        };
        let first = self.waiters.still_held(&poll.members).into_iter().next();
        let Some((_, Prepared { key: first_key, .. }, _)) = first else {
            // Every held client left while the poll was out: a claim it won has nobody to finish it.
            let someone_elses = matches!(
                store.redis.parse_claim(&poll.fingerprint, status, body),
                Ok(Claim::InFlight { .. } | Claim::Completed { .. } | Claim::Unknown { .. })
            );
            if !someone_elses {
                self.release_orphan(host, poll.route, None, &poll.ticket);
                self.send_queued(host);
            }
            return;
        };
        // Polls never take a lookup (see `after_claim`): only the lease's meaning matters here.
        let retain = self.engine.policy(poll.route).key.ttl.millis;
        let reply = store.redis.claim_reply(status, body);
        let found = store.claim_answered(host, poll.ticket, &poll.fingerprint, reply, retain, now);
        let found = self.unless_unanswered(host, poll.route, Some(&first_key), found);
        self.group_found(host, &poll.members, found.map(|c| c.resolve_legacy(|| None)), now);
    }

    /// What the store found for a group of held duplicates: each member's verdict. A claim won
    /// goes to the oldest member still here; the others go on waiting, on it.
    fn group_found(&self, host: &dyn Host, members: &[u32], found: Result<Claim<StoreTicket>, StoreError>, now: u64) {
        let mut taken = false;
        for (ctx, prepared, deadline) in self.waiters.still_held(members) {
            let found = match &found {
                Ok(Claim::Claimed(_)) if taken => {
                    Ok(Claim::InFlight { first_seen_ms: now, lease_ends_ms: deadline, payload: Payload::Same })
                }
                other => other.clone(),
            };
            taken |= matches!(found, Ok(Claim::Claimed(_)));
            let v = self.engine.after_claim(&prepared, found, now, Some(deadline));
            self.resolve_waiter(host, ctx, v);
        }
    }

    /// A held request's verdict, acted on from the root context.
    fn resolve_waiter(&self, host: &dyn Host, ctx: u32, v: Verdict) {
        if let Action::Wait { .. } = &v.action {
            return self.waiters.wait_on(ctx, host.now_ms());
        }
        let Some(w) = self.waiters.release(ctx) else {
            return; // the client went away meanwhile
        };
        let route = w.prepared.route;
        self.metrics.record_wait(host, route, w.since_ms);
        self.record(host, route, &v);
        self.act_from_root(host, ctx, route, v, w.outbound, w.grpc);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polls_back_off_to_the_cap() {
        let gaps: Vec<u64> = (0..8).map(poll_gap_ms).collect();
        assert_eq!(gaps, vec![20, 40, 80, 160, 320, 500, 500, 500]);
        assert_eq!(poll_gap_ms(u32::MAX), MAX_POLL_GAP_MS);
    }
}
