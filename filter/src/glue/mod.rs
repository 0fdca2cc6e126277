//! The proxy-wasm glue: each Envoy callback becomes an event of the core's request lifecycle
//! ([`crate::lifecycle`]), and the core's host calls become ABI calls. No logic of its own.
//!
//! Hostcalls go through [`abi`], which reads bytes and returns every status as an error: the
//! SDK's `hostcalls` panic on unexpected statuses and unwrap UTF-8, and a panic traps the VM for
//! every later request on the worker. The SDK's trait helpers (which `unwrap()`) are never used,
//! and clippy denies `unwrap`/`expect`/`panic` in this crate.

mod abi;
mod envoy;
mod request;
mod root;

use crate::host::{Host, Level};
use proxy_wasm::traits::RootContext;

proxy_wasm::main! {{
    std::panic::set_hook(Box::new(|info| {
        envoy::Envoy::entered().log(Level::Critical, &format!("idem: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(root::Root { id, worker: None }) });
}}
