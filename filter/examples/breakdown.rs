//! What one protected request costs idem, outside Envoy: the host calls it makes (each one a VM
//! exit in Envoy) and the bytes they copy, and the core's own time, natively. `make bench`
//! prints it beside the throughput cases; `scripts/bench-breakdown.sh` adds instruction counts
//! by component (SHA-256, encoding, JSON, formatting, allocation) under callgrind.
//!
//!     cargo run --release -p idem-filter --features fake-host --example breakdown [-- REQUESTS [CASE…]]
//!
//! Paths, as the bench drives them (wrk's headers and body):
//! - (c) shared store, a fresh key: claim, forward, capture, complete;
//! - (d) shared store, a replay;
//! - (e) Redis, a fresh key: claim through Webdis, forward, held answer, completion from the root;
//! - (f) Redis, a replay of an answer this Envoy keeps (no Webdis call).

use idem_filter::host::Host;
use idem_filter::lifecycle::{Stream, Worker};
use idem_filter::testing::{CountingHost, FakeHost, FakeStream};
use std::rc::Rc;
use std::time::Instant;

const SHARED: &str = r#"
[shared]
buckets = 4096
entries_per_bucket = 8
max_response_bytes = 4096

[[route]]
name = "bench-key"
match = { method = "POST", path = "/api/order/create" }

[route.key]
lock_ttl = "30s"
ttl = "24h"
"#;

const REDIS: &str = r#"
[redis]
cluster = "webdis"
basic_auth = "idem:bench"
prefix = "idem-bench:"

[[route]]
name = "bench-redis"
match = { method = "POST", path = "/api/order/create" }
store = "redis"

[route.key]
lock_ttl = "30s"
ttl = "10m"
"#;

/// Counts heap allocations (the harness' included), to show how many a request makes.
struct CountingAlloc;
static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

// SAFETY: forwards every call unchanged to the system allocator; only counts.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as it is.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

const ROOT: u32 = 1;
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

/// One request through the stream's callbacks, as Envoy makes them; on Redis, the Webdis replies
/// and the root's completion too.
fn one(fake: &FakeHost, host: &dyn Host, w: &Rc<Worker>, ctx: u32, key: &str, redis: bool) {
    fake.open(ctx, request(key));
    let mut s = Stream::new(Rc::clone(w), ctx);
    s.on_request_headers(host, false);
    s.on_request_body(host, BODY.len(), true);
    if redis && fake.take_acts().iter().any(|a| matches!(a, idem_filter::testing::Act::Dispatch { .. })) {
        fake.deliver(200, br#"{"SET":null}"#);
        s.on_call_response(host, 1, 12);
    }
    s.on_response_headers(host, false);
    s.on_response_body(host, ANSWER.len(), true);
    if redis {
        fake.enter(ROOT);
        w.on_queue_ready(host);
        for a in fake.take_acts() {
            if let idem_filter::testing::Act::Dispatch { token, .. } = a {
                fake.deliver(200, br#"{"EVAL":1}"#);
                w.on_call_response(host, token, 1, 10);
            }
        }
        fake.enter(ctx);
    }
    s.on_log(host);
    fake.close(ctx);
    fake.take_acts();
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let only: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    println!("idem's own cost per request, outside Envoy ({n} requests per path, core + in-memory host):");
    for (case, policy, redis, replay) in
        [("c", SHARED, false, false), ("d", SHARED, false, true), ("e", REDIS, true, false), ("f", REDIS, true, true)]
    {
        if !only.is_empty() && !only.contains(&case) {
            continue;
        }
        let fake = FakeHost::new(1_800_000_000_000);
        let counting = CountingHost::new(&fake);
        // Envoy's default level for the `wasm` component is info: debug lines are not formatted.
        fake.set_log_level(2);
        fake.enter(ROOT);
        let w = match Worker::configure(&fake, &fake, ROOT, policy.as_bytes()) {
            Ok(w) => Rc::new(w),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(2);
            }
        };
        if replay {
            one(&fake, &fake, &w, 2, "bench-replay", redis);
        }
        let key = |i: u32| if replay { "bench-replay".to_string() } else { format!("k-0-{i}") };
        // Host calls and bytes, counted on a sample.
        let sample = 1000.min(n);
        for i in 0..sample {
            one(&fake, &counting, &w, 10 + i, &key(i), redis);
        }
        let tally = counting.take();
        // The core's time, on the plain in-memory host.
        let allocs0 = ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
        let start = Instant::now();
        for i in sample..sample + n {
            one(&fake, &fake, &w, 10 + i, &key(i), redis);
        }
        let per_req_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(n);
        let allocs = (ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed) - allocs0) as f64 / f64::from(n);
        let calls: u64 = tally.iter().map(|t| t.1).sum();
        let bytes: u64 = tally.iter().map(|t| t.2).sum();
        let per = |x: u64| x as f64 / f64::from(sample);
        println!(
            "({case}) {:5.1} host calls/req, {:6.0} bytes across the boundary/req, core {:5.2} us/req natively, \
             {allocs:.0} allocations/req (harness included)",
            per(calls),
            per(bytes),
            per_req_us
        );
        let detail: Vec<String> =
            tally.iter().map(|(f, c, b)| format!("{f} {:.1} ({:.0} B)", per(*c), per(*b))).collect();
        println!("    {}", detail.join(", "));
    }
}
