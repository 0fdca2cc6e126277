//! OASIS Repeatable Requests 1.0 (`key.protocol = "repeatable-requests"`): the headers Azure's
//! SDKs send by themselves on every operation that declares them (Microsoft's REST guidelines,
//! "Repeatability of requests"), and the answers the protocol gives.
//!
//! The request carries `Repeatability-Request-ID` (the key, a UUID from the SDK, kept across its
//! retries) and `Repeatability-First-Sent` (an IMF-fixdate, when the first attempt left). The
//! gateway keeps a key for `key.ttl`, so that is its window; what the OASIS text (CS01 §5) asks
//! of the server, and what this module does:
//! - neither header: an ordinary request (forwarded unprotected unless `key.required = true`);
//! - one without the other, or a First-Sent that is not an HTTP-date: `400` + `rejected`;
//! - First-Sent before the window (a key the gateway may have forgotten, so it cannot say whether
//!   the request ran): `412` + `rejected`. The window is `key.ttl - key.first_sent_skew`: a
//!   client whose clock runs ahead by up to the skew still meets its record;
//! - ahead of the gateway's clock by more than `key.first_sent_skew` (the spec is silent; a clock
//!   that far ahead would stretch the window past the record): `412` + `rejected`;
//! - the same id with another request (method, URI or body): `400` + `rejected` (§5 "SHOULD");
//! - an answer that is the request's result — the service's answer to its execution, its
//!   replays, the route's duplicate answer for a request completed before: `accepted` (§5);
//!   every other answer the gateway gives itself (in progress, unknown outcome, store
//!   unavailable, a missing key on a route that requires one): `rejected`, its status saying
//!   why. An answer Envoy made itself (an upstream reset, a timeout) and one the service marked
//!   itself are left as they are.

use crate::codes::ErrorCode;
use crate::policy::{KeyProtocol, RoutePolicy};
use crate::request::{raw_single_header, KeyError, RequestView};
use crate::response::LocalReply;

/// The request header that is the key.
pub use crate::policy::REPEATABILITY_REQUEST_ID as REQUEST_ID;
/// The request header that says when the first attempt was sent.
pub const FIRST_SENT: &str = "Repeatability-First-Sent";
/// The answer header: `accepted` or `rejected`.
pub const RESULT: &str = "repeatability-result";

/// Why a request of a Repeatable Requests route is refused before the store is asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The headers are malformed or only one of the two came (400).
    Malformed(String),
    /// First-Sent is outside the window (412).
    OutsideWindow(String),
}

impl Refusal {
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Malformed(_) => ErrorCode::KeyInvalid,
            Refusal::OutsideWindow(_) => ErrorCode::RepeatabilityExpired,
        }
    }

    pub fn message(&self) -> &str {
        let (Refusal::Malformed(m) | Refusal::OutsideWindow(m)) = self;
        m
    }
}

/// Whether a route speaks the protocol.
pub fn speaks(policy: &RoutePolicy) -> bool {
    policy.key.protocol == KeyProtocol::RepeatableRequests
}

/// Checks the pair of headers against the window: `Ok` when both are absent (an ordinary
/// request; the missing key is decided as on any route) or both are present and First-Sent is
/// inside `[now - ttl, now + skew]`.
pub fn check(policy: &RoutePolicy, req: &dyn RequestView, now_ms: u64) -> Result<(), Refusal> {
    let id_sent = !req.header_values(REQUEST_ID).is_empty();
    // Read as sent: an HTTP-date holds a comma, which the key's structured-field reading refuses.
    let first_sent = raw_single_header(req, FIRST_SENT).map_err(|e| match e {
        KeyError::Missing(why) | KeyError::Invalid(why) | KeyError::ScopeMissing(why) | KeyError::Unsupported(why) => {
            Refusal::Malformed(why)
        }
    })?;
    let sent = match (id_sent, first_sent) {
        (false, None) => return Ok(()),
        (true, None) => {
            return Err(Refusal::Malformed(format!(
            "{REQUEST_ID} came without {FIRST_SENT}; a repeatable request carries both (OASIS Repeatable Requests §5)"
        )))
        }
        (false, Some(_)) => {
            return Err(Refusal::Malformed(format!(
            "{FIRST_SENT} came without {REQUEST_ID}; a repeatable request carries both (OASIS Repeatable Requests §5)"
        )))
        }
        (true, Some(sent)) => sent,
    };
    let at = httpdate::parse_http_date(sent.trim()).map_err(|_| {
        Refusal::Malformed(format!(
            "{FIRST_SENT} {sent:?} is not an HTTP-date; send the IMF-fixdate form, e.g. \"Tue, 26 Mar 2019 16:06:51 GMT\""
        ))
    })?;
    let sent_ms = at.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let skew = policy.key.first_sent_skew.millis;
    let window = policy.key.ttl.millis.saturating_sub(skew);
    if sent_ms.saturating_add(window) < now_ms {
        return Err(Refusal::OutsideWindow(format!(
            "{FIRST_SENT} {sent} is more than {} s ago, before the {} s this gateway remembers requests for: \
             whether it already ran cannot be told; send it as a new request (a new {REQUEST_ID})",
            (now_ms - sent_ms) / 1000,
            window / 1000
        )));
    }
    if sent_ms > now_ms.saturating_add(skew) {
        return Err(Refusal::OutsideWindow(format!(
            "{FIRST_SENT} {sent} is {} s ahead of this gateway's clock (at most {} s allowed); check the client's clock",
            (sent_ms - now_ms) / 1000,
            skew / 1000
        )));
    }
    Ok(())
}

/// Marks an answer the gateway gives on a route that speaks the protocol: the request's result
/// (a replay, the first execution's answer the gateway delivers, the route's duplicate answer)
/// is `accepted`, the gateway's own refusals `rejected`.
pub fn mark(policy: &RoutePolicy, reply: &mut LocalReply) {
    let refused = reply.own.as_ref().is_some_and(|own| own.code != policy.duplicate.code);
    let result: &[u8] = if refused { b"rejected" } else { b"accepted" };
    reply.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(RESULT));
    reply.headers.push((RESULT.into(), result.to_vec()));
}

/// The status of a "same id, another request" answer: 400 (§5) instead of the route's 422.
pub const KEY_REUSED_STATUS: u16 = 400;
