//! The root context: loads the policy bundle, polls held duplicates on its tick, and sends
//! Redis completions (woken through this worker's shared queue).

use super::abi;
use super::envoy::{log, Envoy, Level};
use super::request::Request;
use super::state::{call_response, State};
use super::WAIT_POLL;
use crate::engine::{Engine, Outcome, Prepared, StoreOp, StoreTicket};
use crate::host::Host;
use crate::policy::{parse_bundle, StoreKind};
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::ContextType;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;

pub(super) struct Root {
    pub(super) id: u32,
    pub(super) state: Option<Rc<State>>,
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        let Some(state) = self.state.clone() else {
            return;
        };
        let (status, headers, body) = call_response(num_headers, body_size);
        let job = state.finishing.borrow_mut().remove(&token);
        if let Some(job) = job {
            state.finished(job, status, &body);
            state.send_outbox();
            return;
        }
        let renewal = state.renewals.borrow_mut().remove(&token);
        if let Some(owner) = renewal {
            state.renewed(owner, status, &body);
            return;
        }
        let call = state.detached.borrow_mut().remove(&token);
        if let Some(call) = call {
            state.detached_answered(call, status, headers, body);
            state.send_outbox();
            return;
        }
        let Some((ctx, route, ticket)) = state.polls.borrow_mut().remove(&token) else {
            return;
        };
        let pending = state.waiters.borrow().get(&ctx).map(|w| (w.prepared.clone(), w.deadline_ms));
        let Some(store) = state.engine.redis() else {
            return;
        };
        let Some((prepared, deadline)) = pending else {
            // The held client left while its poll was out: a claim it won has nobody to finish it.
            if status == 0
                || matches!(
                    store.parse_claim(ticket.clone(), &[0; 32], status, &body),
                    Ok(crate::store::Claim::Claimed(_))
                )
            {
                state.release_orphan(route, None, &ticket);
                state.send_outbox();
            }
            return;
        };
        let StoreOp::Claim { fingerprint, .. } = &prepared.op else {
            return;
        };
        if status == 0 {
            state.release_orphan(prepared.route, Some(prepared.key.clone()), &ticket);
        }
        let claim = store.parse_claim(ticket, fingerprint, status, &body).map(|c| c.map(StoreTicket::Redis));
        let v = state.engine.after_claim(&prepared, claim, Envoy.now_ms(), Some(deadline));
        state.resolve_waiter(ctx, v);
    }
}

impl RootContext for Root {
    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(true) = abi::dequeue(queue_id) {}
        if let Some(state) = self.state.clone() {
            state.send_outbox();
        }
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = match abi::buffer(abi::buffer::PLUGIN_CONFIGURATION, 0, usize::MAX) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => Vec::new(),
            Err(s) => {
                log(Level::Critical, &format!("idem: invalid policy: cannot read plugin configuration: status {s}"));
                return false;
            }
        };
        let text = match String::from_utf8(config) {
            Ok(t) => t,
            Err(e) => {
                log(Level::Critical, &format!("idem: invalid policy: plugin configuration is not UTF-8: {e}"));
                return false;
            }
        };
        let bundle = match parse_bundle(&text, "plugin configuration") {
            Ok(b) => b,
            Err(e) => {
                log(Level::Critical, &format!("idem: invalid policy: {e}"));
                return false;
            }
        };
        let mut engine = Engine::new(bundle);
        match engine.initialise(&Envoy) {
            Ok(created) => log(
                Level::Info,
                &format!(
                    "idem: loaded {} route policies; shared store {} buckets × {} entries ({} created)",
                    engine.bundle.routes.len(),
                    engine.bundle.shared.buckets,
                    engine.bundle.shared.entries_per_bucket,
                    created
                ),
            ),
            Err(e) => {
                log(Level::Critical, &format!("idem: cannot initialise the shared store: {e}"));
                return false;
            }
        }
        let uses_redis = engine.bundle.routes.iter().any(|r| r.store == StoreKind::Redis);
        let uses_root = uses_redis || engine.has_detached();
        // The tick polls held duplicates, sends and retries queued writes, and renews leases.
        let tick_ms = if engine.has_waiters() || uses_root {
            Some(WAIT_POLL.as_millis() as u64)
        } else {
            engine.min_lock_ttl_ms().map(|l| (l / 3).clamp(20, 1000))
        };
        if let Some(ms) = tick_ms {
            if let Err(s) = abi::set_tick_period_ms(ms as u32) {
                log(Level::Critical, &format!("idem: cannot start the root timer: status {s}"));
                return false;
            }
        }
        // A queue of this worker's own (unique name): enqueueing wakes this root promptly.
        let wake_queue = if uses_root {
            let name = format!("idem-finish-{:016x}", Envoy.random_u64().unwrap_or(0));
            abi::register_queue(&name).ok()
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
                    .map(|o| abi::define_counter(&format!("idem.{}.{}", r.name, o.name())).ok())
                    .collect()
            })
            .collect();
        let unmatched_counters =
            [abi::define_counter("idem._unmatched.passed").ok(), abi::define_counter("idem._unmatched.rejected").ok()];
        let log_level = abi::log_level().unwrap_or(0);
        self.state = Some(Rc::new(State {
            engine,
            counters,
            unmatched_counters,
            log_level,
            waiters: RefCell::new(HashMap::new()),
            polls: RefCell::new(HashMap::new()),
            handoff: RefCell::new(HashMap::new()),
            outbox: RefCell::new(VecDeque::new()),
            finishing: RefCell::new(HashMap::new()),
            detached_out: RefCell::new(Vec::new()),
            detached: RefCell::new(HashMap::new()),
            wake_queue,
            root_id: self.id,
            leases: RefCell::new(HashMap::new()),
            renewals: RefCell::new(HashMap::new()),
            live: RefCell::new(HashSet::new()),
        }));
        true
    }

    fn on_tick(&mut self) {
        let Some(state) = self.state.clone() else {
            return;
        };
        state.send_outbox();
        state.renew_leases();
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
            if let Some(v) = state.engine.unwritten(&Envoy, &prepared, &ticket.key) {
                // The first answer is in this process, not yet in Redis: keep holding.
                if now >= deadline {
                    state.resolve_waiter(ctx, v);
                }
                continue;
            }
            match state.dispatch(&cmd) {
                Ok(token) => {
                    state.polls.borrow_mut().insert(token, (ctx, prepared.route, ticket));
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
        state.live.borrow_mut().insert(context_id);
        Some(Box::new(Request::new(state, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
