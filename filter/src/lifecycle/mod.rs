//! The request lifecycle: what a request does across its callbacks, and what one worker's
//! root context does for all of them — host-independent, driven by events, tested with
//! [`crate::testing::FakeHost`].
//!
//! - [`Stream`]: one request, a state machine over [`stream::Phase`] (reading the body, waiting
//!   for a store reply, held as a duplicate, forwarded, capturing the answer, handed to the root).
//!   Each callback Envoy makes is an event (`on_request_headers`, `on_call_response`, …) that
//!   moves the phase and carries out its actions through the host (send a reply, resume,
//!   dispatch a call), and says whether the stream continues or pauses ([`Flow`]).
//! - [`Worker`]: what the streams of one worker share, and the root context's events: its
//!   tick (held duplicates, retried writes, lease renewals), its wake-up queue, and the answers
//!   of the calls it owns (Redis writes, detached upstream calls, renewals, polls). What the
//!   root owns is finished whatever the client does; a stream's call is treated as lost when
//!   the stream ends, and its late reply as expected (Envoy 1.40 keeps every callout on the
//!   root context and still answers it: `ended_calls`, docs/design.md "Where a callout lives").
//!
//! Each concern in its file: the state it owns behind its own small interface (a struct the
//! worker holds one of — `Waiters`, `Outbox`, `Claims`, `Leases`, `DetachedCalls`, `BodyGate`,
//! `Early`, `Handoffs`, `EndedCalls`, `Replays`, `Metrics` — whose methods keep that state's
//! rules), and the worker's methods that route events to it: they ask the route's store, send
//! calls, and act on streams.
//! The worker keeps one map of the root's calls out, whose `RootCall` says which concern an
//! answer belongs to:
//! - `capture`: the upstream's answer, captured as it streams (or held whole on Redis), and the
//!   ticket finished with it (the response half of [`Stream`]).
//! - `waiters`: held duplicates, re-checked by the root in groups, Redis polls backing off.
//! - `handoff`: a paused stream's verdict carried out by the root (a held duplicate's, a batched
//!   claim's), and what it did, left for the stream's next callback.
//! - `writes`: Redis completions, releases and token restores sent by the root, retried with
//!   backoff until they land, batched while a write is out (group commit); orphaned claims
//!   released.
//! - `claims`: Redis claims batched while a claim call is out (group commit), sent by the root,
//!   each verdict carried out on its stream.
//! - `leases`: claims renewed every third of their lease while the upstream works.
//! - `detached`: requests the root sends upstream itself (`forward = "detached"`).
//! - `contexts`: Envoy's contexts of one VM and the routing of every callout reply by its token
//!   to the owner recorded when it was sent (the dispatcher the glue's exports call).
//! - `ended_calls`: the calls of streams that ended with them out, whose late replies (Envoy
//!   1.40 answers them on the root) are expected rather than stray.
//! - `fate`: what becomes of each live stream's request — answered or let go upstream, one or
//!   the other, once: every local reply, resume and request callback's `Continue` goes through
//!   it, so no later callback, tick or reply can forward a request the gateway answered.
//! - `early`: answers decided while the client still sends its body wait for the body's end.
//! - `body_gate`: finds out whether Envoy passes the body to a request paused at its headers
//!   (only with `allow_on_headers_stop_iteration`), and answers rather than hangs when not.
//! - `eviction`: asks the Redis behind Webdis once whether it may evict idem's keys, and warns.
//! - `replay`: answering a stream — in gRPC's form for a gRPC call, and a replayed gRPC answer
//!   through the echo listener.
//! - `metrics`: the counters and histograms.
//!
//! The glue (`glue/`) only turns proxy-wasm callbacks into these calls.

mod admin;
mod body_gate;
mod capture;
mod claims;
mod contexts;
mod detached;
mod early;
mod ended_calls;
mod eviction;
mod fate;
mod handoff;
mod leases;
mod lookup;
mod metrics;
mod replay;
mod slots;
mod stream;
mod waiters;
mod worker;
mod writes;

pub use body_gate::{BodyDelivery, WITHHELD_LOG};
pub use contexts::Contexts;
pub use early::{DISCARD_LIMIT, PARK_MS, UNPROVEN_PARK_MS};
pub use eviction::EVICTS_LOG;
pub use metrics::STRAY_REPLIES_COUNTER;
pub use stream::Stream;
pub use worker::Worker;

/// What a stream callback tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop here. A body chunk is buffered, counted against Envoy's buffer limit (past it Envoy
    /// answers 413 itself): for a body the decision reads.
    Pause,
    /// Stop a body chunk with flow control instead (`StopIterationAndWatermark`): Envoy keeps it
    /// and stops reading from the client past its buffer limit, never a 413 — for a body that
    /// goes upstream once the decision (made without it) is in. Headers and trailers: `Pause`.
    Hold,
    /// Drop a body chunk (`StopIterationNoBuffer`): the request was answered before its body
    /// ended, and the answer waits until the client has sent it all — a client still uploading
    /// reads no answer (HTTP/2 ends the stream with `RST_STREAM`; HTTP/1.1 closes under the
    /// unread body). Headers and trailers: `Pause`.
    Discard,
}

impl Flow {
    /// Envoy's `FilterHeadersStatus` (0 Continue, 1 StopIteration), for headers and trailers:
    /// the number proxy-wasm and dynamic modules both return.
    pub fn headers_status(self) -> u32 {
        u32::from(self != Flow::Continue)
    }

    /// Envoy's `FilterDataStatus` (0 Continue, 1 StopIterationAndBuffer, 2
    /// StopIterationAndWatermark, 3 StopIterationNoBuffer), for body chunks.
    pub fn data_status(self) -> u32 {
        match self {
            Flow::Continue => 0,
            Flow::Pause => 1,
            Flow::Hold => 2,
            Flow::Discard => 3,
        }
    }
}

/// How often held duplicates are re-checked and queued writes sent, when any route needs it.
pub const POLL_MS: u64 = 20;

/// The worker's maps and sets, keyed by Envoy's context ids and callout tokens: numbers a client
/// does not choose, so a fast fixed hash (foldhash) serves where std's SipHash cost more than
/// the map operation itself, several times per request.
type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;
type Set<K> = std::collections::HashSet<K, foldhash::fast::FixedState>;
