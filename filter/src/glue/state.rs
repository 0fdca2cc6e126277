//! What one worker's contexts share: the engine, counters, held duplicates, and the Redis
//! writes the root context sends for finished requests.

use crate::engine::{Action as Do, Engine, Outcome, Prepared, StoreOp, Ticket, Verdict};
use crate::host::Host;
use crate::key::truncated;
use crate::policy::StoreKind;
use crate::store::{redis, StoreError};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

use super::*;

/// A held duplicate, polled by the root context.
pub(super) struct Waiter {
    pub(super) prepared: Prepared,
    pub(super) deadline_ms: u64,
    /// A Webdis poll is on its way (Redis routes).
    pub(super) polling: bool,
}

/// What every context of this worker shares.
pub(super) struct State {
    pub(super) engine: Engine,
    /// `counters[route][outcome.index()]`
    pub(super) counters: Vec<Vec<Option<u32>>>,
    /// Held duplicates by HTTP context id.
    pub(super) waiters: RefCell<HashMap<u32, Waiter>>,
    /// Root-context Webdis polls: callout token → (HTTP context id, the poll's claim ticket).
    pub(super) polls: RefCell<HashMap<u32, (u32, redis::Ticket)>>,
    /// Envoy's log level for the `wasm` component when the plugin configured (as u32), so
    /// debug lines are not even formatted when they would be dropped.
    pub(super) log_level: u32,
    /// Tickets (and keys) won by a waiter on the root's tick, picked up by its HTTP context.
    pub(super) handoff: RefCell<HashMap<u32, (Ticket, String)>>,
    /// Redis completions, releases and restores waiting to be sent by the root context.
    pub(super) outbox: RefCell<Vec<Job>>,
    /// Root-context Webdis calls finishing a request: callout token → job.
    pub(super) finishing: RefCell<HashMap<u32, Job>>,
    /// This worker's wake-up queue: an HTTP context enqueues, the root's on_queue_ready sends.
    pub(super) wake_queue: Option<u32>,
}

/// Finishing a Redis ticket: sent by the root context, so it completes even though the
/// request's stream (and with it any callout the stream owns) is gone by then.
pub(super) struct Job {
    pub(super) route: usize,
    pub(super) key: Option<String>,
    /// The HTTP context whose response is held until this job is done.
    pub(super) resume: Option<u32>,
    pub(super) cmd: redis::Command,
    pub(super) kind: FinishKind,
    pub(super) cause: String,
}

impl State {
    pub(super) fn count(&self, route: usize, outcome: Outcome) {
        if let Some(Some(id)) = self.counters.get(route).and_then(|c| c.get(outcome.index())) {
            let _ = hostcalls::increment_metric(*id, 1);
        }
    }

    pub(super) fn route_name(&self, route: usize) -> &str {
        self.engine.policy(route).map(|p| p.name.as_str()).unwrap_or("?")
    }

    /// Counts and logs a verdict (one log line per interception).
    pub(super) fn record(&self, route: usize, v: &Verdict) {
        self.count(route, v.outcome);
        let quiet = matches!(v.outcome, Outcome::Forwarded | Outcome::TokenConsumed | Outcome::TokenIssued)
            || matches!(v.action, Do::Wait { .. });
        let level = if quiet { LogLevel::Debug } else { LogLevel::Info };
        if (level as u32) < self.log_level {
            return;
        }
        let key = v.key.as_deref().map(truncated).unwrap_or_else(|| "-".into());
        log(
            level,
            &format!("idem: {} route={} key={} cause={}", v.outcome.name(), self.route_name(route), key, v.cause),
        );
    }

    pub(super) fn record_finish(&self, route: usize, outcome: Option<Outcome>, key: Option<&str>, cause: &str) {
        if let Some(o) = outcome {
            self.count(route, o);
            if o != Outcome::Stored {
                let key = key.map(truncated).unwrap_or_else(|| "-".into());
                log(
                    LogLevel::Info,
                    &format!("idem: {} route={} key={} cause={}", o.name(), self.route_name(route), key, cause),
                );
            }
        }
    }

    /// Whether a route keeps its claims and tokens in Redis.
    pub(super) fn redis_route(&self, route: usize) -> bool {
        self.engine.policy(route).is_some_and(|p| p.store == StoreKind::Redis)
    }

    /// The Webdis call for a prepared claim or token use, with a fresh owner, and its ticket.
    pub(super) fn redis_op(&self, p: &Prepared, now: u64) -> Option<(redis::Command, redis::Ticket)> {
        let store = self.engine.redis()?;
        let owner = Envoy.random_u64().unwrap_or(now);
        Some(match &p.op {
            StoreOp::Claim { id, fingerprint } => {
                let lock_ttl = self.engine.policy(p.route).map(|r| r.key.lock_ttl.millis).unwrap_or(1);
                store.claim(id, fingerprint, owner, now, lock_ttl)
            }
            StoreOp::UseToken { id } => store.use_token(id, owner, now),
        })
    }

    /// Sends a Webdis command through the `[redis]` cluster.
    pub(super) fn dispatch(&self, cmd: &redis::Command) -> Result<u32, StoreError> {
        let (Some(cfg), Some(store)) = (self.engine.bundle.redis.as_ref(), self.engine.redis()) else {
            return Err(StoreError::Host("no [redis] table".into()));
        };
        let headers = store.headers();
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        hostcalls::dispatch_http_call(
            &cfg.cluster,
            headers,
            Some(cmd.body.as_bytes()),
            vec![],
            Duration::from_millis(cfg.timeout.millis.max(1)),
        )
        .map_err(|s| StoreError::Host(format!("dispatch_http_call to cluster {}: {s:?}", cfg.cluster)))
    }

    /// Sends queued finish jobs (root context only: the callouts belong to the root).
    pub(super) fn send_outbox(&self) {
        let jobs: Vec<Job> = self.outbox.borrow_mut().drain(..).collect();
        for job in jobs {
            match self.dispatch(&job.cmd) {
                Ok(token) => {
                    self.finishing.borrow_mut().insert(token, job);
                }
                Err(e) => {
                    let cause = format!("{}; {e}", job.cause);
                    self.record_finish(job.route, Some(Outcome::StoreError), job.key.as_deref(), &cause);
                    if let Some(ctx) = job.resume {
                        if hostcalls::set_effective_context(ctx).is_ok() {
                            let _ = hostcalls::resume_http_response();
                        }
                    }
                }
            }
        }
    }

    /// The reply to a finish job.
    pub(super) fn finished(&self, job: Job, status: u16, body: &[u8]) {
        let Some(store) = self.engine.redis() else {
            return;
        };
        let applied = store.parse_update(status, body);
        let (outcome, cause) = match job.kind {
            FinishKind::Release => crate::engine::released(applied, job.cause),
            FinishKind::Restore => crate::engine::restored(applied, job.cause),
            FinishKind::Complete { tombstone } => {
                let done = applied.map(|ok| match (ok, tombstone) {
                    (false, _) => crate::store::Completion::LostOwnership,
                    (true, true) => crate::store::Completion::Tombstoned,
                    (true, false) => crate::store::Completion::Stored,
                });
                crate::engine::completed(done, job.cause)
            }
        };
        self.record_finish(job.route, outcome, job.key.as_deref(), &cause);
        if let Some(ctx) = job.resume {
            // The client gets its answer only now, so its next retry finds the record written.
            if hostcalls::set_effective_context(ctx).is_ok() {
                let _ = hostcalls::resume_http_response();
            }
        }
    }

    /// A held request's verdict, acted on from the root context.
    pub(super) fn resolve_waiter(&self, ctx: u32, v: Verdict) {
        let route = {
            let mut waiters = self.waiters.borrow_mut();
            match &v.action {
                Do::Wait { .. } => {
                    if let Some(w) = waiters.get_mut(&ctx) {
                        w.polling = false;
                    }
                    return;
                }
                _ => match waiters.remove(&ctx) {
                    Some(w) => w.prepared.route,
                    None => return, // the client went away meanwhile
                },
            }
        };
        self.record(route, &v);
        if hostcalls::set_effective_context(ctx).is_err() {
            return;
        }
        match v.action {
            Do::Forward(ticket) => {
                if let Some(t) = ticket {
                    self.handoff.borrow_mut().insert(ctx, (t, v.key.unwrap_or_default()));
                }
                let _ = hostcalls::resume_http_request();
            }
            Do::Reply(r) => send(&r),
            Do::Wait { .. } => {}
        }
    }
}

pub(super) fn send(r: &crate::response::LocalReply) {
    let headers: Vec<(&str, &str)> = r.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    if let Err(s) = hostcalls::send_http_response(u32::from(r.status), headers, Some(&r.body)) {
        log(LogLevel::Error, &format!("idem: send_http_response failed: {s:?}"));
    }
}

/// The callout reply being handled: HTTP status (0 when the callout failed) and body.
pub(super) fn call_response(num_headers: usize, body_size: usize) -> (u16, Vec<u8>) {
    let status = if num_headers == 0 {
        0
    } else {
        hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    };
    let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size).ok().flatten().unwrap_or_default();
    (status, body)
}
