//! Detached forwarding (`forward = "detached"`): the filter sends a claimed request upstream
//! itself, from the worker's root context, so a client that gives up cannot cancel it.
//!
//! Envoy resets the upstream request when the downstream client disconnects; an SDK that timed
//! out and retries then meets a claim whose outcome nobody knows. A callout owned by the root
//! context outlives the client, so its answer is always stored, and the retry is answered with
//! the first execution's result — as Stripe's own servers do.
//!
//! By default (`[detached] via = "reentry"`) the call goes to a cluster whose endpoint is an
//! Envoy internal listener with the same routes: the request re-enters Envoy and takes the route
//! the inline request would take — its rewrites, header mutations, the filters after idem, its
//! timeout and retry policy — with the headers the inline request carries. Envoy's async client
//! adds `x-envoy-internal: true`, which the internal listener's connection manager strips (its
//! peer is never an internal address). What it still gives up: streaming (request and response
//! are buffered whole), the router's access-log fields on the outer listener; header values must
//! be UTF-8 (Envoy's callout API takes text). `via = "cluster"` sends straight to the route's
//! cluster and gives up the route's rewrites, header mutations and filters as well.

use crate::engine::{Body, Ending};
use crate::pairs::Pair;
use crate::policy::DetachedVia;
use crate::response::{self, LocalReply};

/// Request headers not sent on the detached call: hop-by-hop ones (but `te: trailers`, which gRPC
/// needs end to end), `expect` (the callout sends the body at once), and — when the call goes
/// straight to the cluster, where no connection manager cleans them — Envoy's own control headers
/// (a client must not steer the callout). Through re-entry, Envoy's `x-envoy-*` headers travel as
/// they would inline, and the internal listener cleans them as the outer one did.
fn forwardable(name: &str, value: &[u8], via: DetachedVia) -> bool {
    if name == "te" {
        return value.eq_ignore_ascii_case(b"trailers");
    }
    if via == DetachedVia::Cluster && name.starts_with("x-envoy-") {
        return false;
    }
    name != "expect" && !response::HOP_BY_HOP.contains(&name)
}

/// The detached call's headers: the client's (pseudo-headers `:method`, `:path`, `:authority`
/// included), minus [`forwardable`]'s drops. `Err` names a header whose value is not UTF-8.
pub fn upstream_headers<'a>(
    request: impl IntoIterator<Item = (&'a [u8], &'a [u8])>,
    via: DetachedVia,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (n, v) in request {
        let name = String::from_utf8_lossy(n).to_ascii_lowercase();
        if !forwardable(&name, v, via) {
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
/// Envoy answers some failures itself; their text tells which — in the body of an HTTP answer, in
/// `grpc-message` of a gRPC one (the re-entered call is a gRPC call too): a timeout ("upstream
/// request timeout") leaves the outcome unknown, a connection failure or "no healthy upstream"
/// proves the request never reached the service.
pub fn ending(
    status: u16,
    headers: Vec<Pair>,
    body: Vec<u8>,
    trailers: Vec<Pair>,
    max_response_bytes: usize,
    grpc: bool,
) -> Ending {
    if status == 0 {
        return Ending::NoResponse { forwarded: true };
    }
    let grpc_message = headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(b"grpc-message")).map(|(_, v)| v.clone());
    let text: &[u8] = match (&grpc_message, grpc) {
        (Some(m), true) => m,
        _ => &body,
    };
    let from_envoy = grpc || status >= 500;
    let details = match text {
        b"upstream request timeout" if from_envoy => "upstream_response_timeout".to_string(),
        b if from_envoy && b.starts_with(b"no healthy upstream") => "no_healthy_upstream".to_string(),
        b if from_envoy && b.starts_with(b"upstream connect error") => {
            if contains(b, b"connection failure") || contains(b, b"connection refused") {
                "upstream_reset_before_response_started{connection_failure}".to_string()
            } else {
                "upstream_reset_before_response_started{remote_reset}".to_string()
            }
        }
        _ => "via_upstream".to_string(),
    };
    let lower = |p: Vec<Pair>| -> Vec<crate::response::Header> {
        p.into_iter().map(|(n, v)| (String::from_utf8_lossy(&n).to_ascii_lowercase(), v)).collect()
    };
    let body = if body.len() <= max_response_bytes { Body::Whole(body) } else { Body::TooLarge };
    Ending::Response { status, headers: lower(headers), body, trailers: lower(trailers), details, grpc }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
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
        return crate::replies::outcome_unknown(answers, first_seen_ms, held_until_ms);
    }
    // The first caller's own answer keeps its cookies (only replays drop them); what Envoy
    // recomputes for a local reply (length, date, hop-by-hop) is left out.
    let headers = headers
        .iter()
        .map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.clone()))
        .filter(|(n, _)| n == "set-cookie" || response::replayable_header(n))
        .collect();
    LocalReply { status, headers, body: body.to_vec(), ..Default::default() }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::pairs::Headers;

    #[test]
    fn detached_headers_are_the_inline_ones_through_reentry() {
        let req: Vec<Pair> = [
            (":method", "POST"),
            (":path", "/svc/order"),
            (":authority", "api.example.com"),
            ("x-request-id", "r-1"),
            ("x-envoy-external-address", "203.0.113.7"),
            ("te", "trailers"),
            ("connection", "keep-alive"),
            ("content-length", "12"),
            ("expect", "100-continue"),
            ("x-user-role", "admin"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
        let names = |via| {
            upstream_headers(Headers::from_pairs(&req).iter(), via)
                .unwrap()
                .into_iter()
                .map(|(n, _)| n)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(DetachedVia::Reentry),
            [":method", ":path", ":authority", "x-request-id", "x-envoy-external-address", "te", "x-user-role"]
        );
        // Straight to the cluster, no connection manager cleans Envoy's control headers: dropped.
        assert_eq!(
            names(DetachedVia::Cluster),
            [":method", ":path", ":authority", "x-request-id", "te", "x-user-role"]
        );
        let te_other: Vec<Pair> = vec![(b"te".to_vec(), b"gzip".to_vec())];
        assert!(upstream_headers(Headers::from_pairs(&te_other).iter(), DetachedVia::Reentry).unwrap().is_empty());
        let latin1: Vec<Pair> = vec![(b"x-name".to_vec(), b"r\xe9sum\xe9".to_vec())];
        assert_eq!(
            upstream_headers(Headers::from_pairs(&latin1).iter(), DetachedVia::Reentry),
            Err("x-name".to_string())
        );
    }
}
