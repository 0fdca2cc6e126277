//! The idempotency statement of an operation, from its description section and/or its
//! `x-idempotency` extension, with a source location for every field.

use crate::loader::{FileId, Workspace};
use crate::model::Operation;
use crate::node::{Node, Value};
use crate::section::{find_section, unrecognised_title, Label};
use crate::value::{parse_bool, parse_delivery, parse_duplicate, parse_key, Duplicate, KeyIn, KeySpec, Tri};

/// The statement's own fields of `x-idempotency` (what [`statements`] reads).
pub const EXTENSION_FIELDS: [&str; 5] = ["idempotent", "key", "duplicate", "expiry", "delivery"];

/// Where a finding points: file, byte offset, logical JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loc {
    pub file: FileId,
    pub offset: u32,
    pub pointer: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field<T> {
    pub value: T,
    pub loc: Loc,
    /// The text as written (for messages).
    pub raw: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Section,
    Extension,
}

impl Origin {
    pub fn describe(self) -> &'static str {
        match self {
            Origin::Section => "the 幂等性说明 section",
            Origin::Extension => "x-idempotency",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    pub origin: Origin,
    /// The section title or the `x-idempotency` key.
    pub loc: Loc,
    pub idempotent: Option<Field<Tri>>,
    pub key: Option<Field<KeySpec>>,
    pub duplicate: Option<Field<Duplicate>>,
    pub expiry: Option<Field<String>>,
    /// A delivery's (webhook's, callback's) promise to its receivers: may it come again?
    pub delivery: Option<Field<Tri>>,
    /// The section is written in English (its title has no CJK characters): hints follow it.
    pub english: bool,
}

impl Statement {
    /// How to write a missing field in this form of the statement, in its language.
    pub fn hint(&self, field: &str) -> &'static str {
        match (self.origin, self.english, field) {
            (Origin::Extension, _, "idempotent") => "add `idempotent: true` or `idempotent: false`",
            (Origin::Extension, _, "key") => "add e.g. `key: { in: header, name: Idempotency-Key }`",
            (Origin::Extension, _, "delivery") => "add `delivery: at-least-once`",
            (Origin::Extension, _, "event-key") => "add e.g. `key: { in: header, name: webhook-id }`",
            (Origin::Section, false, "event-key") => "add e.g. `幂等键：webhook-id（header）`",
            (Origin::Section, true, "event-key") => "add e.g. `Key: webhook-id (header)`",
            (Origin::Section, false, "delivery") => "add `投递：至少一次`",
            (Origin::Section, true, "delivery") => "add `Delivery: at least once`",
            (Origin::Extension, _, _) => "add e.g. `duplicate: { status: 409, code: DUPLICATE_REQUEST }`",
            (Origin::Section, false, "idempotent") => "add `是否幂等：是` or `是否幂等：否`",
            (Origin::Section, false, "key") => "add e.g. `幂等键：Idempotency-Key（header）`",
            (Origin::Section, false, _) => "add e.g. `重复请求：409 DUPLICATE_REQUEST`",
            (Origin::Section, true, "idempotent") => "add `Idempotent: yes` or `Idempotent: no`",
            (Origin::Section, true, "key") => "add e.g. `Key: Idempotency-Key (header)`",
            (Origin::Section, true, _) => "add e.g. `Duplicate: 409 DUPLICATE_REQUEST`",
        }
    }

    /// Where the statement is, as named in messages.
    pub fn describe(&self) -> &'static str {
        match (self.origin, self.english) {
            (Origin::Section, true) => "the Idempotency section",
            (origin, _) => origin.describe(),
        }
    }

    /// How to write yes/no, in the statement's language.
    pub fn yes_no(&self) -> &'static str {
        if self.english || self.origin == Origin::Extension {
            "yes/no"
        } else {
            "是/否 (yes/no)"
        }
    }
}

/// Is `s` free of CJK characters (so a section titled with it is English)?
fn is_english(s: &str) -> bool {
    !s.chars().any(|c| matches!(c as u32, 0x2E80..=0x9FFF | 0xF900..=0xFAFF | 0xFF00..=0xFFEF | 0x20000..=0x3FFFF))
}

/// Both statements of an operation (either may be absent).
#[derive(Debug, Clone, Default)]
pub struct Statements {
    pub section: Option<Statement>,
    pub extension: Option<Statement>,
    /// A line naming the section that was not recognised as its title (only when there is
    /// no section), for IDEM001's message.
    pub unrecognised_title: Option<String>,
}

impl Statements {
    /// Field-wise merge: `x-idempotency` wins, the section fills gaps. Disagreements are
    /// IDEM009's business.
    pub fn merged(&self) -> Option<Statement> {
        match (&self.section, &self.extension) {
            (None, None) => None,
            (Some(s), None) => Some(s.clone()),
            (None, Some(e)) => Some(e.clone()),
            (Some(s), Some(e)) => Some(Statement {
                origin: Origin::Extension,
                loc: e.loc.clone(),
                idempotent: e.idempotent.clone().or_else(|| s.idempotent.clone()),
                key: e.key.clone().or_else(|| s.key.clone()),
                duplicate: e.duplicate.clone().or_else(|| s.duplicate.clone()),
                expiry: e.expiry.clone().or_else(|| s.expiry.clone()),
                delivery: e.delivery.clone().or_else(|| s.delivery.clone()),
                english: false,
            }),
        }
    }
}

/// Find `needle` inside `haystack[from..to]`; used to map a line of a parsed description
/// back to its place in the source file (block scalars and plain JSON strings keep lines
/// verbatim; escaped text falls back to the start of the string).
fn find_in(haystack: &str, from: usize, to: usize, needle: &str) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    let hay = haystack.get(from..to.min(haystack.len()))?;
    hay.find(needle).map(|i| from + i)
}

pub fn statements(ws: &Workspace, op: &Operation<'_>, extra_titles: &[String], with_section: bool) -> Statements {
    let mut out = Statements::default();
    let file = op.at.file;
    let text = &ws.file(file).text;
    if with_section {
        if let Some(desc_node) = op.at.node.get("description") {
            if let Some(desc) = desc_node.as_str() {
                if let Some(sec) = find_section(desc, extra_titles) {
                    let pointer = format!("{}/description", op.pointer);
                    let (s, e) = (desc_node.start as usize, desc_node.end as usize);
                    let mut cursor = s;
                    let mut locate = |needle: &str| -> Option<u32> {
                        let i = find_in(text, cursor, e, needle)?;
                        cursor = i + needle.len();
                        Some(i as u32)
                    };
                    let loc_of = |offset: u32| Loc { file, offset, pointer: pointer.clone() };
                    let title_off = locate(sec.title).unwrap_or(desc_node.start);
                    let mut st = Statement {
                        origin: Origin::Section,
                        loc: loc_of(title_off),
                        idempotent: None,
                        key: None,
                        duplicate: None,
                        expiry: None,
                        delivery: None,
                        english: is_english(sec.title),
                    };
                    // Items of one table row (a label row over a value row) share their line.
                    let mut last_line: Option<(std::ops::Range<usize>, Option<u32>)> = None;
                    for item in &sec.items {
                        let line_at = match &last_line {
                            Some((range, at)) if *range == item.range => *at,
                            _ => locate(item.line),
                        };
                        last_line = Some((item.range.clone(), line_at));
                        // Point at the value when the line was found verbatim, else at
                        // the start of the description (escaped JSON text, folded YAML).
                        let off = line_at.map_or(desc_node.start, |l| l + item.value_offset as u32);
                        let raw = item.value.to_string();
                        let loc = loc_of(off);
                        match item.label {
                            Label::Idempotent if st.idempotent.is_none() => {
                                st.idempotent = Some(Field { value: parse_bool(item.value), loc, raw });
                            }
                            Label::Key if st.key.is_none() => {
                                st.key = Some(Field { value: parse_key(item.value), loc, raw });
                            }
                            Label::Duplicate if st.duplicate.is_none() => {
                                st.duplicate = Some(Field { value: parse_duplicate(item.value), loc, raw });
                            }
                            Label::Expiry if st.expiry.is_none() => {
                                st.expiry = Some(Field { value: item.value.to_string(), loc, raw });
                            }
                            Label::Delivery if st.delivery.is_none() => {
                                st.delivery = Some(Field { value: parse_delivery(item.value), loc, raw });
                            }
                            _ => {}
                        }
                    }
                    out.section = Some(st);
                } else {
                    out.unrecognised_title = unrecognised_title(desc, extra_titles).map(str::to_string);
                }
            }
        }
    }
    if let Some(entry) = op.at.node.entry("x-idempotency") {
        out.extension = Some(extension(op, file, entry.key_start, &entry.value));
    }
    out
}

fn extension(op: &Operation<'_>, file: FileId, key_start: u32, node: &Node) -> Statement {
    let base = format!("{}/x-idempotency", op.pointer);
    let loc_at = |n: &Node, field: &str| Loc {
        file,
        offset: n.start,
        pointer: if field.is_empty() { base.clone() } else { format!("{base}/{field}") },
    };
    let mut st = Statement {
        origin: Origin::Extension,
        loc: Loc { file, offset: key_start, pointer: base.clone() },
        idempotent: None,
        key: None,
        duplicate: None,
        expiry: None,
        delivery: None,
        english: false,
    };
    match &node.value {
        Value::Bool(b) => {
            st.idempotent =
                Some(Field { value: if *b { Tri::Yes } else { Tri::No }, loc: loc_at(node, ""), raw: b.to_string() });
            return st;
        }
        Value::Map(_) => {}
        _ => {
            st.idempotent = Some(Field {
                value: match &node.value {
                    Value::String(s) => parse_bool(s),
                    _ => Tri::Unknown(node.scalar_text().unwrap_or_else(|| "?".into())),
                },
                loc: loc_at(node, ""),
                raw: node.scalar_text().unwrap_or_default(),
            });
            return st;
        }
    }
    if let Some(n) = node.get("idempotent") {
        let value = match &n.value {
            Value::Bool(true) => Tri::Yes,
            Value::Bool(false) => Tri::No,
            Value::String(s) => parse_bool(s),
            _ => Tri::Unknown(n.scalar_text().unwrap_or_else(|| "?".into())),
        };
        st.idempotent = Some(Field { value, loc: loc_at(n, "idempotent"), raw: n.scalar_text().unwrap_or_default() });
    }
    if let Some(n) = node.get("key") {
        let value = match &n.value {
            Value::String(s) => parse_key(s),
            Value::Map(_) => {
                let location = n.get("in").and_then(Node::as_str).map(KeyIn::parse);
                let names = match n.get("name").or_else(|| n.get("names")) {
                    Some(v) => match &v.value {
                        Value::String(s) => vec![s.clone()],
                        Value::Seq(items) => items.iter().filter_map(Node::scalar_text).collect(),
                        _ => Vec::new(),
                    },
                    None => Vec::new(),
                };
                KeySpec::at(location, names)
            }
            _ => KeySpec::default(),
        };
        st.key = Some(Field { value, loc: loc_at(n, "key"), raw: n.scalar_text().unwrap_or_default() });
    }
    if let Some(n) = node.get("duplicate") {
        let value = match &n.value {
            Value::String(s) => parse_duplicate(s),
            Value::Number(s) => Duplicate::new(s.parse().ok(), None),
            Value::Map(_) => Duplicate::new(
                n.get("status").and_then(Node::scalar_text).and_then(|s| s.trim().parse().ok()),
                n.get("code").and_then(Node::scalar_text),
            ),
            _ => Duplicate::new(None, None),
        };
        st.duplicate = Some(Field { value, loc: loc_at(n, "duplicate"), raw: n.scalar_text().unwrap_or_default() });
    }
    if let Some(n) = node.get("delivery") {
        st.delivery = Some(Field {
            value: n.scalar_text().map_or(Tri::Unknown("?".into()), |t| parse_delivery(&t)),
            loc: loc_at(n, "delivery"),
            raw: n.scalar_text().unwrap_or_default(),
        });
    }
    if let Some(n) = node.get("expiry") {
        st.expiry = Some(Field {
            value: n.scalar_text().unwrap_or_default(),
            loc: loc_at(n, "expiry"),
            raw: n.scalar_text().unwrap_or_default(),
        });
    }
    st
}
