//! Parser for the 幂等性说明 section of a Markdown `description`, and for the values written in
//! it (also used for string values of `x-idempotency`). Pure functions over `&str`, no panics
//! on any input (property-tested).
//!
//! Accepted forms (listed for users in `lint/README.md`, "The statement"):
//! - a title as an ATX heading of any level (`# 幂等性说明` … `###### 幂等性说明`), a setext
//!   heading (`幂等性说明` underlined with `===`/`---`), or a line in bold (`**幂等性说明**`,
//!   `__幂等性说明__`), optionally numbered (`3. 幂等性说明`) and followed by `:`/`：`, or a
//!   plain line `幂等性说明：` directly followed by list items;
//! - the English alias `Idempotency` (plus aliases from the config file);
//! - items as list lines, numbered lines, plain `label: value` lines or two-column table rows,
//!   labels optionally bold and recognised by meaning ([`LABEL_FORMS`]: `重复…` is the
//!   duplicate line, `…幂等键…` the key, `…是否…幂等…` the yes/no line, …); full- or
//!   half-width colons and parentheses; a bracketed remark after a value changes nothing.
//!
//! The section ends at the next heading of the same or a higher level (an ATX-titled section)
//! or at the next heading or bold title line (a bold-titled section).

use std::ops::Range;

/// Default titles, compared after [`normalize_title`].
pub const TITLES: [&str; 2] = ["幂等性说明", "idempotency"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Idempotent,
    Key,
    Duplicate,
    Expiry,
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
pub fn normalize_title(s: &str) -> String {
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
        is_title(bare, extra_titles) || heading(bare).is_some_and(|(_, inner)| is_title(inner, extra_titles))
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
pub const LABEL_FORMS: &[(&str, Label)] = &[
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
pub fn label_kind(raw: &str) -> Option<Label> {
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

fn clean_value(v: &str) -> &str {
    let mut v = v.trim();
    for m in ["**", "__"] {
        v = v.strip_prefix(m).unwrap_or(v).trim();
        v = v.strip_suffix(m).unwrap_or(v).trim();
    }
    v
}

// ---------------------------------------------------------------------------------------
// Values

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tri {
    Yes,
    No,
    /// Stated, but not as yes/no (the raw text).
    Unknown(String),
}

/// A yes/no value read as a whole word, never by its first characters: `是，重复提交返回 409`
/// is yes, `否（每次都新建）` no, but `幂等键未定，待评审` says neither (it starts with 幂等).
/// Remarks in brackets are cut first; the answer is the value's first clause.
pub fn parse_bool(v: &str) -> Tri {
    let plain = without_remarks(v).replace('`', "").to_lowercase();
    let clause = plain
        .split(['，', ',', '；', ';', '。', '、', ':', '：', '—'])
        .next()
        .unwrap_or("")
        .trim()
        .trim_end_matches(['.', '!', '！'])
        .trim();
    let words: Vec<&str> = clause.split_whitespace().collect();
    let first = words.first().copied().unwrap_or("");
    const NO: [&str; 11] = ["否", "非幂等", "不幂等", "不是", "不支持", "不支持幂等", "非幂等接口", "no", "false", "n", "non-idempotent"];
    const YES: [&str; 10] = ["是", "是的", "幂等", "支持", "支持幂等", "幂等接口", "yes", "true", "y", "idempotent"];
    if NO.contains(&clause) || (NO.contains(&first) && first.is_ascii()) || clause.starts_with("not idempotent") {
        return Tri::No;
    }
    if YES.contains(&clause) || (YES.contains(&first) && first.is_ascii()) {
        return Tri::Yes;
    }
    Tri::Unknown(v.trim().to_string())
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyIn {
    Header,
    Query,
    Path,
    Body,
    Other(String),
}

impl KeyIn {
    pub fn parse(s: &str) -> KeyIn {
        let t = s.trim().to_lowercase();
        if t.contains("header") || t.contains("请求头") || t == "头" {
            KeyIn::Header
        } else if t.contains("query") || t.contains("查询") {
            KeyIn::Query
        } else if t.contains("path") || t.contains("路径") {
            KeyIn::Path
        } else if t.contains("body") || t.contains("请求体") || t.contains("报文") {
            KeyIn::Body
        } else {
            KeyIn::Other(s.trim().to_string())
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            KeyIn::Header => "header",
            KeyIn::Query => "query",
            KeyIn::Path => "path",
            KeyIn::Body => "body",
            KeyIn::Other(s) => s,
        }
    }
}

/// A named key: one or more names (a composite business key), optionally with a location.
/// No names means the statement says explicitly that there is no key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    pub location: Option<KeyIn>,
    pub names: Vec<String>,
}

fn is_none_word(t: &str) -> bool {
    matches!(
        t.trim().to_lowercase().as_str(),
        "无" | "没有" | "不需要" | "none" | "n/a" | "-" | "—" | "null" | "no key"
    )
}

fn unquote(s: &str) -> &str {
    s.trim().trim_matches(['`', '"', '\'', '“', '”']).trim()
}

/// A location word at the end: `Name header`, `Name in query`, `Name 请求头`.
fn trailing_location(v: &str) -> Option<(KeyIn, &str)> {
    let v = v.trim_end();
    let cut = v.rfind(char::is_whitespace)?;
    let last = v.get(cut..)?.trim().trim_matches(['`', '.', '。']).to_lowercase();
    let loc = match last.as_str() {
        "header" | "请求头" => KeyIn::Header,
        "query" | "查询参数" => KeyIn::Query,
        "path" | "路径参数" => KeyIn::Path,
        "body" | "请求体" => KeyIn::Body,
        _ => return None,
    };
    let mut rest = v.get(..cut)?.trim_end();
    if let Some(r) = rest.strip_suffix(" in") {
        rest = r.trim_end();
    }
    Some((loc, rest))
}

/// Words in brackets that try to name a key location idem-lint does not accept (`cookie`):
/// reported by IDEM004 rather than taken as a remark.
fn is_location_like(inner: &str) -> bool {
    let t = inner.trim().to_lowercase();
    ["cookie", "form", "multipart", "表单"].iter().any(|w| t.contains(w))
}

/// Split a value into its text and its bracketed parts: `a（x） + b（y）` gives the text
/// `a + b` (remarks cut out) and `["x", "y"]`. An unclosed bracket runs to the end.
fn brackets(v: &str) -> (String, Vec<&str>) {
    let mut text = String::new();
    let mut inner = Vec::new();
    let mut rest = v;
    while let Some((i, c)) = rest.char_indices().find(|(_, c)| *c == '(' || *c == '（') {
        text.push_str(rest.get(..i).unwrap_or(""));
        let after = rest.get(i + c.len_utf8()..).unwrap_or("");
        match after.char_indices().find(|(_, c)| *c == ')' || *c == '）') {
            Some((j, cc)) => {
                inner.push(after.get(..j).unwrap_or(""));
                rest = after.get(j + cc.len_utf8()..).unwrap_or("");
            }
            None => {
                inner.push(after);
                rest = "";
            }
        }
    }
    text.push_str(rest);
    (text, inner)
}

/// The value without bracketed remarks: `无（只读接口）` → `无`.
fn without_remarks(v: &str) -> String {
    brackets(v).0.trim().to_string()
}

/// The contents of the code spans of a text (`` `a` and `b` `` → `["a", "b"]`), empty ones
/// skipped; an unpaired backtick opens nothing.
fn code_spans(text: &str) -> Vec<&str> {
    let parts: Vec<&str> = text.split('`').collect();
    if parts.len() < 3 {
        return Vec::new();
    }
    let closed = if parts.len() % 2 == 1 { parts.len() } else { parts.len() - 1 };
    parts[..closed].iter().skip(1).step_by(2).map(|p| p.trim()).filter(|p| !p.is_empty()).collect()
}

pub fn parse_key(v: &str) -> KeySpec {
    let v = v.trim();
    let (text, inner) = brackets(v);
    let text = text.trim();
    if text.is_empty() || is_none_word(text) {
        return KeySpec { location: None, names: Vec::new() };
    }
    // A key named by code spans inside prose (`请求体中的 `id` 字段`, "the `Idempotency-Key`
    // request header"): the spans are the key's names wherever they stand, and a location word
    // anywhere in the prose (or a bracket) is its location.
    let spans = code_spans(text);
    if !spans.is_empty() {
        let prose: String = text.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let location = inner
            .iter()
            .map(|i| KeyIn::parse(i))
            .chain(std::iter::once(KeyIn::parse(&prose)))
            .find(|l| !matches!(l, KeyIn::Other(_)));
        return KeySpec { location, names: spans.into_iter().map(str::to_string).collect() };
    }
    let mut name_part = text;
    // "Name（header）" / "Name (header)": a bracket naming a location gives it; any other
    // bracket is a remark (`out_trade_no（商户订单号）`) and changes nothing, except one that
    // tries to name an unsupported location (`token（cookie）`), which IDEM004 reports.
    let mut location = inner.iter().map(|i| KeyIn::parse(i)).find(|l| !matches!(l, KeyIn::Other(_)));
    if location.is_none() {
        location = inner.iter().find(|i| is_location_like(i)).map(|i| KeyIn::Other(i.trim().to_string()));
    }
    if location.is_none() {
        if let Some((loc, rest)) = trailing_location(text) {
            // "`Idempotency-Key` header" / "X-Request-Id in header"
            location = Some(loc);
            name_part = rest;
        } else {
            // "header Idempotency-Key" / "header: Idempotency-Key" / "请求头 Idempotency-Key"
            let first_end =
                text.char_indices().find(|(_, c)| c.is_whitespace() || *c == ':' || *c == '：').map(|(i, _)| i);
            if let Some(e) = first_end {
                let first = text.get(..e).unwrap_or("");
                let loc = KeyIn::parse(first);
                if !matches!(loc, KeyIn::Other(_)) {
                    location = Some(loc);
                    name_part = text.get(e..).unwrap_or("").trim_start_matches([':', '：', ' ', '\t']);
                }
            }
        }
    }
    let names: Vec<String> = name_part
        .split(['+', '、', ',', '，', '&'])
        .flat_map(|s| s.split(" and "))
        .map(unquote)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    KeySpec { location, names }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    pub status: Option<u16>,
    pub code: Option<String>,
    /// A status class written as `5XX` / `4xx` (its first digit), when no exact status is.
    pub class: Option<u8>,
}

impl Duplicate {
    pub fn new(status: Option<u16>, code: Option<String>) -> Duplicate {
        Duplicate { status, code, class: None }
    }
}

/// Full-width ASCII (`５００`, `ＸＸ`) as ASCII.
fn half_width(v: &str) -> String {
    v.chars()
        .map(|c| match c {
            '\u{FF01}'..='\u{FF5E}' => char::from_u32(c as u32 - 0xFF01 + 0x21).unwrap_or(c),
            '\u{3000}' => ' ',
            c => c,
        })
        .collect()
}

pub fn parse_duplicate(v: &str) -> Duplicate {
    let norm = half_width(v);
    let v = norm.as_str();
    if v.trim().is_empty() || is_none_word(v) || is_none_word(&without_remarks(v)) {
        return Duplicate::new(None, None);
    }
    let mut status = None;
    let mut class = None;
    let chars: Vec<(usize, char)> = v.char_indices().collect();
    let mut k = 0;
    let mut after_status = 0;
    while k < chars.len() {
        if chars[k].1.is_ascii_digit() {
            let s = k;
            while k < chars.len() && chars[k].1.is_ascii_digit() {
                k += 1;
            }
            if k - s == 3 {
                let bs = chars[s].0;
                let be = chars.get(k).map_or(v.len(), |c| c.0);
                if let Ok(n) = v.get(bs..be).unwrap_or("").parse::<u16>() {
                    if (100..=599).contains(&n) {
                        status = Some(n);
                        after_status = be;
                        break;
                    }
                }
            }
        } else {
            k += 1;
        }
    }
    if status.is_none() {
        // `5XX` / `5xx`: a status class, as a word of its own.
        let is_word = |c: Option<&(usize, char)>| c.is_none_or(|(_, c)| !c.is_ascii_alphanumeric());
        for k in 0..chars.len() {
            let d = chars[k].1;
            let x = |o: usize| chars.get(k + o).is_some_and(|(_, c)| matches!(c, 'x' | 'X'));
            if ('1'..='5').contains(&d)
                && x(1)
                && x(2)
                && (k == 0 || is_word(chars.get(k - 1)))
                && is_word(chars.get(k + 3))
            {
                class = d.to_digit(10).and_then(|n| u8::try_from(n).ok());
                after_status = chars.get(k + 3).map_or(v.len(), |c| c.0);
                break;
            }
        }
    }
    let rest = v.get(after_status..).unwrap_or("");
    let code = backticked(rest).or_else(|| caps_token(rest));
    Duplicate { status, code, class }
}

fn backticked(s: &str) -> Option<String> {
    let a = s.find('`')?;
    let r = s.get(a + 1..)?;
    let b = r.find('`')?;
    let inner = r.get(..b)?.trim();
    if !inner.is_empty()
        && inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
        && !inner.bytes().all(|c| c.is_ascii_digit())
    {
        Some(inner.to_string())
    } else {
        None
    }
}

fn caps_token(s: &str) -> Option<String> {
    s.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|t| {
            t.len() >= 3
                && t.bytes().next().is_some_and(|b| b.is_ascii_uppercase())
                && t.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                && !matches!(*t, "HTTP" | "JSON" | "API")
        })
        .map(str::to_string)
}

/// Duration in seconds if the text is one (`24h`, `30 分钟`, `1d 12h`, `7天`), for comparing
/// the two ways of stating an expiry.
pub fn duration_secs(s: &str) -> Option<u64> {
    // `24 小时（之后同一个键视为新请求）`: the duration is what comes before a remark.
    let head = s.split(['（', '(', '，', ',', '；', ';', '。']).next().unwrap_or(s);
    let t = head.trim().to_lowercase();
    let mut total = 0u64;
    let mut num = String::new();
    let mut unit = String::new();
    let mut any = false;
    let flush = |num: &mut String, unit: &mut String, total: &mut u64| -> Option<()> {
        if num.is_empty() {
            return if unit.trim().is_empty() { Some(()) } else { None };
        }
        let n: u64 = num.parse().ok()?;
        let mult = match unit.trim() {
            "ms" => 0,
            "s" | "sec" | "secs" | "second" | "seconds" | "秒" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" | "分" | "分钟" => 60,
            "h" | "hr" | "hrs" | "hour" | "hours" | "小时" | "时" | "个小时" => 3600,
            "d" | "day" | "days" | "天" | "日" => 86400,
            _ => return None,
        };
        *total = total.checked_add(n.checked_mul(mult)?)?;
        num.clear();
        unit.clear();
        Some(())
    };
    for c in t.chars() {
        if c.is_ascii_digit() {
            if !unit.trim().is_empty() {
                flush(&mut num, &mut unit, &mut total)?;
            }
            num.push(c);
            any = true;
        } else if c.is_whitespace() {
            if !unit.is_empty() {
                unit.push(c);
            }
        } else {
            unit.push(c);
        }
    }
    flush(&mut num, &mut unit, &mut total)?;
    if any {
        Some(total)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::string_slice)]
    #![allow(clippy::unwrap_used)]
    use super::*;

    const DESIGN_EXAMPLE: &str = "创建订单。\n\n### 幂等性说明\n- 是否幂等：是\n- 幂等键：Idempotency-Key（header）\n- 重复请求：409 DUPLICATE_REQUEST\n- 有效期：24h\n\n### 其他\n- 幂等键：ignored\n";

    #[test]
    fn design_example() {
        let s = find_section(DESIGN_EXAMPLE, &[]).unwrap();
        assert_eq!(s.title, "### 幂等性说明");
        assert_eq!(&DESIGN_EXAMPLE[s.title_range.clone()], "### 幂等性说明");
        let labels: Vec<Label> = s.items.iter().map(|i| i.label).collect();
        assert_eq!(labels, vec![Label::Idempotent, Label::Key, Label::Duplicate, Label::Expiry]);
        assert_eq!(s.items[1].value, "Idempotency-Key（header）");
        assert_eq!(&DESIGN_EXAMPLE[s.items[1].range.clone()], s.items[1].line);
    }

    #[test]
    fn bold_title_half_width_and_english() {
        let d = "Pay.\n\n**Idempotency:**\n1. **Idempotent**: yes\n2. Key: transaction_id (body)\n3. Duplicate: 200 `SUCCESS`\n4. Expiry: 7 days\n**Next**\nKey: nope\n";
        let s = find_section(d, &[]).unwrap();
        assert_eq!(s.items.len(), 4);
        assert_eq!(parse_bool(s.items[0].value), Tri::Yes);
        let k = parse_key(s.items[1].value);
        assert_eq!(k.location, Some(KeyIn::Body));
        assert_eq!(k.names, vec!["transaction_id"]);
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
        assert_eq!(k.location, Some(KeyIn::Header));
        assert_eq!(k.names, vec!["X-Request-Id"]);
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
    fn values() {
        assert_eq!(parse_bool("否（每次调用都会新建）"), Tri::No);
        assert_eq!(parse_bool("No"), Tri::No);
        assert_eq!(parse_bool("是"), Tri::Yes);
        assert!(matches!(parse_bool("看情况"), Tri::Unknown(_)));
        let k = parse_key("merchant_id + out_trade_no（body）");
        assert_eq!(k.names, vec!["merchant_id", "out_trade_no"]);
        let k = parse_key("header: Idempotency-Key");
        assert_eq!(k.location, Some(KeyIn::Header));
        assert_eq!(k.names, vec!["Idempotency-Key"]);
        assert!(parse_key("无").names.is_empty());
        let k = parse_key("`Idempotency-Key` header");
        assert_eq!((k.location, k.names), (Some(KeyIn::Header), vec!["Idempotency-Key".to_string()]));
        let k = parse_key("request_id in query");
        assert_eq!((k.location, k.names), (Some(KeyIn::Query), vec!["request_id".to_string()]));
        let k = parse_key("Idempotency-Key");
        assert_eq!((k.location, k.names), (None, vec!["Idempotency-Key".to_string()]));
        assert_eq!(parse_key("/data/id (body)").names, vec!["/data/id"]);
        let d = parse_duplicate("HTTP 409，返回 DUPLICATE_REQUEST 与首次请求时间");
        assert_eq!(d.status, Some(409));
        assert_eq!(d.code.as_deref(), Some("DUPLICATE_REQUEST"));
        assert_eq!(parse_duplicate("409 Conflict").code, None);
        assert_eq!(parse_duplicate("1409").status, None);
        assert_eq!(duration_secs("24h"), Some(86400));
        assert_eq!(duration_secs("24 小时"), Some(86400));
        assert_eq!(duration_secs("1d 12h"), Some(129600));
        assert_eq!(duration_secs("forever"), None);
        assert_eq!(duration_secs("24 小时（之后同一个键视为新请求）"), Some(86400));
        assert_eq!(duration_secs("30m, then the key may be reused"), Some(1800));
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
        // The source article's wording: each of its three phrases is a label of its own.
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
    fn bracketed_remarks_change_nothing() {
        let k = parse_key("out_trade_no（商户订单号）");
        assert_eq!((k.location, k.names), (None, vec!["out_trade_no".to_string()]));
        let k = parse_key("out_trade_no（商户订单号）（body）");
        assert_eq!((k.location, k.names), (Some(KeyIn::Body), vec!["out_trade_no".to_string()]));
        let k = parse_key("out_trade_no (merchant order number) in body");
        assert_eq!((k.location, k.names), (Some(KeyIn::Body), vec!["out_trade_no".to_string()]));
        assert_eq!(parse_key("无（只读接口）"), KeySpec { location: None, names: Vec::new() });
        assert_eq!(parse_key("none (read-only)").names, Vec::<String>::new());
        // an attempt at an unsupported location is still one
        assert_eq!(parse_key("token（cookie jar）").location, Some(KeyIn::Other("cookie jar".into())));
        assert_eq!(parse_duplicate("无（只读接口）"), Duplicate::new(None, None));
    }

    #[test]
    fn yes_and_no_are_whole_words_never_prefixes() {
        for yes in ["是", "是，重复提交返回 409", "支持幂等", "Yes - by Idempotency-Key", "true", "是（按请求头）"] {
            assert_eq!(parse_bool(yes), Tri::Yes, "{yes}");
        }
        for no in ["否", "否（每次都新建）", "不支持", "not idempotent", "No.", "non-idempotent"] {
            assert_eq!(parse_bool(no), Tri::No, "{no}");
        }
        for neither in ["幂等键未定，待评审", "是否幂等", "yesterday", "nothing yet", "看情况"] {
            assert!(matches!(parse_bool(neither), Tri::Unknown(_)), "{neither}");
        }
    }

    #[test]
    fn numbering_in_every_form() {
        for item in ["(1) 是否幂等：是", "（2）是否幂等：是", "3）是否幂等：是", "3) 是否幂等：是", "① 是否幂等：是", "四、是否幂等：是", "1. 是否幂等：是", "1、是否幂等：是"] {
            assert_eq!(strip_list_marker(item), "是否幂等：是", "{item}");
        }
        for title in ["四、幂等性说明", "（三）幂等性说明", "(3) 幂等性说明", "4、幂等性说明", "3.1 幂等性说明", "② 幂等性说明"] {
            assert_eq!(normalize_title(title), "幂等性说明", "{title}");
        }
        // A version-like number is not an item number.
        assert_eq!(strip_list_marker("3.1是否幂等"), "3.1是否幂等");
    }

    #[test]
    fn a_code_span_is_the_key_wherever_it_stands() {
        let k = |v: &str| {
            let k = parse_key(v);
            (k.location, k.names)
        };
        let one = |n: &str| vec![n.to_string()];
        assert_eq!(k("请求体中的 `id` 字段（由客户端生成，UUID）"), (Some(KeyIn::Body), one("id")));
        assert_eq!(
            k("the `Idempotency-Key` request header (a UUID v4)"),
            (Some(KeyIn::Header), one("Idempotency-Key"))
        );
        assert_eq!(k("查询参数 `request_no`"), (Some(KeyIn::Query), one("request_no")));
        assert_eq!(k("`Idempotency-Key` header"), (Some(KeyIn::Header), one("Idempotency-Key")));
        assert_eq!(
            k("`merchant_id` + `out_trade_no`（均在请求体中）"),
            (Some(KeyIn::Body), vec!["merchant_id".to_string(), "out_trade_no".to_string()])
        );
        // No location word: none given; an unpaired backtick is no span.
        assert_eq!(k("由调用方生成的 `request_id`"), (None, one("request_id")));
        assert_eq!(k("request_id`"), (None, one("request_id")));
    }

    #[test]
    fn full_width_digits_and_status_classes() {
        let d = parse_duplicate("５００ DUPLICATE_REQUEST");
        assert_eq!((d.status, d.code.as_deref()), (Some(500), Some("DUPLICATE_REQUEST")));
        let d = parse_duplicate("5XX DUPLICATE_REQUEST");
        assert_eq!((d.status, d.class, d.code.as_deref()), (None, Some(5), Some("DUPLICATE_REQUEST")));
        assert_eq!(parse_duplicate("返回 5xx").class, Some(5));
        assert_eq!(parse_duplicate("５ｘｘ").class, Some(5));
        assert_eq!(parse_duplicate("409, never 5xx").status, Some(409));
        assert_eq!(parse_duplicate("A5XX").class, None);
        assert_eq!(parse_duplicate("5XXL").class, None);
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
