//! The proxy-wasm glue: the module's exports turn each Envoy callback into an event of the
//! core's [`Contexts`](crate::lifecycle::Contexts), and the core's host calls become ABI calls.
//! No logic of its own.
//!
//! No SDK is linked. Hostcalls go through [`abi`], which reads bytes and returns every status as
//! an error: proxy-wasm 0.2.5's hostcalls panic on unexpected statuses and unwrap UTF-8, and a
//! panic traps the VM for every later request on the worker. The exports ([`exports`]) are ours
//! too: the SDK's dispatcher routes a callout's reply to the context it last called (not to the
//! call's owner) and `unwrap`s its maps, and its `Action` cannot say "stop, with flow control"
//! or "stop, and drop this chunk", which bodies still arriving need. Clippy denies
//! `unwrap`/`expect`/`panic` in this crate.

mod abi;
mod envoy;
mod exports;
