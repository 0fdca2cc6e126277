//! The document tree shared by the JSON and YAML front ends.
//!
//! Every node keeps the byte range it came from in its source file, so any finding can be
//! reported at `file:line:col` no matter which front end produced the tree.

/// A parsed JSON/YAML value with its source byte range.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: Value,
    /// Byte offset of the node's first character in its file.
    pub start: u32,
    /// Byte offset just past the node's last character.
    pub end: u32,
}

/// A mapping entry: the key keeps its own position (findings about an operation point at
/// the `post:` key, not at the first line of its body).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub key_start: u32,
    pub value: Node,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Bool(bool),
    /// Numbers keep their source text: `409` and `409.0` are different spellings, and JSON and
    /// YAML agree on the text of every number they share.
    Number(String),
    String(String),
    Seq(Vec<Node>),
    Map(Vec<Entry>),
}

impl Node {
    pub fn new(value: Value, start: u32, end: u32) -> Node {
        Node { value, start, end }
    }

    pub fn as_map(&self) -> Option<&[Entry]> {
        match &self.value {
            Value::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.value {
            Value::Seq(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match &self.value {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// A scalar as text (strings, numbers, booleans), e.g. a status written `409` or `"409"`.
    pub fn scalar_text(&self) -> Option<String> {
        match &self.value {
            Value::String(s) | Value::Number(s) => Some(s.clone()),
            Value::Bool(b) => Some(b.to_string()),
            _ => None,
        }
    }

    /// The value of `key` in a mapping (first occurrence).
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.entry(key).map(|e| &e.value)
    }

    pub fn entry(&self, key: &str) -> Option<&Entry> {
        self.as_map()?.iter().find(|e| e.key == key)
    }

    /// Child by one JSON-pointer segment (already unescaped): a mapping key or a sequence index.
    pub fn child(&self, segment: &str) -> Option<&Node> {
        match &self.value {
            Value::Map(m) => m.iter().find(|e| e.key == segment).map(|e| &e.value),
            Value::Seq(s) => {
                if segment.is_empty()
                    || (segment.len() > 1 && segment.starts_with('0'))
                    || !segment.bytes().all(|b| b.is_ascii_digit())
                {
                    return None;
                }
                segment.parse::<usize>().ok().and_then(|i| s.get(i))
            }
            _ => None,
        }
    }

    /// Number of nodes in this subtree (used to bound alias expansion).
    pub fn count(&self) -> usize {
        match &self.value {
            Value::Seq(s) => 1 + s.iter().map(Node::count).sum::<usize>(),
            Value::Map(m) => 1 + m.iter().map(|e| 1 + e.value.count()).sum::<usize>(),
            _ => 1,
        }
    }
}

/// Escape one JSON-pointer segment (RFC 6901).
fn escape_segment(s: &str) -> String {
    if !s.contains(['~', '/']) {
        return s.to_string();
    }
    s.replace('~', "~0").replace('/', "~1")
}

/// Unescape one JSON-pointer segment (RFC 6901).
fn unescape_segment(s: &str) -> String {
    if !s.contains('~') {
        return s.to_string();
    }
    s.replace("~1", "/").replace("~0", "~")
}

/// Build a JSON pointer from raw segments.
pub fn pointer<I, S>(segments: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut out = String::new();
    for s in segments {
        out.push('/');
        out.push_str(&escape_segment(s.as_ref()));
    }
    out
}

/// Split a JSON pointer into unescaped segments. `""` is the root; anything else must start
/// with `/`.
pub fn split_pointer(p: &str) -> Option<Vec<String>> {
    if p.is_empty() {
        return Some(Vec::new());
    }
    let rest = p.strip_prefix('/')?;
    Some(rest.split('/').map(unescape_segment).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn pointer_round_trip() {
        let p = pointer(["paths", "/api/order/create", "post", "a~b"]);
        assert_eq!(p, "/paths/~1api~1order~1create/post/a~0b");
        assert_eq!(split_pointer(&p).unwrap(), vec!["paths", "/api/order/create", "post", "a~b"]);
        assert_eq!(split_pointer("").unwrap(), Vec::<String>::new());
        assert!(split_pointer("x").is_none());
    }

    #[test]
    fn seq_child_rejects_leading_zero() {
        let n = Node::new(Value::Seq(vec![Node::new(Value::Null, 0, 0), Node::new(Value::Bool(true), 0, 0)]), 0, 0);
        assert_eq!(n.child("1").and_then(Node::as_bool), Some(true));
        assert!(n.child("01").is_none());
        assert!(n.child("2").is_none());
        assert!(n.child("-").is_none());
    }
}
