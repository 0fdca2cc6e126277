//! [`FakeHost`]: the host boundary in memory, with Envoy's real semantics, for the core's tests
//! (feature `fake-host`; not part of the shipped module).
//!
//! - Shared data as `proxy-wasm-cpp-host` `src/shared_data.cc` has it: one global CAS counter,
//!   `set` on an absent key inserts whatever CAS was passed, nothing is ever deleted.
//! - Streams by context id, like Envoy's contexts: a test opens a stream with its request, says
//!   which context Envoy is calling ([`FakeHost::enter`]), and reads what the filter did to it
//!   ([`FakeHost::acts`]: local replies, resumes, dispatched calls). A callout's answer is
//!   delivered with [`FakeHost::deliver`] before calling the context it belongs to.
//! - `set_effective_context` fails for a context that was never opened or was closed.
//! - What becomes of each request ([`FakeHost::fate`]), as Envoy carries out the filter's
//!   calls: a request goes upstream once — when a request callback continues
//!   ([`FakeHost::returned`], told by the test) or a paused request is resumed — and a local
//!   reply answers it. Envoy defers a local reply sent while the request is paused until the
//!   callback returns, then ends the stream: a continue or resume after it is ignored by Envoy,
//!   and a local reply after the request went upstream answers the client while the service
//!   runs it. Either order is recorded as crossed: the filter decided both ways.
//! - Callouts on the context effective at dispatch, delivered there
//!   ([`FakeHost::take_callout`]). When a stream closes ([`FakeHost::close`]), its callouts go on
//!   and are answered on the root context, as Envoy 1.40 does (it keeps every callout on the
//!   root context: docs/design.md, "Where a callout lives");
//!   [`FakeHost::close_cancelling_callouts`] is the stricter host that cancels them with the
//!   stream. The lifecycle must be right under both. Which object reads a reply is the
//!   module's own dispatcher's business ([`crate::lifecycle::Contexts`]), driven as Envoy does.
//!
//! Beside it: [`CountingHost`] (`counting.rs`), which counts host calls and bytes for the bench
//! breakdown and the host-call budget test, and [`bench`], the request `make bench` sends.

pub mod bench;
mod counting;

pub use counting::CountingHost;

use crate::host::{Host, HostError, Level, Setup};
use crate::pairs::Pair;
use crate::response::LocalReply;
use crate::shared_data::SharedData;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

/// One stream's data as Envoy holds it.
#[derive(Debug, Clone, Default)]
pub struct FakeStream {
    pub request_headers: Vec<Pair>,
    pub request_body: Vec<u8>,
    pub response_headers: Vec<Pair>,
    pub response_body: Vec<u8>,
    pub response_trailers: Vec<Pair>,
    /// Properties by path joined with `.` (`xds.route_name`).
    pub properties: HashMap<String, Vec<u8>>,
}

impl FakeStream {
    /// A request with `:method`, `:path` and the given headers.
    pub fn request(method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Self {
        let mut h: Vec<Pair> = vec![(b":method".to_vec(), method.into()), (b":path".to_vec(), path.into())];
        h.extend(headers.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec())));
        FakeStream { request_headers: h, request_body: body.to_vec(), ..Default::default() }
    }
    /// The upstream's answer (`:status` first).
    pub fn with_response(mut self, status: u16, headers: &[(&str, &[u8])], body: &[u8]) -> Self {
        self.response_headers = vec![(b":status".to_vec(), status.to_string().into_bytes())];
        self.response_headers.extend(headers.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec())));
        self.response_body = body.to_vec();
        self
    }
}

/// What became of one request, as Envoy carried out the filter's calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestFate {
    /// Times the request went upstream (at most once when the filter is right).
    pub upstream: u32,
    /// Times it went on to the echo listener with a gRPC replay (`x-idem-replay` set).
    pub echo: u32,
    /// Local replies sent on it.
    pub replies: u32,
    /// The filter's calls that decided the other way after a decision was carried out (a
    /// continue or resume after an answer, an answer after the request went on, a second
    /// resume): what Envoy would do with each is in the module doc.
    pub crossed: Vec<String>,
}

impl RequestFate {
    fn went(&self) -> bool {
        self.upstream + self.echo > 0
    }
}

/// What the filter did, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    Reply {
        context: u32,
        reply: LocalReply,
    },
    ResumeRequest {
        context: u32,
    },
    ResumeResponse {
        context: u32,
    },
    /// A callout: `path` is its `:path` header.
    Dispatch {
        context: u32,
        token: u32,
        cluster: String,
        path: String,
        body: Vec<u8>,
    },
    Trailer {
        context: u32,
        name: String,
        value: Vec<u8>,
    },
    /// A header set on the stream's (upstream) response.
    ResponseHeader {
        context: u32,
        name: String,
        value: Vec<u8>,
    },
    Enqueue {
        queue: u32,
    },
}

/// In-memory host for tests. `Sync`, so threads can play Envoy's worker VMs against one store.
#[derive(Default)]
pub struct FakeHost {
    /// Envoy's map for one vm_id, with its rules (`crate::shared_data`).
    data: SharedData,
    now: AtomicU64,
    rng: AtomicU64,
    /// When set, every shared-data call fails (store outage).
    pub failing: AtomicBool,
    streams: Mutex<HashMap<u32, FakeStream>>,
    closed: Mutex<HashSet<u32>>,
    current: AtomicU32,
    /// The call answer being delivered, its headers serialized as Envoy hands them over.
    call: Mutex<(crate::pairs::Headers, Vec<u8>)>,
    call_trailers: Mutex<Vec<Pair>>,
    acts: Mutex<Vec<Act>>,
    next_token: AtomicU32,
    /// Callouts out, by token: the context that was effective when each was sent, which is
    /// where Envoy keeps it (and delivers its reply), and which cancels it when it ends.
    callouts: Mutex<HashMap<u32, u32>>,
    /// Every callout's body, by token.
    sent: Mutex<HashMap<u32, Vec<u8>>>,
    /// The `:path` each callout was sent with, by token (a Webdis call's carries its tag).
    sent_paths: Mutex<HashMap<u32, String>>,
    counters: Mutex<Vec<(String, u64)>>,
    histograms: Mutex<Vec<(String, Vec<u64>)>>,
    logs: Mutex<Vec<(Level, String)>>,
    /// What `Setup::log_level` answers (0, debug, unless set).
    log_level: AtomicU32,
    /// Runs once just before the next write of a key (another worker acting in between).
    before_set: Mutex<Option<BeforeSet>>,
    /// What became of each stream's request, by context.
    fates: Mutex<HashMap<u32, RequestFate>>,
    /// Where the callouts of a closed stream are answered.
    root: AtomicU32,
}

/// A key, and what another worker does just before this one writes it.
type BeforeSet = (String, Box<dyn FnOnce() + Send>);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl FakeHost {
    pub fn new(now_ms: u64) -> Self {
        let h = FakeHost::default();
        h.now.store(now_ms, Ordering::SeqCst);
        h.next_token.store(100, Ordering::SeqCst);
        h.root.store(1, Ordering::SeqCst);
        h
    }
    /// Envoy's log level for the filter, as the worker reads it when it configures.
    pub fn set_log_level(&self, level: u32) {
        self.log_level.store(level, Ordering::SeqCst);
    }
    /// Runs `run` once, just before the next write of `key`: what another worker does between
    /// this one's read and its write (Envoy's workers share the data, not a lock).
    pub fn before_next_set(&self, key: &str, run: Box<dyn FnOnce() + Send>) {
        *lock(&self.before_set) = Some((key.to_string(), run));
    }
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
    /// Number of keys and total bytes held (keys + values), like Envoy's map.
    pub fn footprint(&self) -> (usize, usize) {
        self.data.footprint()
    }
    fn check(&self) -> Result<(), HostError> {
        if self.failing.load(Ordering::SeqCst) {
            Err(HostError::Failed("shared data unavailable (fake outage)".into()))
        } else {
            Ok(())
        }
    }

    /// Opens a stream (Envoy created the context) and makes it current.
    pub fn open(&self, context: u32, stream: FakeStream) {
        lock(&self.streams).insert(context, stream);
        self.enter(context);
    }
    /// The stream ended (its client left, or it was answered): the context is gone, and the
    /// callouts it sent go on — answered on the root context ([`FakeHost::set_root`]), as Envoy
    /// 1.40 answers them.
    pub fn close(&self, context: u32) {
        lock(&self.streams).remove(&context);
        lock(&self.closed).insert(context);
        let root = self.root.load(Ordering::SeqCst);
        for kept in lock(&self.callouts).values_mut().filter(|c| **c == context) {
            *kept = root;
        }
    }
    /// The stricter host: the stream ends and its callouts are cancelled with it (their replies
    /// never come).
    pub fn close_cancelling_callouts(&self, context: u32) {
        lock(&self.streams).remove(&context);
        lock(&self.closed).insert(context);
        lock(&self.callouts).retain(|_, c| *c != context);
    }
    /// The root context a closed stream's callouts are answered on (1 unless set).
    pub fn set_root(&self, context: u32) {
        self.root.store(context, Ordering::SeqCst);
    }
    /// Where Envoy delivers the reply of callout `token`: the context that was effective when it
    /// was sent; `None` once delivered or cancelled with its context. Taking it ends the call.
    pub fn take_callout(&self, token: u32) -> Option<u32> {
        lock(&self.callouts).remove(&token)
    }
    /// The body callout `token` was sent with.
    pub fn dispatched(&self, token: u32) -> Option<Vec<u8>> {
        lock(&self.sent).get(&token).cloned()
    }
    /// The callouts out (token, context kept on), by token.
    pub fn callouts(&self) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = lock(&self.callouts).iter().map(|(t, c)| (*t, *c)).collect();
        out.sort_unstable();
        out
    }
    /// Envoy calls this context now (a stream's callback, or the root's: any id).
    pub fn enter(&self, context: u32) {
        self.current.store(context, Ordering::SeqCst);
    }
    pub fn current(&self) -> u32 {
        self.current.load(Ordering::SeqCst)
    }
    /// Changes a stream's data (e.g. the upstream's answer arrives).
    pub fn update(&self, context: u32, f: impl FnOnce(&mut FakeStream)) {
        if let Some(s) = lock(&self.streams).get_mut(&context) {
            f(s);
        }
    }
    /// The answer of call `token`, readable during the next callback, as its server sends it: a
    /// Webdis call (its path asks `?jsonp=<tag>`) answered 200 is wrapped `<tag>(…);`, as Webdis
    /// wraps it. [`FakeHost::deliver`] delivers a body as given (another call's reply, say).
    pub fn deliver_to(&self, token: u32, status: u16, body: &[u8]) {
        let path = lock(&self.sent_paths).get(&token).cloned().unwrap_or_default();
        match path.split_once("?jsonp=") {
            Some((_, tag)) if status == 200 => {
                let mut wrapped = format!("{tag}(").into_bytes();
                wrapped.extend_from_slice(body);
                wrapped.extend_from_slice(b");\n");
                self.deliver(status, &wrapped);
            }
            _ => self.deliver(status, body),
        }
    }
    /// The answer of an HTTP call, readable during the next callback.
    pub fn deliver(&self, status: u16, body: &[u8]) {
        // A failed call has no headers at all, as on Envoy.
        let headers = match status {
            0 => crate::pairs::Headers::default(),
            _ => crate::pairs::Headers::from_pairs(&[(":status", status.to_string())]),
        };
        *lock(&self.call) = (headers, body.to_vec());
        lock(&self.call_trailers).clear();
    }
    /// The answer of an HTTP call with its headers and trailers (a gRPC answer).
    pub fn deliver_with(&self, headers: &[(&str, &[u8])], body: &[u8], trailers: &[(&str, &[u8])]) {
        let pairs = |h: &[(&str, &[u8])]| h.iter().map(|(n, v)| (n.as_bytes().to_vec(), v.to_vec())).collect();
        *lock(&self.call) = (crate::pairs::Headers::from_pairs(headers), body.to_vec());
        *lock(&self.call_trailers) = pairs(trailers);
    }
    /// A callout that timed out, as Envoy's async client answers it: its router's local reply
    /// (`504`, `upstream request timeout`), not a failure without headers.
    pub fn deliver_timeout(&self) {
        let headers = [(":status", "504"), ("content-length", "24"), ("content-type", "text/plain")];
        *lock(&self.call) = (crate::pairs::Headers::from_pairs(&headers), b"upstream request timeout".to_vec());
    }
    /// A request callback of `context` (headers, a body chunk, trailers) returned: `continued`
    /// when it returned `Continue`, which lets a request that has not gone yet go upstream.
    pub fn returned(&self, context: u32, continued: bool) {
        if continued {
            self.request_goes_on(context, "a request callback continued");
        }
    }
    /// What became of the request of `context` so far.
    pub fn fate(&self, context: u32) -> RequestFate {
        lock(&self.fates).get(&context).cloned().unwrap_or_default()
    }
    fn request_goes_on(&self, context: u32, how: &str) {
        let to_echo = lock(&self.streams)
            .get(&context)
            .is_some_and(|s| s.request_headers.iter().any(|(n, _)| n.as_slice() == b"x-idem-replay"));
        let mut fates = lock(&self.fates);
        let fate = fates.entry(context).or_default();
        if fate.replies > 0 {
            fate.crossed.push(format!("{how} after the request was answered"));
        } else if fate.went() {
            // Once gone, later callbacks continuing carry the rest of the body: only a resume
            // (which only a paused request takes) is a second send.
            if how.starts_with("resumed") {
                fate.crossed.push(format!("{how} after the request went on"));
            }
        } else if to_echo {
            fate.echo += 1;
        } else {
            fate.upstream += 1;
        }
    }
    /// Everything done so far, and forgets it.
    pub fn take_acts(&self) -> Vec<Act> {
        std::mem::take(&mut *lock(&self.acts))
    }
    /// A histogram's recorded values, by the name it was defined with.
    pub fn histogram(&self, name: &str) -> Vec<u64> {
        lock(&self.histograms).iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()).unwrap_or_default()
    }
    pub fn logs(&self) -> Vec<(Level, String)> {
        lock(&self.logs).clone()
    }
    /// A counter's value, by the name it was defined with.
    /// Every shared-data key, sorted (tests that reach into the store's layout).
    pub fn shared_keys(&self) -> Vec<String> {
        self.data.keys()
    }

    /// Whether a counter of this name was defined (exported, at zero or more).
    pub fn counter_defined(&self, name: &str) -> bool {
        lock(&self.counters).iter().any(|(n, _)| n == name)
    }
    pub fn counter(&self, name: &str) -> u64 {
        lock(&self.counters).iter().find(|(n, _)| n == name).map(|(_, v)| *v).unwrap_or(0)
    }
    fn act(&self, a: Act) {
        lock(&self.acts).push(a);
    }
    fn with_stream<T>(&self, f: impl FnOnce(&FakeStream) -> T) -> Option<T> {
        lock(&self.streams).get(&self.current()).map(f)
    }
}

impl Host for FakeHost {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        self.check()?;
        Ok(self.data.get(key))
    }
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        self.check()?;
        let hook = {
            let mut pending = lock(&self.before_set);
            match pending.take() {
                Some((k, run)) if k == key => Some(run),
                other => {
                    *pending = other;
                    None
                }
            }
        };
        if let Some(run) = hook {
            run();
        }
        self.data.set(key, value, cas)
    }
    fn random_u64(&self) -> Result<u64, HostError> {
        // Distinct, non-zero, and not sequential-looking.
        let n = self.rng.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn random_token(&self) -> Result<[u8; 16], HostError> {
        let a = self.random_u64()?.to_le_bytes();
        let b = self.random_u64()?.to_le_bytes();
        let mut out = [0u8; 16];
        out[..8].copy_from_slice(&a);
        out[8..].copy_from_slice(&b);
        Ok(out)
    }
    fn log(&self, level: Level, message: &str) {
        lock(&self.logs).push((level, message.to_string()));
    }
    fn define_counter(&self, name: &str) -> Option<u32> {
        Setup::define_counter(self, name)
    }
    fn define_histogram(&self, name: &str) -> Option<u32> {
        // As Envoy: the same name is the same stat.
        let mut h = lock(&self.histograms);
        if let Some(i) = h.iter().position(|(n, _)| n == name) {
            return Some(i as u32);
        }
        h.push((name.to_string(), Vec::new()));
        Some(h.len() as u32 - 1)
    }
    fn count(&self, counter: u32) {
        if let Some(c) = lock(&self.counters).get_mut(counter as usize) {
            c.1 += 1;
        }
    }
    fn record(&self, histogram: u32, value: u64) {
        if let Some(h) = lock(&self.histograms).get_mut(histogram as usize) {
            h.1.push(value);
        }
    }
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        _timeout_ms: u64,
    ) -> Result<u32, HostError> {
        let token = self.next_token.fetch_add(1, Ordering::SeqCst);
        lock(&self.callouts).insert(token, self.current());
        lock(&self.sent).insert(token, body.to_vec());
        let path = headers.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.clone()).unwrap_or_default();
        lock(&self.sent_paths).insert(token, path.clone());
        let context = self.current();
        self.act(Act::Dispatch { context, token, cluster: cluster.into(), path, body: body.to_vec() });
        Ok(token)
    }
    fn enqueue(&self, queue: u32) {
        self.act(Act::Enqueue { queue });
    }
    fn set_effective_context(&self, context: u32) -> Result<(), HostError> {
        if lock(&self.closed).contains(&context) {
            return Err(HostError::Failed(format!("context {context} is gone")));
        }
        self.enter(context);
        Ok(())
    }
    fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.with_stream(|s| s.request_headers.iter().find(|(n, _)| n == name.as_bytes()).map(|(_, v)| v.clone()))
            .flatten()
    }
    fn request_headers(&self) -> crate::pairs::Headers {
        self.with_stream(|s| crate::pairs::Headers::from_pairs(&s.request_headers)).unwrap_or_default()
    }
    fn request_body(&self, size: usize) -> Option<Vec<u8>> {
        self.with_stream(|s| s.request_body.get(..size.min(s.request_body.len())).map(<[u8]>::to_vec))
            .flatten()
            .filter(|b| !b.is_empty())
    }
    fn response_headers(&self) -> crate::pairs::Headers {
        self.with_stream(|s| crate::pairs::Headers::from_pairs(&s.response_headers)).unwrap_or_default()
    }
    fn response_body(&self, size: usize) -> Option<Vec<u8>> {
        self.with_stream(|s| s.response_body.get(..size.min(s.response_body.len())).map(<[u8]>::to_vec))
            .flatten()
            .filter(|b| !b.is_empty())
    }
    fn response_trailers(&self) -> Vec<Pair> {
        self.with_stream(|s| s.response_trailers.clone()).unwrap_or_default()
    }
    fn call_response(&self, _num_headers: usize, _body_size: usize) -> (crate::pairs::Headers, Vec<u8>) {
        lock(&self.call).clone()
    }
    fn call_trailers(&self) -> Vec<Pair> {
        lock(&self.call_trailers).clone()
    }
    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.with_stream(|s| s.properties.get(&path.join(".")).cloned()).flatten()
    }
    fn set_property(&self, name: &str, value: &[u8]) {
        let ctx = self.current();
        if let Some(s) = lock(&self.streams).get_mut(&ctx) {
            s.properties.insert(format!("wasm.{name}"), value.to_vec());
        }
    }
    fn send_reply(&self, reply: LocalReply) -> Result<(), HostError> {
        let context = self.current();
        {
            let mut fates = lock(&self.fates);
            let fate = fates.entry(context).or_default();
            if fate.went() {
                fate.crossed.push("answered after the request went on".into());
            } else if fate.replies > 0 {
                fate.crossed.push("answered twice".into());
            }
            fate.replies += 1;
        }
        self.act(Act::Reply { context, reply });
        Ok(())
    }
    fn set_request_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        let ctx = self.current();
        if let Some(st) = lock(&self.streams).get_mut(&ctx) {
            st.request_headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name.as_bytes()));
            st.request_headers.push((name.as_bytes().to_vec(), value.to_vec()));
        }
        Ok(())
    }
    fn remove_request_header(&self, name: &str) -> Result<(), HostError> {
        let ctx = self.current();
        if let Some(st) = lock(&self.streams).get_mut(&ctx) {
            st.request_headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name.as_bytes()));
        }
        Ok(())
    }
    fn set_response_header(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        let ctx = self.current();
        self.act(Act::ResponseHeader { context: ctx, name: name.into(), value: value.to_vec() });
        Ok(())
    }
    fn add_response_trailer(&self, name: &str, value: &[u8]) -> Result<(), HostError> {
        let ctx = self.current();
        self.act(Act::Trailer { context: ctx, name: name.into(), value: value.to_vec() });
        Ok(())
    }
    fn resume_request(&self) -> Result<(), HostError> {
        self.request_goes_on(self.current(), "resumed");
        self.act(Act::ResumeRequest { context: self.current() });
        Ok(())
    }
    fn resume_response(&self) -> Result<(), HostError> {
        self.act(Act::ResumeResponse { context: self.current() });
        Ok(())
    }
}

impl Setup for FakeHost {
    fn define_counter(&self, name: &str) -> Option<u32> {
        // As Envoy: the same name is the same stat.
        let mut c = lock(&self.counters);
        if let Some(i) = c.iter().position(|(n, _)| n == name) {
            return Some(i as u32);
        }
        c.push((name.to_string(), 0));
        Some(c.len() as u32 - 1)
    }
    fn register_queue(&self, _name: &str) -> Option<u32> {
        Some(7)
    }
    fn start_ticks(&self, _period_ms: u64) -> Result<(), HostError> {
        Ok(())
    }
    fn log_level(&self) -> u32 {
        self.log_level.load(Ordering::SeqCst)
    }
}
