#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The built module, checked at the ABI level: what Envoy's loader will see. A module that imports
//! anything Envoy does not provide (wasm-bindgen shims from getrandom's `js` feature, Higress's
//! Redis ABI, more WASI than Envoy implements) fails to load, so that is caught here, before e2e.

use std::path::PathBuf;
use wasmparser::{Parser, Payload, TypeRef};

fn module() -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip1/release/idem_filter.wasm");
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; build it first with `make build` (cargo build --release --target wasm32-wasip1 -p idem-filter)",
            path.display()
        )
    })
}

fn sections() -> (Vec<(String, String)>, Vec<String>) {
    let bytes = module();
    let (mut imports, mut exports) = (Vec::new(), Vec::new());
    for payload in Parser::new(0).parse_all(&bytes) {
        match payload.unwrap() {
            Payload::ImportSection(s) => {
                for i in s {
                    let i = i.unwrap();
                    assert!(matches!(i.ty, TypeRef::Func(_)), "unexpected non-function import {}.{}", i.module, i.name);
                    imports.push((i.module.to_string(), i.name.to_string()));
                }
            }
            Payload::ExportSection(s) => {
                for e in s {
                    exports.push(e.unwrap().name.to_string());
                }
            }
            _ => {}
        }
    }
    (imports, exports)
}

#[test]
fn exports_the_proxy_wasm_abi() {
    let (_, exports) = sections();
    for name in [
        "memory",
        "_initialize",
        "proxy_abi_version_0_2_1",
        "proxy_on_memory_allocate",
        "proxy_on_context_create",
        "proxy_on_configure",
        "proxy_on_request_headers",
        "proxy_on_request_body",
        "proxy_on_response_headers",
        "proxy_on_response_body",
        "proxy_on_log",
        "proxy_on_done",
    ] {
        assert!(exports.iter().any(|e| e == name), "missing export {name}; exports: {exports:?}");
    }
    assert!(!exports.iter().any(|e| e == "_start"), "a command-style _start would run on every VM start");
}

#[test]
fn imports_only_what_envoy_provides() {
    const WASI: &[&str] =
        &["random_get", "clock_time_get", "environ_get", "environ_sizes_get", "fd_write", "proc_exit", "sched_yield"];
    let (imports, _) = sections();
    assert!(imports.iter().any(|(m, n)| m == "env" && n == "proxy_set_shared_data"));
    assert!(
        imports.iter().any(|(m, n)| m == "wasi_snapshot_preview1" && n == "random_get"),
        "owner ids need random_get"
    );
    for (m, n) in &imports {
        let ok = match m.as_str() {
            "env" => n.starts_with("proxy_") && !n.starts_with("proxy_redis"),
            "wasi_snapshot_preview1" => WASI.contains(&n.as_str()),
            _ => false,
        };
        assert!(ok, "import {m}.{n} is not provided by upstream Envoy 1.40");
    }
}
