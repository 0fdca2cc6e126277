//! Hand-off slots for gRPC replays: a local reply to a gRPC call can only be trailers-only, so a
//! replayed gRPC answer takes one hop through Envoy — the gateway puts the stored answer in a
//! slot, sends the call to the echo listener with the slot's token, and the echo instance (same
//! VM, same shared data) answers with what the slot holds.
//!
//! A fixed pool of [`SLOTS`] shared-data keys (`<prefix>:replay:<i>`), created empty when the
//! plugin configures, so memory stays bounded (shared data is never deleted). A slot is
//! *allocated*, not drawn at random: a replay takes a slot only while it is empty (or its
//! answer was never fetched within [`STALE_MS`]), with a compare-and-swap on the existing key,
//! so two replays — on any workers — never share one, and a slot is never overwritten while its
//! echo may still come. The echo empties the slot when it takes the answer. The token
//! (`<i>.<nonce>`) carries a random nonce, so a client cannot read a slot it was not given.
//! With every slot taken, `put` fails with [`StoreError::Full`]: the caller answers a retryable
//! error rather than a wrong one.

use crate::host::{Host, HostError};
use crate::response::StoredResponse;
use crate::store::StoreError;
use std::cell::Cell;

/// The pool's size: gRPC replays in flight at once, per Envoy process.
pub const SLOTS: u64 = 256;
/// A slot whose answer was not fetched within this long is free again (its client left before
/// the echo hop, which takes milliseconds).
pub const STALE_MS: u64 = 30_000;
/// `<nonce:16 hex><put_ms:16 hex>|`.
const HEAD: usize = 33;

pub struct ReplaySlots {
    prefix: String,
    /// Where this worker looks for a free slot next (round robin: a slot just freed is the last
    /// one tried again).
    next: Cell<u64>,
    /// Whether this worker made sure the slots exist (on its first replay: a bundle without
    /// gRPC calls never creates them).
    ready: Cell<bool>,
}

impl ReplaySlots {
    /// Slots in a plugin's shared-data namespace (the echo instance must share it: same vm_id,
    /// same namespace).
    pub fn new(namespace: &str) -> Self {
        let prefix = format!("{}:{namespace}:replay:", super::shared::PREFIX);
        ReplaySlots { prefix, next: Cell::new(0), ready: Cell::new(false) }
    }

    fn key(&self, slot: u64) -> String {
        format!("{}{slot}", self.prefix)
    }

    /// Creates the slots that do not exist yet, empty (compare-and-swap protects only existing
    /// keys, so allocation must never meet an absent one). Each worker starts its round robin
    /// at its own place. Done on a worker's first replay; two workers' very first replays at the
    /// same instant are the one window where an insert can land over a fresh answer (that
    /// replay then reads as gone, never as another call's answer).
    fn initialise(&self, host: &dyn Host) -> Result<(), StoreError> {
        for slot in 0..SLOTS {
            let key = self.key(slot);
            if host.shared_get(&key)?.is_none() {
                host.shared_set(&key, b"", None)?;
            }
        }
        self.next.set(host.random_u64()? % SLOTS);
        Ok(())
    }

    /// Puts an answer in a free slot; its token. `Err(StoreError::Full)` when every slot holds
    /// an answer whose echo may still come.
    pub fn put(&self, host: &dyn Host, answer: &StoredResponse) -> Result<String, StoreError> {
        if !self.ready.get() {
            self.initialise(host)?;
            self.ready.set(true);
        }
        let now = host.now_ms();
        let nonce = host.random_u64()?;
        let mut value = format!("{nonce:016x}{now:016x}|").into_bytes();
        answer.encode_into(&mut value);
        let start = self.next.get();
        for i in 0..SLOTS {
            let slot = (start + i) % SLOTS;
            let key = self.key(slot);
            let Some((held, cas)) = host.shared_get(&key)? else {
                return Err(StoreError::Missing(key));
            };
            if !free(&held, now) {
                continue;
            }
            match host.shared_set(&key, &value, Some(cas)) {
                Ok(()) => {
                    self.next.set((slot + 1) % SLOTS);
                    return Ok(format!("{slot}.{nonce:016x}"));
                }
                // Another worker took it between our read and write: the next one.
                Err(HostError::CasMismatch) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Full)
    }

    /// Takes the answer a token names, emptying its slot; `None` when the token is malformed or
    /// the slot holds something else (taken already).
    pub fn take(&self, host: &dyn Host, token: &str) -> Option<StoredResponse> {
        let (slot, nonce) = token.split_once('.')?;
        let slot: u64 = slot.parse().ok().filter(|s| *s < SLOTS)?;
        let key = self.key(slot);
        let (value, cas) = host.shared_get(&key).ok()??;
        let (head, encoded) = value.split_at_checked(HEAD)?;
        if head.get(..16)? != nonce.as_bytes() || head.get(HEAD - 1) != Some(&b'|') {
            return None;
        }
        let answer = StoredResponse::decode(encoded)?;
        // Emptied, so the slot is free again and the token cannot be used twice.
        host.shared_set(&key, b"", Some(cas)).ok()?;
        Some(answer)
    }
}

/// Whether a slot's value leaves it free: empty, or an answer put longer than [`STALE_MS`] ago
/// (or unreadable: written by another version).
fn free(held: &[u8], now: u64) -> bool {
    if held.is_empty() {
        return true;
    }
    let put_ms =
        held.get(16..32).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u64::from_str_radix(h, 16).ok());
    match put_ms {
        Some(put) => now.saturating_sub(put) >= STALE_MS,
        None => true,
    }
}
