//! What the native build cannot do on Envoy 1.40, refused when a config loads — never a silent
//! difference from the `.wasm` — and the policy's own check, as the `.wasm` makes it. What a
//! policy itself asks beyond the ABI is the core's `policy::native_build` (idem-lint refuses it
//! too); what depends on Envoy's environment (a `direct` password or CA file) is checked here.

use crate::config::Config;
use crate::host::{Native, Setup};
use idem_filter::lifecycle::Worker;
use idem_filter::policy::{parse_bundle_all, Bundle};
use std::cell::Cell;
use std::sync::Arc;

/// Everything the native build must refuse in this bundle and environment, one line each.
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
    out.extend(idem_filter::policy::native_build::refusals(bundle).into_iter().map(|(_, why)| why));
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
