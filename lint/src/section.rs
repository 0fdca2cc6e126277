//! Finding the 幂等性说明 section of a Markdown `description`: its title, where it ends, its items
//! and their labels. What an item's value says (yes/no, key, duplicate, duration) is the grammar
//! in [`crate::value`]. Pure functions over `&str`, no panics on any input (property-tested).
//!
//! Accepted forms (listed for users in `lint/README.md`, "The statement"):
//! - a title as an ATX heading of any level (`# 幂等性说明` … `###### 幂等性说明`), a setext
//!   heading (`幂等性说明` underlined with `===`/`---`), or a line in bold (`**幂等性说明**`,
//!   `__幂等性说明__`), optionally numbered (`3. 幂等性说明`) and followed by `:`/`：`, or a
//!   plain line `幂等性说明：` directly followed by list items;
//! - the English alias `Idempotency` (plus aliases from the config file);
//! - items as list lines, numbered lines, plain `label: value` lines, two-column table rows
//!   (`| 是否幂等 | 是 |`) or a table of a label row over a value row (`| 是否幂等 | 幂等键 |`),
//!   labels optionally bold and recognised by meaning ([`LABEL_FORMS`]: `重复…` is the
//!   duplicate line, `…幂等键…` the key, `…是否…幂等…` the yes/no line, …); full- or
//!   half-width colons and parentheses; a bracketed remark after a value changes nothing.
//!
//! The section ends at the next heading of the same or a higher level (an ATX-titled section)
//! or at the next heading or bold title line (a bold-titled section).

use std::ops::Range;

/// Default titles, compared after [`normalize_title`].
const TITLES: [&str; 2] = ["幂等性说明", "idempotency"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Idempotent,
    Key,
    Duplicate,
    Expiry,
    /// A delivery's promise: at least once (webhooks, callbacks).
    Delivery,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<'a> {
    pub label: Label,
    pub value: &'a str,
    /// The whole line, trimmed (used to find it again in the source file).
    pub line: &'a str,
    /// Byte range of the trimmed line in the description.
    pub range: Range<usize>,
    /// Byte offset of `value` inside `line` (where a finding about the value points).
    pub value_offset: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section<'a> {
    pub title: &'a str,
    pub title_range: Range<usize>,
    pub items: Vec<Item<'a>>,
}

struct Line<'a> {
    text: &'a str,
    start: usize,
}

fn lines(s: &str) -> Vec<Line<'_>> {
    let mut out = Vec::new();
    let mut start = 0;
    for piece in s.split_inclusive('\n') {
        let text = piece.trim_end_matches(['\n', '\r']);
        out.push(Line { text, start });
        start += piece.len();
    }
    out
}

fn trimmed_range<'a>(l: &Line<'a>) -> (&'a str, Range<usize>) {
    let lead = l.text.len() - l.text.trim_start().len();
    let t = l.text.trim();
    (t, l.start + lead..l.start + lead + t.len())
}

/// Heading level of a line: 1–6 for ATX, 7 for a bold-only line. Returns the inner text.
fn heading(line: &str) -> Option<(u8, &str)> {
    let t = line.trim();
    let hashes = t.bytes().take_while(|&b| b == b'#').count();
    if (1..=6).contains(&hashes) {
        let rest = t.get(hashes..).unwrap_or("");
        if rest.is_empty() || rest.starts_with([' ', '\t']) {
            let inner = rest.trim().trim_end_matches('#').trim();
            return Some((hashes as u8, inner));
        }
        return None;
    }
    let body = t.trim_end_matches([':', '：']).trim_end();
    for m in ["**", "__"] {
        if body.len() > 2 * m.len() && body.starts_with(m) && body.ends_with(m) {
            let inner = body.get(m.len()..body.len() - m.len()).unwrap_or("");
            if !inner.contains(m) {
                return Some((7, inner));
            }
        }
    }
    None
}

fn setext_level(next: Option<&Line<'_>>) -> Option<u8> {
    let t = next?.text.trim();
    if t.len() >= 2 && t.bytes().all(|b| b == b'=') {
        Some(1)
    } else if t.len() >= 2 && t.bytes().all(|b| b == b'-') {
        Some(2)
    } else {
        None
    }
}

/// Which lines are inside a fenced code block (```` ``` ```` or `~~~`, fence lines included):
/// an example of the section shown in a code block is not the operation's statement.
fn fences(ls: &[Line<'_>]) -> Vec<bool> {
    let mut out = Vec::with_capacity(ls.len());
    let mut open: Option<&str> = None;
    for l in ls {
        let t = l.text.trim_start();
        match open {
            Some(f) => {
                out.push(true);
                if t.starts_with(f) {
                    open = None;
                }
            }
            None => {
                let f = if t.starts_with("```") {
                    Some("```")
                } else if t.starts_with("~~~") {
                    Some("~~~")
                } else {
                    None
                };
                out.push(f.is_some());
                open = f;
            }
        }
    }
    out
}

/// Normalise a title for comparison: no emphasis markers, numbering, trailing colon or
/// parenthetical, lower case.
fn normalize_title(s: &str) -> String {
    let mut t: String = s.replace("**", "").replace("__", "").replace('`', "");
    t = t.trim().trim_end_matches([':', '：']).trim().to_string();
    // leading numbering: "3.", "3.1", "3.1.", "四、", "（四）", "(3)", "①"
    let num_end = t.char_indices().find(|(_, c)| !(c.is_ascii_digit() || *c == '.')).map_or(t.len(), |(i, _)| i);
    if num_end > 0 && t.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        t = t.get(num_end..).unwrap_or("").trim_start().to_string();
    } else if let Some(rest) = strip_numbering(&t) {
        t = rest.to_string();
    }
    t = t.trim_start_matches(['、', '.', ')', '）']).trim_start().to_string();
    // trailing parenthetical: "幂等性说明（Idempotency）"
    for (open, close) in [('（', '）'), ('(', ')')] {
        if t.ends_with(close) {
            if let Some(i) = t.rfind(open) {
                let head = t.get(..i).unwrap_or("").trim_end();
                if !head.is_empty() {
                    t = head.to_string();
                }
            }
        }
    }
    t.trim().to_lowercase()
}

fn is_title(text: &str, extra: &[String]) -> bool {
    let n = normalize_title(text);
    TITLES.iter().any(|t| *t == n) || extra.iter().any(|a| normalize_title(a) == n)
}

/// Find the first 幂等性说明 section in a description.
pub fn find_section<'a>(desc: &'a str, extra_titles: &[String]) -> Option<Section<'a>> {
    let ls = lines(desc);
    let fenced = fences(&ls);
    let mut i = 0;
    while i < ls.len() {
        let l = &ls[i];
        if fenced[i] {
            i += 1;
            continue;
        }
        let (level, title_text, body_from) = if let Some((lv, inner)) = heading(l.text) {
            (lv, inner, i + 1)
        } else if let (Some(lv), false) = (setext_level(ls.get(i + 1)), l.text.trim().is_empty()) {
            (lv, l.text.trim(), i + 2)
        } else if l.text.trim_end().ends_with([':', '：']) {
            // A plain title line `幂等性说明：`: a section only when list items follow it.
            (PLAIN, l.text.trim(), i + 1)
        } else {
            i += 1;
            continue;
        };
        if !is_title(title_text, extra_titles) {
            i += 1;
            continue;
        }
        let (title, title_range) = trimmed_range(l);
        let mut items = Vec::new();
        let mut j = body_from;
        let mut started = false;
        // The labels of a table's header row, until its value row is read.
        let mut columns: Option<Vec<Option<Label>>> = None;
        while j < ls.len() {
            let lj = &ls[j];
            if fenced[j] {
                j += 1;
                continue;
            }
            if level == PLAIN {
                // The section is the block of lines right after the title (blank lines
                // before it allowed), up to the next blank line or heading.
                let blank = lj.text.trim().is_empty();
                if blank && started {
                    break;
                }
                started |= !blank;
                if heading(lj.text).is_some_and(|_| label_of(lj.text).is_none()) {
                    break;
                }
            }
            if let Some((lv, _)) = heading(lj.text) {
                // `**是否幂等：是**` is a bold item, not the next title.
                let bold_item = lv == 7 && label_of(lj.text).is_some();
                if !bold_item && (level == 7 || lv <= level) {
                    break;
                }
            }
            if setext_level(ls.get(j + 1)).is_some() && !lj.text.trim().is_empty() && label_of(lj.text).is_none() {
                break;
            }
            // A table in the other orientation: a row of labels over a row of values.
            if let Some(cells) = table_cells(lj.text) {
                if let Some(labels) = &columns {
                    if !cells.iter().all(|c| is_rule_cell(c)) {
                        let (line, range) = trimmed_range(lj);
                        for (label, value) in labels.iter().zip(&cells) {
                            let (Some(label), value) = (*label, clean_value(value)) else { continue };
                            let value_offset = offset_in(line, value);
                            items.push(Item { label, value, line, range: range.clone(), value_offset });
                        }
                        columns = None;
                    }
                    j += 1;
                    continue;
                }
                // A header row: two different labels or more, none twice (a row
                // `| 幂等键 | Idempotency-Key |` reads as the key label twice), over the rule.
                let labels: Vec<Option<Label>> = cells.iter().map(|c| label_kind(clean_value(c))).collect();
                let named: Vec<Label> = labels.iter().flatten().copied().collect();
                let distinct = named.iter().enumerate().all(|(i, l)| !named[..i].contains(l));
                let over_rule = ls
                    .get(j + 1)
                    .and_then(|next| table_cells(next.text))
                    .is_some_and(|next| next.iter().all(|c| is_rule_cell(c)));
                if over_rule && named.len() >= 2 && distinct {
                    columns = Some(labels);
                    j += 1;
                    continue;
                }
            }
            if let Some((label, value)) = label_of(lj.text) {
                let (line, range) = trimmed_range(lj);
                let value_offset = offset_in(line, value);
                items.push(Item { label, value, line, range, value_offset });
            }
            j += 1;
        }
        if level == PLAIN && items.is_empty() {
            i += 1;
            continue;
        }
        return Some(Section { title, title_range, items });
    }
    None
}

/// Level of a plain title line `幂等性说明：` (no `#`, no bold).
const PLAIN: u8 = 8;

/// A line that names the section (`幂等性说明：`, `#幂等性说明`, `- 幂等性说明`) but was not
/// recognised as its title, for IDEM001's message when [`find_section`] found nothing.
pub fn unrecognised_title<'a>(desc: &'a str, extra_titles: &[String]) -> Option<&'a str> {
    let ls = lines(desc);
    let fenced = fences(&ls);
    ls.iter().zip(fenced).filter(|(_, f)| !f).map(|(l, _)| l.text.trim()).find(|t| {
        let bare = strip_list_marker(t.trim_start_matches('#'));
        // `幂等性说明：本接口不幂等…`: the title with prose after its colon.
        let before_colon = bare.split([':', '：']).next().unwrap_or(bare);
        is_title(bare, extra_titles)
            || is_title(before_colon, extra_titles)
            || heading(bare).is_some_and(|(_, inner)| is_title(inner, extra_titles))
    })
}

/// Byte offset of `inner` in `outer` when `inner` is a subslice of it, else 0.
fn offset_in(outer: &str, inner: &str) -> usize {
    let o = outer.as_ptr() as usize;
    let i = inner.as_ptr() as usize;
    if i >= o && i + inner.len() <= o + outer.len() {
        i - o
    } else {
        0
    }
}

fn strip_list_marker(t: &str) -> &str {
    let t = t.trim_start();
    for m in ["- ", "* ", "+ ", "• "] {
        if let Some(r) = t.strip_prefix(m) {
            return r.trim_start();
        }
    }
    strip_numbering(t).unwrap_or(t)
}

/// The text after an item or title number in any form teams write: `3.` `3、` `3)` `3）`
/// `(3)` `（3）` `①`, and the same with Chinese numerals (`四、`, `（四）`). `None` when the text
/// starts with no number.
fn strip_numbering(t: &str) -> Option<&str> {
    let t = t.trim_start();
    let is_num = |c: char| c.is_ascii_digit() || "一二三四五六七八九十".contains(c);
    // ① … ⑳
    if let Some(c) = t.chars().next().filter(|c| ('\u{2460}'..='\u{2473}').contains(c)) {
        return Some(t.get(c.len_utf8()..).unwrap_or("").trim_start());
    }
    // (3) （3） (四)
    for (open, close) in [('(', ')'), ('（', '）')] {
        if let Some(rest) = t.strip_prefix(open) {
            let n = rest.chars().take_while(|c| is_num(*c)).count();
            let digits: String = rest.chars().take(n).collect();
            if n > 0 {
                if let Some(after) = rest.get(digits.len()..).and_then(|r| r.strip_prefix(close)) {
                    return Some(after.trim_start());
                }
            }
        }
    }
    // 3. 3、 3) 3） 四、 (a dot needs a space after it: "3.1" is a version, not a number)
    let n = t.chars().take_while(|c| is_num(*c)).count();
    if n == 0 {
        return None;
    }
    let digits: String = t.chars().take(n).collect();
    let rest = t.get(digits.len()..).unwrap_or("");
    for m in [". ", ") ", "、", "）", "．"] {
        if let Some(r) = rest.strip_prefix(m) {
            return Some(r.trim_start());
        }
    }
    None
}

/// The accepted item labels, by meaning: the first row whose pattern matches the label wins.
/// A label is compared after removing emphasis, spaces, `-`, `_` and backticks and lowering
/// the case (`Idempotency-Key` → `idempotencykey`); in a pattern `…` stands for any text, so
/// `重复…` is "starts with 重复" and `…幂等键…` is "contains 幂等键". Printed in
/// `lint/README.md` ("Item labels"); a test checks that the two agree.
const LABEL_FORMS: &[(&str, Label)] = &[
    ("投递…", Label::Delivery),
    ("重复投递…", Label::Delivery),
    ("delivery…", Label::Delivery),
    ("redelivery…", Label::Delivery),
    ("重复…", Label::Duplicate),
    ("duplicate…", Label::Duplicate),
    ("…有效期…", Label::Expiry),
    ("expiry…", Label::Expiry),
    ("ttl", Label::Expiry),
    ("…幂等键…", Label::Key),
    ("…幂等标识…", Label::Key),
    ("…idempotencykey…", Label::Key),
    ("key", Label::Key),
    ("…是否…幂等…", Label::Idempotent),
    ("…idempotent…", Label::Idempotent),
    ("幂等", Label::Idempotent),
    ("幂等性", Label::Idempotent),
];

/// [`LABEL_FORMS`] as the Markdown table of `lint/README.md` ("Item labels"), printed by
/// `idem-lint rules --labels`.
pub fn label_table() -> String {
    let mut out = String::from("| pattern | meaning |\n|---|---|\n");
    for (pattern, label) in LABEL_FORMS {
        out.push_str(&format!("| `{pattern}` | {label:?} |\n"));
    }
    out
}

/// Does `text` match `pattern`, where `…` in the pattern stands for any text?
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('…').collect();
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return text == pattern;
    }
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    for mid in parts.get(1..parts.len() - 1).unwrap_or(&[]) {
        match rest.find(mid) {
            Some(i) => rest = rest.get(i + mid.len()..).unwrap_or(""),
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The meaning of an item label (see [`LABEL_FORMS`]).
fn label_kind(raw: &str) -> Option<Label> {
    let n: String = raw
        .replace("**", "")
        .replace("__", "")
        .chars()
        .filter(|c| !matches!(c, ' ' | '\t' | '-' | '_' | '`' | '*'))
        .flat_map(char::to_lowercase)
        .collect();
    if n.is_empty() {
        return None;
    }
    LABEL_FORMS.iter().find(|(p, _)| glob(p, &n)).map(|(_, l)| *l)
}

/// `label: value` (any colon width), `| label | value |`, with list markers and bold.
fn label_of(line: &str) -> Option<(Label, &str)> {
    let t = line.trim();
    if let Some(row) = t.strip_prefix('|') {
        let mut cells = row.split('|');
        let label = label_kind(cells.next()?.trim())?;
        let value = clean_value(cells.next()?);
        return Some((label, value));
    }
    let t = strip_list_marker(t);
    let (idx, colon_len) = t.char_indices().find(|(_, c)| *c == ':' || *c == '：').map(|(i, c)| (i, c.len_utf8()))?;
    let label = label_kind(t.get(..idx)?)?;
    let value = clean_value(t.get(idx + colon_len..)?);
    // `写清楚该接口是否支持幂等、幂等键是什么、重复请求会返回什么错误码：` introduces a list;
    // a line with nothing after the colon is not an item.
    if value.is_empty() {
        return None;
    }
    Some((label, value))
}

/// The cells of a table row (`| a | b |`), trimmed, as slices of the line.
fn table_cells(line: &str) -> Option<Vec<&str>> {
    let row = line.trim().strip_prefix('|')?;
    let row = row.strip_suffix('|').unwrap_or(row);
    Some(row.split('|').map(str::trim).collect())
}

/// A cell of the rule under a table's header row (`---`, `:--:`).
fn is_rule_cell(cell: &str) -> bool {
    !cell.is_empty() && cell.chars().all(|c| c == '-' || c == ':' || c == ' ')
}

fn clean_value(v: &str) -> &str {
    let mut v = v.trim();
    for m in ["**", "__"] {
        v = v.strip_prefix(m).unwrap_or(v).trim();
        v = v.strip_suffix(m).unwrap_or(v).trim();
    }
    v
}

#[cfg(test)]
mod tests {
    #![allow(clippy::string_slice)]
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::value::{duration_secs, parse_bool, parse_duplicate, parse_key, KeyIn, Tri};

    const TYPICAL_DESCRIPTION: &str = "创建订单。\n\n### 幂等性说明\n- 是否幂等：是\n- 幂等键：Idempotency-Key（header）\n- 重复请求：409 DUPLICATE_REQUEST\n- 有效期：24h\n\n### 其他\n- 幂等键：ignored\n";

    #[test]
    fn a_typical_description() {
        let s = find_section(TYPICAL_DESCRIPTION, &[]).unwrap();
        assert_eq!(s.title, "### 幂等性说明");
        assert_eq!(&TYPICAL_DESCRIPTION[s.title_range.clone()], "### 幂等性说明");
        let labels: Vec<Label> = s.items.iter().map(|i| i.label).collect();
        assert_eq!(labels, vec![Label::Idempotent, Label::Key, Label::Duplicate, Label::Expiry]);
        assert_eq!(s.items[1].value, "Idempotency-Key（header）");
        assert_eq!(&TYPICAL_DESCRIPTION[s.items[1].range.clone()], s.items[1].line);
    }

    #[test]
    fn bold_title_half_width_and_english() {
        let d = "Pay.\n\n**Idempotency:**\n1. **Idempotent**: yes\n2. Key: transaction_id (body)\n3. Duplicate: 200 `SUCCESS`\n4. Expiry: 7 days\n**Next**\nKey: nope\n";
        let s = find_section(d, &[]).unwrap();
        assert_eq!(s.items.len(), 4);
        assert_eq!(parse_bool(s.items[0].value), Tri::Yes);
        let k = parse_key(s.items[1].value);
        assert_eq!(k.location(), Some(&KeyIn::Body));
        assert_eq!(k.names(), vec!["transaction_id"]);
        let dup = parse_duplicate(s.items[2].value);
        assert_eq!(dup.status, Some(200));
        assert_eq!(dup.code.as_deref(), Some("SUCCESS"));
        assert_eq!(duration_secs(s.items[3].value), Some(7 * 86400));
    }

    #[test]
    fn heading_levels_and_section_end() {
        for level in 1..=6 {
            let d = format!("{} 幂等性说明\n是否幂等: 否\n{} Other\n幂等键: x\n", "#".repeat(level), "#".repeat(level));
            let s = find_section(&d, &[]).unwrap();
            assert_eq!(s.items.len(), 1, "level {level}");
        }
        // bold items inside a bold-titled section
        let d = "**幂等性说明**\n**是否幂等：是**\n**幂等键：K（header）**\n**Other**\n- 重复请求：409\n";
        let s = find_section(d, &[]).unwrap();
        assert_eq!(s.items.len(), 2);
        assert_eq!(s.items[1].value, "K（header）");
        // a deeper heading stays inside the section
        let d = "## 幂等性说明\n#### 细节\n- 幂等键：a（query）\n## 下一节\n";
        assert_eq!(find_section(d, &[]).unwrap().items.len(), 1);
        // setext
        let d = "幂等性说明\n-----\n- 是否幂等：否\n";
        assert_eq!(find_section(d, &[]).unwrap().items.len(), 1);
        // numbered title, parenthetical, table
        let d = "### 3. 幂等性说明（Idempotency）\n| 是否幂等 | 是 |\n| 幂等键 | `X-Request-Id`（请求头） |\n";
        let s = find_section(d, &[]).unwrap();
        assert_eq!(s.items.len(), 2);
        let k = parse_key(s.items[1].value);
        assert_eq!(k.location(), Some(&KeyIn::Header));
        assert_eq!(k.names(), vec!["X-Request-Id"]);
    }

    #[test]
    fn fenced_examples_are_not_statements() {
        let d = "Document like this:\n```markdown\n### 幂等性说明\n- 是否幂等：是\n```\n";
        assert!(find_section(d, &[]).is_none());
        let d = "### 幂等性说明\n~~~\n- 幂等键：X（header）\n~~~\n- 是否幂等：否\n";
        let s = find_section(d, &[]).unwrap();
        assert_eq!(s.items.len(), 1);
        assert_eq!(s.items[0].label, Label::Idempotent);
    }

    #[test]
    fn not_a_section() {
        assert!(find_section("This endpoint is about idempotency.\n", &[]).is_none());
        assert!(find_section("#幂等性说明\n", &[]).is_none());
        assert!(find_section("**幂等性说明** 见下文\n", &[]).is_none());
        assert!(find_section("## 幂等设计\n", &[]).is_none());
        assert!(find_section("## 幂等设计\n", &["幂等设计".to_string()]).is_some());
    }

    #[test]
    fn label_forms_by_meaning() {
        let forms = [
            ("是否幂等", Label::Idempotent),
            ("是否支持幂等", Label::Idempotent),
            ("该接口是否支持幂等", Label::Idempotent),
            ("幂等", Label::Idempotent),
            ("幂等性", Label::Idempotent),
            ("Idempotent", Label::Idempotent),
            ("Is idempotent", Label::Idempotent),
            ("**Idempotent**", Label::Idempotent),
            ("幂等键", Label::Key),
            ("幂等键（Idempotency Key）", Label::Key),
            ("幂等键是什么", Label::Key),
            ("幂等标识", Label::Key),
            ("Idempotency-Key", Label::Key),
            ("Idempotency key", Label::Key),
            ("Key", Label::Key),
            ("重复请求", Label::Duplicate),
            ("重复提交", Label::Duplicate),
            ("重复请求错误码", Label::Duplicate),
            ("重复请求返回", Label::Duplicate),
            ("重复请求响应", Label::Duplicate),
            ("重复请求会返回什么错误码", Label::Duplicate),
            ("Duplicate", Label::Duplicate),
            ("Duplicate request", Label::Duplicate),
            ("Duplicate response", Label::Duplicate),
            ("有效期", Label::Expiry),
            ("幂等键有效期", Label::Expiry),
            ("Expiry", Label::Expiry),
            ("TTL", Label::Expiry),
        ];
        for (label, want) in forms {
            assert_eq!(label_kind(label), Some(want), "{label}");
        }
        for label in ["说明", "备注", "幂等性说明", "Notes", "keys", "", "…"] {
            assert_eq!(label_kind(label), None, "{label}");
        }
        // The wording of the checklist teams copy ("写清楚该接口是否支持幂等、幂等键是什么、重复请求会返回什么错误码"): each of its three phrases is a label of its own.
        let article = "写清楚该接口是否支持幂等、幂等键是什么、重复请求会返回什么错误码";
        let phrases: Vec<&str> = article.trim_start_matches("写清楚").split('、').collect();
        let got: Vec<Option<Label>> = phrases.iter().map(|p| label_kind(p)).collect();
        assert_eq!(got, vec![Some(Label::Idempotent), Some(Label::Key), Some(Label::Duplicate)]);
        let d = "### 幂等性说明\n写清楚该接口是否支持幂等、幂等键是什么、重复请求会返回什么错误码：\n- 该接口是否支持幂等：支持\n- 幂等键是什么：K（header）\n- 重复请求会返回什么错误码：409 DUPLICATE_REQUEST\n";
        let s = find_section(d, &[]).unwrap();
        let labels: Vec<Label> = s.items.iter().map(|i| i.label).collect();
        assert_eq!(labels, vec![Label::Idempotent, Label::Key, Label::Duplicate]);
        assert_eq!(parse_bool(s.items[0].value), Tri::Yes);
        assert_eq!(parse_bool("支持"), Tri::Yes);
        assert_eq!(parse_bool("不支持（每次新建）"), Tri::No);
    }

    #[test]
    fn readme_prints_the_label_table() {
        let readme = include_str!("../README.md");
        assert!(readme.contains(&label_table()), "README.md lacks the table of `idem-lint rules --labels`");
        assert_eq!(label_table().lines().count(), LABEL_FORMS.len() + 2);
    }

    #[test]
    fn numbering_in_every_form() {
        for item in [
            "(1) 是否幂等：是",
            "（2）是否幂等：是",
            "3）是否幂等：是",
            "3) 是否幂等：是",
            "① 是否幂等：是",
            "四、是否幂等：是",
            "1. 是否幂等：是",
            "1、是否幂等：是",
        ] {
            assert_eq!(strip_list_marker(item), "是否幂等：是", "{item}");
        }
        for title in
            ["四、幂等性说明", "（三）幂等性说明", "(3) 幂等性说明", "4、幂等性说明", "3.1 幂等性说明", "② 幂等性说明"]
        {
            assert_eq!(normalize_title(title), "幂等性说明", "{title}");
        }
        // A version-like number is not an item number.
        assert_eq!(strip_list_marker("3.1是否幂等"), "3.1是否幂等");
    }

    #[test]
    fn unrecognised_titles_are_quoted() {
        for (d, line) in [
            (
                "创建订单。\n幂等性说明：本接口不幂等，每次调用新建订单。\n",
                "幂等性说明：本接口不幂等，每次调用新建订单。",
            ),
            ("四、幂等性说明：见下表\n表格待补充\n", "四、幂等性说明：见下表"),
            (
                "Idempotency: not idempotent, every call creates an order.\n",
                "Idempotency: not idempotent, every call creates an order.",
            ),
            ("- **（三）幂等性说明**\n", "- **（三）幂等性说明**"),
        ] {
            assert!(find_section(d, &[]).is_none(), "{d}");
            assert_eq!(unrecognised_title(d, &[]), Some(line), "{d}");
        }
        // Prose that merely mentions the statement is no candidate.
        assert_eq!(unrecognised_title("本接口的幂等性说明见附录。\n", &[]), None);
    }

    #[test]
    fn a_label_row_over_a_value_row() {
        let d =
            "## 幂等性说明\n\n| 是否幂等 | 幂等键 | 重复请求 |\n| :--- | --- | --- |\n| 否 | 无 | - |\n\n## 下一节\n";
        let s = find_section(d, &[]).unwrap();
        let got: Vec<(Label, &str)> = s.items.iter().map(|i| (i.label, i.value)).collect();
        assert_eq!(got, vec![(Label::Idempotent, "否"), (Label::Key, "无"), (Label::Duplicate, "-")]);
        assert_eq!(&s.items[1].line[s.items[1].value_offset..][..3], "无");
        // A column that is no label (the operation's name) is skipped; bold labels count.
        let d = "### Idempotency\n| Operation | **Idempotent** | Key |\n|---|---|---|\n| pay | yes | `Idempotency-Key` (header) |\n| refund | no | none |\n";
        let s = find_section(d, &[]).unwrap();
        let got: Vec<(Label, &str)> = s.items.iter().map(|i| (i.label, i.value)).collect();
        assert_eq!(got, vec![(Label::Idempotent, "yes"), (Label::Key, "`Idempotency-Key` (header)")]);
        // The usual orientation still reads row by row.
        let d = "### 幂等性说明\n| 项目 | 说明 |\n|---|---|\n| 是否幂等 | 是 |\n| 幂等键 | K（header） |\n";
        assert_eq!(find_section(d, &[]).unwrap().items.len(), 2);
        // A first row whose value reads like a label is still a row, not a header.
        let d = "### 幂等性说明\n| 幂等键 | Idempotency-Key（header） |\n|---|---|\n| 重复请求 | 409 |\n";
        let s = find_section(d, &[]).unwrap();
        let got: Vec<(Label, &str)> = s.items.iter().map(|i| (i.label, i.value)).collect();
        assert_eq!(got, vec![(Label::Key, "Idempotency-Key（header）"), (Label::Duplicate, "409")]);
    }

    #[test]
    fn plain_title_line() {
        for colon in [":", "："] {
            let d = format!(
                "创建订单。\n\n幂等性说明{colon}\n- 是否幂等：是\n- 幂等键：K（header）\n\n其他：\n- 幂等键：ignored\n"
            );
            let s = find_section(&d, &[]).unwrap();
            assert_eq!(s.title, format!("幂等性说明{colon}"));
            assert_eq!(s.items.len(), 2);
            assert_eq!(s.items[1].value, "K（header）");
        }
        let d = "Idempotency:\n\n- Idempotent: no\n";
        assert_eq!(find_section(d, &[]).unwrap().items.len(), 1);
        // seen, but not followed by items: no section, and the line is reported
        let d = "幂等性说明：\n该接口会新建订单。\n";
        assert!(find_section(d, &[]).is_none());
        assert_eq!(unrecognised_title(d, &[]), Some("幂等性说明："));
        assert_eq!(unrecognised_title("#幂等性说明\n", &[]), Some("#幂等性说明"));
        assert_eq!(unrecognised_title("创建订单，没有幂等性说明。\n", &[]), None);
        assert_eq!(unrecognised_title("```\n幂等性说明：\n```\n", &[]), None);
    }
}
