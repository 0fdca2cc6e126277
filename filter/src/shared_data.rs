//! Envoy's shared-data semantics in process memory: the map the native build's embedded store
//! lives in (Envoy's dynamic modules have no shared data of their own), and the test host's.
//!
//! The rules are Envoy's proxy-wasm shared data (docs/design.md, reference §9), kept exactly so
//! that the shared store (`store/shared.rs`), written and proven against them, holds its
//! guarantees unchanged on either host: one CAS counter for the whole map; a write to an
//! existing key with a non-zero CAS succeeds only if the stored CAS still matches; a write to an
//! absent key inserts whatever CAS was passed; nothing is ever deleted. One mutex makes each
//! get and set atomic across worker threads, as Envoy's own lock does.

use crate::host::HostError;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// Keys are the store's own (`<namespace>:b:<bucket>`, `…:r:<bucket>:<slot>`: bounded, never a
/// caller's bytes), so a fast fixed-seed hash serves; SipHash took three times as long here.
type Entries = HashMap<String, (Vec<u8>, u32), foldhash::fast::FixedState>;

#[derive(Default)]
struct Map {
    entries: Entries,
    next_cas: u32,
}

/// One shared-data map (Envoy keeps one per `vm_id`).
#[derive(Default)]
pub struct SharedData {
    map: Mutex<Map>,
}

impl SharedData {
    /// A poisoned lock only means a thread panicked while holding it; every write below
    /// completes before it can panic, so the map is whole either way.
    fn lock(&self) -> MutexGuard<'_, Map> {
        self.map.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A value and its CAS, or `None` when the key was never written.
    pub fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.lock().entries.get(key).cloned()
    }

    /// Writes `value`; with a non-zero `cas`, only if an existing key's CAS still matches.
    pub fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        let mut map = self.lock();
        let Map { entries, next_cas } = &mut *map;
        let entry = entries.get_mut(key);
        if let (Some((_, stored)), Some(c)) = (&entry, cas) {
            if c != 0 && c != *stored {
                return Err(HostError::CasMismatch);
            }
        }
        *next_cas = next_cas.wrapping_add(1).max(1);
        match entry {
            Some(entry) => {
                entry.0.clear();
                entry.0.extend_from_slice(value);
                entry.1 = *next_cas;
            }
            None => {
                entries.insert(key.to_string(), (value.to_vec(), *next_cas));
            }
        }
        Ok(())
    }

    /// Every key, sorted (tests that reach into the store's layout).
    pub fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.lock().entries.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Number of keys and total bytes held (keys + values), like Envoy's map.
    pub fn footprint(&self) -> (usize, usize) {
        let map = self.lock();
        (map.entries.len(), map.entries.iter().map(|(k, (v, _))| k.len() + v.len()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_cas_is_refused_and_an_absent_key_ignores_it() {
        let data = SharedData::default();
        data.set("k", b"1", Some(77)).unwrap_or_default();
        let (v, cas) = data.get("k").unwrap_or_default();
        assert_eq!(v, b"1");
        assert_eq!(data.set("k", b"2", Some(cas.wrapping_add(1))), Err(HostError::CasMismatch));
        assert_eq!(data.set("k", b"2", Some(cas)), Ok(()));
        assert_eq!(data.set("k", b"3", Some(cas)), Err(HostError::CasMismatch));
        assert_eq!(data.set("k", b"3", Some(0)), Ok(()));
        assert_eq!(data.get("k").map(|(v, _)| v), Some(b"3".to_vec()));
        assert_eq!(data.footprint(), (1, 2));
    }
}
