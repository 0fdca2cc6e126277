//! The JUnit XML format: one test suite per file, one failing test case per finding, one
//! erroring test case per fatal (parse) error, one passing test case for a clean spec. Each
//! suite counts them in `failures="N"` and `errors="N"`.

use std::fmt::Write as _;

use super::{with_related, Run};
use crate::lint::Finding;
use crate::source::FatalError;

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
    // A finding is a failure; a spec that could not be read is an error.
    let total_fail = run.findings.len();
    let total_err = run.errors.len();
    let total_tests: usize = files
        .iter()
        .map(|file| {
            let n = run.findings.iter().filter(|f| f.file == *file).count()
                + run.errors.iter().filter(|e| e.file == *file).count();
            n.max(1)
        })
        .sum();
    let _ = writeln!(
        out,
        "<testsuites name=\"idem-lint\" tests=\"{total_tests}\" failures=\"{total_fail}\" errors=\"{total_err}\">"
    );
    for file in files {
        let fs: Vec<&Finding> = run.findings.iter().filter(|f| f.file == file).collect();
        let es: Vec<&FatalError> = run.errors.iter().filter(|e| e.file == file).collect();
        let n = fs.len() + es.len();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\">",
            xml_escape(file),
            n.max(1),
            fs.len(),
            es.len()
        );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(xml_escape("<a href=\"x\">&'\n\u{1}"), "&lt;a href=&quot;x&quot;&gt;&amp;&apos;&#10;\u{FFFD}");
    }
}
