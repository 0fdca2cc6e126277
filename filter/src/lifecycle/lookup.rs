//! A repeat that meets an unknown outcome on a route with `[route.reconcile]`: the stream takes
//! the key's lookup (one request per key asks; the others wait as for a request in flight), sends
//! `GET <lookup>` to the service, and carries out what the answer decides.

use super::stream::{text, Phase, Stream};
use super::worker::status_of;
use super::Flow;
use crate::engine::{Action, LookupAnswer, Outcome, Prepared, StoreTicket, Verdict};
use crate::host::{Host, Level};
use crate::pairs::Pair;
use crate::response::LocalReply;
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
        if self.request.grpc {
            // A lookup's answer is an HTTP answer, which a gRPC client cannot take as its reply.
            let v = Verdict {
                outcome: Outcome::OutcomeUnknown,
                action: Action::Reply(unknown),
                cause: "outcome_unknown_grpc".into(),
                key,
            };
            return self.apply(host, route, v, paused);
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
                let answer = LookupAnswer { status: 0, headers: Vec::new(), body: Vec::new() };
                let v = w.engine.after_lookup(host, &prepared, &ticket, answer, unknown);
                self.apply(host, route, v, paused)
            }
        }
    }

    /// `GET <lookup>` through the route's cluster (or the one `[route.reconcile]` names).
    fn send_lookup(&self, host: &dyn Host, prepared: &Prepared) -> Result<u32, String> {
        let w = &self.worker;
        let reconcile =
            w.engine.policy(prepared.route).and_then(|p| p.reconcile.as_ref()).ok_or("no [route.reconcile]")?;
        let path = w.engine.lookup_path(prepared).ok_or("no lookup path")?;
        let cluster = match &reconcile.cluster {
            Some(c) => c.clone(),
            None => text(host.property(&["xds", "cluster_name"])),
        };
        let authority = match &reconcile.authority {
            Some(a) => a.clone(),
            None => self.request.authority(),
        };
        let headers = vec![
            (":method".to_string(), "GET".to_string()),
            (":path".to_string(), path),
            (":authority".to_string(), authority),
            ("accept".to_string(), "application/json".to_string()),
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
        };
        let v = w.engine.after_lookup(host, &prepared, &ticket, answer, unknown);
        self.apply(host, prepared.route, v, true);
    }

    /// The request left while its lookup was out: the lookup is given up, so the next repeat
    /// asks again without waiting for the lease to run out.
    pub(super) fn abandon_lookup(&mut self, host: &dyn Host) {
        if let Phase::Looking(looking) = &self.phase {
            self.worker.stream_call_done(looking.token);
            self.worker.engine.drop_lookup(host, &looking.ticket);
            self.phase = Phase::Idle;
        }
    }
}
