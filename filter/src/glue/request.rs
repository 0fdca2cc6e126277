//! The HTTP context: each proxy-wasm callback becomes an event of the request's
//! [`Stream`](crate::lifecycle::Stream).

use super::envoy::Envoy;
use crate::lifecycle::{Flow, Stream};
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

pub(super) struct Request(pub(super) Stream);

fn action(flow: Flow) -> Action {
    match flow {
        Flow::Continue => Action::Continue,
        Flow::Pause => Action::Pause,
    }
}

impl Context for Request {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        self.0.on_call_response(&Envoy::entered(), num_headers, body_size);
    }
}

impl HttpContext for Request {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        action(self.0.on_request_headers(&Envoy::entered(), end_of_stream))
    }
    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        action(self.0.on_request_body(&Envoy::entered(), body_size, end_of_stream))
    }
    fn on_http_request_trailers(&mut self, _num_trailers: usize) -> Action {
        action(self.0.on_request_trailers(&Envoy::entered()))
    }
    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        action(self.0.on_response_headers(&Envoy::entered(), end_of_stream))
    }
    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        action(self.0.on_response_body(&Envoy::entered(), body_size, end_of_stream))
    }
    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        action(self.0.on_response_trailers(&Envoy::entered()))
    }
    fn on_log(&mut self) {
        self.0.on_log(&Envoy::entered());
    }
}
