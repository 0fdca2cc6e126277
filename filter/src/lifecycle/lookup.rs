//! A repeat that meets an unknown outcome on a route with `[route.reconcile]`: the stream takes
//! the key's lookup through the route's store (one request per key asks; the others wait as for
//! a request in flight), sends `GET <lookup>` to the service, and carries out what the answer
//! decides. Each store step answers at once (the shared store) or is a Webdis call (Redis):
//! one path either way.

use super::stream::{text, Pending, Phase, Stream};
use super::worker::status_of;
use super::writes::After;
use super::Flow;
use crate::engine::{
    failed_cause, reconciled_absent, reconciled_ran, Action, LookupAnswer, Prepared, StoreTicket, Verdict,
};
use crate::host::{Host, Level};
use crate::policy::Found;
use crate::response::{LocalReply, StoredResponse};
use crate::store::{Call, Claim, Payload, Step, StoreError, Write, Written};
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
    /// Starts reconciling: takes the lookup of the unknown outcome `held` (the record the claim
    /// found) — one write, fenced on that record, so of the repeats that meet it one asks.
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
        let now = host.now_ms();
        let first_seen_ms = held.first_seen_ms();
        // The lease outlives the call by a second, so a lookup that times out settles itself.
        let timeout = w.engine.policy(route).reconcile.as_ref().map_or(0, |r| r.timeout.millis);
        match w.engine.store(route).take_lookup(host, &held, timeout.saturating_add(1000), now) {
            Step::Now(taken) => self.lookup_taken(host, prepared, unknown, first_seen_ms, taken, paused),
            Step::Call(Call { cmd, ticket: Some(lookup), .. }) => match w.dispatch(host, &cmd) {
                Ok(token) => {
                    w.stream_call_out(token, self.context);
                    self.phase = Phase::AwaitingStore(Pending::TakeLookup { prepared, lookup, unknown }, now, token);
                    Flow::Pause
                }
                Err(e) => self.lookup_taken(host, prepared, unknown, first_seen_ms, Err(e), paused),
            },
            Step::Call(_) => self.lookup_taken(host, prepared, unknown, first_seen_ms, Ok(None), paused),
        }
    }

    /// The lookup is taken (ask the service), or another repeat asks already (as for a request
    /// in flight, first seen at `first_seen_ms`), or the store failed (the 409).
    pub(super) fn lookup_taken(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        unknown: LocalReply,
        first_seen_ms: u64,
        taken: Result<Option<StoreTicket>, StoreError>,
        paused: bool,
    ) -> Flow {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        match taken {
            Ok(Some(ticket)) => match self.send_lookup(host, &prepared) {
                Ok(token) => {
                    w.stream_call_out(token, self.context);
                    self.phase = Phase::Looking(Box::new(Looking { prepared, ticket, unknown, token }));
                    Flow::Pause
                }
                Err(why) => {
                    w.log_once(
                        host,
                        &w.lookup_logged,
                        Level::Warn,
                        &format!("idem: a lookup could not be sent: {why}"),
                    );
                    self.settle_lookup(host, &prepared, &ticket, Settled::Nothing(failed_cause(0)), unknown, paused)
                }
            },
            Ok(None) => {
                let now = host.now_ms();
                let in_flight = Claim::InFlight { first_seen_ms, lease_ends_ms: now, payload: Payload::Same };
                let v = w.engine.after_claim(&prepared, Ok(in_flight), now, None);
                self.apply(host, route, v, paused)
            }
            Err(e) => {
                let v = w.engine.lookup_settled_nothing(&prepared, unknown, format!("lookup_not_taken: {e}"));
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

    /// The lookup's answer (already read where Envoy delivered it): `ran` → its answer is the
    /// repeat's and is written as the key's; `absent` → the key becomes this request's claim
    /// (the request runs only once it owns the key); else the unknown outcome is given back and
    /// the repeat gets the 409.
    pub(super) fn on_lookup_reply(&mut self, host: &dyn Host, headers: &crate::pairs::Headers, body: &[u8]) {
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
                .map(|(n, v)| (String::from_utf8_lossy(n).to_ascii_lowercase(), v.to_vec()))
                .collect(),
            body: body.to_vec(),
            trailers: Vec::new(),
        };
        let route = prepared.route;
        let found = w.engine.lookup_found(&prepared, answer.status);
        // A gRPC call takes the lookup's answer only as a gRPC reply (see `into_grpc`).
        let answer = match (self.request.grpc, found) {
            (true, Found::Ran) => match answer.into_grpc() {
                Ok(a) => a,
                Err(cause) => {
                    self.settle_lookup(host, &prepared, &ticket, Settled::Nothing(cause), unknown, true);
                    return;
                }
            },
            _ => answer,
        };
        let policy = w.engine.policy(route);
        match found {
            Found::Ran => {
                let stored =
                    StoredResponse::new(answer.status, answer.headers, answer.body).with_trailers(answer.trailers);
                self.settle_lookup(host, &prepared, &ticket, Settled::Ran(stored), unknown, true);
            }
            Found::Absent => {
                let now = host.now_ms();
                let status = answer.status;
                match w.engine.store(route).lookup_absent(host, &ticket, policy.key.lock_ttl.millis, now) {
                    Step::Now(claim) => self.absent_written(host, prepared, &ticket, unknown, status, claim),
                    Step::Call(Call { cmd, ticket: Some(claim), .. }) => match w.dispatch(host, &cmd) {
                        Ok(token) => {
                            w.stream_call_out(token, self.context);
                            let lookup = ticket;
                            let pending = Pending::LookupAbsent { prepared, lookup, claim, unknown, status };
                            self.phase = Phase::AwaitingStore(pending, now, token);
                        }
                        Err(e) => {
                            let settled = Settled::Nothing(format!("store: {e}"));
                            self.settle_lookup(host, &prepared, &ticket, settled, unknown, true);
                        }
                    },
                    Step::Call(_) => {}
                }
            }
            Found::Failed => {
                let settled = Settled::Nothing(failed_cause(answer.status));
                self.settle_lookup(host, &prepared, &ticket, settled, unknown, true);
            }
        }
    }

    /// The request left while its lookup was out: the lookup is given up, so the next repeat
    /// asks again without waiting for the lease to run out.
    pub(super) fn abandon_lookup(&mut self, host: &dyn Host) {
        if let Phase::Looking(looking) = &self.phase {
            self.worker.stream_call_ended(host, looking.token);
            let p = &looking.prepared;
            self.worker.give_back_lookup(host, p.route, Some(p.key.clone()), &looking.ticket);
            self.phase = Phase::Idle;
        }
    }

    /// The key became this request's claim (it runs as the first request), or did not: the
    /// lookup lost the key meanwhile (what it holds now decides), or the store failed (given
    /// back, the 409).
    pub(super) fn absent_written(
        &mut self,
        host: &dyn Host,
        prepared: Prepared,
        lookup: &StoreTicket,
        unknown: LocalReply,
        status: u16,
        written: Result<Option<StoreTicket>, StoreError>,
    ) {
        match written {
            Ok(Some(claim)) => {
                let v = reconciled_absent(&prepared, claim, status);
                self.apply(host, prepared.route, v, true);
            }
            Ok(None) => {
                self.look_again(host, prepared, unknown);
            }
            Err(e) => {
                self.settle_lookup(host, &prepared, lookup, Settled::Nothing(format!("store: {e}")), unknown, true);
            }
        }
    }

    /// Writes what the lookup settled, fenced by its ticket, and answers the request: at once
    /// when the store writes at once; else once the write's first attempt is answered — as a
    /// completion does — so the client's next repeat finds the key written, not the lookup's
    /// lease. An answer that finds the key taken over (the lookup's lease ran out) writes
    /// nothing, and what the key holds now decides. `unknown` is the 409 for a lookup that
    /// settles nothing.
    pub(super) fn settle_lookup(
        &mut self,
        host: &dyn Host,
        prepared: &Prepared,
        lookup: &StoreTicket,
        settled: Settled,
        unknown: LocalReply,
        paused: bool,
    ) -> Flow {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let key = Some(prepared.key.clone());
        let policy = w.engine.policy(route);
        let (write, v) = match settled {
            Settled::Ran(response) => {
                let v = reconciled_ran(prepared, &response);
                let max_response_bytes = policy.max_response_bytes as usize;
                (Write::LookupRan { response, max_response_bytes, ttl_ms: policy.key.ttl.millis }, v)
            }
            Settled::Nothing(cause) => {
                (Write::LookupGivenBack, w.engine.lookup_settled_nothing(prepared, unknown.clone(), cause))
            }
        };
        let lease = policy.key.lock_ttl.millis;
        let call = match w.engine.store(route).write(host, lookup, &write, lease, host.now_ms()) {
            Step::Now(written) => {
                return match (write, written) {
                    (Write::LookupRan { .. }, Ok(Written::NotOurs)) => self.look_again(host, prepared.clone(), unknown),
                    (Write::LookupRan { .. }, Err(e)) => {
                        w.give_back_lookup(host, route, key, lookup);
                        let v = w.engine.lookup_settled_nothing(prepared, unknown, format!("store: {e}"));
                        self.apply(host, route, v, paused)
                    }
                    _ => self.apply(host, route, v, paused),
                };
            }
            Step::Call(call) => call,
        };
        if !matches!(v.action, Action::Reply(_)) {
            // Shadow mode forwards: nothing waits for the write.
            w.queue_lookup_call(host, route, key, lookup, &write, call, After::Nothing);
            return self.apply(host, route, v, paused);
        }
        w.record(host, route, &v);
        w.annotate(host, route, &v);
        if let Action::Reply(reply) = v.action {
            self.phase = Phase::Idle;
            let after = After::Deliver { ctx: self.context, route, reply, grpc: self.request.grpc };
            w.queue_lookup_call(host, route, key, lookup, &write, call, after);
        }
        Flow::Pause
    }

    /// The key changed while the lookup was out (its lease ran out and another repeat took
    /// it): what it holds now decides, but never a second lookup from here (`unknown` instead).
    fn look_again(&mut self, host: &dyn Host, prepared: Prepared, unknown: LocalReply) -> Flow {
        let w = Rc::clone(&self.worker);
        let route = prepared.route;
        let now = host.now_ms();
        let (id, fingerprint) = match &prepared.op {
            crate::engine::StoreOp::Claim { id, fingerprint } => (*id, *fingerprint),
            crate::engine::StoreOp::UseToken { .. } => return Flow::Continue,
        };
        let key = &w.engine.policy(route).key;
        let v = match w.engine.store(route).claim(host, &id, &fingerprint, key.lock_ttl.millis, key.ttl.millis, now) {
            Step::Now(found) => w.engine.after_claim(&prepared, found.map(|c| c.resolve_legacy(|| None)), now, None),
            Step::Call(_) => w.engine.lookup_settled_nothing(&prepared, unknown.clone(), "lookup_lost".into()),
        };
        let v = match v.action {
            Action::Reconcile { .. } => Verdict { action: Action::Reply(unknown), cause: "lookup_lost".into(), ..v },
            _ => v,
        };
        self.apply(host, route, v, true)
    }
}

/// What a lookup's answer settled.
pub(super) enum Settled {
    /// The first attempt ran: this is its answer.
    Ran(StoredResponse),
    /// Nothing, and why.
    Nothing(String),
}
