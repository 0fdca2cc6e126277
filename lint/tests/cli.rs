//! The binary as CI runs it: exit codes, output formats, bad input, config, multi-file specs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use unicode_width::UnicodeWidthStr;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn fx(p: &str) -> String {
    root().join("tests/fixtures").join(p).to_string_lossy().into_owned()
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-lint")).args(args).current_dir(dir).env_remove("NO_COLOR").output().unwrap()
}

fn run(args: &[&str]) -> Output {
    // Run from the fixtures folder of another test so no idem-lint.toml is picked up.
    run_in(&root().join("tests/fixtures/IDEM001"), args)
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn json(args: &[&str]) -> serde_json::Value {
    let mut a = vec!["--format", "json"];
    a.extend_from_slice(args);
    serde_json::from_str(&stdout(&run(&a))).unwrap()
}

#[test]
fn exit_codes_follow_fail_on() {
    let example = root().join("../examples/openapi.yaml");
    let example = example.to_str().unwrap();
    assert_eq!(run(&[example]).status.code(), Some(0));
    let bad = fx("IDEM001/bad.yaml");
    assert_eq!(run(&[&bad]).status.code(), Some(1));
    assert_eq!(run(&["--fail-on", "never", &bad]).status.code(), Some(0));
    // IDEM008 findings are warnings: they fail only with --fail-on warning.
    let warn = fx("IDEM008/bad.yaml");
    let o = run(&[&warn]);
    assert!(stdout(&o).contains("warning[IDEM008]"), "{}", stdout(&o));
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(run(&["--fail-on", "warning", &warn]).status.code(), Some(1));
    // usage errors
    assert_eq!(run(&[]).status.code(), Some(2));
    assert_eq!(run(&["--format", "xml", &bad]).status.code(), Some(2));
}

#[test]
fn bad_input_exits_2_with_file_position_and_one_line_reason() {
    let cases = [
        ("bad-input/malformed.yaml", ":5:1: invalid YAML"),
        ("bad-input/malformed.json", ":1:47: invalid JSON"),
        ("bad-input/empty.yaml", ":1:1: empty file"),
        ("bad-input/binary.yaml", ":1:15: binary file"),
        ("bad-input/image.yaml", ":1:1: not UTF-8 text"),
        ("bad-input/missing-ref-file.yaml", ":7:15: $ref \"./nope/bodies.yaml#/Order\": cannot read"),
        ("bad-input/missing-ref-pointer.yaml", ":7:17: $ref \"#/components/parameters/IdempotencyKey\": no node"),
        ("bad-input/swagger-1.2.yaml", ":1:10: unsupported Swagger version \"1.2\""),
    ];
    for (file, want) in cases {
        let path = fx(file);
        for format in ["text", "json", "sarif", "junit", "github"] {
            let o = run(&["--format", format, &path]);
            assert_eq!(o.status.code(), Some(2), "{file} {format}");
            let err = stderr(&o);
            assert_eq!(err.lines().count(), 1, "{file}: {err}");
            assert!(err.contains(&format!("{path}{want}")), "{file}: {err}");
            assert!(!err.contains("panicked"), "{file}: {err}");
        }
    }
    let o = run(&[&fx("does-not-exist.yaml")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("cannot read file"), "{}", stderr(&o));
    // A bad spec does not hide the findings of a good one given with it.
    let o = run(&["--format", "json", &fx("bad-input/empty.yaml"), &fx("IDEM001/bad.yaml")]);
    assert_eq!(o.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["findings"].as_array().unwrap().len(), 2);
    assert_eq!(v["errors"].as_array().unwrap().len(), 1);
}

#[test]
fn json_findings_carry_the_contract_fields() {
    let v = json(&[&fx("cjk/caret.yaml")]);
    let f = &v["findings"].as_array().unwrap()[0];
    assert_eq!(f["code"], "IDEM001");
    assert_eq!(f["severity"], "error");
    assert_eq!(f["file"], fx("cjk/caret.yaml"));
    assert_eq!(f["line"], 14);
    // `  /𠮷野家/支付: { post`: 13 characters before `post`, 14 UTF-16 units (𠮷 is astral).
    assert_eq!(f["column"], 14);
    assert_eq!(f["column_utf16"], 15);
    assert_eq!(f["pointer"], "/paths/~1𠮷野家~1支付/post");
    assert!(f["message"].as_str().unwrap().contains("POST /𠮷野家/支付"));
    assert_eq!(v["summary"]["errors"], 1);
}

#[test]
fn text_caret_lands_under_the_character_after_cjk_and_astral_text() {
    let o = run(&["--color", "never", &fx("cjk/caret.yaml")]);
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    let src = lines.iter().position(|l| l.contains("/𠮷野家/支付: {")).unwrap();
    let src_line = lines[src];
    let caret_line = lines[src + 1];
    let bar = src_line.find('|').unwrap();
    let code = &src_line[bar + 2..];
    let caret_col = caret_line.find('^').unwrap();
    let caret_pad = caret_line[..caret_col].width() - (caret_line[..bar].width() + 2);
    let before_post = &code[..code.find("post").unwrap()];
    assert_eq!(caret_pad, before_post.width());
    assert_eq!(caret_pad, 18);
    assert!(!out.contains('\x1b'), "no colour when not a terminal");
    let o = run(&["--color", "always", &fx("cjk/caret.yaml")]);
    assert!(stdout(&o).contains("\x1b[1;31m"));
}

#[test]
fn sarif_is_valid_2_1_0_with_utf16_columns_and_rule_help() {
    let o = run(&["--format", "sarif", &fx("cjk/caret.yaml"), &fx("IDEM008/bad.yaml")]);
    let text = stdout(&o);
    let sarif: serde_sarif::sarif::Sarif = serde_json::from_str(&text).unwrap();
    assert_eq!(sarif.version.to_string().trim_matches('"'), "2.1.0");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let run = &v["runs"][0];
    assert_eq!(run["columnKind"], "utf16CodeUnits");
    let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), idem_lint::rules::RULES.len());
    for r in rules {
        assert!(r["help"]["text"].as_str().unwrap().len() > 100, "{r}");
    }
    let results = run["results"].as_array().unwrap();
    let cjk = results.iter().find(|r| r["ruleId"] == "IDEM001").unwrap();
    assert_eq!(cjk["locations"][0]["physicalLocation"]["region"]["startColumn"], 15);
    assert_eq!(cjk["level"], "error");
    let idx = cjk["ruleIndex"].as_u64().unwrap() as usize;
    assert_eq!(rules[idx]["id"], "IDEM001");
    assert!(results.iter().any(|r| r["ruleId"] == "IDEM008" && r["level"] == "warning"));
}

#[test]
fn junit_and_github_formats() {
    let o = run(&["--format", "junit", &fx("IDEM001/bad.yaml"), &fx("IDEM001/good.yaml")]);
    let x = stdout(&o);
    assert!(x.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"));
    assert_eq!(x.matches("<testcase ").count(), 3, "{x}");
    assert_eq!(x.matches("<failure ").count(), 2, "{x}");
    assert!(x.contains("<testsuites name=\"idem-lint\" tests=\"3\" failures=\"2\" errors=\"0\">"), "{x}");
    assert_eq!(x.matches("<testsuite ").count(), x.matches("</testsuite>").count());
    assert_eq!(x.matches(" errors=\"0\">").count(), 3, "every suite carries errors=\"N\": {x}");

    // A spec that cannot be parsed is an error of its suite, not a failure.
    let o = run(&["--format", "junit", &fx("bad-input/malformed.yaml"), &fx("IDEM001/bad.yaml")]);
    assert_eq!(o.status.code(), Some(2));
    let x = stdout(&o);
    assert!(x.contains("<testsuites name=\"idem-lint\" tests=\"3\" failures=\"2\" errors=\"1\">"), "{x}");
    assert!(
        x.contains(&format!(
            "<testsuite name=\"{}\" tests=\"1\" failures=\"0\" errors=\"1\">",
            fx("bad-input/malformed.yaml")
        )),
        "{x}"
    );
    assert!(
        x.contains(&format!("<testsuite name=\"{}\" tests=\"2\" failures=\"2\" errors=\"0\">", fx("IDEM001/bad.yaml"))),
        "{x}"
    );
    assert_eq!(x.matches("<error type=\"fatal\"").count(), 1, "{x}");

    let o = run(&["--format", "github", &fx("IDEM008/bad.yaml")]);
    let g = stdout(&o);
    let first = g.lines().next().unwrap();
    assert!(
        first.starts_with(&format!(
            "::warning file={},line=12,col=15,title=IDEM008 /paths/~1a/post/description::",
            fx("IDEM008/bad.yaml")
        )),
        "{first}"
    );
    assert_eq!(g.lines().count(), 3);
}

#[test]
fn output_is_deterministic_and_sorted() {
    let args = ["--format", "json", &fx("IDEM006/bad.yaml"), &fx("IDEM001/bad.yaml"), &fx("IDEM004/bad.yaml")];
    let a = stdout(&run(&args));
    let b = stdout(&run(&args));
    assert_eq!(a, b);
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    let keys: Vec<(String, u64, u64)> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["file"].as_str().unwrap().to_string(), f["line"].as_u64().unwrap(), f["column"].as_u64().unwrap()))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
}

#[test]
fn rules_and_explain() {
    let o = run(&["rules"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(out.lines().count(), idem_lint::rules::RULES.len());
    assert!(out.lines().nth(7).unwrap().starts_with("IDEM008  warning"));
    let o = run(&["--explain", "idem004"]);
    let doc = stdout(&o);
    assert!(doc.starts_with("IDEM004 undeclared-key (error)"), "{doc}");
    assert!(doc.contains("path-level parameters"), "{doc}");
    assert!(doc.contains("\nWhat it checks\n") && doc.contains("\nFix\n"), "{doc}");
    assert!(!doc.contains("```"));
    // The markdown table: a header, a separator and one row per rule, each with its default
    // (the README's copy is checked against the registry in rules/mod.rs).
    let o = run(&["rules", "--markdown"]);
    assert_eq!(o.status.code(), Some(0));
    let table = stdout(&o);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows[..2], ["| code | name | default | finds |", "|---|---|---|---|"]);
    assert_eq!(rows.len(), 2 + idem_lint::rules::RULES.len(), "{table}");
    assert!(rows[2].starts_with("| IDEM001 | missing-statement | error | "), "{table}");
    assert!(rows.iter().any(|r| r.starts_with("| IDEM008 | ") && r.contains(" | warning | ")), "{table}");
    // `explain CODE` is the same as `--explain CODE`.
    assert_eq!(stdout(&run(&["explain", "idem004"])), doc);
    let o = run(&["--explain", "IDEM999"]);
    assert_eq!(o.status.code(), Some(2));
    let labels = stdout(&run(&["rules", "--labels"]));
    assert!(labels.starts_with("| pattern | meaning |\n|---|---|\n| `投递…` | Delivery |\n"), "{labels}");
    assert!(labels.contains("| `重复…` | Duplicate |\n"), "{labels}");
    assert!(labels.contains("| `…是否…幂等…` | Idempotent |\n"), "{labels}");
}

#[test]
fn config_in_the_working_directory_is_used() {
    let dir = root().join("tests/fixtures/config");
    let o = run_in(&dir, &["--format", "json", "spec.yaml"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let codes: Vec<(&str, &str)> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["code"].as_str().unwrap(), f["severity"].as_str().unwrap()))
        .collect();
    // 幂等设计 is a configured title; IDEM008 is raised to error; IDEM005 is off; DELETE is
    // not in `methods`, so it needs no statement.
    assert_eq!(codes, vec![("IDEM008", "error")]);
    assert_eq!(o.status.code(), Some(1));
    // Without the config the same spec has no statement at all (two IDEM001s).
    let o = run_in(&dir, &["--format", "json", "--config", &fx("../../idem-lint.example.toml"), "spec.yaml"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let codes: Vec<&str> = v["findings"].as_array().unwrap().iter().map(|f| f["code"].as_str().unwrap()).collect();
    assert_eq!(codes, vec!["IDEM001", "IDEM001"], "{v}");
    // A broken config is a usage error with its position.
    let tmp = std::env::temp_dir().join(format!("idem-lint-bad-{}.toml", std::process::id()));
    std::fs::write(&tmp, "[rules]\nIDEM008 = \"loud\"\n").unwrap();
    let o = run_in(&dir, &["--config", tmp.to_str().unwrap(), "spec.yaml"]);
    let _ = std::fs::remove_file(&tmp);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains(":2:11: invalid config"), "{}", stderr(&o));
}

#[test]
fn multi_file_refs_resolve_and_findings_point_into_the_referenced_file() {
    let v = json(&[&fx("multi-file/openapi.yaml")]);
    let f = v["findings"].as_array().unwrap();
    assert_eq!(f.len(), 1, "{v}");
    assert_eq!(f[0]["code"], "IDEM001");
    assert!(f[0]["file"].as_str().unwrap().ends_with("multi-file/paths/order-create.yaml"));
    assert_eq!(f[0]["line"], 12);
    assert_eq!(f[0]["pointer"], "/paths/~1api~1order~1create/put");
}

/// Each finding of a `--format json` report as (code, pointer, message): what must not depend
/// on how the spec was written down.
fn code_pointer_message(v: serde_json::Value) -> Vec<(String, String, String)> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["code"].as_str().unwrap().to_string(),
                f["pointer"].as_str().unwrap().to_string(),
                f["message"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn json_and_yaml_of_the_same_spec_give_the_same_findings() {
    // JSON fixture → YAML (hidden --dump-yaml writes block YAML, all strings quoted), and a
    // YAML fixture → re-dumped YAML: the findings other than positions must be identical.
    for (i, src) in ["IDEM001/bad_json.json", "IDEM004/bad.yaml", "IDEM009/bad.yaml"].iter().enumerate() {
        let src = fx(src);
        let dumped = stdout(&run(&["--dump-yaml", &src]));
        let tmp = std::env::temp_dir().join(format!("idem-lint-dump-{}-{i}.yaml", std::process::id()));
        std::fs::write(&tmp, dumped).unwrap();
        let a = code_pointer_message(json(&[&src]));
        let b = code_pointer_message(json(&[tmp.to_str().unwrap()]));
        let _ = std::fs::remove_file(&tmp);
        assert!(!a.is_empty(), "{src}");
        assert_eq!(a, b, "{src}");
    }
}

#[test]
fn swagger_2_and_its_openapi_3_conversion_give_the_same_findings() {
    let essence = |file: &str| {
        let mut v = code_pointer_message(json(&[&fx(file)]));
        v.sort();
        v
    };
    let v2 = essence("swagger2/shop.yaml");
    let v3 = essence("swagger2/shop.openapi3.yaml");
    let codes: Vec<&str> = v2.iter().map(|f| f.0.as_str()).collect();
    assert_eq!(codes, ["IDEM001", "IDEM004", "IDEM004", "IDEM005", "IDEM006", "IDEM006", "IDEM007", "IDEM008"]);
    assert_eq!(v2, v3);
    // Positions are the Swagger file's own: the body key of PUT /orders/{id} is on line 28.
    let v = json(&[&fx("swagger2/shop.yaml")]);
    let f = v["findings"].as_array().unwrap().iter().find(|f| f["code"] == "IDEM004").unwrap();
    assert_eq!((f["line"].as_u64(), f["column"].as_u64()), (Some(28), Some(14)), "{f}");
}

#[test]
fn x_idem_lint_ignore_applies_to_the_node_and_everything_below_it() {
    let v = json(&[&fx("suppress/spec.yaml")]);
    let got: Vec<(String, String)> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["code"].as_str().unwrap().to_string(), f["pointer"].as_str().unwrap().to_string()))
        .collect();
    // Only the PUT /a key (same key as POST /a, whose ignore sits on the key node) remains;
    // the path-item string form, the wildcard and a $ref'd path item's ignore all apply.
    assert_eq!(got, vec![("IDEM008".to_string(), "/paths/~1a/put/x-idempotency/key".to_string())], "{v}");
}

#[test]
fn hints_use_the_form_the_statement_is_written_in() {
    let v = json(&[&fx("IDEM002/bad.yaml")]);
    let msgs: Vec<&str> = v["findings"].as_array().unwrap().iter().map(|f| f["message"].as_str().unwrap()).collect();
    assert_eq!(msgs.len(), 3, "{msgs:#?}");
    assert!(msgs[0].contains("the 幂等性说明 section of POST /a") && msgs[0].contains("`是否幂等：是`"), "{}", msgs[0]);
    assert!(msgs[1].contains("from \"看情况\""), "{}", msgs[1]);
    assert!(msgs[2].starts_with("x-idempotency of PUT /b") && msgs[2].contains("`idempotent: true`"), "{}", msgs[2]);
}

#[test]
fn a_directory_lints_every_openapi_document_in_it_and_skips_fragments() {
    let dir = std::env::temp_dir().join(format!("idem-lint-dir-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("billing")).unwrap();
    let spec = |path: &str| {
        format!(
            "openapi: 3.0.3\ninfo: {{title: t, version: '1'}}\npaths:\n  {path}:\n    post:\n      responses:\n        '200': {{description: ok}}\n"
        )
    };
    std::fs::write(dir.join("orders.yaml"), spec("/orders")).unwrap();
    std::fs::write(dir.join("billing/pay.yml"), spec("/pay")).unwrap();
    // Swagger 2.0 (springfox's /v2/api-docs saved as JSON) is a spec too.
    std::fs::write(
        dir.join("legacy.json"),
        r#"{"swagger":"2.0","info":{"title":"t","version":"1"},"paths":{"/legacy":{"delete":{"responses":{"200":{"description":"OK"}}}}}}"#,
    )
    .unwrap();
    // A fragment a root spec would $ref: no `openapi` field, never linted on its own.
    std::fs::write(dir.join("billing/schemas.yaml"), "Order:\n  type: object\n").unwrap();
    std::fs::write(dir.join("notes.txt"), "not a spec").unwrap();
    let o = run(&["--format", "json", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let mut files: Vec<String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["code"] == "IDEM001")
        .map(|f| f["file"].as_str().unwrap().rsplit('/').next().unwrap().to_string())
        .collect();
    files.sort();
    assert_eq!(files, ["legacy.json", "orders.yaml", "pay.yml"], "{}", stdout(&o));
    let empty = dir.join("billing");
    std::fs::remove_file(empty.join("pay.yml")).unwrap();
    let o = run(&[empty.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no OpenAPI document"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}
