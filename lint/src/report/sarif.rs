//! The SARIF 2.1.0 format: every rule with its documentation, results with UTF-16 columns and
//! related locations, fatal errors as tool execution notifications.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::{Run, VERSION};
use crate::config::Severity;
use crate::rules::RULES;

/// A relative URI reference for a file path (SARIF `artifactLocation.uri`).
pub fn path_to_uri(path: &str) -> String {
    let mut out = String::new();
    for b in path.replace('\\', "/").bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn level(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

/// The first paragraph of a text, on one line.
fn first_paragraph(doc: &str) -> Option<String> {
    let para: Vec<&str> =
        doc.lines().skip_while(|l| l.trim().is_empty()).take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
    if para.is_empty() {
        None
    } else {
        Some(para.join(" "))
    }
}

pub fn sarif(run: &Run<'_>) -> String {
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| {
            let doc = r.doc();
            let md = r.doc_markdown();
            json!({
                "id": r.code,
                "name": r.name,
                "shortDescription": { "text": r.summary },
                "fullDescription": { "text": r.doc_section("What it checks").as_deref().and_then(first_paragraph).unwrap_or_else(|| r.summary.to_string()) },
                "help": { "text": doc, "markdown": md },
                "defaultConfiguration": { "level": level(r.severity) },
            })
        })
        .collect();
    let results: Vec<Value> = run
        .findings
        .iter()
        .map(|f| {
            let idx = RULES.iter().position(|r| r.code == f.code).unwrap_or(0);
            let related: Vec<Value> = f
                .related
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    json!({
                        "id": i,
                        "message": { "text": r.message },
                        "physicalLocation": {
                            "artifactLocation": { "uri": path_to_uri(&r.file) },
                            "region": { "startLine": r.position.line, "startColumn": r.position.column_utf16 },
                        },
                        "logicalLocations": [{ "fullyQualifiedName": r.pointer, "kind": "member" }],
                    })
                })
                .collect();
            let mut result = json!({
                "ruleId": f.code,
                "ruleIndex": idx,
                "level": level(f.severity),
                "message": { "text": f.message },
                "locations": [{
                    "physicalLocation": {
                        "artifactLocation": { "uri": path_to_uri(&f.file) },
                        "region": {
                            "startLine": f.position.line,
                            "startColumn": f.position.column_utf16,
                        },
                    },
                    "logicalLocations": [{ "fullyQualifiedName": f.pointer, "kind": "member" }],
                }],
            });
            if !related.is_empty() {
                result["relatedLocations"] = Value::Array(related);
            }
            result
        })
        .collect();
    let notifications: Vec<Value> =
        run.errors.iter().map(|e| json!({ "level": "error", "message": { "text": e.to_string() } })).collect();
    let v = json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": { "driver": { "name": "idem-lint", "version": VERSION, "rules": rules } },
            "columnKind": "utf16CodeUnits",
            "invocations": [{
                "executionSuccessful": run.errors.is_empty(),
                "toolExecutionNotifications": notifications,
            }],
            "results": results,
        }],
    });
    let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(path_to_uri("specs/my api/订单.yaml"), "specs/my%20api/%E8%AE%A2%E5%8D%95.yaml");
        assert_eq!(path_to_uri("a\\b.json"), "a/b.json");
    }

    #[test]
    fn first_paragraph_on_one_line() {
        assert_eq!(first_paragraph("\nOne\ntwo.\n\nThree.\n").as_deref(), Some("One two."));
        assert_eq!(first_paragraph("\n\n"), None);
    }
}
