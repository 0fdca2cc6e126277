//! The gateway's own answers as local replies: the 409s of a key in flight or of an unknown
//! outcome, its errors (from the table in [`crate::codes`]) in the route's shape, the route's
//! duplicate response, and any of them turned into a trailers-only gRPC answer. Above
//! `answers` (the shape) and `response` (the reply and the stored-response codec).

use crate::answers::{Answer, Answers};
use crate::codes::ErrorCode;
use crate::policy::DuplicateResponse;
use crate::response::{json_reply, rfc3339, LocalReply};

impl LocalReply {
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
    error_with_status(answers, code, code.status(), message)
}

/// [`error`] with another status than the code's own: a protocol that fixes its own (OASIS
/// Repeatable Requests answers a reused id with 400, not 422).
pub fn error_with_status(answers: &Answers, code: ErrorCode, status: u16, message: &str) -> LocalReply {
    answers.render(&Answer { status, code: code.as_str(), message, retryable: code.retryable(), ..Default::default() })
}

/// One of the token and replay endpoints' plain JSON answers (`{"code","message"}`).
pub fn plain_error(code: ErrorCode, message: &str) -> LocalReply {
    json_reply(code.status(), code.as_str(), message, &[])
}
