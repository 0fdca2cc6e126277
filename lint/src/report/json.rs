//! The JSON format: one object with the findings, the fatal errors and a summary.

use serde::Serialize;

use super::{Run, VERSION};
use crate::config::Severity;

/// One finding in the JSON output (fields in this order).
#[derive(Serialize)]
struct JsonFinding<'a> {
    code: &'a str,
    severity: String,
    file: &'a str,
    line: usize,
    /// 1-based, in Unicode characters.
    column: usize,
    /// 1-based, in UTF-16 code units (what SARIF, LSP and GitHub use).
    column_utf16: usize,
    pointer: &'a str,
    message: &'a str,
    /// The other side of a policy cross-check finding (IDEM1xx); absent when there is none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    related: Vec<JsonRelated<'a>>,
}

#[derive(Serialize)]
struct JsonRelated<'a> {
    file: &'a str,
    line: usize,
    column: usize,
    column_utf16: usize,
    pointer: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct JsonError<'a> {
    file: &'a str,
    line: Option<usize>,
    column: Option<usize>,
    message: &'a str,
}

#[derive(Serialize)]
struct JsonSummary {
    specs: usize,
    errors: usize,
    warnings: usize,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    tool: &'static str,
    version: &'static str,
    findings: Vec<JsonFinding<'a>>,
    errors: Vec<JsonError<'a>>,
    summary: JsonSummary,
}

pub fn json_report(run: &Run<'_>) -> String {
    let report = JsonReport {
        tool: "idem-lint",
        version: VERSION,
        findings: run
            .findings
            .iter()
            .map(|f| JsonFinding {
                code: f.code,
                severity: f.severity.to_string(),
                file: &f.file,
                line: f.position.line,
                column: f.position.column,
                column_utf16: f.position.column_utf16,
                pointer: &f.pointer,
                message: &f.message,
                related: f
                    .related
                    .iter()
                    .map(|r| JsonRelated {
                        file: &r.file,
                        line: r.position.line,
                        column: r.position.column,
                        column_utf16: r.position.column_utf16,
                        pointer: &r.pointer,
                        message: &r.message,
                    })
                    .collect(),
            })
            .collect(),
        errors: run
            .errors
            .iter()
            .map(|e| JsonError {
                file: &e.file,
                line: e.position.map(|p| p.line),
                column: e.position.map(|p| p.column),
                message: &e.reason,
            })
            .collect(),
        summary: JsonSummary {
            specs: run.specs.len(),
            errors: run.count(Severity::Error),
            warnings: run.count(Severity::Warning),
        },
    };
    let mut s = serde_json::to_string_pretty(&report).unwrap_or_default();
    s.push('\n');
    s
}
