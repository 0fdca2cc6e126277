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

use super::{Answer, Claim, Completion, Payload, StoreError, TokenUse};
use crate::host::{Host, HostError};
use crate::policy::SharedConfig;
use crate::response::StoredResponse;
use siphasher::sip::SipHasher13;
use std::hash::Hasher;

/// Every shared-data key starts with this, then the plugin's namespace.
pub(crate) const PREFIX: &str = "idem:v1";
const ENTRY_LEN: usize = 60;
/// An entry's byte 17 when its fingerprint is xxh3-128 (0, in entries of earlier versions: SHA-256).
const DIGEST_XXH3: u8 = 1;
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    id: [u8; 16],
    state: State,
    status: u16,
    owner: u64,
    fingerprint: [u8; 16],
    /// Whether `fingerprint` is SHA-256 (an entry written before fingerprints were xxh3-128).
    legacy_digest: bool,
    first_seen_ms: u64,
    /// Lease end while in flight; expiry once completed.
    until_ms: u64,
}

impl Entry {
    const EMPTY: Entry = Entry {
        id: [0; 16],
        state: State::Empty,
        status: 0,
        owner: 0,
        fingerprint: [0; 16],
        legacy_digest: false,
        first_seen_ms: 0,
        until_ms: 0,
    };

    fn live(&self, now: u64) -> bool {
        self.state != State::Empty && self.until_ms > now
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id);
        out.push(self.state as u8);
        // Byte 17: the fingerprint's digest. Entries of earlier versions hold 0 here (SHA-256).
        out.push(if self.legacy_digest { 0 } else { DIGEST_XXH3 });
        out.extend_from_slice(&self.status.to_le_bytes());
        out.extend_from_slice(&self.owner.to_le_bytes());
        out.extend_from_slice(&self.fingerprint);
        out.extend_from_slice(&self.first_seen_ms.to_le_bytes());
        out.extend_from_slice(&self.until_ms.to_le_bytes());
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
        Entry {
            id: b.get(0..16).and_then(|s| s.try_into().ok()).unwrap_or([0; 16]),
            state,
            status: b.get(18..20).and_then(|s| s.try_into().ok()).map(u16::from_le_bytes).unwrap_or(0),
            owner: u64_at(20),
            fingerprint: b.get(28..44).and_then(|s| s.try_into().ok()).unwrap_or([0; 16]),
            legacy_digest: b.get(17) != Some(&DIGEST_XXH3),
            first_seen_ms: u64_at(44),
            until_ms: u64_at(52),
        }
    }
}

/// Appends `n` in decimal, as `{n}` formats it.
fn push_decimal(out: &mut String, n: u32) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut rest = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        out.push(char::from(d));
    }
}

/// Proof of ownership of one claim, needed to complete or release it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    bucket: u32,
    index: u32,
    id: [u8; 16],
    pub owner: u64,
    pub first_seen_ms: u64,
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
        push_decimal(&mut key, b);
        key
    }
    fn slot_key(&self, b: u32, i: u32) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 25);
        key.push_str(&self.prefix);
        key.push_str(":r:");
        push_decimal(&mut key, b);
        key.push(':');
        push_decimal(&mut key, i);
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

    /// Creates every bucket that does not exist yet. Run in `on_configure`, before workers serve:
    /// creation is an unconditional insert, the one moment CAS cannot protect.
    /// A bucket of another shape (capacity changed) is reset.
    ///
    /// The bucket secret is made the same way: the first VM to configure (Envoy's main thread,
    /// before any worker) writes 16 random bytes; every VM then reads back what is stored.
    pub fn initialise(&mut self, host: &dyn Host) -> Result<u32, StoreError> {
        let secret_key = self.secret_key();
        if !matches!(host.shared_get(&secret_key)?, Some((v, _)) if v.len() == 16) {
            let mut fresh = Vec::with_capacity(16);
            fresh.extend_from_slice(&host.random_u64()?.to_le_bytes());
            fresh.extend_from_slice(&host.random_u64()?.to_le_bytes());
            host.shared_set(&secret_key, &fresh, None)?;
        }
        match host.shared_get(&secret_key)? {
            Some((v, _)) if v.len() == 16 => self.secret.copy_from_slice(&v),
            _ => return Err(StoreError::Missing(secret_key)),
        }
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

    /// Claims `id` for a request with `fingerprint`, or reports who holds it.
    pub fn claim(
        &self,
        host: &dyn Host,
        id: &[u8; 32],
        fingerprint: &[u8; 32],
        lock_ttl_ms: u64,
    ) -> Result<Claim<Ticket>, StoreError> {
        let (b, short) = self.locate(id);
        let mut fp = [0u8; 16];
        fp.copy_from_slice(&fingerprint[..16]);
        let owner = host.random_u64()?;
        self.modify(host, b, |entries, now| {
            if let Some(i) = entries.iter().position(|e| e.id == short && e.live(now)) {
                let e = entries[i];
                // A slot being rewritten answers as in flight, never with wrong data.
                let found = self.found(host, b, i, &e, &fp)?.unwrap_or(Claim::InFlight {
                    first_seen_ms: e.first_seen_ms,
                    lease_ends_ms: now + 1000,
                    payload: Payload::of(&e.fingerprint, e.legacy_digest, &fp),
                });
                return Ok(Edit::Done(found));
            }
            // A takeover reuses the position of the expired claim for the same key, so the old
            // owner's late completion finds another owner there and is fenced off.
            let same_key = entries.iter().position(|e| e.id == short && e.state != State::Empty);
            let i = same_key.or_else(|| victim(entries, now)).ok_or(StoreError::Full)?;
            entries[i] = Entry {
                id: short,
                state: State::InFlight,
                status: 0,
                owner,
                fingerprint: fp,
                legacy_digest: false,
                first_seen_ms: now,
                until_ms: now.saturating_add(lock_ttl_ms),
            };
            Ok(Edit::Write(Claim::Claimed(Ticket { bucket: b, index: i as u32, id: short, owner, first_seen_ms: now })))
        })
    }

    /// What a live entry of position `i` in bucket `b` says to a request with fingerprint `fp`;
    /// `None` when its response slot is being rewritten.
    fn found(
        &self,
        host: &dyn Host,
        b: u32,
        i: usize,
        e: &Entry,
        fp: &[u8; 16],
    ) -> Result<Option<Claim<Ticket>>, StoreError> {
        let payload = Payload::of(&e.fingerprint, e.legacy_digest, fp);
        let first_seen_ms = e.first_seen_ms;
        Ok(Some(match e.state {
            State::InFlight => Claim::InFlight { first_seen_ms, lease_ends_ms: e.until_ms, payload },
            State::Unknown if lookup_out(e.status, host.now_ms()) => {
                Claim::InFlight { first_seen_ms, lease_ends_ms: host.now_ms().saturating_add(1000), payload }
            }
            State::Unknown => Claim::Unknown {
                first_seen_ms,
                held_until_ms: e.until_ms,
                payload,
                held: Some(Ticket { bucket: b, index: i as u32, id: e.id, owner: e.owner, first_seen_ms }),
            },
            State::Tombstone | State::Issued | State::Used => {
                Claim::Completed { first_seen_ms, status: e.status, response: None, payload }
            }
            _ => match self.load_response(host, b, i as u32, e.owner)? {
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
        match entries.iter().position(|e| e.id == short && e.live(now)) {
            Some(i) => Ok(self.found(host, b, i, &entries[i], &fp)?.map(|c| c.map(|_| ()))),
            None => Ok(None),
        }
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
            let Some(i) = same_key.or_else(|| victim(entries, now)) else {
                return Ok(Edit::Done(false));
            };
            if let Some(r) = response {
                // The slot goes first, under our owner id: a reader of the old entry sees an
                // owner mismatch and ignores it.
                if slot_written != Some(i) {
                    let mut v = Vec::with_capacity(8 + r.encoded_len());
                    v.extend_from_slice(&owner.to_le_bytes());
                    r.encode_into(&mut v);
                    host.shared_set(&self.slot_key(b, i as u32), &v, None)?;
                    slot_written = Some(i);
                }
            }
            entries[i] = Entry {
                id: short,
                state: if response.is_some() { State::Completed } else { State::Tombstone },
                status: answer.status,
                owner,
                fingerprint: answer.fingerprint,
                legacy_digest: false,
                first_seen_ms: answer.first_seen_ms,
                until_ms,
            };
            Ok(Edit::Write(true))
        })
    }

    /// Records a freshly issued token (its scoped id) valid for `ttl_ms`.
    pub fn issue_token(&self, host: &dyn Host, id: &[u8; 32], ttl_ms: u64) -> Result<(), StoreError> {
        let (b, short) = self.locate(id);
        self.modify(host, b, |entries, now| {
            let i = victim(entries, now).ok_or(StoreError::Full)?;
            entries[i] = Entry {
                id: short,
                state: State::Issued,
                status: 0,
                owner: 0,
                fingerprint: [0; 16],
                legacy_digest: false,
                first_seen_ms: now,
                until_ms: now.saturating_add(ttl_ms),
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

    fn load_response(&self, host: &dyn Host, b: u32, i: u32, owner: u64) -> Result<Option<StoredResponse>, StoreError> {
        let Some((bytes, _)) = host.shared_get(&self.slot_key(b, i))? else {
            return Ok(None);
        };
        if bytes.len() < 8 || bytes[..8] != owner.to_le_bytes() {
            return Ok(None);
        }
        Ok(StoredResponse::decode(&bytes[8..]))
    }

    /// Records the outcome of a claim: the response (or a tombstone when it does not fit in
    /// `max_response_bytes`), remembered for `ttl_ms`. Fenced by the ticket's owner.
    pub fn complete(
        &self,
        host: &dyn Host,
        t: &Ticket,
        response: &StoredResponse,
        max_response_bytes: usize,
        ttl_ms: u64,
    ) -> Result<Completion, StoreError> {
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
            if !tombstone && !slot_written {
                let mut v = Vec::with_capacity(8 + response.encoded_len());
                v.extend_from_slice(&t.owner.to_le_bytes());
                response.encode_into(&mut v);
                host.shared_set(&self.slot_key(t.bucket, t.index), &v, None)?;
                slot_written = true;
            }
            let e = &mut entries[t.index as usize];
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
        self.update_entry(host, t, State::InFlight, |e, now| e.until_ms = now.saturating_add(lease_ms))
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
            first_seen_ms.set(now);
        })?;
        Ok(taken.then_some(Ticket { first_seen_ms: first_seen_ms.get(), ..*t }))
    }

    /// The lookup failed (no answer, or one that says neither): the outcome stays unknown and
    /// the next repeat may ask again.
    pub fn lookup_failed(&self, host: &dyn Host, t: &Ticket) -> Result<bool, StoreError> {
        self.update_entry(host, t, State::Unknown, |e, _| e.status = 0)
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

/// The position a new claim or token takes: an empty or expired entry, else the oldest completed
/// one (or token). An in-flight entry inside its lease is never evicted.
fn victim(entries: &[Entry], now: u64) -> Option<usize> {
    if let Some(i) = entries.iter().position(|e| !e.live(now)) {
        return Some(i);
    }
    entries
        .iter()
        .enumerate()
        .filter(|(_, e)| !matches!(e.state, State::InFlight))
        .min_by_key(|(_, e)| e.first_seen_ms)
        .map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::push_decimal;

    #[test]
    fn keys_number_their_buckets_as_format_does() {
        for n in [0, 7, 10, 99, 4095, 1_000_000, u32::MAX] {
            let mut out = String::from("b:");
            push_decimal(&mut out, n);
            assert_eq!(out, format!("b:{n}"));
        }
    }
}
