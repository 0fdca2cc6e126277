//! The module's event hooks (`envoy_dynamic_module_on_*`): what Envoy calls. Each one catches
//! unwinding (a panic in a native module would take the whole Envoy down, not one VM), turns its
//! pointers into the crate's handles, and hands the event to the worker's contexts. Envoy
//! resolves every `on_http_filter_*` hook when a config is created and refuses a module that
//! lacks a required one, so the streaming-callout hooks idem never triggers are here too.

use crate::abi::{self, ConfigPtr, EnvoyBuffer, EnvoyHeader, FilterPtr};
use crate::config::Config;
use crate::host::Native;
use crate::{calls, refusal, ticker, worker};
use idem_filter::host::{Host, Level};
use idem_filter::lifecycle::Flow;
use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// Envoy 1.40 compares this with its own ABI version and only warns on a mismatch.
static ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Runs a hook, or answers `default` if it panicked (the panic hook logged it).
fn guarded<T>(default: T, hook: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(hook)).unwrap_or(default)
}

/// What Envoy holds for one stream: its context on this worker and its config.
struct StreamFilter {
    context: u32,
    config: Arc<Config>,
    /// The first hook has run (it offers to carry the worker's ticks).
    started: bool,
    /// The last request / response body hook answered `StopIterationAndBuffer`: Envoy keeps
    /// the chunks, and the next hook sees the body so far (see [`on_body`]).
    buffering: [bool; 2],
}

/// The stream behind a module pointer.
///
/// # Safety
/// `module` is a pointer [`envoy_dynamic_module_on_http_filter_new`] returned and Envoy has not
/// destroyed yet; Envoy calls a stream's hooks one at a time on its worker.
unsafe fn stream<'a>(module: *const c_void) -> Option<&'a mut StreamFilter> {
    // SAFETY: as the caller promised (null for a stream that is not ours).
    unsafe { (module as *mut StreamFilter).as_mut() }
}

/// The stream of a hook (marked started, offering to carry the worker's ticks) and a host for
/// it; `None` for a stream that is not ours.
fn enter<'a>(filter: *mut c_void, module: *const c_void) -> Option<(&'a mut StreamFilter, Native)> {
    // SAFETY: Envoy's module pointer for this stream.
    let s = unsafe { stream(module) }?;
    let filter = FilterPtr(filter);
    if !s.started {
        s.started = true;
        worker::with(|w| w.carry_ticks(s.context, filter));
    }
    let host = Native::new(Arc::clone(&s.config), Some((s.context, filter)));
    Some((s, host))
}

/// A stream hook: the event on the stream's context, its flow as Envoy's status.
fn on_stream(
    filter: *mut c_void,
    module: *const c_void,
    status: fn(Flow) -> u32,
    event: impl FnOnce(&mut idem_filter::lifecycle::Stream, &Native) -> Flow,
) -> u32 {
    guarded(0, || {
        let Some((context, host)) = enter(filter, module).map(|(s, host)| (s.context, host)) else {
            return 0;
        };
        status(worker::on_stream(&host, context, event))
    })
}

/// A body hook, with proxy-wasm's view of the body, which the core is written against: after a
/// `StopIterationAndBuffer` the body so far (what Envoy buffered and this chunk), else this chunk
/// alone — chunks held under the watermark (`Flow::Hold`) stay in Envoy's buffer but are not
/// this hook's. (Counting them again at each chunk made a parked answer's dropped bytes pass
/// `early::DISCARD_LIMIT` after a few chunks of a 2 MiB upload, and the answer went before the
/// upload ended.)
fn on_body(
    filter: *mut c_void,
    module: *const c_void,
    response: bool,
    event: impl FnOnce(&mut idem_filter::lifecycle::Stream, &Native, usize) -> Flow,
) -> u32 {
    guarded(0, || {
        let side = usize::from(response);
        let Some((context, whole, host)) = enter(filter, module).map(|(s, host)| (s.context, s.buffering[side], host))
        else {
            return 0;
        };
        let (buffered, received) = if response {
            (abi::body_type::BUFFERED_RESPONSE, abi::body_type::RECEIVED_RESPONSE)
        } else {
            (abi::body_type::BUFFERED_REQUEST, abi::body_type::RECEIVED_REQUEST)
        };
        let f = FilterPtr(filter);
        let size = f.body_size(received) + if whole { f.body_size(buffered) } else { 0 };
        host.view_body(whole);
        // No reference to the stream's box is held across the event: a reply sent during it
        // runs this stream's other hooks, which take their own.
        let flow = worker::on_stream(&host, context, |stream, h| event(stream, h, size));
        // SAFETY: Envoy's module pointer for this stream, still alive (its destroy hook comes last).
        if let Some(s) = unsafe { stream(module) } {
            s.buffering[side] = flow == Flow::Pause;
        }
        flow.data_status()
    })
}

// ---- program and config ------------------------------------------------------------------

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    std::panic::set_hook(Box::new(|info| {
        abi::log(Level::Critical as u32, &format!("idem: panic (caught; the hook answers its default): {info}"));
    }));
    ABI_VERSION.as_ptr().cast()
}

/// A filter config: the policy is parsed, checked against what this build can do, and the
/// store initialised, all on the main thread; a refusal logs why and makes Envoy reject the
/// config.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: *mut c_void,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    guarded(std::ptr::null(), || {
        // SAFETY: Envoy's buffers for this hook, copied at once.
        let (name, policy) = unsafe {
            (abi::envoy_bytes(name.ptr, name.length).to_vec(), abi::envoy_bytes(config.ptr, config.length).to_vec())
        };
        let name = String::from_utf8_lossy(&name).into_owned();
        let config = Arc::new(Config::new(ConfigPtr(config_envoy), name, policy));
        let host = Native::new(Arc::clone(&config), None);
        if let Err(line) = refusal::check(&config) {
            host.log(Level::Critical, &line);
            // Envoy never destroys a config it was refused: its scheduler goes now.
            config.destroy();
            return std::ptr::null();
        }
        Arc::into_raw(config).cast()
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    guarded((), || {
        if !config.is_null() {
            // SAFETY: the pointer config_new made with `Arc::into_raw`, released once.
            let config = unsafe { Arc::from_raw(config.cast::<Config>()) };
            config.destroy();
        }
    })
}

/// Per-route configs carry nothing: a route enables the filter with an empty `FilterConfig`.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    static NOTHING: u8 = 0;
    (&NOTHING as *const u8).cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: *const c_void) {}

/// One more strong count of the config behind config_new's pointer.
///
/// # Safety
/// `config` is null or the pointer config_new returned, not yet destroyed.
unsafe fn config_arc(config: *const c_void) -> Option<Arc<Config>> {
    if config.is_null() {
        return None;
    }
    // SAFETY: as the caller promised: `Arc::into_raw`'s pointer, still counted.
    unsafe {
        Arc::increment_strong_count(config.cast::<Config>());
        Some(Arc::from_raw(config.cast::<Config>()))
    }
}

// ---- one filter per stream ---------------------------------------------------------------

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(config: *const c_void, filter: *mut c_void) -> *const c_void {
    guarded(std::ptr::null(), || {
        // SAFETY: config_new's pointer, alive until config_destroy (after its streams).
        let Some(config) = (unsafe { config_arc(config) }) else {
            return std::ptr::null();
        };
        let context = worker::with(|w| w.new_stream(&config, FilterPtr(filter)));
        Box::into_raw(Box::new(StreamFilter { context, config, started: false, buffering: [false; 2] }))
            as *const c_void
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter: *mut c_void,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    on_stream(filter, module, Flow::headers_status, |s, h| s.on_request_headers(h, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter: *mut c_void,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    on_body(filter, module, false, |s, h, size| s.on_request_body(h, size, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter: *mut c_void,
    module: *const c_void,
) -> u32 {
    on_stream(filter, module, Flow::headers_status, |s, h| s.on_request_trailers(h))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter: *mut c_void,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    on_stream(filter, module, Flow::headers_status, |s, h| s.on_response_headers(h, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter: *mut c_void,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    on_body(filter, module, true, |s, h, size| s.on_response_body(h, size, end_of_stream))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter: *mut c_void,
    module: *const c_void,
) -> u32 {
    on_stream(filter, module, Flow::headers_status, |s, h| s.on_response_trailers(h))
}

/// The stream is done (proxy-wasm's `on_log`): its outcome is settled and logged.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(filter: *mut c_void, module: *const c_void) {
    guarded((), || {
        // SAFETY: Envoy's module pointer for this stream.
        let Some(s) = (unsafe { stream(module) }) else {
            return;
        };
        let host = Native::new(Arc::clone(&s.config), Some((s.context, FilterPtr(filter))));
        let context = s.context;
        worker::with(|w| w.enter(&host, (), |c, h| c.on_log(h, context)));
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    guarded((), || {
        if module.is_null() {
            return;
        }
        // SAFETY: the box filter_new made, released once, here.
        let s = unsafe { Box::from_raw(module as *mut StreamFilter) };
        worker::with(|w| w.end_stream(s.context));
    })
}

/// idem sends no stream callout (every call goes through the config, `calls.rs`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _filter: *mut c_void,
    _module: *const c_void,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

/// A tick the ticker committed to this stream's scheduler (the worker's roots run their timers),
/// or a wake-up (answers are in the worker's mailbox).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _filter: *mut c_void,
    module: *const c_void,
    event_id: u64,
) {
    guarded((), || {
        // SAFETY: Envoy's module pointer for this stream.
        if unsafe { stream(module) }.is_none() {
            return;
        }
        worker::with(|w| {
            w.take_answers();
            if event_id == ticker::TICK {
                w.tick();
            }
            if event_id == ticker::FLUSH {
                w.flush_counts();
            }
            if event_id == ticker::ROOTS {
                w.run_roots();
            }
        });
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _filter: *mut c_void,
    _module: *const c_void,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter: *mut c_void,
    _module: *const c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter: *mut c_void,
    _module: *const c_void,
) {
}

// ---- hooks for what idem never starts (streamed callouts, config-level events) -------------

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _headers: *mut EnvoyHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _trailers: *mut EnvoyHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter: *mut c_void,
    _module: *const c_void,
    _stream_id: u64,
    _reason: u32,
) {
}

/// Main thread: calls the workers queued are sent (`calls.rs`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: *mut c_void,
    config: *const c_void,
    event_id: u64,
) {
    guarded((), || {
        if event_id == calls::IDLE {
            return ticker::run_idle();
        }
        // SAFETY: config_new's pointer, alive until config_destroy.
        if let Some(config) = unsafe { config_arc(config) } {
            config.calls.send_queued(&config);
        }
    })
}

/// Main thread: a call was answered; its answer goes back to its worker (`calls.rs`).
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: *mut c_void,
    config: *const c_void,
    callout_id: u64,
    result: u32,
    headers: *mut EnvoyHeader,
    headers_size: usize,
    body_chunks: *mut EnvoyBuffer,
    body_chunks_size: usize,
) {
    guarded((), || {
        // SAFETY: config_new's pointer, alive until config_destroy.
        if let Some(config) = unsafe { config_arc(config) } {
            // SAFETY: Envoy's arrays for this hook.
            unsafe {
                config.calls.answered(
                    &config,
                    callout_id,
                    result == 0,
                    (headers, headers_size),
                    (body_chunks, body_chunks_size),
                )
            };
        }
    })
}
