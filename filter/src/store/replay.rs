//! Hand-off slots for gRPC replays: a local reply to a gRPC call can only be trailers-only, so a
//! replayed gRPC answer takes one hop through Envoy — the gateway puts the stored answer in a
//! slot, sends the call to the echo listener with the slot's token, and the echo instance (same
//! VM, same shared data) answers with what the slot holds.
//!
//! A fixed ring of [`SLOTS`] shared-data keys (`<prefix>:replay:<i>`), so memory stays bounded
//! (shared data is never deleted): a slot holds `<nonce>|<encoded answer>` until the echo takes it
//! and empties it. The token (`<i>.<nonce>`) carries a random nonce, so a client cannot read a
//! slot it was not given; a slot overwritten before its echo came (more than [`SLOTS`] replays
//! in flight) reads as gone, and that replay gets an error, never another call's answer.

use crate::host::Host;
use crate::response::StoredResponse;
use crate::store::StoreError;

const SLOTS: u64 = 256;

pub struct ReplaySlots {
    prefix: String,
}

impl ReplaySlots {
    /// Slots in a plugin's shared-data namespace (the echo instance must share it: same vm_id,
    /// same namespace).
    pub fn new(namespace: &str) -> Self {
        ReplaySlots { prefix: format!("{}:{namespace}:replay:", super::shared::PREFIX) }
    }

    /// Puts an answer in a slot; its token.
    pub fn put(&self, host: &dyn Host, answer: &StoredResponse) -> Result<String, StoreError> {
        let slot = host.random_u64()? % SLOTS;
        let nonce = host.random_u64()?;
        let mut value = format!("{nonce:016x}|").into_bytes();
        answer.encode_into(&mut value);
        host.shared_set(&format!("{}{slot}", self.prefix), &value, None)?;
        Ok(format!("{slot}.{nonce:016x}"))
    }

    /// Takes the answer a token names, emptying its slot; `None` when the token is malformed or
    /// the slot holds something else (taken, or reused).
    pub fn take(&self, host: &dyn Host, token: &str) -> Option<StoredResponse> {
        let (slot, nonce) = token.split_once('.')?;
        let slot: u64 = slot.parse().ok().filter(|s| *s < SLOTS)?;
        let key = format!("{}{slot}", self.prefix);
        let (value, cas) = host.shared_get(&key).ok()??;
        let (head, encoded) = value.split_at_checked(17)?;
        if head.get(..16)? != nonce.as_bytes() || head.get(16) != Some(&b'|') {
            return None;
        }
        let answer = StoredResponse::decode(encoded)?;
        // Emptied, so the slot's memory goes back and the token cannot be used twice.
        let _ = host.shared_set(&key, b"", Some(cas));
        Some(answer)
    }
}
