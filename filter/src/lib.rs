//! idem-filter: makes HTTP APIs idempotent at the gateway.
//!
//! The core is host-independent and tested natively. Bottom up (no module uses one above it;
//! `tests/layers.rs` holds that): [`codes`] (the gateway's answers, one table), [`policy`] (the
//! policy files, with the answers' configured shape), [`request`] (the request as keys read it),
//! [`key`] (where keys come from — headers, query, JSON/form/XML bodies ([`json`], [`form`],
//! [`xml`]), path parameters — and caller scoping), [`fingerprint`], [`response`] (local replies
//! and the stored-response codec), [`store`] (atomic claims on Envoy's shared data and Redis),
//! [`answers`] and [`replies`] (the gateway's own answers rendered in the API's shape),
//! [`engine`] (the decisions) and [`lifecycle`] (what a request does across its callbacks, and
//! what the worker's root context does for all of them), all talking to Envoy through the
//! [`host::Host`] trait.
//! The proxy-wasm glue in `glue` is compiled only for `wasm32` and only translates callbacks.

pub mod answers;
pub mod cloudevents;
pub mod codes;
pub mod engine;
pub mod fingerprint;
pub mod form;
pub mod forward;
pub mod grpc;
pub mod host;
pub mod json;
pub mod key;
pub mod lifecycle;
pub mod pairs;
pub mod policy;
pub mod protobuf;
pub mod repeatability;
pub mod replies;
pub mod request;
pub mod response;
pub mod shared_data;
pub mod store;
#[cfg(any(test, feature = "fake-host"))]
pub mod testing;
pub mod xml;

#[cfg(target_arch = "wasm32")]
mod glue;
