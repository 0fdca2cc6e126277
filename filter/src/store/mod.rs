//! Stores: where claims and tokens live. Both implement one interface, [`Store`], and speak the
//! same results, so the engine decides the same way and the lifecycle takes one path whichever
//! store a route uses.
//!
//! The interface is async-shaped, as Envoy's cache filter's `HttpCache` is: an operation answers
//! at once ([`Step::Now`]) or names the call whose reply answers it ([`Step::Call`]), which the
//! lifecycle sends — alone, batched with others, or again after a refusal — and reads back with
//! the store that made it.
//!
//! - [`shared`]: Envoy's proxy-wasm shared data, one Envoy process: answers at once.
//! - [`remote`]: Redis through Webdis HTTP callouts ([`redis`] builds the calls and reads the
//!   replies), a fleet of Envoys, with this process' [`answer_cache`] in front of it: a repeat
//!   of an answer seen here is answered at once.

pub mod answer_cache;
pub mod operator;
pub mod redis;
pub mod remote;
pub mod replay;
pub mod resp;
pub mod shared;
pub(crate) mod text;

use crate::host::Host;
use crate::response::StoredResponse;
use operator::HeldNote;

/// One interface over the stores: what the lifecycle asks of whichever store a route uses.
pub trait Store {
    /// Claims `id` for a request with `fingerprint` (or reports who holds it): in flight for
    /// `lease_ms`, its answer kept `retain_ms` once completed. `now` is the caller's clock
    /// reading, for what a call writes (the shared store reads its own, under its CAS).
    fn claim(
        &self,
        host: &dyn Host,
        id: &[u8; 32],
        fingerprint: &[u8; 32],
        lease_ms: u64,
        retain_ms: u64,
        now: u64,
    ) -> Step<Claim<StoreTicket>>;
    /// Uses a token: of any number of concurrent presentations, one consumes it.
    fn use_token(&self, host: &dyn Host, id: &[u8; 32], now: u64) -> Step<TokenUse<StoreTicket>>;
    /// Records a freshly issued token (its scoped id), valid for `ttl_ms`.
    fn issue_token(&self, host: &dyn Host, id: &[u8; 32], ttl_ms: u64, now: u64) -> Step<()>;
    /// Finishes a claim or a token use with `write`, fenced by `ticket`. `lease_ms` keeps the
    /// claim ours while a refused write is retried.
    fn write(&self, host: &dyn Host, ticket: &StoreTicket, write: &Write, lease_ms: u64, now: u64) -> Step<Written>;
    /// Extends the lease of a claim whose request still waits for the upstream: `false` when the
    /// claim is no longer the ticket's.
    fn renew(&self, host: &dyn Host, ticket: &StoreTicket, lease_ms: u64) -> Step<bool>;
    /// Takes the lookup of the unknown outcome a claim found (`held`): of the repeats that meet
    /// it, one asks the service while the others wait. `None` when another lookup runs or the
    /// record changed. The lookup's lease lasts `lease_ms` from `now`; what its answer writes is
    /// fenced by the ticket returned ([`Write::LookupRan`], [`Write::LookupGivenBack`]).
    fn take_lookup(&self, host: &dyn Host, held: &StoreTicket, lease_ms: u64, now: u64) -> Step<Option<StoreTicket>>;
    /// The lookup said the first attempt did not run: the key becomes the repeat's own claim, in
    /// flight for `lease_ms`, fenced on the lookup; `None` when the lookup no longer holds it.
    fn lookup_absent(
        &self,
        host: &dyn Host,
        lookup: &StoreTicket,
        lease_ms: u64,
        now: u64,
    ) -> Step<Option<StoreTicket>>;
}

/// A store operation's answer.
#[derive(Debug)]
pub enum Step<T> {
    /// Answered at once (Envoy's shared data, or this process' answer cache).
    Now(Result<T, StoreError>),
    /// Answered by the reply to this call, which the caller sends.
    Call(Call),
}

/// A call whose reply answers a store operation: a Webdis command.
#[derive(Debug)]
pub struct Call {
    pub cmd: redis::Command,
    /// The ticket the operation holds if the reply says so (a claim, a token use).
    pub ticket: Option<redis::Ticket>,
    /// A completion that records a tombstone (the response does not fit).
    pub tombstone: bool,
}

impl Call {
    fn plain(cmd: redis::Command) -> Self {
        Call { cmd, ticket: None, tombstone: false }
    }
}

/// A store's proof of ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreTicket {
    Shared(shared::Ticket),
    Redis(redis::Ticket),
}

impl StoreTicket {
    /// When the claim (or the token's use) was made.
    pub fn first_seen_ms(&self) -> u64 {
        match self {
            StoreTicket::Shared(t) => t.first_seen_ms,
            StoreTicket::Redis(t) => t.first_seen_ms,
        }
    }

    /// Whether what finishes this ticket is a call the root sends (Redis): the client's answer
    /// is then held until the write's first attempt is answered, so its retry finds the key
    /// written.
    pub fn written_by_call(&self) -> bool {
        matches!(self, StoreTicket::Redis(_))
    }

    /// The store's name and the key an operator names the record by (`idem-admin`).
    pub fn operator_key(&self) -> (&'static str, String) {
        match self {
            StoreTicket::Shared(t) => ("shared", t.store_key()),
            StoreTicket::Redis(t) => ("redis", t.key.clone()),
        }
    }
}

/// What finishing a claim or a token use writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Free the claim so a retry runs.
    Release,
    /// Put the token back so the user's retry passes.
    RestoreToken,
    /// Remember the response for `ttl_ms` (a tombstone when over `max_response_bytes`).
    Complete { response: StoredResponse, max_response_bytes: usize, ttl_ms: u64 },
    /// The outcome is unknown: hold the claim for `hold_ms`, never to be taken over; `note` is
    /// what an operator lists it by.
    HoldUnknown { hold_ms: u64, note: HeldNote },
    /// A lookup said the first attempt ran: its answer becomes the key's, kept `ttl_ms` (a
    /// tombstone when over `max_response_bytes`).
    LookupRan { response: StoredResponse, max_response_bytes: usize, ttl_ms: u64 },
    /// A lookup settled nothing (or its request left): the unknown outcome again, without the
    /// lookup's lease, so the next repeat may ask.
    LookupGivenBack,
}

impl Write {
    pub fn kind(&self) -> WriteKind {
        match self {
            Write::Release => WriteKind::Release,
            Write::RestoreToken => WriteKind::RestoreToken,
            Write::Complete { .. } => WriteKind::Complete,
            Write::HoldUnknown { .. } => WriteKind::HoldUnknown,
            Write::LookupRan { .. } | Write::LookupGivenBack => WriteKind::Lookup,
        }
    }
}

/// Which write, without its data (what a write's outcome is counted as).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    Release,
    RestoreToken,
    Complete,
    HoldUnknown,
    /// What a lookup settled (counted with the lookup, not as a write of its own).
    Lookup,
}

/// How a write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Applied,
    /// A completion recorded as a tombstone (status only).
    Tombstoned,
    /// The ticket no longer holds the key (its lease ended and another owner took it, or the
    /// token was used again): nothing was written.
    NotOurs,
}

/// The store of one route.
pub enum RouteStore<'a> {
    Shared(&'a shared::SharedStore),
    Remote(remote::Remote<'a>),
}

/// A route's store is used through the interface: `store.claim(…)` whichever it is.
impl<'a> std::ops::Deref for RouteStore<'a> {
    type Target = dyn Store + 'a;

    fn deref(&self) -> &Self::Target {
        match self {
            RouteStore::Shared(s) => *s,
            RouteStore::Remote(r) => r,
        }
    }
}

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
    /// This process' answer for the key is still being written to the remote store (see
    /// [`answer_cache`]): neither claimed nor replayed, whatever the remote store holds now —
    /// its claim may have lapsed during the outage, and claiming it could run the business again.
    Unwritten { first_seen_ms: u64 },
}

impl<T> Claim<T> {
    /// Settles a [`Payload::Legacy`] comparison with the request's SHA-256 fingerprint (its
    /// first 16 bytes), computed only now; `None` (no request at hand) counts as different.
    pub fn resolve_legacy(mut self, legacy: impl FnOnce() -> Option<[u8; 16]>) -> Claim<T> {
        let payload = match &mut self {
            Claim::Claimed(_) | Claim::Unwritten { .. } => return self,
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
            Claim::Unwritten { first_seen_ms } => Claim::Unwritten { first_seen_ms },
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
            StoreError::NoAnswer => write!(f, "no answer from Redis (Webdis or `direct`: reset, refused or timed out)"),
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
