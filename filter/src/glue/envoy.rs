//! The host on Envoy: the core's [`Host`] and [`Setup`] on the raw ABI ([`super::abi`]).

use super::abi;
use crate::host::{Host, HostError, Level, Setup};
use crate::pairs::Pair;
use crate::response::LocalReply;
use std::cell::Cell;

/// [`Host`] on Envoy's hostcalls, made anew for each callback ([`Envoy::entered`]): the clock is
/// read once per callback, not once per use (each read is a VM exit), which is as fine as leases
/// and deadlines in milliseconds need.
#[derive(Default)]
pub(super) struct Envoy {
    now_ms: Cell<Option<u64>>,
}

impl Envoy {
    /// The host for one callback.
    pub(super) fn entered() -> Self {
        Envoy::default()
    }
}

fn failed(call: &str) -> impl Fn(abi::Status) -> HostError + '_ {
    move |s| HostError::Failed(format!("{call}: status {s}"))
}

impl Host for Envoy {
    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = abi::now_ms().unwrap_or(0);
        self.now_ms.set(Some(now));
        now
    }
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        abi::shared_get(key).map_err(failed("get_shared_data"))
    }
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        match abi::shared_set(key, value, cas.unwrap_or(0)) {
            Ok(()) => Ok(()),
            Err(abi::CAS_MISMATCH) => Err(HostError::CasMismatch),
            Err(s) => Err(failed("set_shared_data")(s)),
        }
    }
    fn random_u64(&self) -> Result<u64, HostError> {
        crate::host::owner_id(|| getrandom::u64().map_err(|e| HostError::Failed(format!("random_get: {e}"))))
    }
    /// Tokens must be unguessable: straight from WASI `random_get` (Envoy: BoringSSL `RAND_bytes`).
    fn random_token(&self) -> Result<[u8; 16], HostError> {
        let mut out = [0u8; 16];
        getrandom::fill(&mut out).map_err(|e| HostError::Failed(format!("random_get: {e}")))?;
        Ok(out)
    }
    fn log(&self, level: Level, message: &str) {
        abi::log(level as u32, message);
    }
    fn define_counter(&self, name: &str) -> Option<u32> {
        abi::define_metric(0, name).ok()
    }
    fn count(&self, counter: u32) {
        abi::increment(counter, 1);
    }
    fn define_histogram(&self, name: &str) -> Option<u32> {
        abi::define_metric(2, name).ok()
    }
    fn record(&self, histogram: u32, value: u64) {
        abi::record(histogram, value);
    }
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        abi::dispatch(cluster, headers, body, timeout_ms).map_err(failed("dispatch_http_call"))
    }
    fn enqueue(&self, queue: u32) {
        let _ = abi::enqueue(queue, b"1");
    }
    fn set_effective_context(&self, context: u32) -> Result<(), HostError> {
        abi::set_effective_context(context).map_err(failed("set_effective_context"))
    }
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        abi::header(abi::map::REQUEST_HEADERS, name).ok().flatten()
    }
    fn request_headers(&self) -> crate::pairs::Headers {
        abi::header_block(abi::map::REQUEST_HEADERS).unwrap_or_default()
    }
    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        abi::buffer(abi::buffer::REQUEST_BODY, 0, size).ok().flatten()
    }
    fn response_headers(&self) -> crate::pairs::Headers {
        abi::header_block(abi::map::RESPONSE_HEADERS).unwrap_or_default()
    }
    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        abi::buffer(abi::buffer::RESPONSE_BODY, 0, size).ok().flatten()
    }
    fn response_trailers(&self) -> Vec<Pair> {
        abi::headers(abi::map::RESPONSE_TRAILERS).unwrap_or_default()
    }
    fn call_trailers(&self) -> Vec<Pair> {
        abi::headers(abi::map::CALL_RESPONSE_TRAILERS).unwrap_or_default()
    }
    fn call_response(&self, num_headers: usize, body_size: usize) -> (crate::pairs::Headers, Vec<u8>) {
        // A failed call (reset, timeout, no cluster) has no headers at all.
        let headers = if num_headers == 0 {
            crate::pairs::Headers::default()
        } else {
            abi::header_block(abi::map::CALL_RESPONSE_HEADERS).unwrap_or_default()
        };
        let body = abi::buffer(abi::buffer::CALL_RESPONSE_BODY, 0, body_size).ok().flatten().unwrap_or_default();
        (headers, body)
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        abi::property(path).ok().flatten()
    }
    fn set_property(&self, name: &str, value: &[u8]) {
        let _ = abi::set_property(name, value);
    }
    fn send_reply(&self, reply: LocalReply) -> Result<(), HostError> {
        abi::send_response(reply.status, &reply.headers, &reply.body, reply.grpc_status)
            .map_err(failed("send_local_response"))
    }
    fn resume_request(&self) -> Result<(), HostError> {
        abi::resume_request().map_err(failed("continue_stream"))
    }
    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        abi::replace_header(abi::map::REQUEST_HEADERS, name, value).map_err(failed("replace_header_map_value"))
    }
    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        abi::remove_header(abi::map::REQUEST_HEADERS, name).map_err(failed("remove_header_map_value"))
    }
    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        abi::replace_header(abi::map::RESPONSE_HEADERS, name, value).map_err(failed("replace_header_map_value"))
    }
    fn add_response_trailer(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        abi::add_header(abi::map::RESPONSE_TRAILERS, name, value).map_err(failed("add_header_map_value"))
    }
    fn resume_response(&self) -> Result<(), HostError> {
        abi::resume_response().map_err(failed("continue_stream"))
    }
}

impl Setup for Envoy {
    fn define_counter(&self, name: &str) -> Option<u32> {
        abi::define_metric(0, name).ok()
    }
    fn register_queue(&self, name: &str) -> Option<u32> {
        abi::register_queue(name).ok()
    }
    fn start_ticks(&self, period_ms: u64) -> Result<(), HostError> {
        abi::set_tick_period_ms(period_ms.min(u64::from(u32::MAX)) as u32).map_err(failed("set_tick_period"))
    }
    fn log_level(&self) -> u32 {
        abi::log_level().unwrap_or(0)
    }
}
