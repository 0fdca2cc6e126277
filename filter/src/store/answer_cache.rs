//! This process' copy of a remote store's answers, in front of it (`[redis] answer_cache`): a
//! repeat of a key whose answer this Envoy wrote, or read back, is answered without a round
//! trip; a key whose answer is still being written is marked, so a repeat meanwhile never
//! claims it. Kept in this process' shared data (a Redis route keeps nothing else there, and ids
//! of different routes differ).

use super::shared::{self, SharedStore};
use super::{Answer, Claim, StoreTicket};
use crate::host::Host;

pub struct AnswerCache<'a> {
    shared: &'a SharedStore,
    /// How long a copy is kept at most (`[redis] answer_cache`).
    keep_ms: u64,
}

impl<'a> AnswerCache<'a> {
    pub fn new(shared: &'a SharedStore, keep_ms: u64) -> Self {
        AnswerCache { shared, keep_ms }
    }

    /// What this process knows of `id`, as a claim would find it: a completed answer kept here
    /// — replayed (or refused as a duplicate, or as a reused key) exactly as the remote copy
    /// would be: a completed record never changes there until it expires, and the copy expires
    /// no later — or [`Claim::Unwritten`] while this process' answer is being written.
    pub fn found(&self, host: &dyn Host, id: &[u8; 32], fingerprint: &[u8; 32]) -> Option<Claim<StoreTicket>> {
        match self.shared.lookup(host, id, fingerprint).ok()?? {
            Claim::InFlight { first_seen_ms, .. } => Some(Claim::Unwritten { first_seen_ms }),
            // Copies are written by this version (never a legacy digest), so this is settled.
            Claim::Completed { first_seen_ms, status, response, payload } => {
                Some(Claim::Completed { first_seen_ms, status, response, payload })
            }
            _ => None,
        }
    }

    /// Keeps a completed answer for repeats of its key, for at most `keep_ms` and never past
    /// the record's own expiry in the remote store (first seen plus the route's `ttl`,
    /// `retain_ms`: the record was written later, so it lives longer).
    pub fn remember(&self, host: &dyn Host, id: &[u8; 32], answer: &Answer, retain_ms: u64) {
        let now = host.now_ms();
        let expires = answer.first_seen_ms.saturating_add(retain_ms);
        let until = now.saturating_add(self.keep_ms).min(expires);
        if until > now {
            let _ = self.shared.remember(host, id, answer, until);
        }
    }

    /// Marks a key whose answer is being retried, until `until_ms` at the latest.
    pub fn mark_unwritten(&self, host: &dyn Host, id: &[u8; 32], until_ms: u64) -> Option<shared::Ticket> {
        let lease = until_ms.saturating_sub(host.now_ms()).max(1);
        match self.shared.claim(host, id, &crate::fingerprint::NONE, lease, 0) {
            Ok(Claim::Claimed(t)) => Some(t),
            _ => None,
        }
    }

    /// The answer landed (or was given up): the mark goes.
    pub fn unmark(&self, host: &dyn Host, mark: &shared::Ticket) {
        let _ = self.shared.release(host, mark);
    }
}
