//! The proxy-wasm ABI v0.2.1 exports: what Envoy calls. Each one enters the VM's
//! [`Contexts`] and hands the event on; a status goes back as the number Envoy reads.
//!
//! Envoy never calls back into the VM while a callback runs (a local reply, a resume and a
//! callout's reply are deferred until it returns), so the one `RefCell` is never borrowed twice;
//! if it ever were, the callback logs and lets the request continue rather than panic.

use super::abi;
use super::envoy::Envoy;
use crate::host::{Host, Level};
use crate::lifecycle::{Contexts, Flow};
use std::cell::RefCell;

thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts::default());
}

/// Runs `event` on the VM's contexts with a fresh host, or returns `default` (logged) if they
/// are busy.
fn enter<T>(default: T, event: impl FnOnce(&mut Contexts, &Envoy) -> T) -> T {
    let host = Envoy::entered();
    CONTEXTS.with(|c| match c.try_borrow_mut() {
        Ok(mut contexts) => event(&mut contexts, &host),
        Err(_) => {
            host.log(Level::Critical, "idem: a callback arrived while another was running; it continues untouched");
            default
        }
    })
}

fn on_stream(
    id: u32,
    status: fn(Flow) -> u32,
    event: impl FnOnce(&mut crate::lifecycle::Stream, &Envoy) -> Flow,
) -> u32 {
    status(enter(Flow::Continue, |c, host| c.on_stream(id, |s| event(s, host))))
}

extern "C" {
    fn __wasm_call_ctors();
}

/// The WASI reactor's start: static constructors, then the panic hook (which only logs: no
/// hostcall may run here).
#[no_mangle]
pub extern "C" fn _initialize() {
    // SAFETY: the linker's constructor list, called once, before anything else, as WASI reactors do.
    unsafe { __wasm_call_ctors() };
    std::panic::set_hook(Box::new(|info| {
        Envoy::entered().log(Level::Critical, &format!("idem: panic: {info}"));
    }));
}

#[no_mangle]
pub extern "C" fn proxy_abi_version_0_2_1() {}

/// Memory Envoy fills for us (header maps, bodies, shared data): a boxed slice of exactly `size`
/// bytes, taken back in [`abi`] with `Vec::from_raw_parts(ptr, size, size)`. Left uninitialised,
/// as the proxy-wasm SDKs leave it: Envoy copies the whole value in before the call that asked
/// for it returns (proxy-wasm-cpp-host's `copyToPointerSize`, `exportPairs`), so zeroing it first
/// was a second pass over every body.
#[no_mangle]
pub extern "C" fn proxy_on_memory_allocate(size: usize) -> *mut u8 {
    let slice: Box<[std::mem::MaybeUninit<u8>]> = Box::new_uninit_slice(size);
    Box::into_raw(slice) as *mut u8
}

#[no_mangle]
pub extern "C" fn proxy_on_context_create(context_id: u32, root_context_id: u32) {
    enter((), |c, _| c.create(context_id, root_context_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_vm_start(_context_id: u32, _vm_configuration_size: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_configure(context_id: u32, _plugin_configuration_size: u32) -> u32 {
    let config = match abi::buffer(abi::buffer::PLUGIN_CONFIGURATION, 0, usize::MAX) {
        Ok(bytes) => bytes.unwrap_or_default(),
        Err(s) => {
            let line = format!("idem: invalid policy: cannot read plugin configuration: status {s}");
            Envoy::entered().log(Level::Critical, &line);
            return 0;
        }
    };
    u32::from(enter(false, |c, host| c.configure(host, host, context_id, &config)))
}

#[no_mangle]
pub extern "C" fn proxy_on_tick(context_id: u32) {
    enter((), |c, host| c.on_tick(host, context_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_queue_ready(context_id: u32, queue_id: u32) {
    while let Ok(true) = abi::dequeue(queue_id) {}
    enter((), |c, host| c.on_queue_ready(host, context_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_request_headers(context_id: u32, _num_headers: u32, end_of_stream: u32) -> u32 {
    on_stream(context_id, Flow::headers_status, |s, host| s.on_request_headers(host, end_of_stream != 0))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_body(context_id: u32, body_size: u32, end_of_stream: u32) -> u32 {
    on_stream(context_id, Flow::data_status, |s, host| s.on_request_body(host, body_size as usize, end_of_stream != 0))
}

#[no_mangle]
pub extern "C" fn proxy_on_request_trailers(context_id: u32, _num_trailers: u32) -> u32 {
    on_stream(context_id, Flow::headers_status, |s, host| s.on_request_trailers(host))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_headers(context_id: u32, _num_headers: u32, end_of_stream: u32) -> u32 {
    on_stream(context_id, Flow::headers_status, |s, host| s.on_response_headers(host, end_of_stream != 0))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_body(context_id: u32, body_size: u32, end_of_stream: u32) -> u32 {
    on_stream(context_id, Flow::data_status, |s, host| s.on_response_body(host, body_size as usize, end_of_stream != 0))
}

#[no_mangle]
pub extern "C" fn proxy_on_response_trailers(context_id: u32, _num_trailers: u32) -> u32 {
    on_stream(context_id, Flow::headers_status, |s, host| s.on_response_trailers(host))
}

#[no_mangle]
pub extern "C" fn proxy_on_http_call_response(
    context_id: u32,
    token: u32,
    num_headers: u32,
    body_size: u32,
    _num_trailers: u32,
) {
    enter((), |c, host| c.on_call_response(host, context_id, token, num_headers as usize, body_size as usize));
}

#[no_mangle]
pub extern "C" fn proxy_on_done(_context_id: u32) -> u32 {
    1
}

#[no_mangle]
pub extern "C" fn proxy_on_log(context_id: u32) {
    enter((), |c, host| c.on_log(host, context_id));
}

#[no_mangle]
pub extern "C" fn proxy_on_delete(context_id: u32) {
    enter((), |c, _| c.delete(context_id));
}
