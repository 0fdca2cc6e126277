//! The host on Envoy: the core's [`Host`] trait on the raw ABI ([`super::abi`]), and logging.

use super::abi;
use crate::host::{Host, HostError};

/// [`Host`] on Envoy's hostcalls.
pub(super) struct Envoy;

impl Host for Envoy {
    fn now_ms(&self) -> u64 {
        abi::now_ms().unwrap_or(0)
    }
    fn shared_get(&self, key: &str) -> Result<Option<(Vec<u8>, u32)>, HostError> {
        abi::shared_get(key).map_err(|s| HostError::Failed(format!("get_shared_data: status {s}")))
    }
    fn shared_set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), HostError> {
        match abi::shared_set(key, value, cas.unwrap_or(0)) {
            Ok(()) => Ok(()),
            Err(abi::CAS_MISMATCH) => Err(HostError::CasMismatch),
            Err(s) => Err(HostError::Failed(format!("set_shared_data: status {s}"))),
        }
    }
    /// Owner ids need to be unique across workers, not secret: SplitMix64 seeded once per VM
    /// from WASI `random_get`, instead of a host call per claim.
    fn random_u64(&self) -> Result<u64, HostError> {
        OWNER_SEED.with(|seed| {
            let mut s = seed.get();
            if s == 0 {
                s = getrandom::u64().map_err(|e| HostError::Failed(format!("random_get: {e}")))? | 1;
            }
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            seed.set(s);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            Ok(z ^ (z >> 31))
        })
    }
}

thread_local! {
    static OWNER_SEED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Envoy's log levels (proxy-wasm numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Level {
    Debug = 1,
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

pub(super) fn log(level: Level, msg: &str) {
    abi::log(level as u32, msg);
}
