//! What one protected request costs idem, outside Envoy: the host calls it makes (each one a VM
//! exit in Envoy) and the bytes they copy, and the core's own time, natively. `make bench`
//! prints it beside the throughput cases; `scripts/breakdown.py` adds instruction counts
//! by component (SHA-256, encoding, JSON, formatting, allocation) under callgrind.
//!
//!     cargo run --release -p idem-filter --features fake-host --example breakdown [-- REQUESTS [CASE…]]
//!
//! Paths, as the bench drives them (wrk's headers and body):
//! - (c) shared store, a fresh key: claim, forward, capture, complete;
//! - (d) shared store, a replay;
//! - (e) Redis, a fresh key: claim through Webdis, forward, held answer, completion from the root;
//! - (f) Redis, a replay of an answer this Envoy keeps (no Webdis call).

use idem_filter::lifecycle::Worker;
use idem_filter::testing::bench::{drive, REDIS_POLICY, ROOT, SHARED_POLICY};
use idem_filter::testing::{CountingHost, FakeHost};
use std::rc::Rc;
use std::time::Instant;

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

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(20_000);
    let only: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    println!("idem's own cost per request, outside Envoy ({n} requests per path, core + in-memory host):");
    for (case, policy, redis, replay) in [
        ("c", SHARED_POLICY, false, false),
        ("d", SHARED_POLICY, false, true),
        ("e", REDIS_POLICY, true, false),
        ("f", REDIS_POLICY, true, true),
    ] {
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
            drive(&fake, &fake, &|| (), &w, 2, "bench-replay", redis);
        }
        let key = |i: u32| if replay { "bench-replay".to_string() } else { format!("k-0-{i}") };
        // Host calls and bytes, counted on a sample.
        let sample = 1000.min(n);
        for i in 0..sample {
            drive(&fake, &counting, &|| counting.entered(), &w, 10 + i, &key(i), redis);
        }
        let tally = counting.take();
        // The core's time, on the plain in-memory host.
        let allocs0 = ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed);
        let start = Instant::now();
        for i in sample..sample + n {
            drive(&fake, &fake, &|| (), &w, 10 + i, &key(i), redis);
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
