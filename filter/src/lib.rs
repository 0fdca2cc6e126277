//! idem-filter: makes HTTP APIs idempotent at the gateway.
//!
//! The core is host-independent and tested natively: [`policy`] (the policy files), [`key`]
//! (where keys come from — headers, query, JSON/form/XML bodies ([`json`], [`form`], [`xml`]),
//! path parameters — and caller scoping), [`fingerprint`], [`store`] (atomic claims on Envoy's
//! shared data and Redis), [`response`] (stored responses and local replies), [`engine`] (the
//! decisions) and [`lifecycle`] (what a request does across its callbacks, and what the worker's
//! root context does for all of them), all talking to Envoy through the [`host::Host`] trait.
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
pub mod response;
pub mod store;
#[cfg(any(test, feature = "fake-host"))]
pub mod testing;
pub mod xml;

#[cfg(target_arch = "wasm32")]
mod glue;
