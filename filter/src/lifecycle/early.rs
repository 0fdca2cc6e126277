//! Answers decided before the request has ended wait for its end.
//!
//! A replay, a 409 or a 422 is often known from the headers while the client is still sending
//! the body. Sent at once, the answer is lost by common clients: over HTTP/2 Envoy ends the
//! stream with `RST_STREAM(NO_ERROR)` after it, which curl (error 92), Guzzle and httpx report as
//! a failure; over HTTP/1.1 Envoy closes the connection under the unread body. So while the
//! client uploads, the answer is parked: the rest of the body is read and dropped (nothing is
//! kept: `Flow::Discard`), and the answer goes when the request ends. Bounded: past
//! [`DISCARD_LIMIT`] bytes or [`PARK_MS`] of waiting (the root's tick) it goes anyway — a
//! client sending more than that for a request already answered is not waited for.
//!
//! Only where Envoy passes the body to a paused request (`allow_on_headers_stop_iteration`);
//! where it withholds it, nothing would tell us the request ended, and the answer goes at once.
//! Before a worker knows which (see `body_gate`), an answer waits [`UNPROVEN_PARK_MS`] at most
//! for a first body chunk, which proves delivery.

use super::body_gate::BodyDelivery;
use super::worker::{send, Worker};
use super::{Flow, Map, Set};
use crate::host::Host;
use crate::response::LocalReply;
use std::cell::RefCell;

/// The most body bytes read and dropped for a request already answered.
pub const DISCARD_LIMIT: usize = 16 << 20;
/// The longest an answer waits for its request's end.
pub const PARK_MS: u64 = 10_000;
/// The longest it waits while no body chunk has proven that Envoy delivers bodies to paused
/// requests (without the flag a body never comes, and the client would wait for nothing).
pub const UNPROVEN_PARK_MS: u64 = 200;

/// Streams whose request has not ended, and answers waiting for it: this concern's state.
#[derive(Default)]
pub(super) struct Early {
    /// Streams whose client is still sending (headers seen without `end_of_stream`, no body end
    /// or trailers yet).
    uploading: RefCell<Set<u32>>,
    /// Answers waiting for their request's end.
    parked: RefCell<Map<u32, Parked>>,
}

struct Parked {
    reply: LocalReply,
    since_ms: u64,
    /// Sent from the root's tick at this time if the request has not ended by then.
    due_ms: u64,
    dropped: usize,
}

impl Worker {
    /// The client of stream `ctx` is still sending its request (or no longer is).
    pub(super) fn set_uploading(&self, ctx: u32, uploading: bool) {
        let mut set = self.early.uploading.borrow_mut();
        if uploading {
            set.insert(ctx);
        } else {
            set.remove(&ctx);
        }
    }

    /// Sends `reply` on stream `ctx` (current now), or parks it until the request ends.
    pub(super) fn send_when_read(&self, host: &dyn Host, ctx: u32, reply: LocalReply) {
        let wait = match self.body_delivery() {
            _ if !self.early.uploading.borrow().contains(&ctx) => return send(host, &reply),
            BodyDelivery::Withheld => return send(host, &reply),
            BodyDelivery::Delivered => PARK_MS,
            BodyDelivery::Unknown => UNPROVEN_PARK_MS,
        };
        let now = host.now_ms();
        let parked = Parked { reply, since_ms: now, due_ms: now.saturating_add(wait), dropped: 0 };
        self.early.parked.borrow_mut().insert(ctx, parked);
    }

    /// A request body chunk (or the trailers: `end_of_stream`) of a stream whose answer is
    /// parked: dropped, and the answer sent at the request's end. `None`: no answer is parked.
    pub(super) fn parked_chunk(&self, host: &dyn Host, ctx: u32, size: usize, end_of_stream: bool) -> Option<Flow> {
        let mut parked = self.early.parked.borrow_mut();
        let p = parked.get_mut(&ctx)?;
        // A chunk while the headers are paused: Envoy delivers bodies, so the end will come.
        p.due_ms = p.since_ms.saturating_add(PARK_MS);
        self.body_delivered();
        p.dropped = p.dropped.saturating_add(size);
        if end_of_stream || p.dropped > DISCARD_LIMIT {
            if let Some(p) = parked.remove(&ctx) {
                drop(parked);
                send(host, &p.reply);
            }
        }
        Some(Flow::Discard)
    }

    /// Whether an answer is parked for stream `ctx`.
    pub(super) fn is_parked(&self, ctx: u32) -> bool {
        self.early.parked.borrow().contains_key(&ctx)
    }

    /// On the root's tick: answers whose request did not end in time go now.
    pub(super) fn send_overdue_answers(&self, host: &dyn Host) {
        let now = host.now_ms();
        let overdue: Vec<u32> = {
            let parked = self.early.parked.borrow();
            parked.iter().filter(|(_, p)| now >= p.due_ms).map(|(c, _)| *c).collect()
        };
        for ctx in overdue {
            let Some(p) = self.early.parked.borrow_mut().remove(&ctx) else {
                continue;
            };
            self.on_stream(host, ctx, || send(host, &p.reply));
        }
    }

    /// A stream ended: nothing is parked for it any more.
    pub(super) fn forget_early(&self, ctx: u32) {
        self.early.uploading.borrow_mut().remove(&ctx);
        self.early.parked.borrow_mut().remove(&ctx);
    }
}
