//! Envoy 1.40's dynamic-module ABI (`source/extensions/dynamic_modules/abi/abi.h`), written by
//! hand: the types, the callbacks idem calls, and safe wrappers over them. The only `unsafe` in
//! the crate besides the exported hooks' pointer arguments (`hooks.rs`).
//!
//! The rules each wrapper keeps, from the header:
//! - A `module_buffer` (bytes we pass) only has to live for the call: Envoy copies what it keeps.
//! - An `envoy_buffer` (bytes Envoy hands us: a header value, a body chunk, an attribute) is
//!   valid until the current hook returns or a setter changes the map; every wrapper copies it
//!   out before returning, so no Envoy pointer outlives the call that produced it.
//! - A `(ptr, length)` pair from Envoy may be null with length 0: read as empty.
//! - Enums cross as `u32` (C enums on x86-64 and aarch64 Linux); the two-word buffer structs go by
//!   value, as the header declares them.
//! - Envoy assigns callout ids (`*callout_id_out`, written only on success).
//! - A scheduler is allocated by Envoy and freed by us (`scheduler_delete`); `commit` may be called
//!   from any thread and is a no-op once its filter is gone.

use std::ffi::c_void;
use std::ptr::null;

/// `envoy_dynamic_module_type_http_filter_envoy_ptr`: Envoy's filter of one stream, valid until
/// `on_http_filter_destroy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FilterPtr(pub *mut c_void);

/// `envoy_dynamic_module_type_http_filter_config_envoy_ptr`: Envoy's filter config, valid until
/// `on_http_filter_config_destroy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigPtr(pub *mut c_void);

// SAFETY: both are opaque handles; Envoy documents which thread may use them (the config's
// metrics callbacks from any thread, the filter's only on its worker), and we keep to that.
unsafe impl Send for ConfigPtr {}
unsafe impl Sync for ConfigPtr {}

/// `envoy_dynamic_module_type_http_filter_config_scheduler_module_ptr`: runs events on the main
/// thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigScheduler(pub *mut c_void);

// SAFETY: `config_scheduler_commit` is documented safe from any thread.
unsafe impl Send for ConfigScheduler {}
unsafe impl Sync for ConfigScheduler {}

/// `envoy_dynamic_module_type_http_filter_scheduler_module_ptr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerPtr(pub *mut c_void);

// SAFETY: `scheduler_commit` is documented safe from any thread.
unsafe impl Send for SchedulerPtr {}

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module, borrowed for one call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    ptr: *const u8,
    length: usize,
}

impl ModuleBuffer {
    pub fn of(bytes: &[u8]) -> Self {
        ModuleBuffer { ptr: bytes.as_ptr(), length: bytes.len() }
    }
}

/// `envoy_dynamic_module_type_envoy_http_header`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_module_http_header`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ModuleHeader {
    key_ptr: *const u8,
    key_length: usize,
    value_ptr: *const u8,
    value_length: usize,
}

impl ModuleHeader {
    fn of(name: &[u8], value: &[u8]) -> Self {
        ModuleHeader {
            key_ptr: name.as_ptr(),
            key_length: name.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }

    /// A callout's headers, borrowing the bytes for the call.
    fn all<'a>(headers: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Vec<ModuleHeader> {
        headers.map(|(n, v)| ModuleHeader::of(n, v)).collect()
    }
}

const EMPTY_HEADER: EnvoyHeader = EnvoyHeader { key_ptr: null(), key_length: 0, value_ptr: null(), value_length: 0 };
const EMPTY_BUFFER: EnvoyBuffer = EnvoyBuffer { ptr: null(), length: 0 };

/// `envoy_dynamic_module_type_http_header_type`.
pub mod header_type {
    pub const REQUEST: u32 = 0;
    pub const RESPONSE: u32 = 2;
    pub const RESPONSE_TRAILER: u32 = 3;
}

/// `envoy_dynamic_module_type_http_body_type`.
pub mod body_type {
    pub const RECEIVED_REQUEST: u32 = 0;
    pub const BUFFERED_REQUEST: u32 = 1;
    pub const RECEIVED_RESPONSE: u32 = 2;
    pub const BUFFERED_RESPONSE: u32 = 3;
}

/// `envoy_dynamic_module_type_attribute_id` (the ones idem reads).
pub mod attribute {
    pub const REQUEST_TOTAL_SIZE: u32 = 14;
    pub const RESPONSE_CODE_DETAILS: u32 = 16;
    pub const XDS_CLUSTER_NAME: u32 = 57;
    pub const XDS_ROUTE_NAME: u32 = 61;
}

/// `envoy_dynamic_module_type_metadata_source_Dynamic`: the stream's dynamic metadata.
const METADATA_DYNAMIC: u32 = 0;
/// `envoy_dynamic_module_type_http_callout_init_result_Success`.
const CALLOUT_INIT_SUCCESS: u32 = 0;
/// `envoy_dynamic_module_type_metrics_result_Success`.
const METRICS_SUCCESS: u32 = 0;

extern "C" {
    fn envoy_dynamic_module_callback_log(level: u32, message: ModuleBuffer);
    fn envoy_dynamic_module_callback_log_enabled(level: u32) -> bool;

    fn envoy_dynamic_module_callback_http_get_header(
        filter: *mut c_void,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_headers_size(filter: *mut c_void, header_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_headers(
        filter: *mut c_void,
        header_type: u32,
        result_headers: *mut EnvoyHeader,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_set_header(
        filter: *mut c_void,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_add_header(
        filter: *mut c_void,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    fn envoy_dynamic_module_callback_http_get_body_chunks_size(filter: *mut c_void, body_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_size(filter: *mut c_void, body_type: u32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: *mut c_void,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    fn envoy_dynamic_module_callback_http_send_response(
        filter: *mut c_void,
        status_code: u32,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );
    fn envoy_dynamic_module_callback_http_send_response_headers(
        filter: *mut c_void,
        headers: *mut ModuleHeader,
        headers_size: usize,
        end_stream: bool,
    );
    fn envoy_dynamic_module_callback_http_send_response_data(filter: *mut c_void, data: ModuleBuffer, end_stream: bool);
    fn envoy_dynamic_module_callback_http_send_response_trailers(
        filter: *mut c_void,
        trailers: *mut ModuleHeader,
        trailers_size: usize,
    );
    fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: *mut c_void);
    fn envoy_dynamic_module_callback_http_clear_route_cache(filter: *mut c_void);
    fn envoy_dynamic_module_callback_http_filter_continue_encoding(filter: *mut c_void);

    fn envoy_dynamic_module_callback_http_set_filter_state_bytes(
        filter: *mut c_void,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: *mut c_void,
        source: u32,
        ns: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: *mut c_void,
        attribute: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_filter_get_attribute_int(
        filter: *mut c_void,
        attribute: u32,
        result: *mut u64,
    ) -> bool;

    fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        config: *mut c_void,
        callout_id_out: *mut u64,
        cluster: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(config: *mut c_void) -> *mut c_void;
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(scheduler: *mut c_void, event_id: u64);
    fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(scheduler: *mut c_void);

    fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: *mut c_void) -> *mut c_void;
    fn envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: *mut c_void, event_id: u64);
    fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: *mut c_void);

    fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: *mut c_void,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        histogram_id: *mut usize,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
    fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
        config: *mut c_void,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> u32;
}

/// Envoy's bytes as a slice (empty for a null pointer). The caller copies them before the hook
/// returns.
///
/// # Safety
/// `ptr` is null or points at `length` readable bytes owned by Envoy for the current hook.
pub unsafe fn envoy_bytes<'a>(ptr: *const u8, length: usize) -> &'a [u8] {
    if ptr.is_null() || length == 0 {
        &[]
    } else {
        // SAFETY: as the caller promised.
        unsafe { std::slice::from_raw_parts(ptr, length) }
    }
}

/// Reads an array of Envoy's headers `(ptr, count)` (a hook's argument) in place: `read` sees
/// every `(name, value)` as bytes, which do not outlive it.
///
/// # Safety
/// `headers` is null or points at `count` headers valid for the current hook.
pub unsafe fn read_headers<R>(
    headers: *const EnvoyHeader,
    count: usize,
    read: impl FnOnce(&[(&[u8], &[u8])]) -> R,
) -> R {
    if headers.is_null() || count == 0 {
        return read(&[]);
    }
    // SAFETY: as the caller promised.
    let all = unsafe { std::slice::from_raw_parts(headers, count) };
    // SAFETY: the same headers, valid for the hook; the slices do not outlive `read`.
    read(&unsafe { borrow_headers(all) })
}

/// Each header's name and value as slices of Envoy's memory.
///
/// # Safety
/// Every header's pointers are Envoy's, valid for as long as the returned slices are used.
unsafe fn borrow_headers(all: &[EnvoyHeader]) -> Vec<(&[u8], &[u8])> {
    // SAFETY: as the caller promised.
    all.iter()
        .map(|h| unsafe { (envoy_bytes(h.key_ptr, h.key_length), envoy_bytes(h.value_ptr, h.value_length)) })
        .collect()
}

/// Appends an array of Envoy's buffers `(ptr, count)` to `out` until it holds `limit` bytes (what
/// the core asked for; what `out` held before counts, and is never cut). The room is reserved
/// once: growing a 16 KB body chunk by chunk copied it again (~17k instructions under callgrind).
///
/// # Safety
/// `chunks` is null or points at `count` buffers valid for the current hook.
pub unsafe fn copy_chunks(chunks: *const EnvoyBuffer, count: usize, out: &mut Vec<u8>, limit: usize) {
    if chunks.is_null() || count == 0 {
        return;
    }
    // SAFETY: as the caller promised.
    let chunks = unsafe { std::slice::from_raw_parts(chunks, count) };
    let room = limit.saturating_sub(out.len());
    out.reserve(room.min(chunks.iter().map(|c| c.length).fold(0, usize::saturating_add)));
    for c in chunks {
        let room = limit.saturating_sub(out.len());
        if room == 0 {
            return;
        }
        // SAFETY: each chunk is Envoy's, valid for the hook.
        let bytes = unsafe { envoy_bytes(c.ptr, c.length) };
        out.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

// ---- common --------------------------------------------------------------------------------

/// Logs under Envoy's `dynamic_modules` logger; `level` in Envoy's numbering (trace 0 … critical 5).
pub fn log(level: u32, message: &str) {
    // SAFETY: a live slice for the call.
    unsafe { envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message.as_bytes())) }
}

/// Whether Envoy logs at `level` for the `dynamic_modules` logger.
pub fn log_enabled(level: u32) -> bool {
    // SAFETY: a plain value.
    unsafe { envoy_dynamic_module_callback_log_enabled(level) }
}

// ---- a stream's filter -----------------------------------------------------------------------

impl FilterPtr {
    /// One header's first value (`index` 0), copied.
    pub fn header(self, header_type: u32, name: &str) -> Option<Vec<u8>> {
        let mut out = EMPTY_BUFFER;
        let mut count = 0usize;
        // SAFETY: a live filter, a live key, out-pointers to locals.
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_header(
                self.0,
                header_type,
                ModuleBuffer::of(name.as_bytes()),
                &mut out,
                0,
                &mut count,
            )
        };
        // SAFETY: Envoy's buffer for this hook, copied at once.
        (found && count > 0).then(|| unsafe { envoy_bytes(out.ptr, out.length) }.to_vec())
    }

    /// `read` over every header of one map, borrowed from Envoy for the call (no copy per header).
    pub fn with_headers<R>(self, header_type: u32, read: impl FnOnce(&[(&[u8], &[u8])]) -> R) -> R {
        let mut stack = [EMPTY_HEADER; 32];
        let mut heap = Vec::new();
        // SAFETY: a live filter.
        let n = unsafe { envoy_dynamic_module_callback_http_get_headers_size(self.0, header_type) };
        let all: &mut [EnvoyHeader] = if n <= stack.len() {
            &mut stack[..n]
        } else {
            heap.resize(n, EMPTY_HEADER);
            &mut heap[..]
        };
        // SAFETY: `all` has room for the `n` headers Envoy just counted.
        if n == 0 || !unsafe { envoy_dynamic_module_callback_http_get_headers(self.0, header_type, all.as_mut_ptr()) } {
            return read(&[]);
        }
        // SAFETY: Envoy filled `n` headers valid for this hook; the slices do not outlive `read`.
        read(&unsafe { borrow_headers(all) })
    }

    /// The size of one body buffer (0 when it is not available).
    pub fn body_size(self, body_type: u32) -> usize {
        // SAFETY: a live filter.
        unsafe { envoy_dynamic_module_callback_http_get_body_size(self.0, body_type) }
    }

    /// Every header of one map, copied, in Envoy's order.
    pub fn headers(self, header_type: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.with_headers(header_type, |pairs| pairs.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect())
    }

    pub fn set_header(self, header_type: u32, name: &str, value: &[u8]) -> bool {
        // SAFETY: live slices for the call.
        unsafe {
            envoy_dynamic_module_callback_http_set_header(
                self.0,
                header_type,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }

    /// Removes a header: `set_header` with a null value.
    pub fn remove_header(self, header_type: u32, name: &str) -> bool {
        let none = ModuleBuffer { ptr: null(), length: 0 };
        // SAFETY: a live key; a null value is the documented "remove".
        unsafe {
            envoy_dynamic_module_callback_http_set_header(self.0, header_type, ModuleBuffer::of(name.as_bytes()), none)
        }
    }

    pub fn add_header(self, header_type: u32, name: &str, value: &[u8]) -> bool {
        // SAFETY: live slices for the call.
        unsafe {
            envoy_dynamic_module_callback_http_add_header(
                self.0,
                header_type,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }

    /// Appends the chunks of one body buffer to `out`, up to `limit` bytes in all; false when the
    /// body is not available.
    pub fn body(self, body_type: u32, out: &mut Vec<u8>, limit: usize) -> bool {
        // SAFETY: a live filter.
        let n = unsafe { envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, body_type) };
        if n == 0 {
            return false;
        }
        let mut chunks = vec![EMPTY_BUFFER; n];
        // SAFETY: `chunks` has room for the `n` chunks Envoy just counted.
        if !unsafe { envoy_dynamic_module_callback_http_get_body_chunks(self.0, body_type, chunks.as_mut_ptr()) } {
            return false;
        }
        // SAFETY: Envoy filled `n` chunks valid for this hook.
        unsafe { copy_chunks(chunks.as_ptr(), n, out, limit) };
        true
    }

    /// A local reply (Envoy's `sendLocalReply`); it runs the encoder filters, ours included, before
    /// it returns.
    pub fn send_response(self, status: u16, headers: &[(&[u8], &[u8])], body: &[u8], details: &str) {
        let mut h: Vec<ModuleHeader> = headers.iter().map(|(n, v)| ModuleHeader::of(n, v)).collect();
        // SAFETY: live slices for the call; Envoy copies them.
        unsafe {
            envoy_dynamic_module_callback_http_send_response(
                self.0,
                u32::from(status),
                h.as_mut_ptr(),
                h.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            )
        }
    }

    /// Makes Envoy pick the route again from the (changed) request headers, as proxy-wasm's header
    /// calls do by themselves: without it a request whose `:path` was rewritten still goes to the
    /// route chosen before.
    pub fn clear_route_cache(self) {
        // SAFETY: a live filter.
        unsafe { envoy_dynamic_module_callback_http_clear_route_cache(self.0) }
    }

    /// An answer sent as headers (with `:status`), body and trailers — what a local reply cannot
    /// carry (a gRPC answer's `grpc-status` trailer). Like `send_response`, it runs the encoder
    /// filters, ours included, before it returns.
    pub fn send_with_trailers(self, headers: &[(&[u8], &[u8])], body: &[u8], trailers: &[(&[u8], &[u8])]) {
        let mut h: Vec<ModuleHeader> = headers.iter().map(|(n, v)| ModuleHeader::of(n, v)).collect();
        let mut t: Vec<ModuleHeader> = trailers.iter().map(|(n, v)| ModuleHeader::of(n, v)).collect();
        // SAFETY: live slices for each call; Envoy copies them.
        unsafe {
            envoy_dynamic_module_callback_http_send_response_headers(self.0, h.as_mut_ptr(), h.len(), false);
            envoy_dynamic_module_callback_http_send_response_data(self.0, ModuleBuffer::of(body), false);
            envoy_dynamic_module_callback_http_send_response_trailers(self.0, t.as_mut_ptr(), t.len());
        }
    }

    pub fn continue_decoding(self) {
        // SAFETY: a live filter.
        unsafe { envoy_dynamic_module_callback_http_filter_continue_decoding(self.0) }
    }

    pub fn continue_encoding(self) {
        // SAFETY: a live filter.
        unsafe { envoy_dynamic_module_callback_http_filter_continue_encoding(self.0) }
    }

    pub fn set_filter_state(self, key: &str, value: &[u8]) -> bool {
        // SAFETY: live slices for the call.
        unsafe {
            envoy_dynamic_module_callback_http_set_filter_state_bytes(
                self.0,
                ModuleBuffer::of(key.as_bytes()),
                ModuleBuffer::of(value),
            )
        }
    }

    /// A string of the stream's dynamic metadata, `namespace` / `key`.
    pub fn dynamic_metadata(self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        let mut out = EMPTY_BUFFER;
        // SAFETY: live slices, an out-pointer to a local.
        let found = unsafe {
            envoy_dynamic_module_callback_http_get_metadata_string(
                self.0,
                METADATA_DYNAMIC,
                ModuleBuffer::of(namespace.as_bytes()),
                ModuleBuffer::of(key.as_bytes()),
                &mut out,
            )
        };
        // SAFETY: Envoy's buffer for this hook, copied at once.
        found.then(|| unsafe { envoy_bytes(out.ptr, out.length) }.to_vec())
    }

    pub fn attribute_string(self, attribute: u32) -> Option<Vec<u8>> {
        let mut out = EMPTY_BUFFER;
        // SAFETY: an out-pointer to a local.
        let found =
            unsafe { envoy_dynamic_module_callback_http_filter_get_attribute_string(self.0, attribute, &mut out) };
        // SAFETY: Envoy's buffer for this hook, copied at once.
        found.then(|| unsafe { envoy_bytes(out.ptr, out.length) }.to_vec())
    }

    pub fn attribute_int(self, attribute: u32) -> Option<u64> {
        let mut out = 0u64;
        // SAFETY: an out-pointer to a local.
        unsafe { envoy_dynamic_module_callback_http_filter_get_attribute_int(self.0, attribute, &mut out) }
            .then_some(out)
    }

    /// A scheduler on this stream's worker; freed with [`SchedulerPtr::delete`].
    pub fn scheduler(self) -> Option<SchedulerPtr> {
        // SAFETY: a live filter.
        let s = unsafe { envoy_dynamic_module_callback_http_filter_scheduler_new(self.0) };
        (!s.is_null()).then_some(SchedulerPtr(s))
    }
}

impl SchedulerPtr {
    /// Asks Envoy to call `on_http_filter_scheduled(event_id)` on the scheduler's worker; any thread.
    pub fn commit(self, event_id: u64) {
        // SAFETY: a scheduler not yet deleted (the caller's lock guarantees it).
        unsafe { envoy_dynamic_module_callback_http_filter_scheduler_commit(self.0, event_id) }
    }

    pub fn delete(self) {
        // SAFETY: a scheduler Envoy allocated, deleted once.
        unsafe { envoy_dynamic_module_callback_http_filter_scheduler_delete(self.0) }
    }
}

impl ConfigScheduler {
    /// Asks Envoy to call `on_http_filter_config_scheduled(event_id)` on the main thread; any thread.
    pub fn commit(self, event_id: u64) {
        // SAFETY: a scheduler not yet deleted (deleted only at config destroy, after its streams).
        unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_commit(self.0, event_id) }
    }

    pub fn delete(self) {
        // SAFETY: a scheduler Envoy allocated, deleted once.
        unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_delete(self.0) }
    }
}

// ---- the filter config's metrics -----------------------------------------------------------

/// The most label values a series carries (idem's families take two).
pub const MAX_LABELS: usize = 4;

/// One of a config's counters or histograms: its id and how many labels it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricId(pub usize);

impl ConfigPtr {
    /// An HTTP call through a cluster, kept on the filter config (not on any stream: it outlives
    /// the request that asked for it) and answered on the main thread
    /// (`on_http_filter_config_http_callout_done`); the id Envoy gave it, or the init result's
    /// number. Main thread only: the config's async client is the main thread's.
    pub fn callout<'a>(
        self,
        cluster: &str,
        headers: impl Iterator<Item = (&'a [u8], &'a [u8])>,
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u64, u32> {
        let mut h = ModuleHeader::all(headers);
        let mut id = 0u64;
        // SAFETY: live slices for the call (Envoy copies them), an out-pointer to a local.
        let result = unsafe {
            envoy_dynamic_module_callback_http_filter_config_http_callout(
                self.0,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                h.as_mut_ptr(),
                h.len(),
                ModuleBuffer::of(body),
                timeout_ms,
            )
        };
        if result == CALLOUT_INIT_SUCCESS {
            Ok(id)
        } else {
            Err(result)
        }
    }

    /// A scheduler whose events run on the main thread; freed with [`ConfigScheduler::delete`].
    pub fn scheduler(self) -> Option<ConfigScheduler> {
        // SAFETY: a live config.
        let s = unsafe { envoy_dynamic_module_callback_http_filter_config_scheduler_new(self.0) };
        (!s.is_null()).then_some(ConfigScheduler(s))
    }

    /// Defines a counter (`histogram` false) or histogram with these label names, at config creation.
    pub fn define(self, name: &str, labels: &[&str], histogram: bool) -> Option<MetricId> {
        let mut names: Vec<ModuleBuffer> = labels.iter().map(|l| ModuleBuffer::of(l.as_bytes())).collect();
        let (ptr, len) = if names.is_empty() { (std::ptr::null_mut(), 0) } else { (names.as_mut_ptr(), names.len()) };
        let mut id = 0usize;
        let define = if histogram {
            envoy_dynamic_module_callback_http_filter_config_define_histogram
        } else {
            envoy_dynamic_module_callback_http_filter_config_define_counter
        };
        // SAFETY: live slices for the call, an out-pointer to a local.
        let result = unsafe { define(self.0, ModuleBuffer::of(name.as_bytes()), ptr, len, &mut id) };
        (result == METRICS_SUCCESS).then_some(MetricId(id))
    }

    /// Adds `value` to a counter (`histogram` false) or records it in a histogram, with one value
    /// per label the metric was defined with. Needs no stream: callable from any worker.
    pub fn add(self, id: MetricId, labels: &[Vec<u8>], value: u64, histogram: bool) -> bool {
        let mut values = [const { ModuleBuffer { ptr: null(), length: 0 } }; MAX_LABELS];
        if labels.len() > MAX_LABELS {
            return false;
        }
        for (buffer, label) in values.iter_mut().zip(labels) {
            *buffer = ModuleBuffer::of(label);
        }
        let (ptr, len) =
            if labels.is_empty() { (std::ptr::null_mut(), 0) } else { (values.as_mut_ptr(), labels.len()) };
        let add = if histogram {
            envoy_dynamic_module_callback_http_filter_config_record_histogram_value
        } else {
            envoy_dynamic_module_callback_http_filter_config_increment_counter
        };
        // SAFETY: live slices for the call.
        unsafe { add(self.0, id.0, ptr, len, value) == METRICS_SUCCESS }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_or_empty_envoy_pair_reads_as_empty() {
        // SAFETY: null with any length, and a live pointer with length 0, read nothing.
        unsafe {
            assert_eq!(envoy_bytes(null(), 5), b"");
            assert_eq!(envoy_bytes(b"abc".as_ptr(), 0), b"");
            assert_eq!(envoy_bytes(b"abc".as_ptr(), 2), b"ab");
        }
    }

    #[test]
    fn headers_are_read_as_bytes_and_a_null_array_as_none() {
        let (k, v) = (b"x-a".to_vec(), vec![0xff, b'b']);
        let arr = [
            EnvoyHeader { key_ptr: k.as_ptr(), key_length: k.len(), value_ptr: v.as_ptr(), value_length: v.len() },
            EMPTY_HEADER,
        ];
        let copy = |pairs: &[(&[u8], &[u8])]| -> Vec<(Vec<u8>, Vec<u8>)> {
            pairs.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
        };
        // SAFETY: a live array of two headers; the second's pointers are null.
        let copied = unsafe { read_headers(arr.as_ptr(), arr.len(), copy) };
        assert_eq!(copied, vec![(k.clone(), v.clone()), (vec![], vec![])]);
        // SAFETY: a live array, of which only the first header is read.
        assert_eq!(unsafe { read_headers(arr.as_ptr(), 1, copy) }, vec![(k.clone(), v.clone())]);
        // SAFETY: a null array.
        assert!(unsafe { read_headers(null(), 3, copy) }.is_empty());
    }

    #[test]
    fn chunks_are_appended_in_order() {
        let (a, b) = (b"hello ".to_vec(), b"world".to_vec());
        let arr = [
            EnvoyBuffer { ptr: a.as_ptr(), length: a.len() },
            EMPTY_BUFFER,
            EnvoyBuffer { ptr: b.as_ptr(), length: b.len() },
        ];
        let mut out = b">".to_vec();
        // SAFETY: a live array of three buffers.
        unsafe { copy_chunks(arr.as_ptr(), arr.len(), &mut out, usize::MAX) };
        assert_eq!(out, b">hello world");
        // SAFETY: a null array.
        unsafe { copy_chunks(null(), 2, &mut out, usize::MAX) };
        assert_eq!(out, b">hello world");
        // The limit counts what `out` already held, and cuts inside a chunk or at its end.
        for (limit, want) in
            [(0, &b">"[..]), (1, b">"), (4, b">hel"), (7, b">hello "), (9, b">hello wo"), (99, b">hello world")]
        {
            let mut out = b">".to_vec();
            // SAFETY: a live array of three buffers.
            unsafe { copy_chunks(arr.as_ptr(), arr.len(), &mut out, limit) };
            assert_eq!(out, want, "limit {limit}");
        }
    }

    #[test]
    fn module_buffers_point_at_the_bytes_they_were_made_of() {
        let bytes = b"policy".to_vec();
        let m = ModuleBuffer::of(&bytes);
        assert_eq!((m.ptr, m.length), (bytes.as_ptr(), 6));
        let h = ModuleHeader::of(b"k", b"vv");
        assert_eq!((h.key_length, h.value_length), (1, 2));
    }
}
