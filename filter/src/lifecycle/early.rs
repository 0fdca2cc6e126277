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
//! for a first body chunk, which proves delivery. So does the answer of a request whose chunks
//! were held while its decision was out (a Webdis call, a lookup): held chunks past Envoy's
//! buffer limit make it stop reading from the client (its watermark), so no further chunk may
//! come — over HTTP/1.1 a 2 MiB upload stalled and its 409 went only after [`PARK_MS`]. A chunk
//! that does come proves Envoy still reads, and the answer waits for the request's end.

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
    /// Streams that held a body chunk while their decision was out (see the module doc).
    held: RefCell<Set<u32>>,
}

struct Parked {
    reply: LocalReply,
    since_ms: u64,
    /// Sent from the root's tick at this time if the request has not ended by then.
    due_ms: u64,
    dropped: usize,
}

impl Early {
    /// The client of stream `ctx` is still sending its request (or no longer is).
    pub(super) fn set_uploading(&self, ctx: u32, uploading: bool) {
        let mut set = self.uploading.borrow_mut();
        if uploading {
            set.insert(ctx);
        } else {
            set.remove(&ctx);
        }
    }

    fn uploading(&self, ctx: u32) -> bool {
        self.uploading.borrow().contains(&ctx)
    }

    /// Stream `ctx` held a body chunk while its decision was out.
    pub(super) fn held(&self, ctx: u32) {
        self.held.borrow_mut().insert(ctx);
    }

    /// Parks `reply` until the request of `ctx` ends, or until `wait_ms` from `now` at the most.
    fn park(&self, ctx: u32, reply: LocalReply, now: u64, wait_ms: u64) {
        let parked = Parked { reply, since_ms: now, due_ms: now.saturating_add(wait_ms), dropped: 0 };
        self.parked.borrow_mut().insert(ctx, parked);
    }

    /// A body chunk of `size` bytes (or the request's end) for a stream whose answer is parked:
    /// `None` when none is; else the answer to send now (the request ended, or more than
    /// [`DISCARD_LIMIT`] bytes were dropped), if it is time. A chunk proves Envoy delivers
    /// bodies: the answer may wait the whole [`PARK_MS`] from now on.
    fn chunk(&self, ctx: u32, size: usize, end_of_stream: bool) -> Option<Option<LocalReply>> {
        let mut parked = self.parked.borrow_mut();
        let p = parked.get_mut(&ctx)?;
        p.due_ms = p.since_ms.saturating_add(PARK_MS);
        p.dropped = p.dropped.saturating_add(size);
        if end_of_stream || p.dropped > DISCARD_LIMIT {
            return Some(parked.remove(&ctx).map(|p| p.reply));
        }
        Some(None)
    }

    /// Whether an answer is parked for stream `ctx`.
    pub(super) fn is_parked(&self, ctx: u32) -> bool {
        self.parked.borrow().contains_key(&ctx)
    }

    /// The answers whose request did not end by `now`, taken out.
    fn overdue(&self, now: u64) -> Vec<(u32, LocalReply)> {
        let mut parked = self.parked.borrow_mut();
        let due: Vec<u32> = parked.iter().filter(|(_, p)| now >= p.due_ms).map(|(c, _)| *c).collect();
        due.into_iter().filter_map(|c| parked.remove(&c).map(|p| (c, p.reply))).collect()
    }

    /// A stream ended: nothing is parked for it any more.
    pub(super) fn forget(&self, ctx: u32) {
        self.uploading.borrow_mut().remove(&ctx);
        self.parked.borrow_mut().remove(&ctx);
        self.held.borrow_mut().remove(&ctx);
    }
}

impl Worker {
    /// Sends `reply` on stream `ctx` (current now), or parks it until the request ends.
    pub(super) fn send_when_read(&self, host: &dyn Host, ctx: u32, reply: LocalReply) {
        let wait_ms = match self.body_gate.delivery() {
            _ if !self.early.uploading(ctx) => return self.reply(host, ctx, reply),
            BodyDelivery::Withheld => return self.reply(host, ctx, reply),
            _ if self.early.held.borrow().contains(&ctx) => UNPROVEN_PARK_MS,
            BodyDelivery::Delivered => PARK_MS,
            BodyDelivery::Unknown => UNPROVEN_PARK_MS,
        };
        if self.answered_later(host, ctx) {
            self.early.park(ctx, reply, host.now_ms(), wait_ms);
        }
    }

    /// A request body chunk (or the trailers: `end_of_stream`) of a stream whose answer is
    /// parked: dropped, and the answer sent at the request's end. `None`: no answer is parked.
    pub(super) fn parked_chunk(&self, host: &dyn Host, ctx: u32, size: usize, end_of_stream: bool) -> Option<Flow> {
        let now = self.early.chunk(ctx, size, end_of_stream)?;
        // A chunk while the headers are paused: Envoy delivers bodies, so the end will come.
        self.body_gate.delivered();
        if let Some(reply) = now {
            send(host, reply);
        }
        Some(Flow::Discard)
    }

    /// On the root's tick: answers whose request did not end in time go now.
    pub(super) fn send_overdue_answers(&self, host: &dyn Host) {
        for (ctx, reply) in self.early.overdue(host.now_ms()) {
            self.on_stream(host, ctx, || send(host, reply));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parked_answer_goes_at_the_requests_end_past_the_discard_limit_or_when_overdue() {
        let early = Early::default();
        let reply = || LocalReply { status: 409, ..LocalReply::default() };
        early.park(1, reply(), 0, UNPROVEN_PARK_MS);
        assert_eq!(early.chunk(2, 10, false), None, "nothing parked for 2");
        assert_eq!(early.chunk(1, 10, false), Some(None), "dropped; the answer waits for the end");
        assert!(early.overdue(UNPROVEN_PARK_MS).is_empty(), "a chunk proved delivery: it may wait PARK_MS");
        assert_eq!(early.chunk(1, 5, true).flatten().map(|r| r.status), Some(409), "the request ended");
        assert!(!early.is_parked(1));

        early.park(3, reply(), 0, UNPROVEN_PARK_MS);
        assert!(early.overdue(UNPROVEN_PARK_MS - 1).is_empty());
        assert_eq!(early.overdue(UNPROVEN_PARK_MS).iter().map(|(c, _)| *c).collect::<Vec<_>>(), vec![3]);

        early.park(4, reply(), 0, PARK_MS);
        assert!(early.chunk(4, DISCARD_LIMIT + 1, false).flatten().is_some(), "past the discard limit: sent");
    }
}
