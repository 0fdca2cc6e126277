//! CloudEvents over HTTP push (Knative, Dapr, EventBridge, Pub/Sub): one endpoint receives an
//! event in binary mode (attributes in `ce-*` headers, the data as the body) or in structured mode
//! (`application/cloudevents+json`: the whole event as a JSON object). `cloudevent:<attribute>`
//! reads an attribute from wherever the request's mode puts it, so one policy keys both modes on
//! the spec's identity of an event, `source` + `id`.
//!
//! A batch (`application/cloudevents-batch+json`) holds several events in one request; it is
//! refused (415), never deduplicated as a whole: `[e1, e3]` after `[e1, e2]` would replay e2's
//! answer for e3, and `[e3, e1]` would run e1 twice.

use crate::json::{self, Leaf, PointerError};
use crate::request::{KeyError, RequestView};

/// How a request carries its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Binary,
    /// `application/cloudevents+json`.
    Structured,
    /// `application/cloudevents-batch+json`, or a structured format other than JSON.
    Unsupported(String),
}

/// The mode of a request, by its `content-type` (media type only, any case).
pub fn mode(req: &dyn RequestView) -> Mode {
    let ct = req.first_header_value("content-type").map(|v| String::from_utf8_lossy(v).to_ascii_lowercase());
    let media = ct.as_deref().and_then(|c| c.split(';').next()).unwrap_or("").trim().to_string();
    match media.as_str() {
        "application/cloudevents+json" => Mode::Structured,
        m if m.starts_with("application/cloudevents-batch") => Mode::Unsupported(m.to_string()),
        m if m.starts_with("application/cloudevents") => Mode::Unsupported(m.to_string()),
        _ => Mode::Binary,
    }
}

fn unsupported(media: &str) -> KeyError {
    let why = if media.starts_with("application/cloudevents-batch") {
        "a batch of CloudEvents: this route deduplicates each event on its own, so send them one per request \
         (binary or structured mode)"
            .to_string()
    } else {
        format!("CloudEvents in {media}: this route reads structured mode as application/cloudevents+json only")
    };
    KeyError::Unsupported(why)
}

/// An attribute's value as text: `ce-<attribute>` in binary mode, the JSON member in structured
/// mode (a number by its exact digits). `data` is the data in canonical form ([`data`]).
pub fn attribute(req: &dyn RequestView, name: &str) -> Result<Option<String>, KeyError> {
    if name == "data" {
        // Text exactly, or refused: two binary payloads must never become one key.
        return data(req)?
            .map(|b| {
                String::from_utf8(b).map_err(|_| KeyError::Invalid("the CloudEvent's data is not UTF-8 text".into()))
            })
            .transpose();
    }
    match mode(req) {
        Mode::Binary => {
            let header = format!("ce-{name}");
            crate::request::single_header(req, &header)
        }
        Mode::Structured => match json::at_pointer(req.body().unwrap_or_default(), &format!("/{name}")) {
            Ok(Some(Leaf::String(s) | Leaf::Number(s))) => Ok(Some(s)),
            Ok(None) => Ok(None),
            Err(PointerError::NotJson(e)) => {
                Err(KeyError::Missing(format!("the structured CloudEvent is not JSON ({e}), so {name} cannot be read")))
            }
            Err(PointerError::Ambiguous(m)) => Err(KeyError::Invalid(format!(
                "the structured CloudEvent names {m:?} twice; which one counts is ambiguous"
            ))),
        },
        Mode::Unsupported(media) => Err(unsupported(&media)),
    }
}

/// The event's data, comparable across deliveries: JSON in canonical form (members sorted,
/// numbers exact), anything else as its bytes (`data_base64` as its text).
pub fn data(req: &dyn RequestView) -> Result<Option<Vec<u8>>, KeyError> {
    let body = req.body().unwrap_or_default();
    let ambiguous =
        |m: String| KeyError::Invalid(format!("the event's data names {m:?} twice; which one counts is ambiguous"));
    match mode(req) {
        Mode::Binary => match json::canonical(body) {
            Ok(c) => Ok(Some(c)),
            Err(PointerError::NotJson(_)) => Ok(Some(body.to_vec())),
            Err(PointerError::Ambiguous(m)) => Err(ambiguous(m)),
        },
        Mode::Structured => match json::canonical_at(body, "/data") {
            Ok(Some(d)) => Ok(Some(d)),
            Ok(None) => match json::at_pointer(body, "/data_base64") {
                Ok(Some(Leaf::String(s))) => Ok(Some(s.into_bytes())),
                _ => Ok(None),
            },
            Err(PointerError::NotJson(_)) => Ok(None),
            Err(PointerError::Ambiguous(m)) => Err(ambiguous(m)),
        },
        Mode::Unsupported(media) => Err(unsupported(&media)),
    }
}
