//! The host boundary: everything the filter needs from Envoy, as calls that return `Result` or
//! plain values — never a panic.
//!
//! The Wasm glue implements [`Host`] on the proxy-wasm ABI (`glue/abi.rs`, bytes in and out).
//! [`crate::testing::FakeHost`] implements it in memory with Envoy's real semantics: shared data
//! with one global CAS counter, `set` on an absent key inserting whatever CAS was passed, no
//! delete; streams addressed by context id, with the "current" one the context Envoy is calling
//! (or the effective one a root callback switched to).

use crate::pairs::Pair;
use crate::response::LocalReply;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// The value changed since it was read (compare-and-swap failed).
    CasMismatch,
    /// Any other failure of a host call.
    Failed(String),
}

/// Envoy's log levels (proxy-wasm numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

pub trait Host {
    // ---- the worker
    /// Wall-clock time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// A value and its CAS, or `None` when the key was never written.
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError>;
    /// Writes a value; with `Some(cas)` only if the stored CAS still matches (existing keys only).
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError>;
    /// 64 random bits (owner ids, the bucket secret).
    fn random_u64(&self) -> Result<u64, HostError>;
    /// 16 bytes from the system's CSPRNG (tokens).
    fn random_token(&self) -> Result<[u8; 16], HostError>;
    fn log(&self, level: Level, message: &str);
    /// Defines a counter while serving (counters are defined on first use, so a route × outcome
    /// that never happened exports no zero series). Defining a name again gives the same counter.
    fn define_counter(&self, name: &str) -> Option<u32>;
    /// Adds one to a counter defined with [`Setup::define_counter`] or [`Host::define_counter`].
    fn count(&self, counter: u32);
    /// Defines a histogram while serving: a histogram series exists from its first value, on
    /// both builds (natively Envoy 1.40 makes a labelled series only by recording into it).
    fn define_histogram(&self, name: &str) -> Option<u32>;
    /// Records a value in a histogram defined with [`Host::define_histogram`].
    fn record(&self, histogram: u32, value: u64);
    /// Sends an HTTP call through an Envoy cluster; the answer arrives at the context that is
    /// current now. Returns the call's token.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError>;
    /// Wakes this worker's root context (its shared queue).
    fn enqueue(&self, queue: u32);
    /// Makes another context current (the root acting on a held request).
    fn set_effective_context(&self, context: u32) -> Result<(), HostError>;

    // ---- the current stream
    /// One request header (the first value when it repeats), as bytes.
    fn request_header(&self, name: &str) -> Option<Vec<u8>>;
    /// Every request header, in the host's serialized form (read in place).
    fn request_headers(&self) -> crate::pairs::Headers;
    /// The buffered request body, `size` bytes from the start.
    fn request_body(&self, size: usize) -> Option<Vec<u8>>;
    /// Every response header, in the host's serialized form (read in place).
    fn response_headers(&self) -> crate::pairs::Headers;
    fn response_body(&self, size: usize) -> Option<Vec<u8>>;
    /// The response's trailers (a gRPC answer's `grpc-status`), in `on_response_trailers`.
    fn response_trailers(&self) -> Vec<Pair>;
    /// The answer of the HTTP call being delivered: headers in the host's serialized form (none
    /// when the call failed; read in place, as most answers are only asked their `:status`) and body.
    fn call_response(&self, num_headers: usize, body_size: usize) -> (crate::pairs::Headers, Vec<u8>);
    /// The trailers of the HTTP call being delivered (a gRPC call's status).
    fn call_trailers(&self) -> Vec<Pair>;
    /// A property of the current stream (`xds.route_name`, dynamic metadata, …).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;
    /// Sets filter state on the current stream; Envoy stores `name` as `wasm.<name>`, which its
    /// access log prints with `%FILTER_STATE(wasm.<name>:PLAIN)%`.
    fn set_property(&self, name: &str, value: &[u8]);
    /// Answers the current stream with a local reply.
    fn send_reply(&self, reply: LocalReply) -> Result<(), HostError>;
    fn resume_request(&self) -> Result<(), HostError>;
    /// Sets a request header of the current stream (before it is resumed): a gRPC replay points
    /// the call at the echo listener.
    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostError>;
    fn remove_request_header(&self, name: &str) -> Result<(), HostError>;
    /// Sets a header of the current stream's response, in its response-headers callback (a
    /// Repeatable Requests route's `Repeatability-Result`).
    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostError>;
    /// Adds a response trailer; Envoy creates the trailers only in the last response body
    /// callback (`end_of_stream`).
    fn add_response_trailer(&self, name: &str, value: &[u8]) -> Result<(), HostError>;
    fn resume_response(&self) -> Result<(), HostError>;
    /// Whether a local reply can carry trailers ([`LocalReply::trailers`]). proxy-wasm's cannot,
    /// so a replayed gRPC answer's trailers are added by the gateway as the echo's answer ends;
    /// a dynamic module's echo sends them itself (Envoy 1.40 gives it no way to add trailers to
    /// an answer that has none).
    fn local_reply_trailers(&self) -> bool {
        false
    }
    /// Whether this host speaks RESP to Redis itself ([`Host::redis_direct`]): the native build
    /// does; proxy-wasm has only HTTP callouts, and the `.wasm` goes through Webdis.
    fn speaks_resp(&self) -> bool {
        false
    }
    /// Sends a Redis command to `[redis] direct` in RESP. `command` is the Webdis form the store
    /// builds (`CMD/arg/…`, percent-encoded); the answer arrives as a callout's would: a `200`
    /// whose body is Webdis' JSON for the reply ([`crate::store::resp`]), or a failed call (no
    /// headers) when Redis cannot be reached or does not answer within `timeout_ms`.
    fn redis_direct(
        &self,
        _redis: &crate::policy::RedisConfig,
        _command: &[u8],
        _timeout_ms: u64,
    ) -> Result<u32, HostError> {
        Err(HostError::Failed("this host speaks no RESP: Redis is reached through Webdis".into()))
    }
}

/// What the root context sets up when the plugin configures: counters, the wake-up queue and
/// the timer. Separate from [`Host`] because only configuration needs it.
pub trait Setup {
    fn define_counter(&self, name: &str) -> Option<u32>;
    /// Registers a shared queue only this worker's root reads; its id.
    fn register_queue(&self, name: &str) -> Option<u32>;
    fn start_ticks(&self, period_ms: u64) -> Result<(), HostError>;
    /// Envoy's log level for the `wasm` component, as [`Level`]'s number.
    fn log_level(&self) -> u32;
}

/// Owner ids need to be unique across workers, not secret: SplitMix64 over a per-thread state
/// seeded once from the system's randomness (`seed`), instead of a host call per claim.
pub fn owner_id(seed: impl FnOnce() -> Result<u64, HostError>) -> Result<u64, HostError> {
    thread_local! {
        static STATE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    STATE.with(|state| {
        let mut s = state.get();
        if s == 0 {
            s = seed()? | 1;
        }
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        state.set(s);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Ok(z ^ (z >> 31))
    })
}
