//! What the native build cannot do on Envoy 1.40, refused when a config loads — never a silent
//! difference from the `.wasm` — and the policy's own check, as the `.wasm` makes it.

use crate::config::Config;
use crate::host::{Native, Setup};
use idem_filter::lifecycle::Worker;
use idem_filter::policy::{parse_bundle_all, Bundle, Forward, Source, StoreKind};
use std::cell::Cell;
use std::sync::Arc;

/// Why a root-owned call is not available, named by the ABI calls that exist: Envoy 1.40 has no
/// callout or scheduler of a worker's own. A stream's callout is cancelled when the stream ends;
/// a config's callout answers on the main thread, from where the answer could reach the claim's
/// worker only through the scheduler of one of that worker's live streams (and wait for the next
/// stream when there is none). That hop is not built; the `.wasm` does this today.
const NO_ROOT_CALLS: &str = "needs HTTP calls that outlive the request that sent them, which the native build \
     does not make yet: Envoy 1.40's dynamic-module ABI has no callout of a worker's own, only a stream's \
     (envoy_dynamic_module_callback_http_filter_http_callout, cancelled when the stream ends) and the filter \
     config's (envoy_dynamic_module_callback_http_filter_config_http_callout, answered on the main thread); \
     use the .wasm for this route";

/// Every route the native build must refuse, with the reason, one line each.
pub fn refusals(bundle: &Bundle) -> Vec<String> {
    let mut out = Vec::new();
    for r in &bundle.routes {
        if r.store == StoreKind::Redis {
            out.push(format!(
                "route {:?}: store = \"redis\" (Webdis: group commit, queued writes, renewals) {NO_ROOT_CALLS}",
                r.name
            ));
        }
        if r.forward == Forward::Detached {
            out.push(format!("route {:?}: forward = \"detached\" {NO_ROOT_CALLS}", r.name));
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
