//! Answering a stream with a local reply — and, for a gRPC call, in gRPC's form: the gateway's
//! own answers as trailers-only gRPC answers, and a replayed gRPC answer (message and trailers)
//! through the echo listener, since a local reply to a gRPC call can only be trailers-only.
//!
//! The echo hop: the answer goes into a replay slot (`store::replay`), the call is pointed at
//! `[grpc] echo_path` with the slot's token and a content type that is not gRPC, and sent on;
//! a route sends that path to the echo listener, whose idem instance (`role = "echo"`) answers with
//! the slot's status, headers and body. When that answer ends, this stream adds the trailers.

use super::worker::Worker;
use crate::codes::ErrorCode;
use crate::engine::Outcome;
use crate::host::{Host, Level};
use crate::policy::GrpcReplay;
use crate::policy::RouteId;
use crate::repeatability;
use crate::response::{Header, LocalReply, StoredResponse};
use crate::store::StoreError;

/// The header that carries a replay slot's token to the echo.
pub const REPLAY_HEADER: &str = "x-idem-replay";
/// The content type of a call sent to the echo: not gRPC, so the echo's local reply is whole.
const REPLAY_CONTENT_TYPE: &[u8] = b"application/x-idem-replay";

/// What answering did to the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    /// A local reply went out.
    Replied,
    /// The call goes on to the echo: resume it (or let the callback continue).
    ToEcho,
}

/// Streams replaying a gRPC answer through the echo: the trailers each adds at its end.
#[derive(Default)]
pub(super) struct Replays {
    trailers: std::cell::RefCell<super::Map<u32, Vec<Header>>>,
}

impl Worker {
    /// `Repeatability-Result` on an answer of a route that speaks OASIS Repeatable Requests.
    pub(super) fn mark_repeatability(&self, route: RouteId, reply: &mut LocalReply) {
        let policy = self.engine.policy(route);
        if repeatability::speaks(policy) {
            repeatability::mark(policy, reply);
        }
    }

    /// Answers the current stream (its own callback, or the root acting on it) with `reply`.
    pub(super) fn answer(
        &self,
        host: &dyn Host,
        ctx: u32,
        route: RouteId,
        mut reply: LocalReply,
        grpc: bool,
    ) -> Answered {
        self.mark_repeatability(route, &mut reply);
        if !grpc {
            self.send_when_read(host, ctx, reply);
            return Answered::Replied;
        }
        if reply.own.is_some() {
            self.send_when_read(host, ctx, reply.for_grpc());
            return Answered::Replied;
        }
        // A replayed gRPC answer: whole through the echo, or the route's duplicate answer.
        if !reply.trailers.is_empty() && self.engine.bundle.grpc.replay == GrpcReplay::Echo {
            match self.to_echo(host, ctx, &reply) {
                Ok(()) => return Answered::ToEcho,
                Err(StoreError::Full) => {
                    // More replays in flight than slots: a retryable answer, never a wrong one.
                    self.count(host, route, Outcome::StoreError);
                    let message = "every gRPC replay slot of this gateway is in use; retry";
                    let busy =
                        crate::replies::error(&self.engine.policy(route).answers, ErrorCode::StoreUnavailable, message);
                    host.log(Level::Warn, "idem: gRPC replay slots full; the replay was answered UNAVAILABLE");
                    self.send_when_read(host, ctx, busy.for_grpc());
                    return Answered::Replied;
                }
                Err(e) => host.log(Level::Error, &format!("idem: gRPC replay through the echo not sent: {e}")),
            }
        }
        let p = self.engine.policy(route);
        let duplicate = crate::replies::duplicate(&p.answers, &p.duplicate, None);
        self.send_when_read(host, ctx, duplicate.for_grpc());
        Answered::Replied
    }

    fn to_echo(&self, host: &dyn Host, ctx: u32, reply: &LocalReply) -> Result<(), StoreError> {
        // The trailers go with the answer when the echo's reply can carry them; else this stream
        // adds them as the echo's answer ends.
        let echo_sends_trailers = host.local_reply_trailers();
        let answer = StoredResponse {
            status: reply.status,
            headers: reply.headers.clone(),
            body: reply.body.clone(),
            trailers: if echo_sends_trailers { reply.trailers.clone() } else { Vec::new() },
        };
        let token = self.replay_slots.put(host, &answer)?;
        let path = self.engine.bundle.grpc.echo_path.as_bytes();
        let set =
            |n: &str, v: &[u8]| host.set_request_header(n, v).map_err(|e| StoreError::Host(format!("{n}: {e:?}")));
        set("content-type", REPLAY_CONTENT_TYPE)?;
        set(":path", path)?;
        set(REPLAY_HEADER, token.as_bytes())?;
        // The body the client sent goes on (the echo reads nothing of it): its length stays.
        if !echo_sends_trailers {
            self.replays.trailers.borrow_mut().insert(ctx, reply.trailers.clone());
        }
        Ok(())
    }

    /// The trailers a stream owes its client once the echo's answer ends, if it replays.
    pub(super) fn take_replay(&self, ctx: u32) -> Option<Vec<Header>> {
        self.replays.trailers.borrow_mut().remove(&ctx)
    }

    /// The echo instance's answer to a replay call: the slot's answer, or 404 when the token names
    /// none (a client that came to the echo path by itself, or a slot taken already).
    pub(super) fn echo(&self, host: &dyn Host, ctx: u32, token: Option<&[u8]>) {
        let answer = token.and_then(|t| std::str::from_utf8(t).ok()).and_then(|t| self.replay_slots.take(host, t));
        let reply = match answer {
            Some(a) => LocalReply {
                status: a.status,
                headers: a.headers,
                body: a.body,
                trailers: a.trailers,
                ..Default::default()
            },
            None => crate::replies::plain_error(ErrorCode::ReplayGone, "no replay waits under this token"),
        };
        self.reply(host, ctx, reply);
    }
}

/// Adds the trailers of a replayed gRPC answer (in the last response body callback).
pub(super) fn add_trailers(host: &dyn Host, trailers: &[Header]) {
    for (name, value) in trailers {
        if let Err(e) = host.add_response_trailer(name, value) {
            host.log(Level::Error, &format!("idem: gRPC replay trailer {name} not added: {e:?}"));
        }
    }
}
