//! `idem-lint --fix`: mechanical repairs only, as text insertions that keep the file's
//! formatting and comments, in the statement's language. A webhook or callback that does not
//! say it may be delivered again gets that said (IDEM013), with a template for its event id
//! when it has no statement. A duplicate status the statement names
//! but the operation's `responses` lacks (IDEM006) is added as a one-line entry whose description
//! names the duplicate code; with `--policies`, so are the statuses of the gateway's own answers
//! the policy gives on the operation (IDEM109), one entry per status naming its codes. Nothing is
//! invented: an operation without a statement stays IDEM001, a code missing from an existing
//! response stays a finding.

use crate::config::Config;
use crate::loader::{At, Workspace};
use crate::model::{deliveries, operations, Operation};
use crate::rules::idem006_duplicate_not_in_responses::missing_status;
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
        let description = duplicate_text(missing.code.as_deref(), chinese);
        if let Some(edit) = insertion(text, json, responses, missing.status, &description) {
            if !out.contains(&edit) {
                out.push(edit);
            }
        }
    }
    out.extend(delivery_fixes(ws, cfg));
    out.sort_by_key(|e| (e.file, e.at));
    out
}

/// IDEM013: a webhook or callback that says nothing gets an `x-idempotency` template — the event
/// id its one declared id-like header or body field (`webhook-id`, `ce-id`, `event_id`, …), else
/// a placeholder IDEM004 keeps reporting until it is filled in — and `delivery: at-least-once`.
/// A statement without its delivery line gets one: `delivery` in `x-idempotency`, or a list line
/// after the section's last item (`- 投递：至少一次` / `- Delivery: at least once`).
fn delivery_fixes(ws: &Workspace, cfg: &Config) -> Vec<Edit> {
    let mut out = Vec::new();
    if cfg.severity("IDEM013").is_none() {
        return out;
    }
    for op in deliveries(ws, &cfg.methods) {
        let st = statements(ws, &op, &cfg.section_titles, true);
        // Only what IDEM013 reports, and not where it is suppressed.
        let merged = st.merged();
        let ctx = Ctx { ws, op: &op, statements: &st, merged: merged.as_ref() };
        let mut found = Vec::new();
        crate::rules::idem013_delivery_unstated::check(&ctx, &mut found);
        if found.iter().all(|f| crate::lint::ignored(ws, &op, &f.pointer, f.code)) {
            continue;
        }
        let text = &ws.file(op.at.file).text;
        let json = is_json(text);
        let edit = match (&st.extension, &st.section) {
            (None, None) => {
                let (location, name) = event_id(&op).unwrap_or(("header", "<event id>"));
                let value = |json: bool| {
                    if json {
                        format!(
                            "{{\"key\": {{\"in\": \"{location}\", \"name\": {}}}, \"delivery\": \"at-least-once\"}}",
                            json_string(name)
                        )
                    } else {
                        format!("{{ key: {{ in: {location}, name: {} }}, delivery: at-least-once }}", json_string(name))
                    }
                };
                map_insertion(text, json, op.at, "x-idempotency", value)
            }
            (Some(ext), _) if ext.delivery.is_none() => {
                op.at.node.get("x-idempotency").filter(|n| n.as_map().is_some()).and_then(|n| {
                    map_insertion(text, json, At { file: op.at.file, node: n }, "delivery", |j| {
                        if j {
                            "\"at-least-once\"".into()
                        } else {
                            "at-least-once".into()
                        }
                    })
                })
            }
            (None, Some(section)) if section.delivery.is_none() => section_line(text, &op, section),
            _ => None,
        };
        out.extend(edit.filter(|e| !out.contains(e)));
    }
    out
}

/// The one header parameter or top-level body property of a delivery that names its event
/// (`webhook-id`, `ce-id`, `x-…-event-id`, `event_id`, `notify_id`), as (location, name).
fn event_id<'a>(op: &Operation<'a>) -> Option<(&'static str, &'a str)> {
    let looks = |n: &str| {
        let n = n.to_ascii_lowercase().replace('_', "-");
        ["webhook-id", "ce-id", "event-id", "notify-id", "delivery-id", "message-id"].iter().any(|w| n.ends_with(w))
    };
    let headers: Vec<&str> =
        op.params.iter().filter(|p| p.location == "header" && looks(p.name)).map(|p| p.name).collect();
    if let [one] = headers.as_slice() {
        return Some(("header", one));
    }
    let fields: Vec<&str> = op
        .body
        .schemas
        .iter()
        .filter_map(|s| s.node.get("properties").and_then(crate::node::Node::as_map))
        .flatten()
        .map(|e| e.key.as_str())
        .filter(|k| looks(k) || *k == "id")
        .collect();
    match fields.as_slice() {
        [one] => Some(("body", one)),
        _ => None,
    }
}

/// `- 投递：至少一次` after the last item line of a section written in a YAML literal block
/// scalar (`|`, found verbatim, a list line of one line); nothing for a quoted or JSON string,
/// a folded scalar (`>`), or an item that continues on the next line.
fn section_line(text: &str, op: &Operation<'_>, st: &crate::statement::Statement) -> Option<Edit> {
    let entry = op.at.node.entry("description")?;
    let desc = &entry.value;
    let (start, end) = (desc.start as usize, desc.end as usize);
    // `description: |` (`|-`, `|+`, `|2`): the indicator between the key's colon and the text.
    let head = text.get(entry.key_start as usize..start.max(entry.key_start as usize))?;
    let after_colon = head.split_once(':').map_or(head, |(_, rest)| rest).trim_start();
    if !after_colon.starts_with('|') && text.as_bytes().get(start) != Some(&b'|') {
        return None;
    }
    let last =
        [st.key.as_ref().map(|f| &f.loc), st.duplicate.as_ref().map(|f| &f.loc), st.expiry.as_ref().map(|f| &f.loc)]
            .into_iter()
            .chain([st.idempotent.as_ref().map(|f| &f.loc)])
            .flatten()
            .map(|l| l.offset as usize)
            .filter(|o| *o > start && *o < end)
            .max()?;
    let line_start = text.get(..last)?.rfind('\n').map_or(0, |i| i + 1);
    let line_end = text.get(last..)?.find('\n').map_or(text.len(), |i| last + i);
    let line = text.get(line_start..line_end)?;
    let indent = indent_of(text, line_start + line.len() - line.trim_start().len());
    let marker = ["- ", "* ", "+ "].into_iter().find(|m| line.trim_start().starts_with(m))?;
    if line_end >= end.min(text.len()) {
        return None;
    }
    // The next line continues the item when it is indented past the marker.
    let next = text.get(line_end + 1..)?.lines().next().unwrap_or("");
    let next_indent = next.len() - next.trim_start().len();
    if !next.trim().is_empty() && next_indent > indent.len() {
        return None;
    }
    let item = if st.english { "Delivery: at least once" } else { "投递：至少一次" };
    Some(Edit { file: op.at.file, at: line_end, text: format!("\n{indent}{marker}{item}") })
}

/// With `--policies`: the responses the gateway's own answers need on each operation a key-mode
/// policy protects (IDEM109) and that its `responses` lack altogether, added with the codes in
/// the statement's language. A status that is there without the code is left as it is (its
/// description is the author's): it stays a finding. Where IDEM006 adds the duplicate status to
/// the same map, the entry is written here once, with both ([`merge_gateway_answers`] drops
/// IDEM006's edit at the same place).
pub fn gateway_answer_fixes(ctx: &crate::rules::cross::PolicyCtx<'_>, cfg: &Config) -> Vec<Edit> {
    use crate::rules::idem109_gateway_answers_undocumented::missing_answers;
    let mut out: Vec<Edit> = Vec::new();
    if cfg.severity("IDEM109").is_none() {
        return out;
    }
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        for &oi in matched {
            let op = &ctx.ops[oi];
            let ws = &ctx.workspaces[op.ws];
            let Some(responses) = op.op.responses.filter(|r| inside(r, &op.op.at)) else {
                continue;
            };
            let present =
                |status: u16| responses.node.as_map().is_some_and(|m| m.iter().any(|e| e.key == status.to_string()));
            let mut by_status: Vec<(u16, Vec<&str>)> = Vec::new();
            for (status, code) in missing_answers(ws, &op.op, route) {
                if present(status) {
                    continue;
                }
                match by_status.iter_mut().find(|(s, _)| *s == status) {
                    Some((_, codes)) => codes.push(code),
                    None => by_status.push((status, vec![code])),
                }
            }
            if by_status.is_empty() {
                continue;
            }
            let st = statements(ws, &op.op, &cfg.section_titles, true);
            let statement = st.merged();
            let chinese =
                statement.as_ref().is_some_and(|m| m.origin == crate::statement::Origin::Section && !m.english);
            // The duplicate status IDEM006 would add to this same map: written here, once.
            let c = Ctx { ws, op: &op.op, statements: &st, merged: statement.as_ref() };
            let duplicate = missing_status(&c)
                .filter(|m| m.responses.is_some_and(|r| r.node.start == responses.node.start) && !present(m.status));
            if let Some(d) = &duplicate {
                if !by_status.iter().any(|(s, _)| *s == d.status) {
                    by_status.push((d.status, Vec::new()));
                }
            }
            let text = &ws.file(responses.file).text;
            let json = is_json(text);
            let mut merged: Option<Edit> = None;
            for (status, codes) in by_status {
                let described: Vec<String> = codes.iter().map(|c| gateway_answer_text(c, chinese)).collect();
                let lead = if chinese { "网关应答：" } else { "The gateway's answer: " };
                let answers = format!("{lead}{}", described.join(" / "));
                let description = match &duplicate {
                    Some(d) if d.status == status && codes.is_empty() => duplicate_text(d.code.as_deref(), chinese),
                    Some(d) if d.status == status => {
                        let sep = if chinese { "；" } else { "; " };
                        format!("{}{sep}{answers}", duplicate_text(d.code.as_deref(), chinese))
                    }
                    _ => answers,
                };
                let Some(edit) = insertion(text, json, responses, status, &description) else {
                    continue;
                };
                merged = Some(match merged {
                    Some(m) if m.at == edit.at => Edit { text: m.text + &edit.text, ..m },
                    Some(m) => {
                        out.push(m);
                        edit
                    }
                    None => edit,
                });
            }
            out.extend(merged.filter(|e| !out.contains(e)));
        }
    }
    out.sort_by_key(|e| (e.file, e.at));
    out
}

/// The description of an added duplicate response (IDEM006).
fn duplicate_text(code: Option<&str>, chinese: bool) -> String {
    match (code, chinese) {
        (Some(code), false) => format!("{code}: a repeat of a request already processed"),
        (None, false) => "a repeat of a request already processed".to_string(),
        (Some(code), true) => format!("{code}：重复请求（该请求已处理过）"),
        (None, true) => "重复请求（该请求已处理过）".to_string(),
    }
}

/// One of the gateway's answers, for a client reading the spec.
fn gateway_answer_text(code: &str, chinese: bool) -> String {
    let what = match (code, chinese) {
        ("REQUEST_IN_PROGRESS", false) => "the first request with this key is still running; retry shortly",
        ("REQUEST_IN_PROGRESS", true) => "同一幂等键的首次请求仍在处理中，稍后重试",
        ("IDEMPOTENCY_OUTCOME_UNKNOWN", false) => {
            "the first request's outcome is unknown; check it before sending new work"
        }
        ("IDEMPOTENCY_OUTCOME_UNKNOWN", true) => "首次请求已转发但结果未知，先核实，切勿换新键重试",
        ("IDEMPOTENCY_KEY_REUSED", false) => "the key was used with another request",
        ("IDEMPOTENCY_KEY_REUSED", true) => "同一幂等键用于不同的请求",
        ("IDEMPOTENCY_KEY_MISSING", false) => "no idempotency key",
        ("IDEMPOTENCY_KEY_MISSING", true) => "缺少幂等键",
        ("IDEMPOTENCY_SCOPE_MISSING", false) => "no caller identity",
        ("IDEMPOTENCY_SCOPE_MISSING", true) => "缺少调用方身份",
        ("REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW", false) => {
            "Repeatability-First-Sent is outside the window: send it as a new request"
        }
        ("REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW", true) => "Repeatability-First-Sent 超出时间窗口，请作为新请求发送",
        _ => "",
    };
    if chinese {
        format!("{code}（{what}）")
    } else {
        format!("{code} ({what})")
    }
}

/// Whether `inner` is written within `outer`'s text (not pulled in by reference or alias).
fn inside(inner: &At<'_>, outer: &At<'_>) -> bool {
    inner.file == outer.file && inner.node.start >= outer.node.start && inner.node.end <= outer.node.end
}

/// The new `responses` entry, in the map's own style: a JSON or YAML flow map gets `, "409": {…}`
/// after its last entry (on a line of its own when the map spans lines); a YAML block map gets a
/// line at its entries' indentation after the last one.
fn insertion(text: &str, json_file: bool, responses: At<'_>, status: u16, description: &str) -> Option<Edit> {
    let value = |json: bool| {
        if json {
            format!("{{\"description\": {}}}", json_string(description))
        } else {
            format!("{{ description: {} }}", json_string(description))
        }
    };
    map_insertion(text, json_file, responses, &status.to_string(), value)
}

/// A new entry `key: value` of a map, in the map's own style: a JSON or YAML flow map gets
/// `, key: value` after its last entry (on a line of its own when the map spans lines); a YAML
/// block map gets a line at its entries' indentation after the last one. `value(json)` writes the
/// value as JSON or as YAML flow.
fn map_insertion(
    text: &str,
    json_file: bool,
    responses: At<'_>,
    key: &str,
    value: impl Fn(bool) -> String,
) -> Option<Edit> {
    let map = responses.node;
    let entries = map.as_map()?;
    let (start, end) = (map.start as usize, map.end as usize);
    let own: Vec<_> =
        entries.iter().filter(|e| (e.key_start as usize) >= start && (e.key_start as usize) < end).collect();
    let last = own.iter().max_by_key(|e| e.value.end)?;
    let first = own.iter().min_by_key(|e| e.key_start)?;
    let flow = text.as_bytes().get(start) == Some(&b'{');
    let json = flow && text.as_bytes().get(first.key_start as usize) == Some(&b'"') && json_file;
    let quote = match text.as_bytes().get(first.key_start as usize) {
        Some(b'"') => "\"",
        Some(b'\'') => "'",
        _ => "",
    };
    let key = format!("{quote}{key}{quote}");
    let value = value(json);
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

/// `--fix` with `--policies`: the IDEM006 edits and the gateway's answers (IDEM109), an IDEM006
/// edit dropped where a gateway edit writes the same map's new entries (it carries the duplicate).
pub fn merge_gateway_answers(mut edits: Vec<Edit>, gateway: Vec<Edit>) -> Vec<Edit> {
    edits.retain(|e| !gateway.iter().any(|g| g.file == e.file && g.at == e.at));
    edits.extend(gateway);
    edits.sort_by_key(|e| (e.file, e.at));
    edits
}
