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

impl Worker {
    /// Starts renewing a forwarded claim's lease (key claims only; tokens have no lease).
    pub(super) fn hold_lease(&self, host: &dyn Host, owner: LeaseOwner, route: RouteId, ticket: &Ticket) {
        let Ticket::Claim(st) = ticket else {
            return;
        };
        let renew_at_ms = host.now_ms().saturating_add(self.renew_every(route));
        self.leases.held.borrow_mut().insert(owner, Lease { route, ticket: st.clone(), renew_at_ms });
    }

    pub(super) fn drop_lease(&self, owner: LeaseOwner) {
        self.leases.held.borrow_mut().remove(&owner);
    }

    fn renew_every(&self, route: RouteId) -> u64 {
        (self.engine.policy(route).key.lock_ttl.millis / 3).max(1)
    }

    /// Renews the leases that are due (root context, on its tick).
    pub(super) fn renew_leases(&self, host: &dyn Host) {
        let now = host.now_ms();
        let due: Vec<(LeaseOwner, RouteId, StoreTicket)> = self
            .leases
            .held
            .borrow()
            .iter()
            .filter(|(_, l)| l.renew_at_ms <= now)
            .map(|(o, l)| (*o, l.route, l.ticket.clone()))
            .collect();
        for (owner, route, ticket) in due {
            let next = now.saturating_add(self.renew_every(route));
            if let Some(l) = self.leases.held.borrow_mut().get_mut(&owner) {
                l.renew_at_ms = next;
            }
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
            self.drop_lease(owner);
        }
    }
}
