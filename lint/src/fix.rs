//! `idem-lint --fix`: mechanical repairs only, as text insertions that keep the file's
//! formatting and comments. Today one: a duplicate status the statement names but the
//! operation's `responses` lacks (IDEM006) is added as a one-line entry whose description names
//! the duplicate code. Nothing is invented: an operation without a statement stays IDEM001, a
//! code missing from an existing response stays a finding.

use crate::config::Config;
use crate::loader::{At, Workspace};
use crate::model::operations;
use crate::rules::idem006_duplicate_not_in_responses::{missing_status, MissingStatus};
use crate::rules::Ctx;
use crate::statement::statements;

/// One insertion into a file of the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub file: usize,
    pub at: usize,
    pub text: String,
}

/// The edits `--fix` makes to a workspace, in file order. An operation whose `responses` is not
/// written inside it (a `$ref`, a YAML alias or merge) is left alone: the shared map serves
/// other operations too.
pub fn fixes(ws: &Workspace, cfg: &Config) -> Vec<Edit> {
    let mut out: Vec<Edit> = Vec::new();
    // Whether each file is JSON, found once per file (a file may hold hundreds of fixes).
    let mut json_files: std::collections::HashMap<usize, bool> = std::collections::HashMap::new();
    for op in operations(ws, &cfg.methods) {
        if cfg.severity("IDEM006").is_none() {
            break;
        }
        let st = statements(ws, &op, &cfg.section_titles, true);
        let merged = st.merged();
        let ctx = Ctx { ws, op: &op, statements: &st, merged: merged.as_ref() };
        let Some(missing) = missing_status(&ctx) else {
            continue;
        };
        let Some(responses) = missing.responses.filter(|r| inside(r, &op.at)) else {
            continue;
        };
        let text = &ws.file(responses.file).text;
        let json = *json_files.entry(responses.file).or_insert_with(|| is_json(text));
        // The description in the statement's language: a Chinese statement gets Chinese text.
        let chinese = merged.as_ref().is_some_and(|m| m.origin == crate::statement::Origin::Section && !m.english);
        if let Some(edit) = insertion(text, json, responses, &missing, chinese) {
            if !out.contains(&edit) {
                out.push(edit);
            }
        }
    }
    out.sort_by_key(|e| (e.file, e.at));
    out
}

/// Whether `inner` is written within `outer`'s text (not pulled in by reference or alias).
fn inside(inner: &At<'_>, outer: &At<'_>) -> bool {
    inner.file == outer.file && inner.node.start >= outer.node.start && inner.node.end <= outer.node.end
}

/// The new `responses` entry, in the map's own style: a JSON or YAML flow map gets `, "409": {…}`
/// after its last entry (on a line of its own when the map spans lines); a YAML block map gets a
/// line at its entries' indentation after the last one.
fn insertion(
    text: &str,
    json_file: bool,
    responses: At<'_>,
    missing: &MissingStatus<'_>,
    chinese: bool,
) -> Option<Edit> {
    let map = responses.node;
    let entries = map.as_map()?;
    let (start, end) = (map.start as usize, map.end as usize);
    let own: Vec<_> =
        entries.iter().filter(|e| (e.key_start as usize) >= start && (e.key_start as usize) < end).collect();
    let last = own.iter().max_by_key(|e| e.value.end)?;
    let first = own.iter().min_by_key(|e| e.key_start)?;
    let description = match (&missing.code, chinese) {
        (Some(code), false) => format!("{code}: a repeat of a request already processed"),
        (None, false) => "a repeat of a request already processed".to_string(),
        (Some(code), true) => format!("{code}：重复请求（该请求已处理过）"),
        (None, true) => "重复请求（该请求已处理过）".to_string(),
    };
    let flow = text.as_bytes().get(start) == Some(&b'{');
    let json = flow && text.as_bytes().get(first.key_start as usize) == Some(&b'"') && json_file;
    let quote = match text.as_bytes().get(first.key_start as usize) {
        Some(b'"') => "\"",
        Some(b'\'') => "'",
        _ => "",
    };
    let key = format!("{quote}{}{quote}", missing.status);
    let value = if json {
        format!("{{\"description\": {}}}", json_string(&description))
    } else {
        format!("{{ description: {} }}", json_string(&description))
    };
    // A span may end past the whitespace that follows its value.
    let at = text.get(..last.value.end as usize).map_or(last.value.end as usize, |t| t.trim_end().len());
    if flow {
        let spans_lines = text.get(start..end).is_some_and(|t| t.contains('\n'));
        let sep = if spans_lines { format!(",\n{}", indent_of(text, first.key_start as usize)) } else { ", ".into() };
        let sep = if json && !spans_lines { ",".to_string() } else { sep };
        let colon = if json && !spans_lines { ":" } else { ": " };
        return Some(Edit { file: responses.file, at, text: format!("{sep}{key}{colon}{value}") });
    }
    // A block map: after the line the last entry ends on (its comment included).
    let line_end = text.get(at..).and_then(|t| t.find('\n')).map_or(text.len(), |i| at + i);
    let indent = indent_of(text, first.key_start as usize);
    Some(Edit { file: responses.file, at: line_end, text: format!("\n{indent}{key}: {value}") })
}

/// The whitespace before the line's first character, up to `at`.
fn indent_of(text: &str, at: usize) -> String {
    let line_start = text.get(..at).and_then(|t| t.rfind('\n')).map_or(0, |i| i + 1);
    text.get(line_start..at).unwrap_or("").chars().take_while(|c| *c == ' ' || *c == '\t').collect()
}

/// Whether the whole file is JSON (a JSON spec is fixed in JSON).
fn is_json(text: &str) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// A string in JSON's escaping (valid YAML too).
fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// `text` with the edits applied (edits of one file, any order).
pub fn apply(text: &str, edits: &[&Edit]) -> String {
    let mut sorted: Vec<&&Edit> = edits.iter().collect();
    sorted.sort_by_key(|e| std::cmp::Reverse(e.at));
    let mut out = text.to_string();
    for e in sorted {
        if e.at <= out.len() && out.is_char_boundary(e.at) {
            out.insert_str(e.at, &e.text);
        }
    }
    out
}

/// The files a workspace's edits change: (file name, old text, new text).
pub fn changed_files(ws: &Workspace, edits: &[Edit]) -> Vec<(String, String, String)> {
    let mut files: Vec<usize> = edits.iter().map(|e| e.file).collect();
    files.dedup();
    files
        .into_iter()
        .map(|f| {
            let src = ws.file(f);
            let mine: Vec<&Edit> = edits.iter().filter(|e| e.file == f).collect();
            (src.name.clone(), src.text.clone(), apply(&src.text, &mine))
        })
        .collect()
}

/// A unified diff of one file's change (`--fix --diff`).
pub fn unified_diff(name: &str, old: &str, new: &str) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{name}"), &format!("b/{name}"))
        .to_string()
}
