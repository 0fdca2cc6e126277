//! Every rule has fixtures that must trigger it (`bad*`, with the expected positions) and
//! fixtures that must lint clean (`good*`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]

use std::path::{Path, PathBuf};

use idem_lint::config::Config;
use idem_lint::lint::lint_path;
use idem_lint::rules::RULES;

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// `# expect: IDEM004 11:9` lines in a YAML fixture, or a `.expect` file next to a JSON one.
/// Text after the position is the finding's exact message (`# expect: IDEM007 13:16 POST /a
/// answers a duplicate with 5XX: …`); without it only code and position are compared.
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
    // IDEM1xx need policies: lint/tests/policies.rs.
    for rule in RULES.iter().filter(|r| !r.checks_policies()) {
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
                .enumerate()
                .map(|(i, f)| {
                    let short = format!("{} {}:{}", f.code, f.position.line, f.position.column);
                    let with_message = expected.get(i).is_some_and(|e| e.splitn(3, ' ').count() == 3);
                    if with_message {
                        format!("{short} {}", f.message)
                    } else {
                        short
                    }
                })
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
    for rule in RULES.iter().filter(|r| !r.checks_policies()) {
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
    // Not vacuous: with every statement removed, each of the 14 POSTs is reported.
    let text = std::fs::read_to_string(&path).unwrap();
    let stripped = text
        .replace("幂等性说明", "说明")
        .replace("**Idempotency**", "**Notes**")
        .replace("### Idempotency", "### Notes")
        .replace("x-idempotency:", "x-other:");
    let f = idem_lint::lint::lint_text("stripped.yaml", &stripped, &Config::default()).unwrap();
    let ops: Vec<&str> = f.iter().map(|f| f.code).collect();
    assert_eq!(ops, vec!["IDEM001"; 14], "{f:#?}");
}

#[test]
fn crlf_line_endings_and_escaped_json_descriptions_are_positioned() {
    let cfg = Config::default();
    let yaml = "openapi: 3.0.3\r\npaths:\r\n  /a:\r\n    post:\r\n      description: |\r\n        ### 幂等性说明\r\n        - 是否幂等：是\r\n        - 幂等键：K（header）\r\n        - 重复请求：409 DUPLICATE_REQUEST\r\n      responses: { '409': { description: DUPLICATE_REQUEST } }\r\n";
    let f = idem_lint::lint::lint_text("crlf.yaml", yaml, &cfg).unwrap();
    let got: Vec<String> = f.iter().map(|f| format!("{} {}:{}", f.code, f.position.line, f.position.column)).collect();
    assert_eq!(got, vec!["IDEM004 8:15"]);

    // In JSON the section lines sit between `\n` escapes: found verbatim, except a line with an
    // escaped quote, which falls back to the start of the description string.
    let json = r####"{"openapi": "3.0.3", "paths": {"/a": {"post": {"description": "### 幂等性说明\n- 是否幂等：是\n- 幂等键：K（header）\n- 重复请求：409 \"DUPLICATE_REQUEST\"", "responses": {"201": {"description": "ok"}}}}}}"####;
    let f = idem_lint::lint::lint_text("d.json", json, &cfg).unwrap();
    let got: Vec<String> = f.iter().map(|f| format!("{} {}:{}", f.code, f.position.line, f.position.column)).collect();
    let key_col = json.find("K（header）").unwrap(); // ASCII before it except the title
    let key_col = json[..key_col].chars().count() + 1;
    let desc_col = json[..json.find("\"### ").unwrap()].chars().count() + 1;
    assert_eq!(got, vec![format!("IDEM006 1:{desc_col}"), format!("IDEM004 1:{key_col}")]);
}
