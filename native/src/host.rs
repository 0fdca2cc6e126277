//! The core's [`Host`] and [`Setup`] on Envoy's dynamic-module callbacks.
//!
//! A `Native` is made for each hook, as the Wasm glue's `Envoy` is: the clock is read once, the
//! current stream is the hook's filter (or none, for a root's tick or configuration), and a
//! callout's answer being delivered is held here for [`Host::call_response`].

use crate::abi::{self, attribute, body_type, header_type, FilterPtr};
use crate::config::Config;
use crate::worker::{self, Deferred};
use idem_filter::host::{self as core, HostError, Level};
use idem_filter::pairs::{Headers, Pair};
use idem_filter::policy::RedisConfig;
use idem_filter::response::LocalReply;
use idem_filter::shared_data::SharedData;
use std::cell::{Cell, RefCell};
use std::sync::{Arc, OnceLock};

/// The embedded store's map: one per process, shared by every worker and config (Envoy's shared
/// data is one map per `vm_id`; namespaces keep configs apart, as on Wasm).
fn shared_data() -> &'static SharedData {
    static DATA: OnceLock<SharedData> = OnceLock::new();
    DATA.get_or_init(SharedData::default)
}

/// The wall clock in milliseconds since the Unix epoch, as proxy-wasm's clock reads it.
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// A callout's answer, while its hook runs.
#[derive(Default)]
pub struct CallAnswer {
    pub headers: Headers,
    pub body: Vec<u8>,
}

pub struct Native {
    config: Arc<Config>,
    /// The stream the core acts on (its context and filter): the hook's, or the one a root made
    /// effective.
    current: Cell<Option<(u32, FilterPtr)>>,
    now_ms: Cell<Option<u64>>,
    answer: RefCell<CallAnswer>,
    /// The body reads see what Envoy buffered too (the default), or only the chunk of the
    /// current body hook (`hooks::on_body`).
    whole_body: Cell<bool>,
}

impl Native {
    pub fn new(config: Arc<Config>, stream: Option<(u32, FilterPtr)>) -> Native {
        Native {
            config,
            current: Cell::new(stream),
            now_ms: Cell::new(None),
            answer: RefCell::default(),
            whole_body: Cell::new(true),
        }
    }

    /// A body hook's view of the body: the body so far (`whole`), or its chunk alone.
    pub fn view_body(&self, whole: bool) {
        self.whole_body.set(whole);
    }

    /// Holds a callout's answer for the core to read.
    pub fn deliver(&self, answer: CallAnswer) {
        *self.answer.borrow_mut() = answer;
    }

    fn filter(&self) -> Option<FilterPtr> {
        self.current.get().map(|(_, f)| f)
    }

    fn stream(&self, call: &str) -> Result<FilterPtr, HostError> {
        self.filter().ok_or_else(|| HostError::Failed(format!("{call}: no stream is current")))
    }

    /// The body so far: what Envoy buffered, then the chunk of the current body hook (Envoy
    /// adds it to the buffer only after the hook returns) — or that chunk alone, in a body hook
    /// that follows one which did not buffer ([`Native::view_body`]).
    fn body(&self, buffered: u32, received: u32, size: usize) -> Option<Vec<u8>> {
        let filter = self.filter()?;
        // The core asks for what it reads (`size`): more is neither copied nor made room for.
        let whole = self.whole_body.get();
        let held = if whole { filter.body_size(buffered) } else { 0 };
        let mut out = Vec::with_capacity(size.min(held.saturating_add(filter.body_size(received))));
        let whole = whole && filter.body(buffered, &mut out, size);
        let any = whole | filter.body(received, &mut out, size);
        any.then_some(out)
    }
}

impl core::Host for Native {
    fn now_ms(&self) -> u64 {
        if let Some(now) = self.now_ms.get() {
            return now;
        }
        let now = wall_ms();
        self.now_ms.set(Some(now));
        now
    }
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        Ok(shared_data().get(key))
    }
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        shared_data().set(key, value, cas)
    }
    fn random_u64(&self) -> Result<u64, HostError> {
        core::owner_id(|| getrandom::u64().map_err(|e| HostError::Failed(format!("getrandom: {e}"))))
    }
    fn random_token(&self) -> Result<[u8; 16], HostError> {
        let mut out = [0u8; 16];
        getrandom::fill(&mut out).map_err(|e| HostError::Failed(format!("getrandom: {e}")))?;
        Ok(out)
    }
    fn log(&self, level: Level, message: &str) {
        abi::log(level as u32, message);
    }
    fn define_counter(&self, name: &str) -> Option<u32> {
        worker::with(|w| w.series_handle(&self.config, name))
    }
    fn count(&self, counter: u32) {
        worker::with(|w| w.add_to_series(counter, 1));
    }
    fn define_histogram(&self, name: &str) -> Option<u32> {
        worker::with(|w| w.series_handle(&self.config, name))
    }
    fn record(&self, histogram: u32, value: u64) {
        worker::with(|w| w.add_to_series(histogram, value));
    }
    /// Sent from the main thread, kept on the filter config, so it outlives the stream that
    /// asked for it (`calls.rs`).
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        worker::with(|w| w.send_call(&self.config, cluster, headers, body, timeout_ms))
    }
    fn enqueue(&self, queue: u32) {
        worker::with(|w| w.wake(queue));
    }
    fn set_effective_context(&self, context: u32) -> Result<(), HostError> {
        // A root's own id (or a context that ended) has no filter: no stream is current.
        let filter = worker::with(|w| w.filter_of(context));
        self.current.set(filter.map(|f| (context, f)));
        Ok(())
    }
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.filter()?.header(header_type::REQUEST, name)
    }
    fn request_headers(&self) -> Headers {
        self.filter()
            .map(|f| f.with_headers(header_type::REQUEST, |pairs| Headers::from_pairs(pairs)))
            .unwrap_or_default()
    }
    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        self.body(body_type::BUFFERED_REQUEST, body_type::RECEIVED_REQUEST, size)
    }
    fn response_headers(&self) -> Headers {
        self.filter()
            .map(|f| f.with_headers(header_type::RESPONSE, |pairs| Headers::from_pairs(pairs)))
            .unwrap_or_default()
    }
    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        self.body(body_type::BUFFERED_RESPONSE, body_type::RECEIVED_RESPONSE, size)
    }
    fn response_trailers(&self) -> Vec<Pair> {
        self.filter().map(|f| f.headers(header_type::RESPONSE_TRAILER)).unwrap_or_default()
    }
    fn call_response(&self, _num_headers: usize, _body_size: usize) -> (Headers, Vec<u8>) {
        let answer = std::mem::take(&mut *self.answer.borrow_mut());
        (answer.headers, answer.body)
    }
    fn call_trailers(&self) -> Vec<Pair> {
        Vec::new()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        if path == ["plugin_name"] {
            return Some(self.config.name.as_bytes().to_vec());
        }
        let filter = self.filter()?;
        match path {
            ["xds", "route_name"] => filter.attribute_string(attribute::XDS_ROUTE_NAME),
            ["xds", "cluster_name"] => filter.attribute_string(attribute::XDS_CLUSTER_NAME),
            ["response", "code_details"] => filter.attribute_string(attribute::RESPONSE_CODE_DETAILS),
            // proxy-wasm's form of an integer property: an int64 in host byte order.
            ["request", "total_size"] => {
                filter.attribute_int(attribute::REQUEST_TOTAL_SIZE).map(|n| (n as i64).to_le_bytes().to_vec())
            }
            ["metadata", "filter_metadata", namespace, key] => filter.dynamic_metadata(namespace, key),
            _ => None,
        }
    }
    /// Filter state under the name the `.wasm` uses (`wasm.<name>`), so an access log format
    /// (`%FILTER_STATE(wasm.idem_outcome:PLAIN)%`) reads the same with either artifact.
    fn set_property(&self, name: &str, value: &[u8]) {
        if let Some(filter) = self.filter() {
            filter.set_filter_state(&format!("wasm.{name}"), value);
        }
    }
    fn send_reply(&self, reply: LocalReply) -> Result<(), HostError> {
        let filter = self.stream("send_response")?;
        worker::with(|w| w.defer(Deferred::Reply(filter, Box::new(reply))));
        Ok(())
    }
    fn resume_request(&self) -> Result<(), HostError> {
        let filter = self.stream("continue_decoding")?;
        worker::with(|w| w.defer(Deferred::Resume(filter)));
        Ok(())
    }
    /// A changed request header re-picks the route (as proxy-wasm's `replace_header_map_value` does
    /// in Envoy): a gRPC replay rewrites `:path` to the echo listener's route.
    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        let filter = self.stream("set_header")?;
        let ok = filter.set_header(header_type::REQUEST, name, value);
        filter.clear_route_cache();
        ok.then_some(()).ok_or_else(|| HostError::Failed(format!("set_header {name}: refused")))
    }
    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        let filter = self.stream("set_header")?;
        filter.remove_header(header_type::REQUEST, name);
        filter.clear_route_cache();
        Ok(())
    }
    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        let ok = self.stream("set_header")?.set_header(header_type::RESPONSE, name, value);
        ok.then_some(()).ok_or_else(|| HostError::Failed(format!("set_header response {name}: refused")))
    }
    fn add_response_trailer(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        let ok = self.stream("add_header")?.add_header(header_type::RESPONSE_TRAILER, name, value);
        ok.then_some(()).ok_or_else(|| HostError::Failed(format!("add_header trailer {name}: no trailers")))
    }
    fn resume_response(&self) -> Result<(), HostError> {
        let filter = self.stream("continue_encoding")?;
        worker::with(|w| w.defer(Deferred::ResumeResponse(filter)));
        Ok(())
    }
    /// The echo sends a replayed gRPC answer's trailers itself (`send_response_trailers`).
    fn local_reply_trailers(&self) -> bool {
        true
    }
    /// `[redis] direct`: RESP from the module's client thread (`resp.rs`).
    fn speaks_resp(&self) -> bool {
        true
    }
    fn redis_direct(&self, redis: &RedisConfig, command: &[u8], timeout_ms: u64) -> Result<u32, HostError> {
        worker::with(|w| w.send_redis(&self.config, redis, command, timeout_ms))
    }
}

/// What a root asks for when it configures: its timer's period (the ticker carries it), its
/// queue (its own context id: a wake-up runs after the current hook), and metric handles.
pub struct Setup<'a> {
    pub host: &'a Native,
    pub root: u32,
    pub tick_ms: Cell<Option<u64>>,
}

impl core::Setup for Setup<'_> {
    fn define_counter(&self, name: &str) -> Option<u32> {
        core::Host::define_counter(self.host, name)
    }
    fn register_queue(&self, _name: &str) -> Option<u32> {
        Some(self.root)
    }
    fn start_ticks(&self, period_ms: u64) -> Result<(), HostError> {
        self.tick_ms.set(Some(period_ms));
        Ok(())
    }
    fn log_level(&self) -> u32 {
        // Envoy's numbering (trace 0 … critical 5), as proxy-wasm's: the lowest level logged.
        (0..=5).find(|l| abi::log_enabled(*l)).unwrap_or(6)
    }
}
