//! YAML front end: `saphyr-parser` events → [`Node`] tree with byte offsets.
//!
//! saphyr reports positions as character indexes; they are turned into byte offsets with a
//! cursor that walks the text, so the cost stays linear even for large non-ASCII files.
//! Plain scalars are typed with the YAML 1.2 core schema (`true`, `null`, `409`, `1.5`);
//! quoted and block scalars are strings. Anchors/aliases are expanded (bounded), `<<` merge
//! keys are applied.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use crate::node::{Entry, Node, Value};

/// Maximum number of nodes that alias expansion may add (a "billion laughs" guard).
const MAX_ALIAS_NODES: usize = 2_000_000;
/// Internal marker for a plain `<<` key (a quoted "<<" is an ordinary key).
const MERGE_KEY: &str = "\u{0}<<merge>>";

/// Maximum nesting depth.
pub const MAX_DEPTH: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct YamlError {
    pub offset: usize,
    pub reason: String,
}

/// Char index → byte offset, amortised linear for mostly-forward queries.
struct Cursor<'a> {
    text: &'a str,
    ascii: bool,
    chars: usize,
    bytes: usize,
}

impl Cursor<'_> {
    fn byte(&mut self, char_index: usize) -> usize {
        if self.ascii {
            return char_index.min(self.text.len());
        }
        while self.chars < char_index && self.bytes < self.text.len() {
            let c = self.text.get(self.bytes..).and_then(|r| r.chars().next()).map_or(1, char::len_utf8);
            self.bytes += c;
            self.chars += 1;
        }
        while self.chars > char_index && self.bytes > 0 {
            self.bytes -= 1;
            while self.bytes > 0 && !self.text.is_char_boundary(self.bytes) {
                self.bytes -= 1;
            }
            self.chars -= 1;
        }
        self.bytes
    }
}

enum Frame {
    Seq { items: Vec<Node>, start: u32, anchor: usize },
    Map { entries: Vec<Entry>, key: Option<(String, u32, bool)>, start: u32, anchor: usize, has_merge: bool },
}

pub fn parse(text: &str) -> Result<Node, YamlError> {
    let mut cur = Cursor { text, ascii: text.is_ascii(), chars: 0, bytes: 0 };
    let mut parser = Parser::new_from_str(text);
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Node> = HashMap::new();
    let mut root: Option<Node> = None;
    let mut docs = 0usize;
    let mut alias_nodes = 0usize;

    while let Some(ev) = parser.next_event() {
        let (ev, span) = match ev {
            Ok(x) => x,
            Err(e) => {
                let offset = cur.byte(e.marker().index());
                return Err(YamlError { offset, reason: format!("invalid YAML: {}", e.info()) });
            }
        };
        let (start, end) = span_bytes(&mut cur, &span);
        let mut plain_merge_key = false;
        let done: Option<(Node, usize)> = match ev {
            Event::StreamStart | Event::Nothing | Event::DocumentEnd => None,
            Event::StreamEnd => break,
            Event::DocumentStart(_) => {
                docs += 1;
                if docs > 1 {
                    return Err(YamlError {
                        offset: start as usize,
                        reason: "more than one YAML document in the file; an OpenAPI spec is a single document".into(),
                    });
                }
                None
            }
            Event::Alias(id) => {
                let Some(n) = anchors.get(&id) else {
                    return Err(YamlError { offset: start as usize, reason: "alias to an unknown anchor".into() });
                };
                alias_nodes += n.count();
                if alias_nodes > MAX_ALIAS_NODES {
                    return Err(YamlError {
                        offset: start as usize,
                        reason: format!("alias expansion exceeds {MAX_ALIAS_NODES} nodes"),
                    });
                }
                let mut n = n.clone();
                n.start = start;
                n.end = end;
                Some((n, 0))
            }
            Event::Scalar(v, style, anchor, tag) => {
                let is_str_tag = tag.as_ref().is_some_and(|t| t.suffix == "str");
                plain_merge_key = style == ScalarStyle::Plain && v == "<<";
                let value = if style == ScalarStyle::Plain && !is_str_tag {
                    resolve_plain(&v)
                } else {
                    Value::String(v.into_owned())
                };
                Some((Node::new(value, start, end), anchor))
            }
            Event::SequenceStart(anchor, _) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(YamlError {
                        offset: start as usize,
                        reason: format!("nesting deeper than {MAX_DEPTH} levels"),
                    });
                }
                stack.push(Frame::Seq { items: Vec::new(), start, anchor });
                None
            }
            Event::MappingStart(anchor, _) => {
                if stack.len() >= MAX_DEPTH {
                    return Err(YamlError {
                        offset: start as usize,
                        reason: format!("nesting deeper than {MAX_DEPTH} levels"),
                    });
                }
                stack.push(Frame::Map { entries: Vec::new(), key: None, start, anchor, has_merge: false });
                None
            }
            Event::SequenceEnd => match stack.pop() {
                Some(Frame::Seq { items, start: s, anchor }) => {
                    Some((Node::new(Value::Seq(items), s, end.max(s)), anchor))
                }
                _ => return Err(YamlError { offset: start as usize, reason: "unbalanced sequence end".into() }),
            },
            Event::MappingEnd => match stack.pop() {
                Some(Frame::Map { entries, start: s, anchor, has_merge, .. }) => {
                    let entries = if has_merge { apply_merge(entries) } else { entries };
                    Some((Node::new(Value::Map(entries), s, end.max(s)), anchor))
                }
                _ => return Err(YamlError { offset: start as usize, reason: "unbalanced mapping end".into() }),
            },
        };
        let Some((node, anchor)) = done else {
            continue;
        };
        if anchor != 0 {
            anchors.insert(anchor, node.clone());
        }
        match stack.last_mut() {
            None => root = Some(node),
            Some(Frame::Seq { items, .. }) => items.push(node),
            Some(Frame::Map { entries, key, has_merge, .. }) => match key.take() {
                None => {
                    let k = match &node.value {
                        Value::String(s) | Value::Number(s) => s.clone(),
                        Value::Bool(b) => b.to_string(),
                        Value::Null => String::new(),
                        _ => {
                            return Err(YamlError {
                                offset: node.start as usize,
                                reason: "complex mapping keys are not supported".into(),
                            })
                        }
                    };
                    *key = Some((k, node.start, plain_merge_key));
                }
                Some((k, key_start, is_merge)) => {
                    let merge = is_merge && matches!(node.value, Value::Map(_) | Value::Seq(_));
                    *has_merge |= merge;
                    let key = if merge { MERGE_KEY.to_string() } else { k };
                    entries.push(Entry { key, key_start, value: node });
                }
            },
        }
    }
    root.ok_or_else(|| YamlError { offset: 0, reason: "empty document".into() })
}

fn span_bytes(cur: &mut Cursor<'_>, span: &Span) -> (u32, u32) {
    let s = cur.byte(span.start.index());
    let e = cur.byte(span.end.index());
    (clamp32(s), clamp32(e.max(s)))
}

fn clamp32(v: usize) -> u32 {
    v.min(u32::MAX as usize) as u32
}

/// `<<: *base` / `<<: [*a, *b]`: keys of the merged maps that the map does not set itself.
fn apply_merge(entries: Vec<Entry>) -> Vec<Entry> {
    let mut own = Vec::new();
    let mut merged: Vec<Entry> = Vec::new();
    for e in entries {
        if e.key == MERGE_KEY {
            match e.value.value {
                Value::Map(m) => merged.extend(m),
                Value::Seq(s) => {
                    for n in s {
                        if let Value::Map(m) = n.value {
                            merged.extend(m);
                        }
                    }
                }
                other => own.push(Entry {
                    key: "<<".to_string(),
                    key_start: e.key_start,
                    value: Node::new(other, e.value.start, e.value.end),
                }),
            }
        } else {
            own.push(e);
        }
    }
    for m in merged {
        if !own.iter().any(|o| o.key == m.key) {
            own.push(m);
        }
    }
    own
}

/// YAML 1.2 core schema resolution of a plain scalar.
fn resolve_plain(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    if is_core_number(s) {
        Value::Number(s.to_string())
    } else {
        Value::String(s.to_string())
    }
}

fn is_core_number(s: &str) -> bool {
    let b = s.as_bytes();
    if let Some(h) = s.strip_prefix("0x") {
        return !h.is_empty() && h.bytes().all(|c| c.is_ascii_hexdigit());
    }
    if let Some(o) = s.strip_prefix("0o") {
        return !o.is_empty() && o.bytes().all(|c| (b'0'..=b'7').contains(&c));
    }
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if matches!(body, ".inf" | ".Inf" | ".INF") || matches!(s, ".nan" | ".NaN" | ".NAN") {
        return true;
    }
    if b.is_empty() {
        return false;
    }
    // [-+]? ( \. [0-9]+ | [0-9]+ ( \. [0-9]* )? ) ( [eE] [-+]? [0-9]+ )?
    let bb = body.as_bytes();
    let mut i = 0;
    let mut digits = 0;
    while i < bb.len() && bb[i].is_ascii_digit() {
        i += 1;
        digits += 1;
    }
    if i < bb.len() && bb[i] == b'.' {
        i += 1;
        while i < bb.len() && bb[i].is_ascii_digit() {
            i += 1;
            digits += 1;
        }
    }
    if digits == 0 {
        return false;
    }
    if i < bb.len() && (bb[i] == b'e' || bb[i] == b'E') {
        i += 1;
        if i < bb.len() && (bb[i] == b'+' || bb[i] == b'-') {
            i += 1;
        }
        let exp_start = i;
        while i < bb.len() && bb[i].is_ascii_digit() {
            i += 1;
        }
        if i == exp_start {
            return false;
        }
    }
    i == bb.len()
}

/// Write a tree as block-style YAML. Every string is double-quoted with JSON escapes (valid
/// YAML 1.2), so types survive the round trip exactly. Used by the hidden `--dump-yaml` debug
/// option that the corpus tests use to compare the JSON and YAML front ends.
pub fn dump(node: &Node) -> String {
    let mut out = String::new();
    dump_node(node, 0, &mut out);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    out
}

fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

fn scalar(node: &Node) -> Option<String> {
    match &node.value {
        Value::Null => Some("null".into()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.clone()),
        Value::String(s) => Some(quote(s)),
        Value::Seq(s) if s.is_empty() => Some("[]".into()),
        Value::Map(m) if m.is_empty() => Some("{}".into()),
        _ => None,
    }
}

fn dump_node(node: &Node, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match &node.value {
        Value::Map(m) if !m.is_empty() => {
            for e in m {
                out.push_str(&pad);
                out.push_str(&quote(&e.key));
                out.push(':');
                match scalar(&e.value) {
                    Some(s) => {
                        out.push(' ');
                        out.push_str(&s);
                        out.push('\n');
                    }
                    None => {
                        out.push('\n');
                        dump_node(&e.value, indent + 2, out);
                    }
                }
            }
        }
        Value::Seq(s) if !s.is_empty() => {
            for item in s {
                out.push_str(&pad);
                out.push('-');
                match scalar(item) {
                    Some(v) => {
                        out.push(' ');
                        out.push_str(&v);
                        out.push('\n');
                    }
                    None => {
                        out.push('\n');
                        dump_node(item, indent + 2, out);
                    }
                }
            }
        }
        _ => {
            out.push_str(&pad);
            out.push_str(&scalar(node).unwrap_or_default());
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::string_slice)]
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn strip(n: &Node) -> Node {
        let value = match &n.value {
            Value::Seq(s) => Value::Seq(s.iter().map(strip).collect()),
            Value::Map(m) => Value::Map(
                m.iter().map(|e| Entry { key: e.key.clone(), key_start: 0, value: strip(&e.value) }).collect(),
            ),
            v => v.clone(),
        };
        Node::new(value, 0, 0)
    }

    #[test]
    fn typed_scalars_and_offsets_after_cjk() {
        let t = "描述: 支付\nstatus: 409\nquoted: '409'\nflag: true\nnothing: ~\nf: 1.5e3\nname: 3.0.3\n";
        let n = parse(t).unwrap();
        assert_eq!(n.get("status").unwrap().value, Value::Number("409".into()));
        assert_eq!(n.get("quoted").unwrap().as_str(), Some("409"));
        assert_eq!(n.get("flag").unwrap().as_bool(), Some(true));
        assert_eq!(n.get("nothing").unwrap().value, Value::Null);
        assert_eq!(n.get("f").unwrap().value, Value::Number("1.5e3".into()));
        assert_eq!(n.get("name").unwrap().as_str(), Some("3.0.3"));
        let e = n.entry("status").unwrap();
        assert_eq!(&t[e.key_start as usize..e.key_start as usize + 6], "status");
        let v = n.get("描述").unwrap();
        assert_eq!(&t[v.start as usize..v.end as usize], "支付");
    }

    #[test]
    fn anchors_aliases_and_merge() {
        let t = "base: &b {x: 1, y: 2}\nuse:\n  <<: *b\n  y: 3\nagain: *b\nq: {\"<<\": [1]}\n";
        let n = parse(t).unwrap();
        let u = n.get("use").unwrap();
        assert_eq!(u.get("x").unwrap().value, Value::Number("1".into()));
        assert_eq!(u.get("y").unwrap().value, Value::Number("3".into()));
        assert!(u.get("<<").is_none());
        let q = n.get("q").unwrap();
        assert_eq!(q.get("<<").unwrap().as_seq().unwrap().len(), 1);
        assert_eq!(n.get("again").unwrap().get("y").unwrap().value, Value::Number("2".into()));
    }

    #[test]
    fn dump_round_trips_through_the_parser() {
        let src = r#"{"a": {"b": [1, "two", {"c": null}], "e": [], "f": {}}, "s": "line\nnext: \"q\" #x", "t": true, "n": "123", "k y": -1.5}"#;
        let j = crate::json::parse(src).unwrap();
        let y = parse(&dump(&j)).unwrap();
        assert_eq!(strip(&j), strip(&y));
    }

    #[test]
    fn errors_are_positioned() {
        let t = "a: 1\nb: [1, 2\n";
        let e = parse(t).unwrap_err();
        assert!(e.reason.starts_with("invalid YAML"));
        assert!(e.offset > 4, "{e:?}");
        assert_eq!(parse("").unwrap_err().reason, "empty document");
        assert!(parse("a: 1\n---\nb: 2\n").is_err());
    }

    #[test]
    fn billion_laughs_is_bounded() {
        let mut t = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
        let mut prev = 'a';
        for c in 'b'..='k' {
            t.push_str(&format!(
                "{c}: &{c} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
            ));
            prev = c;
        }
        let e = parse(&t).unwrap_err();
        assert!(e.reason.contains("alias expansion"), "{e:?}");
    }
}
