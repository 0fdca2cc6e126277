//! The rule catalogue. One rule per file; each file's `//!` comment is its documentation,
//! printed by `idem-lint --explain CODE` and shown as SARIF help text.

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
pub mod idem101_route_without_operation;
pub mod idem102_operation_without_policy;
pub mod idem103_key_mismatch;
pub mod idem104_duplicate_mismatch;
pub mod idem105_token_undocumented;
pub mod idem106_policy_on_non_idempotent;

/// One finding before severities and suppressions are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
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
    pub fn at(&self, code: &'static str, loc: &Loc, message: String) -> RawFinding {
        RawFinding { code, file: loc.file, offset: loc.offset, pointer: loc.pointer.clone(), message }
    }

    /// The statement's duplicate response, when it names a status (rules on that status).
    pub fn duplicate_status(&self) -> Option<(&crate::statement::Field<crate::section::Duplicate>, u16)> {
        let dup = self.merged?.duplicate.as_ref()?;
        Some((dup, dup.value.status?))
    }

    pub fn label(&self) -> String {
        self.op.label()
    }
}

pub type Check = fn(&Ctx<'_>, &mut Vec<RawFinding>);

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

pub struct Rule {
    pub code: &'static str,
    pub name: &'static str,
    pub severity: Severity,
    pub summary: &'static str,
    source: &'static str,
    /// The per-operation check (spec rules).
    pub check: Check,
    /// The spec ↔ policy check (`--policies`, IDEM1xx); these rules have a no-op `check`.
    pub cross: Option<cross::CrossCheck>,
}

/// The per-operation check of a cross-check rule: nothing (it runs only with `--policies`).
fn spec_only_with_policies(_: &Ctx<'_>, _: &mut Vec<RawFinding>) {}

impl Rule {
    /// The rule's documentation as Markdown: its file's leading `//!` comment.
    pub fn doc_markdown(&self) -> String {
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

    /// The documentation for a terminal: code fences become 4-space indented blocks.
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
            out.push_str(line);
            out.push('\n');
        }
        out
    }
}

pub static RULES: [Rule; 15] = [
    Rule {
        code: "IDEM001",
        name: "missing-statement",
        severity: Severity::Error,
        summary: "non-safe operation without a 幂等性说明",
        source: include_str!("idem001_missing_statement.rs"),
        check: idem001_missing_statement::check,
        cross: None,
    },
    Rule {
        code: "IDEM002",
        name: "idempotent-unstated",
        severity: Severity::Error,
        summary: "statement does not say whether the operation is idempotent",
        source: include_str!("idem002_idempotent_unstated.rs"),
        check: idem002_idempotent_unstated::check,
        cross: None,
    },
    Rule {
        code: "IDEM003",
        name: "missing-key",
        severity: Severity::Error,
        summary: "idempotent, but no key named",
        source: include_str!("idem003_missing_key.rs"),
        check: idem003_missing_key::check,
        cross: None,
    },
    Rule {
        code: "IDEM004",
        name: "undeclared-key",
        severity: Severity::Error,
        summary: "named key is not declared by the operation",
        source: include_str!("idem004_undeclared_key.rs"),
        check: idem004_undeclared_key::check,
        cross: None,
    },
    Rule {
        code: "IDEM005",
        name: "missing-duplicate",
        severity: Severity::Error,
        summary: "idempotent, but no duplicate response named",
        source: include_str!("idem005_missing_duplicate.rs"),
        check: idem005_missing_duplicate::check,
        cross: None,
    },
    Rule {
        code: "IDEM006",
        name: "duplicate-not-in-responses",
        severity: Severity::Error,
        summary: "duplicate status not among the responses, or its code not in that response",
        source: include_str!("idem006_duplicate_not_in_responses.rs"),
        check: idem006_duplicate_not_in_responses::check,
        cross: None,
    },
    Rule {
        code: "IDEM007",
        name: "duplicate-5xx",
        severity: Severity::Error,
        summary: "duplicate answered with a 5xx",
        source: include_str!("idem007_duplicate_5xx.rs"),
        check: idem007_duplicate_5xx::check,
        cross: None,
    },
    Rule {
        code: "IDEM008",
        name: "unstable-key",
        severity: Severity::Warning,
        summary: "unstable or too-coarse key (user id alone, timestamp, whole-body hash)",
        source: include_str!("idem008_unstable_key.rs"),
        check: idem008_unstable_key::check,
        cross: None,
    },
    Rule {
        code: "IDEM009",
        name: "statements-disagree",
        severity: Severity::Error,
        summary: "description section and x-idempotency disagree",
        source: include_str!("idem009_statements_disagree.rs"),
        check: idem009_statements_disagree::check,
        cross: None,
    },
    Rule {
        code: "IDEM101",
        name: "route-without-operation",
        severity: Severity::Error,
        summary: "policy route that matches no operation of the spec",
        source: include_str!("idem101_route_without_operation.rs"),
        check: spec_only_with_policies,
        cross: Some(idem101_route_without_operation::check),
    },
    Rule {
        code: "IDEM102",
        name: "operation-without-policy",
        severity: Severity::Error,
        summary: "operation documented as idempotent, but no policy route protects it",
        source: include_str!("idem102_operation_without_policy.rs"),
        check: spec_only_with_policies,
        cross: Some(idem102_operation_without_policy::check),
    },
    Rule {
        code: "IDEM103",
        name: "key-mismatch",
        severity: Severity::Error,
        summary: "policy and spec disagree on where the key is or what it is called",
        source: include_str!("idem103_key_mismatch.rs"),
        check: spec_only_with_policies,
        cross: Some(idem103_key_mismatch::check),
    },
    Rule {
        code: "IDEM104",
        name: "duplicate-mismatch",
        severity: Severity::Error,
        summary: "policy and spec disagree on the duplicate response's status or code",
        source: include_str!("idem104_duplicate_mismatch.rs"),
        check: spec_only_with_policies,
        cross: Some(idem104_duplicate_mismatch::check),
    },
    Rule {
        code: "IDEM105",
        name: "token-undocumented",
        severity: Severity::Error,
        summary: "token policy whose issue endpoint or token header the spec does not document",
        source: include_str!("idem105_token_undocumented.rs"),
        check: spec_only_with_policies,
        cross: Some(idem105_token_undocumented::check),
    },
    Rule {
        code: "IDEM106",
        name: "policy-on-non-idempotent",
        severity: Severity::Error,
        summary: "policy enforces idempotency on an operation the spec says is not idempotent",
        source: include_str!("idem106_policy_on_non_idempotent.rs"),
        check: spec_only_with_policies,
        cross: Some(idem106_policy_on_non_idempotent::check),
    },
];

pub fn find(code: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| r.code.eq_ignore_ascii_case(code))
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
