//! Detached forwarding on the root context: the claimed request is sent upstream by the root,
//! so a client that leaves cannot cancel it; the answer is stored and given to the client if it
//! is still there (see [`crate::forward`] for what the option gives up).

use super::leases::LeaseOwner;
use super::worker::{RootCall, Worker};
use super::writes::After;
use crate::codes::ErrorCode;
use crate::engine::{Ending, Ticket};
use crate::host::{Host, Level};
use crate::pairs::Pair;
use crate::policy::DetachedVia;
use crate::policy::RouteId;
use std::cell::RefCell;

/// The request as the root context sends it upstream: the route's cluster, the headers it
/// may carry (see [`crate::forward::upstream_headers`]) and the body.
pub(super) struct Outbound {
    pub(super) cluster: String,
    pub(super) headers: Vec<(String, String)>,
    pub(super) body: Vec<u8>,
    /// A gRPC call: its ending is read from its `grpc-status`.
    pub(super) grpc: bool,
}

/// Detached calls waiting for the root context to send them: this concern's state.
#[derive(Default)]
pub(super) struct DetachedCalls {
    queued: RefCell<Vec<Detached>>,
}

/// A claimed request the root context sends upstream (`forward = "detached"`).
pub(super) struct Detached {
    pub(super) ctx: u32,
    pub(super) route: RouteId,
    pub(super) ticket: Ticket,
    pub(super) key: Option<String>,
    pub(super) request: Outbound,
    pub(super) first_seen_ms: u64,
}

impl DetachedCalls {
    fn queue(&self, call: Detached) {
        self.queued.borrow_mut().push(call);
    }

    /// Every queued call, oldest first, taken out.
    fn take_all(&self) -> Vec<Detached> {
        std::mem::take(&mut *self.queued.borrow_mut())
    }
}

impl Worker {
    /// Queues a detached call for the root context, and wakes it.
    pub(super) fn detach(&self, host: &dyn Host, call: Detached) {
        self.detached.queue(call);
        self.wake(host);
    }

    /// Sends queued detached upstream calls (root context).
    pub(super) fn send_detached(&self, host: &dyn Host) {
        for call in self.detached.take_all() {
            let timeout = self.engine.policy(call.route).upstream_timeout.millis;
            let Outbound { cluster, headers, body, .. } = &call.request;
            match host.dispatch(cluster, headers, body, timeout) {
                Ok(token) => {
                    self.hold_lease(host, LeaseOwner::Detached(call.ctx), call.route, &call.ticket);
                    self.call_out(token, RootCall::Detached(call));
                }
                Err(e) => {
                    let hint = match self.engine.bundle.detached.via {
                        DetachedVia::Reentry => format!(
                            "; is there a cluster {cluster} reaching the internal listener detached requests re-enter \
                             Envoy through? (docs/clients.md#detached-forwarding; or [detached] via = \"cluster\")"
                        ),
                        DetachedVia::Cluster => String::new(),
                    };
                    host.log(Level::Error, &format!("idem: detached call to cluster {cluster} not sent: {e:?}{hint}"));
                    let answers = &self.engine.policy(call.route).answers;
                    let reply = crate::replies::error(
                        answers,
                        ErrorCode::UpstreamUnavailable,
                        "the request could not be sent upstream; retry later",
                    );
                    let ending = Ending::NoResponse { forwarded: false };
                    let after = After::Deliver { ctx: call.ctx, route: call.route, reply, grpc: call.request.grpc };
                    if let Some(after) = self.finish_ticket(host, call.route, &call.ticket, call.key, ending, after) {
                        self.carry_out(host, after);
                    }
                }
            }
        }
    }

    /// A detached call's answer: store it, then give it to the client if it is still there.
    pub(super) fn detached_answered(
        &self,
        host: &dyn Host,
        call: Detached,
        status: u16,
        headers: Vec<Pair>,
        body: Vec<u8>,
    ) {
        self.leases.forget(LeaseOwner::Detached(call.ctx));
        let policy = self.engine.policy(call.route);
        let hold_until = host.now_ms().saturating_add(policy.key.unknown_hold_ms());
        let grpc = call.request.grpc;
        let trailers = if grpc { host.call_trailers() } else { Vec::new() };
        let mut reply =
            crate::forward::answer(&policy.answers, status, &headers, &body, call.first_seen_ms, hold_until);
        reply.trailers =
            trailers.iter().map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.clone())).collect();
        let ending = crate::forward::ending(status, headers, body, trailers, policy.max_response_bytes as usize, grpc);
        let after = After::Deliver { ctx: call.ctx, route: call.route, reply, grpc };
        if let Some(after) = self.finish_ticket(host, call.route, &call.ticket, call.key, ending, after) {
            self.carry_out(host, after);
        }
    }
}
