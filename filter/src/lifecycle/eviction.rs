//! Does the Redis behind Webdis evict keys when its memory is full? With any policy but
//! `noeviction` it may drop a live claim (a retry then runs the business again) or a stored
//! answer (a replay becomes a second run): all of idem's keys have a TTL, so `volatile-*`
//! policies pick them as readily as `allkeys-*`. Each worker's root asks once, soon after it
//! starts (and again every 30 s while Webdis does not answer), and logs what it found.

use super::worker::{RootCall, Worker};
use crate::host::{Host, Level};
use crate::store::redis::Eviction;
use std::cell::Cell;

/// How long to wait before asking again when Webdis did not answer.
const RETRY_MS: u64 = 30_000;

/// Where the probe stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Probe {
    /// Not asked yet.
    #[default]
    Due,
    /// To ask again at this time (Webdis did not answer).
    Later(u64),
    /// Asked; the answer is awaited (a [`RootCall::EvictionProbe`]).
    Sent,
    /// Answered (or no Redis route): nothing more to do.
    Done,
}

/// Logged when Redis may evict idem's keys.
pub const EVICTS_LOG: &str = "idem: Redis may evict idem's keys when its memory is full";

impl Worker {
    /// On the root's tick: ask Redis once.
    pub(super) fn probe_eviction(&self, host: &dyn Host) {
        let due = match self.eviction.get() {
            Probe::Due => true,
            Probe::Later(at) => host.now_ms() >= at,
            Probe::Sent | Probe::Done => false,
        };
        if !due {
            return;
        }
        let Some(store) = self.engine.redis() else {
            self.eviction.set(Probe::Done);
            return;
        };
        self.eviction.set(match self.dispatch(host, &store.eviction_probe()) {
            Ok(token) => {
                self.call_out(token, RootCall::EvictionProbe);
                Probe::Sent
            }
            Err(_) => Probe::Later(host.now_ms().saturating_add(RETRY_MS)),
        });
    }

    /// The probe's answer.
    pub(super) fn eviction_answered(&self, host: &dyn Host, status: u16, body: &[u8]) {
        let Some(store) = self.engine.redis() else {
            return;
        };
        match store.parse_eviction(status, body) {
            Ok(found) => {
                self.eviction.set(Probe::Done);
                log_eviction(host, &found);
            }
            Err(_) => self.eviction.set(Probe::Later(host.now_ms().saturating_add(RETRY_MS))),
        }
    }
}

fn log_eviction(host: &dyn Host, found: &Eviction) {
    match found {
        Eviction::Never => {
            host.log(Level::Info, "idem: Redis maxmemory-policy is noeviction: claims are never evicted")
        }
        Eviction::Evicts { policy, maxmemory } => host.log(
            Level::Warn,
            &format!(
                "{EVICTS_LOG} (maxmemory-policy {policy}, maxmemory {maxmemory}): an evicted claim lets a \
                 retry run the business again, an evicted answer turns a replay into a second run. Set \
                 maxmemory-policy noeviction (docs/redis.md, \"Production checklist\")"
            ),
        ),
        Eviction::Unreadable(why) => host.log(
            Level::Info,
            &format!(
                "idem: could not read Redis' maxmemory-policy ({why}); make sure it is noeviction, or allow \
                 INFO to Webdis' Redis user so idem can check (docs/redis.md)"
            ),
        ),
    }
}

/// A fresh probe state.
pub(super) fn probe() -> Cell<Probe> {
    Cell::new(Probe::Due)
}
