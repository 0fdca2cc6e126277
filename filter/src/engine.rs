//! The decision engine: for a request on a policy route, forward it (with a claim) or answer it;
//! for a forwarded request, decide what its outcome does to the claim.
//!
//! Host-independent: the glue feeds it a [`RequestView`] and a [`Host`], and carries out the
//! returned [`Verdict`].

use crate::fingerprint::fingerprint;
use crate::host::Host;
use crate::key::{self, KeyError, RequestView};
use crate::policy::{Bundle, Mode, OnCompleted, RoutePolicy};
use crate::response::{self, LocalReply, StoredResponse};
use crate::store::{Claim, Completion, SharedStore, StoreError, Ticket};

/// Every outcome the filter counts, as `idem.<route>.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Forwarded,
    Replayed,
    RejectedDuplicate,
    InFlight,
    KeyReused,
    MissingKey,
    InvalidKey,
    BodyTooLarge,
    StoreError,
    Stored,
    Released,
    Held,
    Tombstoned,
    LeaseLost,
    NoKey,
    ShadowWouldBlock,
}

impl Outcome {
    pub const ALL: [Outcome; 16] = [
        Outcome::Forwarded,
        Outcome::Replayed,
        Outcome::RejectedDuplicate,
        Outcome::InFlight,
        Outcome::KeyReused,
        Outcome::MissingKey,
        Outcome::InvalidKey,
        Outcome::BodyTooLarge,
        Outcome::StoreError,
        Outcome::Stored,
        Outcome::Released,
        Outcome::Held,
        Outcome::Tombstoned,
        Outcome::LeaseLost,
        Outcome::NoKey,
        Outcome::ShadowWouldBlock,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::RejectedDuplicate => "rejected_duplicate",
            Outcome::InFlight => "in_flight",
            Outcome::KeyReused => "key_reused",
            Outcome::MissingKey => "missing_key",
            Outcome::InvalidKey => "invalid_key",
            Outcome::BodyTooLarge => "body_too_large",
            Outcome::StoreError => "store_error",
            Outcome::Stored => "stored",
            Outcome::Released => "released",
            Outcome::Held => "held",
            Outcome::Tombstoned => "tombstoned",
            Outcome::LeaseLost => "lease_lost",
            Outcome::NoKey => "no_key",
            Outcome::ShadowWouldBlock => "shadow_would_block",
        }
    }

    pub fn index(self) -> usize {
        Outcome::ALL.iter().position(|o| *o == self).unwrap_or(0)
    }
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Let it through; with a ticket, its outcome must be reported with [`Engine::finish`].
    Forward(Option<Ticket>),
    Reply(LocalReply),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    pub action: Action,
    /// Why, for the log line (e.g. `completed`, `in_flight`, `fingerprint_mismatch`).
    pub cause: String,
    /// The client's key, for the (truncated) log line.
    pub key: Option<String>,
}

/// How a forwarded request ended, as the glue observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// A response came back. `body` is `None` when it was not seen to the end (client gone) or
    /// grew past the route's `max_response_bytes`. `details` is Envoy's `response.code_details`
    /// (`via_upstream` when the upstream produced it).
    Response { status: u16, headers: Vec<(String, String)>, body: Option<Vec<u8>>, details: String },
    /// No response: the client went away, or the stream was reset.
    NoResponse { forwarded: bool },
}

pub struct Engine {
    pub bundle: Bundle,
    store: SharedStore,
}

impl Engine {
    pub fn new(bundle: Bundle) -> Self {
        let store = SharedStore::new(&bundle.shared);
        Engine { bundle, store }
    }

    /// Creates the store's bucket keys; call when the plugin configures.
    pub fn initialise(&self, host: &dyn Host) -> Result<u32, StoreError> {
        self.store.initialise(host)
    }

    pub fn policy(&self, route: usize) -> Option<&RoutePolicy> {
        self.bundle.routes.get(route)
    }

    /// Answers what can be answered from the headers alone: a header or query key that is
    /// missing or malformed. `None` means: go on (buffer the body if the policy needs it).
    pub fn precheck(&self, route: usize, req: &dyn RequestView) -> Option<Verdict> {
        let policy = self.policy(route)?;
        if policy.key.from == crate::policy::KeySource::Body {
            return None;
        }
        match key::extract(&policy.key, req) {
            Ok(_) => None,
            Err(e) => Some(self.key_error(policy, e)),
        }
    }

    /// The request body is larger than the route allows.
    pub fn body_too_large(&self, route: usize) -> Option<Verdict> {
        let policy = self.policy(route)?;
        let reply = response::json_reply(
            413,
            "IDEMPOTENCY_BODY_TOO_LARGE",
            &format!("the request body exceeds {} bytes", policy.max_body_bytes),
            &[],
        );
        Some(shadowed(policy, Outcome::BodyTooLarge, reply, "body_too_large".into(), None))
    }

    /// The full decision for a request whose key (and body, if needed) is available.
    pub fn decide(&self, host: &dyn Host, route: usize, req: &dyn RequestView) -> Option<Verdict> {
        let policy = self.policy(route)?;
        let client_key = match key::extract(&policy.key, req) {
            Ok(k) => k,
            Err(e) => return Some(self.key_error(policy, e)),
        };
        let id = key::scoped_id(&policy.name, &policy.key.scope, &client_key, req);
        let fp = fingerprint(&policy.key, req);
        let now = host.now_ms();
        let claim = match self.store.claim(host, &id, &fp, policy.key.lock_ttl.millis) {
            Ok(c) => c,
            Err(e) => {
                let reply = response::json_reply(
                    503,
                    "IDEMPOTENCY_STORE_UNAVAILABLE",
                    "the idempotency store is unavailable; retry later",
                    &[],
                );
                return Some(shadowed(policy, Outcome::StoreError, reply, e.to_string(), Some(client_key)));
            }
        };
        let reused = || {
            response::json_reply(
                422,
                "IDEMPOTENCY_KEY_REUSED",
                "this idempotency key was already used with a different request",
                &[],
            )
        };
        let k = Some(client_key);
        Some(match claim {
            Claim::Claimed(ticket) => Verdict {
                outcome: Outcome::Forwarded,
                action: Action::Forward(Some(ticket)),
                cause: "first".into(),
                key: k,
            },
            Claim::InFlight { same_payload: false, .. } | Claim::Completed { same_payload: false, .. } => {
                shadowed(policy, Outcome::KeyReused, reused(), "fingerprint_mismatch".into(), k)
            }
            Claim::InFlight { first_seen_ms, lease_ends_ms, .. } => shadowed(
                policy,
                Outcome::InFlight,
                response::in_progress(first_seen_ms, now, lease_ends_ms),
                "in_flight".into(),
                k,
            ),
            Claim::Completed { response: Some(stored), .. } if policy.key.on_completed == OnCompleted::Replay => {
                shadowed(policy, Outcome::Replayed, stored.replay(), "completed".into(), k)
            }
            Claim::Completed { first_seen_ms, response, .. } => {
                let cause = if response.is_none() { "tombstone" } else { "completed" };
                shadowed(
                    policy,
                    Outcome::RejectedDuplicate,
                    response::duplicate(&policy.duplicate, first_seen_ms),
                    cause.into(),
                    k,
                )
            }
        })
    }

    fn key_error(&self, policy: &RoutePolicy, e: KeyError) -> Verdict {
        match e {
            KeyError::Missing(_) if !policy.key.required => Verdict {
                outcome: Outcome::NoKey,
                action: Action::Forward(None),
                cause: "no_key_not_required".into(),
                key: None,
            },
            KeyError::Missing(why) => {
                let reply = response::json_reply(400, "IDEMPOTENCY_KEY_MISSING", &why, &[]);
                shadowed(policy, Outcome::MissingKey, reply, "missing_key".into(), None)
            }
            KeyError::Invalid(why) => {
                let reply = response::json_reply(400, "IDEMPOTENCY_KEY_INVALID", &why, &[]);
                shadowed(policy, Outcome::InvalidKey, reply, "invalid_key".into(), None)
            }
        }
    }

    /// Records how a forwarded request ended. Returns the outcome to count, with its cause.
    pub fn finish(&self, host: &dyn Host, route: usize, ticket: &Ticket, ending: Ending) -> (Outcome, String) {
        let Some(policy) = self.policy(route) else {
            return (Outcome::StoreError, "unknown route".into());
        };
        let release = |cause: String| match self.store.release(host, ticket) {
            Ok(true) => (Outcome::Released, cause),
            Ok(false) => (Outcome::LeaseLost, format!("{cause}; lease already taken over")),
            Err(e) => (Outcome::StoreError, format!("{cause}; release failed: {e}")),
        };
        match ending {
            Ending::NoResponse { forwarded: false } => release("not_forwarded".into()),
            // The service may have done the work: keep the claim until its lease ends.
            Ending::NoResponse { forwarded: true } => (Outcome::Held, "no_response".into()),
            Ending::Response { status, details, .. } if !is_upstream_answer(&details) && status >= 500 => {
                if never_reached_upstream(&details) {
                    release(format!("upstream_unreachable:{details}"))
                } else {
                    (Outcome::Held, format!("outcome_unknown:{details}"))
                }
            }
            Ending::Response { status, .. } if !policy.key.remembers(status) => release(format!("status_{status}")),
            Ending::Response { status, headers, body, .. } => {
                let stored = StoredResponse::new(status, headers, body.clone().unwrap_or_default());
                // A body we did not see whole is remembered as a tombstone: status only.
                let limit = if body.is_some() { policy.max_response_bytes as usize } else { 0 };
                match self.store.complete(host, ticket, &stored, limit, policy.key.ttl.millis) {
                    Ok(Completion::Stored) => (Outcome::Stored, format!("status_{status}")),
                    Ok(Completion::Tombstoned) => (Outcome::Tombstoned, format!("status_{status}")),
                    Ok(Completion::LostOwnership) => (Outcome::LeaseLost, "lease_expired".into()),
                    Err(e) => (Outcome::StoreError, format!("complete failed: {e}")),
                }
            }
        }
    }
}

/// In shadow mode nothing is blocked: the would-be answer is only counted and logged.
fn shadowed(policy: &RoutePolicy, outcome: Outcome, reply: LocalReply, cause: String, key: Option<String>) -> Verdict {
    match policy.mode {
        Mode::Key => Verdict { outcome, action: Action::Reply(reply), cause, key },
        Mode::Shadow => Verdict {
            outcome: Outcome::ShadowWouldBlock,
            action: Action::Forward(None),
            cause: format!("would_{}:{}", outcome.name(), cause),
            key,
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
