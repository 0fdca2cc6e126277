//! The engine driven on the shared store at once, for tests: the whole decision, a finish, a
//! token issued — what the lifecycle does through [`crate::store::Store`], in one call.

use super::finish::finished;
use super::verdict::{Begin, Ending, Finish, Prepared, StoreOp, StoreTicket, Ticket, Verdict};
use super::{Engine, Outcome};
use crate::host::Host;
use crate::key::RequestView;
use crate::policy::RouteId;
use crate::store::{Step, Store, StoreError};

impl Engine {
    /// The whole decision on the shared store, at once (tests drive the engine with it).
    pub fn decide_shared(&self, host: &dyn Host, route: RouteId, req: &dyn RequestView) -> Option<Verdict> {
        match self.begin(route, req, host.now_ms())? {
            Begin::Done(v) => Some(v),
            Begin::Store(p) => Some(self.run_shared(host, &p, None, Some(req))),
        }
    }

    /// Runs a prepared operation on the shared store, at once (tests). `waiting_until` is set
    /// when polling for a held duplicate; `req`, when at hand, settles an entry written with the
    /// legacy digest.
    pub fn run_shared(
        &self,
        host: &dyn Host,
        p: &Prepared,
        waiting_until: Option<u64>,
        req: Option<&dyn RequestView>,
    ) -> Verdict {
        let now = host.now_ms();
        match &p.op {
            StoreOp::Claim { id, fingerprint } => {
                let lock_ttl = self.lock_ttl_ms(p.route);
                let retain = self.policy(p.route).key.ttl.millis;
                let claim = self.shared.claim(host, id, fingerprint, lock_ttl, retain);
                let legacy = || req.and_then(|r| self.legacy_fingerprint(p.route, r));
                let claim = claim.map(|c| c.resolve_legacy(legacy).map(StoreTicket::Shared));
                self.after_claim(p, claim, now, waiting_until)
            }
            StoreOp::UseToken { id } => {
                let used = self.shared.use_token(host, id).map(|u| u.map(StoreTicket::Shared));
                self.after_token(p, used)
            }
        }
    }

    /// Finishes a ticket on the shared store, at once (tests). Returns the outcome to count (if
    /// any) and its cause.
    pub fn finish_shared(
        &self,
        host: &dyn Host,
        route: RouteId,
        ticket: &Ticket,
        ending: Ending,
    ) -> (Option<Outcome>, String) {
        let st = ticket.store_ticket();
        match self.plan_finish(route, ticket, ending, None) {
            Finish::Nothing { outcome, cause } => (outcome, cause),
            Finish::Write { write, cause } => {
                let written = match Store::write(&self.shared, host, st, &write, self.lock_ttl_ms(route), 0) {
                    Step::Now(r) => r,
                    Step::Call(_) => Err(StoreError::Host("the shared store made a call".into())),
                };
                finished(write.kind(), written, cause)
            }
        }
    }

    /// Records an issued token on the shared store (tests).
    pub fn issue_shared(&self, host: &dyn Host, route: RouteId, id: &[u8; 32]) -> Result<(), StoreError> {
        let ttl = self.policy(route).token.ttl.millis;
        self.shared.issue_token(host, id, ttl)
    }
}
