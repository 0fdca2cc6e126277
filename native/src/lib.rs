//! idem-native: the filter's host-independent core (`idem-filter`) as an Envoy dynamic module
//! (`envoy.filters.http.dynamic_modules`), a shared object Envoy loads into its own process, so
//! a protected request pays no Wasm VM crossing. ARCHITECTURE.md, "The native build", maps
//! proxy-wasm's model (root contexts, ticks, queues, shared data) onto what Envoy 1.40's ABI has.
//!
//! - [`abi`]: the bindings, written by hand (Envoy's Rust SDK is not on crates.io), and the only
//!   module with `unsafe` besides the hooks' pointer arguments;
//! - [`hooks`]: the exported event hooks, each catching unwinding;
//! - [`config`]: one filter config: its policy and metric families;
//! - [`worker`]: what one worker thread holds (the core's contexts, its streams' filters,
//!   callouts out, deferred replies and resumes);
//! - [`ticker`]: the thread that ticks each worker's roots through a live stream's scheduler;
//! - [`calls`]: every HTTP call, sent from the main thread so it outlives its request, and its
//!   answer brought back to the worker;
//! - [`host`]: the core's `Host` on the ABI, with the embedded store's map in process memory;
//! - [`resp`]: `[redis] direct`: RESP to Redis from a client thread, replies as Webdis' JSON;
//! - [`refusal`]: what this build refuses at load, and why.

pub mod abi;
mod calls;
mod config;
mod hooks;
mod host;
mod refusal;
mod resp;
mod ticker;
mod worker;
