//! The grammar of a statement's values (also used for string values of `x-idempotency`): a
//! yes/no answer, a key (names and location), a duplicate response (status, code or class), a
//! duration. Pure functions over `&str`, no panics on any input (property-tested). Where the values
//! stand — the section, its items and labels — is [`crate::section`].

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
    const NO: [&str; 11] =
        ["否", "非幂等", "不幂等", "不是", "不支持", "不支持幂等", "非幂等接口", "no", "false", "n", "non-idempotent"];
    const YES: [&str; 10] = ["是", "是的", "幂等", "支持", "支持幂等", "幂等接口", "yes", "true", "y", "idempotent"];
    if NO.contains(&clause) || (NO.contains(&first) && first.is_ascii()) || clause.starts_with("not idempotent") {
        return Tri::No;
    }
    if YES.contains(&clause) || (YES.contains(&first) && first.is_ascii()) {
        return Tri::Yes;
    }
    Tri::Unknown(v.trim().to_string())
}

/// Whether a delivery (a webhook, a callback) may reach its receiver more than once: `Yes` for
/// "at least once" (`至少一次`, `可能重复投递`, `会重试`, `at least once`, `may repeat`,
/// `retried`), `No` for a promise of one delivery (`仅一次`, `exactly once`, `no`), which no
/// sender over HTTP can keep. Read as [`parse_bool`] reads yes/no: the first clause, whole.
pub fn parse_delivery(v: &str) -> Tri {
    let plain = without_remarks(v).replace('`', "").to_lowercase();
    let clause = plain
        .split(['，', ',', '；', ';', '。', '、', '—'])
        .next()
        .unwrap_or("")
        .trim()
        .trim_end_matches(['.', '!', '！']);
    let clause = clause.trim().replace(['-', '_'], " ");
    const REPEATS: [&str; 12] = [
        "至少一次",
        "可能重复",
        "可能重复投递",
        "会重复投递",
        "会重试",
        "重试投递",
        "at least once",
        "may repeat",
        "may be repeated",
        "repeated",
        "retried",
        "yes",
    ];
    const ONCE: [&str; 6] = ["仅一次", "只投递一次", "exactly once", "once", "no", "否"];
    if REPEATS.contains(&clause.as_str()) || clause.starts_with("at least once") || clause == "是" {
        return Tri::Yes;
    }
    if ONCE.contains(&clause.as_str()) {
        return Tri::No;
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

/// One part of a key: a name and where it is read, when the statement says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPart {
    pub name: String,
    pub location: Option<KeyIn>,
}

/// A named key: one or more parts (a composite business key), each with its own location
/// (`out_trade_no（path）+ mchid（body）`). No parts means the statement says explicitly that
/// there is no key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeySpec {
    pub parts: Vec<KeyPart>,
}

impl KeySpec {
    /// The names in every part sharing one location (`x-idempotency`'s `{in, name(s)}`).
    pub fn at(location: Option<KeyIn>, names: Vec<String>) -> KeySpec {
        KeySpec { parts: names.into_iter().map(|name| KeyPart { name, location: location.clone() }).collect() }
    }

    /// The statement says there is no key.
    pub fn is_none(&self) -> bool {
        self.parts.is_empty()
    }

    pub fn names(&self) -> Vec<&str> {
        self.parts.iter().map(|p| p.name.as_str()).collect()
    }

    /// The location every part shares, if they share one.
    pub fn location(&self) -> Option<&KeyIn> {
        let first = self.parts.first()?.location.as_ref()?;
        self.parts.iter().all(|p| p.location.as_ref() == Some(first)).then_some(first)
    }

    /// The key as messages quote it: `a + b (body)` when the parts share a location,
    /// `a (path) + b (body)` when they do not, `none` for no key.
    pub fn text(&self) -> String {
        if self.parts.is_empty() {
            return "none".into();
        }
        if let Some(l) = self.location() {
            return format!("{} ({})", self.names().join(" + "), l.as_str());
        }
        let part = |p: &KeyPart| match &p.location {
            Some(l) => format!("{} ({})", p.name, l.as_str()),
            None => p.name.clone(),
        };
        self.parts.iter().map(part).collect::<Vec<_>>().join(" + ")
    }
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

/// The parts of a key value: split at `+ 、 , ， &` and ` and `, never inside brackets (a
/// remark may hold a comma) or code spans.
fn split_parts(v: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut in_span, mut from) = (0usize, false, 0usize);
    let mut chars = v.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '`' => in_span = !in_span,
            '(' | '（' if !in_span => depth += 1,
            ')' | '）' if !in_span => depth = depth.saturating_sub(1),
            '+' | '、' | ',' | '，' | '&' if depth == 0 && !in_span => {
                parts.push(v.get(from..i).unwrap_or(""));
                from = i + c.len_utf8();
            }
            ' ' if depth == 0 && !in_span && v.get(i..).is_some_and(|t| t.starts_with(" and ")) => {
                parts.push(v.get(from..i).unwrap_or(""));
                from = i + " and ".len();
                while chars.peek().is_some_and(|(j, _)| *j < from) {
                    chars.next();
                }
            }
            _ => {}
        }
    }
    parts.push(v.get(from..).unwrap_or(""));
    parts
}

/// One part's names and location. Code spans are the names wherever they stand (`请求体中的
/// `id` 字段`, "the `Idempotency-Key` request header"), with a location word anywhere in the
/// prose; otherwise the text is the name, with its location in a bracket (`Name（header）`),
/// before it (`header: Name`, `请求头 Name`) or after it (`Name in query`). A bracket that
/// names no location is a remark (`out_trade_no（商户订单号）`) and changes nothing, except one
/// that tries an unsupported location (`token（cookie）`), which IDEM004 reports.
fn parse_part(part: &str) -> (Vec<String>, Option<KeyIn>) {
    let (text, inner) = brackets(part);
    let text = text.trim();
    let bracket_location = || inner.iter().map(|i| KeyIn::parse(i)).find(|l| !matches!(l, KeyIn::Other(_)));
    let spans = code_spans(text);
    if !spans.is_empty() {
        let prose: String = text.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let location =
            bracket_location().or_else(|| Some(KeyIn::parse(&prose)).filter(|l| !matches!(l, KeyIn::Other(_))));
        // A composite key in one span (`mchid + out_trade_no`, WeChat Pay's docs): its parts,
        // each at the span's location. No header, field or parameter name holds a separator.
        let names = spans.into_iter().flat_map(split_parts).map(unquote).filter(|n| !n.is_empty());
        return (names.map(str::to_string).collect(), location);
    }
    let mut name = text;
    let mut location = bracket_location();
    if location.is_none() {
        location = inner.iter().find(|i| is_location_like(i)).map(|i| KeyIn::Other(i.trim().to_string()));
    }
    if location.is_none() {
        if let Some((loc, rest)) = trailing_location(text) {
            location = Some(loc);
            name = rest;
        } else {
            let first_end =
                text.char_indices().find(|(_, c)| c.is_whitespace() || *c == ':' || *c == '：').map(|(i, _)| i);
            if let Some(e) = first_end {
                let loc = KeyIn::parse(text.get(..e).unwrap_or(""));
                if !matches!(loc, KeyIn::Other(_)) {
                    location = Some(loc);
                    name = text.get(e..).unwrap_or("").trim_start_matches([':', '：', ' ', '\t']);
                }
            }
        }
    }
    let name = unquote(name);
    (if name.is_empty() { Vec::new() } else { vec![name.to_string()] }, location)
}

/// A key value: `Idempotency-Key（header）`, `header: Idempotency-Key`, `merchant_id +
/// out_trade_no（body）`, `out_trade_no（path）+ mchid（body）`, `无`. A part without a location
/// of its own takes the one the others share (`a + b（body）`: both in the body); when the
/// others differ, it has none.
pub fn parse_key(v: &str) -> KeySpec {
    let v = v.trim();
    let bare = without_remarks(v);
    if bare.is_empty() || is_none_word(&bare) {
        return KeySpec::default();
    }
    // Once code spans name the key, text outside them is prose, even between separators
    // (`` `a` (path) + `b` (header), a UUID per refund ``).
    let spans = !code_spans(&bare).is_empty();
    let mut parts = Vec::new();
    for part in split_parts(v) {
        if spans && code_spans(&without_remarks(part)).is_empty() {
            continue;
        }
        let (names, location) = parse_part(part);
        parts.extend(names.into_iter().map(|name| KeyPart { name, location: location.clone() }));
    }
    let mut located = parts.iter().filter_map(|p| p.location.clone());
    let shared = located.next().filter(|first| located.all(|l| &l == first));
    if let Some(shared) = shared {
        for p in parts.iter_mut().filter(|p| p.location.is_none()) {
            p.location = Some(shared.clone());
        }
    }
    KeySpec { parts }
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
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn values() {
        assert_eq!(parse_bool("否（每次调用都会新建）"), Tri::No);
        assert_eq!(parse_bool("No"), Tri::No);
        assert_eq!(parse_bool("是"), Tri::Yes);
        assert!(matches!(parse_bool("看情况"), Tri::Unknown(_)));
        let k = parse_key("merchant_id + out_trade_no（body）");
        assert_eq!(k.names(), vec!["merchant_id", "out_trade_no"]);
        let k = parse_key("header: Idempotency-Key");
        assert_eq!(k.location().cloned(), Some(KeyIn::Header));
        assert_eq!(k.names(), vec!["Idempotency-Key"]);
        assert!(parse_key("无").is_none());
        let k = parse_key("`Idempotency-Key` header");
        assert_eq!((k.location().cloned(), k.names()), (Some(KeyIn::Header), vec!["Idempotency-Key"]));
        let k = parse_key("request_id in query");
        assert_eq!((k.location().cloned(), k.names()), (Some(KeyIn::Query), vec!["request_id"]));
        let k = parse_key("Idempotency-Key");
        assert_eq!((k.location().cloned(), k.names()), (None, vec!["Idempotency-Key"]));
        assert_eq!(parse_key("/data/id (body)").names(), vec!["/data/id"]);
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
    fn bracketed_remarks_change_nothing() {
        let k = parse_key("out_trade_no（商户订单号）");
        assert_eq!((k.location().cloned(), k.names()), (None, vec!["out_trade_no"]));
        let k = parse_key("out_trade_no（商户订单号）（body）");
        assert_eq!((k.location().cloned(), k.names()), (Some(KeyIn::Body), vec!["out_trade_no"]));
        let k = parse_key("out_trade_no (merchant order number) in body");
        assert_eq!((k.location().cloned(), k.names()), (Some(KeyIn::Body), vec!["out_trade_no"]));
        assert_eq!(parse_key("无（只读接口）"), KeySpec::default());
        assert_eq!(parse_key("none (read-only)").names(), Vec::<&str>::new());
        // an attempt at an unsupported location is still one
        assert_eq!(parse_key("token（cookie jar）").location().cloned(), Some(KeyIn::Other("cookie jar".into())));
        assert_eq!(parse_duplicate("无（只读接口）"), Duplicate::new(None, None));
    }

    #[test]
    fn yes_and_no_are_whole_words_never_prefixes() {
        for yes in ["是", "是，重复提交返回 409", "支持幂等", "Yes - by Idempotency-Key", "true", "是（按请求头）"]
        {
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
    fn a_code_span_is_the_key_wherever_it_stands() {
        let k = |v: &str| {
            let k = parse_key(v);
            (k.location().cloned(), k.names().into_iter().map(String::from).collect::<Vec<_>>())
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
    fn each_part_of_a_composite_key_has_its_own_location() {
        let parts = |v: &str| {
            let k = parse_key(v);
            k.parts.iter().map(|p| (p.name.clone(), p.location.clone())).collect::<Vec<_>>()
        };
        let part = |n: &str, l: Option<KeyIn>| (n.to_string(), l);
        assert_eq!(
            parts("out_trade_no（path）+ mchid（body）"),
            vec![part("out_trade_no", Some(KeyIn::Path)), part("mchid", Some(KeyIn::Body))]
        );
        assert_eq!(
            parts("order_id in path and Idempotency-Key in header"),
            vec![part("order_id", Some(KeyIn::Path)), part("Idempotency-Key", Some(KeyIn::Header))]
        );
        assert_eq!(
            parts("`merchant_id` (path) + `Idempotency-Key` (header), a UUID per refund"),
            vec![part("merchant_id", Some(KeyIn::Path)), part("Idempotency-Key", Some(KeyIn::Header))]
        );
        // A part without its own location takes the one the others share, and none when they differ.
        assert_eq!(
            parts("mchid + out_trade_no（body）"),
            vec![part("mchid", Some(KeyIn::Body)), part("out_trade_no", Some(KeyIn::Body))]
        );
        assert_eq!(
            parts("a（path）+ b + c（body）"),
            vec![part("a", Some(KeyIn::Path)), part("b", None), part("c", Some(KeyIn::Body))]
        );
        // A comma inside a remark separates nothing.
        assert_eq!(parts("out_trade_no（商户订单号，唯一）"), vec![part("out_trade_no", None)]);
        let k = parse_key("out_trade_no（path）+ mchid（body）");
        assert_eq!((k.location(), k.text()), (None, "out_trade_no (path) + mchid (body)".to_string()));
        assert_eq!(parse_key("a + b（body）").text(), "a + b (body)");
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
}
