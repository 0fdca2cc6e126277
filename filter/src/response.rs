//! Answers the filter gives itself: stored responses (what is kept, how it is encoded, how it is
//! replayed) and the JSON local replies with their stable codes.

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
/// hand one caller's session to a later request), and Envoy's own diagnostics. Any case.
pub fn replayable_header(name: &str) -> bool {
    const ALSO: &[&str] = &["date", "set-cookie", "server", "idempotent-replayed"];
    !name.starts_with(':')
        && !name.get(..8).is_some_and(|p| p.eq_ignore_ascii_case("x-envoy-"))
        && !HOP_BY_HOP.iter().chain(ALSO).any(|d| name.eq_ignore_ascii_case(d))
}

/// Which headers of one response may be replayed: [`replayable_header`], and not named by
/// its `Connection` header (hop-by-hop by that naming, RFC 9110 §7.6.1).
pub struct Replayable {
    named_by_connection: Vec<Vec<u8>>,
}

impl Replayable {
    pub fn of<'a>(headers: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Replayable {
        let named_by_connection = headers
            .filter(|(n, _)| n.eq_ignore_ascii_case(b"connection"))
            .flat_map(|(_, v)| v.split(|&b| b == b',').map(|t| t.trim_ascii().to_ascii_lowercase()))
            .collect();
        Replayable { named_by_connection }
    }

    pub fn keeps(&self, name: &[u8]) -> bool {
        std::str::from_utf8(name).is_ok_and(replayable_header)
            && !self.named_by_connection.iter().any(|c| name.eq_ignore_ascii_case(c))
    }

    /// The headers to remember, lower-cased, from a response's serialized map: only these are
    /// copied out of it (a response carries a dozen headers, a replay keeps a few).
    pub fn copy(headers: &crate::pairs::Headers) -> Vec<Header> {
        let keep = Replayable::of(headers.iter());
        headers
            .iter()
            .filter(|(n, _)| keep.keeps(n))
            .map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.to_vec()))
            .collect()
    }
}

impl StoredResponse {
    /// Keeps only replayable headers (also those named by a `Connection` header).
    pub fn new(status: u16, headers: Vec<Header>, body: Vec<u8>) -> Self {
        let keep = Replayable::of(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_slice())));
        let headers = headers.into_iter().filter(|(n, _)| keep.keeps(n.as_bytes())).collect();
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
/// errors take the route's shape, `crate::replies`).
pub fn json_reply(status: u16, code: &str, message: &str, extra: &[(&str, serde_json::Value)]) -> LocalReply {
    let mut body = serde_json::Map::new();
    body.insert("code".into(), code.into());
    body.insert("message".into(), message.into());
    for (k, v) in extra {
        body.insert((*k).into(), v.clone());
    }
    LocalReply::new(status, "application/json", serde_json::to_vec(&body).unwrap_or_default())
}

/// RFC 3339 UTC timestamp, second precision.
pub fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pairs::Headers;

    #[test]
    fn only_replayable_headers_are_copied_out_of_a_response_lower_cased() {
        let response = Headers::from_pairs(&[
            (":status", "201"),
            ("Content-Type", "application/json"),
            ("Connection", "keep-alive, X-Session-Hint"),
            ("x-session-hint", "abc"),
            ("X-Envoy-Upstream-Service-Time", "3"),
            ("set-cookie", "sid=1"),
            ("date", "Sun, 06 Dec 2026 21:00:00 GMT"),
            ("content-length", "12"),
            ("x-order-id", "42"),
        ]);
        let kept = Replayable::copy(&response);
        let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-order-id"]);
        assert_eq!(kept[1].1, b"42");
        // The stored answer keeps the same, from pairs it is given whole.
        let whole: Vec<Header> =
            response.iter().map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.to_vec())).collect();
        assert_eq!(StoredResponse::new(201, whole, vec![]).headers, kept);
    }
}
