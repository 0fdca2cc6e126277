//! The shared-data store: atomic claims on Envoy's proxy-wasm shared data, bounded in memory.
//!
//! Envoy's shared data has three traps (proxy-wasm-cpp-host `src/shared_data.cc`): CAS does not protect a key that does
//! not exist yet, keys cannot be deleted, and every get/set copies the whole value under one
//! process-wide mutex. So:
//! - a fixed number of *bucket* keys is created when the plugin configures, and every claim is a
//!   get → edit → set-with-CAS on an existing bucket (retried a bounded number of times);
//! - a bucket holds a fixed number of small entries (hashed key, state, owner, fingerprint,
//!   first-seen, lease/expiry), so expiry lives inside values and nothing needs deleting;
//! - each entry position owns one response slot key, written once per completion, so hot bucket
//!   values stay small and memory is bounded by `buckets × entries × (entry + slot)`.
//!
//! Every claim carries a random owner id; completion and release check it (fencing), and a stored
//! response carries its owner so a replay never serves a slot that another owner rewrote.

pub mod held;
mod interface;

use super::text::push_decimal;
use super::{Answer, Claim, Completion, Payload, StoreError, TokenUse};
use crate::host::{Host, HostError};
use crate::policy::SharedConfig;
use crate::response::StoredResponse;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;

/// Every shared-data key starts with this, then the plugin's namespace.
pub(crate) const PREFIX: &str = "idem:v1";
const ENTRY_LEN: usize = 60;
/// A claim completes through its response slot alone (no bucket read or write) only while its
/// lease has at least this long to run: no other request can take the key over meanwhile, so
/// the slot it writes is still its own. Nearer the lease's end it goes through the bucket, fenced.
const SLOT_COMPLETION_MARGIN_MS: u64 = 1000;
/// What follows the owner in a slot a [`Layout::SlotCompletion`] entry's owner wrote: read by an
/// earlier version as a response, it is a status with trailers whose first header claims 4 GiB,
/// so that version finds no response there (a slot being rewritten: in flight), never a wrong one.
const SLOT_RECORD_MARK: [u8; 8] = [0xff; 8];
/// The record's kind, after the mark: an answer (the response follows) or a tombstone.
const SLOT_ANSWER: u8 = 1;
const SLOT_TOMBSTONE: u8 = 2;
/// Owner, mark, kind, status, expiry: what precedes the stored response in such a slot.
const SLOT_RECORD_HEADER: usize = 8 + 8 + 1 + 2 + 8;
/// CAS retries before a claim gives up as a store error. Contention on one bucket across
/// workers is short-lived; a bounded loop keeps a hot bucket from spinning a worker.
const MAX_CAS_RETRIES: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty = 0,
    InFlight = 1,
    Completed = 2,
    Tombstone = 3,
    /// A token issued and not used yet.
    Issued = 4,
    /// A token used; `first_seen_ms` is when.
    Used = 5,
    /// Forwarded, no answer: held until `until_ms`, never taken over. While a lookup asks the
    /// service (`[route.reconcile]`), `owner` is the lookup's and `status` holds when its lease
    /// ends ([`lookup_lease`]); 0 otherwise, as in entries of earlier versions.
    Unknown = 6,
}

/// A lookup's lease end as an unknown entry's `status` holds it: whole seconds modulo 2^16, odd
/// (never 0, which says no lookup is out), so the lease runs one to three seconds past `until_ms`.
/// The entry has no other free field; a lease lasts seconds, so the wrap (18 h) cannot make a
/// lapsed lease look live for longer than one lease.
fn lookup_lease(until_ms: u64) -> u16 {
    ((until_ms / 1000 + 1) & 0xffff) as u16 | 1
}

/// Whether a lookup lease (`status` of an unknown entry) is still running at `now`.
fn lookup_out(status: u16, now: u64) -> bool {
    let left = status.wrapping_sub(((now / 1000) & 0xffff) as u16);
    status != 0 && left != 0 && left < 0x8000
}

/// How an entry is laid out, marked by its byte 17. Every version reads all three; this one
/// writes [`Layout::SlotCompletion`] for what it creates and keeps an older entry's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// 0: written before fingerprints were xxh3: `fingerprint` is SHA-256's first 16 bytes.
    Sha256,
    /// 1: an xxh3-128 fingerprint (16 bytes); in flight, `until_ms` is the lease's end.
    Xxh3,
    /// 2: xxh3-128's first 12 bytes, then the lease's end (u32, ms after `first_seen_ms`). In
    /// flight, `until_ms` bounds how long the answer is kept, so the claim may complete through
    /// its response slot alone: the slot then holds a record (kind, status, expiry, response)
    /// under the claim's owner, and readers take the entry as completed.
    SlotCompletion,
}

impl Layout {
    fn mark(self) -> u8 {
        match self {
            Layout::Sha256 => 0,
            Layout::Xxh3 => 1,
            Layout::SlotCompletion => 2,
        }
    }

    /// The part of a request's fingerprint an entry of this layout keeps.
    fn comparable(self, fp: &[u8; 16]) -> [u8; 16] {
        let mut out = *fp;
        if self == Layout::SlotCompletion {
            out[12..].fill(0);
        }
        out
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    id: [u8; 16],
    state: State,
    status: u16,
    owner: u64,
    fingerprint: [u8; 16],
    layout: Layout,
    first_seen_ms: u64,
    /// While in flight: the lease's end ([`Layout::Sha256`], [`Layout::Xxh3`]) or a bound on the
    /// answer's expiry ([`Layout::SlotCompletion`]); once completed, the expiry.
    until_ms: u64,
    /// While in flight, when the lease ends (the same as `until_ms` in the older layouts).
    lease_end_ms: u64,
}

impl Entry {
    const EMPTY: Entry = Entry {
        id: [0; 16],
        state: State::Empty,
        status: 0,
        owner: 0,
        fingerprint: [0; 16],
        layout: Layout::SlotCompletion,
        first_seen_ms: 0,
        until_ms: 0,
        lease_end_ms: 0,
    };

    fn live(&self, now: u64) -> bool {
        self.state != State::Empty && self.until_ms > now
    }

    /// In flight with its lease still running: never taken over nor evicted.
    fn leased(&self, now: u64) -> bool {
        self.state == State::InFlight && self.lease_end_ms > now
    }

    /// Whether the answer of this entry may be in its slot alone (see [`Layout::SlotCompletion`]).
    fn completes_in_slot(&self) -> bool {
        self.state == State::InFlight && self.layout == Layout::SlotCompletion
    }

    // Filled in place and appended once: a claim writes every entry of its bucket back.
    fn encode(&self, out: &mut Vec<u8>) {
        let mut b = [0u8; ENTRY_LEN];
        b[..16].copy_from_slice(&self.id);
        b[16] = self.state as u8;
        b[17] = self.layout.mark();
        b[18..20].copy_from_slice(&self.status.to_le_bytes());
        b[20..28].copy_from_slice(&self.owner.to_le_bytes());
        b[28..44].copy_from_slice(&self.fingerprint);
        if self.layout == Layout::SlotCompletion {
            let lease = self.lease_end_ms.saturating_sub(self.first_seen_ms).min(u64::from(u32::MAX)) as u32;
            b[40..44].copy_from_slice(&lease.to_le_bytes());
        }
        b[44..52].copy_from_slice(&self.first_seen_ms.to_le_bytes());
        b[52..60].copy_from_slice(&self.until_ms.to_le_bytes());
        out.extend_from_slice(&b);
    }

    fn decode(b: &[u8]) -> Entry {
        let u64_at = |i: usize| b.get(i..i + 8).and_then(|s| s.try_into().ok()).map(u64::from_le_bytes).unwrap_or(0);
        let state = match b.get(16) {
            Some(1) => State::InFlight,
            Some(2) => State::Completed,
            Some(3) => State::Tombstone,
            Some(4) => State::Issued,
            Some(5) => State::Used,
            Some(6) => State::Unknown,
            _ => State::Empty,
        };
        let layout = match b.get(17) {
            Some(1) => Layout::Xxh3,
            Some(2) => Layout::SlotCompletion,
            _ => Layout::Sha256,
        };
        let mut fingerprint: [u8; 16] = b.get(28..44).and_then(|s| s.try_into().ok()).unwrap_or([0; 16]);
        let (first_seen_ms, until_ms) = (u64_at(44), u64_at(52));
        let lease_end_ms = if layout == Layout::SlotCompletion {
            let lease = u32::from_le_bytes([fingerprint[12], fingerprint[13], fingerprint[14], fingerprint[15]]);
            fingerprint[12..].fill(0);
            first_seen_ms.saturating_add(u64::from(lease))
        } else {
            until_ms
        };
        Entry {
            id: b.get(0..16).and_then(|s| s.try_into().ok()).unwrap_or([0; 16]),
            state,
            status: b.get(18..20).and_then(|s| s.try_into().ok()).map(u16::from_le_bytes).unwrap_or(0),
            owner: u64_at(20),
            fingerprint,
            layout,
            first_seen_ms,
            until_ms,
            lease_end_ms,
        }
    }
}

/// What the secret's key holds until one VM's secret replaces it (not empty: the glue reads an
/// empty value as absent).
const SECRET_PLACEHOLDER: &[u8] = b"-";

/// Proof of ownership of one claim, needed to complete or release it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    bucket: u32,
    index: u32,
    id: [u8; 16],
    pub owner: u64,
    pub first_seen_ms: u64,
    /// The claim's first lease end, when it may complete through its slot alone (a claim of
    /// this version's layout); 0 when its completion goes through the bucket.
    slot_lease_end_ms: u64,
}

impl Ticket {
    /// What an operator names the claim's entry by (`s:<bucket>:<id>`, see [`held::store_key`]).
    pub fn store_key(&self) -> String {
        held::store_key(self.bucket, &self.id)
    }
}

pub struct SharedStore {
    buckets: u32,
    entries: u32,
    /// `idem:v1:<namespace>`: the key space of this plugin (see `SharedConfig::namespace`).
    prefix: String,
    /// Mixed into the bucket index so a client cannot compute which bucket its keys land in
    /// (and fill a victim's bucket with abandoned claims). One per Envoy process, in shared data.
    secret: [u8; 16],
}

impl SharedStore {
    /// The store of `cfg`, in the namespace `cfg.namespace` (the configuring worker fills it in
    /// with the plugin's name when the bundle names none; `default` only for tests).
    pub fn new(cfg: &SharedConfig) -> Self {
        let namespace = cfg.namespace.as_deref().unwrap_or("default");
        SharedStore {
            buckets: cfg.buckets,
            entries: cfg.entries_per_bucket,
            prefix: format!("{PREFIX}:{namespace}"),
            secret: [0; 16],
        }
    }

    // Built by hand: `format!` cost more than the rest of a claim's key handling, and these run
    // two to four times per request.
    fn bucket_key(&self, b: u32) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 14);
        key.push_str(&self.prefix);
        key.push_str(":b:");
        push_decimal(&mut key, u64::from(b));
        key
    }
    fn slot_key(&self, b: u32, i: u32) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 25);
        key.push_str(&self.prefix);
        key.push_str(":r:");
        push_decimal(&mut key, u64::from(b));
        key.push(':');
        push_decimal(&mut key, u64::from(i));
        key
    }
    /// Where the per-process bucket secret lives (see [`SharedStore::initialise`]).
    fn secret_key(&self) -> String {
        format!("{}:secret", self.prefix)
    }
    fn empty_bucket(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.entries as usize * ENTRY_LEN);
        for _ in 0..self.entries {
            Entry::EMPTY.encode(&mut v);
        }
        v
    }

    /// Where the store's shape lives: `<buckets>x<entries>`, written by the first configuration.
    fn shape_key(&self) -> String {
        format!("{}:shape", self.prefix)
    }

    /// The namespace, for messages.
    fn namespace(&self) -> &str {
        self.prefix.strip_prefix(PREFIX).and_then(|n| n.strip_prefix(':')).unwrap_or(&self.prefix)
    }

    /// Refuses a shape other than the one this namespace's store was created in. Shared-data
    /// keys cannot be deleted, so a store keeps its shape for the life of the Envoy process: a
    /// bucket rewritten in another shape loses the claims in flight, and another bucket count
    /// sends a key to another bucket, where a repeat would not find its claim. Two plugins of one
    /// namespace (or a configuration reloaded with another `[shared]` shape) must agree.
    fn check_shape(&self, host: &dyn Host) -> Result<(), StoreError> {
        let wanted = format!("{}x{}", self.buckets, self.entries);
        let found = match host.shared_get(&self.shape_key())? {
            Some((v, _)) => String::from_utf8_lossy(&v).into_owned(),
            // No record: a first configuration, or buckets an earlier version created, whose
            // entries a bucket's length tells.
            None => match host.shared_get(&self.bucket_key(0))? {
                Some((b, _)) if b.len() != self.entries as usize * ENTRY_LEN => format!("?x{}", b.len() / ENTRY_LEN),
                _ => {
                    host.shared_set(&self.shape_key(), wanted.as_bytes(), None)?;
                    return Ok(());
                }
            },
        };
        if found == wanted {
            return Ok(());
        }
        let (buckets, entries) = found.split_once('x').unwrap_or(("?", "?"));
        Err(StoreError::Host(format!(
            "namespace {} already holds a shared store of {buckets} buckets × {entries} entries in this Envoy \
             process, created by another configuration (another plugin of the same namespace, or this one before \
             its [shared] changed); this configuration asks for {} × {}. A store keeps its shape for the life of \
             the process: keep [shared] buckets and entries_per_bucket as they were, or give this configuration \
             its own [shared] namespace (it starts empty)",
            self.namespace(),
            self.buckets,
            self.entries
        )))
    }

    /// Creates every bucket that does not exist yet. Run in `on_configure`, before workers serve:
    /// creation is an unconditional insert, the one moment CAS cannot protect. A store of
    /// another shape in the namespace refuses the configuration (see `check_shape`).
    ///
    /// The bucket secret is made the same way: the first VM to configure (Envoy's main thread,
    /// before any worker) writes 16 random bytes; every VM then reads back what is stored.
    pub fn initialise(&mut self, host: &dyn Host) -> Result<u32, StoreError> {
        self.check_shape(host)?;
        self.secret = self.agreed_secret(host)?;
        let mut created = 0;
        let expected = self.entries as usize * ENTRY_LEN;
        for b in 0..self.buckets {
            let key = self.bucket_key(b);
            match host.shared_get(&key)? {
                Some((v, _)) if v.len() == expected => {}
                _ => {
                    host.shared_set(&key, &self.empty_bucket(), None)?;
                    created += 1;
                }
            }
        }
        Ok(created)
    }

    /// The namespace's secret, the same for every VM of the process: the bucket of a key depends
    /// on it, so two workers holding different secrets would put one key in two buckets and
    /// both claim it. The first VM to store one wins and the others read it back. Envoy's shared
    /// data cannot insert only if absent (a compare-and-swap is ignored for an absent key), so a
    /// placeholder is created first with a set that fails against any existing value (no value
    /// holds that version), and the secret replaces it by compare-and-swap: of VMs starting
    /// together, one swap succeeds and every VM reads its secret.
    fn agreed_secret(&self, host: &dyn Host) -> Result<[u8; 16], StoreError> {
        let key = self.secret_key();
        for _ in 0..MAX_CAS_RETRIES {
            let written = match host.shared_get(&key)? {
                Some((v, _)) if v.len() == 16 => {
                    let mut secret = [0u8; 16];
                    secret.copy_from_slice(&v);
                    return Ok(secret);
                }
                Some((_, cas)) => {
                    let mut fresh = Vec::with_capacity(16);
                    fresh.extend_from_slice(&host.random_u64()?.to_le_bytes());
                    fresh.extend_from_slice(&host.random_u64()?.to_le_bytes());
                    host.shared_set(&key, &fresh, Some(cas))
                }
                None => host.shared_set(&key, SECRET_PLACEHOLDER, Some(u32::MAX)),
            };
            match written {
                Ok(()) | Err(HostError::CasMismatch) => {}
                Err(HostError::Failed(m)) => return Err(StoreError::Host(m)),
            }
        }
        Err(StoreError::Contended)
    }

    /// This process' secret (drawn by `initialise`): also the default key tokens are signed with.
    pub fn secret(&self) -> [u8; 16] {
        self.secret
    }

    /// The bucket a key id lands in (diagnostics and tests: it depends on this process' secret).
    pub fn bucket_of(&self, id: &[u8; 32]) -> u32 {
        self.locate(id).0
    }

    fn locate(&self, id: &[u8; 32]) -> (u32, [u8; 16]) {
        let mut short = [0u8; 16];
        short.copy_from_slice(&id[..16]);
        // SipHash keyed with the secret: a PRF, so the bucket of an id is unpredictable without
        // the secret, at a tenth of a SHA-256 block's cost.
        let mut h = SipHasher13::new_with_key(&self.secret);
        h.write(id);
        let b = (h.finish() % u64::from(self.buckets)) as u32;
        (b, short)
    }

    fn read(&self, host: &dyn Host, b: u32) -> Result<(Vec<Entry>, u32), StoreError> {
        let key = self.bucket_key(b);
        let (bytes, cas) = host.shared_get(&key)?.ok_or(StoreError::Missing(key))?;
        let mut entries: Vec<Entry> = bytes.chunks_exact(ENTRY_LEN).map(Entry::decode).collect();
        entries.resize(self.entries as usize, Entry::EMPTY);
        Ok((entries, cas))
    }

    fn write(&self, host: &dyn Host, b: u32, entries: &[Entry], cas: u32) -> Result<bool, StoreError> {
        let mut v = Vec::with_capacity(entries.len() * ENTRY_LEN);
        for e in entries {
            e.encode(&mut v);
        }
        match host.shared_set(&self.bucket_key(b), &v, Some(cas)) {
            Ok(()) => Ok(true),
            Err(HostError::CasMismatch) => Ok(false),
            Err(HostError::Failed(m)) => Err(StoreError::Host(m)),
        }
    }

    /// Read → edit → write-with-CAS on bucket `b`, retried while other workers change it: the
    /// one way every operation changes a bucket.
    fn modify<T>(
        &self,
        host: &dyn Host,
        b: u32,
        mut edit: impl FnMut(&mut [Entry], u64) -> Result<Edit<T>, StoreError>,
    ) -> Result<T, StoreError> {
        for _ in 0..MAX_CAS_RETRIES {
            let now = host.now_ms();
            let (mut entries, cas) = self.read(host, b)?;
            match edit(&mut entries, now)? {
                Edit::Done(result) => return Ok(result),
                Edit::Write(result) => {
                    if self.write(host, b, &entries, cas)? {
                        return Ok(result);
                    }
                }
            }
        }
        Err(StoreError::Contended)
    }

    /// Claims `id` for a request with `fingerprint`, or reports who holds it. A claim is kept
    /// for `lock_ttl_ms` while in flight and its answer for `retain_ms` once completed.
    pub fn claim(
        &self,
        host: &dyn Host,
        id: &[u8; 32],
        fingerprint: &[u8; 32],
        lock_ttl_ms: u64,
        retain_ms: u64,
    ) -> Result<Claim<Ticket>, StoreError> {
        let (b, short) = self.locate(id);
        let mut fp = [0u8; 16];
        fp.copy_from_slice(&fingerprint[..16]);
        let owner = host.random_u64()?;
        self.modify(host, b, |entries, now| {
            let mut same_key = None;
            for (i, e) in entries.iter().enumerate() {
                if e.id != short || e.state == State::Empty {
                    continue;
                }
                same_key = same_key.or(Some(i));
                let (seen, response) = self.settled(host, b, i, e)?;
                if seen.live(now) {
                    // A slot being rewritten answers as in flight, never with wrong data.
                    let found = self.found(host, b, i, &seen, &fp, response)?.unwrap_or(Claim::InFlight {
                        first_seen_ms: seen.first_seen_ms,
                        lease_ends_ms: now + 1000,
                        payload: Payload::of(&seen.fingerprint, seen.layout == Layout::Sha256, &fp),
                    });
                    return Ok(Edit::Done(found));
                }
            }
            // A takeover reuses the position of the expired claim for the same key, so the old
            // owner's late completion finds another owner there and is fenced off.
            let i = match same_key {
                Some(i) => i,
                None => match self.victim(host, b, entries, now)? {
                    Some(i) => i,
                    None => return Err(self.full(host, b, entries, now)),
                },
            };
            let lease_end_ms = now.saturating_add(lock_ttl_ms);
            entries[i] = Entry {
                id: short,
                state: State::InFlight,
                status: 0,
                owner,
                fingerprint: Layout::SlotCompletion.comparable(&fp),
                layout: Layout::SlotCompletion,
                first_seen_ms: now,
                until_ms: lease_end_ms.saturating_add(retain_ms),
                lease_end_ms,
            };
            Ok(Edit::Write(Claim::Claimed(Ticket {
                bucket: b,
                index: i as u32,
                id: short,
                owner,
                first_seen_ms: now,
                slot_lease_end_ms: lease_end_ms,
            })))
        })
    }

    /// Entry `e` (position `i` of bucket `b`) as readers take it: a claim that completed
    /// through its slot alone reads as completed (expiring when its record says), with the
    /// response read on the way; one still in flight lives until its lease ends.
    fn settled(
        &self,
        host: &dyn Host,
        b: u32,
        i: usize,
        e: &Entry,
    ) -> Result<(Entry, Option<StoredResponse>), StoreError> {
        if !e.completes_in_slot() {
            return Ok((*e, None));
        }
        let Some((bytes, _)) = host.shared_get(&self.slot_key(b, i as u32))? else {
            return Ok((Entry { until_ms: e.lease_end_ms, ..*e }, None));
        };
        match SlotRecord::read(&bytes, e.owner) {
            Some(SlotRecord { kind, status, expires_ms, response }) => {
                let state = if kind == SLOT_ANSWER { State::Completed } else { State::Tombstone };
                Ok((Entry { state, status, until_ms: expires_ms, ..*e }, response))
            }
            None => Ok((Entry { until_ms: e.lease_end_ms, ..*e }, None)),
        }
    }

    /// What a live entry of position `i` in bucket `b` says to a request with fingerprint `fp`;
    /// `None` when its response slot is being rewritten. `response`: the answer, when already read.
    fn found(
        &self,
        host: &dyn Host,
        b: u32,
        i: usize,
        e: &Entry,
        fp: &[u8; 16],
        response: Option<StoredResponse>,
    ) -> Result<Option<Claim<Ticket>>, StoreError> {
        let payload = Payload::of(&e.fingerprint, e.layout == Layout::Sha256, &e.layout.comparable(fp));
        let first_seen_ms = e.first_seen_ms;
        Ok(Some(match e.state {
            State::InFlight => Claim::InFlight { first_seen_ms, lease_ends_ms: e.lease_end_ms, payload },
            State::Unknown if lookup_out(e.status, host.now_ms()) => {
                Claim::InFlight { first_seen_ms, lease_ends_ms: host.now_ms().saturating_add(1000), payload }
            }
            State::Unknown => Claim::Unknown {
                first_seen_ms,
                held_until_ms: e.until_ms,
                payload,
                held: Some(Ticket {
                    bucket: b,
                    index: i as u32,
                    id: e.id,
                    owner: e.owner,
                    first_seen_ms,
                    slot_lease_end_ms: 0,
                }),
            },
            State::Tombstone | State::Issued | State::Used => {
                Claim::Completed { first_seen_ms, status: e.status, response: None, payload }
            }
            _ => match response.map_or_else(|| self.load_response(host, b, i as u32, e), |r| Ok(Some(r)))? {
                Some(r) => Claim::Completed { first_seen_ms, status: e.status, response: Some(r), payload },
                None => return Ok(None),
            },
        }))
    }

    /// What this process holds for `id` (read only, nothing claimed): `None` when nothing live,
    /// or when a response slot is being rewritten. The Redis routes' local view (see
    /// [`SharedStore::remember`]).
    pub fn lookup(
        &self,
        host: &dyn Host,
        id: &[u8; 32],
        fingerprint: &[u8; 32],
    ) -> Result<Option<Claim<()>>, StoreError> {
        let (b, short) = self.locate(id);
        let mut fp = [0u8; 16];
        fp.copy_from_slice(&fingerprint[..16]);
        let now = host.now_ms();
        let (entries, _) = self.read(host, b)?;
        for (i, e) in entries.iter().enumerate() {
            if e.id != short || e.state == State::Empty {
                continue;
            }
            let (seen, response) = self.settled(host, b, i, e)?;
            if seen.live(now) {
                return Ok(self.found(host, b, i, &seen, &fp, response)?.map(|c| c.map(|_| ())));
            }
        }
        Ok(None)
    }

    /// Records a completed answer for `id` until `until_ms`, whoever held the position before
    /// (the same key's entry, else an expired or the oldest completed one): a copy of what a
    /// remote store holds, so repeats of it are answered without asking that store.
    pub fn remember(&self, host: &dyn Host, id: &[u8; 32], answer: &Answer, until_ms: u64) -> Result<bool, StoreError> {
        let response = answer.response;
        let (b, short) = self.locate(id);
        let owner = host.random_u64()?;
        let mut slot_written = None;
        self.modify(host, b, |entries, now| {
            let same_key = entries.iter().position(|e| e.id == short && e.state != State::Empty);
            let i = match same_key {
                Some(i) => Some(i),
                None => self.victim(host, b, entries, now)?,
            };
            let Some(i) = i else {
                return Ok(Edit::Done(false));
            };
            if let Some(r) = response {
                // The slot goes first, under our owner id: a reader of the old entry sees an
                // owner mismatch and ignores it.
                if slot_written != Some(i) {
                    self.write_slot(host, b, i as u32, Layout::SlotCompletion, owner, SLOT_ANSWER, until_ms, r)?;
                    slot_written = Some(i);
                }
            }
            entries[i] = Entry {
                id: short,
                state: if response.is_some() { State::Completed } else { State::Tombstone },
                status: answer.status,
                owner,
                fingerprint: Layout::SlotCompletion.comparable(&answer.fingerprint),
                layout: Layout::SlotCompletion,
                first_seen_ms: answer.first_seen_ms,
                until_ms,
                lease_end_ms: 0,
            };
            Ok(Edit::Write(true))
        })
    }

    /// Records a freshly issued token (its scoped id) valid for `ttl_ms`.
    pub fn issue_token(&self, host: &dyn Host, id: &[u8; 32], ttl_ms: u64) -> Result<(), StoreError> {
        let (b, short) = self.locate(id);
        self.modify(host, b, |entries, now| {
            let Some(i) = self.victim(host, b, entries, now)? else {
                return Err(self.full(host, b, entries, now));
            };
            entries[i] = Entry {
                id: short,
                state: State::Issued,
                status: 0,
                owner: 0,
                fingerprint: [0; 16],
                layout: Layout::SlotCompletion,
                first_seen_ms: now,
                until_ms: now.saturating_add(ttl_ms),
                lease_end_ms: 0,
            };
            Ok(Edit::Write(()))
        })
    }

    /// Uses a token atomically: of any number of concurrent presentations, one consumes it.
    pub fn use_token(&self, host: &dyn Host, id: &[u8; 32]) -> Result<TokenUse<Ticket>, StoreError> {
        let (b, short) = self.locate(id);
        let owner = host.random_u64()?;
        self.modify(host, b, |entries, now| {
            let Some(i) = entries.iter().position(|e| e.id == short && e.live(now)) else {
                return Ok(Edit::Done(TokenUse::Unknown));
            };
            match entries[i].state {
                State::Issued => {}
                State::Used => return Ok(Edit::Done(TokenUse::Used { used_at_ms: entries[i].first_seen_ms })),
                _ => return Ok(Edit::Done(TokenUse::Unknown)),
            }
            entries[i].state = State::Used;
            entries[i].owner = owner;
            entries[i].first_seen_ms = now;
            Ok(Edit::Write(TokenUse::Consumed(Ticket {
                bucket: b,
                index: i as u32,
                id: short,
                owner,
                first_seen_ms: now,
                slot_lease_end_ms: 0,
            })))
        })
    }

    /// Puts a used token back (its remaining TTL unchanged), if this ticket still holds it.
    pub fn restore_token(&self, host: &dyn Host, t: &Ticket) -> Result<bool, StoreError> {
        self.update_entry(host, t, State::Used, |e, _| {
            e.state = State::Issued;
            e.owner = 0;
        })
    }

    /// The answer in the response slot of entry `e` at position `i` of bucket `b`: `None` when
    /// the slot holds another owner's (being rewritten) or nothing readable.
    fn load_response(&self, host: &dyn Host, b: u32, i: u32, e: &Entry) -> Result<Option<StoredResponse>, StoreError> {
        let Some((bytes, _)) = host.shared_get(&self.slot_key(b, i))? else {
            return Ok(None);
        };
        if e.layout == Layout::SlotCompletion {
            return Ok(SlotRecord::read(&bytes, e.owner).and_then(|r| r.response));
        }
        // Older layouts: the owner, then the response.
        if bytes.len() < 8 || bytes[..8] != e.owner.to_le_bytes() {
            return Ok(None);
        }
        Ok(StoredResponse::decode(&bytes[8..]))
    }

    /// Writes the response slot of position `i` in bucket `b` as an entry of `layout` owned by
    /// `owner` reads it: in this version's layout `kind` (answer or tombstone), status, expiry,
    /// then the response; in the older ones the response alone (never a tombstone).
    #[allow(clippy::too_many_arguments)]
    fn write_slot(
        &self,
        host: &dyn Host,
        b: u32,
        i: u32,
        layout: Layout,
        owner: u64,
        kind: u8,
        expires_ms: u64,
        response: &StoredResponse,
    ) -> Result<(), StoreError> {
        let body = if kind == SLOT_ANSWER { response.encoded_len() } else { 0 };
        let mut v = Vec::with_capacity(SLOT_RECORD_HEADER + body);
        v.extend_from_slice(&owner.to_le_bytes());
        if layout == Layout::SlotCompletion {
            v.extend_from_slice(&SLOT_RECORD_MARK);
            v.push(kind);
            v.extend_from_slice(&response.status.to_le_bytes());
            v.extend_from_slice(&expires_ms.to_le_bytes());
        }
        if kind == SLOT_ANSWER {
            response.encode_into(&mut v);
        }
        Ok(host.shared_set(&self.slot_key(b, i), &v, None)?)
    }

    /// Records the outcome of a claim: the response (or a tombstone when it does not fit in
    /// `max_response_bytes`), remembered for `ttl_ms`. Fenced by the ticket's owner: while the
    /// claim's lease has [`SLOT_COMPLETION_MARGIN_MS`] left nobody can have taken it over, and
    /// the answer is written to its slot alone (one shared-data write, the bucket untouched);
    /// later, through the bucket, checked against the owner there. A ticket is finished once
    /// (complete, release or hold): a released ticket completed later could overwrite the slot
    /// of the claim that came after it.
    pub fn complete(
        &self,
        host: &dyn Host,
        t: &Ticket,
        response: &StoredResponse,
        max_response_bytes: usize,
        ttl_ms: u64,
    ) -> Result<Completion, StoreError> {
        let now = host.now_ms();
        if now.saturating_add(SLOT_COMPLETION_MARGIN_MS) < t.slot_lease_end_ms {
            let (kind, done) = if response.encoded_len() > max_response_bytes {
                (SLOT_TOMBSTONE, Completion::Tombstoned)
            } else {
                (SLOT_ANSWER, Completion::Stored)
            };
            let expires_ms = now.saturating_add(ttl_ms);
            self.write_slot(host, t.bucket, t.index, Layout::SlotCompletion, t.owner, kind, expires_ms, response)?;
            return Ok(done);
        }
        self.settle(host, t, State::InFlight, response, max_response_bytes, ttl_ms)
    }

    /// Writes `response` as the answer of the ticket's entry if the ticket still holds it in
    /// `state` (a claim in flight, or an unknown outcome under a lookup).
    fn settle(
        &self,
        host: &dyn Host,
        t: &Ticket,
        state: State,
        response: &StoredResponse,
        max_response_bytes: usize,
        ttl_ms: u64,
    ) -> Result<Completion, StoreError> {
        let tombstone = response.encoded_len() > max_response_bytes;
        let (written, done) =
            if tombstone { (State::Tombstone, Completion::Tombstoned) } else { (State::Completed, Completion::Stored) };
        let mut slot_written = false;
        self.modify(host, t.bucket, |entries, now| {
            // Ownership is checked before the slot is written, so a late writer never clobbers
            // a new owner's slot.
            if !owns(entries, t, state) {
                return Ok(Edit::Done(Completion::LostOwnership));
            }
            let e = &mut entries[t.index as usize];
            if !tombstone && !slot_written {
                let expires_ms = now.saturating_add(ttl_ms);
                self.write_slot(host, t.bucket, t.index, e.layout, t.owner, SLOT_ANSWER, expires_ms, response)?;
                slot_written = true;
            }
            e.state = written;
            e.status = response.status;
            e.until_ms = now.saturating_add(ttl_ms);
            Ok(Edit::Write(done))
        })
    }

    /// Frees a claim whose first attempt definitely failed, so a retry can run. Fenced.
    pub fn release(&self, host: &dyn Host, t: &Ticket) -> Result<bool, StoreError> {
        self.update_entry(host, t, State::InFlight, |e, _| *e = Entry::EMPTY)
    }

    /// Extends the lease of a claim whose request is still waiting for the upstream. Fenced.
    pub fn renew(&self, host: &dyn Host, t: &Ticket, lease_ms: u64) -> Result<bool, StoreError> {
        self.update_entry(host, t, State::InFlight, |e, now| {
            let end = now.saturating_add(lease_ms);
            if e.layout == Layout::SlotCompletion {
                // The bound on the answer's expiry moves with the lease.
                e.until_ms = e.until_ms.saturating_add(end.saturating_sub(e.lease_end_ms));
            } else {
                e.until_ms = end;
            }
            e.lease_end_ms = end;
        })
    }

    /// Marks a claim whose outcome is unknown: held for `hold_ms`, never taken over. Fenced.
    pub fn hold_unknown(&self, host: &dyn Host, t: &Ticket, hold_ms: u64) -> Result<bool, StoreError> {
        self.update_entry(host, t, State::InFlight, |e, now| {
            e.state = State::Unknown;
            e.until_ms = now.saturating_add(hold_ms);
        })
    }

    /// Takes the lookup of an unknown outcome (`held`, as a claim found it): of the repeats that
    /// meet it, one asks the service while the others wait. `None` when another lookup runs or
    /// the entry changed.
    pub fn take_lookup(&self, host: &dyn Host, held: &Ticket, lease_ms: u64) -> Result<Option<Ticket>, StoreError> {
        let owner = host.random_u64()?;
        self.modify(host, held.bucket, |entries, now| {
            let free = entries.get(held.index as usize).is_some_and(|e| {
                e.id == held.id && e.owner == held.owner && e.state == State::Unknown && !lookup_out(e.status, now)
            });
            if !free {
                return Ok(Edit::Done(None));
            }
            let e = &mut entries[held.index as usize];
            e.owner = owner;
            e.status = lookup_lease(now.saturating_add(lease_ms));
            Ok(Edit::Write(Some(Ticket { owner, ..*held })))
        })
    }

    /// The lookup says the first attempt ran: `response` becomes the key's answer. Fenced by the
    /// lookup's ticket.
    pub fn lookup_ran(
        &self,
        host: &dyn Host,
        t: &Ticket,
        response: &StoredResponse,
        max_response_bytes: usize,
        ttl_ms: u64,
    ) -> Result<Completion, StoreError> {
        self.settle(host, t, State::Unknown, response, max_response_bytes, ttl_ms)
    }

    /// The lookup says the first attempt did not run: the entry becomes the lookup's own claim
    /// (the repeat runs as the first request); the ticket returned completes or releases it.
    pub fn lookup_absent(&self, host: &dyn Host, t: &Ticket, lock_ttl_ms: u64) -> Result<Option<Ticket>, StoreError> {
        let first_seen_ms = std::cell::Cell::new(0);
        let taken = self.update_entry(host, t, State::Unknown, |e, now| {
            e.state = State::InFlight;
            e.status = 0;
            e.first_seen_ms = now;
            e.until_ms = now.saturating_add(lock_ttl_ms);
            // Its completion goes through the bucket (the ticket carries no slot lease), so the
            // entry lives exactly as long as its lease.
            e.lease_end_ms = e.until_ms;
            first_seen_ms.set(now);
        })?;
        Ok(taken.then_some(Ticket { first_seen_ms: first_seen_ms.get(), ..*t }))
    }

    /// The lookup failed (no answer, or one that says neither): the outcome stays unknown and
    /// the next repeat may ask again.
    pub fn lookup_failed(&self, host: &dyn Host, t: &Ticket) -> Result<bool, StoreError> {
        self.update_entry(host, t, State::Unknown, |e, _| e.status = 0)
    }

    /// The position a new claim or token takes in bucket `b`: an empty or expired entry, else
    /// the oldest completed one (or token, or claim past its lease). An in-flight entry inside
    /// its lease is never evicted; when nothing else is left, the oldest of those that completed
    /// through their slot is (its slot read to know: a bucket turned over faster than the lease).
    fn victim(&self, host: &dyn Host, b: u32, entries: &[Entry], now: u64) -> Result<Option<usize>, StoreError> {
        if let Some(i) = entries.iter().position(|e| !e.live(now)) {
            return Ok(Some(i));
        }
        let oldest_unleased =
            entries.iter().enumerate().filter(|(_, e)| !e.leased(now)).min_by_key(|(_, e)| e.first_seen_ms);
        if let Some((i, _)) = oldest_unleased {
            return Ok(Some(i));
        }
        let mut in_slot: Vec<usize> = (0..entries.len()).filter(|&i| entries[i].completes_in_slot()).collect();
        in_slot.sort_by_key(|&i| entries[i].first_seen_ms);
        for i in in_slot {
            if self.settled(host, b, i, &entries[i])?.0.state != State::InFlight {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// [`StoreError::Full`], with a census of the bucket logged: a full bucket is rare (a store
    /// sized below its peak, or keys aimed at it), and what fills it — claims inside their lease,
    /// slots that do not read as completed, held outcomes — tells which.
    fn full(&self, host: &dyn Host, b: u32, entries: &[Entry], now: u64) -> StoreError {
        let (mut leased, mut in_slot, mut unknown, mut other) = (0, 0, 0, 0);
        for e in entries {
            match e.state {
                State::InFlight if e.completes_in_slot() => in_slot += 1,
                State::InFlight if e.leased(now) => leased += 1,
                State::Unknown => unknown += 1,
                _ => other += 1,
            }
        }
        host.log(
            crate::host::Level::Warn,
            &format!(
                "idem: shared store bucket {b} full ({} entries): {in_slot} claims whose slot holds no answer \
                 yet, {leased} claims inside their lease, {unknown} unknown outcomes held, {other} other live \
                 entries",
                entries.len()
            ),
        );
        StoreError::Full
    }

    /// Rewrites every entry (and its slot) as an earlier version wrote it: the layout mark
    /// `mark` (0: SHA-256, 1: xxh3), the whole 16-byte `fingerprint`, in flight until its lease
    /// ends or completed with the bare response after the owner in the slot. For upgrade tests.
    #[cfg(any(test, feature = "fake-host"))]
    pub fn rewrite_as_earlier_version(&self, host: &dyn Host, mark: u8, fingerprint: [u8; 16]) {
        let layout = if mark == 0 { Layout::Sha256 } else { Layout::Xxh3 };
        for b in 0..self.buckets {
            let Ok((mut entries, _)) = self.read(host, b) else { continue };
            for (i, entry) in entries.iter_mut().enumerate() {
                if entry.state == State::Empty {
                    continue;
                }
                let (seen, loaded) = self.settled(host, b, i, entry).unwrap_or((*entry, None));
                let response = loaded.or_else(|| self.load_response(host, b, i as u32, &seen).ok().flatten());
                *entry = Entry { fingerprint, layout, ..seen };
                if let (Some(r), State::Completed) = (response, seen.state) {
                    let _ = self.write_slot(host, b, i as u32, layout, seen.owner, SLOT_ANSWER, seen.until_ms, &r);
                }
            }
            let mut v = Vec::new();
            for e in &entries {
                e.encode(&mut v);
            }
            let _ = host.shared_set(&self.bucket_key(b), &v, None);
        }
    }

    /// Applies `f` to the ticket's entry if the ticket still holds it in `state`; `false` if not.
    fn update_entry(
        &self,
        host: &dyn Host,
        t: &Ticket,
        state: State,
        f: impl Fn(&mut Entry, u64),
    ) -> Result<bool, StoreError> {
        self.modify(host, t.bucket, |entries, now| {
            if !owns(entries, t, state) {
                return Ok(Edit::Done(false));
            }
            f(&mut entries[t.index as usize], now);
            Ok(Edit::Write(true))
        })
    }
}

/// A response slot as the owner of a [`Layout::SlotCompletion`] entry writes it.
struct SlotRecord {
    kind: u8,
    status: u16,
    expires_ms: u64,
    /// `None` for a tombstone (status only).
    response: Option<StoredResponse>,
}

impl SlotRecord {
    /// The record in `bytes` if `owner` wrote it and it reads whole.
    fn read(bytes: &[u8], owner: u64) -> Option<SlotRecord> {
        if bytes.get(..8)? != owner.to_le_bytes() {
            return None;
        }
        if bytes.get(8..16)? != SLOT_RECORD_MARK {
            return None;
        }
        let kind = *bytes.get(16)?;
        let status = u16::from_le_bytes(bytes.get(17..19)?.try_into().ok()?);
        let expires_ms = u64::from_le_bytes(bytes.get(19..SLOT_RECORD_HEADER)?.try_into().ok()?);
        let response = match kind {
            SLOT_ANSWER => Some(StoredResponse::decode(bytes.get(SLOT_RECORD_HEADER..)?)?),
            SLOT_TOMBSTONE => None,
            _ => return None,
        };
        Some(SlotRecord { kind, status, expires_ms, response })
    }
}

/// What one attempt at changing a bucket decided.
enum Edit<T> {
    /// Write the edited entries; once the write succeeds, the result is `T`.
    Write(T),
    /// Nothing to write: the result is `T`.
    Done(T),
}

fn owns(entries: &[Entry], t: &Ticket, state: State) -> bool {
    entries.get(t.index as usize).is_some_and(|e| e.id == t.id && e.owner == t.owner && e.state == state)
}
