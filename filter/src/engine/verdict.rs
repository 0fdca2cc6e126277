//! The vocabulary of decisions: what to do with a request, what a forwarded request holds, and
//! how it ended.

use super::Outcome;
use crate::policy::RouteId;
use crate::response::{Header, LocalReply};
pub use crate::store::StoreTicket;
use crate::store::Write;

/// What a forwarded request holds until it finishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticket {
    /// A key claim: complete it with the response, or release it.
    Claim(StoreTicket),
    /// A consumed token: restore it if the upstream failed (and the route says so).
    Token(StoreTicket),
}

impl Ticket {
    /// When the claim (or the token's use) was made.
    pub fn first_seen_ms(&self) -> u64 {
        self.store_ticket().first_seen_ms()
    }

    /// The store's proof of ownership, whether of a claim or a token's use.
    pub fn store_ticket(&self) -> &StoreTicket {
        let (Ticket::Claim(st) | Ticket::Token(st)) = self;
        st
    }
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Let it through; with a ticket, its outcome must be reported when it ends.
    Forward(Option<Ticket>),
    Reply(LocalReply),
    /// Hold it (`on_in_flight = "wait"`) and run `prepared` again until `deadline_ms`.
    Wait {
        prepared: Box<Prepared>,
        deadline_ms: u64,
    },
    /// The key holds an unknown outcome and the route has a lookup (`[route.reconcile]`): ask
    /// the service whether the first attempt ran ([`crate::store::Store::take_lookup`]).
    /// `unknown` is the answer when no lookup is made (a gRPC call).
    Reconcile {
        prepared: Box<Prepared>,
        held: StoreTicket,
        unknown: LocalReply,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    pub action: Action,
    /// Why, for the log line (e.g. `completed`, `in_flight`, `fingerprint_mismatch`).
    pub cause: String,
    /// The client's key or token, for the (truncated) log line.
    pub key: Option<String>,
}

/// A request ready for its store operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub route: RouteId,
    pub op: StoreOp,
    /// The client's key or token (for logs only; never stored).
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StoreOp {
    Claim { id: [u8; 32], fingerprint: [u8; 32] },
    UseToken { id: [u8; 32] },
}

/// The first step of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Decided without the store.
    Done(Verdict),
    /// Needs one store operation.
    Store(Prepared),
}

/// The body of a response, as far as it was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Seen to its end.
    Whole(Vec<u8>),
    /// Seen to its end, larger than the route's `max_response_bytes`: remembered as a tombstone.
    TooLarge,
    /// Not seen to its end: the upstream reset it or the client left mid-body. Whether the work
    /// was done is unknown from here.
    Cut,
}

/// How a forwarded request ended, as the glue observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// A response came back. `details` is Envoy's `response.code_details` (`via_upstream` when the
    /// upstream produced it). `grpc`: the request was a gRPC call, whose outcome is the
    /// `grpc-status` of `trailers` (or of `headers`, for a trailers-only answer).
    Response { status: u16, headers: Vec<Header>, body: Body, trailers: Vec<Header>, details: String, grpc: bool },
    /// No response: the client went away, or the stream was reset.
    NoResponse { forwarded: bool },
}

/// The store operation that finishing a ticket needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Nothing to write; count `outcome` (if any).
    Nothing { outcome: Option<Outcome>, cause: String },
    /// Write this to the store, then count what it did.
    Write { write: Write, cause: String },
}

/// A token issue request: which route the token is for, or the answer when it cannot be issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issue {
    Token { route: RouteId, token: String, id: [u8; 32] },
    Reply { route: Option<RouteId>, reply: LocalReply, cause: String },
}
