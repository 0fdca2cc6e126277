//! The decision engine: for a request on a policy route, forward it (with a claim) or answer it;
//! for a forwarded request, decide what its outcome does to the claim.
//!
//! Host-independent and store-independent: a decision is split around the one store operation it
//! needs ([`Engine::begin`] → store → [`Engine::after_claim`] / [`Engine::after_token`]), so the
//! shared store runs it in one call ([`Engine::decide_shared`]) and the Redis store across a Webdis
//! callout, with the same answers.

use crate::fingerprint::fingerprint;
use crate::host::Host;
use crate::key::{self, KeyError, RequestView};
use crate::policy::{Bundle, Forward, Mode, OnCompleted, OnInFlight, OnStoreError, RoutePolicy, StoreKind, Unmatched};
use crate::response::{self, Header, LocalReply, StoredResponse};
use crate::store::shared::SharedStore;
use crate::store::{redis, shared, Claim, Completion, StoreError, TokenUse};
use sha2::Digest;

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
    Waited,
    TokenIssued,
    TokenConsumed,
    TokenRejected,
    TokenRestored,
    OutcomeUnknown,
    MissingScope,
    WriteRetried,
    WriteDropped,
    OrphanReleased,
}

impl Outcome {
    pub const ALL: [Outcome; 26] = [
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
        Outcome::Waited,
        Outcome::TokenIssued,
        Outcome::TokenConsumed,
        Outcome::TokenRejected,
        Outcome::TokenRestored,
        Outcome::OutcomeUnknown,
        Outcome::MissingScope,
        Outcome::WriteRetried,
        Outcome::WriteDropped,
        Outcome::OrphanReleased,
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
            Outcome::Waited => "waited",
            Outcome::TokenIssued => "token_issued",
            Outcome::TokenConsumed => "token_consumed",
            Outcome::TokenRejected => "token_rejected",
            Outcome::TokenRestored => "token_restored",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::MissingScope => "missing_scope",
            Outcome::WriteRetried => "write_retried",
            Outcome::WriteDropped => "write_dropped",
            Outcome::OrphanReleased => "orphan_released",
        }
    }

    /// Position in [`Outcome::ALL`] (declaration order), for counter ids.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A store's proof of ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreTicket {
    Shared(shared::Ticket),
    Redis(redis::Ticket),
}

/// What a forwarded request holds until it finishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ticket {
    /// A key claim: complete it with the response, or release it.
    Claim(StoreTicket),
    /// A consumed token: restore it if the upstream failed (and the route says so).
    Token(StoreTicket),
}

/// What to do with a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Let it through; with a ticket, its outcome must be reported when it ends.
    Forward(Option<Ticket>),
    Reply(LocalReply),
    /// Hold it (`on_in_flight = "wait"`) and run `prepared` again until `deadline_ms`.
    Wait {
        prepared: Box<Prepared>,
        deadline_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub outcome: Outcome,
    pub action: Action,
    /// Why, for the log line (e.g. `completed`, `in_flight`, `fingerprint_mismatch`).
    pub cause: String,
    /// The client's key or token, for the (truncated) log line.
    pub key: Option<String>,
}

/// A request ready for its store operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub route: usize,
    pub op: StoreOp,
    /// The client's key or token (for logs only; never stored).
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    Claim { id: [u8; 32], fingerprint: [u8; 32] },
    UseToken { id: [u8; 32] },
}

/// The first step of a decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Begin {
    /// Decided without the store.
    Done(Verdict),
    /// Needs one store operation.
    Store(Prepared),
}

/// How a forwarded request ended, as the glue observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// A response came back. `body` is `None` when it was not seen to the end (client gone) or
    /// grew past the route's `max_response_bytes`. `details` is Envoy's `response.code_details`
    /// (`via_upstream` when the upstream produced it).
    Response { status: u16, headers: Vec<Header>, body: Option<Vec<u8>>, details: String },
    /// No response: the client went away, or the stream was reset.
    NoResponse { forwarded: bool },
}

/// The store operation that finishing a ticket needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finish {
    /// Nothing to write; count `outcome` (if any).
    Nothing { outcome: Option<Outcome>, cause: String },
    /// Free the claim so a retry runs.
    Release { cause: String },
    /// Remember the response (a tombstone when over `max_response_bytes`).
    Complete { response: StoredResponse, max_response_bytes: usize, ttl_ms: u64, cause: String },
    /// Put the token back so the user's retry passes.
    RestoreToken { cause: String },
    /// The outcome is unknown: hold the claim for `hold_ms`, never to be taken over.
    HoldUnknown { hold_ms: u64, cause: String },
}

/// A token issue request: which route the token is for, or the answer when it cannot be issued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Issue {
    Token { route: usize, token: String, id: [u8; 32] },
    Reply { route: Option<usize>, reply: LocalReply, cause: String },
}

pub struct Engine {
    pub bundle: Bundle,
    shared: SharedStore,
}

impl Engine {
    pub fn new(bundle: Bundle) -> Self {
        let shared = SharedStore::new(&bundle.shared);
        Engine { bundle, shared }
    }

    /// Creates the shared store's bucket keys; call when the plugin configures.
    pub fn initialise(&mut self, host: &dyn Host) -> Result<u32, StoreError> {
        self.shared.initialise(host)
    }

    pub fn policy(&self, route: usize) -> Option<&RoutePolicy> {
        self.bundle.routes.get(route)
    }

    pub fn redis(&self) -> Option<redis::RedisStore<'_>> {
        self.bundle.redis.as_ref().map(redis::RedisStore::new)
    }

    /// Redis routes: whether this Envoy process holds an answer for this key that Redis refused
    /// so far (marked with [`Engine::mark_unwritten`]). A retry that reaches the process meanwhile
    /// gets 409 `REQUEST_IN_PROGRESS` instead of claiming a key whose Redis lease may have run out
    /// during the outage — the one way it could run the business again.
    pub fn unwritten(&self, host: &dyn Host, p: &Prepared, redis_key: &str) -> Option<Verdict> {
        let first_seen_ms = self.shared.in_flight(host, &unwritten_id(redis_key)).ok()??;
        let policy = self.policy(p.route)?;
        let reply = response::in_progress(first_seen_ms);
        Some(shadowed(policy, Outcome::InFlight, reply, "answer_not_yet_written".into(), Some(p.key.clone())))
    }

    /// Marks a Redis key whose answer is being retried, until `until_ms` at the latest.
    pub fn mark_unwritten(&self, host: &dyn Host, redis_key: &str, until_ms: u64) -> Option<shared::Ticket> {
        let lease = until_ms.saturating_sub(host.now_ms()).max(1);
        match self.shared.claim(host, &unwritten_id(redis_key), &[0; 32], lease) {
            Ok(Claim::Claimed(t)) => Some(t),
            _ => None,
        }
    }

    /// The answer landed (or was given up): the mark goes.
    pub fn unmark_unwritten(&self, host: &dyn Host, mark: &shared::Ticket) {
        let _ = self.shared.release(host, mark);
    }

    /// Whether any route forwards detached (the root context then sends upstream calls).
    pub fn has_detached(&self) -> bool {
        self.bundle.routes.iter().any(|r| r.forward == Forward::Detached)
    }

    /// The answer to a request on a filter-enabled route that no policy matches: `None` to let
    /// it pass (`unmatched = "pass"`, or a safe method), else 400 `IDEMPOTENCY_NO_POLICY`.
    pub fn unmatched(&self, method: &str) -> Option<LocalReply> {
        let safe = matches!(method, "GET" | "HEAD" | "OPTIONS" | "TRACE");
        if self.bundle.unmatched == Unmatched::Pass || safe {
            return None;
        }
        Some(response::json_reply(
            400,
            "IDEMPOTENCY_NO_POLICY",
            "no idempotency policy matches this method and path on a route that requires one",
            &[],
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
    pub fn precheck(&self, route: usize, req: &dyn RequestView) -> Option<Verdict> {
        let policy = self.policy(route)?;
        if policy.mode == Mode::Token || policy.key.from == crate::policy::KeySource::Body {
            return None;
        }
        key::extract(&policy.key, req).err().map(|e| key_error(policy, e))
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

    /// Reads the key (or token) and prepares the store operation.
    pub fn begin(&self, route: usize, req: &dyn RequestView) -> Option<Begin> {
        let policy = self.policy(route)?;
        if policy.mode == Mode::Token {
            let token = match key::single_header(req, &policy.token.header) {
                Ok(Some(t)) if key::validate(&t).is_ok() => t,
                Ok(Some(_)) | Err(_) => {
                    let reply = response::json_reply(
                        400,
                        "IDEMPOTENCY_TOKEN_INVALID",
                        &format!("header {} is not a valid token", policy.token.header),
                        &[],
                    );
                    return Some(Begin::Done(verdict(Outcome::TokenRejected, reply, "invalid_token", None)));
                }
                Ok(None) => {
                    let reply = response::json_reply(
                        400,
                        "IDEMPOTENCY_TOKEN_MISSING",
                        &format!(
                            "header {} is missing; get a token from POST {}",
                            policy.token.header, policy.token.issue_path
                        ),
                        &[],
                    );
                    return Some(Begin::Done(verdict(Outcome::TokenRejected, reply, "missing_token", None)));
                }
            };
            let id = match token_id(policy, &token, req) {
                Ok(id) => id,
                Err(e) => return Some(Begin::Done(key_error(policy, e))),
            };
            return Some(Begin::Store(Prepared { route, op: StoreOp::UseToken { id }, key: token }));
        }
        let client_key = match key::extract(&policy.key, req) {
            Ok(k) => k,
            Err(e) => return Some(Begin::Done(key_error(policy, e))),
        };
        let id = match key::scoped_id(&policy.name, &policy.key.scope, policy.key.anonymous, &client_key, req) {
            Ok(id) => id,
            Err(e) => return Some(Begin::Done(key_error(policy, e))),
        };
        let fp = fingerprint(&policy.key, req, &policy.matcher.canonical_path(req.path()));
        Some(Begin::Store(Prepared { route, op: StoreOp::Claim { id, fingerprint: fp }, key: client_key }))
    }

    /// The whole decision on the shared store (synchronous).
    pub fn decide_shared(&self, host: &dyn Host, route: usize, req: &dyn RequestView) -> Option<Verdict> {
        match self.begin(route, req)? {
            Begin::Done(v) => Some(v),
            Begin::Store(p) => Some(self.run_shared(host, &p, None)),
        }
    }

    /// Runs a prepared operation on the shared store. `waiting_until` is set when polling for a
    /// held duplicate.
    pub fn run_shared(&self, host: &dyn Host, p: &Prepared, waiting_until: Option<u64>) -> Verdict {
        let now = host.now_ms();
        match &p.op {
            StoreOp::Claim { id, fingerprint } => {
                let lock_ttl = self.policy(p.route).map(|r| r.key.lock_ttl.millis).unwrap_or(1);
                let claim = self.shared.claim(host, id, fingerprint, lock_ttl);
                let claim = claim.map(|c| c.map(StoreTicket::Shared));
                self.after_claim(p, claim, now, waiting_until)
            }
            StoreOp::UseToken { id } => {
                let used = self.shared.use_token(host, id).map(|u| u.map(StoreTicket::Shared));
                self.after_token(p, used)
            }
        }
    }

    /// The verdict for what a claim found.
    pub fn after_claim(
        &self,
        p: &Prepared,
        claim: Result<Claim<StoreTicket>, StoreError>,
        now: u64,
        waiting_until: Option<u64>,
    ) -> Verdict {
        let Some(policy) = self.policy(p.route) else {
            return verdict(Outcome::StoreError, store_unavailable(), "unknown route", None);
        };
        let k = Some(p.key.clone());
        let claim = match claim {
            Ok(c) => c,
            Err(e) => return self.store_error(policy, e, k),
        };
        let waited = waiting_until.is_some();
        match claim {
            Claim::Claimed(ticket) => Verdict {
                outcome: if waited { Outcome::Waited } else { Outcome::Forwarded },
                action: Action::Forward(Some(Ticket::Claim(ticket))),
                cause: if waited { "took_over_after_wait".into() } else { "first".into() },
                key: k,
            },
            Claim::InFlight { same_payload: false, .. }
            | Claim::Completed { same_payload: false, .. }
            | Claim::Unknown { same_payload: false, .. } => {
                let reply = response::json_reply(
                    422,
                    "IDEMPOTENCY_KEY_REUSED",
                    "this idempotency key was already used with a different request",
                    &[],
                );
                shadowed(policy, Outcome::KeyReused, reply, "fingerprint_mismatch".into(), k)
            }
            Claim::Unknown { first_seen_ms, held_until_ms, .. } => {
                let reply = response::outcome_unknown(first_seen_ms, held_until_ms);
                shadowed(policy, Outcome::OutcomeUnknown, reply, "outcome_unknown".into(), k)
            }
            Claim::InFlight { first_seen_ms, .. } => {
                let wait = policy.key.on_in_flight == OnInFlight::Wait && policy.mode == Mode::Key;
                let deadline = waiting_until.unwrap_or(now.saturating_add(policy.key.wait_timeout.millis));
                if wait && now < deadline {
                    return Verdict {
                        outcome: Outcome::InFlight,
                        action: Action::Wait { prepared: Box::new(p.clone()), deadline_ms: deadline },
                        cause: "in_flight_waiting".into(),
                        key: k,
                    };
                }
                let cause = if waited { "in_flight_wait_timeout" } else { "in_flight" };
                let reply = response::in_progress(first_seen_ms);
                shadowed(policy, Outcome::InFlight, reply, cause.into(), k)
            }
            Claim::Completed { response: Some(stored), .. } if policy.key.on_completed == OnCompleted::Replay => {
                let cause = if waited { "completed_while_waiting" } else { "completed" };
                shadowed(policy, Outcome::Replayed, stored.replay(), cause.into(), k)
            }
            Claim::Completed { first_seen_ms, response, .. } => {
                let cause = if response.is_none() { "tombstone" } else { "completed" };
                let reply = response::duplicate(&policy.duplicate, Some(first_seen_ms));
                shadowed(policy, Outcome::RejectedDuplicate, reply, cause.into(), k)
            }
        }
    }

    /// The verdict for what presenting a token found.
    pub fn after_token(&self, p: &Prepared, used: Result<TokenUse<StoreTicket>, StoreError>) -> Verdict {
        let Some(policy) = self.policy(p.route) else {
            return verdict(Outcome::StoreError, store_unavailable(), "unknown route", None);
        };
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
                action: Action::Reply(response::duplicate(&policy.duplicate, Some(used_at_ms))),
                cause: "token_used".into(),
                key: k,
            },
            Ok(TokenUse::Unknown) => Verdict {
                outcome: Outcome::TokenRejected,
                action: Action::Reply(response::duplicate(&policy.duplicate, None)),
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
        shadowed(policy, Outcome::StoreError, store_unavailable(), e.to_string(), key)
    }

    /// What finishing a ticket must do, whatever the store.
    pub fn plan_finish(&self, route: usize, ticket: &Ticket, ending: &Ending) -> Finish {
        let Some(policy) = self.policy(route) else {
            return Finish::Nothing { outcome: None, cause: "unknown route".into() };
        };
        let result = classify(ending);
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
            (Ended::Answered, Ending::Response { status, .. }) if !policy.key.remembers(*status) => {
                Finish::Release { cause: format!("status_{status}") }
            }
            (Ended::Answered, Ending::Response { status, headers, body, .. }) => {
                // A body we did not see whole is remembered as a tombstone: status only.
                let limit = if body.is_some() { policy.max_response_bytes as usize } else { 0 };
                Finish::Complete {
                    response: StoredResponse::new(*status, headers.clone(), body.clone().unwrap_or_default()),
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
        route: usize,
        ticket: &Ticket,
        ending: Ending,
    ) -> (Option<Outcome>, String) {
        let (Ticket::Claim(StoreTicket::Shared(t)) | Ticket::Token(StoreTicket::Shared(t))) = ticket else {
            return (Some(Outcome::StoreError), "not a shared-store ticket".into());
        };
        match self.plan_finish(route, ticket, &ending) {
            Finish::Nothing { outcome, cause } => (outcome, cause),
            Finish::Release { cause } => released(self.shared.release(host, t), cause),
            Finish::RestoreToken { cause } => restored(self.shared.restore_token(host, t), cause),
            Finish::Complete { response, max_response_bytes, ttl_ms, cause } => {
                completed(self.shared.complete(host, t, &response, max_response_bytes, ttl_ms), cause)
            }
            Finish::HoldUnknown { hold_ms, cause } => held(self.shared.hold_unknown(host, t, hold_ms), cause),
        }
    }

    /// Extends the lease of a claim on the shared store whose request still waits for the
    /// upstream: while the gateway lives, a slow request is never taken over. `Ok(false)` when
    /// the claim is no longer this ticket's.
    pub fn renew_shared(&self, host: &dyn Host, route: usize, ticket: &shared::Ticket) -> Result<bool, StoreError> {
        let lease = self.policy(route).map(|p| p.key.lock_ttl.millis).unwrap_or(1);
        self.shared.renew(host, ticket, lease)
    }

    /// Whether `path` is some token route's issue endpoint (cheap: no allocation).
    pub fn is_issue_path(&self, path: &str) -> bool {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        self.bundle.routes.iter().any(|r| r.mode == Mode::Token && r.token.issue_path == bare)
    }

    /// The token issue endpoint: which route, a fresh token, or the answer when none is issued.
    /// `random` supplies 16 random bytes.
    pub fn issue(&self, method: &str, path: &str, req: &dyn RequestView, random: [u8; 16]) -> Option<Issue> {
        let bare = path.split(['?', '#']).next().unwrap_or(path);
        let routes: Vec<usize> = (0..self.bundle.routes.len())
            .filter(|&i| self.bundle.routes[i].mode == Mode::Token && self.bundle.routes[i].token.issue_path == bare)
            .collect();
        let first = *routes.first()?;
        if method != "POST" {
            let mut reply = response::json_reply(405, "METHOD_NOT_ALLOWED", "tokens are issued with POST", &[]);
            reply.headers.push(("allow".into(), "POST".into()));
            return Some(Issue::Reply { route: Some(first), reply, cause: "method_not_allowed".into() });
        }
        let route = if routes.len() == 1 {
            first
        } else {
            let wanted = key::query_param(path, "route");
            match routes.iter().find(|&&i| Some(&self.bundle.routes[i].name) == wanted.as_ref()) {
                Some(&i) => i,
                None => {
                    let names: Vec<&str> = routes.iter().map(|&i| self.bundle.routes[i].name.as_str()).collect();
                    let reply = response::json_reply(
                        400,
                        "IDEMPOTENCY_TOKEN_ROUTE_REQUIRED",
                        &format!("several routes issue tokens here; add ?route= one of: {}", names.join(", ")),
                        &[],
                    );
                    return Some(Issue::Reply { route: None, reply, cause: "route_required".into() });
                }
            }
        };
        let policy = self.policy(route)?;
        let token = redis::token_text(&random);
        match token_id(policy, &token, req) {
            Ok(id) => Some(Issue::Token { route, token, id }),
            Err(e) => {
                let v = key_error(policy, e);
                let Action::Reply(reply) = v.action else {
                    return None;
                };
                Some(Issue::Reply { route: Some(route), reply, cause: v.cause })
            }
        }
    }

    /// Records an issued token on the shared store.
    pub fn issue_shared(&self, host: &dyn Host, route: usize, id: &[u8; 32]) -> Result<(), StoreError> {
        let ttl = self.policy(route).map(|p| p.token.ttl.millis).unwrap_or(1);
        self.shared.issue_token(host, id, ttl)
    }

    /// The answer to a successful issue (or the store's failure).
    pub fn issued(&self, route: usize, token: &str, now: u64, stored: Result<(), StoreError>) -> Verdict {
        let Some(policy) = self.policy(route) else {
            return verdict(Outcome::StoreError, store_unavailable(), "unknown route", None);
        };
        if let Err(e) = stored {
            return verdict(Outcome::StoreError, store_unavailable(), &e.to_string(), None);
        }
        let ttl = policy.token.ttl.millis;
        let mut reply = response::json_reply(
            200,
            "TOKEN_ISSUED",
            "send this token once, in the named header",
            &[
                ("token", token.into()),
                ("header", policy.token.header.clone().into()),
                ("expires_at", response::rfc3339(now.saturating_add(ttl)).into()),
                ("ttl_seconds", (ttl / 1000).into()),
            ],
        );
        reply.headers.push(("cache-control".into(), "no-store".into()));
        verdict(Outcome::TokenIssued, reply, "issued", Some(token.to_string()))
    }
}

/// Where the shared store marks a Redis key whose answer is not written yet.
fn unwritten_id(redis_key: &str) -> [u8; 32] {
    let mut h = sha2::Sha256::new();
    key::put(&mut h, b"unwritten");
    key::put(&mut h, redis_key.as_bytes());
    h.finalize().into()
}

/// The stored identity of a token: route + caller scope + token, as for keys, in its own domain.
fn token_id(policy: &RoutePolicy, token: &str, req: &dyn RequestView) -> Result<[u8; 32], KeyError> {
    key::scoped_id(&format!("token:{}", policy.name), &policy.token.scope, policy.token.anonymous, token, req)
}

fn verdict(outcome: Outcome, reply: LocalReply, cause: &str, key: Option<String>) -> Verdict {
    Verdict { outcome, action: Action::Reply(reply), cause: cause.into(), key }
}

fn store_unavailable() -> LocalReply {
    response::json_reply(503, "IDEMPOTENCY_STORE_UNAVAILABLE", "the idempotency store is unavailable; retry later", &[])
}

fn key_error(policy: &RoutePolicy, e: KeyError) -> Verdict {
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
        KeyError::ScopeMissing(why) => {
            let reply = response::json_reply(400, "IDEMPOTENCY_SCOPE_MISSING", &why, &[]);
            shadowed(policy, Outcome::MissingScope, reply, "missing_scope".into(), None)
        }
    }
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

/// In shadow mode nothing is blocked: the would-be answer is only counted and logged.
fn shadowed(policy: &RoutePolicy, outcome: Outcome, reply: LocalReply, cause: String, key: Option<String>) -> Verdict {
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

/// How a forwarded request ended, for the claim.
enum Ended {
    /// Definitely failed: the upstream answered 5xx, or the request never reached it.
    Failed(String),
    /// Forwarded, and no answer: the service may have done the work.
    Unknown(String),
    /// The upstream answered below 500.
    Answered,
}

fn classify(ending: &Ending) -> Ended {
    match ending {
        Ending::NoResponse { forwarded: false } => Ended::Failed("not_forwarded".into()),
        Ending::NoResponse { forwarded: true } => Ended::Unknown("no_response".into()),
        Ending::Response { status, details, .. } if *status >= 500 && !is_upstream_answer(details) => {
            if never_reached_upstream(details) {
                Ended::Failed(format!("upstream_unreachable:{details}"))
            } else {
                Ended::Unknown(format!("outcome_unknown:{details}"))
            }
        }
        Ending::Response { status, .. } if *status >= 500 => Ended::Failed(format!("status_{status}")),
        Ending::Response { .. } => Ended::Answered,
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
