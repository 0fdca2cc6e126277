//! Paused streams the root context decides for (a held duplicate, a batched claim): it carries
//! out the verdict on the stream — forwarded, sent detached, or answered — and leaves what it did
//! for the stream to pick up in its next callback.

use super::detached::{Detached, Outbound};
use super::leases::LeaseOwner;
use super::replay::Answered;
use super::worker::Worker;
use super::Map;
use crate::engine::{Action, Ticket, Verdict};
use crate::host::Host;
use crate::policy::RouteId;
use std::cell::RefCell;

/// What the root context did with a paused stream (a held duplicate, a batched claim): the
/// stream's next callback picks it up and goes on from there — its body chunks, still arriving,
/// then go upstream (or are dropped under a parked answer) instead of staying paused.
pub(super) enum Resumed {
    /// Forwarded with this ticket (and key): its answer is to be captured.
    Forwarded(Ticket, String),
    /// Forwarded without a ticket (nothing to finish), or on to the echo listener.
    Passed,
    /// Answered (or the answer parked until the request ends).
    Answered,
}

/// What the root did with each paused stream, until the stream picks it up: this concern's state.
#[derive(Default)]
pub(super) struct Handoffs {
    resumed: RefCell<Map<u32, Resumed>>,
}

impl Handoffs {
    fn hand_off(&self, ctx: u32, resumed: Resumed) {
        self.resumed.borrow_mut().insert(ctx, resumed);
    }

    /// What the root did with a paused stream, if anything, for the stream to pick up.
    pub(super) fn take(&self, ctx: u32) -> Option<Resumed> {
        self.resumed.borrow_mut().remove(&ctx)
    }

    /// The stream ended: nothing is handed to it.
    pub(super) fn forget(&self, ctx: u32) {
        self.resumed.borrow_mut().remove(&ctx);
    }
}

impl Worker {
    /// Carries out a paused stream's verdict from the root context (a held duplicate's, a
    /// batched claim's): forwarded with its ticket handed over (its lease renewed from now),
    /// sent by the root on a detached route, or answered.
    pub(super) fn act_from_root(
        &self,
        host: &dyn Host,
        ctx: u32,
        route: RouteId,
        v: Verdict,
        outbound: Option<Outbound>,
        grpc: bool,
    ) {
        self.on_stream(host, ctx, || {
            self.annotate(host, route, &v);
            match (v.action, outbound) {
                // A detached route's waiter won the key: the root sends it, as it sent the first.
                (Action::Forward(Some(ticket)), Some(request)) => {
                    let first_seen_ms = ticket.first_seen_ms();
                    self.detach(host, Detached { ctx, route, ticket, key: v.key, request, first_seen_ms });
                }
                (Action::Forward(ticket), _) => {
                    let resumed = match ticket {
                        Some(t) => {
                            // Renewed while the upstream works, not only once its answer begins.
                            self.hold_lease(host, LeaseOwner::Stream(ctx), route, &t);
                            Resumed::Forwarded(t, v.key.unwrap_or_default())
                        }
                        None => Resumed::Passed,
                    };
                    self.handoffs.hand_off(ctx, resumed);
                    self.release(host, ctx);
                }
                // The root never looks an unknown outcome up (a held request found it): 409.
                (Action::Reply(r) | Action::Reconcile { unknown: r, .. }, _) => {
                    let resumed = match self.answer(host, ctx, route, r, grpc) {
                        Answered::ToEcho => {
                            self.release(host, ctx);
                            Resumed::Passed
                        }
                        Answered::Replied => Resumed::Answered,
                    };
                    self.handoffs.hand_off(ctx, resumed);
                }
                (Action::Wait { .. }, _) => {}
            }
        });
    }
}
