//! Answers the filter gives itself: stored responses (what is kept, how it is encoded, how it is
//! replayed) and the JSON local replies with their stable codes.

use crate::answers::{Answer, Answers};
use crate::codes::ErrorCode;
use crate::policy::DuplicateResponse;

/// A header: a lower-case name and its value as bytes (an upstream may send Latin-1).
pub type Header = (String, Vec<u8>);

/// An answer the filter sends instead of forwarding.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LocalReply {
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
    /// Trailers after the body: a replayed gRPC answer's `grpc-status` and trailing metadata.
    pub trailers: Vec<Header>,
    /// The gateway's own answer (not a replay): what it says, for the gRPC form of it.
    pub own: Option<Box<Own>>,
    /// A trailers-only gRPC answer with this `grpc-status` ([`LocalReply::for_grpc`]).
    pub grpc_status: Option<u32>,
    /// Its body or headers hold [`crate::answers::REQUEST_ID_MARK`], to be replaced by the
    /// request's id when it is sent.
    pub request_id: bool,
}

/// What one of the gateway's own answers says: its stable code, its message, and when the first
/// request was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Own {
    pub code: String,
    pub message: String,
    pub first_seen_ms: Option<u64>,
}

impl LocalReply {
    pub fn new(status: u16, content_type: &str, body: Vec<u8>) -> Self {
        LocalReply {
            status,
            headers: vec![("content-type".into(), content_type.as_bytes().to_vec())],
            body,
            ..Default::default()
        }
    }

    /// This answer to a gRPC call: the gateway's own answers become trailers-only gRPC answers —
    /// a fitting code ([`crate::grpc::status_for`]), the stable code and message in
    /// `grpc-message`, a `google.rpc.Status` with an `ErrorInfo` in `grpc-status-details-bin`,
    /// `grpc-retry-pushback-ms` when a retry shortly may succeed — never Envoy's mapping of an
    /// HTTP status to `UNKNOWN`. A replay stays as it is.
    pub fn for_grpc(self) -> LocalReply {
        let Some(own) = &self.own else {
            return self;
        };
        let status = crate::grpc::status_for(&own.code, self.status);
        let message = format!("{}: {}", own.code, own.message);
        let mut meta = Vec::new();
        if let Some(ms) = own.first_seen_ms {
            meta.push(("first_seen_at", rfc3339(ms)));
        }
        let details = crate::grpc::status_details(status, &message, &own.code, &meta);
        let mut headers = vec![("grpc-status-details-bin".to_string(), details.into_bytes())];
        if status == crate::grpc::code::UNAVAILABLE {
            let pushback = IN_PROGRESS_RETRY_AFTER_S * 1000;
            headers.push(("grpc-retry-pushback-ms".to_string(), pushback.to_string().into_bytes()));
        }
        LocalReply { status: 200, headers, body: message.into_bytes(), grpc_status: Some(status), ..self }
    }
}

/// A remembered upstream response: status, the headers safe to replay, body, and (gRPC) its
/// trailers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
    pub trailers: Vec<Header>,
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) and the length Envoy computes itself: never copied from
/// one HTTP message to another (a replay, a detached call, its answer).
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Headers never replayed: [`HOP_BY_HOP`], ones Envoy recomputes, cookies (a replay must not
/// hand one caller's session to a later request), and Envoy's own diagnostics.
pub fn replayable_header(name: &str) -> bool {
    const ALSO: &[&str] = &["date", "set-cookie", "server", "idempotent-replayed"];
    !name.starts_with(':')
        && !name.starts_with("x-envoy-")
        && !HOP_BY_HOP.iter().chain(ALSO).any(|d| name.eq_ignore_ascii_case(d))
}

impl StoredResponse {
    /// Keeps only replayable headers (also those named by a `Connection` header).
    pub fn new(status: u16, headers: Vec<Header>, body: Vec<u8>) -> Self {
        let named_by_connection: Vec<String> = headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| {
                v.split(|&b| b == b',')
                    .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .collect();
        let headers = headers
            .into_iter()
            .filter(|(n, _)| replayable_header(n) && !named_by_connection.iter().any(|c| n.eq_ignore_ascii_case(c)))
            .collect();
        StoredResponse { status, headers, body, trailers: Vec::new() }
    }

    /// With the trailers a gRPC answer ended with (its `grpc-status` and trailing metadata).
    pub fn with_trailers(mut self, trailers: Vec<Header>) -> Self {
        self.trailers = trailers.into_iter().filter(|(n, _)| replayable_header(n)).collect();
        self
    }

    /// Size of the encoded form, to compare with the slot size before storing.
    pub fn encoded_len(&self) -> usize {
        let fields = |h: &[Header]| h.iter().map(|(n, v)| 8 + n.len() + v.len()).sum::<usize>();
        let trailers = if self.trailers.is_empty() { 0 } else { 2 + fields(&self.trailers) };
        4 + fields(&self.headers) + trailers + self.body.len()
    }

    /// `status u16 | count u16 | (name_len u32, name, value_len u32, value)* | body`; with
    /// trailers, the status carries [`TRAILERS_FLAG`] and `count u16 | fields` of the trailers
    /// follow the headers (records written before trailers were stored read as they were).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let flag = if self.trailers.is_empty() { 0 } else { TRAILERS_FLAG };
        out.extend_from_slice(&(self.status | flag).to_le_bytes());
        put_fields(out, &self.headers);
        if !self.trailers.is_empty() {
            put_fields(out, &self.trailers);
        }
        out.extend_from_slice(&self.body);
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        let raw = u16::from_le_bytes(r.take(2)?.try_into().ok()?);
        let headers = r.fields()?;
        let trailers = if raw & TRAILERS_FLAG != 0 { r.fields()? } else { Vec::new() };
        Some(StoredResponse { status: raw & !TRAILERS_FLAG, headers, body: r.0.to_vec(), trailers })
    }

    /// The replay: stored status, headers, body and trailers, marked as a replay.
    pub fn replay(&self) -> LocalReply {
        let mut headers = self.headers.clone();
        headers.push(("idempotent-replayed".into(), "true".into()));
        LocalReply {
            status: self.status,
            headers,
            body: self.body.clone(),
            trailers: self.trailers.clone(),
            ..Default::default()
        }
    }
}

/// The bit of an encoded status that says trailers follow the headers (statuses are < 1000).
const TRAILERS_FLAG: u16 = 0x8000;

fn put_fields(out: &mut Vec<u8>, fields: &[Header]) {
    out.extend_from_slice(&(fields.len().min(u16::MAX as usize) as u16).to_le_bytes());
    for (n, v) in fields.iter().take(u16::MAX as usize) {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn field(&mut self) -> Option<&'a [u8]> {
        let len = u32::from_le_bytes(self.take(4)?.try_into().ok()?) as usize;
        self.take(len)
    }
    fn fields(&mut self) -> Option<Vec<Header>> {
        let count = u16::from_le_bytes(self.take(2)?.try_into().ok()?);
        let mut out = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let n = String::from_utf8(self.field()?.to_vec()).ok()?;
            out.push((n, self.field()?.to_vec()));
        }
        Some(out)
    }
}

/// A JSON local reply with a stable `code` (the token endpoint's answers; the gateway's own
/// errors take the route's shape through [`Answers`]).
pub fn json_reply(status: u16, code: &str, message: &str, extra: &[(&str, serde_json::Value)]) -> LocalReply {
    let mut body = serde_json::Map::new();
    body.insert("code".into(), code.into());
    body.insert("message".into(), message.into());
    for (k, v) in extra {
        body.insert((*k).into(), v.clone());
    }
    LocalReply::new(status, "application/json", serde_json::to_vec(&body).unwrap_or_default())
}

/// The route's duplicate response, with when the first request was seen (when known): its own
/// `body` when it has one (a provider's exact success answer), else in the route's shape.
pub fn duplicate(answers: &Answers, dup: &DuplicateResponse, first_seen_ms: Option<u64>) -> LocalReply {
    let a = Answer { status: dup.status, code: &dup.code, message: &dup.message, first_seen_ms, ..Default::default() };
    let own = dup.body.as_ref().map(|b| (b, dup.content_type.as_str()));
    answers.render_with(&a, own)
}

/// How long a client should wait before asking again about a request still in progress.
///
/// Never the lease end: SDKs that honour `Retry-After` come back exactly then, and a retry that
/// lands as the lease ends would take the claim over and run the business a second time.
const IN_PROGRESS_RETRY_AFTER_S: u64 = 1;

/// `409 REQUEST_IN_PROGRESS` with a short `Retry-After`: the first request is still waiting for
/// the upstream, and its answer will be replayed to a later retry.
pub fn in_progress(answers: &Answers, first_seen_ms: u64) -> LocalReply {
    let code = ErrorCode::RequestInProgress;
    let mut reply = answers.render(&Answer {
        status: code.status(),
        code: code.as_str(),
        message: "a request with this idempotency key is still being processed; retry shortly",
        first_seen_ms: Some(first_seen_ms),
        held_until_ms: None,
        retryable: code.retryable(),
    });
    reply.headers.push(("retry-after".into(), IN_PROGRESS_RETRY_AFTER_S.to_string().into_bytes()));
    reply
}

/// `409 IDEMPOTENCY_OUTCOME_UNKNOWN`: the first attempt was forwarded and no answer came back
/// (client gone, upstream reset or timeout), so the service may have done the work. Retrying
/// cannot help — only reconciliation can say — so there is no `Retry-After`, and
/// `x-should-retry: false` stops SDKs (Stainless-generated ones honour it) from trying again.
pub fn outcome_unknown(answers: &Answers, first_seen_ms: u64, held_until_ms: u64) -> LocalReply {
    let code = ErrorCode::OutcomeUnknown;
    let mut reply = answers.render(&Answer {
        status: code.status(),
        code: code.as_str(),
        message: "an earlier request with this idempotency key was forwarded and its outcome is unknown; \
                  it may have been carried out. Check its effect before sending new work with another key",
        first_seen_ms: Some(first_seen_ms),
        held_until_ms: Some(held_until_ms),
        retryable: code.retryable(),
    });
    reply.headers.push(("x-should-retry".into(), b"false".to_vec()));
    reply
}

/// One of the gateway's errors, in the route's shape: its status and retryability from the table.
pub fn error(answers: &Answers, code: ErrorCode, message: &str) -> LocalReply {
    answers.render(&Answer {
        status: code.status(),
        code: code.as_str(),
        message,
        retryable: code.retryable(),
        ..Default::default()
    })
}

/// One of the token and replay endpoints' plain JSON answers (`{"code","message"}`).
pub fn plain_error(code: ErrorCode, message: &str) -> LocalReply {
    json_reply(code.status(), code.as_str(), message, &[])
}

/// RFC 3339 UTC timestamp, second precision.
pub fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}
