//! What a policy asks that Envoy 1.40's dynamic-module ABI cannot do, so the native build refuses
//! it at load (never a silent difference from the `.wasm`) and `idem-lint envoy --native` refuses
//! to write a bootstrap for it, both with these reasons.

use super::{Bundle, Forward, Source};

/// Why detached forwarding cannot be promised natively. Its call is the request itself, sent
/// again by the root through the internal listener (`via = "reentry"`): a dynamic module's calls
/// that must outlive their stream go out as the filter config's callout, on Envoy's main thread,
/// and the main thread cannot reach an internal listener (measured: 503 "remote connection
/// failure"); a stream's own callout (envoy_dynamic_module_callback_http_filter_http_callout) is
/// cancelled when its stream ends.
const DETACHED: &str = "needs its request sent again after the client's stream ended, through the \
     internal listener: Envoy 1.40's dynamic modules can send a call that outlives its stream only as the \
     filter config's callout, from the main thread, which cannot reach an internal listener, and a \
     stream's own callout (envoy_dynamic_module_callback_http_filter_http_callout) is cancelled with its \
     stream. Use the .wasm for this route";

/// Every route of the bundle the native build must refuse: its index in `bundle.routes`, and the
/// reason, one line each.
pub fn refusals(bundle: &Bundle) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, r) in bundle.routes.iter().enumerate() {
        if r.forward == Forward::Detached {
            out.push((i, format!("route {:?}: forward = \"detached\" {DETACHED}", r.name)));
        }
        for source in r.key.sources.iter().chain(&r.key.scope) {
            if let Source::Metadata(path) = source {
                if path.len() > 2 {
                    out.push((
                        i,
                        format!(
                            "route {:?}: {source} reads a value nested inside a metadata key, and Envoy 1.40's \
                         dynamic-module ABI reads only a string at the top of a namespace \
                         (envoy_dynamic_module_callback_http_get_metadata_string: namespace, key); \
                         use a top-level key (metadata:<namespace>/<key>) or the .wasm",
                            r.name
                        ),
                    ));
                }
            }
        }
    }
    out
}
