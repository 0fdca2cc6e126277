//! The Redis store, spoken through Webdis (upstream Envoy gives Wasm no Redis client).
//!
//! This module only builds Webdis requests and reads its replies; the glue carries them with
//! `dispatch_http_call`. The protocol:
//!
//! | operation | Redis command | round trips |
//! |---|---|---|
//! | claim | `SET k <in-flight record> NX PX <lock_ttl> GET` (Redis ≥ 7): nil = claimed, else the record | 1 |
//! | complete | `EVAL`: if `GET k` is our in-flight record or nothing, `SET k <completed record> PX <ttl>`; if that `SET` fails, `PEXPIRE` our record (lease kept while the write is retried) | 1 |
//! | hold unknown | `EVAL`: if `GET k` is our in-flight record or nothing, `SET k <unknown record> PX <hold>` | 1 |
//! | release | `EVAL`: if `GET k` is still our in-flight record, `DEL k`; says whether the key was ours, someone else's or absent | 1 |
//! | renew lease | `EVAL`: if `GET k` is still our in-flight record, `PEXPIRE k <lock_ttl>` | 1 |
//! | issue token | `SET t <issued record> PX <ttl>` | 1 |
//! | use token | `EVAL`: `GET t`; if issued, `SET t <used record> KEEPTTL`; return the old value | 1 |
//! | restore token | `EVAL`: if `GET t` is our used record, `SET t <issued record> KEEPTTL` | 1 |
//! | batch (group commit) | `EVAL` of [`BATCH`]: several completions, releases and restores, each with its own owner check and reply | 1 for all |
//!
//! Fencing compares the whole in-flight record, which carries a random owner id, so a request
//! whose lease expired (the key's `PX` ran out and another request claimed it) can never
//! overwrite or delete the new owner's record. An empty key is written too: the lease ran out
//! and nobody took over, and the answer in hand must not be thrown away (a retry would run the
//! business again). Writing the same final record twice returns 1, so a retried write whose
//! first reply was lost is not mistaken for a lost lease. Records are ASCII (responses base64-encoded)
//! because Webdis' JSON replies are not binary-safe. Webdis answers HTTP 200 even for Redis
//! errors (`[false, "ERR …"]`): those are store errors too.

use super::operator::HeldNote;
use super::text::{push_decimal, push_hex};
use super::{Claim, Payload, StoreError, TokenUse};
use crate::policy::{percent_encode_into, RedisConfig};
use crate::response::StoredResponse;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use std::sync::OnceLock;

/// A Webdis call: `POST /` with `body` (`CMD/arg/arg…`, each argument percent-encoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// The Redis command name, which is also the key of Webdis' JSON reply.
    pub name: &'static str,
    pub body: String,
    /// A fenced write (complete, hold unknown, release, restore token) as one step of a batch.
    pub step: Option<Step>,
}

/// One fenced write as a step of [`BATCH`]: the script's letter, its key and its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    op: &'static str,
    pub key: String,
    args: Vec<String>,
}

impl Command {
    fn plain(name: &'static str, body: String) -> Command {
        Command { name, body, step: None }
    }

    /// A one-key `EVAL` of a fenced write that can also go out as one step of a batch.
    fn fenced(op: &'static str, script: &'static str, key: &str, args: Vec<String>) -> Command {
        let mut argv: Vec<&str> = vec!["1", key];
        argv.extend(args.iter().map(String::as_str));
        let body = eval(script, &argv);
        Command { name: "EVAL", body, step: Some(Step { op, key: key.to_string(), args }) }
    }
}

/// Proof of ownership of a Redis claim or used token: its key and the exact record we wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub key: String,
    pub record: String,
    pub first_seen_ms: u64,
}

impl Ticket {
    /// The scoped id the key is made of (`<prefix>k:<hex id>`), which also names the key's entry
    /// in this process' shared store.
    pub fn id(&self) -> [u8; 32] {
        let hex = self.key.get(self.key.len().saturating_sub(64)..).unwrap_or("");
        unhex(hex)
    }

    /// The first half of the claiming request's fingerprint, as the in-flight record holds it.
    pub fn fingerprint16(&self) -> [u8; 16] {
        let fp = claim_parts(&self.record).1;
        unhex(fp.strip_prefix(XXH3_MARK).unwrap_or(fp))
    }
}

/// Lowercase hex to bytes; what is missing or not hex reads as zeros.
fn unhex<const N: usize>(hex: &str) -> [u8; N] {
    let digit = |c: u8| char::from(c).to_digit(16).unwrap_or(0) as u8;
    let mut out = [0u8; N];
    for (o, pair) in out.iter_mut().zip(hex.as_bytes().chunks_exact(2)) {
        *o = digit(pair[0]) << 4 | digit(pair[1]);
    }
    out
}

// Each fenced write's script is written once, over `K` (its key) and `A` (its arguments), and
// runs alone (`KEYS[1]`, `ARGV`) or as a step of [`BATCH`].
macro_rules! complete_body {
    () => {
        "local v=redis.call('GET',K) \
        if v==A[2] then return 1 end \
        if v and v~=A[1] then return 0 end \
        local r=redis.pcall('SET',K,A[2],'PX',A[3]) \
        if type(r)=='table' and r.err then if v then redis.call('PEXPIRE',K,A[4]) end return r end \
        return 1"
    };
}
macro_rules! release_body {
    () => {
        "local v=redis.call('GET',K) \
        if v==A[1] then redis.call('DEL',K) return 1 elseif v then return 0 else return 2 end"
    };
}
macro_rules! restore_body {
    () => {
        "if redis.call('GET',K)==A[1] then redis.call('SET',K,A[2],'KEEPTTL') return 1 else return 0 end"
    };
}
const COMPLETE: &str = concat!("local K,A=KEYS[1],ARGV ", complete_body!());
pub(super) const RELEASE: &str = concat!("local K,A=KEYS[1],ARGV ", release_body!());
pub(super) const RESTORE_TOKEN: &str = concat!("local K,A=KEYS[1],ARGV ", restore_body!());
const RENEW: &str = "if redis.call('GET',KEYS[1])==ARGV[1] then \
    return redis.call('PEXPIRE',KEYS[1],ARGV[2]) else return 0 end";
const USE_TOKEN: &str = "local v=redis.call('GET',KEYS[1]) if not v then return false end \
    if string.sub(v,1,2)=='K|' then redis.call('SET',KEYS[1],ARGV[1],'KEEPTTL') end return v";

/// Several fenced writes in one call (group commit): per key, `ARGV` holds the step's letter,
/// its argument count and its arguments; the reply is each step's own reply in order, a Redis
/// error of one step as the string `ERR …` (the other steps still run).
pub const BATCH: &str = concat!(
    "local F={C=function(K,A) ",
    complete_body!(),
    " end,R=function(K,A) ",
    release_body!(),
    " end,T=function(K,A) ",
    restore_body!(),
    " end} \
    local out,j={},1 \
    for i=1,#KEYS do \
      local op,n=ARGV[j],tonumber(ARGV[j+1]) \
      local A={} for x=1,n do A[x]=ARGV[j+1+x] end \
      j=j+2+n \
      local ok,r=pcall(F[op],KEYS[i],A) \
      if type(r)=='table' and r.err then r='ERR '..tostring(r.err) elseif not ok then r='ERR '..tostring(r) end \
      out[i]=r \
    end \
    return out"
);

/// Several claims in one call (group commit): `SET k <record> NX PX <lock_ttl> GET` per key,
/// `ARGV` holding each key's record and lock ttl; per key the reply is `""` (claimed), the
/// record found, or `ERR …` for that key alone.
pub const CLAIM_BATCH: &str = "local out={} \
    for i=1,#KEYS do \
      local ok,r=pcall(redis.call,'SET',KEYS[i],ARGV[2*i-1],'NX','PX',ARGV[2*i],'GET') \
      if not ok then r='ERR '..tostring(type(r)=='table' and r.err or r) elseif not r then r='' end \
      out[i]=r \
    end \
    return out";

/// What Redis does when memory runs out: `maxmemory-policy|maxmemory` from `INFO memory`, or
/// `unreadable:<error>` when the ACL does not allow `INFO`.
const EVICTION: &str = "local i=redis.pcall('INFO','memory') \
    if type(i)=='table' then return 'unreadable:'..tostring(i.err) end \
    return (string.match(i,'maxmemory_policy:([%w%-]+)') or 'unknown')..'|'..(string.match(i,'maxmemory:(%d+)') or '')";

pub struct RedisStore<'a> {
    cfg: &'a RedisConfig,
}

impl<'a> RedisStore<'a> {
    pub fn new(cfg: &'a RedisConfig) -> Self {
        RedisStore { cfg }
    }

    /// The callout headers: Envoy requires `:method`, `:path` and `:authority`.
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut h = vec![
            (":method".to_string(), "POST".to_string()),
            (":path".to_string(), "/".to_string()),
            (":authority".to_string(), self.cfg.authority.clone()),
            ("content-type".to_string(), "text/plain".to_string()),
        ];
        if let Some(auth) = &self.cfg.basic_auth {
            h.push(("authorization".to_string(), format!("Basic {}", STANDARD.encode(auth))));
        }
        h
    }

    fn key(&self, kind: &str, id: &[u8; 32]) -> String {
        let mut key = String::with_capacity(self.cfg.prefix.len() + kind.len() + 64);
        key.push_str(&self.cfg.prefix);
        key.push_str(kind);
        push_hex(&mut key, id);
        key
    }

    /// Claim in one round trip. The returned ticket is valid only if the reply says "claimed".
    pub fn claim(&self, id: &[u8; 32], fp: &[u8; 32], owner: u64, now: u64, lock_ttl_ms: u64) -> (Command, Ticket) {
        let key = self.key("k:", id);
        // `I|<owner:016x>|<fingerprint field>|<now>|<lease end>`, built in place.
        let mut record = String::with_capacity(80);
        record.push_str("I|");
        push_hex(&mut record, &owner.to_be_bytes());
        record.push('|');
        push_fp_field(&mut record, fp);
        record.push('|');
        push_decimal(&mut record, now);
        record.push('|');
        push_decimal(&mut record, now.saturating_add(lock_ttl_ms));
        let mut ttl = String::with_capacity(20);
        push_decimal(&mut ttl, lock_ttl_ms.max(1));
        let body = command(&["SET", &key, &record, "NX", "PX", &ttl, "GET"]);
        (Command::plain("SET", body), Ticket { key, record, first_seen_ms: now })
    }

    /// Reads the claim reply: `Claimed(())` means the ticket's claim is ours. An error leaves it
    /// open whether the `SET` landed (a callout that timed out may still reach Redis), so the
    /// caller releases the ticket, owner-checked.
    pub fn parse_claim(&self, fp: &[u8; 32], status: u16, body: &[u8]) -> Result<Claim<()>, StoreError> {
        read_claim(fp, reply("SET", status, body)?)
    }

    /// The claim reply's value (the record found, or null), read with [`read_claim_at`] and
    /// [`held_ticket`].
    pub fn claim_reply(&self, status: u16, body: &[u8]) -> Result<serde_json::Value, StoreError> {
        reply("SET", status, body)
    }

    /// Claims (tickets of [`RedisStore::claim`], with their lock ttl) as one call; its reply is
    /// read with [`RedisStore::parse_batch`], each claim's with [`read_claim`].
    pub fn claim_batch(&self, claims: &[(&Ticket, u64)]) -> Command {
        let n = claims.len().to_string();
        let ttls: Vec<String> = claims.iter().map(|(_, ttl)| ttl.max(&1).to_string()).collect();
        let mut argv: Vec<&str> = vec![&n];
        argv.extend(claims.iter().map(|(t, _)| t.key.as_str()));
        for ((t, _), ttl) in claims.iter().zip(&ttls) {
            argv.push(&t.record);
            argv.push(ttl);
        }
        Command::plain("EVAL", eval(CLAIM_BATCH, &argv))
    }
}

/// One claim's reply value: nothing there before (`null`, or `""` in a batch) is ours. A lookup
/// lease on an unknown outcome counts as running (see [`read_claim_at`]).
pub fn read_claim(fp: &[u8; 32], v: serde_json::Value) -> Result<Claim<()>, StoreError> {
    read_claim_at(fp, v, 0)
}

/// [`read_claim`] at `now`: an unknown outcome whose lookup lease (`[route.reconcile]`) runs
/// past `now` reads as a request in flight (repeats wait for the lookup, or get 409 in
/// progress), one whose lease has lapsed as the unknown outcome again.
pub fn read_claim_at(fp: &[u8; 32], v: serde_json::Value, now: u64) -> Result<Claim<()>, StoreError> {
    match v {
        serde_json::Value::Null => Ok(Claim::Claimed(())),
        serde_json::Value::String(record) if record.is_empty() => Ok(Claim::Claimed(())),
        serde_json::Value::String(record) => match parse_record(&record, fp)? {
            Claim::Unknown { first_seen_ms, payload, .. } if lookup_lease(&record).is_some_and(|l| l > now) => {
                Ok(Claim::InFlight { first_seen_ms, lease_ends_ms: lookup_lease(&record).unwrap_or(now), payload })
            }
            found => Ok(found),
        },
        other => Err(StoreError::Host(format!("unexpected SET reply {other}"))),
    }
}

/// The lookup lease of an unknown outcome's record (`U|owner|fp|first|until|lease end|note`):
/// a sixth field, empty when no lookup is out. Readers of earlier versions read the record as
/// the unknown outcome (they take field 4 as its end) and never take a lookup of one with a note.
fn lookup_lease(record: &str) -> Option<u64> {
    let f: Vec<&str> = record.split('|').collect();
    match f.as_slice() {
        ["U", _, _, _, _, lease, ..] => lease.parse().ok(),
        _ => None,
    }
}

/// An unknown outcome's record with its lookup lease set to `lease` (`None`: no lookup out),
/// under `owner`; the note after the lease is kept.
fn with_lease(record: &str, owner: &str, lease: Option<u64>) -> String {
    let f: Vec<&str> = record.split('|').collect();
    let mut out = format!("U|{owner}|{}|{}|{}|", field(&f, 2), field(&f, 3), field(&f, 4));
    if let Some(lease) = lease {
        out.push_str(&lease.to_string());
    }
    if let Some(note) = f.get(6..).filter(|n| !n.is_empty()) {
        out.push('|');
        out.push_str(&note.join("|"));
    } else if lease.is_none() {
        out.pop();
    }
    out
}

/// The ticket a lookup of the unknown outcome a claim found is fenced by: the record found (the
/// claim reply's value), when it is an unknown outcome whose lookup is free at `now`.
pub fn held_ticket(mine: &Ticket, v: &serde_json::Value, now: u64) -> Option<Ticket> {
    // Every claim reply passes here: a completed record (its answer in base64) is not split.
    let record = v.as_str().filter(|r| r.starts_with("U|"))?;
    let f: Vec<&str> = record.split('|').collect();
    let free = |lease: &str| lease.is_empty() || lease.parse::<u64>().is_ok_and(|l| l <= now);
    let first = match f.as_slice() {
        ["U", owner, _, first, _] if owner.len() == 16 => first,
        ["U", owner, _, first, _, lease, ..] if owner.len() == 16 && free(lease) => first,
        _ => return None,
    };
    Some(Ticket { key: mine.key.clone(), record: record.to_string(), first_seen_ms: first.parse().unwrap_or(0) })
}

impl RedisStore<'_> {
    /// Completion: the response (or a tombstone when it does not fit in `max_response_bytes`).
    /// `lease_ms` extends our in-flight record when Redis refuses the write, so the claim stays
    /// ours while the write is retried. Returns the command and whether it records a tombstone.
    pub fn complete(
        &self,
        t: &Ticket,
        response: &StoredResponse,
        max_response_bytes: usize,
        ttl_ms: u64,
        lease_ms: u64,
    ) -> (Command, bool) {
        let (owner, fp, first) = claim_parts(&t.record);
        let tombstone = response.encoded_len() > max_response_bytes;
        let record = if tombstone {
            format!("T|{owner}|{fp}|{first}|{}", response.status)
        } else {
            let mut enc = Vec::with_capacity(response.encoded_len());
            response.encode_into(&mut enc);
            let mut record = String::with_capacity(owner.len() + fp.len() + first.len() + 12 + enc.len() * 4 / 3 + 4);
            for part in ["C", owner, fp, first] {
                record.push_str(part);
                record.push('|');
            }
            push_decimal(&mut record, u64::from(response.status));
            record.push('|');
            STANDARD.encode_string(enc, &mut record);
            record
        };
        let args = vec![t.record.clone(), record, ttl_ms.max(1).to_string(), lease_ms.max(1).to_string()];
        (Command::fenced("C", COMPLETE, &t.key, args), tombstone)
    }

    /// Marks a claim whose outcome is unknown, held for `hold_ms` (same fencing as completion),
    /// with the `note` an operator lists it by; no lookup out yet (the lease field empty).
    pub fn hold_unknown(&self, t: &Ticket, hold_ms: u64, now: u64, lease_ms: u64, note: &HeldNote) -> Command {
        let (owner, fp, first) = claim_parts(&t.record);
        let mut record = format!("U|{owner}|{fp}|{first}|{}||", now.saturating_add(hold_ms));
        note.encode_into(&mut record);
        let args = vec![t.record.clone(), record, hold_ms.max(1).to_string(), lease_ms.max(1).to_string()];
        Command::fenced("C", COMPLETE, &t.key, args)
    }

    /// Takes the lookup of an unknown outcome (`held`, as [`held_ticket`] read it): its record
    /// again, under the lookup's owner, with the lease's end as a sixth field; fenced on the
    /// record found, so of the repeats that meet it one takes it. The returned ticket fences
    /// what the lookup's answer writes.
    pub fn take_lookup(&self, held: &Ticket, owner: u64, lease_ends_ms: u64) -> (Command, Ticket) {
        let record = with_lease(&held.record, &format!("{owner:016x}"), Some(lease_ends_ms));
        let body = eval(RESTORE_TOKEN, &["1", &held.key, &held.record, &record]);
        (Command::plain("EVAL", body), Ticket { record, ..held.clone() })
    }

    /// The lookup says the first attempt did not run: the key becomes the repeat's own claim
    /// (in flight, `lock_ttl_ms`), fenced on the lookup's record — or on nothing there, when the
    /// hold ran out meanwhile. The returned ticket is the claim's.
    pub fn lookup_absent(&self, t: &Ticket, owner: u64, now: u64, lock_ttl_ms: u64) -> (Command, Ticket) {
        let fp = claim_parts(&t.record).1;
        let record = format!("I|{owner:016x}|{fp}|{now}|{}", now.saturating_add(lock_ttl_ms));
        let ttl = lock_ttl_ms.max(1).to_string();
        let cmd = Command::fenced("C", COMPLETE, &t.key, vec![t.record.clone(), record.clone(), ttl.clone(), ttl]);
        (cmd, Ticket { key: t.key.clone(), record, first_seen_ms: now })
    }

    /// The lookup settled nothing (or its request left): the unknown outcome again, without the
    /// lease, so the next repeat may ask. Fenced on the lookup's record.
    pub fn lookup_failed(&self, t: &Ticket) -> Command {
        let record = with_lease(&t.record, field(&t.record.split('|').collect::<Vec<_>>(), 1), None);
        Command::fenced("T", RESTORE_TOKEN, &t.key, vec![t.record.clone(), record])
    }

    /// Extends the lease of a claim whose request still waits for the upstream.
    pub fn renew(&self, t: &Ticket, lease_ms: u64) -> Command {
        let lease = lease_ms.max(1).to_string();
        Command::plain("EVAL", eval(RENEW, &["1", &t.key, &t.record, &lease]))
    }

    /// Release of a claim whose first attempt definitely failed.
    pub fn release(&self, t: &Ticket) -> Command {
        Command::fenced("R", RELEASE, &t.key, vec![t.record.clone()])
    }

    /// A new random token (URL-safe) and the command that records it.
    pub fn issue_token(&self, id: &[u8; 32], now: u64, ttl_ms: u64) -> Command {
        let key = self.key("t:", id);
        let record = format!("K|{now}");
        Command::plain("SET", command(&["SET", &key, &record, "PX", &ttl_ms.max(1).to_string()]))
    }

    pub fn use_token(&self, id: &[u8; 32], owner: u64, now: u64) -> (Command, Ticket) {
        let key = self.key("t:", id);
        let record = format!("U|{owner:016x}|{now}");
        let body = eval(USE_TOKEN, &["1", &key, &record]);
        (Command::plain("EVAL", body), Ticket { key, record, first_seen_ms: now })
    }

    pub fn parse_use_token(&self, ticket: Ticket, status: u16, body: &[u8]) -> Result<TokenUse<Ticket>, StoreError> {
        match reply("EVAL", status, body)? {
            serde_json::Value::Null => Ok(TokenUse::Unknown),
            serde_json::Value::String(v) if v.starts_with("K|") => Ok(TokenUse::Consumed(ticket)),
            serde_json::Value::String(v) if v.starts_with("U|") => {
                let fields: Vec<&str> = v.split('|').collect();
                Ok(TokenUse::Used { used_at_ms: field(&fields, 2).parse().unwrap_or(0) })
            }
            other => Err(StoreError::Host(format!("unexpected token record {other}"))),
        }
    }

    pub fn restore_token(&self, t: &Ticket) -> Command {
        let issued = format!("K|{}", t.first_seen_ms);
        Command::fenced("T", RESTORE_TOKEN, &t.key, vec![t.record.clone(), issued])
    }

    /// Reads a fenced update's reply (`complete`, `hold_unknown`, `renew`, `restore_token`): `true`
    /// if it applied, `false` if another owner holds the key now.
    pub fn parse_update(&self, status: u16, body: &[u8]) -> Result<bool, StoreError> {
        read_update(reply("EVAL", status, body)?)
    }

    /// Reads a release's reply.
    pub fn parse_release(&self, status: u16, body: &[u8]) -> Result<Released, StoreError> {
        read_release(reply("EVAL", status, body)?)
    }

    /// Fenced writes (each built with a step) as one call; `None` when one is not a fenced write.
    pub fn batch(&self, writes: &[&Command]) -> Option<Command> {
        let steps: Vec<&Step> = writes.iter().map(|c| c.step.as_ref()).collect::<Option<_>>()?;
        let n = steps.len().to_string();
        let counts: Vec<String> = steps.iter().map(|s| s.args.len().to_string()).collect();
        let mut argv: Vec<&str> = vec![&n];
        argv.extend(steps.iter().map(|s| s.key.as_str()));
        for (s, count) in steps.iter().zip(&counts) {
            argv.push(s.op);
            argv.push(count);
            argv.extend(s.args.iter().map(String::as_str));
        }
        Some(Command::plain("EVAL", eval(BATCH, &argv)))
    }

    /// A batch's reply: each step's own reply, in order (read with [`read_update`] or
    /// [`read_release`]). An error of the whole call (Webdis, or Redis refusing the script, as
    /// Redis Cluster does for keys of several slots: `CROSSSLOT`) is `Err`.
    pub fn parse_batch(&self, steps: usize, status: u16, body: &[u8]) -> Result<Vec<StepReply>, StoreError> {
        let serde_json::Value::Array(items) = reply("EVAL", status, body)? else {
            return Err(StoreError::Host("unexpected batch reply (not a list)".into()));
        };
        if items.len() != steps {
            return Err(StoreError::Host(format!("batch reply holds {} replies for {steps} writes", items.len())));
        }
        Ok(items
            .into_iter()
            .map(|v| match v.as_str().and_then(|e| e.strip_prefix("ERR ")) {
                Some(e) => Err(redis_error(e)),
                None => Ok(v),
            })
            .collect())
    }
}

/// The Redis Cluster slot of a key: CRC16 (XMODEM) of the key, or of its `{hash tag}`, mod
/// 16384. A batch on a cluster holds keys of one slot only.
pub fn hash_slot(key: impl AsRef<[u8]>) -> u16 {
    let bytes = key.as_ref();
    let tag = bytes.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = bytes.get(open + 1..)?;
        let close = rest.iter().position(|&c| c == b'}')?;
        rest.get(..close).filter(|t| !t.is_empty())
    });
    let mut crc: u16 = 0;
    for &byte in tag.unwrap_or(bytes) {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc % 16384
}

/// One step's reply in a batch.
pub type StepReply = Result<serde_json::Value, StoreError>;

/// A fenced update's reply value: `true` if it applied, `false` if another owner holds the key.
pub fn read_update(v: serde_json::Value) -> Result<bool, StoreError> {
    match v {
        serde_json::Value::Number(n) => Ok(n.as_i64() == Some(1)),
        other => Err(StoreError::Host(format!("unexpected EVAL reply {other}"))),
    }
}

/// A release's reply value.
pub fn read_release(v: serde_json::Value) -> Result<Released, StoreError> {
    match v {
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(1) => Ok(Released::Deleted),
            Some(0) => Ok(Released::NotOurs),
            Some(2) => Ok(Released::Absent),
            _ => Err(StoreError::Host(format!("unexpected release reply {n}"))),
        },
        other => Err(StoreError::Host(format!("unexpected EVAL reply {other}"))),
    }
}

impl RedisStore<'_> {
    /// Asks Redis how it handles running out of memory (one key, so a cluster proxy can route it).
    pub fn eviction_probe(&self) -> Command {
        let key = format!("{}probe", self.cfg.prefix);
        Command::plain("EVAL", eval(EVICTION, &["1", &key]))
    }

    /// Reads the probe's reply.
    pub fn parse_eviction(&self, status: u16, body: &[u8]) -> Result<Eviction, StoreError> {
        match reply("EVAL", status, body)? {
            serde_json::Value::String(v) => Ok(match v.strip_prefix("unreadable:") {
                Some(why) => Eviction::Unreadable(why.to_string()),
                None => {
                    let (policy, max) = v.split_once('|').unwrap_or((v.as_str(), ""));
                    if policy == "noeviction" {
                        Eviction::Never
                    } else {
                        Eviction::Evicts { policy: policy.to_string(), maxmemory: max.parse().unwrap_or(0) }
                    }
                }
            }),
            other => Err(StoreError::Host(format!("unexpected EVAL reply {other}"))),
        }
    }

    /// Reads a plain write's reply (`issue_token`).
    pub fn parse_ok(&self, status: u16, body: &[u8]) -> Result<(), StoreError> {
        match reply("SET", status, body)? {
            serde_json::Value::Array(a) if a.first() == Some(&serde_json::Value::Bool(true)) => Ok(()),
            other => Err(StoreError::Host(format!("unexpected SET reply {other}"))),
        }
    }
}

/// What Redis does with idem's keys when its memory is full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Eviction {
    /// `noeviction`: new writes are refused (idem answers 503 and retries completions).
    Never,
    /// Any other policy: keys with a TTL — all of idem's — may be evicted.
    Evicts { policy: String, maxmemory: u64 },
    /// The ACL of Webdis' Redis user does not allow `INFO`.
    Unreadable(String),
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// Our in-flight record was there and is deleted.
    Deleted,
    /// Another owner's record is there (it took the key over): left alone.
    NotOurs,
    /// Nothing is there: our lease ran out, or our claim has not landed (yet).
    Absent,
}

/// Owner, fingerprint and first-seen time of an in-flight record (`I|owner|fp|first|lease`),
/// which a completion or an unknown-outcome record carries over.
fn claim_parts(record: &str) -> (&str, &str, &str) {
    let mut f = record.split('|').skip(1);
    (f.next().unwrap_or(""), f.next().unwrap_or(""), f.next().unwrap_or(""))
}

fn field<'s>(fields: &[&'s str], i: usize) -> &'s str {
    fields.get(i).copied().unwrap_or("")
}

/// Writes over `path` the path of a Webdis call tagged `tag` (a call's headers are reused, not
/// made again): Webdis wraps its reply as JSONP, `i<tag>(…);`, the one thing of a call its reply
/// carries back. Webdis 0.1.9 writes the reply of a command whose client closed the connection
/// (an Envoy callout that timed out) into the next connection that reuses the socket, where
/// Envoy reads it as that connection's next call's reply: a claim for another key read as
/// `null`, "claimed" (docs/redis.md). The tag tells them apart.
pub fn write_tagged_path(path: &mut String, tag: u64) {
    path.clear();
    path.push_str("/?jsonp=i");
    push_hex(path, &tag.to_be_bytes());
}

/// A tagged reply's JSON, in place; `false` (the body untouched) when it carries another tag,
/// or none: it is not the reply of this call.
pub fn untag(tag: u64, body: &mut Vec<u8>) -> bool {
    // `i`, the tag's 16 hex digits, `(`, the JSON, `);` (and a newline, trimmed).
    const HEAD: usize = 18;
    let end = body.trim_ascii_end().len();
    let ours = end >= HEAD + 2
        && body.first() == Some(&b'i')
        && body.get(HEAD - 1) == Some(&b'(')
        && body
            .get(1..HEAD - 1)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .map(|hex| u64::from_be_bytes(unhex(hex)))
            == Some(tag)
        && body.get(..end).is_some_and(|b| b.ends_with(b");"));
    if !ours {
        return false;
    }
    body.truncate(end - 2);
    body.drain(..HEAD);
    true
}

/// `EVAL/<script>/<arg>/…`, encoded as [`command`] encodes. Every call carries its script's
/// text (a few hundred bytes): its encoding is made once per process, where encoding it again
/// for each call cost more than the rest of building the call.
fn eval(script: &'static str, args: &[&str]) -> String {
    static ENCODED: OnceLock<Vec<(&'static str, String)>> = OnceLock::new();
    let scripts = [COMPLETE, RELEASE, RESTORE_TOKEN, RENEW, USE_TOKEN, BATCH, CLAIM_BATCH, EVICTION];
    let encoded = ENCODED.get_or_init(|| scripts.iter().map(|s| (*s, command(&[s]))).collect());
    let known = encoded.iter().find(|(s, _)| s.len() == script.len() && *s == script).map(|(_, e)| e);
    let mut out = String::with_capacity(script.len() * 2 + args.iter().map(|a| a.len() * 3 + 1).sum::<usize>());
    out.push_str("EVAL/");
    match known {
        Some(e) => out.push_str(e),
        None => percent_encode_into(&mut out, script),
    }
    for a in args {
        out.push('/');
        percent_encode_into(&mut out, a);
    }
    out
}

/// `CMD/arg/…` with every byte outside `[A-Za-z0-9_~-]` percent-encoded (Webdis splits on `/`
/// and treats `.` as a format extension).
pub fn command(args: &[&str]) -> String {
    let mut out = String::with_capacity(args.iter().map(|a| a.len() * 3 + 1).sum());
    for (i, a) in args.iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        percent_encode_into(&mut out, a);
    }
    out
}

/// A Redis error reply as a store error: `CROSSSLOT` (Redis Cluster, keys of several hash slots
/// in one call; nothing of it ran) is a kind of its own, which the batching reacts to.
fn redis_error(message: &str) -> StoreError {
    if message.starts_with("CROSSSLOT") {
        StoreError::CrossSlot(message.to_string())
    } else {
        StoreError::Redis(message.to_string())
    }
}

/// Webdis' JSON reply `{"CMD": value}`; HTTP errors, callout failures (status 0) and Redis errors
/// (`[false, "ERR …"]` inside a 200) are store errors.
pub fn reply(name: &str, status: u16, body: &[u8]) -> Result<serde_json::Value, StoreError> {
    if status == 0 {
        return Err(StoreError::NoAnswer);
    }
    if status != 200 {
        let text = String::from_utf8_lossy(body.get(..200).unwrap_or(body)).into_owned();
        return Err(StoreError::Host(format!("webdis answered HTTP {status}: {}", text.trim())));
    }
    let mut v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| StoreError::Host(format!("webdis reply is not JSON ({e})")))?;
    // Taken out, not cloned: a claim batch's reply holds a record per key.
    let inner = v.as_object_mut().and_then(|m| m.remove(name));
    let inner = inner.ok_or_else(|| StoreError::Host(format!("webdis reply has no {name:?}: {v}")))?;
    if let serde_json::Value::Array(a) = &inner {
        if a.first() == Some(&serde_json::Value::Bool(false)) {
            let msg = a.get(1).and_then(|m| m.as_str()).unwrap_or("error");
            return Err(redis_error(msg));
        }
    }
    Ok(inner)
}

/// Marks a record's fingerprint as xxh3-128; records of earlier versions hold SHA-256's first
/// 16 bytes there, bare hex.
const XXH3_MARK: &str = "x";

/// A fingerprint as records hold it: `x` and the 16 bytes in hex.
#[cfg(test)]
pub(super) fn fp_field(fp: &[u8; 32]) -> String {
    let mut field = String::with_capacity(33);
    push_fp_field(&mut field, fp);
    field
}

/// Appends [`fp_field`].
fn push_fp_field(out: &mut String, fp: &[u8; 32]) {
    out.push_str(XXH3_MARK);
    push_hex(out, &fp[..16]);
}

/// An existing claim record as the claim's answer.
fn parse_record(record: &str, fp: &[u8; 32]) -> Result<Claim<()>, StoreError> {
    let f: Vec<&str> = record.splitn(6, '|').collect();
    let num = |i: usize| field(&f, i).parse::<u64>().unwrap_or(0);
    let stored = field(&f, 2);
    let mut current = [0u8; 16];
    current.copy_from_slice(&fp[..16]);
    let payload = match stored.strip_prefix(XXH3_MARK) {
        Some(hex) => Payload::of(&unhex(hex), false, &current),
        None => Payload::of(&unhex(stored), true, &current),
    };
    let bad = || {
        let head: String = record.chars().take(40).collect();
        StoreError::Unreadable(format!("unreadable claim record {head:?}"))
    };
    match field(&f, 0) {
        "I" => Ok(Claim::InFlight { first_seen_ms: num(3), lease_ends_ms: num(4), payload }),
        "U" => Ok(Claim::Unknown { first_seen_ms: num(3), held_until_ms: num(4), payload, held: None }),
        "T" => Ok(Claim::Completed { first_seen_ms: num(3), status: num(4) as u16, response: None, payload }),
        "C" => {
            let bytes = STANDARD.decode(field(&f, 5)).map_err(|_| bad())?;
            let response = StoredResponse::decode(&bytes).ok_or_else(bad)?;
            Ok(Claim::Completed { first_seen_ms: num(3), status: num(4) as u16, response: Some(response), payload })
        }
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod eval_tests {
    use super::*;

    /// The cached encodings are exactly what encoding each call afresh gives (a script not in
    /// the cache is encoded on the spot).
    #[test]
    fn an_eval_is_encoded_as_a_command_is() {
        let scripts =
            [COMPLETE, RELEASE, RESTORE_TOKEN, RENEW, USE_TOKEN, BATCH, CLAIM_BATCH, EVICTION, "return 'a/b'"];
        for script in scripts {
            let args = ["1", "t:k:ab", "I|00ff|x|1.5", "30000"];
            let mut all = vec!["EVAL", script];
            all.extend(args);
            assert_eq!(eval(script, &args), command(&all), "{script}");
        }
    }
}

#[cfg(test)]
mod tag_tests {
    use super::*;

    /// Webdis answers `POST /?jsonp=<tag>` as `<tag>(<json>);` and a newline.
    #[test]
    fn a_reply_is_read_only_under_its_own_tag() {
        let tag = 0x0123_4567_89ab_cdef;
        let mut path = String::from("/");
        write_tagged_path(&mut path, tag);
        assert_eq!(path, "/?jsonp=i0123456789abcdef");
        let mut own = br#"i0123456789abcdef({"SET":null});"#.to_vec();
        own.push(b'\n');
        assert!(untag(tag, &mut own));
        assert_eq!(own, br#"{"SET":null}"#);
        let mut empty = b"i0123456789abcdef();".to_vec();
        assert!(untag(tag, &mut empty) && empty.is_empty());
        // Another call's reply, an untagged one, a cut one: not this call's, and left as they are.
        for other in [
            &br#"i0123456789abcdee({"SET":null});"#[..],
            br#"{"SET":null}"#,
            br#"i0123456789abcdef({"SET":null}"#,
            b"i0123456789abcdef(",
            b"",
        ] {
            let mut body = other.to_vec();
            assert!(!untag(tag, &mut body), "{}", String::from_utf8_lossy(other));
            assert_eq!(body, other);
        }
    }
}
