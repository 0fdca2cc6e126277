//! Reading one value out of a JSON body by JSON pointer, exactly.
//!
//! Keys taken from a body must be the client's value byte for byte: going through `f64` merges
//! two 20-digit transaction ids into one claim (the second transaction is answered with the
//! first's stored answer and never runs), and turns `1001`, `1001.0` and `1.001e3` into three
//! keys. So the walk keeps each level as raw text ([`serde_json::value::RawValue`]) and a number
//! leaf is canonicalised from its decimal text, never through floating point. A member name
//! that appears twice on the way is ambiguous (the upstream's parser may pick the other one).

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;

/// A scalar at the end of a pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leaf {
    String(String),
    /// The canonical decimal text (see [`canonical_number`]).
    Number(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointerError {
    /// The body does not parse as JSON.
    NotJson(String),
    /// An object on the way names this member more than once.
    Ambiguous(String),
}

/// The string or number at `pointer` (RFC 6901), `Ok(None)` when there is none (absent, or an
/// object, array, boolean or null).
pub fn at_pointer(body: &[u8], pointer: &str) -> Result<Option<Leaf>, PointerError> {
    let Some(value) = walk(body, pointer)? else {
        return Ok(None);
    };
    let raw = value.get().trim();
    if raw.starts_with('"') {
        let s: String = serde_json::from_str(raw).map_err(not_json)?;
        return Ok(Some(Leaf::String(s)));
    }
    if raw.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
        return Ok(canonical_number(raw).map(Leaf::Number));
    }
    Ok(None)
}

/// The canonical text of a whole JSON document: see [`canonical_at`].
pub fn canonical(body: &[u8]) -> Result<Vec<u8>, PointerError> {
    Ok(canonical_at(body, "")?.unwrap_or_default())
}

/// The canonical text of the value at `pointer` (`""`: the whole document), `Ok(None)` when
/// there is none: objects with their members sorted by name, arrays in order, numbers by
/// [`canonical_number`] (never through floating point: `1.0` and `1` are one number, two
/// 20-digit ids that differ in the last digit are two), strings re-escaped the one way
/// `serde_json` writes them, no whitespace. A member named twice anywhere is ambiguous.
pub fn canonical_at(body: &[u8], pointer: &str) -> Result<Option<Vec<u8>>, PointerError> {
    let Some(value) = walk(body, pointer)? else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(value.get().len());
    write_canonical(value, &mut out)?;
    Ok(Some(out))
}

fn not_json(e: serde_json::Error) -> PointerError {
    PointerError::NotJson(e.to_string())
}

/// The value at `pointer`, as raw text.
fn walk<'b>(body: &'b [u8], pointer: &str) -> Result<Option<&'b RawValue>, PointerError> {
    let text = std::str::from_utf8(body).map_err(|e| PointerError::NotJson(e.to_string()))?;
    let mut cur: &RawValue = serde_json::from_str(text).map_err(not_json)?;
    for token in pointer.split('/').skip(1) {
        let token = token.replace("~1", "/").replace("~0", "~");
        let raw = cur.get().trim_start();
        if raw.starts_with('{') {
            let Members(members) = serde_json::from_str(raw).map_err(not_json)?;
            let mut hits = members.into_iter().filter(|(name, _)| *name == token);
            let Some((_, value)) = hits.next() else {
                return Ok(None);
            };
            if hits.next().is_some() {
                return Err(PointerError::Ambiguous(token));
            }
            cur = value;
        } else if raw.starts_with('[') {
            let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(not_json)?;
            let index = (token == "0" || (!token.starts_with('0') && !token.is_empty()))
                .then(|| token.parse::<usize>().ok())
                .flatten();
            match index.and_then(|i| items.get(i)) {
                Some(v) => cur = v,
                None => return Ok(None),
            }
        } else {
            return Ok(None);
        }
    }
    Ok(Some(cur))
}

fn write_canonical(value: &RawValue, out: &mut Vec<u8>) -> Result<(), PointerError> {
    let raw = value.get().trim();
    match raw.as_bytes().first() {
        Some(b'{') => {
            let Members(mut members) = serde_json::from_str(raw).map_err(not_json)?;
            members.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(w) = members.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(PointerError::Ambiguous(w[0].0.clone()));
            }
            out.push(b'{');
            for (i, (name, v)) in members.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                serde_json::to_writer(&mut *out, name).map_err(not_json)?;
                out.push(b':');
                write_canonical(v, out)?;
            }
            out.push(b'}');
        }
        Some(b'[') => {
            let items: Vec<&RawValue> = serde_json::from_str(raw).map_err(not_json)?;
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out)?;
            }
            out.push(b']');
        }
        Some(b'"') => {
            let s: String = serde_json::from_str(raw).map_err(not_json)?;
            serde_json::to_writer(&mut *out, &s).map_err(not_json)?;
        }
        Some(b'-' | b'0'..=b'9') => {
            let n = canonical_number(raw).ok_or_else(|| PointerError::NotJson(format!("number {raw} out of range")))?;
            out.extend_from_slice(n.as_bytes());
        }
        _ => out.extend_from_slice(raw.as_bytes()), // true, false, null
    }
    Ok(())
}

/// A JSON number's value as canonical decimal text, computed on its digits: `1001`, `1001.0`,
/// `1.001e3` and `10010e-1` are all `1001`; `-0` is `0`; `0.50` is `0.5`. Values whose digits
/// would run past 40 places are written `<digits>e<exponent>` (`1e400`). `None` for text that is
/// not a JSON number, or an exponent beyond 18 digits (no key is that).
fn canonical_number(text: &str) -> Option<String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (unsigned.get(..i)?, Some(unsigned.get(i + 1..)?)),
        None => (unsigned, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) => (i, f),
        None => (mantissa, ""),
    };
    let digits_ok = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits_ok(int) || (mantissa.contains('.') && !digits_ok(frac)) || (int.len() > 1 && int.starts_with('0')) {
        return None;
    }
    let mut exp: i64 = match exponent {
        None => 0,
        Some(e) => {
            let unsigned_e = e.strip_prefix(['+', '-']).unwrap_or(e);
            if !digits_ok(unsigned_e) || unsigned_e.len() > 18 {
                return None;
            }
            e.parse().ok()?
        }
    };
    exp -= frac.len() as i64;
    let all: String = format!("{int}{frac}");
    let trimmed = all.trim_start_matches('0');
    let significant = trimmed.trim_end_matches('0');
    if significant.is_empty() {
        return Some("0".into());
    }
    exp += (trimmed.len() - significant.len()) as i64;
    const MAX_PLACES: i64 = 40;
    let len = significant.len() as i64;
    let body = if exp >= 0 && len + exp <= MAX_PLACES {
        format!("{significant}{}", "0".repeat(exp as usize))
    } else if exp < 0 && -exp <= MAX_PLACES {
        let point = len + exp;
        if point > 0 {
            let (a, b) = significant.split_at(point as usize);
            format!("{a}.{b}")
        } else {
            format!("0.{}{significant}", "0".repeat((-point) as usize))
        }
    } else {
        format!("{significant}e{exp}")
    };
    Some(if negative { format!("-{body}") } else { body })
}

/// An object's members in document order, duplicates kept.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Members<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Members<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn numbers_are_exact_and_canonical() {
        for (a, b) in [("1001", "1001"), ("1001.0", "1001"), ("1.001e3", "1001"), ("10010e-1", "1001")] {
            assert_eq!(canonical_number(a).as_deref(), Some(b), "{a}");
        }
        assert_ne!(canonical_number("12345678901234567890"), canonical_number("12345678901234567891"));
        assert_eq!(canonical_number("12345678901234567890").as_deref(), Some("12345678901234567890"));
        assert_eq!(canonical_number("-0").as_deref(), Some("0"));
        assert_eq!(canonical_number("0.50").as_deref(), Some("0.5"));
        assert_eq!(canonical_number("-0.0012").as_deref(), Some("-0.0012"));
        assert_eq!(canonical_number("1e400").as_deref(), Some("1e400"));
        assert_eq!(canonical_number("1E+2").as_deref(), Some("100"));
        assert_eq!(canonical_number("1e9999999999999999999"), None);
        assert_eq!(canonical_number("01"), None);
    }

    #[test]
    fn pointer_walks_raw_text() {
        let body = br#"{"a":{"b":[10, {"c":"x"}]},"n":123456789012345678901234}"#;
        assert_eq!(at_pointer(body, "/a/b/1/c"), Ok(Some(Leaf::String("x".into()))));
        assert_eq!(at_pointer(body, "/a/b/0"), Ok(Some(Leaf::Number("10".into()))));
        assert_eq!(at_pointer(body, "/n"), Ok(Some(Leaf::Number("123456789012345678901234".into()))));
        assert_eq!(at_pointer(body, "/a/b/01"), Ok(None));
        assert_eq!(at_pointer(body, "/a"), Ok(None));
        assert_eq!(at_pointer(br#"{"id":1,"id":2}"#, "/id"), Err(PointerError::Ambiguous("id".into())));
        assert!(matches!(at_pointer(b"{", "/id"), Err(PointerError::NotJson(_))));
        assert!(matches!(at_pointer(b"\xff", "/id"), Err(PointerError::NotJson(_))));
    }

    #[test]
    fn canonical_text_is_exact_and_sorted() {
        let c = |s: &str| String::from_utf8(canonical(s.as_bytes()).unwrap()).unwrap();
        assert_eq!(
            c(r#" { "b" : [1.0, 1e2, "x\u0041"], "a": {"z": null, "y": true} } "#),
            r#"{"a":{"y":true,"z":null},"b":[1,100,"xA"]}"#
        );
        assert_ne!(c(r#"{"amount":12345678901234567890}"#), c(r#"{"amount":12345678901234567891}"#));
        assert_eq!(c(r#"{"amount":1001}"#), c(r#"{"amount":1.001e3}"#));
        assert_eq!(canonical(br#"{"a":{"id":1,"id":2}}"#), Err(PointerError::Ambiguous("id".into())));
        assert_eq!(
            canonical_at(br#"{"data":{"b":2,"a":1},"time":"t"}"#, "/data").unwrap().unwrap(),
            br#"{"a":1,"b":2}"#
        );
        assert_eq!(canonical_at(br#"{"data":1}"#, "/nothing").unwrap(), None);
    }
}
