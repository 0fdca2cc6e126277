//! The shape of the answers the gateway gives itself (400, 409, 413, 422, 500, 503 and the
//! duplicate response), so that the API's own SDKs read them: our JSON (`{"code","message",…}`,
//! the default), RFC 9457 `application/problem+json`, or a template of the API's own envelope
//! (Stripe's `{"error":{"type":…,"code":…,"message":…}}`), plus headers (`Stripe-Should-Retry`).
//!
//! Set bundle-wide in `[answers]`, per route in `[route.answers]`. Templates name values as
//! `{{code}}`, `{{message}}`, `{{status}}`, `{{title}}`, `{{type}}`, `{{first_seen_at}}`,
//! `{{held_until}}` and `{{should_retry}}` (`true`/`false`); a value is escaped for where it
//! lands, since `{{message}}` can carry what a client sent (a key, an XML tag name, a JSON member
//! name): JSON string escapes when the content type says `json`, XML escapes when it says `xml`,
//! HTML escapes for `text/html`, nothing for `text/plain`; in a header value, control characters
//! and `%` are percent-encoded (`%0D%0A`), so no value can end the header line. A body template
//! of any other content type may not hold `{{message}}` (refused at load). A template is checked
//! when the policy loads: unknown names are refused, and a JSON template must be JSON once filled
//! in.

use crate::codes::ErrorCode;
use crate::response::LocalReply;

use crate::policy::answers::Escape;
pub use crate::policy::answers::{check_body, Answers, Format, Mapped, Template, Var, REQUEST_ID_MARK};

/// What the gateway says, before it takes the API's shape.
#[derive(Debug, Clone, Default)]
pub struct Answer<'a> {
    pub status: u16,
    pub code: &'a str,
    pub message: &'a str,
    pub first_seen_ms: Option<u64>,
    pub held_until_ms: Option<u64>,
    /// Whether the same request again may succeed (in progress, store unavailable): the value of
    /// `{{should_retry}}`.
    pub retryable: bool,
}

impl Answers {
    /// The answer as a local reply in this shape.
    pub fn render(&self, a: &Answer<'_>) -> LocalReply {
        self.render_with(a, None)
    }

    /// The answer with a body of its own (a duplicate response's `body`), else in this shape;
    /// the headers are added either way.
    pub fn render_with(&self, answer: &Answer<'_>, own: Option<(&Template, &str)>) -> LocalReply {
        let mapped = self.codes.get(answer.code);
        let shown = Answer {
            code: mapped.map_or(answer.code, |m| m.code.as_str()),
            status: mapped.and_then(|m| m.status).unwrap_or(answer.status),
            ..answer.clone()
        };
        let a = &shown;
        let mut reply = match (&self.format, own) {
            (_, Some((body, content_type))) => {
                let filled = body.fill(&|v| self.value(v, a), Escape::for_content_type(content_type));
                LocalReply::new(a.status, content_type, filled.into_bytes())
            }
            (format, None) => self.shaped(format, a),
        };
        for (name, value) in &self.headers {
            reply.headers.push((name.clone(), value.fill(&|v| self.value(v, a), Escape::Header).into_bytes()));
        }
        reply.own = Some(Box::new(crate::response::Own {
            code: answer.code.to_string(),
            message: answer.message.to_string(),
            first_seen_ms: answer.first_seen_ms,
        }));
        reply.request_id = self.names_request_id(own.map(|(t, _)| t));
        reply
    }

    fn shaped(&self, format: &Format, a: &Answer<'_>) -> LocalReply {
        match format {
            Format::Json => {
                let mut body = serde_json::Map::new();
                body.insert("code".into(), a.code.into());
                body.insert("message".into(), a.message.into());
                add_times(&mut body, a);
                LocalReply::new(a.status, "application/json", serde_json::to_vec(&body).unwrap_or_default())
            }
            Format::Problem { type_base } => {
                let mut body = serde_json::Map::new();
                body.insert("type".into(), problem_type(type_base.as_deref(), a.code).into());
                body.insert("title".into(), title(a.code, a.status).into());
                body.insert("status".into(), a.status.into());
                body.insert("detail".into(), a.message.into());
                body.insert("code".into(), a.code.into());
                add_times(&mut body, a);
                LocalReply::new(a.status, "application/problem+json", serde_json::to_vec(&body).unwrap_or_default())
            }
            Format::Template { body, content_type } => {
                let filled = body.fill(&|v| self.value(v, a), Escape::for_content_type(content_type));
                LocalReply::new(a.status, content_type, filled.into_bytes())
            }
        }
    }

    /// Whether an answer rendered with this shape (or this own body) holds `{{request_id}}`.
    fn names_request_id(&self, own: Option<&Template>) -> bool {
        let body = match (&self.format, own) {
            (_, Some(t)) | (Format::Template { body: t, .. }, None) => Some(t),
            _ => None,
        };
        body.into_iter().chain(self.headers.iter().map(|(_, t)| t)).any(|t| t.names(Var::RequestId))
    }

    fn value(&self, v: Var, a: &Answer<'_>) -> String {
        let time = |ms: Option<u64>| ms.map(crate::response::rfc3339).unwrap_or_default();
        match v {
            Var::Code => a.code.to_string(),
            Var::Message => a.message.to_string(),
            Var::Status => a.status.to_string(),
            Var::Title => title(a.code, a.status).to_string(),
            Var::Type => {
                let base = match &self.format {
                    Format::Problem { type_base } => type_base.as_deref(),
                    _ => None,
                };
                problem_type(base, a.code)
            }
            Var::FirstSeenAt => time(a.first_seen_ms),
            Var::HeldUntil => time(a.held_until_ms),
            Var::ShouldRetry => a.retryable.to_string(),
            Var::RequestId => REQUEST_ID_MARK.to_string(),
        }
    }
}

fn add_times(body: &mut serde_json::Map<String, serde_json::Value>, a: &Answer<'_>) {
    if let Some(ms) = a.first_seen_ms {
        body.insert("first_seen_at".into(), crate::response::rfc3339(ms).into());
    }
    if let Some(ms) = a.held_until_ms {
        body.insert("held_until".into(), crate::response::rfc3339(ms).into());
    }
}

/// `type_base` + the code in kebab case (`REQUEST_IN_PROGRESS` → `request-in-progress`).
fn problem_type(base: Option<&str>, code: &str) -> String {
    match base {
        Some(b) => format!("{b}{}", code.to_ascii_lowercase().replace('_', "-")),
        None => "about:blank".to_string(),
    }
}

/// A short title for each of the gateway's codes; the HTTP reason phrase otherwise (a route's
/// own duplicate code).
pub fn title(code: &str, status: u16) -> &'static str {
    ErrorCode::parse(code).filter(|c| c.shaped()).map_or_else(|| reason_phrase(status), ErrorCode::title)
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        410 => "Gone",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        422 => "Unprocessable Content",
        425 => "Too Early",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Duplicate request",
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::policy::answers::build;
    use std::collections::BTreeMap;

    fn answer() -> Answer<'static> {
        Answer {
            status: 409,
            code: "REQUEST_IN_PROGRESS",
            message: "a \"busy\" key",
            first_seen_ms: Some(1_700_000_000_000),
            retryable: true,
            ..Default::default()
        }
    }

    #[test]
    fn stripe_envelope_and_headers() {
        let a = build(
            None,
            Some(r#"{"error":{"type":"idempotency_error","code":"{{code}}","message":"{{message}}"}}"#.into()),
            None,
            None,
            BTreeMap::from([("Stripe-Should-Retry".to_string(), "{{should_retry}}".to_string())]),
        )
        .unwrap();
        let r = a.render(&answer());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"]["code"], "REQUEST_IN_PROGRESS");
        assert_eq!(v["error"]["message"], "a \"busy\" key");
        assert!(r.headers.contains(&("stripe-should-retry".to_string(), b"true".to_vec())));
        assert!(r.headers.contains(&("content-type".to_string(), b"application/json".to_vec())));
    }

    #[test]
    fn problem_json() {
        let a =
            build(Some("problem"), None, None, Some("https://errors.example.com/".into()), BTreeMap::new()).unwrap();
        let r = a.render(&answer());
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["type"], "https://errors.example.com/request-in-progress");
        assert_eq!(v["status"], 409);
        assert_eq!(v["code"], "REQUEST_IN_PROGRESS");
        assert_eq!(v["first_seen_at"], "2023-11-14T22:13:20Z");
        assert!(r.headers.contains(&("content-type".to_string(), b"application/problem+json".to_vec())));
    }

    #[test]
    fn bad_templates_are_refused() {
        let t = |s: &str| build(None, Some(s.into()), None, None, BTreeMap::new()).unwrap_err();
        assert!(t(r#"{"code":"{{kode}}"}"#).contains("unknown placeholder `{{kode}}`"));
        assert!(t(r#"{"code":{{code}}}"#).contains("not JSON"));
        assert!(t(r#"{"code":"{{code"}"#).contains("unclosed placeholder"));
        let xml = build(None, Some("<e>{{message}}</e>".into()), Some("application/xml".into()), None, BTreeMap::new());
        let r = xml.unwrap().render(&answer());
        assert_eq!(r.body, b"<e>a &quot;busy&quot; key</e>");
        let bad_header = BTreeMap::from([("Bad Header".to_string(), "x".to_string())]);
        assert!(build(None, None, None, None, bad_header).unwrap_err().contains("not a header name"));
        assert!(build(Some("xml"), None, None, None, BTreeMap::new()).unwrap_err().contains("unknown format"));
    }

    /// What a client sent (an XML end tag with CR LF, markup, NUL) never leaves the value it
    /// lands in.
    #[test]
    fn client_bytes_are_escaped_where_they_land() {
        let hostile = "</transaction_id\r\nX-Injected: yes> <img src=x onerror=alert(1)> 100% \0";
        let a = Answer { status: 400, code: "IDEMPOTENCY_KEY_INVALID", message: hostile, ..Default::default() };
        let headers = BTreeMap::from([("X-Error".to_string(), "{{code}}: {{message}}".to_string())]);
        let html =
            build(None, Some("<p>{{message}}</p>".into()), Some("text/html; charset=utf-8".into()), None, headers);
        let r = html.unwrap().render(&a);
        let header = r.headers.iter().find(|(n, _)| n == "x-error").map(|(_, v)| v.clone()).unwrap();
        assert!(!header.iter().any(|b| b.is_ascii_control()), "{:?}", String::from_utf8_lossy(&header));
        assert!(
            String::from_utf8_lossy(&header).contains("%0D%0AX-Injected: yes> <img src=x onerror=alert(1)> 100%25 %00")
        );
        let body = String::from_utf8(r.body).unwrap();
        assert!(body.contains("&lt;img src=x onerror=alert(1)&gt;") && !body.contains("<img"), "{body}");
        let plain = build(None, Some("{{message}}".into()), Some("text/plain".into()), None, BTreeMap::new());
        assert_eq!(plain.unwrap().render(&a).body, hostile.as_bytes(), "text/plain carries no markup");
        let csv = build(None, Some("{{message}}".into()), Some("text/csv".into()), None, BTreeMap::new()).unwrap_err();
        assert!(csv.contains("knows no escaping"), "{csv}");
        assert!(build(None, Some("{{code}}".into()), Some("text/csv".into()), None, BTreeMap::new()).is_ok());
    }

    /// AWS-shaped APIs: the SDK raises the API's own exception for the gateway's answers.
    #[test]
    fn the_apis_own_codes_and_statuses_replace_the_gateways_in_what_the_client_reads() {
        let toml = r#"
format = "template"
content_type = "application/x-amz-json-1.0"
template = '{"__type":"com.amazonaws.dynamodb.v20120810#{{code}}","message":"{{message}}","RequestId":"{{request_id}}"}'
[codes]
IDEMPOTENCY_KEY_REUSED = "IdempotentParameterMismatchException"
REQUEST_IN_PROGRESS = { code = "TransactionInProgressException", status = 400 }
"#;
        let a: Answers = toml::from_str(toml).unwrap();
        let reused =
            a.render(&Answer { status: 422, code: "IDEMPOTENCY_KEY_REUSED", message: "m", ..Default::default() });
        let v: serde_json::Value = serde_json::from_slice(&reused.body).unwrap();
        assert_eq!(v["__type"], "com.amazonaws.dynamodb.v20120810#IdempotentParameterMismatchException");
        assert_eq!(reused.status, 422, "no status mapped: the gateway's");
        assert_eq!(
            reused.own.as_ref().unwrap().code,
            "IDEMPOTENCY_KEY_REUSED",
            "logs and gRPC keep the gateway's code"
        );
        assert!(reused.request_id && v["RequestId"] == REQUEST_ID_MARK);
        let busy = a.render(&Answer { status: 409, code: "REQUEST_IN_PROGRESS", message: "m", ..Default::default() });
        assert_eq!(busy.status, 400);
        let other =
            a.render(&Answer { status: 400, code: "IDEMPOTENCY_KEY_MISSING", message: "m", ..Default::default() });
        assert!(String::from_utf8_lossy(&other.body).contains("#IDEMPOTENCY_KEY_MISSING"));
        let bad = toml::from_str::<Answers>(
            "[codes]
KEY_REUSED = \"X\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(bad.contains("not one of the gateway's answers"), "{bad}");
        let bad = toml::from_str::<Answers>(
            "[codes]
IDEMPOTENCY_KEY_REUSED = { code = \"X\", status = 99 }\n",
        );
        assert!(bad.unwrap_err().to_string().contains("not an HTTP status"));
    }
}
