//! What the native build cannot do on Envoy 1.40, refused when a config loads — never a silent
//! difference from the `.wasm` — and the policy's own check, as the `.wasm` makes it.

use crate::config::Config;
use crate::host::{Native, Setup};
use idem_filter::lifecycle::Worker;
use idem_filter::policy::{parse_bundle_all, Bundle, Forward, Source, StoreKind};
use std::cell::Cell;
use std::sync::Arc;

/// Why root work cannot be promised natively: the calls themselves go through the main thread
/// (`calls.rs`), but what the root does with their answers and on its timer — retrying a write
/// Redis refused, releasing the claim of a client that left, finishing a detached call — runs on
/// the worker, and Envoy 1.40 cannot wake a worker that has no live stream. (A detached call
/// through the internal listener, `via = "reentry"`, could not even be sent: the main thread
/// cannot reach an internal listener.)
const IDLE_WORKER: &str = "needs the worker to act after its last request ended (retry a write Redis \
     refused, release the claim of a client that left, finish a call), and Envoy 1.40's dynamic modules \
     cannot wake a worker with no live stream: no worker timer, and a stream's scheduler \
     (envoy_dynamic_module_callback_http_filter_scheduler_commit) ends with its stream; it would wait for \
     that worker's next request. Use the .wasm for this route";

/// Every route the native build must refuse, with the reason, one line each.
pub fn refusals(bundle: &Bundle) -> Vec<String> {
    let mut out = Vec::new();
    for r in &bundle.routes {
        if r.store == StoreKind::Redis {
            out.push(format!("route {:?}: store = \"redis\" {IDLE_WORKER}", r.name));
        }
        if r.forward == Forward::Detached {
            out.push(format!("route {:?}: forward = \"detached\" {IDLE_WORKER}", r.name));
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
