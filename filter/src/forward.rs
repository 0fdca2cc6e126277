//! Detached forwarding (`forward = "detached"`): the filter sends a claimed request upstream
//! itself, from the worker's root context, so a client that gives up cannot cancel it.
//!
//! Envoy resets the upstream request when the downstream client disconnects; an SDK that timed
//! out and retries then meets a claim whose outcome nobody knows. A callout owned by the root
//! context outlives the client, so its answer is always stored, and the retry is answered with
//! the first execution's result — as Stripe's own servers do.
//!
//! What it gives up, compared with Envoy's router: streaming (request and response are buffered
//! whole), the route's retry policy, header mutations and other filters after this one, and the
//! router's access-log fields; header values must be UTF-8 (Envoy's callout API takes text).

use crate::engine::Ending;
use crate::pairs::Pair;
use crate::response::{self, LocalReply};

/// Request headers not sent on the detached call: hop-by-hop ones, `expect` (the callout sends
/// the body at once), and Envoy's own control headers (a client must not steer the callout).
fn forwardable(name: &str) -> bool {
    !name.starts_with("x-envoy-") && name != "expect" && !response::HOP_BY_HOP.contains(&name)
}

/// The detached call's headers: the client's (pseudo-headers `:method`, `:path`, `:authority`
/// included), minus [`forwardable`]'s drops. `Err` names a header whose value is not UTF-8.
pub fn upstream_headers(request: &[Pair]) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::with_capacity(request.len());
    for (n, v) in request {
        let name = String::from_utf8_lossy(n).to_ascii_lowercase();
        if !forwardable(&name) {
            continue;
        }
        match std::str::from_utf8(v) {
            Ok(value) => out.push((name, value.to_string())),
            Err(_) => return Err(name),
        }
    }
    Ok(out)
}

/// How the detached call ended. `status` 0 is a callout failure (reset, or no answer in time).
///
/// Envoy's async client answers some failures itself; its bodies tell which: a timeout (504
/// "upstream request timeout") leaves the outcome unknown, a connection failure or "no healthy
/// upstream" proves the request never reached the service.
pub fn ending(status: u16, headers: Vec<Pair>, body: Vec<u8>, max_response_bytes: usize) -> Ending {
    if status == 0 {
        return Ending::NoResponse { forwarded: true };
    }
    let details = match (status, body.as_slice()) {
        (504, b"upstream request timeout") => "upstream_response_timeout".to_string(),
        (503, b) if b.starts_with(b"no healthy upstream") => "no_healthy_upstream".to_string(),
        (503, b) if b.starts_with(b"upstream connect error") => {
            if b.windows(18).any(|w| w == b"connection failure") || b.windows(17).any(|w| w == b"connection refused") {
                "upstream_reset_before_response_started{connection_failure}".to_string()
            } else {
                "upstream_reset_before_response_started{remote_reset}".to_string()
            }
        }
        _ => "via_upstream".to_string(),
    };
    let headers = headers.into_iter().map(|(n, v)| (String::from_utf8_lossy(&n).to_ascii_lowercase(), v)).collect();
    let body = (body.len() <= max_response_bytes).then_some(body);
    Ending::Response { status, headers, body, details }
}

/// What the waiting client gets once the detached call ended: the upstream's answer with its
/// replayable headers (whole, even when too large to store), or the unknown-outcome answer.
pub fn answer(
    answers: &crate::answers::Answers,
    status: u16,
    headers: &[Pair],
    body: &[u8],
    first_seen_ms: u64,
    held_until_ms: u64,
) -> LocalReply {
    if status == 0 {
        return response::outcome_unknown(answers, first_seen_ms, held_until_ms);
    }
    // The first caller's own answer keeps its cookies (only replays drop them); what Envoy
    // recomputes for a local reply (length, date, hop-by-hop) is left out.
    let headers = headers
        .iter()
        .map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.clone()))
        .filter(|(n, _)| n == "set-cookie" || response::replayable_header(n))
        .collect();
    LocalReply { status, headers, body: body.to_vec() }
}
