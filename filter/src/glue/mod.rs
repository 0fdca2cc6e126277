//! The proxy-wasm glue: Envoy callbacks in, [`crate::engine::Engine`] decisions out, Webdis calls carried. No
//! policy logic here.
//!
//! Hostcalls go through `proxy_wasm::hostcalls`, which return `Result`; the SDK trait helpers that
//! `unwrap()` are never used, and clippy denies `unwrap`/`expect`/`panic` in this crate.
//!
//! Held duplicates (`on_in_flight = "wait"`) have no timer of their own: the root context polls
//! the store for them on its tick and acts on the held request with `set_effective_context`.

mod envoy;
mod request;
mod root;
mod state;

// The glue's pieces see each other through `use super::*`.
use envoy::*;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::RootContext;
use proxy_wasm::types::LogLevel;
use request::*;
use root::*;
use state::*;
use std::time::Duration;

proxy_wasm::main! {{
    std::panic::set_hook(Box::new(|info| {
        let _ = hostcalls::log(LogLevel::Critical, &format!("idem: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { state: None }) });
}}

/// How often held duplicates are re-checked (and queued Redis writes, as a backstop).
pub(crate) const WAIT_POLL: Duration = Duration::from_millis(20);
