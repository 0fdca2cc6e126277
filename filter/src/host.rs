//! The host boundary: everything the core needs from Envoy, as calls that return `Result`.
//!
//! The Wasm glue implements [`Host`] with proxy-wasm hostcalls; [`FakeHost`] implements it in
//! memory with Envoy's real shared-data semantics (proxy-wasm-cpp-host `src/shared_data.cc`):
//! one global CAS counter, `set` on an absent key inserts whatever CAS was passed, no delete.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostError {
    /// The value changed since it was read (compare-and-swap failed).
    CasMismatch,
    /// Any other failure of a host call.
    Failed(String),
}

pub trait Host {
    /// Wall-clock time in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
    /// A value and its CAS, or `None` when the key was never written.
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError>;
    /// Writes a value; with `Some(cas)` only if the stored CAS still matches (existing keys only).
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError>;
    /// 64 random bits (owner ids).
    fn random_u64(&self) -> Result<u64, HostError>;
}

/// Envoy's map for one vm_id: key → (value, cas), plus the global CAS counter.
#[derive(Default)]
struct SharedData {
    map: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
}

/// In-memory host for tests. `Sync`, so threads can play Envoy's worker VMs against one store.
#[derive(Default)]
pub struct FakeHost {
    data: Mutex<SharedData>,
    now: AtomicU64,
    rng: AtomicU64,
    /// When set, every shared-data call fails (store outage).
    pub failing: std::sync::atomic::AtomicBool,
}

impl FakeHost {
    pub fn new(now_ms: u64) -> Self {
        let h = FakeHost::default();
        h.now.store(now_ms, Ordering::SeqCst);
        h
    }
    pub fn advance(&self, ms: u64) {
        self.now.fetch_add(ms, Ordering::SeqCst);
    }
    /// Number of keys and total bytes held (keys + values), like Envoy's map.
    pub fn footprint(&self) -> (usize, usize) {
        match self.data.lock() {
            Ok(g) => (g.map.len(), g.map.iter().map(|(k, (v, _))| k.len() + v.len()).sum()),
            Err(_) => (0, 0),
        }
    }
    fn check(&self) -> Result<(), HostError> {
        if self.failing.load(Ordering::SeqCst) {
            Err(HostError::Failed("shared data unavailable (fake outage)".into()))
        } else {
            Ok(())
        }
    }
}

impl Host for FakeHost {
    fn now_ms(&self) -> u64 {
        self.now.load(Ordering::SeqCst)
    }
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        self.check()?;
        let g = self.data.lock().map_err(|_| HostError::Failed("poisoned".into()))?;
        Ok(g.map.get(key).cloned())
    }
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        self.check()?;
        let mut g = self.data.lock().map_err(|_| HostError::Failed("poisoned".into()))?;
        let SharedData { map, next_cas: counter } = &mut *g;
        if let Some((_, stored)) = map.get(key) {
            if let Some(c) = cas {
                if c != 0 && c != *stored {
                    return Err(HostError::CasMismatch);
                }
            }
        }
        // Envoy: an absent key is inserted whatever CAS was passed.
        *counter = counter.wrapping_add(1);
        if *counter == 0 {
            *counter = 1;
        }
        map.insert(key.to_string(), (value.to_vec(), *counter));
        Ok(())
    }
    fn random_u64(&self) -> Result<u64, HostError> {
        // Distinct, non-zero, and not sequential-looking.
        let n = self.rng.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
}
