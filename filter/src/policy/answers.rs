//! `[answers]` / `[route.answers]` as configured: the shape of the gateway's own answers (our
//! JSON, problem+json, or a template of the API's envelope), their headers and the API's own
//! codes, each template parsed and checked when the policy loads (unknown placeholders refused,
//! a JSON template JSON once filled in, `{{message}}` only where its escaping is known).
//! Rendering an answer in this shape is `crate::answers`, above the policy.

use crate::codes::ErrorCode;
use serde::{de, Deserialize, Deserializer};
use std::collections::BTreeMap;

/// One value a template can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    Code,
    Message,
    Status,
    Title,
    Type,
    FirstSeenAt,
    HeldUntil,
    ShouldRetry,
    RequestId,
}

const VARS: [(&str, Var); 9] = [
    ("code", Var::Code),
    ("message", Var::Message),
    ("status", Var::Status),
    ("title", Var::Title),
    ("type", Var::Type),
    ("first_seen_at", Var::FirstSeenAt),
    ("held_until", Var::HeldUntil),
    ("should_retry", Var::ShouldRetry),
    ("request_id", Var::RequestId),
];

/// Where `{{request_id}}` stands in a rendered answer until it is sent: the request's id is the
/// stream's (`x-request-id`, read when the answer goes out), not known where answers are made.
/// Made of characters no escaping changes.
pub const REQUEST_ID_MARK: &str = "@@idem-request-id@@";

/// The API's own code (and status) for one of the gateway's answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub code: String,
    pub status: Option<u16>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(Var),
}

/// A text with `{{name}}` placeholders.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

impl Template {
    /// Whether the template names `var` (`{{request_id}}` is filled in only when sent).
    pub fn names(&self, var: Var) -> bool {
        self.pieces.contains(&Piece::Var(var))
    }

    pub fn parse(source: &str) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut rest = source;
        while let Some(start) = rest.find("{{") {
            let (text, after) = rest.split_at(start);
            if !text.is_empty() {
                pieces.push(Piece::Text(text.to_string()));
            }
            let after = after.get(2..).unwrap_or("");
            let Some(end) = after.find("}}") else {
                return Err(format!("unclosed placeholder `{{{{{}`", after.chars().take(20).collect::<String>()));
            };
            let name = after.get(..end).unwrap_or("").trim();
            let var = VARS.iter().find(|(n, _)| *n == name).map(|(_, v)| *v).ok_or_else(|| {
                let known: Vec<String> = VARS.iter().map(|(n, _)| format!("{{{{{n}}}}}")).collect();
                format!("unknown placeholder `{{{{{name}}}}}`; known: {}", known.join(", "))
            })?;
            pieces.push(Piece::Var(var));
            rest = after.get(end + 2..).unwrap_or("");
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Template { pieces })
    }

    /// The text with every value filled in, escaped by `escape`.
    pub(crate) fn fill(&self, values: &dyn Fn(Var) -> String, escape: Escape) -> String {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Var(v) => escape.push(&mut out, &values(*v)),
            }
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Escape {
    Json,
    Xml,
    Html,
    /// `text/plain`: nothing in it is markup.
    Plain,
    /// A header value: control characters and `%` percent-encoded.
    Header,
    /// Any other content type: no escaping is known, so no client-controlled value may go in.
    Unknown,
}

impl Escape {
    pub(crate) fn for_content_type(ct: &str) -> Escape {
        let ct = ct.to_ascii_lowercase();
        let media = ct.split(';').next().unwrap_or("").trim();
        if media.contains("json") {
            Escape::Json
        } else if media.contains("xml") {
            Escape::Xml
        } else if media == "text/html" {
            Escape::Html
        } else if media == "text/plain" {
            Escape::Plain
        } else {
            Escape::Unknown
        }
    }

    fn push(self, out: &mut String, value: &str) {
        match self {
            Escape::Plain | Escape::Unknown => out.push_str(value),
            Escape::Header => {
                for c in value.chars() {
                    if c.is_ascii_control() || c == '%' {
                        out.push_str(&format!("%{:02X}", c as u32));
                    } else {
                        out.push(c);
                    }
                }
            }
            Escape::Html => {
                for c in value.chars() {
                    match c {
                        '<' => out.push_str("&lt;"),
                        '>' => out.push_str("&gt;"),
                        '&' => out.push_str("&amp;"),
                        '"' => out.push_str("&quot;"),
                        '\'' => out.push_str("&#39;"),
                        c => out.push(c),
                    }
                }
            }
            Escape::Json => {
                let quoted = serde_json::Value::from(value).to_string();
                out.push_str(quoted.get(1..quoted.len().saturating_sub(1)).unwrap_or(""));
            }
            Escape::Xml => {
                for c in value.chars() {
                    match c {
                        '<' => out.push_str("&lt;"),
                        '>' => out.push_str("&gt;"),
                        '&' => out.push_str("&amp;"),
                        '"' => out.push_str("&quot;"),
                        '\'' => out.push_str("&apos;"),
                        c => out.push(c),
                    }
                }
            }
        }
    }
}

/// Checks a body template against its content type: a JSON one must be JSON once filled in
/// with values that need escaping (so a placeholder outside a string is found too), and one of
/// a content type with no known escaping may not carry `{{message}}` (a client's bytes).
pub fn check_body(template: &Template, content_type: &str) -> Result<(), String> {
    let escape = Escape::for_content_type(content_type);
    if escape == Escape::Unknown && template.pieces.contains(&Piece::Var(Var::Message)) {
        return Err(format!(
            "holds {{{{message}}}}, which can carry what a client sent, in content type {content_type:?}, for which \
             the gateway knows no escaping; use a JSON, XML, text/html or text/plain content type, or leave \
             {{{{message}}}} out"
        ));
    }
    if escape != Escape::Json {
        return Ok(());
    }
    let sample = |v: Var| match v {
        Var::Status => "409".to_string(),
        Var::ShouldRetry => "false".to_string(),
        _ => "a \"quoted\" \\ value".to_string(),
    };
    let text = template.fill(&sample, Escape::Json);
    serde_json::from_str::<serde_json::Value>(&text).map(|_| ()).map_err(|e| {
        format!(
            "is not JSON once its placeholders are filled in ({e}); put text placeholders inside quotes, \
             like \"{{{{message}}}}\""
        )
    })
}

/// How the gateway's own answers look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// `{"code","message",…}` as `application/json` (the default).
    Json,
    /// RFC 9457 `application/problem+json`: `type` (`type_base` + the code in kebab case, else
    /// `about:blank`), `title`, `status`, `detail`, and `code` (plus `first_seen_at`,
    /// `held_until`) as extension members.
    Problem { type_base: Option<String> },
    /// The API's own envelope.
    Template { body: Template, content_type: String },
}

/// `[answers]` / `[route.answers]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answers {
    pub format: Format,
    /// Extra headers on every answer (values may name placeholders).
    pub headers: Vec<(String, Template)>,
    /// The API's own code (and status) for some of the gateway's answers, by the gateway's code
    /// (`IDEMPOTENCY_KEY_REUSED → IdempotentParameterMismatchException`): what `{{code}}` and
    /// the status say. Counters, logs and gRPC codes keep the gateway's code.
    pub codes: BTreeMap<String, Mapped>,
}

impl Default for Answers {
    fn default() -> Self {
        Answers { format: Format::Json, headers: Vec::new(), codes: BTreeMap::new() }
    }
}

/// An HTTP header name: a token (RFC 9110 §5.6.2).
fn valid_header_name(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl<'de> Deserialize<'de> for Answers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Raw {
            #[serde(default)]
            format: Option<String>,
            #[serde(default)]
            template: Option<String>,
            #[serde(default)]
            content_type: Option<String>,
            #[serde(default)]
            type_base: Option<String>,
            #[serde(default)]
            headers: BTreeMap<String, String>,
            #[serde(default)]
            codes: BTreeMap<String, RawMapped>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct RawFull {
            code: String,
            #[serde(default)]
            status: Option<u16>,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum RawMapped {
            Code(String),
            Full(RawFull),
        }
        let raw = Raw::deserialize(d)?;
        let mut answers = build(raw.format.as_deref(), raw.template, raw.content_type, raw.type_base, raw.headers)
            .map_err(de::Error::custom)?;
        for (ours, theirs) in raw.codes {
            if !ErrorCode::parse(&ours).is_some_and(ErrorCode::shaped) {
                let known: Vec<&str> =
                    ErrorCode::ALL.into_iter().filter(|c| c.shaped()).map(ErrorCode::as_str).collect();
                return Err(de::Error::custom(format!(
                    "`codes`: {ours:?} is not one of the gateway's answers; they are {}",
                    known.join(", ")
                )));
            }
            let mapped = match theirs {
                RawMapped::Code(code) => Mapped { code, status: None },
                RawMapped::Full(RawFull { code, status }) => Mapped { code, status },
            };
            if mapped.code.is_empty() || mapped.code.chars().any(char::is_control) {
                return Err(de::Error::custom(format!("`codes.{ours}`: the code must be non-empty text")));
            }
            if let Some(st) = mapped.status.filter(|st| !(200..=599).contains(st)) {
                return Err(de::Error::custom(format!("`codes.{ours}`: status {st} is not an HTTP status (200–599)")));
            }
            answers.codes.insert(ours, mapped);
        }
        Ok(answers)
    }
}

pub(crate) fn build(
    format: Option<&str>,
    template: Option<String>,
    content_type: Option<String>,
    type_base: Option<String>,
    headers: BTreeMap<String, String>,
) -> Result<Answers, String> {
    let format = match (format.unwrap_or(if template.is_some() { "template" } else { "json" }), template) {
        ("json", None) => Format::Json,
        ("problem", None) => Format::Problem { type_base },
        ("template", Some(t)) => {
            let content_type = content_type.unwrap_or_else(|| "application/json".into());
            let body = Template::parse(&t).map_err(|e| format!("`template`: {e}"))?;
            check_body(&body, &content_type).map_err(|e| format!("`template` {e}"))?;
            Format::Template { body, content_type }
        }
        ("template", None) => return Err("format = \"template\" needs `template`, the body of every answer".into()),
        ("json" | "problem", Some(_)) => {
            return Err("`template` goes with format = \"template\" (or leave `format` out)".into())
        }
        (other, _) => return Err(format!("unknown format {other:?}: expected \"json\", \"problem\" or \"template\"")),
    };
    let mut out = Vec::new();
    for (name, value) in headers {
        if !valid_header_name(&name) {
            return Err(format!("`headers`: {name:?} is not a header name"));
        }
        if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!("`headers`: the value of {name} holds a line break"));
        }
        let t = Template::parse(&value).map_err(|e| format!("`headers.{name}`: {e}"))?;
        out.push((name.to_ascii_lowercase(), t));
    }
    Ok(Answers { format, headers: out, codes: BTreeMap::new() })
}

impl<'de> Deserialize<'de> for Template {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Template::parse(&s).map_err(de::Error::custom)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Template {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Template".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A text with {{code}}, {{message}}, {{status}}, {{title}}, {{type}}, {{first_seen_at}}, {{held_until}} or {{should_retry}} placeholders.",
            "type": "string"
        })
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Answers {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Answers".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "The shape of the gateway's own answers: format json (default), problem (RFC 9457) or template (the API's envelope, with {{code}}, {{message}}, {{status}}, {{title}}, {{type}}, {{first_seen_at}}, {{held_until}}, {{should_retry}}), plus headers.",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "format": { "enum": ["json", "problem", "template"] },
                "template": { "type": "string" },
                "content_type": { "type": "string" },
                "type_base": { "type": "string" },
                "headers": { "type": "object", "additionalProperties": { "type": "string" } }
            }
        })
    }
}
