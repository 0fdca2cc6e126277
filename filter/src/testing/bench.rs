//! The request `make bench` sends (wrk's headers and body), run through the core as Envoy runs
//! it: shared by the breakdown example (`filter/examples/breakdown.rs`) and the host-call budget
//! test, so both count the same path.

use super::{Act, FakeHost, FakeStream};
use crate::host::Host;
use crate::lifecycle::{Stream, Worker};
use std::rc::Rc;

/// Case (c)/(d): the shared store (`bench/scenario/shared.toml`, which `scripts/bench.py` reads).
pub const SHARED_POLICY: &str = include_str!("../../../bench/scenario/shared.toml");

/// Case (e)/(f): Redis through Webdis (`bench/scenario/redis-route.toml` after this host's
/// `[redis]` table).
pub const REDIS_POLICY: &str = concat!(
    "[redis]\ncluster = \"webdis\"\nbasic_auth = \"idem:bench\"\nprefix = \"idem-bench:\"\n\n",
    include_str!("../../../bench/scenario/redis-route.toml")
);

/// The root context's id.
pub const ROOT: u32 = 1;
const BODY: &[u8] = br#"{"sku":"A1","qty":1}"#;
const ANSWER: &[u8] = br#"{"ok":true}"#;

fn request(key: &str) -> FakeStream {
    let headers: [(&str, &[u8]); 6] = [
        (":authority", b"127.0.0.1:10000"),
        ("idempotency-key", key.as_bytes()),
        ("content-type", b"application/json"),
        ("authorization", b"Bearer bench"),
        ("content-length", b"20"),
        ("x-request-id", b"5e0c3c58-4a0f-4b7e-9a53-3c1b0c8f7d21"),
    ];
    FakeStream::request("POST", "/api/order/create", &headers, BODY).with_response(
        200,
        &[("content-type", b"application/json"), ("content-length", b"11"), ("date", b"Tue, 01 Dec 2026 14:00:00 GMT")],
        ANSWER,
    )
}

/// One request through the stream's callbacks, as Envoy makes them; on Redis, the Webdis
/// replies and the root's completion too. `entered` runs before each callback.
pub fn drive(fake: &FakeHost, host: &dyn Host, entered: &dyn Fn(), w: &Rc<Worker>, ctx: u32, key: &str, redis: bool) {
    fake.open(ctx, request(key));
    let mut s = Stream::new(Rc::clone(w), ctx);
    entered();
    s.on_request_headers(host, false);
    entered();
    s.on_request_body(host, BODY.len(), true);
    if redis && fake.take_acts().iter().any(|a| matches!(a, Act::Dispatch { .. })) {
        let token = s.call_out().unwrap_or(0);
        fake.deliver_to(token, 200, br#"{"SET":null}"#);
        // Delivered: the call is over (Envoy's, and the fake host's, record of it goes).
        fake.take_callout(token);
        entered();
        s.on_call_response(host, token, 1, 12);
    }
    entered();
    s.on_response_headers(host, false);
    entered();
    s.on_response_body(host, ANSWER.len(), true);
    if redis {
        fake.enter(ROOT);
        entered();
        w.on_queue_ready(host);
        for a in fake.take_acts() {
            if let Act::Dispatch { token, .. } = a {
                fake.take_callout(token);
                fake.deliver_to(token, 200, br#"{"EVAL":1}"#);
                entered();
                w.on_call_response(host, token, 1, 10);
            }
        }
        fake.enter(ctx);
    }
    entered();
    s.on_log(host);
    fake.close(ctx);
    fake.take_acts();
}
