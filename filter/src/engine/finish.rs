//! What a forwarded request's ending does to its claim (complete, release, hold as unknown), on
//! either store; lease renewal; and the mark of a Redis answer not written yet.

use super::verdict::{Body, Ending, Finish, StoreTicket, Ticket};
use super::{shadowed, Engine, Outcome, Prepared, StoreOp, Verdict};
use crate::host::Host;
use crate::policy::KeyPolicy;
use crate::policy::RouteId;
use crate::response::StoredResponse;
use crate::store::operator::HeldNote;
use crate::store::{shared, Answer, Claim, Completion, StoreError};

impl Engine {
    /// Redis routes: what this Envoy process knows of a key without asking Redis, as a verdict.
    /// `id` is the key's scoped id, which names its entry in this process' shared store (a
    /// Redis route keeps nothing else there, and ids of different routes differ).
    ///
    /// - An answer Redis refused so far (marked with [`Engine::mark_unwritten`]): a retry that
    ///   reaches the process meanwhile gets 409 `REQUEST_IN_PROGRESS` instead of claiming a key
    ///   whose Redis lease may have run out during the outage — the one way it could run the
    ///   business again.
    /// - A completed answer seen here (written by this process or read back from Redis; see
    ///   [`Engine::remember_answer`]): replayed (or refused as a duplicate, or as a reused key)
    ///   exactly as Redis' copy would be, without a round trip. A completed record never changes
    ///   in Redis until it expires, and the local copy expires no later.
    pub fn local_answer(
        &self,
        host: &dyn Host,
        p: &Prepared,
        id: &[u8; 32],
        waiting_until: Option<u64>,
    ) -> Option<Verdict> {
        let fingerprint = match &p.op {
            StoreOp::Claim { fingerprint, .. } => fingerprint,
            StoreOp::UseToken { .. } => &crate::fingerprint::NONE,
        };
        let claim = self.shared.lookup(host, id, fingerprint).ok()??;
        let policy = self.policy(p.route);
        match claim {
            Claim::InFlight { first_seen_ms, .. } => {
                let reply = crate::replies::in_progress(&policy.answers, first_seen_ms);
                Some(shadowed(policy, Outcome::InFlight, reply, "answer_not_yet_written".into(), Some(p.key.clone())))
            }
            // Copies are written by this version (never a legacy digest), so this is settled.
            Claim::Completed { first_seen_ms, status, response, payload } if matches!(p.op, StoreOp::Claim { .. }) => {
                let found = Claim::Completed { first_seen_ms, status, response, payload };
                Some(self.after_claim(p, Ok(found), host.now_ms(), waiting_until))
            }
            _ => None,
        }
    }

    /// Keeps a completed Redis answer in this process for repeats of its key, for at most
    /// `[redis] answer_cache` and never past the record's own expiry in Redis (first seen plus
    /// the route's `ttl`: the record was written later, so it lives longer).
    pub fn remember_answer(&self, host: &dyn Host, route: RouteId, id: &[u8; 32], answer: &Answer) {
        let Some(cfg) = self.bundle.redis.as_ref() else {
            return;
        };
        let policy = self.policy(route);
        let now = host.now_ms();
        let expires = answer.first_seen_ms.saturating_add(policy.key.ttl.millis);
        let until = now.saturating_add(cfg.answer_cache.millis).min(expires);
        if until > now {
            let _ = self.shared.remember(host, id, answer, until);
        }
    }

    /// Marks a Redis key whose answer is being retried, until `until_ms` at the latest.
    pub fn mark_unwritten(&self, host: &dyn Host, id: &[u8; 32], until_ms: u64) -> Option<shared::Ticket> {
        let lease = until_ms.saturating_sub(host.now_ms()).max(1);
        match self.shared.claim(host, id, &crate::fingerprint::NONE, lease, 0) {
            Ok(Claim::Claimed(t)) => Some(t),
            _ => None,
        }
    }

    /// The answer landed (or was given up): the mark goes.
    pub fn unmark_unwritten(&self, host: &dyn Host, mark: &shared::Ticket) {
        let _ = self.shared.release(host, mark);
    }

    /// What finishing a ticket must do, whatever the store.
    pub fn plan_finish(&self, route: RouteId, ticket: &Ticket, ending: Ending) -> Finish {
        let policy = self.policy(route);
        let result = classify(&policy.key, &ending);
        if let Ticket::Token(_) = ticket {
            return match result {
                Ended::Failed(cause) if policy.token.restore_on_failure => Finish::RestoreToken { cause },
                Ended::Failed(cause) | Ended::Unknown(cause) => Finish::Nothing { outcome: None, cause },
                Ended::Answered => Finish::Nothing { outcome: None, cause: String::new() },
            };
        }
        match (result, ending) {
            (Ended::Failed(cause), _) => Finish::Release { cause },
            // The service may have done the work: hold the claim, and never let a retry take it over.
            (Ended::Unknown(cause), _) => Finish::HoldUnknown { hold_ms: policy.key.unknown_hold_ms(), cause },
            (Ended::Answered, Ending::Response { status, grpc: false, .. }) if !policy.key.remembers(status) => {
                Finish::Release { cause: format!("status_{status}") }
            }
            (Ended::Answered, Ending::Response { body, .. })
                if policy.key.success_body_contains.as_ref().is_some_and(|marker| !contains(&body, marker)) =>
            {
                Finish::Release { cause: "no_success_marker".into() }
            }
            (Ended::Answered, Ending::Response { status, headers, body, trailers, .. }) => {
                // A body too large to store is remembered as a tombstone: status only.
                let (bytes, limit) = match body {
                    Body::Whole(b) => (b, policy.max_response_bytes as usize),
                    Body::TooLarge | Body::Cut => (Vec::new(), 0),
                };
                Finish::Complete {
                    response: StoredResponse::new(status, headers, bytes).with_trailers(trailers),
                    max_response_bytes: limit,
                    ttl_ms: policy.key.ttl.millis,
                    cause: format!("status_{status}"),
                }
            }
            (Ended::Answered, Ending::NoResponse { .. }) => Finish::Nothing { outcome: None, cause: String::new() },
        }
    }

    /// Finishes a ticket on the shared store. Returns the outcome to count (if any) and its cause.
    pub fn finish_shared(
        &self,
        host: &dyn Host,
        route: RouteId,
        ticket: &Ticket,
        ending: Ending,
    ) -> (Option<Outcome>, String) {
        let (Ticket::Claim(StoreTicket::Shared(t)) | Ticket::Token(StoreTicket::Shared(t))) = ticket else {
            return (Some(Outcome::StoreError), "not a shared-store ticket".into());
        };
        match self.plan_finish(route, ticket, ending) {
            Finish::Nothing { outcome, cause } => (outcome, cause),
            Finish::Release { cause } => released(self.shared.release(host, t), cause),
            Finish::RestoreToken { cause } => restored(self.shared.restore_token(host, t), cause),
            Finish::Complete { response, max_response_bytes, ttl_ms, cause } => {
                completed(self.shared.complete(host, t, &response, max_response_bytes, ttl_ms), cause)
            }
            Finish::HoldUnknown { hold_ms, cause } => held(self.shared.hold_unknown(host, t, hold_ms), cause),
        }
    }

    /// Notes the route and key of an unknown outcome just held on the shared store, for the
    /// operator's list.
    pub fn note_held(&self, host: &dyn Host, t: &shared::Ticket, note: &HeldNote) -> Result<(), StoreError> {
        self.shared.note_held(host, t, note)
    }

    /// Extends the lease of a claim on the shared store whose request still waits for the
    /// upstream: while the gateway lives, a slow request is never taken over. `Ok(false)` when
    /// the claim is no longer this ticket's.
    pub fn renew_shared(&self, host: &dyn Host, route: RouteId, ticket: &shared::Ticket) -> Result<bool, StoreError> {
        let lease = self.lock_ttl_ms(route);
        self.shared.renew(host, ticket, lease)
    }
}

/// Whether a body seen whole holds `marker`.
fn contains(body: &Body, marker: &str) -> bool {
    matches!(body, Body::Whole(b) if b.windows(marker.len().max(1)).any(|w| w == marker.as_bytes()))
}

/// The outcome of a release, on either store.
pub fn released(r: Result<bool, StoreError>, cause: String) -> (Option<Outcome>, String) {
    match r {
        Ok(true) => (Some(Outcome::Released), cause),
        Ok(false) => (Some(Outcome::LeaseLost), format!("{cause}; lease already taken over")),
        Err(e) => (Some(Outcome::StoreError), format!("{cause}; release failed: {e}")),
    }
}

/// The outcome of holding an unknown outcome, on either store.
pub fn held(r: Result<bool, StoreError>, cause: String) -> (Option<Outcome>, String) {
    match r {
        Ok(true) => (Some(Outcome::Held), cause),
        Ok(false) => (Some(Outcome::LeaseLost), format!("{cause}; lease already taken over")),
        Err(e) => (Some(Outcome::StoreError), format!("{cause}; hold failed: {e}")),
    }
}

/// The outcome of a token restore, on either store.
pub fn restored(r: Result<bool, StoreError>, cause: String) -> (Option<Outcome>, String) {
    match r {
        Ok(true) => (Some(Outcome::TokenRestored), cause),
        Ok(false) => (None, format!("{cause}; token no longer ours")),
        Err(e) => (Some(Outcome::StoreError), format!("{cause}; restore failed: {e}")),
    }
}

/// The outcome of a completion, on either store.
pub fn completed(r: Result<Completion, StoreError>, cause: String) -> (Option<Outcome>, String) {
    match r {
        Ok(Completion::Stored) => (Some(Outcome::Stored), cause),
        Ok(Completion::Tombstoned) => (Some(Outcome::Tombstoned), cause),
        Ok(Completion::LostOwnership) => (Some(Outcome::LeaseLost), "lease_expired".into()),
        Err(e) => (Some(Outcome::StoreError), format!("complete failed: {e}")),
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

impl Engine {
    /// Why an ending leaves the outcome unknown (the request was forwarded and no answer came
    /// back, or a gRPC call ended DEADLINE_EXCEEDED/CANCELLED), or `None` when it is known.
    pub fn unknown_cause(&self, route: RouteId, ending: &Ending) -> Option<String> {
        let policy = self.policy(route);
        match classify(&policy.key, ending) {
            Ended::Unknown(cause) => Some(cause),
            _ => None,
        }
    }
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
        Ending::Response { status, .. } if *status >= 500 => Ended::Failed(format!("status_{status}")),
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
        None if *status >= 500 => Ended::Failed(format!("status_{status}")),
        None => Ended::Unknown("grpc_status_missing".into()),
        Some(code) => match crate::grpc::outcome(policy, code) {
            crate::grpc::Outcome::Completed => Ended::Answered,
            crate::grpc::Outcome::Failed => Ended::Failed(format!("grpc_status_{code}")),
            crate::grpc::Outcome::Unknown => Ended::Unknown(format!("grpc_status_{code}")),
        },
    }
}

/// Envoy's `response.code_details` for a response the upstream itself sent.
fn is_upstream_answer(details: &str) -> bool {
    details.is_empty() || details == "via_upstream"
}

/// Local replies that prove the request never reached the upstream service.
fn never_reached_upstream(details: &str) -> bool {
    ["connection_failure", "no_healthy_upstream", "cluster_not_found", "route_not_found", "overflow", "no_route"]
        .iter()
        .any(|d| details.contains(d))
}
