//! What a forwarded request's ending does to its claim (complete, release, hold as unknown),
//! whatever the store, and how what the store did is counted.

use super::verdict::{Body, Ending, Finish, Ticket};
use super::{Engine, Outcome};
use crate::policy::KeyPolicy;
use crate::policy::RouteId;
use crate::response::StoredResponse;
use crate::store::operator::HeldNote;
use crate::store::{StoreError, Write, WriteKind, Written};

impl Engine {
    /// What finishing a ticket must do, whatever the store. `key` (the client's, for the
    /// operator's list) goes into the note of an unknown outcome.
    pub fn plan_finish(&self, route: RouteId, ticket: &Ticket, ending: Ending, key: Option<&str>) -> Finish {
        let policy = self.policy(route);
        let result = classify(&policy.key, &ending);
        let write = |write, cause| Finish::Write { write, cause };
        if let Ticket::Token(_) = ticket {
            return match result {
                Ended::Failed(cause) if policy.token.restore_on_failure => write(Write::RestoreToken, cause),
                Ended::Failed(cause) | Ended::Unknown(cause) => Finish::Nothing { outcome: None, cause },
                Ended::Answered => Finish::Nothing { outcome: None, cause: String::new() },
            };
        }
        match (result, ending) {
            (Ended::Failed(cause), _) => write(Write::Release, cause),
            // The service may have done the work: hold the claim, and never let a retry take it over.
            (Ended::Unknown(cause), _) => {
                let note = HeldNote::new(&policy.name, key);
                write(Write::HoldUnknown { hold_ms: policy.key.unknown_hold_ms(), note }, cause)
            }
            (Ended::Answered, Ending::Response { status, grpc: false, .. }) if !policy.key.remembers(status) => {
                write(Write::Release, status_cause(status))
            }
            (Ended::Answered, Ending::Response { body, .. })
                if policy.key.success_body_contains.as_ref().is_some_and(|marker| !contains(&body, marker)) =>
            {
                write(Write::Release, "no_success_marker".into())
            }
            (Ended::Answered, Ending::Response { status, headers, body, trailers, .. }) => {
                // A body too large to store is remembered as a tombstone: status only.
                let (bytes, limit) = match body {
                    Body::Whole(b) => (b, policy.max_response_bytes as usize),
                    Body::TooLarge | Body::Cut => (Vec::new(), 0),
                };
                let complete = Write::Complete {
                    response: StoredResponse::new(status, headers, bytes).with_trailers(trailers),
                    max_response_bytes: limit,
                    ttl_ms: policy.key.ttl.millis,
                };
                write(complete, status_cause(status))
            }
            (Ended::Answered, Ending::NoResponse { .. }) => Finish::Nothing { outcome: None, cause: String::new() },
        }
    }
}

/// `status_<code>`: the cause of every answered request, written without `format!`.
fn status_cause(status: u16) -> String {
    let mut cause = String::with_capacity(12);
    cause.push_str("status_");
    crate::store::text::push_decimal(&mut cause, u64::from(status));
    cause
}

/// Whether a body seen whole holds `marker`.
fn contains(body: &Body, marker: &str) -> bool {
    matches!(body, Body::Whole(b) if b.windows(marker.len().max(1)).any(|w| w == marker.as_bytes()))
}

/// What a write did, as the outcome to count (if any) and its cause, on either store.
pub fn finished(kind: WriteKind, r: Result<Written, StoreError>, cause: String) -> (Option<Outcome>, String) {
    let failed =
        |what: &str, e: StoreError, cause: String| (Some(Outcome::StoreError), format!("{cause}; {what} failed: {e}"));
    match (kind, r) {
        (WriteKind::Complete, Ok(Written::Applied)) => (Some(Outcome::Stored), cause),
        (WriteKind::Complete, Ok(Written::Tombstoned)) => (Some(Outcome::Tombstoned), cause),
        (WriteKind::Complete, Ok(Written::NotOurs)) => (Some(Outcome::LeaseLost), "lease_expired".into()),
        (WriteKind::Complete, Err(e)) => (Some(Outcome::StoreError), format!("complete failed: {e}")),
        (WriteKind::Release, Ok(Written::NotOurs)) | (WriteKind::HoldUnknown, Ok(Written::NotOurs)) => {
            (Some(Outcome::LeaseLost), format!("{cause}; lease already taken over"))
        }
        (WriteKind::Release, Ok(_)) => (Some(Outcome::Released), cause),
        (WriteKind::Release, Err(e)) => failed("release", e, cause),
        (WriteKind::HoldUnknown, Ok(_)) => (Some(Outcome::Held), cause),
        (WriteKind::HoldUnknown, Err(e)) => failed("hold", e, cause),
        (WriteKind::RestoreToken, Ok(Written::NotOurs)) => (None, format!("{cause}; token no longer ours")),
        (WriteKind::RestoreToken, Ok(_)) => (Some(Outcome::TokenRestored), cause),
        (WriteKind::RestoreToken, Err(e)) => failed("restore", e, cause),
        (WriteKind::Lookup, Ok(Written::NotOurs)) => (None, format!("{cause}; key changed")),
        (WriteKind::Lookup, Ok(_)) => (None, format!("{cause}; written")),
        (WriteKind::Lookup, Err(e)) => failed("lookup write", e, cause),
    }
}

/// How a forwarded request ended, for the claim.
enum Ended {
    /// Definitely failed: the upstream answered 5xx, or the request never reached it.
    Failed(String),
    /// Forwarded, and no answer: the service may have done the work.
    Unknown(String),
    /// The upstream answered below 500.
    Answered,
}

fn classify(policy: &KeyPolicy, ending: &Ending) -> Ended {
    match ending {
        Ending::NoResponse { forwarded: false } => Ended::Failed("not_forwarded".into()),
        Ending::NoResponse { forwarded: true } => Ended::Unknown("no_response".into()),
        Ending::Response { grpc: true, .. } => classify_grpc(policy, ending),
        Ending::Response { status, details, .. } if *status >= 500 && !is_upstream_answer(details) => {
            if never_reached_upstream(details) {
                Ended::Failed(format!("upstream_unreachable:{details}"))
            } else {
                Ended::Unknown(format!("outcome_unknown:{details}"))
            }
        }
        Ending::Response { status, .. } if *status >= 500 => Ended::Failed(status_cause(*status)),
        // Headers came and the body was cut (upstream reset, client gone mid-body): the service
        // answered, and what it answered is lost — an unknown outcome, never a tombstone.
        Ending::Response { body: Body::Cut, .. } => Ended::Unknown("body_cut".into()),
        Ending::Response { .. } => Ended::Answered,
    }
}

/// A gRPC call's ending, by its `grpc-status` (HTTP is 200 for failures too).
fn classify_grpc(policy: &KeyPolicy, ending: &Ending) -> Ended {
    let Ending::Response { status, headers, body, trailers, details, .. } = ending else {
        return Ended::Unknown("no_response".into());
    };
    // Envoy answered the call itself (connect failure, route timeout, stream duration): its
    // grpc-status says what Envoy saw, and the details whether the service was reached.
    if !is_upstream_answer(details) {
        return if never_reached_upstream(details) {
            Ended::Failed(format!("upstream_unreachable:{details}"))
        } else {
            Ended::Unknown(format!("outcome_unknown:{details}"))
        };
    }
    if *body == Body::Cut {
        return Ended::Unknown("body_cut".into());
    }
    let grpc_status = |fields: &[crate::response::Header]| {
        let value = fields.iter().find(|(n, _)| n == "grpc-status").map(|(_, v)| v.as_slice())?;
        std::str::from_utf8(value).ok()?.trim().parse::<u32>().ok()
    };
    match grpc_status(trailers).or_else(|| grpc_status(headers)) {
        None if *status >= 500 => Ended::Failed(status_cause(*status)),
        None => Ended::Unknown("grpc_status_missing".into()),
        Some(code) => match crate::grpc::outcome(policy, code) {
            crate::grpc::Outcome::Completed => Ended::Answered,
            crate::grpc::Outcome::Failed => Ended::Failed(format!("grpc_status_{code}")),
            crate::grpc::Outcome::Unknown => Ended::Unknown(format!("grpc_status_{code}")),
        },
    }
}

/// Whether Envoy's `response.code_details` says the upstream produced the answer (empty: the
/// host did not say, as for an upstream answer).
pub fn is_upstream_answer(details: &str) -> bool {
    details.is_empty() || details == "via_upstream"
}

/// Local replies that prove the request never reached the upstream service.
fn never_reached_upstream(details: &str) -> bool {
    ["connection_failure", "no_healthy_upstream", "cluster_not_found", "route_not_found", "overflow", "no_route"]
        .iter()
        .any(|d| details.contains(d))
}
