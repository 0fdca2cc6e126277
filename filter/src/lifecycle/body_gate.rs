//! Does Envoy hand us the request body while the headers are paused?
//!
//! Only with `allow_on_headers_stop_iteration: true` in the Wasm filter's config. Without it
//! (Istio's WasmPlugin, Envoy Gateway), pausing at the headers becomes
//! `StopAllIterationAndWatermark`: Envoy buffers the body and never calls `on_request_body`
//! until the filter resumes — and resuming would send the headers upstream before the decision.
//! A route that needs the body (body key, body fingerprint, detached forwarding) would hang
//! until the client gave up.
//!
//! The filter cannot read that flag, so it watches: a stream paused at its headers for the
//! body is registered here. A body callback proves delivery (and ends the watching for good).
//! When Envoy has received body bytes for a registered stream (`request.total_size` grew)
//! and no body callback came, the body is being withheld: every waiting stream is answered
//! `500 IDEMPOTENCY_MISCONFIGURED` from the root's tick, the worker logs once what to change,
//! and later such requests are answered at their headers. Routes that decide at the headers
//! (header or query key, no body fingerprint, token mode) never pause for the body and work
//! either way.

use super::worker::Worker;
use super::{Map, Set};
use crate::engine::Action;
use crate::host::{Host, Level};
use crate::policy::RouteId;
use std::cell::{Cell, RefCell};

/// What this worker has seen of body delivery during paused headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BodyDelivery {
    /// No body-needing request has shown it yet.
    #[default]
    Unknown,
    /// A body callback arrived while the headers were paused: the flag is on.
    Delivered,
    /// Body bytes reached Envoy and no body callback came: the flag is off.
    Withheld,
}

/// What one worker has learnt about body delivery, and the streams it watches.
#[derive(Default)]
pub(super) struct BodyGate {
    delivery: Cell<BodyDelivery>,
    /// Streams paused at their headers for a body not seen yet.
    awaiting: RefCell<Map<u32, AwaitingBody>>,
    /// Streams let through unexamined because their body was withheld (shadow mode).
    passthrough: RefCell<Set<u32>>,
}

/// A stream paused at its headers for the body: its route and `request.total_size` then.
#[derive(Debug, Clone, Copy)]
pub(super) struct AwaitingBody {
    route: RouteId,
    size_at_headers: u64,
}

/// How often the root looks for withheld bodies while a stream waits for one.
pub const BODY_CHECK_MS: u64 = 50;

/// `request.total_size` (headers plus body bytes received so far), an int64 in host byte order.
fn total_size(host: &dyn Host) -> Option<u64> {
    let bytes = host.property(&["request", "total_size"])?;
    let raw: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    u64::try_from(i64::from_le_bytes(raw)).ok()
}

impl BodyGate {
    /// What is known about body delivery.
    pub(super) fn delivery(&self) -> BodyDelivery {
        self.delivery.get()
    }

    /// A stream pauses at its headers to read the body (`size_at_headers`: what Envoy has
    /// received of it then), watched while delivery is unknown.
    fn watch(&self, context: u32, route: RouteId, size_at_headers: u64) {
        if self.delivery.get() == BodyDelivery::Unknown {
            self.awaiting.borrow_mut().insert(context, AwaitingBody { route, size_at_headers });
        }
    }

    /// A body callback arrived for a stream paused at its headers: delivery is proven, and
    /// nothing is watched any more (streams are registered only while it is unknown).
    pub(super) fn delivered(&self) {
        if self.delivery.get() == BodyDelivery::Unknown {
            self.delivery.set(BodyDelivery::Delivered);
            self.awaiting.borrow_mut().clear();
        }
    }

    /// The stream ended.
    pub(super) fn forget(&self, context: u32) {
        if self.delivery.get() != BodyDelivery::Delivered {
            self.awaiting.borrow_mut().remove(&context);
            self.passthrough.borrow_mut().remove(&context);
        }
    }

    /// The streams watched now.
    fn watched(&self) -> Vec<(u32, AwaitingBody)> {
        self.awaiting.borrow().iter().map(|(c, a)| (*c, *a)).collect()
    }

    /// Envoy was seen to withhold bodies: nothing is watched any more.
    fn withheld(&self) {
        self.delivery.set(BodyDelivery::Withheld);
        self.awaiting.borrow_mut().clear();
    }

    /// A stream let through unexamined (shadow mode, body withheld).
    fn pass_through(&self, context: u32) {
        self.passthrough.borrow_mut().insert(context);
    }

    /// Whether a stream was let through unexamined; clears it.
    pub(super) fn take_passthrough(&self, context: u32) -> bool {
        self.delivery.get() == BodyDelivery::Withheld && self.passthrough.borrow_mut().remove(&context)
    }
}

impl Worker {
    /// A stream pauses at its headers to read the body.
    pub(super) fn await_body(&self, host: &dyn Host, context: u32, route: RouteId) {
        if self.body_gate.delivery() == BodyDelivery::Unknown {
            self.body_gate.watch(context, route, total_size(host).unwrap_or(0));
        }
    }

    /// On the root's tick: has Envoy received body bytes for a waiting stream without calling
    /// its body callback? Then answer every waiting stream.
    pub(super) fn check_body_delivery(&self, host: &dyn Host) {
        let waiting = self.body_gate.watched();
        if waiting.is_empty() {
            return;
        }
        let received = |&(ctx, wait): &(u32, AwaitingBody)| {
            let mut grew = false;
            self.on_stream(host, ctx, || grew = total_size(host).is_some_and(|now| now > wait.size_at_headers));
            grew
        };
        if !waiting.iter().any(received) {
            return;
        }
        self.body_gate.withheld();
        host.log(Level::Error, WITHHELD_LOG);
        for (ctx, wait) in waiting {
            self.answer_withheld(host, ctx, wait.route);
        }
    }

    /// Answers a stream whose body Envoy withholds (from the root context).
    fn answer_withheld(&self, host: &dyn Host, ctx: u32, route: RouteId) {
        let v = self.engine.body_withheld(route);
        self.record(host, route, &v);
        self.on_stream(host, ctx, || {
            self.annotate(host, route, &v);
            match &v.action {
                Action::Reply(r) => {
                    let mut r = r.clone();
                    self.mark_repeatability(route, &mut r);
                    self.reply(host, ctx, r)
                }
                // Shadow mode never blocks: let it through unexamined.
                _ => {
                    self.body_gate.pass_through(ctx);
                    self.release(host, ctx);
                }
            }
        });
    }
}

/// Logged once per worker when Envoy is found to withhold the body.
pub const WITHHELD_LOG: &str =
    "idem: misconfigured: Envoy does not pass the request body to the filter while it holds \
the headers, so routes that need the body (key from the body, fingerprint with \"body\", forward = \"detached\") \
answer 500 IDEMPOTENCY_MISCONFIGURED. Set `allow_on_headers_stop_iteration: true` in the Wasm filter's config \
(Istio: the EnvoyFilter patch in examples/istio/; Envoy Gateway: the EnvoyPatchPolicy in examples/envoy-gateway/), \
or key and fingerprint these routes without the body (docs/deploy.md: \"Deploy on Istio / Envoy Gateway / Higress\").";
