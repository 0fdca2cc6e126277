//! Every rule has fixtures that must trigger it (`bad*`, with the expected positions) and
//! fixtures that must lint clean (`good*`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use idem_lint::config::Config;
use idem_lint::lint::lint_path;
use idem_lint::rules::RULES;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `# expect: IDEM004 11:9` lines in a YAML fixture, or a `.expect` file next to a JSON one.
fn expectations(path: &Path) -> Vec<String> {
    let sidecar = path.with_extension("expect");
    let text = if sidecar.exists() {
        std::fs::read_to_string(&sidecar).unwrap()
    } else {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("# expect: "))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

fn files(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().to_string();
            n.starts_with(prefix) && (n.ends_with(".yaml") || n.ends_with(".json"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn bad_fixtures_trigger_their_rule_at_the_expected_places() {
    let cfg = Config::default();
    for rule in &RULES {
        let dir = fixtures_dir().join(rule.code);
        let bad = files(&dir, "bad");
        assert!(!bad.is_empty(), "{}: no bad fixture", rule.code);
        for path in bad {
            let expected = expectations(&path);
            assert!(!expected.is_empty(), "{}: no expectations", path.display());
            let findings =
                lint_path(path.to_str().unwrap(), &cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let got: Vec<String> = findings
                .iter()
                .filter(|f| f.code == rule.code)
                .map(|f| format!("{} {}:{}", f.code, f.position.line, f.position.column))
                .collect();
            assert_eq!(
                got,
                expected,
                "{}: findings were {:#?}",
                path.display(),
                findings
                    .iter()
                    .map(|f| format!("{} {}:{} {}", f.code, f.position.line, f.position.column, f.message))
                    .collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn good_fixtures_lint_clean() {
    let cfg = Config::default();
    for rule in &RULES {
        let dir = fixtures_dir().join(rule.code);
        let good = files(&dir, "good");
        assert!(!good.is_empty(), "{}: no good fixture", rule.code);
        for path in good {
            let findings =
                lint_path(path.to_str().unwrap(), &cfg).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let shown: Vec<String> = findings
                .iter()
                .map(|f| format!("{} {}:{} {}", f.code, f.position.line, f.position.column, f.message))
                .collect();
            assert!(findings.is_empty(), "{}: {shown:#?}", path.display());
        }
    }
}

#[test]
fn example_spec_lints_clean_and_has_statements_for_every_non_safe_operation() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/openapi.yaml");
    let findings = lint_path(path.to_str().unwrap(), &Config::default()).unwrap();
    assert!(findings.is_empty(), "{findings:#?}");
    // Not vacuous: with every statement removed, each of the 8 POSTs is reported.
    let text = std::fs::read_to_string(&path).unwrap();
    let stripped = text
        .replace("幂等性说明", "说明")
        .replace("**Idempotency**", "**Notes**")
        .replace("x-idempotency:", "x-other:");
    let f = idem_lint::lint::lint_text("stripped.yaml", &stripped, &Config::default()).unwrap();
    let ops: Vec<&str> = f.iter().map(|f| f.code).collect();
    assert_eq!(ops, vec!["IDEM001"; 8], "{f:#?}");
}
