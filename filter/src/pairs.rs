//! The proxy-wasm serialization of a header map, in both directions, on bytes.
//!
//! Layout (ABI v0.2.1): `count: u32`, then `count × (name_len: u32, value_len: u32)`, then each
//! name and value followed by a NUL byte. All integers little-endian.
//!
//! The SDK's own decoder (proxy-wasm 0.2.5 `hostcalls::utils::deserialize_map`) unwraps
//! `String::from_utf8` on every name and value, so one Latin-1 header byte from a client or an
//! upstream traps the VM. This one keeps bytes and never panics: a malformed buffer decodes to
//! the pairs read before the damage.

/// A header as Envoy holds it: bytes, not necessarily UTF-8.
pub type Pair = (Vec<u8>, Vec<u8>);

/// Decodes a serialized map; stops at the first inconsistency instead of failing.
pub fn decode(bytes: &[u8]) -> Vec<Pair> {
    let u32_at = |i: usize| -> Option<usize> {
        let b = bytes.get(i..i.checked_add(4)?)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let Some(count) = u32_at(0) else {
        return Vec::new();
    };
    // Each pair needs at least 8 bytes of sizes and 2 NULs: a lying count cannot allocate much.
    let mut pairs = Vec::with_capacity(count.min(bytes.len() / 10));
    let Some(mut p) = count.checked_mul(8).and_then(|n| n.checked_add(4)) else {
        return pairs;
    };
    for n in 0..count {
        let (Some(name_len), Some(value_len)) = (u32_at(4 + n * 8), u32_at(8 + n * 8)) else {
            break;
        };
        let Some(name) = p.checked_add(name_len).and_then(|end| bytes.get(p..end)) else {
            break;
        };
        p += name_len + 1;
        let Some(value) = p.checked_add(value_len).and_then(|end| bytes.get(p..end)) else {
            break;
        };
        p += value_len + 1;
        pairs.push((name.to_vec(), value.to_vec()));
    }
    pairs
}

/// Serializes pairs for the host (local replies, callout headers).
pub fn encode<N: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(N, V)]) -> Vec<u8> {
    let size = 4 + pairs.iter().map(|(n, v)| 10 + n.as_ref().len() + v.as_ref().len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (n, v) in pairs {
        out.extend_from_slice(&(n.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (n, v) in pairs {
        out.extend_from_slice(n.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

/// A property path (`["xds", "route_name"]`) as the host reads it: each segment NUL-terminated.
pub fn property_path(path: &[&str]) -> Vec<u8> {
    let mut out = Vec::with_capacity(path.iter().map(|s| s.len() + 1).sum());
    for s in path {
        out.extend_from_slice(s.as_bytes());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_keeps_non_utf8_bytes() {
        let pairs: Vec<Pair> = vec![
            (b":status".to_vec(), b"200".to_vec()),
            (b"content-disposition".to_vec(), b"attachment; filename=\"r\xe9sum\xe9.pdf\"".to_vec()),
            (b"x-empty".to_vec(), Vec::new()),
        ];
        assert_eq!(decode(&encode(&pairs)), pairs);
    }

    #[test]
    fn truncated_or_lying_buffers_never_panic() {
        let full = encode(&[("a", "1"), ("b", "2")]);
        for cut in 0..full.len() {
            let got = decode(&full[..cut]);
            assert!(got.len() <= 2, "cut {cut}: {got:?}");
        }
        let mut lying = full.clone();
        lying[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&lying).len() <= 2);
        assert!(decode(&[]).is_empty());
    }
}
