//! Reporters: text, JSON, SARIF 2.1.0, JUnit XML, GitHub workflow annotations.
//! All take findings already in their deterministic order and return the whole output.

use std::fmt::Write as _;

use serde::Serialize;
use serde_json::{json, Value};

use crate::config::Severity;
use crate::lint::{Finding, Snippet};
use crate::rules::RULES;
use crate::source::FatalError;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
    Sarif,
    Junit,
    Github,
}

/// Everything a reporter may need.
pub struct Run<'a> {
    /// The spec files given on the command line, in order.
    pub specs: &'a [String],
    pub findings: &'a [Finding],
    pub errors: &'a [FatalError],
}

impl Run<'_> {
    fn count(&self, s: Severity) -> usize {
        self.findings.iter().filter(|f| f.severity == s).count()
    }
}

pub fn render(format: Format, run: &Run<'_>, color: bool) -> String {
    match format {
        Format::Text => text(run, color),
        Format::Json => json_report(run),
        Format::Sarif => sarif(run),
        Format::Junit => junit(run),
        Format::Github => github(run),
    }
}

// --------------------------------------------------------------------------------- text

struct Style {
    on: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.on {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

pub fn text(run: &Run<'_>, color: bool) -> String {
    let st = Style { on: color };
    let mut out = String::new();
    for f in run.findings {
        let (sev_color, sev) = match f.severity {
            Severity::Error => ("1;31", "error"),
            Severity::Warning => ("1;33", "warning"),
        };
        let _ = writeln!(
            out,
            "{}: {}: {}",
            st.paint("1", &format!("{}:{}:{}", f.file, f.position.line, f.position.column)),
            st.paint(sev_color, &format!("{sev}[{}]", f.code)),
            f.message
        );
        snippet_block(&mut out, &st, sev_color, f.position.line, &f.snippet, &f.pointer);
        for r in &f.related {
            let _ = writeln!(
                out,
                "{}: {}: {}",
                st.paint("1", &format!("{}:{}:{}", r.file, r.position.line, r.position.column)),
                st.paint("1;36", "related"),
                r.message
            );
            snippet_block(&mut out, &st, "1;36", r.position.line, &r.snippet, &r.pointer);
        }
        out.push('\n');
    }
    let errors = run.count(Severity::Error);
    let warnings = run.count(Severity::Warning);
    let files = run.specs.len();
    let summary = if errors + warnings == 0 && run.errors.is_empty() {
        format!("idem-lint: no findings in {files} spec{}", if files == 1 { "" } else { "s" })
    } else {
        format!(
            "idem-lint: {errors} error{}, {warnings} warning{} in {files} spec{}{}",
            if errors == 1 { "" } else { "s" },
            if warnings == 1 { "" } else { "s" },
            if files == 1 { "" } else { "s" },
            if run.errors.is_empty() { String::new() } else { format!("; {} could not be read", run.errors.len()) }
        )
    };
    let _ = writeln!(out, "{}", st.paint("1", &summary));
    out
}

fn snippet_block(out: &mut String, st: &Style, color: &str, line: usize, snippet: &Snippet, pointer: &str) {
    let line_no = line.to_string();
    let gutter = " ".repeat(line_no.len());
    let bar = st.paint("1;34", "|");
    let left = if snippet.cut_left { "…" } else { "" };
    let right = if snippet.cut_right { "…" } else { "" };
    let shown = snippet.text.replace('\t', "    ");
    let caret_pad = usize::from(snippet.cut_left) + snippet.caret_width();
    let _ = writeln!(out, "{gutter} {bar}");
    let _ = writeln!(out, "{} {bar} {left}{shown}{right}", st.paint("1;34", &line_no));
    let _ = writeln!(out, "{gutter} {bar} {}{}", " ".repeat(caret_pad), st.paint(color, "^"));
    let _ = writeln!(out, "{gutter} {} {}", st.paint("1;34", "="), pointer);
}

// --------------------------------------------------------------------------------- JSON

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

// --------------------------------------------------------------------------------- SARIF

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

/// The first paragraph after the title line of a rule's documentation, on one line.
fn first_paragraph(doc: &str) -> Option<String> {
    let para: Vec<&str> = doc
        .lines()
        .skip(1)
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect();
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
                "fullDescription": { "text": first_paragraph(&doc).unwrap_or_else(|| r.summary.to_string()) },
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

// --------------------------------------------------------------------------------- JUnit

pub fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            c if (c as u32) < 0x20 && c != '\t' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

pub fn junit(run: &Run<'_>) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    // One suite per spec given (findings in $ref'd files belong to the spec that reached them
    // only loosely, so they are grouped by the file they are in).
    let mut files: Vec<&str> = run.specs.iter().map(String::as_str).collect();
    for f in run.findings {
        if !files.contains(&f.file.as_str()) {
            files.push(&f.file);
        }
    }
    let total_fail = run.findings.len() + run.errors.len();
    let total_tests: usize = files
        .iter()
        .map(|file| {
            let n = run.findings.iter().filter(|f| f.file == *file).count()
                + run.errors.iter().filter(|e| e.file == *file).count();
            n.max(1)
        })
        .sum();
    let _ = writeln!(out, "<testsuites name=\"idem-lint\" tests=\"{total_tests}\" failures=\"{total_fail}\">");
    for file in files {
        let fs: Vec<&Finding> = run.findings.iter().filter(|f| f.file == file).collect();
        let es: Vec<&FatalError> = run.errors.iter().filter(|e| e.file == file).collect();
        let n = fs.len() + es.len();
        let _ = writeln!(out, "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\">", xml_escape(file), n.max(1), n);
        if n == 0 {
            let _ = writeln!(out, "    <testcase classname=\"{}\" name=\"idem-lint\"/>", xml_escape(file));
        }
        for f in fs {
            let _ = writeln!(
                out,
                "    <testcase classname=\"{}\" name=\"{} {} ({}:{})\">",
                xml_escape(file),
                f.code,
                xml_escape(&f.pointer),
                f.position.line,
                f.position.column
            );
            let _ = writeln!(
                out,
                "      <failure type=\"{}\" message=\"{}\">{}:{}:{}: {}[{}] {}</failure>",
                f.severity,
                xml_escape(&f.message),
                xml_escape(file),
                f.position.line,
                f.position.column,
                f.severity,
                f.code,
                xml_escape(&with_related(f))
            );
            out.push_str("    </testcase>\n");
        }
        for e in es {
            let _ = writeln!(out, "    <testcase classname=\"{}\" name=\"parse\">", xml_escape(file));
            let _ = writeln!(
                out,
                "      <error type=\"fatal\" message=\"{}\">{}</error>",
                xml_escape(&e.reason),
                xml_escape(&e.to_string())
            );
            out.push_str("    </testcase>\n");
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// The message plus its related locations (`(see file:line:col: message)`), for formats with
/// one location per finding.
fn with_related(f: &Finding) -> String {
    let mut m = f.message.clone();
    for r in &f.related {
        let _ = write!(m, " (see {}:{}:{}: {})", r.file, r.position.line, r.position.column, r.message);
    }
    m
}

// --------------------------------------------------------------------------------- GitHub

fn gh_data(s: &str) -> String {
    s.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A")
}

fn gh_prop(s: &str) -> String {
    gh_data(s).replace(':', "%3A").replace(',', "%2C")
}

pub fn github(run: &Run<'_>) -> String {
    let mut out = String::new();
    for f in run.findings {
        let kind = match f.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        let _ = writeln!(
            out,
            "::{kind} file={},line={},col={},title={}::{}",
            gh_prop(&f.file),
            f.position.line,
            f.position.column_utf16,
            gh_prop(&format!("{} {}", f.code, f.pointer)),
            gh_data(&with_related(f))
        );
    }
    for e in run.errors {
        match e.position {
            Some(p) => {
                let _ = writeln!(
                    out,
                    "::error file={},line={},col={},title=idem-lint::{}",
                    gh_prop(&e.file),
                    p.line,
                    p.column,
                    gh_data(&e.reason)
                );
            }
            None => {
                let _ = writeln!(out, "::error file={},title=idem-lint::{}", gh_prop(&e.file), gh_data(&e.reason));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(path_to_uri("specs/my api/订单.yaml"), "specs/my%20api/%E8%AE%A2%E5%8D%95.yaml");
        assert_eq!(path_to_uri("a\\b.json"), "a/b.json");
        assert_eq!(xml_escape("<a href=\"x\">&'\n\u{1}"), "&lt;a href=&quot;x&quot;&gt;&amp;&apos;&#10;\u{FFFD}");
        assert_eq!(gh_data("50%\r\nx"), "50%25%0D%0Ax");
        assert_eq!(gh_prop("a:b,c"), "a%3Ab%2Cc");
    }

    #[test]
    fn first_paragraph_skips_the_title_line() {
        assert_eq!(first_paragraph("IDEM000 x (error)\n\nOne\ntwo.\n\nThree.\n").as_deref(), Some("One two."));
        assert_eq!(first_paragraph("title only\n"), None);
    }
}
