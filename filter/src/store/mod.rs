//! Stores: where claims and tokens live. Both speak the same results, so the engine decides the
//! same way whichever store a route uses.
//!
//! - [`shared`]: Envoy's proxy-wasm shared data, one Envoy process, synchronous.
//! - [`redis`]: Redis through Webdis HTTP callouts, a fleet of Envoys; the glue carries the calls,
//!   this crate builds them and reads the replies.

pub mod operator;
pub mod redis;
pub mod replay;
pub mod shared;

use crate::response::StoredResponse;

/// Whether a found record was made by the same request (its fingerprint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    Same,
    Different,
    /// The record was written before fingerprints were xxh3-128 (SHA-256, its first 16 bytes
    /// here): the request's own SHA-256 fingerprint decides ([`Claim::resolve_legacy`]), taken
    /// only then.
    Legacy([u8; 16]),
}

impl Payload {
    /// A stored fingerprint against the request's: `legacy_digest` says the stored one is SHA-256.
    pub fn of(stored: &[u8; 16], legacy_digest: bool, current: &[u8; 16]) -> Payload {
        match (stored == current, legacy_digest) {
            (true, _) => Payload::Same,
            (false, true) => Payload::Legacy(*stored),
            (false, false) => Payload::Different,
        }
    }

    pub fn is_same(self) -> bool {
        self == Payload::Same
    }
}

/// What a claim found. `T` is the store's proof of ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim<T> {
    /// The caller owns the key now and may forward the request.
    Claimed(T),
    /// Another request holds the key and its lease has not ended.
    InFlight { first_seen_ms: u64, lease_ends_ms: u64, payload: Payload },
    /// The key completed earlier. `response` is `None` for a tombstone (status only).
    Completed { first_seen_ms: u64, status: u16, response: Option<StoredResponse>, payload: Payload },
    /// The first attempt was forwarded and no answer came back: it may have run. Held (never
    /// taken over) until `held_until_ms`, or until an operator releases it. `held` is the proof
    /// a lookup (`[route.reconcile]`) starts from, where the store gives one.
    Unknown { first_seen_ms: u64, held_until_ms: u64, payload: Payload, held: Option<T> },
}

impl<T> Claim<T> {
    /// Settles a [`Payload::Legacy`] comparison with the request's SHA-256 fingerprint (its
    /// first 16 bytes), computed only now; `None` (no request at hand) counts as different.
    pub fn resolve_legacy(mut self, legacy: impl FnOnce() -> Option<[u8; 16]>) -> Claim<T> {
        let payload = match &mut self {
            Claim::Claimed(_) => return self,
            Claim::InFlight { payload, .. } | Claim::Completed { payload, .. } | Claim::Unknown { payload, .. } => {
                payload
            }
        };
        if let Payload::Legacy(stored) = *payload {
            *payload = if legacy() == Some(stored) { Payload::Same } else { Payload::Different };
        }
        self
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Claim<U> {
        match self {
            Claim::Claimed(t) => Claim::Claimed(f(t)),
            Claim::InFlight { first_seen_ms, lease_ends_ms, payload } => {
                Claim::InFlight { first_seen_ms, lease_ends_ms, payload }
            }
            Claim::Completed { first_seen_ms, status, response, payload } => {
                Claim::Completed { first_seen_ms, status, response, payload }
            }
            Claim::Unknown { first_seen_ms, held_until_ms, payload, held } => {
                Claim::Unknown { first_seen_ms, held_until_ms, payload, held: held.map(f) }
            }
        }
    }
}

/// A completed answer as this process keeps a copy of it (see `shared::SharedStore::remember`).
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// The first half of the answered request's fingerprint (what records compare).
    pub fingerprint: [u8; 16],
    pub first_seen_ms: u64,
    pub status: u16,
    /// `None` for a tombstone (status only).
    pub response: Option<&'a StoredResponse>,
}

/// What presenting a token found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenUse<T> {
    /// The token was valid and is now used; `T` allows restoring it.
    Consumed(T),
    /// The token was used before, at this time.
    Used { used_at_ms: u64 },
    /// Never issued (for this route and caller), expired, or evicted.
    Unknown,
}

impl<T> TokenUse<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> TokenUse<U> {
        match self {
            TokenUse::Consumed(t) => TokenUse::Consumed(f(t)),
            TokenUse::Used { used_at_ms } => TokenUse::Used { used_at_ms },
            TokenUse::Unknown => TokenUse::Unknown,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// Every entry of the bucket is in flight inside its lease.
    Full,
    /// The value kept changing under us.
    Contended,
    /// A bucket key that should exist does not (the store was not initialised).
    Missing(String),
    /// The host or the remote store failed.
    Host(String),
    /// The store call got no answer: Webdis reset, refused or timed out.
    NoAnswer,
    /// Redis refused the command (its error text).
    Redis(String),
    /// Redis Cluster refused a call whose keys are in several hash slots (nothing of it ran).
    CrossSlot(String),
    /// A record or reply the store holds cannot be read (what, and its first characters).
    Unreadable(String),
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Full => write!(f, "store full: every entry of the bucket is in flight"),
            StoreError::Contended => write!(f, "store contended beyond the retry limit"),
            StoreError::Missing(k) => write!(f, "bucket {k} does not exist"),
            StoreError::Host(e) | StoreError::Unreadable(e) => write!(f, "{e}"),
            StoreError::NoAnswer => write!(f, "webdis callout failed (no response: reset, refused or timed out)"),
            StoreError::Redis(e) | StoreError::CrossSlot(e) => write!(f, "redis error: {e}"),
        }
    }
}

impl From<crate::host::HostError> for StoreError {
    fn from(e: crate::host::HostError) -> Self {
        match e {
            crate::host::HostError::CasMismatch => StoreError::Contended,
            crate::host::HostError::Failed(m) => StoreError::Host(m),
        }
    }
}

/// How a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    Stored,
    Tombstoned,
    /// The lease had ended and another owner holds the key: nothing was written.
    LostOwnership,
}
