//! `[route.reconcile]`: when a repeat meets an unknown outcome (the first attempt was forwarded and
//! no answer came back), the gateway asks the service whether it ran, by a `GET` of `lookup`.

use super::PART_SEPARATOR;
use super::{percent_encode_into, Duration, StatusSet};
use serde::{Deserialize, Deserializer};

/// The longest a lookup may take: the repeat waits for it.
pub const MAX_LOOKUP_TIMEOUT_MS: u64 = 60_000;

/// `[route.reconcile]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Reconcile {
    /// The lookup's path (and query), with placeholders for the client's key: `{key}` (a one-part
    /// key) or `{key.1}` … `{key.8}` (a composite key's parts), each percent-encoded whole (`/`,
    /// `.`, `%` included), so no key can change the path: `"/orders/by-key/{key}"`.
    pub lookup: LookupPath,
    /// The Envoy cluster asked; the route's own cluster (`xds.cluster_name`) if unset.
    #[serde(default, deserialize_with = "super::fields::de_opt_nonempty")]
    pub cluster: Option<String>,
    /// The lookup's `:authority`; the request's own if unset.
    #[serde(default, deserialize_with = "super::fields::de_opt_nonempty")]
    pub authority: Option<String>,
    /// How long the gateway waits for the lookup's answer (at most 60s); no answer in time is a
    /// failed lookup: the repeat gets 409 `IDEMPOTENCY_OUTCOME_UNKNOWN` as without a lookup.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// Statuses that say the first attempt ran: the lookup's answer becomes the key's stored
    /// answer, replayed to this repeat and the later ones.
    #[serde(default = "default_ran")]
    pub ran: Vec<StatusSet>,
    /// Statuses that say it did not run: the key is released and the repeat runs as the first
    /// request.
    #[serde(default = "default_absent")]
    pub absent: Vec<StatusSet>,
}

fn default_timeout() -> Duration {
    Duration::from_secs(2)
}
fn default_ran() -> Vec<StatusSet> {
    vec![StatusSet::Code(200)]
}
fn default_absent() -> Vec<StatusSet> {
    vec![StatusSet::Code(404)]
}

/// What a lookup's status says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    Ran,
    Absent,
    /// Neither (or no answer): the outcome stays unknown.
    Failed,
}

impl Reconcile {
    pub fn found(&self, status: u16) -> Found {
        if status == 0 {
            Found::Failed
        } else if self.ran.iter().any(|s| s.contains(status)) {
            Found::Ran
        } else if self.absent.iter().any(|s| s.contains(status)) {
            Found::Absent
        } else {
            Found::Failed
        }
    }

    /// Checks the table against the route's key (`parts` is how many parts it has).
    pub fn check(&self, parts: usize) -> Result<(), String> {
        if self.timeout.millis == 0 || self.timeout.millis > MAX_LOOKUP_TIMEOUT_MS {
            return Err("`timeout` must be positive and at most 60s (the repeat waits for the lookup)".into());
        }
        if self.ran.is_empty() || self.absent.is_empty() {
            return Err("`ran` and `absent` each need at least one status".into());
        }
        for status in 100..600 {
            if self.ran.iter().any(|s| s.contains(status)) && self.absent.iter().any(|s| s.contains(status)) {
                return Err(format!("status {status} is in both `ran` and `absent`"));
            }
        }
        for piece in &self.lookup.0 {
            match *piece {
                Piece::Key if parts > 1 => {
                    return Err(format!(
                        "`lookup` uses {{key}} but the key has {parts} parts: name them {{key.1}} … {{key.{parts}}}"
                    ))
                }
                Piece::Part(n) if n > parts => {
                    return Err(format!("`lookup` uses {{key.{n}}} but the key has {parts} part(s)"))
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// A lookup path: literal text and the key's placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupPath(Vec<Piece>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    /// `{key}`: the whole (one-part) key.
    Key,
    /// `{key.N}`: part N of a composite key, from 1.
    Part(usize),
}

impl LookupPath {
    pub fn parse(s: &str) -> Result<LookupPath, String> {
        if !s.starts_with('/') {
            return Err(format!("`lookup` {s:?} must be a path starting with '/'"));
        }
        if let Some(c) = s.chars().find(|c| !c.is_ascii_graphic() || *c == '#') {
            return Err(format!(
                "`lookup` {s:?} holds {c:?}: write a path and query, percent-encoded, without a fragment"
            ));
        }
        let unopened = || format!("`lookup` {s:?}: '}}' without '{{'");
        let mut pieces = Vec::new();
        let mut rest = s;
        while let Some((text, after)) = rest.split_once('{') {
            if text.contains('}') {
                return Err(unopened());
            }
            if !text.is_empty() {
                pieces.push(Piece::Text(text.to_string()));
            }
            let (name, tail) = after.split_once('}').ok_or_else(|| format!("`lookup` {s:?}: '{{' without '}}'"))?;
            pieces.push(match name {
                "key" => Piece::Key,
                _ => match name.strip_prefix("key.").and_then(|n| n.parse::<usize>().ok()) {
                    Some(n) if (1..=8).contains(&n) => Piece::Part(n),
                    _ => {
                        return Err(format!(
                            "`lookup` {s:?}: unknown placeholder {{{name}}} (use {{key}}, or {{key.1}} … {{key.8}})"
                        ))
                    }
                },
            });
            rest = tail;
        }
        if rest.contains('}') {
            return Err(unopened());
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        if !pieces.iter().any(|p| matches!(p, Piece::Key | Piece::Part(_))) {
            return Err(format!("`lookup` {s:?} names no part of the key ({{key}} or {{key.N}})"));
        }
        Ok(LookupPath(pieces))
    }

    /// The path for the client's key (parts joined with [`PART_SEPARATOR`], as `key::extract`
    /// returns it). Every placeholder's bytes but `A-Z a-z 0-9 - _ ~` are percent-encoded: a key
    /// holding `/`, `..`, `%2F` or `%00` stays inside its one path segment.
    pub fn render(&self, key: &str) -> String {
        let parts: Vec<&str> = key.split(PART_SEPARATOR).collect();
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Key => percent_encode_into(&mut out, key),
                Piece::Part(n) => percent_encode_into(&mut out, parts.get(n - 1).copied().unwrap_or("")),
            }
        }
        out
    }
}

impl<'de> Deserialize<'de> for LookupPath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        LookupPath::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for LookupPath {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LookupPath".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^/",
            "description": "A path and query with {key} or {key.N} placeholders, e.g. /orders/by-key/{key}"
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;

    #[test]
    fn a_key_cannot_leave_its_segment() {
        let p = LookupPath::parse("/orders/by-key/{key}?v=1").unwrap();
        for (key, want) in [
            ("ord-1", "/orders/by-key/ord-1?v=1"),
            ("../admin", "/orders/by-key/%2E%2E%2Fadmin?v=1"),
            ("a/b", "/orders/by-key/a%2Fb?v=1"),
            ("%00x", "/orders/by-key/%2500x?v=1"),
            ("..", "/orders/by-key/%2E%2E?v=1"),
            ("x?y=1&z#f", "/orders/by-key/x%3Fy%3D1%26z%23f?v=1"),
            ("café", "/orders/by-key/caf%C3%A9?v=1"),
        ] {
            assert_eq!(p.render(key), want, "{key:?}");
        }
    }

    #[test]
    fn parts_are_named_by_position() {
        let p = LookupPath::parse("/m/{key.1}/trades/{key.2}").unwrap();
        let key = format!("mch/1{PART_SEPARATOR}T 9");
        assert_eq!(p.render(&key), "/m/mch%2F1/trades/T%209");
    }

    #[test]
    fn malformed_lookups_are_refused_with_the_reason() {
        for (s, says) in [
            ("orders/{key}", "starting with '/'"),
            ("/orders/{id}", "unknown placeholder {id}"),
            ("/orders/{key", "without '}'"),
            ("/orders/key}", "without '{'"),
            ("/orders/all", "names no part of the key"),
            ("/orders/{key.9}", "unknown placeholder"),
            ("/orders /{key}", "holds ' '"),
            ("/orders/{key}#x", "without a fragment"),
        ] {
            match LookupPath::parse(s) {
                Ok(_) => panic!("{s:?} parsed"),
                Err(e) => assert!(e.contains(says), "{s:?}: {e}"),
            }
        }
    }
}
