//! How a request finds its policy: Envoy route names, path templates, and the path as
//! frameworks route it (normalised, aliases folded).

use super::{Bundle, RouteId};
use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matcher {
    /// Matches the Envoy route whose `name` is this (`xds.route_name`).
    RouteName(String),
    /// Matches a method (or any) and a path template.
    Request { method: Option<String>, path: PathTemplate },
}

/// A path template: literal segments and `{param}` segments that match one non-empty segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    pub source: String,
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    /// `{name}`: one non-empty segment.
    Param(String),
}

impl PathTemplate {
    pub fn parse(source: &str) -> Result<Self, String> {
        if !source.starts_with('/') {
            return Err(format!("path {source:?} must start with '/'"));
        }
        if source.contains('?') || source.contains('#') {
            return Err(format!("path {source:?} must not contain a query or fragment"));
        }
        let mut segments = Vec::new();
        for seg in source.split('/').filter(|s| !s.is_empty()) {
            if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')).filter(|n| !n.is_empty()) {
                if !super::is_param_name(name) {
                    return Err(format!(
                        "path {source:?}: parameter {{{name}}} must be a name of letters, digits, '_', '-' or '.'"
                    ));
                }
                if segments.iter().any(|s| matches!(s, Segment::Param(n) if n == name)) {
                    return Err(format!("path {source:?}: parameter {{{name}}} appears twice"));
                }
                segments.push(Segment::Param(name.to_string()));
            } else if seg.contains('{') || seg.contains('}') {
                return Err(format!(
                    "path {source:?}: a template parameter must be a whole segment, like /orders/{{id}}"
                ));
            } else {
                segments.push(Segment::Literal(seg.to_string()));
            }
        }
        Ok(PathTemplate { source: source.to_string(), segments })
    }

    fn is_exact(&self) -> bool {
        self.segments.iter().all(|s| matches!(s, Segment::Literal(_)))
    }

    /// Matches a request path (without the query string), after [`normalize_path`]: literal
    /// segments compare ignoring ASCII case, since many frameworks route `/Create` and `/create/`
    /// to the same handler, and a policy that such an alias slips past runs the business twice.
    pub fn matches(&self, path: &str) -> bool {
        self.matches_segments(&normalize_path(path))
    }

    /// [`PathTemplate::matches`] on a path already normalised (once for every template).
    fn matches_segments(&self, segments: &[Cow<'_, str>]) -> bool {
        segments.len() == self.segments.len()
            && self.segments.iter().zip(segments).all(|(seg, p)| match seg {
                Segment::Literal(lit) => lit.eq_ignore_ascii_case(p),
                Segment::Param(_) => !p.is_empty(),
            })
    }

    /// Whether the template has the parameter `{name}`.
    pub fn has_param(&self, name: &str) -> bool {
        self.segments.iter().any(|s| matches!(s, Segment::Param(n) if n == name))
    }

    /// The value of parameter `{name}` in a request path (query string allowed), percent-decoded:
    /// `Ok(None)` when the path does not match the template or the segment is absent, `Err` when the
    /// decoded value is not UTF-8.
    pub fn param(&self, path: &str, name: &str) -> Result<Option<String>, std::string::FromUtf8Error> {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        let segments = normalize_path(bare);
        if !self.matches_segments(&segments) {
            return Ok(None);
        }
        let Some(i) = self.segments.iter().position(|s| matches!(s, Segment::Param(n) if n == name)) else {
            return Ok(None);
        };
        let Some(raw) = segments.get(i) else {
            return Ok(None);
        };
        let bytes = percent_decode(raw.as_bytes());
        String::from_utf8(bytes).map(Some)
    }

    /// The shape used to detect two templates that match the same paths.
    fn shape(&self) -> Vec<Option<String>> {
        self.segments
            .iter()
            .map(|s| match s {
                Segment::Literal(l) => Some(l.to_ascii_lowercase()),
                Segment::Param(_) => None,
            })
            .collect()
    }
}

/// The bytes a percent-encoded value carries as they are: `A-Z a-z 0-9 - _ ~`.
const UNRESERVED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'-' || c == b'_' || c == b'~';
        b += 1;
    }
    table
};

/// Appends `value` percent-encoded: every byte but the unreserved `A-Z a-z 0-9 - _ ~` (so `/`,
/// `.`, `%`, `?` and `#` too), upper-case hex. What a lookup's placeholder and a Webdis argument
/// both need: the value stays one path segment, whatever it holds.
pub fn percent_encode_into(out: &mut String, value: &str) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    // Runs of unreserved bytes are copied whole (a stored answer's base64 is mostly one run);
    // such a run is ASCII, so it starts and ends on character boundaries.
    let mut run = 0;
    for (i, b) in value.bytes().enumerate() {
        if UNRESERVED[usize::from(b)] {
            continue;
        }
        out.push_str(value.get(run..i).unwrap_or_default());
        out.push('%');
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 15)]));
        run = i + 1;
    }
    out.push_str(value.get(run..).unwrap_or_default());
}

/// Every `%XX` decoded (a path parameter is the value the framework hands its handler).
pub fn percent_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (bytes[i], bytes.get(i + 1).and_then(|&b| hex(b)), bytes.get(i + 2).and_then(|&b| hex(b))) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

/// A request path as the policy matcher sees it: its segments, with percent-encoded unreserved
/// characters decoded (`%63reate` is `create`), empty segments dropped (`//` and a trailing `/`)
/// and `.`/`..` resolved. Envoy's `normalize_path` and `merge_slashes` do the same before routing;
/// doing it here too keeps a policy from being bypassed where the listener lacks them.
pub fn normalize_path(path: &str) -> Vec<Cow<'_, str>> {
    let mut out: Vec<Cow<'_, str>> = Vec::new();
    for raw in path.split('/') {
        let seg = decode_unreserved(raw);
        match seg.as_ref() {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            _ => out.push(seg),
        }
    }
    out
}

/// Decodes `%XX` only where it stands for an unreserved character (RFC 3986 §2.3); other escapes
/// (`%2F`, `%20`, …) stay, with their hex digits in upper case (RFC 3986 §6.2.2.1: `%2f` and
/// `%2F` are one path, so one fingerprint).
fn decode_unreserved(seg: &str) -> Cow<'_, str> {
    if !seg.contains('%') {
        return Cow::Borrowed(seg);
    }
    let bytes = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = (bytes[i] == b'%')
            .then(|| seg.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .filter(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
        let escape = (bytes[i] == b'%')
            .then(|| seg.get(i + 1..i + 3))
            .flatten()
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()));
        match (decoded, escape) {
            (Some(b), _) => {
                out.push(char::from(b));
                i += 3;
            }
            (None, Some(hex)) => {
                out.push('%');
                out.push_str(&hex.to_ascii_uppercase());
                i += 3;
            }
            (None, None) => {
                let ch_len = seg.get(i..).and_then(|r| r.chars().next()).map_or(1, char::len_utf8);
                out.push_str(seg.get(i..i + ch_len).unwrap_or(""));
                i += ch_len;
            }
        }
    }
    Cow::Owned(out)
}

impl Bundle {
    /// The policy for a request, by Envoy route name first, then exact paths, then templates.
    /// `method` and `route_name` are only asked for when a candidate needs them: a request that
    /// no policy can match costs one look at its path.
    pub fn find(
        &self,
        method: impl FnOnce() -> String,
        path: &str,
        route_name: impl FnOnce() -> Option<String>,
    ) -> Option<RouteId> {
        let path = path.split(['?', '#']).next().unwrap_or(path);
        let segments = normalize_path(path);
        if self.routes.iter().any(|r| matches!(r.matcher, Matcher::RouteName(_))) {
            if let Some(name) = route_name() {
                let hit = self.routes.iter().position(|r| matches!(&r.matcher, Matcher::RouteName(n) if *n == name));
                if let Some(i) = hit {
                    return self.route_at(i);
                }
            }
        }
        let mut method = Some(method);
        let mut actual: Option<String> = None;
        for exact in [true, false] {
            for (i, r) in self.routes.iter().enumerate() {
                let Matcher::Request { method: wanted, path: t } = &r.matcher else {
                    continue;
                };
                if t.is_exact() != exact || !t.matches_segments(&segments) {
                    continue;
                }
                let Some(wanted) = wanted else {
                    return self.route_at(i);
                };
                if actual.is_none() {
                    actual = method.take().map(|f| f());
                }
                // Methods are case-sensitive in HTTP, but frameworks upper-case them (an HTTP/2
                // `:method: post` runs the POST handler), so the policy must match it too.
                if actual.as_deref().is_some_and(|a| a.eq_ignore_ascii_case(wanted)) {
                    return self.route_at(i);
                }
            }
        }
        None
    }
}

impl Matcher {
    /// The request path as the fingerprint sees it: [`normalize_path`]'s segments, with the
    /// segments a template names literally written as the template writes them. Aliases of one
    /// endpoint (`/Create/`, `%63reate`) are the same request; parameter values keep their case.
    pub fn canonical_path(&self, path: &str) -> String {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        let mut segments = normalize_path(bare);
        if let Matcher::Request { path: t, .. } = self {
            if t.matches_segments(&segments) {
                for (seg, lit) in segments.iter_mut().zip(&t.segments) {
                    if let Segment::Literal(l) = lit {
                        *seg = Cow::Borrowed(l.as_str());
                    }
                }
            }
        }
        let mut out = String::with_capacity(bare.len());
        for seg in &segments {
            out.push('/');
            out.push_str(seg);
        }
        if out.is_empty() {
            out.push('/');
        }
        out
    }

    /// Whether two matchers match the same requests (two such routes cannot share a bundle).
    pub fn conflicts_with(&self, other: &Matcher) -> bool {
        match (self, other) {
            (Matcher::RouteName(x), Matcher::RouteName(y)) => x == y,
            (Matcher::Request { method: ma, path: pa }, Matcher::Request { method: mb, path: pb }) => {
                let methods_overlap = match (ma, mb) {
                    (Some(x), Some(y)) => x == y,
                    _ => true,
                };
                methods_overlap && pa.shape() == pb.shape()
            }
            _ => false,
        }
    }
}
