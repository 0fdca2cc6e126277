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

    struct Root {
        callouts: Option<Rc<Callouts>>,
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
            }
            true
        }
        fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Floor { id, seen: 0, callouts: self.callouts.clone(), response_held: false }))
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
        response_held: bool,
    }

    impl Floor {
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
            self.seen += self.get_http_request_headers_bytes().len();
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
            self.seen += self.get_http_request_body(0, size).map_or(0, |b| b.len());
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
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { callouts: None }) });
    }}
}
