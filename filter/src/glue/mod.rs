//! The proxy-wasm glue: Envoy callbacks in, [`crate::engine::Engine`] decisions out, Webdis calls
//! carried. No policy logic here.
//!
//! Hostcalls go through [`abi`], which reads bytes and returns every status as an error: the
//! SDK's `hostcalls` panic on unexpected statuses and unwrap UTF-8, and a panic traps the VM for
//! every later request on the worker. The SDK's trait helpers (which `unwrap()`) are never used,
//! and clippy denies `unwrap`/`expect`/`panic` in this crate.
//!
//! Held duplicates (`on_in_flight = "wait"`) have no timer of their own: the root context polls
//! the store for them on its tick and acts on the held request with `set_effective_context`.
//! Redis writes and detached upstream calls are sent by the root context too, so a client that
//! leaves cannot cancel them.

mod abi;
mod envoy;
mod request;
mod root;
mod state;

use envoy::{log, Level};
use proxy_wasm::traits::RootContext;
use std::time::Duration;

proxy_wasm::main! {{
    std::panic::set_hook(Box::new(|info| {
        log(Level::Critical, &format!("idem: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(root::Root { id, state: None }) });
}}

/// How often held duplicates are re-checked (and queued Redis writes, as a backstop).
pub(crate) const WAIT_POLL: Duration = Duration::from_millis(20);
