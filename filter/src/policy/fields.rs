//! Field deserializers: each field validates its value, so the parser attaches the position
//! (line, column, field) to the error.

use super::{Duration, FingerprintPart, Source, StatusSet};
use serde::{de, Deserialize, Deserializer};

pub(super) fn de_route_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if ok {
        Ok(s)
    } else {
        Err(de::Error::custom(format!("invalid route name {s:?}: use 1 to 64 lower-case letters, digits, '-' or '_'")))
    }
}

/// Whether a shared-data namespace is acceptable: 1 to 128 of `A-Z a-z 0-9 . _ -` (`:` separates
/// the parts of a key, `/` appears in Envoy Gateway's names and is kept out for the same reason).
fn valid_namespace(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

pub(super) fn de_opt_namespace<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    if valid_namespace(&s) {
        Ok(Some(s))
    } else {
        Err(de::Error::custom(format!("invalid namespace {s:?}: use 1 to 128 letters, digits, '.', '_' or '-'")))
    }
}

pub(super) fn de_nonempty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        Err(de::Error::custom("must not be empty"))
    } else {
        Ok(s)
    }
}

pub(super) fn de_opt_nonempty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    de_nonempty(d).map(Some)
}

/// `host:port`, or several separated by commas (`[redis] direct`: a Redis Cluster's seed nodes),
/// each checked by [`split_address`].
pub(super) fn de_opt_address<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let s = String::deserialize(d)?;
    let bad = addresses(&s).find(|a| split_address(a).is_none()).map(str::to_string);
    match bad {
        None => Ok(Some(s)),
        Some(bad) => Err(de::Error::custom(format!(
            "{bad:?} is not host:port (for example \"127.0.0.1:6379\", or \"10.0.0.1:7000,10.0.0.2:7000\" for a \
             cluster's seed nodes)"
        ))),
    }
}

/// The addresses of a comma-separated list, each trimmed (`[redis] direct`).
pub fn addresses(list: &str) -> impl Iterator<Item = &str> {
    list.split(',').map(str::trim)
}

/// A `host:port` address split: the host a name, an IPv4 address or an `[IPv6]` one (no scheme,
/// path or space), the port 1 to 65535.
pub fn split_address(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|p| *p > 0)?;
    let bracketed = host.starts_with('[') && host.ends_with(']') && host.len() > 2;
    let plain = !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    (bracketed || plain).then_some((host, port))
}

fn ranged<'de, D: Deserializer<'de>>(d: D, min: u64, max: u64, what: &str) -> Result<u32, D::Error> {
    let v = u64::deserialize(d)?;
    if (min..=max).contains(&v) {
        Ok(v as u32)
    } else {
        Err(de::Error::custom(format!("{what} must be between {min} and {max}, got {v}")))
    }
}

pub(super) fn de_buckets<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, 1, 65536, "buckets")
}
pub(super) fn de_entries<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, 1, 64, "entries_per_bucket")
}
pub(super) fn de_response_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, 0, 16 << 20, "max_response_bytes")
}
pub(super) fn de_opt_body_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    ranged(d, 0, 16 << 20, "max_body_bytes").map(Some)
}
pub(super) fn de_opt_response_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    de_response_bytes(d).map(Some)
}

pub(super) fn de_duplicate_status<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    let v = u64::deserialize(d)?;
    if (200..=499).contains(&v) {
        Ok(v as u16)
    } else {
        Err(de::Error::custom(format!(
            "invalid duplicate status {v}: a duplicate is a business outcome, use 200-499 (never a 5xx)"
        )))
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(de::Error::custom)
    }
}

/// Parses `"250ms"`, `"30s"`, `"10m"`, `"24h"`, `"7d"`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "invalid duration {s:?}: expected a number and a unit, like \"250ms\", \"30s\", \"10m\", \"24h\" or \"7d\""
        )
    };
    let digits = s.bytes().take_while(|b| b.is_ascii_digit()).count();
    let (number, unit) = s.split_at(digits);
    let n: u64 = number.parse().map_err(|_| bad())?;
    let factor = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    n.checked_mul(factor).map(|millis| Duration { millis }).ok_or_else(bad)
}

impl<'de> Deserialize<'de> for StatusSet {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Code(u64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Code(c) if (100..=599).contains(&c) => Ok(StatusSet::Code(c as u16)),
            Raw::Code(c) => Err(de::Error::custom(format!("invalid status {c}: expected 100-599"))),
            Raw::Text(t) => match t.as_bytes() {
                [c @ b'1'..=b'5', b'x', b'x'] => Ok(StatusSet::Class(u16::from(c - b'0'))),
                _ => Err(de::Error::custom(format!(
                    "invalid status {t:?}: expected a code like 404 or a class like \"2xx\""
                ))),
            },
        }
    }
}

impl<'de> Deserialize<'de> for FingerprintPart {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        match s.as_str() {
            "method" => Ok(FingerprintPart::Method),
            "path" => Ok(FingerprintPart::Path),
            "query" => Ok(FingerprintPart::Query),
            "body" => Ok(FingerprintPart::Body),
            _ => match Source::parse(&s) {
                Ok(Source::Header(h)) => Ok(FingerprintPart::Header(h.to_ascii_lowercase())),
                Ok(
                    v @ (Source::Body(_)
                    | Source::Form(_)
                    | Source::Xml(_)
                    | Source::Query(_)
                    | Source::Path(_)
                    | Source::CloudEvent(_)),
                ) => Ok(FingerprintPart::Value(v)),
                _ => Err(de::Error::custom(format!(
                    "invalid fingerprint part {s:?}: expected method, path, query, body, header:<name>, \
                     query:<name>, body:/<JSON pointer>, form:<field>, xml:/<element>[/…], path:<parameter> \
                     or cloudevent:<attribute>"
                ))),
            },
        }
    }
}

/// JSON Schemas of the values with their own syntax (feature `schema`), kept beside their parsers.
#[cfg(feature = "schema")]
mod schema {
    use super::super::{Duration, FingerprintPart, StatusSet};
    use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
    use std::borrow::Cow;

    /// `impl JsonSchema` for a value parsed from its own syntax: its name and its schema.
    macro_rules! schema_of {
        ($ty:ty, $name:literal, $schema:tt) => {
            impl JsonSchema for $ty {
                fn schema_name() -> Cow<'static, str> {
                    $name.into()
                }
                fn json_schema(_: &mut SchemaGenerator) -> Schema {
                    json_schema!($schema)
                }
            }
        };
    }

    schema_of!(Duration, "Duration", {
        "description": "A number and a unit: \"250ms\", \"30s\", \"10m\", \"24h\", \"7d\".",
        "type": "string",
        "pattern": "^[0-9]+(ms|s|m|h|d)$"
    });
    schema_of!(StatusSet, "StatusSet", {
        "description": "A status code (100-599) or a class like \"2xx\".",
        "oneOf": [
            { "type": "integer", "minimum": 100, "maximum": 599 },
            { "type": "string", "pattern": "^[1-5]xx$" }
        ]
    });
    schema_of!(FingerprintPart, "FingerprintPart", {
        "description": "method, path, query, body, header:<name>, query:<name>, body:/<JSON pointer>, form:<field>, xml:/<element>[/…], path:<parameter> or cloudevent:<attribute>.",
        "type": "string",
        "pattern": "^(method|path|query|body|header:.+|query:.+|body:/.*|form:.+|xml:(/[^/]+)+|path:[A-Za-z0-9_.-]+|cloudevent:[a-z0-9]+)$"
    });
}
