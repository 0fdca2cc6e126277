//! What the native build cannot do on Envoy 1.40, refused when a config loads — never a silent
//! difference from the `.wasm` — and the policy's own check, as the `.wasm` makes it.

use crate::config::Config;
use crate::host::{Native, Setup};
use idem_filter::lifecycle::Worker;
use idem_filter::policy::{parse_bundle_all, Bundle, Forward, Source};
use std::cell::Cell;
use std::sync::Arc;

/// Why detached forwarding cannot be promised natively. Its call is the request itself, sent
/// again by the root through the internal listener (`via = "reentry"`): a dynamic module's calls
/// that must outlive their stream go out as the filter config's callout, on Envoy's main thread
/// (`calls.rs`), and the main thread cannot reach an internal listener (measured: 503 "remote
/// connection failure"); a stream's own callout
/// (envoy_dynamic_module_callback_http_filter_http_callout) is cancelled when its stream ends.
const DETACHED: &str = "needs its request sent again after the client's stream ended, through the \
     internal listener: Envoy 1.40's dynamic modules can send a call that outlives its stream only as the \
     filter config's callout, from the main thread, which cannot reach an internal listener, and a \
     stream's own callout (envoy_dynamic_module_callback_http_filter_http_callout) is cancelled with its \
     stream. Use the .wasm for this route";

/// Every route the native build must refuse, with the reason, one line each.
pub fn refusals(bundle: &Bundle) -> Vec<String> {
    let mut out = Vec::new();
    // The password of `direct` is read from Envoy's environment, never the policy: a variable
    // Envoy does not have would fail every connection, so it fails the load instead.
    let direct = bundle.redis.as_ref().filter(|r| r.direct.is_some());
    if let Some(name) = direct.and_then(|r| r.password_env.as_ref()) {
        if std::env::var(name).is_err() {
            out.push(format!(
                "[redis] password_env = {name:?}: Envoy's environment has no such variable, or it is not UTF-8 \
                 (the password of `direct` is read from it at each connection)"
            ));
        }
    }
    // The same for a password file (a mounted secret): unreadable now, every connection fails.
    if let Some(path) = direct.and_then(|r| r.password_file.as_ref()) {
        if let Err(e) = crate::resp::read_password_file(path) {
            out.push(format!(
                "[redis] password_file = {path:?}: {e} (the password of `direct` is read from it at each connection)"
            ));
        }
    }
    if let Some(path) = direct.and_then(|r| r.tls_ca_file.as_ref()) {
        if let Err(e) = crate::resp::read_ca_file(path) {
            out.push(format!("[redis] tls_ca_file = {path:?}: {e}"));
        }
    }
    for r in &bundle.routes {
        if r.forward == Forward::Detached {
            out.push(format!("route {:?}: forward = \"detached\" {DETACHED}", r.name));
        }
        for source in r.key.sources.iter().chain(&r.key.scope) {
            if let Source::Metadata(path) = source {
                if path.len() > 2 {
                    out.push(format!(
                        "route {:?}: {source} reads a value nested inside a metadata key, and Envoy 1.40's \
                         dynamic-module ABI reads only a string at the top of a namespace \
                         (envoy_dynamic_module_callback_http_get_metadata_string: namespace, key); \
                         use a top-level key (metadata:<namespace>/<key>) or the .wasm",
                        r.name
                    ));
                }
            }
        }
    }
    out
}

/// The policy a config carries: parsed, checked against this build, and its store initialised
/// (the `.wasm`'s `on_configure`), on Envoy's main thread. The error is the line to log.
pub fn check(config: &Arc<Config>) -> Result<(), String> {
    let text = String::from_utf8_lossy(&config.policy);
    if let Ok(bundle) = parse_bundle_all(&text, "filter_config") {
        let refused = refusals(&bundle);
        if !refused.is_empty() {
            return Err(format!("idem: invalid policy for the native build: {}", refused.join("; ")));
        }
    }
    let host = Native::new(Arc::clone(config), None);
    let setup = Setup { host: &host, root: 0, tick_ms: Cell::new(None) };
    Worker::configure(&setup, &host, 0, &config.policy).map(|_| ())
}
