//! The shared store behind the [`Store`] interface: every operation answers at once.

use super::{SharedStore, Ticket};
use crate::host::{Host, Level};
use crate::store::{Claim, Completion, Step, Store, StoreError, StoreTicket, TokenUse, Write, Written};

impl Store for SharedStore {
    fn claim(
        &self,
        host: &dyn Host,
        id: &[u8; 32],
        fingerprint: &[u8; 32],
        lease_ms: u64,
        retain_ms: u64,
        _now: u64,
    ) -> Step<Claim<StoreTicket>> {
        let found = SharedStore::claim(self, host, id, fingerprint, lease_ms, retain_ms);
        Step::Now(found.map(|c| c.map(StoreTicket::Shared)))
    }

    fn use_token(&self, host: &dyn Host, id: &[u8; 32], _now: u64) -> Step<TokenUse<StoreTicket>> {
        Step::Now(SharedStore::use_token(self, host, id).map(|u| u.map(StoreTicket::Shared)))
    }

    fn issue_token(&self, host: &dyn Host, id: &[u8; 32], ttl_ms: u64, _now: u64) -> Step<()> {
        Step::Now(SharedStore::issue_token(self, host, id, ttl_ms))
    }

    fn write(&self, host: &dyn Host, ticket: &StoreTicket, write: &Write, _lease_ms: u64, _now: u64) -> Step<Written> {
        Step::Now(shared_ticket(ticket).and_then(|t| self.write_now(host, t, write)))
    }

    fn renew(&self, host: &dyn Host, ticket: &StoreTicket, lease_ms: u64) -> Step<bool> {
        Step::Now(shared_ticket(ticket).and_then(|t| SharedStore::renew(self, host, t, lease_ms)))
    }

    fn take_lookup(&self, host: &dyn Host, held: &StoreTicket, lease_ms: u64, _now: u64) -> Step<Option<StoreTicket>> {
        let taken = shared_ticket(held).and_then(|t| SharedStore::take_lookup(self, host, t, lease_ms));
        Step::Now(taken.map(|t| t.map(StoreTicket::Shared)))
    }

    fn lookup_absent(
        &self,
        host: &dyn Host,
        lookup: &StoreTicket,
        lease_ms: u64,
        _now: u64,
    ) -> Step<Option<StoreTicket>> {
        let claim = shared_ticket(lookup).and_then(|t| SharedStore::lookup_absent(self, host, t, lease_ms));
        Step::Now(claim.map(|t| t.map(StoreTicket::Shared)))
    }
}

fn shared_ticket(ticket: &StoreTicket) -> Result<&Ticket, StoreError> {
    match ticket {
        StoreTicket::Shared(t) => Ok(t),
        StoreTicket::Redis(_) => Err(StoreError::Host("a Redis ticket given to the shared store".into())),
    }
}

impl SharedStore {
    fn write_now(&self, host: &dyn Host, t: &Ticket, write: &Write) -> Result<Written, StoreError> {
        let applied = |ok: bool| if ok { Written::Applied } else { Written::NotOurs };
        match write {
            Write::Release => self.release(host, t).map(applied),
            Write::RestoreToken => self.restore_token(host, t).map(applied),
            Write::Complete { response, max_response_bytes, ttl_ms } => {
                self.complete(host, t, response, *max_response_bytes, *ttl_ms).map(written)
            }
            Write::LookupRan { response, max_response_bytes, ttl_ms } => {
                self.lookup_ran(host, t, response, *max_response_bytes, *ttl_ms).map(written)
            }
            Write::LookupGivenBack => self.lookup_failed(host, t).map(applied),
            Write::HoldUnknown { hold_ms, note } => {
                let held = self.hold_unknown(host, t, *hold_ms)?;
                if held {
                    // The operator's list; the hold stands without it.
                    if let Err(e) = self.note_held(host, t, note) {
                        host.log(Level::Warn, &format!("idem: the unknown outcome's note for the operator: {e}"));
                    }
                }
                Ok(applied(held))
            }
        }
    }
}

fn written(c: Completion) -> Written {
    match c {
        Completion::Stored => Written::Applied,
        Completion::Tombstoned => Written::Tombstoned,
        Completion::LostOwnership => Written::NotOurs,
    }
}
