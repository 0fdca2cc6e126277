//! The upstream's answer to a forwarded request: captured as it streams (or held whole until
//! its record is written, on Redis), then the request's ticket is finished with it — stored,
//! released, or held as an unknown outcome.

use super::leases::LeaseOwner;
use super::replay;
use super::stream::{text, Phase, Stream};
use super::worker::parse_status;
use super::writes::After;
use super::Flow;
use crate::engine::{Body, Ending, Ticket};
use crate::host::{Host, Level};
use crate::pairs::Pair;
use crate::policy::RouteId;
use crate::repeatability;
use crate::response::{Header, Replayable};
use std::rc::Rc;

/// The response being captured for a forwarded request.
pub(super) struct Capture {
    status: u16,
    headers: Vec<Header>,
    body: Vec<u8>,
    /// Not storable whole (too large, or an HTTP answer ended with trailers): a tombstone is stored.
    too_large: bool,
    /// A gRPC answer's trailers (`grpc-status` and trailing metadata).
    trailers: Vec<Header>,
    grpc: bool,
    details: String,
    /// Held (buffered) until the root has written the outcome (Redis), so a retry after the
    /// client got its answer always finds it.
    holding: bool,
}

/// Responses whose headers wait until the root has written their ticket's outcome (a 5xx's
/// release on Redis): their body chunks are held too — continuing one would let the held headers
/// go with it (Envoy passes body chunks to a filter that paused the headers, and a `Continue`
/// there resumes the whole response). This concern's state.
#[derive(Default)]
pub(super) struct HeldResponses {
    held: std::cell::RefCell<super::Set<u32>>,
}

impl HeldResponses {
    pub(super) fn hold(&self, ctx: u32) {
        self.held.borrow_mut().insert(ctx);
    }

    /// The root resumes the response of `ctx` (or the stream ended).
    pub(super) fn release(&self, ctx: u32) {
        self.held.borrow_mut().remove(&ctx);
    }

    fn is_held(&self, ctx: u32) -> bool {
        self.held.borrow().contains(&ctx)
    }
}

/// Header names in lower case (values as bytes).
fn lowercase(pairs: Vec<Pair>) -> Vec<Header> {
    // Envoy's names are lower case UTF-8 already: lowered in place, not copied, in that case.
    let name = |n: Vec<u8>| {
        let mut name = String::from_utf8(n).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        name.make_ascii_lowercase();
        name
    };
    pairs.into_iter().map(|(n, v)| (name(n), v)).collect()
}

impl Stream {
    /// The upstream's response headers arrived.
    pub fn on_response_headers(&mut self, host: &dyn Host, end_of_stream: bool) -> Flow {
        self.take_handoff(host);
        if let Some(trailers) = self.worker.take_replay(self.context) {
            // The echo's answer to a gRPC replay: its trailers are added when it ends.
            if end_of_stream {
                host.log(Level::Error, "idem: a gRPC replay came back without a body; no trailers added");
            } else {
                self.phase = Phase::Replaying { trailers };
            }
            return Flow::Continue;
        }
        let Phase::Forwarded { route, ticket, key } = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return Flow::Continue;
        };
        let response = host.response_headers();
        let status = parse_status(response.get(b":status"));
        // Whether Envoy answered itself (and why): for gRPC, its answers are 200s too.
        let grpc = self.request.grpc;
        let repeatable = repeatability::speaks(self.worker.engine.policy(route));
        let details = if status >= 500 || grpc || repeatable {
            text(host.property(&["response", "code_details"]))
        } else {
            String::new()
        };
        // The first execution's own answer, from the service (its replays are marked where they
        // are made); not Envoy's own answer, nor one the service marked itself.
        let marked = || response.iter().any(|(n, _)| n.eq_ignore_ascii_case(repeatability::RESULT.as_bytes()));
        if repeatable && crate::engine::is_upstream_answer(&details) && !marked() {
            if let Err(e) = host.set_response_header(repeatability::RESULT, b"accepted") {
                host.log(Level::Warn, &format!("idem: cannot set {}: {e:?}", repeatability::RESULT));
            }
        }
        // Only what a replay may carry is kept (`StoredResponse::new` keeps the same).
        let headers = Replayable::copy(&response);
        let holding = ticket.store_ticket().written_by_call();
        let capture =
            Capture { status, headers, body: Vec::new(), too_large: false, details, holding, trailers: vec![], grpc };
        if status >= 500 && !grpc {
            // A 5xx decides the ticket at its headers, whatever its body (released; held when
            // Envoy answered and the service may have run): written before the headers go, so a
            // client or a sidecar that retries the instant they arrive meets the key released,
            // not still claimed. On Redis the headers (and the body after them) wait for the write.
            let flow = self.finish(host, route, ticket, key, capture.into_ending(false), holding);
            if flow == Flow::Pause {
                self.worker.held_responses.hold(self.context);
            }
            return flow;
        }
        self.phase = Phase::Capturing { route, ticket, key, capture };
        if end_of_stream {
            return self.finish_capture(host);
        }
        // The headers go on even when the answer is held: holding the body is enough to keep
        // the client from the complete answer until the record is written, and a pause here
        // would starve the body callbacks without allow_on_headers_stop_iteration (Envoy turns
        // it into StopAllIteration: the body is buffered and never reaches the filter).
        Flow::Continue
    }

    /// A response body chunk arrived; `size` is the chunk (streaming) or everything buffered
    /// so far (while holding).
    pub fn on_response_body(&mut self, host: &dyn Host, size: usize, end_of_stream: bool) -> Flow {
        if self.worker.held_responses.is_held(self.context) {
            return Flow::Pause;
        }
        if let (Phase::Replaying { trailers }, true) = (&self.phase, end_of_stream) {
            replay::add_trailers(host, trailers);
            self.phase = Phase::Idle;
            return Flow::Continue;
        }
        let Phase::Capturing { route, capture, .. } = &mut self.phase else {
            return Flow::Continue;
        };
        let limit = self.worker.engine.policy(*route).max_response_bytes as usize;
        // A gRPC answer ends with its trailers: its body streams (captured chunk by chunk), and it
        // is held at the trailers instead, which end the call for the client.
        if capture.holding && !capture.grpc {
            // Envoy buffers and calls again with the cumulative size; read the whole body once.
            if size > limit {
                // Too large to remember (a tombstone): stop holding, let it stream.
                capture.holding = false;
                capture.too_large = true;
            } else if !end_of_stream {
                return Flow::Pause;
            } else {
                capture.body = host.response_body(size).unwrap_or_default();
                return self.finish_capture(host);
            }
        }
        if !capture.too_large && size > 0 {
            // Not pausing: each call carries only the new chunk, and the client is not delayed.
            match host.response_body(size) {
                Some(chunk) if capture.body.len() + chunk.len() <= limit => capture.body.extend_from_slice(&chunk),
                Some(_) => {
                    capture.too_large = true;
                    capture.body = Vec::new();
                }
                None => {}
            }
        }
        if end_of_stream {
            return self.finish_capture(host);
        }
        Flow::Continue
    }

    /// Response trailers arrived. A gRPC answer's trailers (its status) are kept and replayed
    /// with it. An HTTP answer with trailers is never stored whole (a replay without its trailers
    /// would be another answer): its body counts as too large, so a status the route remembers
    /// is kept as a tombstone (a repeat gets the duplicate answer), and a route that needs
    /// `success_body_contains` releases the key, since the marker cannot be checked.
    pub fn on_response_trailers(&mut self, host: &dyn Host) -> Flow {
        if self.worker.held_responses.is_held(self.context) {
            return Flow::Pause;
        }
        if let Phase::Capturing { capture, .. } = &mut self.phase {
            if capture.grpc {
                // A gRPC answer ends with its status: kept, and replayed with the message.
                capture.trailers = lowercase(host.response_trailers());
            } else {
                capture.too_large = true;
                capture.details = "trailers".into();
            }
        }
        self.finish_capture(host)
    }

    // ---- finishing

    fn finish_capture(&mut self, host: &dyn Host) -> Flow {
        match std::mem::replace(&mut self.phase, Phase::Idle) {
            Phase::Capturing { route, ticket, key, capture } => {
                let held = capture.holding;
                self.finish(host, route, ticket, key, capture.into_ending(false), held)
            }
            other => {
                self.phase = other;
                Flow::Continue
            }
        }
    }

    /// Reports how the forwarded request ended. On Redis the write is handed to the root
    /// context, which reads its reply and retries it whatever becomes of the stream, and whose
    /// wake-up gathers the writes of concurrent streams into one call (sending each from its
    /// stream at once took group commit away: 2.00 Webdis calls per request at 4 connections,
    /// against 1.5, and more CPU per request; sending it at once only while no write call is out
    /// saved the hop for a sequential client, 2 % of its instructions, but cost (e-c4) p50 and CPU:
    /// docs/benchmarks.md, "The root hop, tried and dropped").
    /// Pauses when the response is held until the root has written the outcome.
    pub(super) fn finish(
        &mut self,
        host: &dyn Host,
        route: RouteId,
        ticket: Ticket,
        key: Option<String>,
        ending: Ending,
        held: bool,
    ) -> Flow {
        let w = Rc::clone(&self.worker);
        w.leases.forget(LeaseOwner::Stream(self.context));
        self.phase = Phase::Idle;
        let after = if held { After::Resume(self.context) } else { After::Nothing };
        match w.finish_ticket(host, route, &ticket, key, ending, after) {
            // Written (or nothing to write): this callback lets the response go on.
            Some(_) => Flow::Continue,
            // Queued: a held response waits for the root to resume it.
            None if held => Flow::Pause,
            None => Flow::Continue,
        }
    }
}

impl Capture {
    /// How the response ended: `cut` when the stream ended before the body did.
    pub(super) fn into_ending(self, cut: bool) -> Ending {
        let body = match (cut, self.too_large) {
            (true, _) => Body::Cut,
            (false, true) => Body::TooLarge,
            (false, false) => Body::Whole(self.body),
        };
        Ending::Response {
            status: self.status,
            headers: self.headers,
            body,
            trailers: self.trailers,
            details: self.details,
            grpc: self.grpc,
        }
    }
}
