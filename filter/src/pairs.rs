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
    Iter::new(bytes).map(|(n, v)| (n.to_vec(), v.to_vec())).collect()
}

/// A header map kept in its serialized form and read in place: one buffer, where decoding it
/// into pairs takes two allocations per header — on every request, for a map that is mostly
/// searched for a few names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers {
    bytes: Vec<u8>,
}

impl Headers {
    /// A map as the host serialized it (malformed bytes read as the pairs before the damage).
    pub fn from_bytes(bytes: Vec<u8>) -> Headers {
        Headers { bytes }
    }

    pub fn from_pairs<N: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(N, V)]) -> Headers {
        Headers { bytes: encode(pairs) }
    }

    /// Every `(name, value)`, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter::new(&self.bytes)
    }

    /// The first value of `name` (exact bytes: Envoy's names are lower case).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    pub fn to_pairs(&self) -> Vec<Pair> {
        decode(&self.bytes)
    }

    /// The size of the serialized map (what crossed the ABI).
    pub fn byte_len(&self) -> usize {
        self.bytes.len()
    }
}

/// The pairs of a serialized map, borrowed; ends at the first inconsistency.
pub struct Iter<'a> {
    bytes: &'a [u8],
    count: usize,
    next: usize,
    /// Where the next name starts (after the sizes).
    at: usize,
}

impl<'a> Iter<'a> {
    fn new(bytes: &'a [u8]) -> Iter<'a> {
        let count = u32_at(bytes, 0).unwrap_or(0);
        // A count whose sizes do not fit in the buffer reads as nothing after what fits.
        let at = count.checked_mul(8).and_then(|n| n.checked_add(4)).unwrap_or(usize::MAX);
        Iter { bytes, count, next: 0, at }
    }
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a [u8], &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.count {
            return None;
        }
        let n = self.next;
        let name_len = u32_at(self.bytes, 4 + n * 8)?;
        let value_len = u32_at(self.bytes, 8 + n * 8)?;
        let name = self.at.checked_add(name_len).and_then(|end| self.bytes.get(self.at..end));
        let value_at = self.at.checked_add(name_len).and_then(|end| end.checked_add(1));
        let value = value_at.and_then(|p| p.checked_add(value_len).and_then(|end| self.bytes.get(p..end)));
        match (name, value, value_at) {
            (Some(name), Some(value), Some(p)) => {
                self.next += 1;
                self.at = p + value_len + 1;
                Some((name, value))
            }
            _ => {
                self.next = self.count;
                None
            }
        }
    }
}

fn u32_at(bytes: &[u8], i: usize) -> Option<usize> {
    let b = bytes.get(i..i.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
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
        let mut huge_name = full.clone();
        huge_name[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode(&huge_name).is_empty());
    }

    #[test]
    fn a_header_map_is_read_in_place() {
        let pairs = [(":method", "POST"), ("x-dup", "1"), ("x-dup", "2"), ("x-empty", "")];
        let headers = Headers::from_pairs(&pairs);
        assert_eq!(headers.get(b":method"), Some(&b"POST"[..]));
        assert_eq!(headers.get(b"x-dup"), Some(&b"1"[..]), "the first value");
        assert_eq!(headers.get(b"x-empty"), Some(&b""[..]));
        assert_eq!(headers.get(b"X-DUP"), None, "names are exact");
        assert_eq!(headers.iter().count(), 4);
        assert_eq!(headers.to_pairs(), decode(&encode(&pairs)));
        let full = encode(&pairs);
        // Cut anywhere before the last value's end, the map reads as the pairs before the cut.
        for cut in 0..full.len() - 1 {
            let partial = Headers::from_bytes(full[..cut].to_vec());
            assert!(partial.iter().count() < 4, "cut {cut}");
            assert_eq!(partial.to_pairs(), decode(&full[..cut]));
        }
    }
}
