//! One policy file: the filter's validated model of it and the byte ranges of its fields
//! (read by a thin serde mirror of the TOML, which only records spans), and positions in it.

use std::ops::Range;

use idem_filter::policy::{parse_bundle_all, Bundle, PolicyError};
use serde::Deserialize;
use toml::Spanned;

use crate::source::{position_of, FatalError, FatalErrors, Position, SourceFile};

/// One policy file: its text, the filter's validated model and where its fields are.
#[derive(Debug)]
pub struct PolicyFile {
    pub source: SourceFile,
    pub bundle: Bundle,
    /// Spans of the fields of each route, in the order of `bundle.routes`.
    pub spans: Vec<RouteSpans>,
    /// Spans of the `[shared]` and `[redis]` tables when the file has them.
    pub shared_span: Option<Range<usize>>,
    pub redis_span: Option<Range<usize>>,
}

/// Byte ranges of the fields of one `[[route]]` (None when the field is absent and the
/// filter's default applies).
#[derive(Debug, Clone, Default)]
pub struct RouteSpans {
    pub name: Range<usize>,
    pub matcher: Option<Range<usize>>,
    pub method: Option<Range<usize>>,
    pub path: Option<Range<usize>>,
    pub mode: Option<Range<usize>>,
    pub key: Option<Range<usize>>,
    pub key_from: Option<Range<usize>>,
    pub key_name: Option<Range<usize>>,
    pub key_parts: Option<Range<usize>>,
    pub key_scope: Option<Range<usize>>,
    pub on_completed: Option<Range<usize>>,
    pub token: Option<Range<usize>>,
    pub token_header: Option<Range<usize>>,
    pub token_issue_path: Option<Range<usize>>,
    pub duplicate: Option<Range<usize>>,
    pub duplicate_status: Option<Range<usize>>,
    pub duplicate_code: Option<Range<usize>>,
}

// ---- the thin mirror: only spans, no validation (the filter's parser has done that) ----

#[derive(Deserialize, Default)]
struct MirrorDoc {
    #[serde(default)]
    route: Vec<MirrorRoute>,
    shared: Option<Spanned<toml::Value>>,
    redis: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
struct MirrorRoute {
    name: Spanned<String>,
    #[serde(rename = "match")]
    matcher: Option<Spanned<MirrorMatch>>,
    mode: Option<Spanned<String>>,
    key: Option<Spanned<MirrorKey>>,
    token: Option<Spanned<MirrorToken>>,
    duplicate: Option<Spanned<MirrorDuplicate>>,
}

#[derive(Deserialize)]
struct MirrorMatch {
    method: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct MirrorKey {
    from: Option<Spanned<String>>,
    name: Option<Spanned<String>>,
    parts: Option<Spanned<toml::Value>>,
    scope: Option<Spanned<toml::Value>>,
    on_completed: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct MirrorToken {
    header: Option<Spanned<String>>,
    issue_path: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct MirrorDuplicate {
    status: Option<Spanned<toml::Value>>,
    code: Option<Spanned<String>>,
}

fn span<T>(s: &Option<Spanned<T>>) -> Option<Range<usize>> {
    s.as_ref().map(Spanned::span)
}

fn spans_of(r: &MirrorRoute) -> RouteSpans {
    let m = r.matcher.as_ref().map(Spanned::get_ref);
    let k = r.key.as_ref().map(Spanned::get_ref);
    let t = r.token.as_ref().map(Spanned::get_ref);
    let d = r.duplicate.as_ref().map(Spanned::get_ref);
    RouteSpans {
        name: r.name.span(),
        matcher: span(&r.matcher),
        method: m.and_then(|m| span(&m.method)),
        path: m.and_then(|m| span(&m.path)),
        mode: span(&r.mode),
        key: span(&r.key),
        key_from: k.and_then(|k| span(&k.from)),
        key_name: k.and_then(|k| span(&k.name)),
        key_parts: k.and_then(|k| span(&k.parts)),
        key_scope: k.and_then(|k| span(&k.scope)),
        on_completed: k.and_then(|k| span(&k.on_completed)),
        token: span(&r.token),
        token_header: t.and_then(|t| span(&t.header)),
        token_issue_path: t.and_then(|t| span(&t.issue_path)),
        duplicate: span(&r.duplicate),
        duplicate_status: d.and_then(|d| span(&d.status)),
        duplicate_code: d.and_then(|d| span(&d.code)),
    }
}

/// A policy error as the linter reports it: exit 2, `file:line:col: message`, exactly the
/// filter's message and position.
pub fn fatal(e: &PolicyError, text: &str) -> FatalError {
    let position = match (e.line, e.column) {
        (Some(line), Some(column)) => {
            let line_text = text.lines().nth(line.saturating_sub(1)).unwrap_or("");
            let column_utf16 = line_text.chars().take(column.saturating_sub(1)).map(char::len_utf16).sum::<usize>() + 1;
            Some(Position { line, column, column_utf16 })
        }
        (Some(line), None) => Some(Position { line, column: 1, column_utf16: 1 }),
        _ => None,
    };
    FatalError { file: e.origin.clone(), position, reason: e.message.replace('\n', " ") }
}

impl PolicyFile {
    /// Parses one policy file (TOML, or JSON when it starts with `{`; JSON files carry no
    /// field spans and findings then point at their first line).
    pub fn parse(name: &str, text: &str) -> Result<PolicyFile, FatalErrors> {
        PolicyFile::parse_with(name, text, &toml::Table::new())
    }

    /// Parses a file with the bundle-wide tables another file states (`[redis]` in a file of
    /// its own, say), appended after its own text when it lacks them: errors in the file itself
    /// keep their positions.
    pub fn parse_with(name: &str, text: &str, bundle_tables: &toml::Table) -> Result<PolicyFile, FatalErrors> {
        let own: Option<toml::Table> = toml::from_str(text).ok();
        let missing: toml::Table = match &own {
            Some(own) => bundle_tables
                .iter()
                .filter(|(k, _)| !own.contains_key(*k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            None => toml::Table::new(),
        };
        let full = if missing.is_empty() || text.trim_start().starts_with('{') {
            text.to_string()
        } else {
            format!("{text}\n{}", toml::to_string(&missing).unwrap_or_default())
        };
        let bundle = parse_bundle_all(&full, name)
            .map_err(|errors| FatalErrors(errors.iter().map(|e| fatal(e, &full)).collect()))?;
        let mirror: MirrorDoc = if text.trim_start().starts_with('{') {
            MirrorDoc::default()
        } else {
            toml::from_str(text).map_err(|e| {
                FatalError::at(name, text, e.span().map_or(0, |s| s.start), format!("invalid policy: {}", e.message()))
            })?
        };
        let mut spans: Vec<RouteSpans> = mirror.route.iter().map(spans_of).collect();
        spans.resize(bundle.routes.len(), RouteSpans::default());
        Ok(PolicyFile {
            source: SourceFile::new(name.to_string(), text.to_string()),
            bundle,
            spans,
            shared_span: span(&mirror.shared),
            redis_span: span(&mirror.redis),
        })
    }

    pub fn name(&self) -> &str {
        &self.source.name
    }

    pub fn position(&self, span: &Range<usize>) -> Position {
        position_of(&self.source.text, span.start)
    }

    /// `file:line:col` of a span, for messages that name another place.
    pub(super) fn at(&self, span: &Range<usize>) -> String {
        let p = self.position(span);
        format!("{}:{}:{}", self.name(), p.line, p.column)
    }
}

/// A fatal error at a span of a policy file.
pub(super) fn fatal_at(f: &PolicyFile, span: &Range<usize>, reason: String) -> FatalError {
    FatalError::at(f.name(), &f.source.text, span.start, reason)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn spans_point_at_fields() {
        let text = "[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/a\" }\n\n[route.key]\nfrom = \"body\"\nname = \"/id\"\n\n[route.duplicate]\nstatus = 200\ncode = \"OK\"\n";
        let f = PolicyFile::parse("p.toml", text).unwrap();
        let s = &f.spans[0];
        let at = |r: &Option<Range<usize>>| {
            let p = f.position(r.as_ref().unwrap());
            (p.line, p.column)
        };
        assert_eq!(at(&s.path), (3, 35));
        assert_eq!(at(&s.key_from), (6, 8));
        assert_eq!(at(&s.key_name), (7, 8));
        assert_eq!(at(&s.duplicate_status), (10, 10));
        assert_eq!(at(&s.duplicate_code), (11, 8));
        assert_eq!(s.mode, None);
    }
}
