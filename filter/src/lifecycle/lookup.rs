//! A repeat that meets an unknown outcome on a route with `[route.reconcile]`: the stream takes
//! the key's lookup (one request per key asks; the others wait as for a request in flight), sends
//! `GET <lookup>` to the service, and carries out what the answer decides.

use super::stream::{text, Pending, Phase, Stream};
use super::worker::status_of;
use super::writes::After;
use super::Flow;
use crate::engine::{
    failed_cause, reconciled_absent, reconciled_ran, Action, LookupAnswer, Outcome, Prepared, StoreTicket, Verdict,
};
use crate::host::{Host, Level};
use crate::pairs::Pair;
use crate::policy::Found;
use crate::response::{LocalReply, StoredResponse};
use crate::store::{redis, Claim, Payload, StoreError};
use std::rc::Rc;

/// A lookup out: what its answer settles.
pub(super) struct Looking {
    pub(super) prepared: Prepared,
    pub(super) ticket: StoreTicket,
    /// The 409 the request gets when the lookup settles nothing.
    pub(super) unknown: LocalReply,
    pub(super) token: u32,
}

impl Stream {
    /// Starts reconciling: takes the lookup and sends it, or — another request asks already —
    /// goes by what the store says now (in flight: the request waits or gets 409 as for one).
    pub(super) fn reconcile(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        held: StoreTicket,
        unknown: LocalReply,
        paused: bool,
    ) -> Flow {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let key = Some(prepared.key.clone());
        if let StoreTicket::Redis(held) = &held {
            return self.take_redis_lookup(host, prepared, held, unknown, paused);
        }
        let ticket = match w.engine.take_lookup(host, &prepared, &held) {
            Ok(Some(ticket)) => ticket,
            Ok(None) => {
                let v = w.engine.run_shared(host, &prepared, None, None);
                let v = match v.action {
                    Action::Reconcile { .. } => Verdict {
                        outcome: Outcome::OutcomeUnknown,
                        action: Action::Reply(unknown),
                        cause: "outcome_unknown".into(),
                        key,
                    },
                    _ => v,
                };
                return self.apply(host, route, v, paused);
            }
            Err(e) => {
                let cause = format!("lookup_not_taken: {e}");
                let v = Verdict { outcome: Outcome::ReconcileFailed, action: Action::Reply(unknown), cause, key };
                return self.apply(host, route, v, paused);
            }
        };
        match self.send_lookup(host, &prepared) {
            Ok(token) => {
                w.stream_call_out(token, self.context);
                self.phase = Phase::Looking(Box::new(Looking { prepared, ticket, unknown, token }));
                Flow::Pause
            }
            Err(why) => {
                w.log_once(host, &w.lookup_logged, Level::Warn, &format!("idem: a lookup could not be sent: {why}"));
                let answer = LookupAnswer { status: 0, headers: Vec::new(), body: Vec::new(), trailers: Vec::new() };
                let v = w.engine.after_lookup(host, &prepared, &ticket, answer, unknown);
                self.apply(host, route, v, paused)
            }
        }
    }

    /// `GET <lookup>` through the route's cluster (or the one `[route.reconcile]` names).
    fn send_lookup(&self, host: &dyn Host, prepared: &Prepared) -> Result<u32, String> {
        let w = &self.worker;
        let reconcile = w.engine.policy(prepared.route).reconcile.as_ref().ok_or("no [route.reconcile]")?;
        let path = w.engine.lookup_path(prepared).ok_or("no lookup path")?;
        let cluster = match &reconcile.cluster {
            Some(c) => c.clone(),
            None => text(host.property(&["xds", "cluster_name"])),
        };
        let authority = match &reconcile.authority {
            Some(a) => a.clone(),
            None => self.request.authority(),
        };
        // A gRPC call's lookup answers the reply message (see `LookupAnswer::into_grpc`).
        let accept = if self.request.grpc { "application/x-protobuf, application/grpc" } else { "application/json" };
        let headers = vec![
            (":method".to_string(), "GET".to_string()),
            (":path".to_string(), path),
            (":authority".to_string(), authority),
            ("accept".to_string(), accept.to_string()),
            ("idempotency-lookup".to_string(), "true".to_string()),
        ];
        host.dispatch(&cluster, &headers, &[], reconcile.timeout.millis)
            .map_err(|e| format!("dispatch_http_call to cluster {cluster:?}: {e:?}"))
    }

    /// The lookup's answer (already read where Envoy delivered it).
    pub(super) fn on_lookup_reply(&mut self, host: &dyn Host, headers: &[Pair], body: &[u8]) {
        let Phase::Looking(looking) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        let Looking { prepared, ticket, unknown, token } = *looking;
        let w = Rc::clone(&self.worker);
        w.stream_call_done(token);
        let answer = LookupAnswer {
            status: status_of(headers),
            headers: headers
                .iter()
                .map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.clone()))
                .collect(),
            body: body.to_vec(),
            trailers: Vec::new(),
        };
        // A gRPC call takes the lookup's answer only as a gRPC reply (see `into_grpc`).
        let answer = match (self.request.grpc, w.engine.lookup_found(&prepared, answer.status)) {
            (true, Found::Ran) => match answer.into_grpc() {
                Ok(a) => a,
                Err(cause) => return self.lookup_settled_nothing(host, prepared, ticket, unknown, cause),
            },
            _ => answer,
        };
        if let StoreTicket::Redis(lookup) = ticket {
            return self.after_redis_lookup(host, prepared, lookup, answer, unknown);
        }
        let v = w.engine.after_lookup(host, &prepared, &ticket, answer, unknown);
        self.apply(host, prepared.route, v, true);
    }

    /// A lookup whose answer settles nothing for this request: given back, and the 409.
    fn lookup_settled_nothing(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        ticket: StoreTicket,
        unknown: LocalReply,
        cause: String,
    ) {
        let w = Rc::clone(&self.worker);
        let v = w.engine.lookup_settled_nothing(&prepared, unknown, cause);
        match ticket {
            StoreTicket::Redis(lookup) => self.settle_redis(host, &prepared, &lookup, None, v),
            shared => {
                w.engine.drop_lookup(host, &shared);
                self.apply(host, prepared.route, v, true);
            }
        }
    }

    /// The request left while its lookup was out: the lookup is given up, so the next repeat
    /// asks again without waiting for the lease to run out.
    pub(super) fn abandon_lookup(&mut self, host: &dyn Host) {
        if let Phase::Looking(looking) = &self.phase {
            self.worker.stream_call_done(looking.token);
            match &looking.ticket {
                StoreTicket::Redis(t) => {
                    let p = &looking.prepared;
                    self.worker.queue_lookup_write(host, p.route, Some(p.key.clone()), t, None, After::Nothing);
                }
                shared => self.worker.engine.drop_lookup(host, shared),
            }
            self.phase = Phase::Idle;
        }
    }

    // ---- on Redis: each step a Webdis call (take the lookup, ask, write what it says)

    /// Takes the lookup of the unknown outcome `held` (the record the claim found): one write,
    /// fenced on that record, so of the repeats that meet it one asks.
    fn take_redis_lookup(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        held: &redis::Ticket,
        unknown: LocalReply,
        paused: bool,
    ) -> Flow {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let now = host.now_ms();
        let timeout = w.engine.policy(route).reconcile.as_ref().map_or(0, |r| r.timeout.millis);
        let Some(store) = w.engine.redis() else {
            let v = w.engine.lookup_settled_nothing(&prepared, unknown, "no_redis".into());
            return self.apply(host, route, v, paused);
        };
        // The lease outlives the call by a second, so a lookup that times out settles itself.
        let owner = host.random_u64().unwrap_or(now);
        let (cmd, lookup) = store.take_lookup(held, owner, now.saturating_add(timeout).saturating_add(1000));
        match w.dispatch(host, &cmd) {
            Ok(token) => {
                w.stream_call_out(token, self.context);
                self.phase = Phase::AwaitingStore(Pending::TakeLookup { prepared, lookup, unknown }, now, token);
                Flow::Pause
            }
            Err(e) => {
                let v = w.engine.lookup_settled_nothing(&prepared, unknown, format!("lookup_not_taken: {e}"));
                self.apply(host, route, v, paused)
            }
        }
    }

    /// The lookup is taken (or not): ask the service, or go by what the key holds now.
    pub(super) fn lookup_taken(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        lookup: redis::Ticket,
        unknown: LocalReply,
        taken: Result<bool, StoreError>,
    ) {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        match taken {
            Ok(true) => match self.send_lookup(host, &prepared) {
                Ok(token) => {
                    w.stream_call_out(token, self.context);
                    let ticket = StoreTicket::Redis(lookup);
                    self.phase = Phase::Looking(Box::new(Looking { prepared, ticket, unknown, token }));
                }
                Err(why) => {
                    w.log_once(
                        host,
                        &w.lookup_logged,
                        Level::Warn,
                        &format!("idem: a lookup could not be sent: {why}"),
                    );
                    let v = w.engine.lookup_settled_nothing(&prepared, unknown, failed_cause(0));
                    self.settle_redis(host, &prepared, &lookup, None, v);
                }
            },
            // Another repeat took it first (or the key changed): as for a request in flight.
            Ok(false) => {
                let now = host.now_ms();
                let in_flight =
                    Claim::InFlight { first_seen_ms: lookup.first_seen_ms, lease_ends_ms: now, payload: Payload::Same };
                let v = w.engine.after_claim(&prepared, Ok(in_flight), now, None);
                self.apply(host, route, v, true);
            }
            Err(e) => {
                // The write may have landed: give it back (fenced).
                let v = w.engine.lookup_settled_nothing(&prepared, unknown, format!("lookup_not_taken: {e}"));
                self.settle_redis(host, &prepared, &lookup, None, v);
            }
        }
    }

    /// What a lookup's answer does on Redis: `ran` → its answer is the repeat's now and is
    /// written as the key's (in the background, fenced by the lookup); `absent` → the key becomes
    /// this request's claim (awaited: the request runs only once it owns the key); else the
    /// unknown outcome is given back and the repeat gets the 409.
    fn after_redis_lookup(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        lookup: redis::Ticket,
        answer: LookupAnswer,
        unknown: LocalReply,
    ) {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        match w.engine.lookup_found(&prepared, answer.status) {
            Found::Ran => {
                let stored =
                    StoredResponse::new(answer.status, answer.headers, answer.body).with_trailers(answer.trailers);
                let v = reconciled_ran(&prepared, &stored);
                self.settle_redis(host, &prepared, &lookup, Some(&stored), v);
            }
            Found::Absent => {
                let now = host.now_ms();
                let (Some(store), policy) = (w.engine.redis(), w.engine.policy(route)) else {
                    return;
                };
                let owner = host.random_u64().unwrap_or(now);
                let (cmd, claim) = store.lookup_absent(&lookup, owner, now, policy.key.lock_ttl.millis);
                match w.dispatch(host, &cmd) {
                    Ok(token) => {
                        w.stream_call_out(token, self.context);
                        let pending = Pending::LookupAbsent { prepared, lookup, claim, unknown, status: answer.status };
                        self.phase = Phase::AwaitingStore(pending, now, token);
                    }
                    Err(e) => {
                        let v = w.engine.lookup_settled_nothing(&prepared, unknown, format!("store: {e}"));
                        self.settle_redis(host, &prepared, &lookup, None, v);
                    }
                }
            }
            Found::Failed => {
                let v = w.engine.lookup_settled_nothing(&prepared, unknown, failed_cause(answer.status));
                self.settle_redis(host, &prepared, &lookup, None, v);
            }
        }
    }

    /// The key became this request's claim (it runs as the first request), or did not.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn absent_written(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        lookup: redis::Ticket,
        claim: redis::Ticket,
        unknown: LocalReply,
        status: u16,
        written: Result<bool, StoreError>,
    ) {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let key = Some(prepared.key.clone());
        let v = match written {
            Ok(true) => reconciled_absent(&prepared, StoreTicket::Redis(claim), status),
            Ok(false) => w.engine.lookup_settled_nothing(&prepared, unknown, "lookup_lost".into()),
            Err(e) => {
                // Either write may have landed: the claim is released, the lookup given back.
                w.release_orphan(host, route, key, &claim);
                let v = w.engine.lookup_settled_nothing(&prepared, unknown, format!("store: {e}"));
                return self.settle_redis(host, &prepared, &lookup, None, v);
            }
        };
        self.apply(host, route, v, true);
    }

    /// Writes what the lookup settled (`answer`: it ran; `None`: the unknown outcome given back)
    /// and answers the request once the write's first attempt is answered — as a completion
    /// does — so the client's next repeat finds the key written, not the lookup's lease.
    fn settle_redis(
        &mut self,
        host: &dyn Host,
        prepared: &Prepared,
        lookup: &redis::Ticket,
        answer: Option<&StoredResponse>,
        v: Verdict,
    ) {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let key = Some(prepared.key.clone());
        if !matches!(v.action, Action::Reply(_)) {
            // Shadow mode forwards: nothing waits for the write.
            w.queue_lookup_write(host, route, key, lookup, answer, After::Nothing);
            self.apply(host, route, v, true);
            return;
        }
        w.record(host, route, &v);
        w.annotate(host, route, &v);
        if let Action::Reply(reply) = v.action {
            self.phase = Phase::Idle;
            let after = After::Deliver { ctx: self.context, route, reply, grpc: self.request.grpc };
            w.queue_lookup_write(host, route, key, lookup, answer, after);
        }
    }
}
