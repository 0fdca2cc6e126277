//! The proxy-wasm ABI (v0.2.1) called directly, returning every status as an error.
//!
//! Why not `proxy_wasm::hostcalls`: in proxy-wasm 0.2.5 every hostcall `panic!`s on a status it
//! did not expect, and the string getters unwrap `String::from_utf8`. A panic traps the VM, and
//! every later request on that worker fails until Envoy restarts — one Latin-1 header byte would
//! do it. So the glue reads bytes and gets `Err(status)` for anything but `Ok`.
//!
//! No SDK is linked at all: the module's exports (`super::exports`) are ours too, so the callout
//! owner table, the context table and the body statuses Envoy accepts (watermark, no-buffer) are
//! idem's to decide, not the SDK dispatcher's (which routes a reply to the context *it* thinks
//! was active at dispatch, and `unwrap`s its maps).
//!
//! Memory the host returns was allocated through our `proxy_on_memory_allocate` (a boxed slice of
//! exactly that size), so it is taken back with `Vec::from_raw_parts(ptr, len, len)`.

use crate::pairs::{self, Pair};
use std::ptr::{null, null_mut};

/// A status other than `Ok` (the ABI's numbering: 1 NotFound, 2 BadArgument, 7 Empty,
/// 8 CasMismatch, 10 InternalFailure).
pub(super) type Status = u32;
const NOT_FOUND: Status = 1;
const EMPTY: Status = 7;
pub(super) const CAS_MISMATCH: Status = 8;
const OK: u32 = 0;

pub(super) mod map {
    pub(in super::super) const REQUEST_HEADERS: u32 = 0;
    pub(in super::super) const RESPONSE_HEADERS: u32 = 2;
    pub(in super::super) const RESPONSE_TRAILERS: u32 = 3;
    pub(in super::super) const CALL_RESPONSE_HEADERS: u32 = 6;
    pub(in super::super) const CALL_RESPONSE_TRAILERS: u32 = 7;
}
pub(super) mod buffer {
    pub(in super::super) const REQUEST_BODY: u32 = 0;
    pub(in super::super) const RESPONSE_BODY: u32 = 1;
    pub(in super::super) const CALL_RESPONSE_BODY: u32 = 4;
    pub(in super::super) const PLUGIN_CONFIGURATION: u32 = 7;
}
const STREAM_REQUEST: u32 = 0;
const STREAM_RESPONSE: u32 = 1;

#[allow(clashing_extern_declarations)]
extern "C" {
    fn proxy_log(level: u32, message_data: *const u8, message_size: usize) -> u32;
    fn proxy_get_log_level(return_level: *mut u32) -> u32;
    fn proxy_get_current_time_nanoseconds(return_time: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer_type: u32,
        start: usize,
        max_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map_type: u32, return_data: *mut *mut u8, return_size: *mut usize) -> u32;
    fn proxy_get_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_get_property(
        path_data: *const u8,
        path_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
    ) -> u32;
    fn proxy_set_property(path_data: *const u8, path_size: usize, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_get_shared_data(
        key_data: *const u8,
        key_size: usize,
        return_data: *mut *mut u8,
        return_size: *mut usize,
        return_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    fn proxy_register_shared_queue(name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_dequeue_shared_queue(queue_id: u32, return_data: *mut *mut u8, return_size: *mut usize) -> u32;
    fn proxy_enqueue_shared_queue(queue_id: u32, value_data: *const u8, value_size: usize) -> u32;
    fn proxy_continue_stream(stream_type: u32) -> u32;
    fn proxy_send_local_response(
        status_code: u32,
        details_data: *const u8,
        details_size: usize,
        body_data: *const u8,
        body_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_set_effective_context(context_id: u32) -> u32;
    fn proxy_replace_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map_type: u32, key_data: *const u8, key_size: usize) -> u32;
    fn proxy_add_header_map_value(
        map_type: u32,
        key_data: *const u8,
        key_size: usize,
        value_data: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_define_metric(metric_type: u32, name_data: *const u8, name_size: usize, return_id: *mut u32) -> u32;
    fn proxy_increment_metric(metric_id: u32, offset: i64) -> u32;
    fn proxy_record_metric(metric_id: u32, value: u64) -> u32;
    fn proxy_http_call(
        upstream_data: *const u8,
        upstream_size: usize,
        headers_data: *const u8,
        headers_size: usize,
        body_data: *const u8,
        body_size: usize,
        trailers_data: *const u8,
        trailers_size: usize,
        timeout_ms: u32,
        return_token: *mut u32,
    ) -> u32;
}

fn check(status: u32) -> Result<(), Status> {
    if status == OK {
        Ok(())
    } else {
        Err(status)
    }
}

/// Takes ownership of a host-allocated buffer (see the module doc).
///
/// SAFETY (of the callers): `data`/`size` come straight from a host call that returned `Ok`.
fn take(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    if data.is_null() || size == 0 {
        return None;
    }
    // SAFETY: allocated by `proxy_on_memory_allocate(size)` as a boxed slice of `size` bytes.
    Some(unsafe { Vec::from_raw_parts(data, size, size) })
}

/// A call that returns bytes: `Ok(None)` for NotFound or an empty value.
fn read_bytes(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Result<Option<Vec<u8>>, Status> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    match call(&mut data, &mut size) {
        OK => Ok(take(data, size)),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

pub(super) fn log(level: u32, msg: &str) {
    // SAFETY: a live slice.
    let _ = unsafe { proxy_log(level, msg.as_ptr(), msg.len()) };
}

pub(super) fn log_level() -> Result<u32, Status> {
    let mut level = 0;
    // SAFETY: a live out-pointer.
    check(unsafe { proxy_get_log_level(&mut level) })?;
    Ok(level)
}

pub(super) fn now_ms() -> Result<u64, Status> {
    let mut ns = 0u64;
    // SAFETY: a live out-pointer.
    check(unsafe { proxy_get_current_time_nanoseconds(&mut ns) })?;
    Ok(ns / 1_000_000)
}

pub(super) fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    // SAFETY: plain value.
    check(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

pub(super) fn buffer(buffer_type: u32, start: usize, max: usize) -> Result<Option<Vec<u8>>, Status> {
    // SAFETY: out-pointers from read_bytes.
    read_bytes(|d, s| unsafe { proxy_get_buffer_bytes(buffer_type, start, max, d, s) })
}

/// Every header of a map, serialized, to be read in place.
pub(super) fn header_block(map_type: u32) -> Result<pairs::Headers, Status> {
    // SAFETY: out-pointers from read_bytes.
    let bytes = read_bytes(|d, s| unsafe { proxy_get_header_map_pairs(map_type, d, s) })?;
    Ok(pairs::Headers::from_bytes(bytes.unwrap_or_default()))
}

/// Every header of a map, as bytes.
pub(super) fn headers(map_type: u32) -> Result<Vec<Pair>, Status> {
    // SAFETY: out-pointers from read_bytes.
    let bytes = read_bytes(|d, s| unsafe { proxy_get_header_map_pairs(map_type, d, s) })?;
    Ok(bytes.map(|b| pairs::decode(&b)).unwrap_or_default())
}

/// One header's value as bytes (Envoy gives the first when a header repeats).
pub(super) fn header(map_type: u32, name: &str) -> Result<Option<Vec<u8>>, Status> {
    // SAFETY: a live slice and out-pointers from read_bytes.
    read_bytes(|d, s| unsafe { proxy_get_header_map_value(map_type, name.as_ptr(), name.len(), d, s) })
}

pub(super) fn property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let p = pairs::property_path(path);
    // SAFETY: a live slice and out-pointers from read_bytes.
    read_bytes(|d, s| unsafe { proxy_get_property(p.as_ptr(), p.len(), d, s) })
}

/// Filter state `wasm.<name>`. Unlike reads, the name goes as it is: Envoy prefixes it with
/// `wasm.` verbatim, so a path serialized with its NUL terminator would name another key.
pub(super) fn set_property(name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: live slices.
    check(unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// A shared-data value and its CAS; `None` when the key was never written.
pub(super) fn shared_get(key: &str) -> Result<Option<(Vec<u8>, u32)>, Status> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    let mut cas: u32 = 0;
    // SAFETY: a live slice and out-pointers.
    match unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) } {
        OK => Ok(Some((take(data, size).unwrap_or_default(), cas))),
        NOT_FOUND => Ok(None),
        s => Err(s),
    }
}

pub(super) fn shared_set(key: &str, value: &[u8], cas: u32) -> Result<(), Status> {
    // SAFETY: live slices.
    check(unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) })
}

pub(super) fn register_queue(name: &str) -> Result<u32, Status> {
    let mut id = 0;
    // SAFETY: a live slice and out-pointer.
    check(unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// `Ok(true)` when an item was taken, `Ok(false)` when the queue is empty.
pub(super) fn dequeue(queue: u32) -> Result<bool, Status> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    // SAFETY: out-pointers.
    match unsafe { proxy_dequeue_shared_queue(queue, &mut data, &mut size) } {
        OK => {
            let _ = take(data, size);
            Ok(true)
        }
        NOT_FOUND | EMPTY => Ok(false),
        s => Err(s),
    }
}

pub(super) fn enqueue(queue: u32, value: &[u8]) -> Result<(), Status> {
    // SAFETY: a live slice.
    check(unsafe { proxy_enqueue_shared_queue(queue, value.as_ptr(), value.len()) })
}

pub(super) fn resume_request() -> Result<(), Status> {
    // SAFETY: plain value.
    check(unsafe { proxy_continue_stream(STREAM_REQUEST) })
}

pub(super) fn resume_response() -> Result<(), Status> {
    // SAFETY: plain value.
    check(unsafe { proxy_continue_stream(STREAM_RESPONSE) })
}

/// A local reply; header values are bytes (a replayed upstream header need not be UTF-8).
/// `grpc_status`: the code of a trailers-only gRPC answer (Envoy then puts `body` into
/// `grpc-message`); `None` lets Envoy derive one from the HTTP status.
pub(super) fn send_response<N: AsRef<[u8]>, V: AsRef<[u8]>>(
    status: u16,
    headers: &[(N, V)],
    body: &[u8],
    grpc_status: Option<u32>,
) -> Result<(), Status> {
    let h = pairs::encode(headers);
    let (body_ptr, body_len) = if body.is_empty() { (null(), 0) } else { (body.as_ptr(), body.len()) };
    let grpc = grpc_status.and_then(|g| i32::try_from(g).ok()).unwrap_or(-1);
    // SAFETY: live slices; -1 = no gRPC status.
    check(unsafe {
        proxy_send_local_response(u32::from(status), null(), 0, body_ptr, body_len, h.as_ptr(), h.len(), grpc)
    })
}

pub(super) fn replace_header(map_type: u32, name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: live slices.
    check(unsafe { proxy_replace_header_map_value(map_type, name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

pub(super) fn remove_header(map_type: u32, name: &str) -> Result<(), Status> {
    // SAFETY: a live slice.
    check(unsafe { proxy_remove_header_map_value(map_type, name.as_ptr(), name.len()) })
}

pub(super) fn add_header(map_type: u32, name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: live slices.
    check(unsafe { proxy_add_header_map_value(map_type, name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

pub(super) fn set_effective_context(ctx: u32) -> Result<(), Status> {
    // SAFETY: plain value.
    check(unsafe { proxy_set_effective_context(ctx) })
}

/// Metric types: 0 counter, 2 histogram.
pub(super) fn define_metric(metric_type: u32, name: &str) -> Result<u32, Status> {
    let mut id = 0;
    // SAFETY: a live slice and out-pointer.
    check(unsafe { proxy_define_metric(metric_type, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub(super) fn record(metric: u32, value: u64) {
    // SAFETY: plain values.
    let _ = unsafe { proxy_record_metric(metric, value) };
}

pub(super) fn increment(metric: u32, by: i64) {
    // SAFETY: plain values.
    let _ = unsafe { proxy_increment_metric(metric, by) };
}

/// A callout through Envoy's async HTTP client; its token. Envoy keeps the call on the context
/// that is effective now (cancelled when that context ends) and answers it there.
pub(super) fn dispatch<N: AsRef<str>, V: AsRef<str>>(
    cluster: &str,
    headers: &[(N, V)],
    body: &[u8],
    timeout_ms: u64,
) -> Result<u32, Status> {
    let pairs: Vec<(&[u8], &[u8])> =
        headers.iter().map(|(n, v)| (n.as_ref().as_bytes(), v.as_ref().as_bytes())).collect();
    let h = pairs::encode(&pairs);
    let trailers = pairs::encode::<&[u8], &[u8]>(&[]);
    let (body_ptr, body_len) = if body.is_empty() { (null(), 0) } else { (body.as_ptr(), body.len()) };
    let timeout = timeout_ms.clamp(1, u64::from(u32::MAX)) as u32;
    let mut token = 0;
    // SAFETY: live slices and out-pointer.
    check(unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            h.as_ptr(),
            h.len(),
            body_ptr,
            body_len,
            trailers.as_ptr(),
            trailers.len(),
            timeout,
            &mut token,
        )
    })?;
    Ok(token)
}
