//! Stores: where claims and tokens live. Both speak the same results, so the engine decides the
//! same way whichever store a route uses.
//!
//! - [`shared`]: Envoy's proxy-wasm shared data, one Envoy process, synchronous.
//! - [`redis`]: Redis through Webdis HTTP callouts, a fleet of Envoys; the glue carries the calls,
//!   this crate builds them and reads the replies.

pub mod redis;
pub mod replay;
pub mod shared;

use crate::response::StoredResponse;

/// What a claim found. `T` is the store's proof of ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim<T> {
    /// The caller owns the key now and may forward the request.
    Claimed(T),
    /// Another request holds the key and its lease has not ended.
    InFlight { first_seen_ms: u64, lease_ends_ms: u64, same_payload: bool },
    /// The key completed earlier. `response` is `None` for a tombstone (status only).
    Completed { first_seen_ms: u64, status: u16, response: Option<StoredResponse>, same_payload: bool },
    /// The first attempt was forwarded and no answer came back: it may have run. Held (never
    /// taken over) until `held_until_ms`, or until an operator releases it.
    Unknown { first_seen_ms: u64, held_until_ms: u64, same_payload: bool },
}

impl<T> Claim<T> {
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Claim<U> {
        match self {
            Claim::Claimed(t) => Claim::Claimed(f(t)),
            Claim::InFlight { first_seen_ms, lease_ends_ms, same_payload } => {
                Claim::InFlight { first_seen_ms, lease_ends_ms, same_payload }
            }
            Claim::Completed { first_seen_ms, status, response, same_payload } => {
                Claim::Completed { first_seen_ms, status, response, same_payload }
            }
            Claim::Unknown { first_seen_ms, held_until_ms, same_payload } => {
                Claim::Unknown { first_seen_ms, held_until_ms, same_payload }
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
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Full => write!(f, "store full: every entry of the bucket is in flight"),
            StoreError::Contended => write!(f, "store contended beyond the retry limit"),
            StoreError::Missing(k) => write!(f, "bucket {k} does not exist"),
            StoreError::Host(e) => write!(f, "{e}"),
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
