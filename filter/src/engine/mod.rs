//! The decision engine: for a request on a policy route, forward it (with a claim) or answer it;
//! for a forwarded request, decide what its outcome does to the claim.
//!
//! Host-independent. The decisions are the same on either store: a decision is split around the
//! one store operation it needs ([`Engine::begin`] → the route's store ([`Engine::store`], one
//! interface, [`crate::store::Store`]) → [`Engine::after_claim`] / [`Engine::after_token`]). The
//! lifecycle runs the operation, which answers at once (the shared store, or the answer cache in
//! front of Redis) or with the reply to the Webdis call it names. The engine makes no host call
//! itself; tests drive it on the shared store with `decide_shared` and `finish_shared`.
//!
//! - [`outcome`]: what is counted; [`verdict`]: the vocabulary of decisions (verdicts, tickets,
//!   endings); `finish`: what a forwarded request's ending does to its claim; `tokens`: the
//!   token mechanism's issue endpoint.

#[cfg(any(test, feature = "fake-host"))]
mod at_once;
mod finish;
pub mod outcome;
mod reconcile;
mod tokens;
pub mod verdict;

pub use finish::{finished, is_upstream_answer};
pub use outcome::Outcome;
pub use reconcile::{failed_cause, reconciled_absent, reconciled_ran, LookupAnswer, RECONCILED_HEADER};
pub use verdict::{Action, Begin, Body, Ending, Finish, Issue, Prepared, StoreOp, StoreTicket, Ticket, Verdict};

use crate::codes::ErrorCode;
use crate::fingerprint::fingerprint;
use crate::host::Host;
use crate::key::{self, KeyError, RequestView};
use crate::policy::RouteId;
use crate::policy::{Bundle, Forward, Mode, OnCompleted, OnInFlight, OnStoreError, RoutePolicy, StoreKind, Unmatched};
use crate::repeatability;
use crate::response::LocalReply;
use crate::store::remote::Remote;
use crate::store::shared::SharedStore;
use crate::store::{redis, Claim, RouteStore, StoreError, TokenUse};
use tokens::token_id;

pub struct Engine {
    pub bundle: Bundle,
    shared: SharedStore,
}

impl Engine {
    pub fn new(bundle: Bundle) -> Self {
        let shared = SharedStore::new(&bundle.shared);
        Engine { bundle, shared }
    }

    /// The shared store, for tests that look inside it.
    #[cfg(any(test, feature = "fake-host"))]
    pub fn shared_store(&self) -> &SharedStore {
        &self.shared
    }

    /// Creates the shared store's bucket keys; call when the plugin configures.
    pub fn initialise(&mut self, host: &dyn Host) -> Result<u32, StoreError> {
        self.shared.initialise(host)
    }

    /// The policy of a route of this engine's bundle.
    pub fn policy(&self, route: RouteId) -> &RoutePolicy {
        self.bundle.route(route)
    }

    /// A route's lease (`lock_ttl`), in milliseconds.
    pub fn lock_ttl_ms(&self, route: RouteId) -> u64 {
        self.policy(route).key.lock_ttl.millis
    }

    pub fn redis(&self) -> Option<redis::RedisStore<'_>> {
        self.bundle.redis.as_ref().map(redis::RedisStore::new)
    }

    /// Redis with this process' answer cache in front of it, when the bundle has `[redis]`.
    pub fn remote(&self) -> Option<Remote<'_>> {
        self.bundle.redis.as_ref().map(|cfg| Remote::new(cfg, &self.shared))
    }

    /// The store a route keeps its claims and tokens in.
    pub fn store(&self, route: RouteId) -> RouteStore<'_> {
        // Redis and its cache are put together only for a Redis route (every request asks).
        let remote = (self.policy(route).store == StoreKind::Redis).then(|| self.remote()).flatten();
        remote.map_or(RouteStore::Shared(&self.shared), RouteStore::Remote)
    }

    /// Whether any route forwards detached (the root context then sends upstream calls).
    pub fn has_detached(&self) -> bool {
        self.bundle.routes.iter().any(|r| r.forward == Forward::Detached)
    }

    /// The answer to a request on a filter-enabled route that no policy matches: `None` to let
    /// it pass (`unmatched = "pass"`, or a safe method), else 400 `IDEMPOTENCY_NO_POLICY`.
    pub fn unmatched(&self, method: &str) -> Option<LocalReply> {
        if self.bundle.unmatched == Unmatched::Pass || is_safe_method(method) {
            return None;
        }
        Some(crate::replies::error(
            &self.bundle.answers,
            ErrorCode::NoPolicy,
            "no idempotency policy matches this method and path on a route that requires one",
        ))
    }

    /// The shortest lease of the key routes (the root renews leases a third of it ahead).
    pub fn min_lock_ttl_ms(&self) -> Option<u64> {
        self.bundle.routes.iter().filter(|r| r.mode != Mode::Token).map(|r| r.key.lock_ttl.millis).min()
    }

    /// Whether any route holds duplicates (the root context then polls on a timer).
    pub fn has_waiters(&self) -> bool {
        self.bundle.routes.iter().any(|r| r.mode != Mode::Token && r.key.on_in_flight == OnInFlight::Wait)
    }

    /// Before buffering a body: answers a header or query key that is missing or malformed, so
    /// such a request is refused without waiting for its body. Cheap: reads the key, hashes nothing.
    /// `now_ms` is asked only on a route whose headers carry a time (Repeatable Requests).
    pub fn precheck(&self, route: RouteId, req: &dyn RequestView, now_ms: impl FnOnce() -> u64) -> Option<Verdict> {
        let policy = self.policy(route);
        if policy.mode == Mode::Token || policy.key.key_reads_body() {
            return None;
        }
        if repeatability::speaks(policy) {
            if let Some(refused) = repeatability_refusal(policy, req, now_ms()) {
                return Some(refused);
            }
        }
        key::extract(&policy.key, policy.template(), req).err().map(|e| key_error(policy, e))
    }

    /// The request body is larger than the route allows.
    pub fn body_too_large(&self, route: RouteId) -> Verdict {
        let policy = self.policy(route);
        let reply = crate::replies::error(
            &policy.answers,
            ErrorCode::BodyTooLarge,
            &format!("the request body exceeds {} bytes", policy.max_body_bytes),
        );
        shadowed(policy, Outcome::BodyTooLarge, reply, "body_too_large".into(), None)
    }

    /// The route needs the request body and Envoy withholds it while the headers are paused
    /// (`allow_on_headers_stop_iteration` is off): refuse promptly rather than hang.
    pub fn body_withheld(&self, route: RouteId) -> Verdict {
        let policy = self.policy(route);
        let reply = crate::replies::error(
            &policy.answers,
            ErrorCode::Misconfigured,
            "the gateway does not pass the request body to the idempotency filter before forwarding, and this \
             route needs it; the gateway's operators must enable allow_on_headers_stop_iteration",
        );
        shadowed(policy, Outcome::Misconfigured, reply, "body_withheld".into(), None)
    }

    /// Reads the key (or token) and prepares the store operation.
    pub fn begin(&self, route: RouteId, req: &dyn RequestView, now_ms: u64) -> Option<Begin> {
        let policy = self.policy(route);
        if policy.mode == Mode::Token {
            let token = match key::single_header(req, &policy.token.header) {
                Ok(Some(t)) if key::validate(&t).is_ok() => t,
                Ok(Some(_)) | Err(_) => {
                    let reply = crate::replies::error(
                        &policy.answers,
                        ErrorCode::TokenInvalid,
                        &format!("header {} is not a valid token", policy.token.header),
                    );
                    return Some(Begin::Done(verdict(Outcome::TokenRejected, reply, "invalid_token", None)));
                }
                Ok(None) => {
                    let reply = crate::replies::error(
                        &policy.answers,
                        ErrorCode::TokenMissing,
                        &format!(
                            "header {} is missing; get a token from POST {}",
                            policy.token.header, policy.token.issue_path
                        ),
                    );
                    return Some(Begin::Done(verdict(Outcome::TokenRejected, reply, "missing_token", None)));
                }
            };
            if !self.issued_here(&policy.name, &token) {
                let reply = crate::replies::error(
                    &policy.answers,
                    ErrorCode::TokenInvalid,
                    &format!(
                        "header {} holds no token this route issued (mistyped, cut short, or another route's); \
                         get one from POST {}",
                        policy.token.header, policy.token.issue_path
                    ),
                );
                return Some(Begin::Done(verdict(Outcome::TokenRejected, reply, "token_not_issued", Some(token))));
            }
            let id = match token_id(policy, &token, req) {
                Ok(id) => id,
                Err(e) => return Some(Begin::Done(key_error(policy, e))),
            };
            return Some(Begin::Store(Prepared { route, op: StoreOp::UseToken { id }, key: token }));
        }
        if let Some(refused) = repeatability_refusal(policy, req, now_ms) {
            return Some(Begin::Done(refused));
        }
        let template = policy.template();
        let client_key = match key::extract(&policy.key, template, req) {
            Ok(k) => k,
            Err(e) => return Some(Begin::Done(key_error(policy, e))),
        };
        let scope = (&policy.key.scope, policy.key.anonymous);
        let id = match key::scoped_id(&policy.name, scope.0, scope.1, &client_key, template, req) {
            Ok(id) => id,
            Err(e) => return Some(Begin::Done(key_error(policy, e))),
        };
        let path = policy.matcher.canonical_path(req.path());
        let fp = match fingerprint(&policy.key, template, req, &path, policy.max_body_bytes as usize) {
            Ok(fp) => fp,
            Err(e) => return Some(Begin::Done(key_error(policy, e))),
        };
        Some(Begin::Store(Prepared { route, op: StoreOp::Claim { id, fingerprint: fp }, key: client_key }))
    }

    /// The request's fingerprint as records of earlier versions hold it (SHA-256, first 16
    /// bytes), for [`Claim::resolve_legacy`].
    pub fn legacy_fingerprint(&self, route: RouteId, req: &dyn RequestView) -> Option<[u8; 16]> {
        let policy = self.policy(route);
        let path = policy.matcher.canonical_path(req.path());
        let fp = crate::fingerprint::legacy_fingerprint(
            &policy.key,
            policy.template(),
            req,
            &path,
            policy.max_body_bytes as usize,
        )
        .ok()?;
        fp[..16].try_into().ok()
    }

    /// The verdict for what a claim found.
    pub fn after_claim(
        &self,
        p: &Prepared,
        claim: Result<Claim<StoreTicket>, StoreError>,
        now: u64,
        waiting_until: Option<u64>,
    ) -> Verdict {
        let policy = self.policy(p.route);
        let k = Some(p.key.clone());
        let claim = match claim {
            Ok(c) => c,
            Err(e) => return self.store_error(policy, e, k),
        };
        let waited = waiting_until.is_some();
        match claim {
            // A held duplicate that takes the key over is forwarded: it was counted `waited` when
            // it was held, and each request's ending is counted once.
            Claim::Claimed(ticket) => Verdict {
                outcome: Outcome::Forwarded,
                action: Action::Forward(Some(Ticket::Claim(ticket))),
                cause: if waited { "took_over_after_wait".into() } else { "first".into() },
                key: k,
            },
            Claim::InFlight { payload, .. } | Claim::Completed { payload, .. } | Claim::Unknown { payload, .. }
                if !payload.is_same() =>
            {
                // OASIS Repeatable Requests answers an id reused with another request with 400.
                let (status, message) = if repeatability::speaks(policy) {
                    (
                        repeatability::KEY_REUSED_STATUS,
                        "this Repeatability-Request-ID was already used with a different request",
                    )
                } else {
                    (ErrorCode::KeyReused.status(), "this idempotency key was already used with a different request")
                };
                let reply = crate::replies::error_with_status(&policy.answers, ErrorCode::KeyReused, status, message);
                shadowed(policy, Outcome::KeyReused, reply, "fingerprint_mismatch".into(), k)
            }
            Claim::Unknown { first_seen_ms, held_until_ms, held, .. } => {
                let reply = crate::replies::outcome_unknown(&policy.answers, first_seen_ms, held_until_ms);
                // A held duplicate polling from the root never starts a lookup: a request
                // does, when it meets the unknown outcome itself.
                match held {
                    Some(held) if policy.reconcile.is_some() && policy.mode == Mode::Key && !waited => Verdict {
                        outcome: Outcome::OutcomeUnknown,
                        action: Action::Reconcile { prepared: Box::new(p.clone()), held, unknown: reply },
                        cause: "outcome_unknown_lookup".into(),
                        key: k,
                    },
                    _ => shadowed(policy, Outcome::OutcomeUnknown, reply, "outcome_unknown".into(), k),
                }
            }
            // This process' answer is still being written to Redis: a held duplicate waits on
            // (the cache is looked at every tick), anything else gets 409 now.
            Claim::Unwritten { first_seen_ms } => match waiting_until {
                Some(deadline) if now < deadline => Verdict {
                    outcome: Outcome::Waited,
                    action: Action::Wait { prepared: Box::new(p.clone()), deadline_ms: deadline },
                    cause: "in_flight_waiting".into(),
                    key: k,
                },
                _ => {
                    let reply = crate::replies::in_progress(&policy.answers, first_seen_ms);
                    shadowed(policy, Outcome::InFlight, reply, "answer_not_yet_written".into(), k)
                }
            },
            Claim::InFlight { first_seen_ms, .. } => {
                let wait = policy.key.on_in_flight == OnInFlight::Wait && policy.mode == Mode::Key;
                let deadline = waiting_until.unwrap_or(now.saturating_add(policy.key.wait_timeout.millis));
                if wait && now < deadline {
                    return Verdict {
                        outcome: Outcome::Waited,
                        action: Action::Wait { prepared: Box::new(p.clone()), deadline_ms: deadline },
                        cause: "in_flight_waiting".into(),
                        key: k,
                    };
                }
                let cause = if waited { "in_flight_wait_timeout" } else { "in_flight" };
                let reply = crate::replies::in_progress(&policy.answers, first_seen_ms);
                shadowed(policy, Outcome::InFlight, reply, cause.into(), k)
            }
            Claim::Completed { response: Some(stored), .. } if policy.key.on_completed == OnCompleted::Replay => {
                let cause = if waited { "completed_while_waiting" } else { "completed" };
                shadowed(policy, Outcome::Replayed, stored.replay(), cause.into(), k)
            }
            Claim::Completed { first_seen_ms, response, .. } => {
                let cause = if response.is_none() { "tombstone" } else { "completed" };
                let reply = crate::replies::duplicate(&policy.answers, &policy.duplicate, Some(first_seen_ms));
                shadowed(policy, Outcome::RejectedDuplicate, reply, cause.into(), k)
            }
        }
    }

    /// The verdict for what presenting a token found.
    pub fn after_token(&self, p: &Prepared, used: Result<TokenUse<StoreTicket>, StoreError>) -> Verdict {
        let policy = self.policy(p.route);
        let k = Some(p.key.clone());
        match used {
            Err(e) => self.store_error(policy, e, k),
            Ok(TokenUse::Consumed(t)) => Verdict {
                outcome: Outcome::TokenConsumed,
                action: Action::Forward(Some(Ticket::Token(t))),
                cause: "token_valid".into(),
                key: k,
            },
            Ok(TokenUse::Used { used_at_ms }) => Verdict {
                outcome: Outcome::TokenRejected,
                action: Action::Reply(crate::replies::duplicate(&policy.answers, &policy.duplicate, Some(used_at_ms))),
                cause: "token_used".into(),
                key: k,
            },
            Ok(TokenUse::Unknown) => Verdict {
                outcome: Outcome::TokenRejected,
                action: Action::Reply(crate::replies::duplicate(&policy.answers, &policy.duplicate, None)),
                cause: "token_unknown_or_expired".into(),
                key: k,
            },
        }
    }

    fn store_error(&self, policy: &RoutePolicy, e: StoreError, key: Option<String>) -> Verdict {
        let allow = policy.store == StoreKind::Redis
            && self.bundle.redis.as_ref().is_some_and(|r| r.on_store_error == OnStoreError::Allow);
        if allow {
            return Verdict {
                outcome: Outcome::StoreError,
                action: Action::Forward(None),
                cause: format!("allowed_unprotected: {e}"),
                key,
            };
        }
        shadowed(policy, Outcome::StoreError, store_unavailable(&policy.answers), e.to_string(), key)
    }
}

/// A Repeatable Requests route's refusal of malformed headers or a First-Sent outside its window.
fn repeatability_refusal(policy: &RoutePolicy, req: &dyn RequestView, now_ms: u64) -> Option<Verdict> {
    if !repeatability::speaks(policy) {
        return None;
    }
    let refusal = repeatability::check(policy, req, now_ms).err()?;
    let reply = crate::replies::error(&policy.answers, refusal.code(), refusal.message());
    let (outcome, cause) = match refusal {
        repeatability::Refusal::Malformed(_) => (Outcome::InvalidKey, "repeatability_headers_invalid"),
        repeatability::Refusal::OutsideWindow(_) => (Outcome::InvalidKey, "first_sent_outside_window"),
    };
    Some(shadowed(policy, outcome, reply, cause.into(), None))
}

pub(super) fn verdict(outcome: Outcome, reply: LocalReply, cause: &str, key: Option<String>) -> Verdict {
    Verdict { outcome, action: Action::Reply(reply), cause: cause.into(), key }
}

pub(super) fn store_unavailable(answers: &crate::answers::Answers) -> LocalReply {
    crate::replies::error(answers, ErrorCode::StoreUnavailable, "the idempotency store is unavailable; retry later")
}

pub(super) fn key_error(policy: &RoutePolicy, e: KeyError) -> Verdict {
    match e {
        KeyError::Missing(_) if !policy.key.required => Verdict {
            outcome: Outcome::NoKey,
            action: Action::Forward(None),
            cause: "no_key_not_required".into(),
            key: None,
        },
        KeyError::Missing(why) => {
            let reply = crate::replies::error(&policy.answers, ErrorCode::KeyMissing, &why);
            shadowed(policy, Outcome::MissingKey, reply, "missing_key".into(), None)
        }
        KeyError::Invalid(why) => {
            let reply = crate::replies::error(&policy.answers, ErrorCode::KeyInvalid, &why);
            shadowed(policy, Outcome::InvalidKey, reply, "invalid_key".into(), None)
        }
        KeyError::ScopeMissing(why) => {
            let reply = crate::replies::error(&policy.answers, ErrorCode::ScopeMissing, &why);
            shadowed(policy, Outcome::MissingScope, reply, "missing_scope".into(), None)
        }
        KeyError::Unsupported(why) => {
            let reply = crate::replies::error(&policy.answers, ErrorCode::MediaTypeUnsupported, &why);
            shadowed(policy, Outcome::Unsupported, reply, "unsupported".into(), None)
        }
    }
}

/// In shadow mode nothing is blocked: the would-be answer is only counted and logged.
pub(super) fn shadowed(
    policy: &RoutePolicy,
    outcome: Outcome,
    reply: LocalReply,
    cause: String,
    key: Option<String>,
) -> Verdict {
    match policy.mode {
        Mode::Key | Mode::Token => Verdict { outcome, action: Action::Reply(reply), cause, key },
        Mode::Shadow => Verdict {
            outcome: Outcome::ShadowWouldBlock,
            action: Action::Forward(None),
            cause: format!("would_{}:{}", outcome.name(), cause),
            key,
        },
    }
}

/// A method that changes nothing (RFC 9110 §9.2.1): GET, HEAD, OPTIONS, TRACE. Such requests
/// need no policy: they are never refused or warned about as unmatched.
pub fn is_safe_method(method: &str) -> bool {
    ["GET", "HEAD", "OPTIONS", "TRACE"].iter().any(|m| m.eq_ignore_ascii_case(method))
}
