//! The floor of (c) as a *native* Envoy filter, for `make bench` only (never shipped): case
//! (c0-native) in scripts/bench.py, issue 41.
//!
//! It does what bench/floor (the no-op Wasm filter of case (c0)) does, through Envoy's
//! dynamic-modules ABI (`envoy.filters.http.dynamic_modules`, a shared object loaded in-process,
//! no VM crossing): pause at the request headers and read them, hold the request until the whole
//! body is buffered and read it once, set one filter-state value, read the response headers and
//! each response body chunk as it streams. No hashing, no shared data, no counters, no logging.
//! (c0) minus (c0-native) is what the Wasm VM crossing costs a filter that does this much.
//!
//! Proof of life: a request carrying `x-floor-native-probe` gets the response header
//! `x-floor-native-seen: <bytes read>` (request headers + body + response headers). Other
//! requests get nothing added, so the measured traffic does exactly what (c0)'s does.
//!
//! The bindings below are written by hand against Envoy 1.40's `abi.h`
//! (source/extensions/dynamic_modules/abi/abi.h): only the types and callbacks used here, plus
//! every `envoy_dynamic_module_on_http_filter_*` event hook, because Envoy resolves them all when
//! the filter config is created and refuses a module that lacks a required one. The callbacks
//! (`envoy_dynamic_module_callback_*`) are left undefined in the .so and bound at dlopen time to
//! the symbols the Envoy binary exports (`nm -D envoy | grep envoy_dynamic_module_callback`).
//!
//! Only x86-64/aarch64 Linux matter here: C enums are passed as `u32`, the two-word buffer
//! structs by value (two registers), exactly as the C header declares them.

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_void};
use std::hint::black_box;

/// `envoy_dynamic_module_on_program_init`'s answer. Envoy 1.40 compares it with its own
/// `ENVOY_DYNAMIC_MODULES_ABI_VERSION` and only *warns* on a mismatch ("Dynamic module ABI version
/// {} is deprecated ..."); a match is logged at info as "Dynamic module ABI version {} matched.".
static ABI_VERSION: &[u8] = b"v0.2.0\0";

// ---- ABI types (abi.h) -------------------------------------------------------------------

type EnvoyPtr = *mut c_void;
type ModulePtr = *const c_void;

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    ptr: *const u8,
    length: usize,
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    ptr: *const u8,
    length: usize,
}

impl ModuleBuffer {
    fn of(bytes: &[u8]) -> Self {
        ModuleBuffer { ptr: bytes.as_ptr(), length: bytes.len() }
    }
}

/// `envoy_dynamic_module_type_envoy_http_header`: a header owned by Envoy's HeaderMap.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHttpHeader {
    key_ptr: *const u8,
    key_length: usize,
    value_ptr: *const u8,
    value_length: usize,
}

const EMPTY_HEADER: EnvoyHttpHeader =
    EnvoyHttpHeader { key_ptr: std::ptr::null(), key_length: 0, value_ptr: std::ptr::null(), value_length: 0 };
const EMPTY_BUFFER: EnvoyBuffer = EnvoyBuffer { ptr: std::ptr::null(), length: 0 };

// envoy_dynamic_module_type_http_header_type
const REQUEST_HEADER: u32 = 0;
const RESPONSE_HEADER: u32 = 2;
// envoy_dynamic_module_type_http_body_type
const RECEIVED_REQUEST_BODY: u32 = 0;
const BUFFERED_REQUEST_BODY: u32 = 1;
const RECEIVED_RESPONSE_BODY: u32 = 2;
// envoy_dynamic_module_type_on_http_filter_*_status
const CONTINUE: u32 = 0;
const HEADERS_STOP_ITERATION: u32 = 1;
const BODY_STOP_ITERATION_AND_BUFFER: u32 = 1;

// ---- callbacks Envoy exports ---------------------------------------------------------------

extern "C" {
    fn envoy_dynamic_module_callback_http_get_headers_size(filter: EnvoyPtr, header_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        filter: EnvoyPtr,
        header_type: u32,
        result_headers: *mut EnvoyHttpHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(filter: EnvoyPtr, body_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: EnvoyPtr,
        body_type: u32,
        result_buffer_vector: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: EnvoyPtr,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: EnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
}

// ---- the filter ----------------------------------------------------------------------------

const PROBE: &[u8] = b"x-floor-native-probe";
const SEEN: &[u8] = b"x-floor-native-seen";
const FILTER_STATE_KEY: &[u8] = b"floor_seen";

struct Floor {
    /// Bytes read from Envoy, so the reads are not optimised away.
    seen: usize,
    /// The request asked for proof (`x-floor-native-probe`).
    probe: bool,
}

/// Envoy's `(ptr, length)` as a slice (an empty one for a null pointer).
unsafe fn envoy_bytes<'a>(ptr: *const u8, length: usize) -> &'a [u8] {
    if ptr.is_null() || length == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(ptr, length)
    }
}

/// Reads every header of one map (no copy: Envoy hands out pointers into its HeaderMap). Returns
/// (bytes, whether the probe header is among them).
unsafe fn read_headers(filter: EnvoyPtr, header_type: u32) -> (usize, bool) {
    let n = envoy_dynamic_module_callback_http_get_headers_size(filter, header_type);
    let mut stack = [EMPTY_HEADER; 32];
    let mut heap = Vec::new();
    let headers: &mut [EnvoyHttpHeader] = if n <= stack.len() {
        &mut stack[..n]
    } else {
        heap.resize(n, EMPTY_HEADER);
        &mut heap[..]
    };
    if n == 0 || !envoy_dynamic_module_callback_http_get_headers(filter, header_type, headers.as_mut_ptr()) {
        return (0, false);
    }
    let mut bytes = 0;
    let mut probe = false;
    for h in headers.iter() {
        let key = envoy_bytes(h.key_ptr, h.key_length);
        let value = envoy_bytes(h.value_ptr, h.value_length);
        probe |= key == PROBE;
        bytes += black_box(key).len() + black_box(value).len();
    }
    (bytes, probe)
}

/// Reads every chunk of one body buffer.
unsafe fn read_body(filter: EnvoyPtr, body_type: u32) -> usize {
    let n = envoy_dynamic_module_callback_http_get_body_chunks_size(filter, body_type);
    if n == 0 {
        return 0;
    }
    let mut stack = [EMPTY_BUFFER; 16];
    let mut heap = Vec::new();
    let chunks: &mut [EnvoyBuffer] = if n <= stack.len() {
        &mut stack[..n]
    } else {
        heap.resize(n, EMPTY_BUFFER);
        &mut heap[..]
    };
    if !envoy_dynamic_module_callback_http_get_body_chunks(filter, body_type, chunks.as_mut_ptr()) {
        return 0;
    }
    chunks.iter().map(|c| black_box(envoy_bytes(c.ptr, c.length)).len()).sum()
}

/// `n` in decimal, into `buf`; the digits' slice.
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[i..];
        }
    }
}

unsafe fn floor<'a>(module: ModulePtr) -> &'a mut Floor {
    &mut *(module as *mut Floor)
}

// ---- event hooks: program and filter config --------------------------------------------------

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr().cast()
}

/// Any non-null pointer: the config holds nothing.
static CONFIG: u8 = 0;

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy: EnvoyPtr,
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> ModulePtr {
    (&CONFIG as *const u8).cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(_config: ModulePtr) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> ModulePtr {
    (&CONFIG as *const u8).cast()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: ModulePtr) {}

// ---- event hooks: one filter per stream -----------------------------------------------------

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(_config: ModulePtr, _filter: EnvoyPtr) -> ModulePtr {
    Box::into_raw(Box::new(Floor { seen: 0, probe: false })) as ModulePtr
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter: EnvoyPtr,
    module: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    let f = floor(module);
    let (bytes, probe) = read_headers(filter, REQUEST_HEADER);
    f.seen += bytes;
    f.probe = probe;
    if end_of_stream {
        CONTINUE
    } else {
        HEADERS_STOP_ITERATION
    }
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter: EnvoyPtr,
    module: ModulePtr,
    end_of_stream: bool,
) -> u32 {
    if !end_of_stream {
        return BODY_STOP_ITERATION_AND_BUFFER;
    }
    let f = floor(module);
    // The whole body: what was buffered so far plus this last chunk.
    f.seen += read_body(filter, BUFFERED_REQUEST_BODY) + read_body(filter, RECEIVED_REQUEST_BODY);
    let mut buf = [0u8; 20];
    let value = decimal(f.seen, &mut buf);
    envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter,
        ModuleBuffer::of(FILTER_STATE_KEY),
        ModuleBuffer::of(value),
    );
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(_filter: EnvoyPtr, _module: ModulePtr) -> u32 {
    CONTINUE
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter: EnvoyPtr,
    module: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    let f = floor(module);
    f.seen += read_headers(filter, RESPONSE_HEADER).0;
    if f.probe {
        let mut buf = [0u8; 20];
        let value = decimal(f.seen, &mut buf);
        envoy_dynamic_module_callback_http_set_header(
            filter,
            RESPONSE_HEADER,
            ModuleBuffer::of(SEEN),
            ModuleBuffer::of(value),
        );
    }
    CONTINUE
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter: EnvoyPtr,
    module: ModulePtr,
    _end_of_stream: bool,
) -> u32 {
    floor(module).seen += read_body(filter, RECEIVED_RESPONSE_BODY);
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(_filter: EnvoyPtr, _module: ModulePtr) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(_filter: EnvoyPtr, _module: ModulePtr) {}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: ModulePtr) {
    drop(Box::from_raw(module as *mut Floor));
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _filter: EnvoyPtr,
    _module: ModulePtr,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter: EnvoyPtr,
    _module: ModulePtr,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter: EnvoyPtr,
    _module: ModulePtr,
) {
}

// ---- event hooks this module never triggers (no callouts, streams or schedulers), present
// because Envoy requires them when it creates the filter config -----------------------------

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(_filter: EnvoyPtr, _module: ModulePtr, _event_id: u64) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _filter: EnvoyPtr,
    _module: ModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter: EnvoyPtr,
    _module: ModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: EnvoyPtr,
    _config: ModulePtr,
    _event_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: EnvoyPtr,
    _config: ModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_headers(
    _config_envoy: EnvoyPtr,
    _config: ModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_data(
    _config_envoy: EnvoyPtr,
    _config: ModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_trailers(
    _config_envoy: EnvoyPtr,
    _config: ModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_complete(
    _config_envoy: EnvoyPtr,
    _config: ModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_reset(
    _config_envoy: EnvoyPtr,
    _config: ModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}
