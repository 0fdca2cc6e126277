//! [`CountingHost`]: what the core asks of a host, counted.

use super::lock;
use crate::host::{Host, HostError, Level, Setup};
use crate::pairs::Pair;
use crate::response::LocalReply;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// A host that counts what the core asks of it: calls per host function and the bytes that
/// cross the boundary (both ways), then does it on the host it wraps. The cost model of a
/// request for `make bench`'s breakdown and for the host-call budget test: in Envoy every call
/// is a VM exit, and every byte a copy.
pub struct CountingHost<'a, H: Host + Setup> {
    inner: &'a H,
    tally: Mutex<std::collections::BTreeMap<&'static str, (u64, u64)>>,
    clock_read: AtomicBool,
}

impl<'a, H: Host + Setup> CountingHost<'a, H> {
    pub fn new(inner: &'a H) -> Self {
        CountingHost { inner, tally: Mutex::new(Default::default()), clock_read: AtomicBool::new(false) }
    }
    /// A new callback begins: Envoy's glue reads the clock at most once per callback.
    pub fn entered(&self) {
        self.clock_read.store(false, Ordering::SeqCst);
    }
    fn add(&self, call: &'static str, bytes: usize) {
        let mut t = lock(&self.tally);
        let e = t.entry(call).or_default();
        e.0 += 1;
        e.1 += bytes as u64;
    }
    /// `(host function, calls, bytes)`, by name; and forgets them.
    pub fn take(&self) -> Vec<(&'static str, u64, u64)> {
        std::mem::take(&mut *lock(&self.tally)).into_iter().map(|(k, (n, b))| (k, n, b)).collect()
    }
}

fn pairs_len(p: &[Pair]) -> usize {
    p.iter().map(|(n, v)| n.len() + v.len()).sum()
}

impl<H: Host + Setup> Host for CountingHost<'_, H> {
    fn now_ms(&self) -> u64 {
        if !self.clock_read.swap(true, Ordering::SeqCst) {
            self.add("get_current_time", 8);
        }
        self.inner.now_ms()
    }
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        let r = self.inner.shared_get(key);
        let n = r.as_ref().ok().and_then(|v| v.as_ref()).map_or(0, |(v, _)| v.len());
        self.add("get_shared_data", key.len() + n);
        r
    }
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        self.add("set_shared_data", key.len() + value.len());
        self.inner.shared_set(key, value, cas)
    }
    fn random_u64(&self) -> Result<u64, HostError> {
        // No host call in Envoy: the glue draws owner ids from a generator seeded once per VM.
        self.inner.random_u64()
    }
    fn random_token(&self) -> Result<[u8; 16], HostError> {
        self.add("random_get", 16);
        self.inner.random_token()
    }
    fn log(&self, level: Level, message: &str) {
        self.add("log", message.len());
        self.inner.log(level, message)
    }
    fn define_counter(&self, name: &str) -> Option<u32> {
        self.add("define_metric", name.len());
        Host::define_counter(self.inner, name)
    }
    fn define_histogram(&self, name: &str) -> Option<u32> {
        self.add("define_metric", name.len());
        Host::define_histogram(self.inner, name)
    }
    fn count(&self, counter: u32) {
        self.add("increment_metric", 0);
        self.inner.count(counter)
    }
    fn record(&self, histogram: u32, value: u64) {
        self.add("record_metric", 8);
        self.inner.record(histogram, value)
    }
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        let h: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        self.add("dispatch_http_call", cluster.len() + h + body.len());
        self.inner.dispatch(cluster, headers, body, timeout_ms)
    }
    fn enqueue(&self, queue: u32) {
        self.add("enqueue_shared_queue", 0);
        self.inner.enqueue(queue)
    }
    fn set_effective_context(&self, context: u32) -> Result<(), HostError> {
        self.add("set_effective_context", 0);
        self.inner.set_effective_context(context)
    }
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        let r = self.inner.request_header(name);
        self.add("get_header_map_value", name.len() + r.as_ref().map_or(0, Vec::len));
        r
    }
    fn request_headers(&self) -> crate::pairs::Headers {
        let r = self.inner.request_headers();
        self.add("get_header_map_pairs", r.byte_len());
        r
    }
    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        let r = self.inner.request_body(size);
        self.add("get_buffer_bytes", r.as_ref().map_or(0, Vec::len));
        r
    }
    fn response_headers(&self) -> crate::pairs::Headers {
        let r = self.inner.response_headers();
        self.add("get_header_map_pairs", r.byte_len());
        r
    }
    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        let r = self.inner.response_body(size);
        self.add("get_buffer_bytes", r.as_ref().map_or(0, Vec::len));
        r
    }
    fn response_trailers(&self) -> Vec<Pair> {
        let r = self.inner.response_trailers();
        self.add("get_header_map_pairs", pairs_len(&r));
        r
    }
    fn call_response(&self, num_headers: usize, body_size: usize) -> (crate::pairs::Headers, Vec<u8>) {
        let r = self.inner.call_response(num_headers, body_size);
        self.add("get_http_call_response", r.0.byte_len() + r.1.len());
        r
    }
    fn call_trailers(&self) -> Vec<Pair> {
        let r = self.inner.call_trailers();
        self.add("get_header_map_pairs", pairs_len(&r));
        r
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let r = self.inner.property(path);
        self.add("get_property", path.iter().map(|p| p.len()).sum::<usize>() + r.as_ref().map_or(0, Vec::len));
        r
    }
    fn set_property(&self, name: &str, value: &[u8]) {
        self.add("set_property", name.len() + value.len());
        self.inner.set_property(name, value)
    }
    fn send_reply(&self, reply: LocalReply) -> Result<(), HostError> {
        let h: usize = reply.headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        self.add("send_local_response", h + reply.body.len());
        self.inner.send_reply(reply)
    }
    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        self.add("replace_header_map_value", name.len() + value.len());
        self.inner.set_request_header(name, value)
    }
    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        self.add("remove_header_map_value", name.len());
        self.inner.remove_request_header(name)
    }
    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        self.add("replace_header_map_value", name.len() + value.len());
        self.inner.set_response_header(name, value)
    }
    fn add_response_trailer(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        self.add("add_header_map_value", name.len() + value.len());
        self.inner.add_response_trailer(name, value)
    }
    fn resume_request(&self) -> Result<(), HostError> {
        self.add("continue_stream", 0);
        self.inner.resume_request()
    }
    fn resume_response(&self) -> Result<(), HostError> {
        self.add("continue_stream", 0);
        self.inner.resume_response()
    }
}

impl<H: Host + Setup> Setup for CountingHost<'_, H> {
    fn define_counter(&self, name: &str) -> Option<u32> {
        Setup::define_counter(self.inner, name)
    }
    fn register_queue(&self, name: &str) -> Option<u32> {
        self.inner.register_queue(name)
    }
    fn start_ticks(&self, period_ms: u64) -> Result<(), HostError> {
        self.inner.start_ticks(period_ms)
    }
    fn log_level(&self) -> u32 {
        self.inner.log_level()
    }
}
