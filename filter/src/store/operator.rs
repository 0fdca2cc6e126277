//! What an operator does to the unknown outcomes a store holds (`idem-admin`; on the shared store
//! through the admin listener, [`super::shared`]): read a held record, release it, or resolve it
//! with an answer. For Redis the record formats live in [`super::redis`]; this module only reads
//! an unknown record and builds the record that replaces it, so the operator's tool and the filter
//! can never disagree on them.
//!
//! Every change is fenced the way the filter fences its own writes: the tool reads the record,
//! then runs a script that changes the key only if it still holds exactly that record. A key
//! another request has claimed since (its hold ran out, a new request took it) is never touched.

use super::redis::{RELEASE, RESTORE_TOKEN};
use crate::policy::{percent_decode, percent_encode_into};
use crate::response::StoredResponse;
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;

/// `EVAL <script> 1 <key> <record read>`: deletes the key if it still holds the record read.
/// Replies 1 (released), 0 (the key holds another record now) or 2 (the key is gone).
pub const RELEASE_IF_UNCHANGED: &str = RELEASE;

/// `EVAL <script> 1 <key> <record read> <new record>`: replaces the record read, keeping its
/// expiry. Replies 1 (resolved) or 0 (the key holds another record, or is gone).
pub const REPLACE_IF_UNCHANGED: &str = RESTORE_TOKEN;

/// What a held unknown outcome's record says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// The claiming request's random owner id (hex), which fences every write.
    pub owner: String,
    pub first_seen_ms: u64,
    pub held_until_ms: u64,
    /// When a lookup (`[route.reconcile]`) that asks the service about it gives up, if one was
    /// taken; while it runs, an operator leaves the key alone.
    pub lookup_lease_ms: Option<u64>,
    /// Which route's request it was and the start of its key, when the record says (records
    /// written before notes were kept do not).
    pub note: Option<HeldNote>,
}

/// What a held unknown outcome carries for the operator: the route and the first characters of
/// the client's key ([`crate::key::truncated`], as in the `unknown_outcome` log line), so the
/// list says which business call to check. Both stored percent-encoded, so neither can forge a
/// field of the record around them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldNote {
    pub route: String,
    pub key_prefix: Option<String>,
}

impl HeldNote {
    pub fn new(route: &str, key: Option<&str>) -> HeldNote {
        HeldNote { route: route.to_string(), key_prefix: key.map(crate::key::truncated) }
    }

    /// `<route>|<key prefix>` (the prefix empty when the key has none), each percent-encoded.
    pub fn encode_into(&self, out: &mut String) {
        percent_encode_into(out, &self.route);
        out.push('|');
        if let Some(prefix) = &self.key_prefix {
            percent_encode_into(out, prefix);
        }
    }

    /// Reads the two fields [`HeldNote::encode_into`] wrote; `None` unless there are exactly two.
    pub fn decode(fields: &[&str]) -> Option<HeldNote> {
        let [route, prefix] = fields else {
            return None;
        };
        let text = |f: &str| String::from_utf8(percent_decode(f.as_bytes())).ok();
        Some(HeldNote { route: text(route)?, key_prefix: if prefix.is_empty() { None } else { Some(text(prefix)?) } })
    }
}

/// What an operator's release or resolve did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Done,
    /// Nothing changed: the key does not exist (its hold ended, or someone released it).
    Absent,
    /// Nothing changed: the key holds something else now (a claim, an answer, a lookup).
    Holds(RecordKind),
    /// Nothing changed: the key is an unknown outcome of another request (owner, hex) than the
    /// one the operator listed.
    OtherOwner(String),
}

impl Change {
    /// What a release or resolve (`done`: "released", "resolved") of `key` did, as scripts read
    /// it (`result`: `done`, `absent` or `unchanged`) and as people do (the message).
    pub fn describe(&self, done: &str, key: &str) -> (String, String) {
        match self {
            Change::Done => (done.to_string(), format!("{done} {key}")),
            Change::Absent => {
                ("absent".into(), format!("nothing {done}: {key} does not exist (its hold ended, or it was released)"))
            }
            Change::Holds(kind) => {
                ("unchanged".into(), format!("nothing {done}: {key} holds {}, not an unknown outcome", kind.describe()))
            }
            Change::OtherOwner(owner) => (
                "unchanged".into(),
                format!("nothing {done}: {key} is now the unknown outcome of another request (owner {owner})"),
            ),
        }
    }
}

/// The key's kind, as the first field of its record says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    InFlight,
    /// An unknown outcome whose lookup (`[route.reconcile]`) is asking the service right now.
    LookingUp,
    Unknown,
    Completed,
    Tombstone,
    Other,
}

impl RecordKind {
    pub fn of(record: &str) -> RecordKind {
        match record.split('|').next() {
            Some("I") => RecordKind::InFlight,
            Some("U") => RecordKind::Unknown,
            Some("C") => RecordKind::Completed,
            Some("T") => RecordKind::Tombstone,
            _ => RecordKind::Other,
        }
    }

    /// For messages: what the key holds.
    pub fn describe(self) -> &'static str {
        match self {
            RecordKind::InFlight => "a claim in flight (a request took the key)",
            RecordKind::LookingUp => "an unknown outcome whose lookup is asking the service now",
            RecordKind::Unknown => "an unknown outcome",
            RecordKind::Completed => "a stored answer",
            RecordKind::Tombstone => "a stored answer too large to keep (a tombstone)",
            RecordKind::Other => "a record that is not a claim",
        }
    }
}

/// A claim key's unknown-outcome record (`U|owner|fingerprint|first seen|held until`, then
/// the end of a lookup's lease — empty when none was taken — and the [`HeldNote`]); `None` for
/// any other record (a token's `U|owner|used at` has three fields and is not a claim either).
pub fn held(record: &str) -> Option<Held> {
    let f: Vec<&str> = record.split('|').collect();
    let (kind, owner, first, until, lease, note) = match f.as_slice() {
        [kind, owner, _fp, first, until] => (kind, owner, first, until, None, None),
        [kind, owner, _fp, first, until, lease, note @ ..] => {
            let lease = if lease.is_empty() { None } else { Some(lease.parse().ok()?) };
            (kind, owner, first, until, lease, HeldNote::decode(note))
        }
        _ => return None,
    };
    if *kind != "U" || owner.len() != 16 || !owner.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some(Held {
        owner: owner.to_string(),
        first_seen_ms: first.parse().ok()?,
        held_until_ms: until.parse().ok()?,
        lookup_lease_ms: lease,
        note,
    })
}

/// The completed record that resolves the unknown record `record` with `answer`: same owner,
/// fingerprint and first-seen time, so the client's repeat (same fingerprint) gets `answer`
/// replayed and a different request with the key gets 422, as for any stored answer.
pub fn resolved(record: &str, answer: &StoredResponse) -> Option<String> {
    held(record)?;
    let mut f = record.split('|').skip(1);
    let (owner, fp, first) = (f.next()?, f.next()?, f.next()?);
    let mut enc = Vec::with_capacity(answer.encoded_len());
    answer.encode_into(&mut enc);
    Some(format!("C|{owner}|{fp}|{first}|{}|{}", answer.status, STANDARD.encode(enc)))
}

/// Whether `store_key` names a claim key under `prefix`: `<prefix>k:` and 64 lowercase hex digits.
pub fn is_claim_key(prefix: &str, store_key: &str) -> bool {
    store_key
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix("k:"))
        .is_some_and(|id| id.len() == 64 && id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, clippy::string_slice)]
    use super::*;
    use crate::store::redis::{fp_field, read_claim};
    use crate::store::{Claim, Payload};

    fn unknown(fp: &[u8; 32]) -> String {
        format!("U|00000000000000ab|{}|1700000000000|1700086400000", fp_field(fp))
    }

    #[test]
    fn a_records_state_is_what_the_operator_sees() {
        let fp = [7u8; 32];
        let state = |r: &str| KeyState::of_record(r, 1_700_000_000_500);
        assert_eq!(
            state(&format!("I|00000000000000ab|{}|1700000000000|1700000030000", fp_field(&fp))),
            Some(KeyState::Claimed {
                owner: "00000000000000ab".into(),
                first_seen_ms: 1_700_000_000_000,
                lease_ends_ms: 1_700_000_030_000
            })
        );
        assert!(matches!(
            state(&format!("T|00000000000000ab|{}|1700000000000|201", fp_field(&fp))),
            Some(KeyState::Completed { status: 201, whole: false, .. })
        ));
        assert!(matches!(
            state(&unknown(&fp)),
            Some(KeyState::Unknown { held_until_ms: 1_700_086_400_000, looking_up: false, .. })
        ));
        let looking = format!("{}|1700000001000|", unknown(&fp));
        assert!(matches!(state(&looking), Some(KeyState::Unknown { looking_up: true, .. })), "a lookup's lease runs");
        assert_eq!(state("garbage"), None);
        assert_eq!(KeyState::Absent.to_json("k")["state"], "absent");
    }

    #[test]
    fn an_unknown_record_is_read_and_nothing_else_is() {
        let fp = [7u8; 32];
        let held = held(&unknown(&fp)).unwrap();
        assert_eq!(
            held,
            Held {
                owner: "00000000000000ab".into(),
                first_seen_ms: 1_700_000_000_000,
                held_until_ms: 1_700_086_400_000,
                lookup_lease_ms: None,
                note: None,
            }
        );
        let looking = super::held(&format!("{}|1700000002000", unknown(&fp))).unwrap();
        assert_eq!(looking.lookup_lease_ms, Some(1_700_000_002_000));
        let note = HeldNote::new("create-order", Some("a|b%7C|c…d"));
        let mut noted = format!("{}||", unknown(&fp));
        note.encode_into(&mut noted);
        assert_eq!(noted.matches('|').count(), 7, "{noted}");
        let read = super::held(&noted).unwrap();
        assert_eq!((read.lookup_lease_ms, read.note), (None, Some(note)));
        for other in
            ["I|00000000000000ab|x00|1|2", "U|00000000000000ab|1700000000000", "U|zz|x|1|2", "C|a|b|1|200|AA==", ""]
        {
            assert_eq!(super::held(other), None, "{other:?}");
        }
    }

    /// The filter reads the resolved record as the key's stored answer: the client's repeat (same
    /// fingerprint) replays it, another body with the key is a different request.
    #[test]
    fn a_resolved_record_is_the_stored_answer_the_filter_replays() {
        let fp = [7u8; 32];
        let answer = StoredResponse::new(
            201,
            vec![("content-type".into(), b"application/json".to_vec())],
            br#"{"order":"A|B"}"#.to_vec(),
        );
        let record = resolved(&unknown(&fp), &answer).unwrap();
        match read_claim(&fp, serde_json::Value::String(record.clone())).unwrap() {
            Claim::Completed { first_seen_ms, status, response, payload } => {
                assert_eq!((first_seen_ms, status, payload), (1_700_000_000_000, 201, Payload::Same));
                assert_eq!(response, Some(answer));
            }
            other => panic!("{other:?}"),
        }
        let other_fp = [8u8; 32];
        assert!(matches!(
            read_claim(&other_fp, serde_json::Value::String(record)).unwrap(),
            Claim::Completed { payload: Payload::Different, .. }
        ));
        assert_eq!(resolved("I|00000000000000ab|x00|1|2", &StoredResponse::new(200, vec![], vec![])), None);
    }

    #[test]
    fn claim_keys_are_the_prefix_k_and_a_hex_id() {
        let id = "0123456789abcdef".repeat(4);
        assert!(is_claim_key("idem:", &format!("idem:k:{id}")));
        for bad in [
            format!("idem:t:{id}"),
            format!("other:k:{id}"),
            format!("idem:k:{}", &id[1..]),
            format!("idem:k:{}", id.to_uppercase()),
            "idem:k:../x".into(),
        ] {
            assert!(!is_claim_key("idem:", &bad), "{bad}");
        }
    }
}

/// What a key holds, as an operator asks about one key (`idem-admin show`, the admin listener's
/// `GET /keys/<id>`), on either store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// Nothing: never claimed, released, expired, or evicted.
    Absent,
    /// A request holds it and its outcome is not in yet.
    Claimed { owner: String, first_seen_ms: u64, lease_ends_ms: u64 },
    /// An answer is stored (`whole`: the answer itself; else only its status, a tombstone).
    Completed { owner: String, first_seen_ms: u64, status: u16, whole: bool },
    /// Forwarded with no answer: held until `held_until_ms`; `looking_up`: a lookup asks now.
    Unknown { owner: String, first_seen_ms: u64, held_until_ms: u64, looking_up: bool },
}

impl KeyState {
    /// A Redis claim record's state at `now_ms` (`None` for an unreadable one).
    pub fn of_record(record: &str, now_ms: u64) -> Option<KeyState> {
        let f: Vec<&str> = record.splitn(7, '|').collect();
        let num = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok());
        let owner = f.get(1)?.to_string();
        Some(match *f.first()? {
            "I" => KeyState::Claimed { owner, first_seen_ms: num(3)?, lease_ends_ms: num(4)? },
            "C" | "T" => KeyState::Completed {
                owner,
                first_seen_ms: num(3)?,
                status: u16::try_from(num(4)?).ok()?,
                whole: f[0] == "C",
            },
            "U" => {
                let held = held(record)?;
                let looking_up = held.lookup_lease_ms.is_some_and(|lease| lease > now_ms);
                KeyState::Unknown {
                    owner,
                    first_seen_ms: held.first_seen_ms,
                    held_until_ms: held.held_until_ms,
                    looking_up,
                }
            }
            _ => return None,
        })
    }

    /// The state as the admin listener answers it (times in RFC 3339).
    pub fn to_json(&self, store_key: &str) -> serde_json::Value {
        use crate::response::rfc3339;
        use serde_json::json;
        match self {
            KeyState::Absent => json!({"store_key": store_key, "state": "absent"}),
            KeyState::Claimed { owner, first_seen_ms, lease_ends_ms } => json!({
                "store_key": store_key, "state": "claimed", "owner": owner,
                "first_seen_at": rfc3339(*first_seen_ms), "lease_ends_at": rfc3339(*lease_ends_ms),
            }),
            KeyState::Completed { owner, first_seen_ms, status, whole } => json!({
                "store_key": store_key, "state": "completed", "owner": owner, "status": status,
                "first_seen_at": rfc3339(*first_seen_ms), "answer_kept": whole,
            }),
            KeyState::Unknown { owner, first_seen_ms, held_until_ms, looking_up } => json!({
                "store_key": store_key, "state": "unknown_outcome", "owner": owner,
                "first_seen_at": rfc3339(*first_seen_ms), "held_until": rfc3339(*held_until_ms),
                "looking_up": looking_up,
            }),
        }
    }
}
