//! The floor of a body-buffering Wasm filter, for `make bench` only (never shipped).
//!
//! It makes Envoy do what idem's protected path (case (c): shared store, fresh key) makes it do,
//! and nothing of the idempotency work: pause at the request headers and read them, hold the
//! request until the whole body is buffered and read it once, read the response headers and
//! each response body chunk as it streams, set one filter-state value — the same VM entries and
//! the same copies across the ABI. No hashing, no shared data, no counters, no logging. The
//! difference between its cost and idem's is what idem itself costs.

#[cfg(target_arch = "wasm32")]
mod floor {
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, ContextType};

    struct Root;
    impl Context for Root {}
    impl RootContext for Root {
        fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Floor { seen: 0 }))
        }
        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    struct Floor {
        /// Bytes read across the ABI, so the reads are not optimised away.
        seen: usize,
    }
    impl Context for Floor {}
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
            Action::Continue
        }
        fn on_http_response_headers(&mut self, _n: usize, _end_of_stream: bool) -> Action {
            self.seen += self.get_http_response_headers_bytes().len();
            Action::Continue
        }
        fn on_http_response_body(&mut self, size: usize, _end_of_stream: bool) -> Action {
            self.seen += self.get_http_response_body(0, size).map_or(0, |b| b.len());
            Action::Continue
        }
    }

    proxy_wasm::main! {{
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
    }}
}
