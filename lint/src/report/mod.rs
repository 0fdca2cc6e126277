//! Reporters: text, JSON, SARIF 2.1.0, JUnit XML, GitHub workflow annotations, one file per
//! format. All take findings already in their deterministic order and return the whole output.

use std::fmt::Write as _;

use crate::config::Severity;
use crate::lint::Finding;
use crate::source::FatalError;

mod github;
mod json;
mod junit;
mod sarif;
mod text;

pub use self::github::github;
pub use self::json::json_report;
pub use self::junit::{junit, xml_escape};
pub use self::sarif::{path_to_uri, sarif};
pub use self::text::text;

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

/// The message plus its related locations (`(see file:line:col: message)`), for formats with
/// one location per finding.
fn with_related(f: &Finding) -> String {
    let mut m = f.message.clone();
    for r in &f.related {
        let _ = write!(m, " (see {}:{}:{}: {})", r.file, r.position.line, r.position.column, r.message);
    }
    m
}
