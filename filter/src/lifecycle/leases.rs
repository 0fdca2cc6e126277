//! Lease renewal: while a request waits for the upstream, the root context renews its claim's
//! lease every third of `lock_ttl`, so a slow request is never taken over while its gateway
//! lives. Only a gateway that died (or froze) stops renewing — the one way left to a second
//! execution.

use super::worker::{RootCall, Worker};
use super::Map;
use crate::engine::{StoreTicket, Ticket};
use crate::host::Host;
use crate::policy::RouteId;
use crate::store::{Step, StoreError};
use std::cell::RefCell;

/// Who holds a forwarded claim: a request's own stream, or the root's detached call for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum LeaseOwner {
    Stream(u32),
    Detached(u32),
}

/// The leases the root renews, by who holds them: this concern's state.
#[derive(Default)]
pub(super) struct Leases {
    held: RefCell<Map<LeaseOwner, Lease>>,
}

pub(super) struct Lease {
    route: RouteId,
    ticket: StoreTicket,
    renew_at_ms: u64,
}

impl Leases {
    /// Renews `ticket` for `owner` from `renew_at_ms` on.
    pub(super) fn hold(&self, owner: LeaseOwner, route: RouteId, ticket: StoreTicket, renew_at_ms: u64) {
        self.held.borrow_mut().insert(owner, Lease { route, ticket, renew_at_ms });
    }

    /// Renews nothing for `owner` any more (its request finished, or the claim is not ours).
    pub(super) fn forget(&self, owner: LeaseOwner) {
        self.held.borrow_mut().remove(&owner);
    }

    /// The leases due at `now`, each next due `every_ms(route)` later.
    pub(super) fn due(&self, now: u64, every_ms: impl Fn(RouteId) -> u64) -> Vec<(LeaseOwner, RouteId, StoreTicket)> {
        let mut held = self.held.borrow_mut();
        let due = held.iter_mut().filter(|(_, l)| l.renew_at_ms <= now);
        due.map(|(owner, l)| {
            l.renew_at_ms = now.saturating_add(every_ms(l.route));
            (*owner, l.route, l.ticket.clone())
        })
        .collect()
    }
}

impl Worker {
    /// Starts renewing a forwarded claim's lease (key claims only; tokens have no lease).
    pub(super) fn hold_lease(&self, host: &dyn Host, owner: LeaseOwner, route: RouteId, ticket: &Ticket) {
        if let Ticket::Claim(st) = ticket {
            let renew_at_ms = host.now_ms().saturating_add(self.renew_every(route));
            self.leases.hold(owner, route, st.clone(), renew_at_ms);
        }
    }

    fn renew_every(&self, route: RouteId) -> u64 {
        (self.engine.policy(route).key.lock_ttl.millis / 3).max(1)
    }

    /// Renews the leases that are due through their route's store (root context, on its tick).
    pub(super) fn renew_leases(&self, host: &dyn Host) {
        for (owner, route, ticket) in self.leases.due(host.now_ms(), |r| self.renew_every(r)) {
            let lease = self.engine.policy(route).key.lock_ttl.millis;
            match self.engine.store(route).renew(host, &ticket, lease) {
                Step::Now(renewed) => self.renewed(owner, renewed),
                Step::Call(call) => {
                    if let Ok(token) = self.dispatch(host, &call.cmd) {
                        self.call_out(token, RootCall::Renewal(owner));
                    }
                }
            }
        }
    }

    /// A renewal's answer (at once, or its Webdis call's reply read by the root): a lease that
    /// is no longer ours — taken over meanwhile — is not renewed again. A renewal that failed
    /// is tried again at the next due time.
    pub(super) fn renewed(&self, owner: LeaseOwner, renewed: Result<bool, StoreError>) {
        if let Ok(false) = renewed {
            self.leases.forget(owner);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic)]
    use super::*;
    use crate::store::redis;

    fn ticket(first_seen_ms: u64) -> StoreTicket {
        StoreTicket::Redis(redis::Ticket { key: "k".into(), record: "r".into(), first_seen_ms })
    }

    #[test]
    fn due_leases_are_rescheduled_and_forgotten_ones_never_come_back() {
        let leases = Leases::default();
        let bundle = crate::policy::parse_bundle("[[route]]\nname = \"r\"\nmatch = { path = \"/r\" }\n", "t");
        let Some(route) = bundle.ok().and_then(|b| b.route_ids().next()) else {
            panic!("a bundle of one route");
        };
        leases.hold(LeaseOwner::Stream(1), route, ticket(1), 100);
        leases.hold(LeaseOwner::Detached(2), route, ticket(2), 300);
        assert!(leases.due(99, |_| 50).is_empty(), "nothing due before its time");
        let due = leases.due(100, |_| 50);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].0, LeaseOwner::Stream(1));
        assert!(leases.due(149, |_| 50).is_empty(), "renewed at 100: next due at 150");
        assert_eq!(leases.due(150, |_| 50).len(), 1);
        leases.forget(LeaseOwner::Stream(1));
        let owners: Vec<LeaseOwner> = leases.due(1_000, |_| 50).into_iter().map(|d| d.0).collect();
        assert_eq!(owners, vec![LeaseOwner::Detached(2)]);
    }
}
