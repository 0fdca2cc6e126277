//! The root context: loads the policy bundle, polls held duplicates on its tick, and sends
//! Redis completions (woken through this worker's shared queue).

use crate::engine::{Engine, Outcome, Prepared, StoreOp, StoreTicket};
use crate::host::Host;
use crate::policy::{parse_bundle, StoreKind};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel, MetricType};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use super::*;

pub(super) struct Root {
    pub(super) state: Option<Rc<State>>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        let Some(state) = self.state.clone() else {
            return;
        };
        let job = state.finishing.borrow_mut().remove(&token);
        if let Some(job) = job {
            let (status, body) = call_response(num_headers, body_size);
            state.finished(job, status, &body);
            return;
        }
        let Some((ctx, ticket)) = state.polls.borrow_mut().remove(&token) else {
            return;
        };
        let (status, body) = call_response(num_headers, body_size);
        let pending = state.waiters.borrow().get(&ctx).map(|w| (w.prepared.clone(), w.deadline_ms));
        let (Some((prepared, deadline)), Some(store)) = (pending, state.engine.redis()) else {
            return;
        };
        let StoreOp::Claim { fingerprint, .. } = &prepared.op else {
            return;
        };
        let claim = store.parse_claim(ticket, fingerprint, status, &body).map(|c| c.map(StoreTicket::Redis));
        let v = state.engine.after_claim(&prepared, claim, Envoy.now_ms(), Some(deadline));
        state.resolve_waiter(ctx, v);
    }
}

impl RootContext for Root {
    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue_id) {}
        if let Some(state) = self.state.clone() {
            state.send_outbox();
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, usize::MAX) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => Vec::new(),
            Err(s) => {
                log(LogLevel::Critical, &format!("idem: invalid policy: cannot read plugin configuration: {s:?}"));
                return false;
            }
        };
        let text = match String::from_utf8(config) {
            Ok(t) => t,
            Err(e) => {
                log(LogLevel::Critical, &format!("idem: invalid policy: plugin configuration is not UTF-8: {e}"));
                return false;
            }
        };
        let bundle = match parse_bundle(&text, "plugin configuration") {
            Ok(b) => b,
            Err(e) => {
                log(LogLevel::Critical, &format!("idem: invalid policy: {e}"));
                return false;
            }
        };
        let engine = Engine::new(bundle);
        match engine.initialise(&Envoy) {
            Ok(created) => log(
                LogLevel::Info,
                &format!(
                    "idem: loaded {} route policies; shared store {} buckets × {} entries ({} created)",
                    engine.bundle.routes.len(),
                    engine.bundle.shared.buckets,
                    engine.bundle.shared.entries_per_bucket,
                    created
                ),
            ),
            Err(e) => {
                log(LogLevel::Critical, &format!("idem: cannot initialise the shared store: {e}"));
                return false;
            }
        }
        let uses_redis = engine.bundle.routes.iter().any(|r| r.store == StoreKind::Redis);
        if engine.has_waiters() || uses_redis {
            // Polls held duplicates; for Redis also a backstop that sends queued finish jobs.
            if let Err(s) = hostcalls::set_tick_period(WAIT_POLL) {
                log(LogLevel::Critical, &format!("idem: cannot start the root timer: {s:?}"));
                return false;
            }
        }
        // A queue of this worker's own (unique name): enqueueing wakes this root promptly.
        let wake_queue = if uses_redis {
            let name = format!("idem-finish-{:016x}", Envoy.random_u64().unwrap_or(0));
            hostcalls::register_shared_queue(&name).ok()
        } else {
            None
        };
        let counters = engine
            .bundle
            .routes
            .iter()
            .map(|r| {
                Outcome::ALL
                    .iter()
                    .map(|o| {
                        hostcalls::define_metric(MetricType::Counter, &format!("idem.{}.{}", r.name, o.name())).ok()
                    })
                    .collect()
            })
            .collect();
        let log_level = hostcalls::get_log_level().map(|l| l as u32).unwrap_or(0);
        self.state = Some(Rc::new(State {
            engine,
            counters,
            log_level,
            waiters: RefCell::new(HashMap::new()),
            polls: RefCell::new(HashMap::new()),
            handoff: RefCell::new(HashMap::new()),
            outbox: RefCell::new(Vec::new()),
            finishing: RefCell::new(HashMap::new()),
            wake_queue,
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(state) = self.state.clone() else {
            return;
        };
        state.send_outbox();
        let due: Vec<(u32, Prepared, u64)> = state
            .waiters
            .borrow()
            .iter()
            .filter(|(_, w)| !w.polling)
            .map(|(ctx, w)| (*ctx, w.prepared.clone(), w.deadline_ms))
            .collect();
        for (ctx, prepared, deadline) in due {
            if !state.redis_route(prepared.route) {
                let v = state.engine.run_shared(&Envoy, &prepared, Some(deadline));
                state.resolve_waiter(ctx, v);
                continue;
            }
            let now = Envoy.now_ms();
            let Some((cmd, ticket)) = state.redis_op(&prepared, now) else {
                continue;
            };
            match state.dispatch(&cmd) {
                Ok(token) => {
                    state.polls.borrow_mut().insert(token, (ctx, ticket));
                    if let Some(w) = state.waiters.borrow_mut().get_mut(&ctx) {
                        w.polling = true;
                    }
                }
                Err(e) => {
                    let v = state.engine.after_claim(&prepared, Err(e), now, Some(deadline));
                    state.resolve_waiter(ctx, v);
                }
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let state = self.state.clone()?;
        Some(Box::new(Request {
            state,
            context_id,
            route: None,
            method: String::new(),
            path: String::new(),
            body: None,
            decided: false,
            forwarded: false,
            ticket: None,
            key: None,
            pending: None,
            response: None,
            holding: false,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
