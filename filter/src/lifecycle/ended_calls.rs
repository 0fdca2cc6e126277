//! Calls of streams that ended with them out. Envoy 1.40 keeps every HTTP callout on the
//! worker's root context, so such a call is still answered after its stream has ended
//! (docs/design.md, "Where a callout lives"): its reply is expected, and is dropped unread
//! without counting as a stray. A host that cancels the call with its stream never answers it,
//! so an entry is kept for a bounded time, and only a bounded number of them.

use super::worker::Worker;
use super::Map;
use crate::host::Host;
use std::cell::RefCell;

/// How long an ended stream's call may still be answered: longer than any callout timeout a
/// policy sets in practice (a reply later than this counts as a stray).
const KEPT_MS: u64 = 5 * 60 * 1000;
/// At most this many are remembered (a host that cancels them would otherwise fill the map
/// with one per client that left); beyond it, a late reply counts as a stray.
const MAX_KEPT: usize = 4096;

/// This concern's state: tokens of ended streams' calls, with when they are forgotten.
#[derive(Default)]
pub(super) struct EndedCalls {
    until_ms: RefCell<Map<u32, u64>>,
}

impl EndedCalls {
    /// The stream that sent call `token` ended before its reply came.
    fn ended(&self, token: u32, now_ms: u64) {
        let mut until = self.until_ms.borrow_mut();
        if until.len() < MAX_KEPT {
            until.insert(token, now_ms.saturating_add(KEPT_MS));
        }
    }

    /// Whether `token` is the call of a stream that ended.
    pub(super) fn contains(&self, token: u32) -> bool {
        self.until_ms.borrow().contains_key(&token)
    }

    /// Its reply came: the token is forgotten.
    pub(super) fn answered(&self, token: u32) {
        self.until_ms.borrow_mut().remove(&token);
    }

    /// Forgets the calls whose reply has not come in time.
    fn forget_due(&self, now_ms: u64) {
        self.until_ms.borrow_mut().retain(|_, until| *until > now_ms);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.until_ms.borrow().len()
    }
}

impl Worker {
    /// A stream ended with call `token` out: its reply, if it still comes, is nobody's and
    /// expected.
    pub(super) fn stream_call_ended(&self, host: &dyn Host, token: u32) {
        self.stream_call_done(token);
        self.ended_calls.ended(token, host.now_ms());
    }

    /// The root's tick: ended streams' calls that were never answered are forgotten.
    pub(super) fn forget_ended_calls(&self, host: &dyn Host) {
        self.ended_calls.forget_due(host.now_ms());
    }
}

#[cfg(test)]
mod tests {
    use super::{EndedCalls, KEPT_MS, MAX_KEPT};

    #[test]
    fn an_ended_call_is_kept_until_answered_or_for_its_time_at_most() {
        let calls = EndedCalls::default();
        calls.ended(7, 1_000);
        calls.ended(8, 1_000);
        assert!(calls.contains(7) && calls.contains(8));
        calls.answered(7);
        assert!(!calls.contains(7), "an answered call is forgotten");
        calls.forget_due(1_000 + KEPT_MS - 1);
        assert!(calls.contains(8), "still within its time");
        calls.forget_due(1_000 + KEPT_MS);
        assert!(!calls.contains(8), "forgotten once its time is up");
    }

    #[test]
    fn at_most_a_bounded_number_is_kept() {
        let calls = EndedCalls::default();
        for token in 0..(MAX_KEPT as u32 + 10) {
            calls.ended(token, 0);
        }
        assert_eq!(calls.len(), MAX_KEPT);
        assert!(!calls.contains(MAX_KEPT as u32 + 5));
    }
}
