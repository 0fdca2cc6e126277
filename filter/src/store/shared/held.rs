//! The operator's view of the shared store, served by the admin listener (`role = "admin"`):
//! every unknown outcome held, and the two fenced changes an operator makes to one. The admin
//! instance runs in the same Envoy process and VM as the gateway (same `vm_id`), so it reads the
//! same shared data; it never creates or resizes a bucket, and takes the shape the gateway
//! created (its own `[shared]` sizes need not match).

use super::{lookup_out, Edit, Entry, SharedStore, State, ENTRY_LEN, SLOT_ANSWER};
use crate::host::Host;
use crate::response::StoredResponse;
use crate::store::operator::{Change, HeldNote, KeyState, RecordKind};
use crate::store::text::{push_decimal, push_hex};
use crate::store::StoreError;

/// One unknown outcome, as `GET /unknown` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldEntry {
    pub bucket: u32,
    pub id: [u8; 16],
    pub owner: u64,
    pub first_seen_ms: u64,
    pub held_until_ms: u64,
    /// A lookup (`[route.reconcile]`) is asking the service about it right now.
    pub looking_up: bool,
    /// The route and key prefix noted when it was held ([`SharedStore::note_held`]).
    pub note: Option<HeldNote>,
}

impl HeldEntry {
    /// `s:<bucket>:<id>`: what the operator names the entry by (also in the `unknown_outcome`
    /// log line).
    pub fn store_key(&self) -> String {
        store_key(self.bucket, &self.id)
    }
}

/// The store key of a shared-store entry: `s:<bucket>:<the 16-byte id in hex>`.
pub fn store_key(bucket: u32, id: &[u8; 16]) -> String {
    let mut key = String::with_capacity(2 + 10 + 1 + 32);
    key.push_str("s:");
    push_decimal(&mut key, u64::from(bucket));
    key.push(':');
    push_hex(&mut key, id);
    key
}

/// Reads `s:<bucket>:<32 lowercase hex digits>`; `None` for anything else.
pub fn parse_store_key(key: &str) -> Option<(u32, [u8; 16])> {
    let rest = key.strip_prefix("s:")?;
    let (bucket, hex) = rest.split_once(':')?;
    if bucket.is_empty() || bucket.len() > 5 || !bucket.bytes().all(|b| b.is_ascii_digit()) || hex.len() != 32 {
        return None;
    }
    let mut id = [0u8; 16];
    for (o, pair) in id.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        let digit = |c: u8| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        };
        *o = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Some((bucket.parse().ok()?, id))
}

/// The most buckets a gateway creates (`[shared] buckets` is at most 65536).
const MAX_BUCKETS: u32 = 65536;

impl SharedStore {
    /// The store the gateway instances of this namespace created, in the shape they created it
    /// (entries per bucket from a bucket's length, buckets counted): `None` when none did yet.
    pub fn attach(&self, host: &dyn Host) -> Result<Option<SharedStore>, StoreError> {
        let Some((first, _)) = host.shared_get(&self.bucket_key(0))? else {
            return Ok(None);
        };
        // The shape the gateway recorded, when this version created the store.
        if let Some((shape, _)) = host.shared_get(&self.shape_key())? {
            let shape = String::from_utf8_lossy(&shape).into_owned();
            if let Some((b, e)) = shape.split_once('x').and_then(|(b, e)| Some((b.parse().ok()?, e.parse().ok()?))) {
                return Ok(Some(SharedStore { buckets: b, entries: e, prefix: self.prefix.clone(), secret: [0; 16] }));
            }
        }
        let entries = (first.len() / ENTRY_LEN) as u32;
        let mut buckets = 1;
        while buckets < MAX_BUCKETS && host.shared_get(&self.bucket_key(buckets))?.is_some() {
            buckets += 1;
        }
        Ok(Some(SharedStore { buckets, entries, prefix: self.prefix.clone(), secret: [0; 16] }))
    }

    /// Notes which route and key the unknown outcome `t` held is (the operator's list shows
    /// them). One key per entry position, so notes never outgrow the store (shared-data keys
    /// cannot be deleted); a note names the entry's id and is read only while that entry is
    /// there. Written without CAS: the last hold at a position is the one its entry holds.
    pub fn note_held(&self, host: &dyn Host, t: &super::Ticket, note: &HeldNote) -> Result<(), StoreError> {
        let mut value = store_key(t.bucket, &t.id);
        value.push('|');
        note.encode_into(&mut value);
        host.shared_set(&self.note_key(t.bucket, t.index), value.as_bytes(), None)?;
        Ok(())
    }

    fn note_key(&self, b: u32, i: u32) -> String {
        format!("{}:n:{b}:{i}", self.prefix)
    }

    /// The note of entry `id` at position `i` of bucket `b`, if the one there is its own.
    fn read_note(&self, host: &dyn Host, b: u32, i: u32, id: &[u8; 16]) -> Result<Option<HeldNote>, StoreError> {
        let Some((value, _)) = host.shared_get(&self.note_key(b, i))? else {
            return Ok(None);
        };
        let value = String::from_utf8_lossy(&value);
        let fields: Vec<&str> = value.split('|').collect();
        match fields.split_first() {
            Some((key, note)) if *key == store_key(b, id) => Ok(HeldNote::decode(note)),
            _ => Ok(None),
        }
    }

    /// What the store holds for the scoped id `id` now (read only), and the entry's store key
    /// (`s:<bucket>:<id>`, the bucket the id falls in when absent).
    pub fn inspect(&self, host: &dyn Host, id: &[u8; 32]) -> Result<(KeyState, String), StoreError> {
        // An attached store knows the shape, not the secret a key's bucket depends on: read it.
        let mut secret = [0u8; 16];
        match host.shared_get(&self.secret_key())? {
            Some((v, _)) if v.len() == 16 => secret.copy_from_slice(&v),
            _ => return Err(StoreError::Missing(self.secret_key())),
        }
        let located = SharedStore { buckets: self.buckets, entries: self.entries, prefix: self.prefix.clone(), secret };
        let (b, short) = located.locate(id);
        let now = host.now_ms();
        let (entries, _) = self.read(host, b)?;
        for (i, e) in entries.iter().enumerate() {
            if e.id != short || e.state == State::Empty {
                continue;
            }
            let (seen, _) = self.settled(host, b, i, e)?;
            if !seen.live(now) {
                continue;
            }
            let owner = format!("{:016x}", seen.owner);
            let first_seen_ms = seen.first_seen_ms;
            let state = match seen.state {
                State::InFlight => KeyState::Claimed { owner, first_seen_ms, lease_ends_ms: seen.lease_end_ms },
                State::Completed | State::Tombstone => KeyState::Completed {
                    owner,
                    first_seen_ms,
                    status: seen.status,
                    whole: seen.state == State::Completed,
                },
                State::Unknown => KeyState::Unknown {
                    owner,
                    first_seen_ms,
                    held_until_ms: seen.until_ms,
                    looking_up: lookup_out(seen.status, now),
                },
                State::Issued | State::Used | State::Empty => continue,
            };
            return Ok((state, store_key(b, &short)));
        }
        Ok((KeyState::Absent, store_key(b, &short)))
    }

    /// Every unknown outcome held now, oldest first.
    pub fn held(&self, host: &dyn Host) -> Result<Vec<HeldEntry>, StoreError> {
        let now = host.now_ms();
        let mut out = Vec::new();
        for b in 0..self.buckets {
            let (entries, _) = self.read(host, b)?;
            for (i, e) in entries.iter().enumerate() {
                if e.state != State::Unknown || !e.live(now) {
                    continue;
                }
                out.push(HeldEntry {
                    bucket: b,
                    id: e.id,
                    owner: e.owner,
                    first_seen_ms: e.first_seen_ms,
                    held_until_ms: e.until_ms,
                    looking_up: lookup_out(e.status, now),
                    note: self.read_note(host, b, i as u32, &e.id)?,
                });
            }
        }
        out.sort_by_key(|e| (e.first_seen_ms, e.bucket, e.id));
        Ok(out)
    }

    /// Releases the unknown outcome `id` of bucket `bucket` (of `owner`, when given): the
    /// client's next repeat runs as a first request.
    pub fn operator_release(
        &self,
        host: &dyn Host,
        bucket: u32,
        id: &[u8; 16],
        owner: Option<u64>,
    ) -> Result<Change, StoreError> {
        self.change_held(host, bucket, id, owner, |entries, i, _| {
            entries[i] = Entry::EMPTY;
            Ok(())
        })
    }

    /// Stores `answer` as the key's answer until its hold would have ended: the client's
    /// repeats (same fingerprint) get it replayed; another request with the key gets 422.
    pub fn operator_resolve(
        &self,
        host: &dyn Host,
        bucket: u32,
        id: &[u8; 16],
        owner: Option<u64>,
        answer: &StoredResponse,
    ) -> Result<Change, StoreError> {
        let mut slot_written = None;
        self.change_held(host, bucket, id, owner, |entries, i, e| {
            // The slot first, under the entry's owner, as a completion writes it: a reader that
            // sees the new entry finds its answer.
            if slot_written != Some(i) {
                self.write_slot(host, bucket, i as u32, e.layout, e.owner, SLOT_ANSWER, e.until_ms, answer)?;
                slot_written = Some(i);
            }
            let entry = &mut entries[i];
            entry.state = State::Completed;
            entry.status = answer.status;
            Ok(())
        })
    }

    /// Applies `f` to the entry `id` of `bucket` if it is a live unknown outcome (of `owner`)
    /// with no lookup out, in one CAS write.
    fn change_held(
        &self,
        host: &dyn Host,
        bucket: u32,
        id: &[u8; 16],
        owner: Option<u64>,
        mut f: impl FnMut(&mut [Entry], usize, Entry) -> Result<(), StoreError>,
    ) -> Result<Change, StoreError> {
        if bucket >= self.buckets {
            return Ok(Change::Absent);
        }
        self.modify(host, bucket, |entries, now| {
            let Some(i) = entries.iter().position(|e| e.id == *id && e.live(now)) else {
                return Ok(Edit::Done(Change::Absent));
            };
            // A claim completed through its slot alone reads as completed.
            let e = self.settled(host, bucket, i, &entries[i])?.0;
            let kind = match e.state {
                State::Unknown if lookup_out(e.status, now) => RecordKind::LookingUp,
                State::Unknown => RecordKind::Unknown,
                State::InFlight => RecordKind::InFlight,
                State::Completed => RecordKind::Completed,
                State::Tombstone => RecordKind::Tombstone,
                _ => RecordKind::Other,
            };
            if kind != RecordKind::Unknown {
                return Ok(Edit::Done(Change::Holds(kind)));
            }
            if owner.is_some_and(|o| o != e.owner) {
                return Ok(Edit::Done(Change::OtherOwner(format!("{:016x}", e.owner))));
            }
            f(entries, i, e)?;
            Ok(Edit::Write(Change::Done))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn store_keys_read_back_and_nothing_else_does() {
        let id = [0xab; 16];
        let key = store_key(17, &id);
        assert_eq!(key, format!("s:17:{}", "ab".repeat(16)));
        assert_eq!(parse_store_key(&key), Some((17, id)));
        for bad in [
            "s:17:".to_string(),
            format!("s::{}", "ab".repeat(16)),
            format!("s:-1:{}", "ab".repeat(16)),
            format!("s:17:{}", "AB".repeat(16)),
            format!("s:17:{}0", "ab".repeat(16)),
            format!("s:123456:{}", "ab".repeat(16)),
            format!("idem:k:{}", "ab".repeat(32)),
            "s:1:../../../etc/passwd0000000000".to_string(),
        ] {
            assert_eq!(parse_store_key(&bad), None, "{bad}");
        }
    }
}
