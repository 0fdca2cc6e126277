//! The rule catalogue. One rule per file, which defines the rule's `static RULE: Rule`: its
//! code, name, default severity, one-line summary, check, and — the file's `//!` comment, with
//! the sections of [`DOC_SECTIONS`] — its documentation, printed by `idem-lint --explain CODE`
//! and shown as SARIF help text. Findings take their code from `RULE`; [`RULES`] lists them,
//! and everything else (the `rules` listing, config validation, SARIF, the README's rule table)
//! is derived from it.

use std::fmt;

use serde::Deserialize;

use crate::loader::{At, FileId, Workspace};
use crate::model::Operation;
use crate::node::{Node, Value};
use crate::statement::{Loc, Statement, Statements};

pub mod cross;
pub mod idem001_missing_statement;
pub mod idem002_idempotent_unstated;
pub mod idem003_missing_key;
pub mod idem004_undeclared_key;
pub mod idem005_missing_duplicate;
pub mod idem006_duplicate_not_in_responses;
pub mod idem007_duplicate_5xx;
pub mod idem008_unstable_key;
pub mod idem009_statements_disagree;
pub mod idem010_unknown_directive;
pub mod idem011_not_idempotent_with_key;
pub mod idem012_generated_header_key;
pub mod idem013_delivery_unstated;
pub mod idem101_route_without_operation;
pub mod idem102_operation_without_policy;
pub mod idem103_key_mismatch;
pub mod idem104_duplicate_mismatch;
pub mod idem105_token_undocumented;
pub mod idem106_policy_on_non_idempotent;
pub mod idem107_scope_undeclared;
pub mod idem108_token_scoped_on_whole_header;
pub mod idem109_gateway_answers_undocumented;

/// The rules that check a delivery (a webhook, a callback): what its receivers deduplicate on
/// and that it may repeat (IDEM013), that the id is declared and stable (IDEM004, IDEM008), and
/// the suppressions' codes (IDEM010). The others are about requests clients send.
pub const DELIVERY_RULES: [&str; 4] = ["IDEM004", "IDEM008", "IDEM010", "IDEM013"];

/// One finding before severities and suppressions are applied.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RawFinding {
    pub code: &'static str,
    pub file: FileId,
    pub offset: u32,
    pub pointer: String,
    pub message: String,
}

/// What a rule sees for one operation.
pub struct Ctx<'a> {
    pub ws: &'a Workspace,
    pub op: &'a Operation<'a>,
    pub statements: &'a Statements,
    /// Section and `x-idempotency` merged field by field (`x-idempotency` wins).
    pub merged: Option<&'a Statement>,
}

impl Ctx<'_> {
    pub fn at(&self, rule: &'static Rule, loc: &Loc, message: String) -> RawFinding {
        RawFinding { code: rule.code, file: loc.file, offset: loc.offset, pointer: loc.pointer.clone(), message }
    }

    /// The statement's duplicate response, when it names a status (rules on that status).
    pub fn duplicate_status(&self) -> Option<(&crate::statement::Field<crate::value::Duplicate>, u16)> {
        let dup = self.merged?.duplicate.as_ref()?;
        Some((dup, dup.value.status?))
    }

    pub fn label(&self) -> String {
        self.op.label()
    }
}

/// What a rule checks: one operation of a spec, or the specs against the gateway's policies
/// (`--policies`, the IDEM1xx rules).
#[derive(Clone, Copy)]
pub enum Check {
    Operation(fn(&Ctx<'_>, &mut Vec<RawFinding>)),
    Policies(cross::CrossCheck),
}

/// How bad a finding is: a rule's default, overridden per rule by `idem-lint.toml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Warning => "warning",
            Severity::Error => "error",
        })
    }
}

/// One rule: everything about it is here, defined once in its file as `pub static RULE`.
pub struct Rule {
    /// `IDEMnnn`: what findings, `idem-lint.toml`, `x-idem-lint-ignore` and `--explain` use.
    pub code: &'static str,
    /// kebab-case name, shown next to the code.
    pub name: &'static str,
    /// The default severity (`[rules]` in `idem-lint.toml` overrides it).
    pub severity: Severity,
    /// One line: the `rules` listing, SARIF's short description, the README's rule table.
    pub summary: &'static str,
    /// The rule's source file (`include_str!`), whose leading `//!` comment is its documentation.
    source: &'static str,
    pub check: Check,
}

/// The sections every rule's documentation has, in this order (as `## …` headings).
pub const DOC_SECTIONS: [&str; 4] = ["What it checks", "Why", "Example", "Fix"];

impl Rule {
    /// Whether the rule checks specs against policies (`--policies`) rather than each operation.
    pub fn checks_policies(&self) -> bool {
        matches!(self.check, Check::Policies(_))
    }

    /// The rule's documentation as Markdown: its file's leading `//!` comment (the sections of
    /// [`DOC_SECTIONS`]), under a title line made from the code, name and default severity.
    pub fn doc_markdown(&self) -> String {
        let mut out = format!("{} {} ({})\n\n", self.code, self.name, self.severity);
        out.push_str(&self.doc_body());
        out
    }

    /// The `//!` comment of the rule's file.
    fn doc_body(&self) -> String {
        let mut out = String::new();
        for line in self.source.lines() {
            let Some(rest) = line.strip_prefix("//!") else {
                break;
            };
            out.push_str(rest.strip_prefix(' ').unwrap_or(rest));
            out.push('\n');
        }
        out
    }

    /// The text of one `## title` section of the documentation, trimmed (None when absent).
    pub fn doc_section(&self, title: &str) -> Option<String> {
        let body = self.doc_body();
        let mut lines = body.lines().skip_while(|l| l.strip_prefix("## ").map(str::trim) != Some(title));
        lines.next()?;
        let text: Vec<&str> = lines.take_while(|l| !l.starts_with("## ")).collect();
        Some(text.join("\n").trim().to_string())
    }

    /// The documentation for a terminal: `## ` headings become plain lines, code fences become
    /// 4-space indented blocks.
    pub fn doc(&self) -> String {
        let mut out = String::new();
        let mut in_code = false;
        for line in self.doc_markdown().lines() {
            if line.starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if in_code {
                out.push_str("    ");
            }
            out.push_str(line.strip_prefix("## ").unwrap_or(line));
            out.push('\n');
        }
        out
    }
}

pub static RULES: [&Rule; 22] = [
    &idem001_missing_statement::RULE,
    &idem002_idempotent_unstated::RULE,
    &idem003_missing_key::RULE,
    &idem004_undeclared_key::RULE,
    &idem005_missing_duplicate::RULE,
    &idem006_duplicate_not_in_responses::RULE,
    &idem007_duplicate_5xx::RULE,
    &idem008_unstable_key::RULE,
    &idem009_statements_disagree::RULE,
    &idem010_unknown_directive::RULE,
    &idem011_not_idempotent_with_key::RULE,
    &idem012_generated_header_key::RULE,
    &idem013_delivery_unstated::RULE,
    &idem101_route_without_operation::RULE,
    &idem102_operation_without_policy::RULE,
    &idem103_key_mismatch::RULE,
    &idem104_duplicate_mismatch::RULE,
    &idem105_token_undocumented::RULE,
    &idem106_policy_on_non_idempotent::RULE,
    &idem107_scope_undeclared::RULE,
    &idem108_token_scoped_on_whole_header::RULE,
    &idem109_gateway_answers_undocumented::RULE,
];

pub fn find(code: &str) -> Option<&'static Rule> {
    RULES.iter().copied().find(|r| r.code.eq_ignore_ascii_case(code))
}

/// The rule table of `lint/README.md`, rendered from the registry (`idem-lint rules --markdown`;
/// a test checks the README holds exactly this table).
pub fn markdown_table() -> String {
    let mut out = String::from("| code | name | default | finds |\n|---|---|---|---|\n");
    for r in &RULES {
        let finds = r.summary.replace('|', "\\|");
        out.push_str(&format!("| {} | {} | {} | {} |\n", r.code, r.name, r.severity, finds));
    }
    out
}

// ---------------------------------------------------------------------------------------
// Helpers shared by rules.

/// Does `text` contain `word` with no identifier character on either side?
pub fn contains_word(text: &str, word: &str) -> bool {
    if word.is_empty() {
        return false;
    }
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = text.get(from..).and_then(|t| t.find(word)) {
        let s = from + i;
        let e = s + word.len();
        let before = text.get(..s).and_then(|t| t.chars().next_back());
        let after = text.get(e..).and_then(|t| t.chars().next());
        if !before.is_some_and(is_ident) && !after.is_some_and(is_ident) {
            return true;
        }
        from = s + word.len().max(1);
    }
    false
}

/// Walk a subtree following `$ref`s (each target once), calling `f` on every string value
/// and mapping key until it returns true.
pub fn any_text(ws: &Workspace, start: At<'_>, f: &mut dyn FnMut(&str) -> bool) -> bool {
    let mut seen: std::collections::HashSet<*const Node> = std::collections::HashSet::new();
    let mut stack: Vec<At<'_>> = vec![start];
    while let Some(at) = stack.pop() {
        let Some(at) = ws.resolve(at) else {
            continue;
        };
        let ptr = at.node as *const Node;
        if !seen.insert(ptr) {
            continue;
        }
        if seen.len() > 100_000 {
            return false;
        }
        match &at.node.value {
            Value::String(s) if f(s) => return true,
            Value::Map(m) => {
                for e in m {
                    if f(&e.key) {
                        return true;
                    }
                    stack.push(At { file: at.file, node: &e.value });
                }
            }
            Value::Seq(s) => {
                for n in s {
                    stack.push(At { file: at.file, node: n });
                }
            }
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, clippy::string_slice)]
    use super::*;

    #[test]
    fn every_rule_doc_has_the_four_sections_in_order_and_non_empty() {
        for r in &RULES {
            let body = r.doc_body();
            let headings: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("## ")).map(str::trim).collect();
            assert_eq!(headings, DOC_SECTIONS, "{}: the `## ` headings of its `//!` comment", r.code);
            for title in DOC_SECTIONS {
                let text = r.doc_section(title).unwrap_or_default();
                assert!(!text.trim().is_empty(), "{}: section \"{title}\" is empty", r.code);
            }
            assert!(body.starts_with("## What it checks\n"), "{}: the doc must start with its first section", r.code);
            let doc = r.doc();
            assert!(doc.starts_with(&format!("{} {} ({})\n", r.code, r.name, r.severity)), "{doc}");
            assert!(!doc.contains("```") && !doc.lines().any(|l| l.starts_with("## ")), "{doc}");
        }
    }

    #[test]
    fn registry_codes_and_names_are_well_formed_unique_and_sorted() {
        let mut codes = Vec::new();
        let mut names = std::collections::HashSet::new();
        for r in &RULES {
            assert!(
                r.code.len() == 7 && r.code.starts_with("IDEM") && r.code[4..].bytes().all(|b| b.is_ascii_digit()),
                "{}",
                r.code
            );
            assert!(r.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'), "{}", r.name);
            assert!(names.insert(r.name), "duplicate name {}", r.name);
            assert!(!r.summary.is_empty() && !r.summary.contains('\n'), "{}", r.code);
            codes.push(r.code);
            // The rule is defined in its own file, `idemNNN_snake_name.rs`.
            let file = format!("{}_{}.rs", r.code.to_ascii_lowercase(), r.name.replace('-', "_"));
            assert!(r.source.contains(&format!("include_str!(\"{file}\")")), "{}: not defined in {file}", r.code);
            assert_eq!(find(&r.code.to_ascii_lowercase()).map(|f| f.code), Some(r.code));
        }
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(codes, sorted, "codes must be unique and in order");
    }

    #[test]
    fn rule_bodies_take_their_code_from_rule() {
        // The only `"IDEMnnn"` literal in a rule's file is its own definition: a finding built
        // with a typo'd literal would carry a code no config or suppression can name.
        for r in &RULES {
            let literals: Vec<&str> = r
                .source
                .match_indices("\"IDEM")
                .map(|(i, _)| r.source.get(i + 1..i + 8).unwrap_or(""))
                .filter(|c| c.get(4..).is_some_and(|d| d.bytes().all(|b| b.is_ascii_digit())))
                .collect();
            assert_eq!(literals, [r.code], "{}: code literals outside `RULE`", r.code);
            assert!(r.source.contains(&format!("code: \"{}\",", r.code)));
        }
    }

    const TABLE_BEGIN: &str = "<!-- rules table: generated by `idem-lint rules --markdown` -->\n";
    const TABLE_END: &str = "<!-- end of rules table -->\n";

    #[test]
    fn readme_rule_table_is_generated_from_the_registry() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/README.md");
        let readme = std::fs::read_to_string(path).unwrap_or_default();
        let table = markdown_table();
        let (Some(b), Some(e)) = (readme.find(TABLE_BEGIN), readme.find(TABLE_END)) else {
            panic!(
                "lint/README.md has no `{}` … `{}` markers around its rule table",
                TABLE_BEGIN.trim(),
                TABLE_END.trim()
            );
        };
        let current = readme.get(b + TABLE_BEGIN.len()..e).unwrap_or_default();
        if current == table {
            return;
        }
        if std::env::var_os("IDEM_LINT_UPDATE_README").is_some() {
            let updated = format!("{}{table}{}", &readme[..b + TABLE_BEGIN.len()], &readme[e..]);
            std::fs::write(path, updated).unwrap_or_else(|err| panic!("writing {path}: {err}"));
            return;
        }
        panic!(
            "lint/README.md's rule table is not the registry's (lint/src/rules).\n\
             Regenerate it: IDEM_LINT_UPDATE_README=1 cargo test -p idem-lint readme_rule_table \
             (or paste the output of `idem-lint rules --markdown` between the markers).\n\
             --- README ---\n{current}--- registry ---\n{table}"
        );
    }
}
