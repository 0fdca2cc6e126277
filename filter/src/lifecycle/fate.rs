//! What becomes of each live stream's request: the gateway answers it, or it goes upstream —
//! one or the other, once, whoever decides (the stream's own callback, a callout's reply, the
//! root's tick or batch).
//!
//! Every decision reaches Envoy through this concern: a local reply ([`Worker::reply`]), a
//! resume ([`Worker::release`]), and the status a request callback returns
//! ([`Worker::request_flow`]: `Continue` lets the request go). Once a stream is answered, no
//! later callback, tick or reply can let its request go upstream; once it went, no answer of
//! the gateway's replaces it. A stream whose decision is out (a store call, a lookup, a held
//! duplicate, an answer waiting for its write) is `Open`: its body chunks are held, never let
//! through. The case this exists for: a repeat decided at its headers met an unknown outcome,
//! its lookup went out, and its body chunk's callback continued — the service ran the repeat
//! while the gateway answered it (issue 53).

use super::worker::{send, Worker};
use super::{Flow, Map};
use crate::host::{Host, Level};
use crate::response::LocalReply;
use std::cell::RefCell;

/// Where a live stream's request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fate {
    /// Not decided, or decided and not yet carried out: the request is held here.
    Open,
    /// The gateway answered it (a local reply sent, or parked until the request ends).
    Answered,
    /// It went on: upstream, or to the echo listener with a gRPC replay.
    Released,
}

/// The streams that have not ended, and each one's fate: this concern's state.
#[derive(Default)]
pub(super) struct Fates {
    live: RefCell<Map<u32, Fate>>,
}

impl Fates {
    pub(super) fn started(&self, ctx: u32) {
        self.live.borrow_mut().insert(ctx, Fate::Open);
    }

    pub(super) fn ended(&self, ctx: u32) {
        self.live.borrow_mut().remove(&ctx);
    }

    /// Whether stream `ctx` has not ended (the root acts only on such streams).
    pub(super) fn is_live(&self, ctx: u32) -> bool {
        self.live.borrow().contains_key(&ctx)
    }

    /// The fate of stream `ctx` (`None`: not live).
    pub(super) fn of(&self, ctx: u32) -> Option<Fate> {
        self.live.borrow().get(&ctx).copied()
    }

    /// Settles stream `ctx` as `fate`, once: `Err` with the fate it already has (an answered
    /// request never goes on nor is answered twice; a request that went on is never answered
    /// here nor resumed twice). A stream that is not live changes nothing.
    fn settle(&self, ctx: u32, fate: Fate) -> Result<(), Fate> {
        let mut live = self.live.borrow_mut();
        match live.get_mut(&ctx) {
            Some(f @ Fate::Open) => {
                *f = fate;
                Ok(())
            }
            Some(f) => Err(*f),
            None => Ok(()),
        }
    }
}

impl Worker {
    /// Answers stream `ctx` (the current context) with `reply` — unless its request already went
    /// on, which the lifecycle never does: the answer is dropped and the mistake logged.
    pub(super) fn reply(&self, host: &dyn Host, ctx: u32, reply: LocalReply) {
        match self.fates.settle(ctx, Fate::Answered) {
            Ok(()) => send(host, reply),
            Err(fate) => refused(host, ctx, "an answer", fate),
        }
    }

    /// Marks stream `ctx` answered: its answer is parked until the request ends, and goes then.
    pub(super) fn answered_later(&self, host: &dyn Host, ctx: u32) -> bool {
        match self.fates.settle(ctx, Fate::Answered) {
            Ok(()) => true,
            Err(fate) => {
                refused(host, ctx, "an answer", fate);
                false
            }
        }
    }

    /// Lets the request of stream `ctx` (the current context, paused) go on — unless the
    /// gateway answered it: then nothing is resumed and the mistake is logged.
    pub(super) fn release(&self, host: &dyn Host, ctx: u32) {
        match self.fates.settle(ctx, Fate::Released) {
            Ok(()) => {
                let _ = host.resume_request();
            }
            Err(fate) => refused(host, ctx, "a resume", fate),
        }
    }

    /// The status a request callback of stream `ctx` returns: `Continue` lets the request go on,
    /// and is refused (the chunk dropped, or the callback paused) once the stream was answered.
    pub(super) fn request_flow(&self, host: &dyn Host, ctx: u32, flow: Flow, body: bool) -> Flow {
        if flow != Flow::Continue {
            return flow;
        }
        match self.fates.settle(ctx, Fate::Released) {
            // The body of a request that went on follows it.
            Ok(()) | Err(Fate::Released) => Flow::Continue,
            Err(fate) => {
                refused(host, ctx, "a continue", fate);
                if body {
                    Flow::Discard
                } else {
                    Flow::Pause
                }
            }
        }
    }

    /// What a body chunk or the trailers of stream `ctx` do once its body is no longer read for
    /// the decision: held while the decision is out, dropped once answered, on once released.
    pub(super) fn after_decision(&self, ctx: u32) -> Flow {
        match self.fates.of(ctx) {
            Some(Fate::Open) => {
                self.early.held(ctx);
                Flow::Hold
            }
            Some(Fate::Answered) => Flow::Discard,
            Some(Fate::Released) | None => Flow::Continue,
        }
    }
}

/// A host call the lifecycle must never make, not made; logged at error level with the stream.
fn refused(host: &dyn Host, ctx: u32, what: &str, fate: Fate) {
    let why = match fate {
        Fate::Answered => "the gateway answered it already",
        Fate::Released | Fate::Open => "its request went upstream already",
    };
    host.log(Level::Error, &format!("idem: bug: {what} for stream {ctx} was not made: {why}"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_is_answered_or_released_once() {
        let fates = Fates::default();
        fates.started(1);
        assert_eq!(fates.settle(1, Fate::Answered), Ok(()));
        assert_eq!(fates.settle(1, Fate::Released), Err(Fate::Answered), "an answered stream never goes on");
        assert_eq!(fates.settle(1, Fate::Answered), Err(Fate::Answered), "never answered twice");
        fates.started(2);
        assert_eq!(fates.settle(2, Fate::Released), Ok(()));
        assert_eq!(fates.settle(2, Fate::Answered), Err(Fate::Released), "a released stream is never answered");
        assert_eq!(fates.settle(2, Fate::Released), Err(Fate::Released), "nor resumed twice");
        fates.ended(2);
        assert_eq!(fates.of(2), None);
        assert_eq!(fates.settle(2, Fate::Answered), Ok(()), "an ended stream: nothing to settle");
    }
}
