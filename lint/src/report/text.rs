//! The text format (the default): `file:line:col: severity[CODE]: message`, a source snippet
//! with a caret, related locations the same way, and a summary line.

use std::fmt::Write as _;

use super::Run;
use crate::config::Severity;
use crate::lint::Snippet;

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
