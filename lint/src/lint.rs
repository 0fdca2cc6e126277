//! The engine: load → operations → statements → rules → suppressions → positioned findings.

use std::collections::BTreeMap;

use crate::config::{Config, Severity};
use crate::loader::{At, Workspace};
use crate::model::{deliveries, operations, Operation};
use crate::node::{split_pointer, Node, Value};
use crate::rules::{Ctx, RawFinding, DELIVERY_RULES, RULES};
use crate::source::{char_width, FatalError, Position, SourceFile};
use crate::statement::statements;

/// Characters of context kept on each side of the column in a snippet (long minified lines).
const SNIPPET_CONTEXT: usize = 60;

/// The source line of a finding, cut to a window around the column when it is long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snippet {
    pub text: String,
    /// 0-based character index of the finding's column inside `text`.
    pub caret: usize,
    pub cut_left: bool,
    pub cut_right: bool,
}

impl Snippet {
    /// Display width of the text before the caret (where the caret goes in a terminal).
    pub fn caret_width(&self) -> usize {
        self.text.chars().take(self.caret).map(char_width).sum()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub code: &'static str,
    pub severity: Severity,
    pub file: String,
    pub position: Position,
    pub pointer: String,
    pub message: String,
    pub snippet: Snippet,
    /// Other places the finding concerns (the policy file's field for a spec finding, or the
    /// spec's statement for a policy finding): SARIF `relatedLocations`, JSON `related`.
    pub related: Vec<Related>,
}

/// A secondary location of a finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Related {
    pub file: String,
    pub position: Position,
    pub pointer: String,
    pub message: String,
    pub snippet: Snippet,
}

impl Finding {
    /// The deterministic output order: file, line, column, code, message.
    fn sort_key(&self) -> (&str, usize, usize, &str, &str) {
        (&self.file, self.position.line, self.position.column, self.code, &self.message)
    }
}

/// Lint one spec file.
pub fn lint_path(path: &str, cfg: &Config) -> Result<Vec<Finding>, FatalError> {
    let ws = Workspace::load(path)?;
    Ok(lint_workspace(&ws, cfg))
}

/// Lint a spec held in memory (tests).
pub fn lint_text(name: &str, text: &str, cfg: &Config) -> Result<Vec<Finding>, FatalError> {
    let ws = Workspace::from_text(name, text)?;
    Ok(lint_workspace(&ws, cfg))
}

pub fn lint_workspace(ws: &Workspace, cfg: &Config) -> Vec<Finding> {
    let mut ops = operations(ws, &cfg.methods);
    ops.extend(deliveries(ws, &cfg.methods));
    let enabled: Vec<_> = RULES.iter().filter_map(|r| cfg.severity(r.code).map(|s| (r, s))).collect();
    let mut raw: Vec<(RawFinding, Severity)> = Vec::new();
    // A finding on a node shared by several operations (IDEM010 on the root's
    // `x-idem-lint-ignore`) is reported once.
    let mut seen: std::collections::HashSet<RawFinding> = std::collections::HashSet::new();
    for op in &ops {
        let st = statements(ws, op, &cfg.section_titles, true);
        let merged = st.merged();
        let ctx = Ctx { ws, op, statements: &st, merged: merged.as_ref() };
        let mut found = Vec::new();
        for (rule, _) in &enabled {
            if op.is_delivery() && !DELIVERY_RULES.contains(&rule.code) {
                continue;
            }
            if let crate::rules::Check::Operation(check) = rule.check {
                check(&ctx, &mut found);
            }
        }
        for f in found {
            if ignored(ws, op, &f.pointer, f.code) {
                continue;
            }
            if !seen.insert(f.clone()) {
                continue;
            }
            let sev = enabled.iter().find(|(r, _)| r.code == f.code).map_or(Severity::Error, |(_, s)| *s);
            raw.push((f, sev));
        }
    }
    position(ws, raw)
}

fn position(ws: &Workspace, raw: Vec<(RawFinding, Severity)>) -> Vec<Finding> {
    let mut by_file: BTreeMap<usize, Vec<(RawFinding, Severity)>> = BTreeMap::new();
    for r in raw {
        by_file.entry(r.0.file).or_default().push(r);
    }
    let mut out = Vec::new();
    for (file, list) in by_file {
        let src = ws.file(file);
        let offsets: Vec<u32> = list.iter().map(|(f, _)| f.offset).collect();
        let positions = src.positions(&offsets);
        for ((f, sev), pos) in list.into_iter().zip(positions) {
            out.push(Finding {
                code: f.code,
                severity: sev,
                file: src.name.clone(),
                position: pos,
                pointer: f.pointer,
                message: f.message,
                snippet: snippet(src, pos.line, f.offset),
                related: Vec::new(),
            });
        }
    }
    sort(&mut out);
    out
}

pub fn sort(findings: &mut [Finding]) {
    findings.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
}

/// The line around a byte offset, cut to a window of characters around it when the line
/// is long. Works from the offset outwards, so a finding on a 20 MB one-line JSON file costs
/// O(window), not O(line).
pub(crate) fn snippet(src: &SourceFile, line: usize, offset: u32) -> Snippet {
    let (ls, le) = src.line_bounds(line);
    let text = &src.text;
    let mut off = (offset as usize).clamp(ls, le);
    while off > ls && !text.is_char_boundary(off) {
        off -= 1;
    }
    let before = text.get(ls..off).unwrap_or("");
    let after = text.get(off..le).unwrap_or("");
    let mut start = off;
    let mut caret = 0;
    for (i, _) in before.char_indices().rev() {
        if caret == SNIPPET_CONTEXT {
            break;
        }
        start = ls + i;
        caret += 1;
    }
    let mut end = off;
    for (taken, c) in after.chars().enumerate() {
        if taken == 2 * SNIPPET_CONTEXT {
            break;
        }
        end += c.len_utf8();
    }
    Snippet { text: text.get(start..end).unwrap_or("").to_string(), caret, cut_left: start > ls, cut_right: end < le }
}

fn ignore_list(node: &Node) -> Vec<&str> {
    match node.get("x-idem-lint-ignore").map(|n| &n.value) {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Seq(items)) => items.iter().filter_map(Node::as_str).collect(),
        _ => Vec::new(),
    }
}

fn matches_code(list: &[&str], code: &str) -> bool {
    list.iter().any(|c| c.eq_ignore_ascii_case(code) || *c == "*" || c.eq_ignore_ascii_case("all"))
}

/// `x-idem-lint-ignore` on the root, `paths`, the path item, the operation or any node on the
/// way from the operation to the finding's node.
pub(crate) fn ignored(ws: &Workspace, op: &Operation<'_>, pointer: &str, code: &str) -> bool {
    for a in &op.ancestors {
        if matches_code(&ignore_list(a.node), code) {
            return true;
        }
    }
    let rest = pointer.strip_prefix(op.pointer.as_str()).unwrap_or("");
    let Some(segments) = split_pointer(rest) else {
        return false;
    };
    let mut cur = op.at;
    for seg in &segments {
        let Some(next) = cur.node.child(seg) else {
            break;
        };
        let Some(next) = ws.resolve(At { file: cur.file, node: next }) else {
            break;
        };
        if matches_code(&ignore_list(next.node), code) {
            return true;
        }
        cur = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snippet_windows_long_lines() {
        let line = format!("{}支付{}", "x".repeat(1000), "y".repeat(1000));
        let src = SourceFile::new("t".into(), format!("a\n{line}\nb"));
        let off = 2 + 1000;
        let s = snippet(&src, 2, off as u32);
        assert!(s.cut_left && s.cut_right);
        assert_eq!(s.caret, SNIPPET_CONTEXT);
        assert_eq!(s.text.chars().nth(s.caret), Some('支'));
        let src = SourceFile::new("t".into(), "x:\n  post:\n".into());
        let short = snippet(&src, 2, 5);
        assert_eq!(short.text, "  post:");
        assert_eq!(short.caret, 2);
        assert!(!short.cut_left && !short.cut_right);
    }
}
