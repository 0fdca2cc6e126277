//! Shared test helpers: a request the core can read.
#![allow(dead_code)]

pub mod webdis;

/// A request the core can read (the filter's own plain request, with its builder).
pub type Req = idem_filter::request::PlainRequest;

/// Decodes a Webdis command (`CMD/arg/…`, each argument percent-encoded) for reading in asserts.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            out.push(u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap(), 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// Every `.rs` file under `filter/src`: its path relative to `src` (`/`-separated) and the code
/// before its `#[cfg(test)]` part (what the module itself compiles).
pub fn filter_sources() -> Vec<(String, String)> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(&src).map(|p| p.to_string_lossy().replace('\\', "/")).unwrap_or_default();
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let code = text.split("#[cfg(test)]").next().unwrap_or_default().to_string();
                out.push((rel, code));
            }
        }
    }
    out.sort();
    out
}
