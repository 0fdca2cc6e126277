//! The GitHub format: workflow commands (`::error file=…,line=…,col=…,title=…::message`) that
//! GitHub Actions shows as annotations on the pull request.

use std::fmt::Write as _;

use super::{with_related, Run};
use crate::config::Severity;

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
        assert_eq!(gh_data("50%\r\nx"), "50%25%0D%0Ax");
        assert_eq!(gh_prop("a:b,c"), "a%3Ab%2Cc");
    }
}
