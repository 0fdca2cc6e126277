//! The gateway's own answers, one table: for each stable code its HTTP status, title, gRPC code,
//! whether the same request again may succeed, and the situation it answers (the line the docs'
//! guarantee table carries; a test compares them). Every answer the filter makes of its own —
//! in the route's shape ([`crate::response::error`]), as gRPC ([`crate::grpc::status_for`]), or
//! the token and replay endpoints' plain JSON — takes its code and status from here, so a code
//! cannot be misspelt at a call site and fall through to a default.

use self::grpc_code as grpc;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    RequestInProgress,
    OutcomeUnknown,
    KeyReused,
    KeyMissing,
    KeyInvalid,
    ScopeMissing,
    TokenMissing,
    TokenInvalid,
    BodyTooLarge,
    StoreUnavailable,
    Misconfigured,
    NoPolicy,
    UpstreamUnavailable,
    HeaderInvalid,
    MediaTypeUnsupported,
    TokenRouteRequired,
    TokenMethodNotAllowed,
    ReplayGone,
    RepeatabilityExpired,
}

/// One row of the table.
struct Row {
    code: &'static str,
    status: u16,
    title: &'static str,
    grpc: u32,
    /// The same request again may succeed (`{{should_retry}}`, gRPC retry pushback).
    retryable: bool,
    /// Rendered in the route's answer shape (`[answers]`), so `[answers.codes]` may map it; the
    /// others are the token and replay endpoints' plain JSON.
    shaped: bool,
    /// The situation it answers, as the docs' guarantee table says it.
    when: &'static str,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::RequestInProgress,
        ErrorCode::OutcomeUnknown,
        ErrorCode::KeyReused,
        ErrorCode::KeyMissing,
        ErrorCode::KeyInvalid,
        ErrorCode::ScopeMissing,
        ErrorCode::TokenMissing,
        ErrorCode::TokenInvalid,
        ErrorCode::BodyTooLarge,
        ErrorCode::StoreUnavailable,
        ErrorCode::Misconfigured,
        ErrorCode::NoPolicy,
        ErrorCode::UpstreamUnavailable,
        ErrorCode::HeaderInvalid,
        ErrorCode::MediaTypeUnsupported,
        ErrorCode::TokenRouteRequired,
        ErrorCode::TokenMethodNotAllowed,
        ErrorCode::ReplayGone,
        ErrorCode::RepeatabilityExpired,
    ];

    const fn row(self) -> Row {
        let (code, status, title, grpc, retryable, shaped, when) = match self {
            ErrorCode::RequestInProgress => (
                "REQUEST_IN_PROGRESS",
                409,
                "A request with this idempotency key is in progress",
                grpc::UNAVAILABLE,
                true,
                true,
                "a repeat while the first request is in flight",
            ),
            ErrorCode::OutcomeUnknown => (
                "IDEMPOTENCY_OUTCOME_UNKNOWN",
                409,
                "The outcome of the first request is unknown",
                grpc::FAILED_PRECONDITION,
                false,
                true,
                "a repeat of a request whose outcome is unknown (held)",
            ),
            ErrorCode::KeyReused => (
                "IDEMPOTENCY_KEY_REUSED",
                422,
                "Idempotency key reused with another request",
                grpc::FAILED_PRECONDITION,
                false,
                true,
                "the key again with another request (another fingerprint)",
            ),
            ErrorCode::KeyMissing => (
                "IDEMPOTENCY_KEY_MISSING",
                400,
                "Idempotency key missing",
                grpc::INVALID_ARGUMENT,
                false,
                true,
                "no key where the route reads it",
            ),
            ErrorCode::KeyInvalid => (
                "IDEMPOTENCY_KEY_INVALID",
                400,
                "Idempotency key invalid",
                grpc::INVALID_ARGUMENT,
                false,
                true,
                "a key that is empty, too long, has control characters, or is ambiguous",
            ),
            ErrorCode::ScopeMissing => (
                "IDEMPOTENCY_SCOPE_MISSING",
                400,
                "Caller identity missing",
                grpc::UNAUTHENTICATED,
                false,
                true,
                "no caller identity where `scope` reads it",
            ),
            ErrorCode::TokenMissing => (
                "IDEMPOTENCY_TOKEN_MISSING",
                400,
                "Idempotency token missing",
                grpc::INVALID_ARGUMENT,
                false,
                true,
                "a token route's request without a token",
            ),
            ErrorCode::TokenInvalid => (
                "IDEMPOTENCY_TOKEN_INVALID",
                400,
                "Idempotency token invalid",
                grpc::INVALID_ARGUMENT,
                false,
                true,
                "a token this gateway did not issue (or issued to another caller or route)",
            ),
            ErrorCode::BodyTooLarge => (
                "IDEMPOTENCY_BODY_TOO_LARGE",
                413,
                "Request body too large",
                grpc::RESOURCE_EXHAUSTED,
                false,
                true,
                "a body above the route's `max_body_bytes` where the key or fingerprint needs it",
            ),
            ErrorCode::StoreUnavailable => (
                "IDEMPOTENCY_STORE_UNAVAILABLE",
                503,
                "Idempotency store unavailable",
                grpc::UNAVAILABLE,
                true,
                true,
                "the store cannot be reached or is full (`on_store_error = \"reject\"`)",
            ),
            ErrorCode::Misconfigured => (
                "IDEMPOTENCY_MISCONFIGURED",
                500,
                "Gateway misconfigured",
                grpc::INTERNAL,
                false,
                true,
                "the gateway withholds the body the route needs (`allow_on_headers_stop_iteration` off)",
            ),
            ErrorCode::NoPolicy => (
                "IDEMPOTENCY_NO_POLICY",
                400,
                "No idempotency policy",
                grpc::FAILED_PRECONDITION,
                false,
                true,
                "a request no policy matches, with `unmatched = \"reject\"`",
            ),
            ErrorCode::UpstreamUnavailable => (
                "IDEMPOTENCY_UPSTREAM_UNAVAILABLE",
                503,
                "Upstream unavailable",
                grpc::UNAVAILABLE,
                true,
                true,
                "a detached request that cannot be sent (its cluster is missing)",
            ),
            ErrorCode::HeaderInvalid => (
                "IDEMPOTENCY_HEADER_INVALID",
                400,
                "Header invalid",
                grpc::INVALID_ARGUMENT,
                false,
                true,
                "a header the gateway reads is malformed",
            ),
            ErrorCode::MediaTypeUnsupported => (
                "IDEMPOTENCY_MEDIA_TYPE_UNSUPPORTED",
                415,
                "Media type not supported on this route",
                grpc::INVALID_ARGUMENT,
                false,
                true,
                "a body whose content type the route's key cannot be read from",
            ),
            ErrorCode::TokenRouteRequired => (
                "IDEMPOTENCY_TOKEN_ROUTE_REQUIRED",
                400,
                "Token route required",
                grpc::INVALID_ARGUMENT,
                false,
                false,
                "a token asked for where several routes issue them, without `?route=`",
            ),
            ErrorCode::TokenMethodNotAllowed => (
                "METHOD_NOT_ALLOWED",
                405,
                "Method Not Allowed",
                grpc::UNIMPLEMENTED,
                false,
                false,
                "a token asked for with another method than POST",
            ),
            ErrorCode::ReplayGone => (
                "IDEMPOTENCY_REPLAY_GONE",
                404,
                "Replay gone",
                grpc::NOT_FOUND,
                false,
                false,
                "the echo listener asked for a gRPC replay it no longer holds (internal)",
            ),
            ErrorCode::RepeatabilityExpired => (
                "REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW",
                412,
                "Repeatability-First-Sent outside the window",
                grpc::FAILED_PRECONDITION,
                false,
                true,
                "a Repeatable Requests route's `Repeatability-First-Sent` before its window (`key.ttl`) or too far ahead",
            ),
        };
        Row { code, status, title, grpc, retryable, shaped, when }
    }

    /// The stable code clients and `[answers.codes]` see.
    pub const fn as_str(self) -> &'static str {
        self.row().code
    }

    pub const fn status(self) -> u16 {
        self.row().status
    }

    /// problem+json's `title`, `{{title}}`.
    pub const fn title(self) -> &'static str {
        self.row().title
    }

    /// The gRPC status of this answer to a gRPC call: never `UNKNOWN`, `INTERNAL` only for the
    /// gateway's own misconfiguration.
    pub const fn grpc(self) -> u32 {
        self.row().grpc
    }

    /// The same request again may succeed shortly.
    pub const fn retryable(self) -> bool {
        self.row().retryable
    }

    /// Rendered in the route's answer shape; `[answers.codes]` may map it.
    pub const fn shaped(self) -> bool {
        self.row().shaped
    }

    /// The situation it answers (the docs' guarantee table).
    pub const fn when(self) -> &'static str {
        self.row().when
    }

    /// The code named `code`, if it is one of the gateway's.
    pub fn parse(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == code)
    }
}

/// gRPC status codes (the `grpc-status` values).
pub mod grpc_code {
    pub const OK: u32 = 0;
    pub const CANCELLED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 3;
    pub const DEADLINE_EXCEEDED: u32 = 4;
    pub const NOT_FOUND: u32 = 5;
    pub const ALREADY_EXISTS: u32 = 6;
    pub const PERMISSION_DENIED: u32 = 7;
    pub const RESOURCE_EXHAUSTED: u32 = 8;
    pub const FAILED_PRECONDITION: u32 = 9;
    pub const OUT_OF_RANGE: u32 = 11;
    pub const UNIMPLEMENTED: u32 = 12;
    pub const INTERNAL: u32 = 13;
    pub const UNAVAILABLE: u32 = 14;
    pub const UNAUTHENTICATED: u32 = 16;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_read_back() {
        for (i, c) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(ErrorCode::parse(c.as_str()), Some(*c));
            assert!(ErrorCode::ALL[..i].iter().all(|d| d.as_str() != c.as_str()), "{c:?} twice");
            assert!((400..600).contains(&c.status()), "{c:?}");
            // Never UNKNOWN, never OK for an error.
            assert!(c.grpc() != grpc::OK && c.grpc() != 2, "{c:?}");
        }
        assert_eq!(ErrorCode::parse("DUPLICATE_REQUEST"), None);
    }
}
