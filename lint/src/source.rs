//! Source files and position arithmetic.
//!
//! Nodes store byte offsets; everything a user sees is derived here: 1-based line, 1-based
//! column in Unicode characters (text and JSON output), 1-based column in UTF-16 code units
//! (SARIF, GitHub annotations — what Spectral, Redocly and editors use), and the display width
//! of the text before the column (where a terminal caret has to go under CJK text).

use std::cell::OnceCell;
use std::fmt;

use unicode_width::UnicodeWidthChar;

/// One loaded file.
#[derive(Debug)]
pub struct SourceFile {
    /// The path as the user gave it (or as a `$ref` resolved it), used in every report.
    pub name: String,
    pub text: String,
    line_starts: OnceCell<Vec<u32>>,
}

/// A resolved position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Position {
    /// 1-based line.
    pub line: usize,
    /// 1-based column counted in Unicode scalar values.
    pub column: usize,
    /// 1-based column counted in UTF-16 code units.
    pub column_utf16: usize,
}

impl SourceFile {
    pub fn new(name: String, text: String) -> SourceFile {
        SourceFile { name, text, line_starts: OnceCell::new() }
    }

    fn line_starts(&self) -> &[u32] {
        self.line_starts.get_or_init(|| line_starts(&self.text))
    }

    /// Byte offset → line/column. Offsets past the end clamp to the end; offsets inside a
    /// character clamp to its start.
    pub fn position(&self, offset: u32) -> Position {
        position_in(&self.text, self.line_starts(), offset)
    }

    /// Positions of many offsets at once, in one forward pass per line (columns on a 20 MB
    /// one-line JSON file would otherwise cost a scan from the line start for every finding).
    /// The result is in the order of `offsets`.
    pub fn positions(&self, offsets: &[u32]) -> Vec<Position> {
        let starts = self.line_starts();
        let mut order: Vec<usize> = (0..offsets.len()).collect();
        order.sort_by_key(|&i| offsets[i]);
        let mut out = vec![Position { line: 1, column: 1, column_utf16: 1 }; offsets.len()];
        // (line index, byte offset reached, chars, utf16 units)
        let mut state: Option<(usize, usize, usize, usize)> = None;
        for i in order {
            let mut off = (offsets[i] as usize).min(self.text.len());
            while off > 0 && !self.text.is_char_boundary(off) {
                off -= 1;
            }
            let line_idx = match starts.binary_search(&(off as u32)) {
                Ok(k) => k,
                Err(k) => k.saturating_sub(1),
            };
            let (from, mut chars, mut units) = match state {
                Some((l, b, c, u)) if l == line_idx && b <= off => (b, c, u),
                _ => (starts.get(line_idx).copied().unwrap_or(0) as usize, 0, 0),
            };
            for ch in self.text.get(from..off).unwrap_or("").chars() {
                chars += 1;
                units += ch.len_utf16();
            }
            state = Some((line_idx, off, chars, units));
            out[i] = Position { line: line_idx + 1, column: chars + 1, column_utf16: units + 1 };
        }
        out
    }

    /// Byte range of a 1-based line without its line terminator.
    pub fn line_bounds(&self, line: usize) -> (usize, usize) {
        let starts = self.line_starts();
        let Some(&start) = starts.get(line.saturating_sub(1)) else {
            return (self.text.len(), self.text.len());
        };
        let mut end = starts.get(line).map(|&e| e as usize).unwrap_or(self.text.len());
        let bytes = self.text.as_bytes();
        while end > start as usize && matches!(bytes.get(end - 1), Some(b'\n' | b'\r')) {
            end -= 1;
        }
        (start as usize, end)
    }

    /// The text of a 1-based line without its line terminator.
    pub fn line_text(&self, line: usize) -> &str {
        let starts = self.line_starts();
        let Some(&start) = starts.get(line.saturating_sub(1)) else {
            return "";
        };
        let end = starts.get(line).map(|&e| e as usize).unwrap_or(self.text.len());
        let s = self.text.get(start as usize..end).unwrap_or("");
        s.trim_end_matches(['\n', '\r'])
    }
}

fn line_starts(text: &str) -> Vec<u32> {
    let mut v = vec![0u32];
    for (i, b) in text.bytes().enumerate() {
        if b == b'\n' {
            v.push((i + 1) as u32);
        }
    }
    v
}

fn position_in(text: &str, starts: &[u32], offset: u32) -> Position {
    let mut offset = (offset as usize).min(text.len());
    while offset > 0 && !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let idx = match starts.binary_search(&(offset as u32)) {
        Ok(i) => i,
        Err(i) => i.saturating_sub(1),
    };
    let start = starts.get(idx).copied().unwrap_or(0) as usize;
    let prefix = text.get(start..offset).unwrap_or("");
    Position {
        line: idx + 1,
        column: prefix.chars().count() + 1,
        column_utf16: prefix.chars().map(char::len_utf16).sum::<usize>() + 1,
    }
}

/// Position of a byte offset in a text that has no `SourceFile` yet (parse errors).
pub fn position_of(text: &str, offset: usize) -> Position {
    position_in(text, &line_starts(text), offset.min(u32::MAX as usize) as u32)
}

pub fn char_width(c: char) -> usize {
    if c == '\t' {
        4
    } else {
        c.width().unwrap_or(0)
    }
}

/// A fatal problem (usage, I/O, parse, `$ref`): exit status 2, reported as
/// `file:line:col: reason` on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FatalError {
    pub file: String,
    pub position: Option<Position>,
    pub reason: String,
}

impl FatalError {
    pub fn at(file: &str, text: &str, offset: usize, reason: impl Into<String>) -> FatalError {
        FatalError {
            file: file.to_string(),
            position: Some(position_of(text, offset)),
            reason: one_line(&reason.into()),
        }
    }

    pub fn whole_file(file: &str, reason: impl Into<String>) -> FatalError {
        FatalError { file: file.to_string(), position: None, reason: one_line(&reason.into()) }
    }
}

/// Every fatal error a step found (a policy set reports every file's errors in one run), each
/// printed on its own line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FatalErrors(pub Vec<FatalError>);

impl From<FatalError> for FatalErrors {
    fn from(e: FatalError) -> FatalErrors {
        FatalErrors(vec![e])
    }
}

impl fmt::Display for FatalErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, l) in s.lines().map(str::trim).filter(|l| !l.is_empty()).enumerate() {
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(l);
    }
    out
}

impl fmt::Display for FatalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(p) => write!(f, "{}:{}:{}: {}", self.file, p.line, p.column, self.reason),
            None => write!(f, "{}: {}", self.file, self.reason),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_after_cjk_and_astral() {
        // The reference case: Spectral says UTF-16 col 24 (1-based), code point col 23.
        let text = "a: 1\n      tags: [𠮷野家, 支付, BAD]\n";
        let f = SourceFile::new("t.yaml".into(), text.into());
        let off = text.find("BAD").unwrap_or(0) as u32;
        let p = f.position(off);
        assert_eq!(p.line, 2);
        assert_eq!(p.column, 23);
        assert_eq!(p.column_utf16, 24);
        let line = f.line_text(2);
        let prefix: String = line.chars().take(p.column - 1).collect();
        assert_eq!(prefix.chars().map(char_width).sum::<usize>(), 27, "display width: tabs 4, CJK 2");
    }

    #[test]
    fn batch_positions_match_single() {
        let text = "ab: 支付\n𠮷x: [1, 2]\nlast";
        let f = SourceFile::new("t".into(), text.into());
        let offs: Vec<u32> = vec![12, 0, 3, 9, 22, 16, 3, 200];
        let batch = f.positions(&offs);
        for (o, p) in offs.iter().zip(batch) {
            assert_eq!(f.position(*o), p, "offset {o}");
        }
    }

    #[test]
    fn line_text_strips_crlf_and_out_of_range_is_empty() {
        let f = SourceFile::new("t".into(), "x\r\ny".into());
        assert_eq!(f.line_text(1), "x");
        assert_eq!(f.line_text(2), "y");
        assert_eq!(f.line_text(3), "");
        assert_eq!(f.position(100).line, 2);
    }

    #[test]
    fn fatal_error_is_one_line() {
        let e = FatalError::at("a.yaml", "x\ny", 2, "bad\n  thing");
        assert_eq!(e.to_string(), "a.yaml:2:1: bad; thing");
    }
}
