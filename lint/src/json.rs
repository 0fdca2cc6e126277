//! A small strict JSON parser (RFC 8259) that records the byte range of every node.
//!
//! serde_json is faster still but keeps no positions; going through the YAML parser for JSON
//! works (YAML 1.2 is a superset) but is about 4× slower on the 13 MB GitHub spec. This parser
//! is a single pass over bytes with no backtracking.

use crate::node::{Entry, Node, Value};

/// Maximum nesting depth; deeper documents are rejected instead of overflowing the stack.
pub const MAX_DEPTH: usize = 256;

/// A parse error at a byte offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsonError {
    pub offset: usize,
    pub reason: String,
}

pub fn parse(text: &str) -> Result<Node, JsonError> {
    let mut p = Parser { s: text.as_bytes(), text, i: 0, depth: 0 };
    p.ws();
    let node = p.value()?;
    p.ws();
    if p.i < p.s.len() {
        return Err(p.err("unexpected content after the JSON document"));
    }
    Ok(node)
}

struct Parser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn err(&self, reason: impl Into<String>) -> JsonError {
        JsonError { offset: self.i, reason: reason.into() }
    }

    fn ws(&mut self) {
        while let Some(&b) = self.s.get(self.i) {
            if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
                self.i += 1;
            } else {
                break;
            }
        }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn value(&mut self) -> Result<Node, JsonError> {
        let start = self.i;
        let v = match self.peek() {
            None => return Err(self.err("unexpected end of input, expected a JSON value")),
            Some(b'{') => self.object()?,
            Some(b'[') => self.array()?,
            Some(b'"') => Value::String(self.string()?),
            Some(b't') => self.literal("true", Value::Bool(true))?,
            Some(b'f') => self.literal("false", Value::Bool(false))?,
            Some(b'n') => self.literal("null", Value::Null)?,
            Some(b'-' | b'0'..=b'9') => self.number()?,
            Some(_) => {
                let c = self.text.get(self.i..).and_then(|r| r.chars().next());
                return Err(self.err(format!("unexpected character {:?}, expected a JSON value", c.unwrap_or('?'))));
            }
        };
        Ok(Node::new(v, start as u32, self.i as u32))
    }

    fn literal(&mut self, word: &str, v: Value) -> Result<Value, JsonError> {
        if self.s.get(self.i..self.i + word.len()) == Some(word.as_bytes()) {
            self.i += word.len();
            Ok(v)
        } else {
            Err(self.err(format!("invalid literal, expected `{word}`")))
        }
    }

    fn enter(&mut self) -> Result<(), JsonError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err(format!("nesting deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }

    fn object(&mut self) -> Result<Value, JsonError> {
        self.enter()?;
        self.i += 1;
        let mut entries = Vec::new();
        self.ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
            self.depth -= 1;
            return Ok(Value::Map(entries));
        }
        loop {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(self.err("expected a string key"));
            }
            let key_start = self.i as u32;
            let key = self.string()?;
            self.ws();
            if self.peek() != Some(b':') {
                return Err(self.err("expected `:` after the key"));
            }
            self.i += 1;
            self.ws();
            let value = self.value()?;
            entries.push(Entry { key, key_start, value });
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b'}') => {
                    self.i += 1;
                    break;
                }
                None => return Err(self.err("unexpected end of input inside an object")),
                _ => return Err(self.err("expected `,` or `}`")),
            }
        }
        self.depth -= 1;
        Ok(Value::Map(entries))
    }

    fn array(&mut self) -> Result<Value, JsonError> {
        self.enter()?;
        self.i += 1;
        let mut items = Vec::new();
        self.ws();
        if self.peek() == Some(b']') {
            self.i += 1;
            self.depth -= 1;
            return Ok(Value::Seq(items));
        }
        loop {
            self.ws();
            items.push(self.value()?);
            self.ws();
            match self.peek() {
                Some(b',') => self.i += 1,
                Some(b']') => {
                    self.i += 1;
                    break;
                }
                None => return Err(self.err("unexpected end of input inside an array")),
                _ => return Err(self.err("expected `,` or `]`")),
            }
        }
        self.depth -= 1;
        Ok(Value::Seq(items))
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.i += 1;
                }
            }
            _ => return Err(self.err("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("invalid number: digit expected after `.`"));
            }
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return Err(self.err("invalid number: digit expected in exponent"));
            }
            while matches!(self.peek(), Some(b'0'..=b'9')) {
                self.i += 1;
            }
        }
        Ok(Value::Number(self.text.get(start..self.i).unwrap_or("").to_string()))
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.i += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy the run of plain characters in one go.
            let run_start = self.i;
            while let Some(&b) = self.s.get(self.i) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.i += 1;
            }
            out.push_str(self.text.get(run_start..self.i).unwrap_or(""));
            match self.peek() {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let esc = self.peek();
                    self.i += 1;
                    match esc {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{8}'),
                        Some(b'f') => out.push('\u{c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let c = self.unicode_escape()?;
                            out.push(c);
                        }
                        _ => {
                            self.i -= 1;
                            return Err(self.err("invalid escape sequence"));
                        }
                    }
                }
                Some(_) => return Err(self.err("control character inside a string")),
            }
        }
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let Some(h) = self.text.get(self.i..self.i + 4) else {
            return Err(self.err("invalid \\u escape"));
        };
        let v = u32::from_str_radix(h, 16).map_err(|_| self.err("invalid \\u escape"))?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(self.err("invalid \\u escape"));
        }
        self.i += 4;
        Ok(v)
    }

    fn unicode_escape(&mut self) -> Result<char, JsonError> {
        let hi = self.hex4()?;
        if (0xD800..0xDC00).contains(&hi) {
            if self.s.get(self.i..self.i + 2) == Some(b"\\u") {
                self.i += 2;
                let lo = self.hex4()?;
                if (0xDC00..0xE000).contains(&lo) {
                    let c = 0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00);
                    return char::from_u32(c).ok_or_else(|| self.err("invalid surrogate pair"));
                }
            }
            return Err(self.err("unpaired UTF-16 surrogate in \\u escape"));
        }
        if (0xDC00..0xE000).contains(&hi) {
            return Err(self.err("unpaired UTF-16 surrogate in \\u escape"));
        }
        char::from_u32(hi).ok_or_else(|| self.err("invalid \\u escape"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::string_slice)]
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_and_keeps_offsets() {
        let t = r#"{"a": [1, -2.5e3, true, null], "b": "x\"\u00e9\ud83d\ude00"}"#;
        let n = parse(t).unwrap();
        let a = n.get("a").unwrap();
        assert_eq!(&t[a.start as usize..a.end as usize], "[1, -2.5e3, true, null]");
        assert_eq!(n.get("b").unwrap().as_str(), Some("x\"é😀"));
        let e = n.entry("b").unwrap();
        assert_eq!(&t[e.key_start as usize..e.key_start as usize + 3], "\"b\"");
    }

    #[test]
    fn matches_serde_json_on_valid_input() {
        let t = r#"{"k": {"x": [0, 1e2, "\t", false], "y": {}}, "z": []}"#;
        let ours = parse(t).unwrap();
        let theirs: serde_json::Value = serde_json::from_str(t).unwrap();
        assert_eq!(to_serde(&ours), theirs);
    }

    fn to_serde(n: &Node) -> serde_json::Value {
        match &n.value {
            Value::Null => serde_json::Value::Null,
            Value::Bool(b) => serde_json::Value::Bool(*b),
            Value::Number(s) => serde_json::from_str(s).unwrap(),
            Value::String(s) => serde_json::Value::String(s.clone()),
            Value::Seq(v) => serde_json::Value::Array(v.iter().map(to_serde).collect()),
            Value::Map(m) => serde_json::Value::Object(m.iter().map(|e| (e.key.clone(), to_serde(&e.value))).collect()),
        }
    }

    #[test]
    fn errors_have_offsets() {
        for (t, off) in [
            ("{\"a\": }", 6),
            ("[1, 2", 5),
            ("{\"a\" 1}", 5),
            ("01", 1),
            ("\"abc", 4),
            ("{} x", 3),
            ("\"\\ud800\"", 7),
            ("", 0),
        ] {
            let e = parse(t).unwrap_err();
            assert_eq!(e.offset, off, "{t:?}: {e:?}");
        }
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        let t = "[".repeat(100_000);
        let e = parse(&t).unwrap_err();
        assert!(e.reason.contains("nesting"));
    }
}
