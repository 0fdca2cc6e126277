//! Redis behind the [`Store`] interface, with this process' [`AnswerCache`] in front: an
//! operation answers at once from the cache, or is the Webdis call whose reply answers it.

use super::answer_cache::AnswerCache;
use super::redis::{self, RedisStore};
use super::shared::SharedStore;
use super::{Answer, Call, Claim, Payload, Step, Store, StoreError, StoreTicket, TokenUse, Write, Written};
use crate::host::Host;
use crate::policy::RedisConfig;

/// A claim call whose reply says nothing readable (a timeout, a reset, an unreadable record):
/// its `SET` may still reach Redis with nobody to finish it, so the caller releases `ticket`
/// (owner-checked) if it does.
#[derive(Debug)]
pub struct Unanswered {
    pub error: StoreError,
    pub ticket: redis::Ticket,
}

pub struct Remote<'a> {
    pub redis: RedisStore<'a>,
    pub cache: AnswerCache<'a>,
}

impl<'a> Remote<'a> {
    pub fn new(cfg: &'a RedisConfig, shared: &'a SharedStore) -> Self {
        Remote { redis: RedisStore::new(cfg), cache: AnswerCache::new(shared, cfg.answer_cache.millis) }
    }

    /// Reads a claim's reply (`value`: a call's, a batch's step, a poll's) for the claim `mine`
    /// of a request with `fingerprint`: the claim ours, or what holds the key — with the record
    /// found when it is an unknown outcome whose lookup is free at `now` (what a lookup is fenced by). A
    /// completed answer of this very request is kept in the cache for the key's next repeats.
    pub fn claim_answered(
        &self,
        host: &dyn Host,
        mine: redis::Ticket,
        fingerprint: &[u8; 32],
        value: Result<serde_json::Value, StoreError>,
        retain_ms: u64,
        now: u64,
    ) -> Result<Claim<StoreTicket>, Unanswered> {
        let v = match value {
            Ok(v) => v,
            Err(error) => return Err(Unanswered { error, ticket: mine }),
        };
        let held = redis::held_ticket(&mine, &v, now);
        let id = mine.id();
        let found = match redis::read_claim_at(fingerprint, v, now) {
            Ok(found) => found,
            Err(error) => return Err(Unanswered { error, ticket: mine }),
        };
        let found = match found {
            Claim::Unknown { first_seen_ms, held_until_ms, payload, .. } => {
                Claim::Unknown { first_seen_ms, held_until_ms, payload, held: held.map(StoreTicket::Redis) }
            }
            other => other.map(|()| StoreTicket::Redis(mine)),
        };
        if let Claim::Completed { first_seen_ms, status, response, payload: Payload::Same } = &found {
            let mut fp = [0u8; 16];
            fp.copy_from_slice(&fingerprint[..16]);
            let answer =
                Answer { fingerprint: fp, first_seen_ms: *first_seen_ms, status: *status, response: response.as_ref() };
            self.cache.remember(host, &id, &answer, retain_ms);
        }
        Ok(found)
    }

    /// Reads the reply of a call that takes a ticket when its fenced update applies
    /// ([`Store::take_lookup`], [`Store::lookup_absent`]): the ticket, or `None`.
    pub fn read_taken(
        &self,
        ticket: redis::Ticket,
        status: u16,
        body: &[u8],
    ) -> Result<Option<StoreTicket>, StoreError> {
        let applied = self.redis.parse_update(status, body)?;
        Ok(applied.then_some(StoreTicket::Redis(ticket)))
    }

    /// A fresh owner id for a record.
    fn owner(host: &dyn Host, now: u64) -> u64 {
        host.random_u64().unwrap_or(now)
    }
}

impl Store for Remote<'_> {
    fn claim(
        &self,
        host: &dyn Host,
        id: &[u8; 32],
        fingerprint: &[u8; 32],
        lease_ms: u64,
        _retain_ms: u64,
        now: u64,
    ) -> Step<Claim<StoreTicket>> {
        if let Some(found) = self.cache.found(host, id, fingerprint) {
            return Step::Now(Ok(found));
        }
        let (cmd, ticket) = self.redis.claim(id, fingerprint, Self::owner(host, now), now, lease_ms);
        Step::Call(Call { cmd, ticket: Some(ticket), tombstone: false })
    }

    /// Tokens are not cached: a token is used once, and its use is decided where it is kept.
    fn use_token(&self, host: &dyn Host, id: &[u8; 32], now: u64) -> Step<TokenUse<StoreTicket>> {
        let (cmd, ticket) = self.redis.use_token(id, Self::owner(host, now), now);
        Step::Call(Call { cmd, ticket: Some(ticket), tombstone: false })
    }

    fn issue_token(&self, _host: &dyn Host, id: &[u8; 32], ttl_ms: u64, now: u64) -> Step<()> {
        Step::Call(Call::plain(self.redis.issue_token(id, now, ttl_ms)))
    }

    fn write(&self, _host: &dyn Host, ticket: &StoreTicket, write: &Write, lease_ms: u64, now: u64) -> Step<Written> {
        let t = match redis_ticket(ticket) {
            Ok(t) => t,
            Err(e) => return Step::Now(Err(e)),
        };
        Step::Call(match write {
            Write::Release => Call::plain(self.redis.release(t)),
            Write::RestoreToken => Call::plain(self.redis.restore_token(t)),
            Write::Complete { response, max_response_bytes, ttl_ms } => {
                let (cmd, tombstone) = self.redis.complete(t, response, *max_response_bytes, *ttl_ms, lease_ms);
                Call { cmd, ticket: None, tombstone }
            }
            Write::HoldUnknown { hold_ms, note } => {
                Call::plain(self.redis.hold_unknown(t, *hold_ms, now, lease_ms, note))
            }
            // Fenced on the lookup's record, as a completion on its claim's.
            Write::LookupRan { response, max_response_bytes, ttl_ms } => {
                let (cmd, tombstone) = self.redis.complete(t, response, *max_response_bytes, *ttl_ms, lease_ms);
                Call { cmd, ticket: None, tombstone }
            }
            Write::LookupGivenBack => Call::plain(self.redis.lookup_failed(t)),
        })
    }

    /// The reply says whether the update applied ([`Remote::read_taken`]).
    fn take_lookup(&self, host: &dyn Host, held: &StoreTicket, lease_ms: u64, now: u64) -> Step<Option<StoreTicket>> {
        match redis_ticket(held) {
            Ok(t) => {
                let (cmd, lookup) = self.redis.take_lookup(t, Self::owner(host, now), now.saturating_add(lease_ms));
                Step::Call(Call { cmd, ticket: Some(lookup), tombstone: false })
            }
            Err(e) => Step::Now(Err(e)),
        }
    }

    /// The reply says whether the update applied ([`Remote::read_taken`]).
    fn lookup_absent(
        &self,
        host: &dyn Host,
        lookup: &StoreTicket,
        lease_ms: u64,
        now: u64,
    ) -> Step<Option<StoreTicket>> {
        match redis_ticket(lookup) {
            Ok(t) => {
                let (cmd, claim) = self.redis.lookup_absent(t, Self::owner(host, now), now, lease_ms);
                Step::Call(Call { cmd, ticket: Some(claim), tombstone: false })
            }
            Err(e) => Step::Now(Err(e)),
        }
    }

    fn renew(&self, _host: &dyn Host, ticket: &StoreTicket, lease_ms: u64) -> Step<bool> {
        match redis_ticket(ticket) {
            Ok(t) => Step::Call(Call::plain(self.redis.renew(t, lease_ms))),
            Err(e) => Step::Now(Err(e)),
        }
    }
}

fn redis_ticket(ticket: &StoreTicket) -> Result<&redis::Ticket, StoreError> {
    match ticket {
        StoreTicket::Redis(t) => Ok(t),
        StoreTicket::Shared(_) => Err(StoreError::Host("a shared-store ticket given to Redis".into())),
    }
}
