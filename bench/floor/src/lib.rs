//! The floor of a body-buffering Wasm filter, for `make bench` only (never shipped).
//!
//! It makes Envoy do what idem's protected path (case (c): shared store, fresh key) makes it do,
//! and nothing of the idempotency work: pause at the request headers and read them, hold the
//! request until the whole body is buffered and read it once, read the response headers and
//! each response body chunk as it streams, set one filter-state value — the same VM entries and
//! the same copies across the ABI. No hashing, no shared data, no counters, no logging. The
//! difference between its cost and idem's is what idem itself costs.
//!
//! With the plugin configuration `callouts <cluster> <basic auth>` it is the floor of the Redis
//! path (case (e)) instead: the request waits for one Webdis call (`SET k v NX PX 30000 GET`, a
//! fresh key each time) before it goes upstream, and the response is held until its end and a
//! second Webdis call (a `SET` of a value the size of the answer) has been answered — the two
//! round trips through Envoy's async HTTP client that a fresh key costs idem on Redis.
//!
//! With `store` it is (c0) plus the host calls a fresh key costs idem on the shared store and
//! nothing else (`scripts/breakdown.py --envoy`, cases (c0s), (c0sh)): a bucket read, a
//! compare-and-swap write of the bucket and a write of the answer's slot (the sizes idem's take),
//! the clock once per callback, two counters. `sha256` adds the SHA-256 of a scoped id over the
//! bytes idem hashes for the bench's request (route, scope part, `Authorization`, key, framed as
//! idem frames them), and `xxh3` the xxh3-128 of the body (idem's fingerprint). It tells how much
//! of (c)'s cost over (c0) a shared-data store and the two digests take before any of idem's logic.

#[cfg(target_arch = "wasm32")]
mod floor {
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType};
    use std::rc::Rc;

    /// Where the callouts go, when the configuration asks for them.
    struct Callouts {
        cluster: String,
        auth: String,
    }

    /// The shared-data operations of a fresh key (mode `store`).
    struct Store {
        counters: [u32; 2],
        sha256: bool,
        xxh3: bool,
    }

    /// Buckets and bucket size of the bench's store (bench/scenario/shared.toml: 16 384 × 8
    /// entries of 60 bytes and a header).
    const BUCKETS: u32 = 16_384;
    const BUCKET_BYTES: usize = 488;
    const SLOT_BYTES: usize = 100;

    struct Root {
        callouts: Option<Rc<Callouts>>,
        store: Option<Rc<Store>>,
    }
    impl Context for Root {}
    impl RootContext for Root {
        fn on_configure(&mut self, _size: usize) -> bool {
            let config = self.get_plugin_configuration().unwrap_or_default();
            let text = String::from_utf8_lossy(&config);
            let mut words = text.split_whitespace();
            if words.next() == Some("callouts") {
                let cluster = words.next().unwrap_or("webdis").to_string();
                let auth = words.next().unwrap_or("").to_string();
                self.callouts = Some(Rc::new(Callouts { cluster, auth }));
            } else if text.split_whitespace().next() == Some("store") {
                let sha256 = text.split_whitespace().any(|w| w == "sha256");
                let xxh3 = text.split_whitespace().any(|w| w == "xxh3");
                let mut counters = [0; 2];
                for (i, name) in ["floor_requests", "floor_stored"].iter().enumerate() {
                    counters[i] =
                        proxy_wasm::hostcalls::define_metric(proxy_wasm::types::MetricType::Counter, name).unwrap_or(0);
                }
                // Every bucket exists before the first request, as idem's store creates them.
                let empty = vec![b'.'; BUCKET_BYTES];
                for b in 0..BUCKETS {
                    let _ = self.set_shared_data(&format!("idem-floor:b:{b}"), Some(&empty), None);
                }
                self.store = Some(Rc::new(Store { counters, sha256, xxh3 }));
            }
            true
        }
        fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Floor {
                id,
                seen: 0,
                callouts: self.callouts.clone(),
                store: self.store.clone(),
                response_held: false,
                auth: Vec::new(),
                key: Vec::new(),
            }))
        }
        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    struct Floor {
        id: u32,
        /// Bytes read across the ABI, so the reads are not optimised away.
        seen: usize,
        callouts: Option<Rc<Callouts>>,
        store: Option<Rc<Store>>,
        response_held: bool,
        /// `Authorization` and `Idempotency-Key`, kept for the scoped id (mode `sha256`).
        auth: Vec<u8>,
        key: Vec<u8>,
    }

    impl Floor {
        /// A fresh key's claim: the clock, the bucket read and its compare-and-swap write, a
        /// counter; with `sha256`, the scoped id first.
        fn claim(&mut self, store: &Store, body: &[u8]) {
            let now = self.get_current_time();
            if store.xxh3 {
                let mut h = xxhash_rust::xxh3::Xxh3Default::new();
                for part in [&b"POST"[..], b"/api/order/create", body] {
                    h.update(&(part.len() as u64).to_le_bytes());
                    h.update(part);
                }
                self.seen += (h.digest128() & 1) as usize;
            }
            if store.sha256 {
                use sha2::Digest;
                let mut h = sha2::Sha256::new();
                for part in [&b"bench-key"[..], b"header:authorization", &self.auth, &self.key] {
                    h.update((part.len() as u64).to_le_bytes());
                    h.update(part);
                }
                h.update(1u64.to_le_bytes());
                self.seen += usize::from(h.finalize()[0]);
            }
            let bucket = format!("idem-floor:b:{}", self.id % BUCKETS);
            let (value, cas) = self.get_shared_data(&bucket);
            let mut value = value.unwrap_or_default();
            value.truncate(BUCKET_BYTES);
            value.resize(BUCKET_BYTES, b'.');
            let stamp = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis()).to_string();
            let n = stamp.len().min(value.len());
            value[..n].copy_from_slice(&stamp.as_bytes()[..n]);
            let _ = self.set_shared_data(&bucket, Some(&value), cas);
            let _ = proxy_wasm::hostcalls::increment_metric(store.counters[0], 1);
        }

        /// Its completion: the clock, the answer's slot written alone, a counter.
        fn complete(&mut self, store: &Store) {
            let _ = self.get_current_time();
            let slot = vec![b'S'; SLOT_BYTES];
            let _ = self.set_shared_data(&format!("idem-floor:s:{}", self.id % BUCKETS), Some(&slot), None);
            let _ = proxy_wasm::hostcalls::increment_metric(store.counters[1], 1);
        }

        /// One Webdis call; `true` if it went out (the stream then waits for its answer).
        fn call(&self, body: &str) -> bool {
            let Some(c) = &self.callouts else {
                return false;
            };
            let auth = format!("Basic {}", c.auth);
            let headers = vec![
                (":method", "POST"),
                (":path", "/"),
                (":authority", "webdis"),
                ("content-type", "text/plain"),
                ("authorization", auth.as_str()),
            ];
            let timeout = std::time::Duration::from_millis(500);
            self.dispatch_http_call(&c.cluster, headers, Some(body.as_bytes()), vec![], timeout).is_ok()
        }
    }

    impl Context for Floor {
        fn on_http_call_response(&mut self, _token: u32, _headers: usize, body_size: usize, _trailers: usize) {
            self.seen += self.get_http_call_response_body(0, body_size).map_or(0, |b| b.len());
            if self.response_held {
                self.resume_http_response();
            } else {
                self.resume_http_request();
            }
        }
    }

    impl HttpContext for Floor {
        fn on_http_request_headers(&mut self, _n: usize, end_of_stream: bool) -> Action {
            let headers = self.get_http_request_headers_bytes();
            self.seen += headers.len();
            if self.store.as_ref().is_some_and(|s| s.sha256) {
                // The scoped id's inputs, from the one read of the headers (as idem reads them).
                for (name, value) in headers {
                    match name.as_str() {
                        "authorization" => self.auth = value,
                        "idempotency-key" => self.key = value,
                        _ => {}
                    }
                }
            }
            if end_of_stream {
                Action::Continue
            } else {
                Action::Pause
            }
        }
        fn on_http_request_body(&mut self, size: usize, end_of_stream: bool) -> Action {
            if !end_of_stream {
                return Action::Pause;
            }
            let body = self.get_http_request_body(0, size).unwrap_or_default();
            self.seen += body.len();
            if let Some(store) = self.store.clone() {
                self.claim(&store, &body);
            }
            self.set_property(vec!["floor_seen"], Some(self.seen.to_string().as_bytes()));
            let claim = format!("SET/idem-floor%3A{}%3A{}/I%7Cfloor/NX/PX/30000/GET", self.id, self.seen);
            if self.call(&claim) {
                return Action::Pause;
            }
            Action::Continue
        }
        fn on_http_response_headers(&mut self, _n: usize, _end_of_stream: bool) -> Action {
            self.seen += self.get_http_response_headers_bytes().len();
            Action::Continue
        }
        fn on_http_response_body(&mut self, size: usize, end_of_stream: bool) -> Action {
            if self.callouts.is_none() {
                self.seen += self.get_http_response_body(0, size).map_or(0, |b| b.len());
                if let (true, Some(store)) = (end_of_stream, self.store.clone()) {
                    self.complete(&store);
                }
                return Action::Continue;
            }
            // As idem on Redis: the answer is held whole until its record is written.
            if !end_of_stream {
                return Action::Pause;
            }
            let body = self.get_http_response_body(0, size).unwrap_or_default();
            let value = "C".repeat(body.len() * 4 / 3 + 64);
            let write = format!("SET/idem-floor%3A{}%3A{}/{value}/PX/600000", self.id, self.seen);
            if self.call(&write) {
                self.response_held = true;
                return Action::Pause;
            }
            Action::Continue
        }
    }

    proxy_wasm::main! {{
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { callouts: None, store: None }) });
    }}
}
