#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The Webdis protocol of the Redis store: what is sent and how every reply is read. (The real
//! Redis + Webdis are exercised end to end in tests/e2e.)

mod common;
use common::percent_decode;
use idem_filter::policy::parse_bundle;
use idem_filter::response::StoredResponse;
use idem_filter::store::operator::HeldNote;
use idem_filter::store::redis::*;
use idem_filter::store::{Claim, Payload, StoreError, TokenUse};

fn cfg() -> idem_filter::policy::RedisConfig {
    let b = parse_bundle("[redis]\ncluster = \"webdis\"\nbasic_auth = \"idem:pw\"\nprefix = \"t:\"\n", "p").unwrap();
    b.redis.unwrap()
}

#[test]
fn commands_are_percent_encoded_per_argument() {
    assert_eq!(command(&["SET", "a/b", "x.y z", "NX"]), "SET/a%2Fb/x%2Ey%20z/NX");
    assert_eq!(command(&["EVAL", "return 1", "0"]), "EVAL/return%201/0");
    assert_eq!(command(&["GET", "订"]), "GET/%E8%AE%A2");
}

#[test]
fn callout_headers_carry_authority_and_basic_auth() {
    let c = cfg();
    let h = RedisStore::new(&c).headers();
    assert!(h.contains(&(":authority".into(), "webdis".into())));
    assert!(h.contains(&(":method".into(), "POST".into())));
    assert!(h.contains(&("authorization".into(), "Basic aWRlbTpwdw==".into())));
}

#[test]
fn claim_is_one_set_nx_px_get() {
    let c = cfg();
    let s = RedisStore::new(&c);
    let (cmd, t) = s.claim(&[0xab; 32], &[1; 32], 0x1234, 1000, 30_000);
    assert_eq!(cmd.name, "SET");
    assert!(cmd.body.starts_with("SET/t%3Ak%3Aabab"), "{}", cmd.body);
    assert!(cmd.body.ends_with("/NX/PX/30000/GET"), "{}", cmd.body);
    assert_eq!(t.record, format!("I|0000000000001234|x{}|1000|31000", "01".repeat(16)));
    // nil: we own it.
    assert_eq!(s.parse_claim(&[1; 32], 200, br#"{"SET":null}"#).unwrap(), Claim::Claimed(()));
    // Someone else's in-flight record.
    let other = format!(r#"{{"SET":"I|00000000000000ff|x{}|900|30900"}}"#, "01".repeat(16));
    assert_eq!(
        s.parse_claim(&[1; 32], 200, other.as_bytes()).unwrap(),
        Claim::InFlight { first_seen_ms: 900, lease_ends_ms: 30900, payload: Payload::Same }
    );
    assert!(matches!(
        s.parse_claim(&[2; 32], 200, other.as_bytes()).unwrap(),
        Claim::InFlight { payload: Payload::Different, .. }
    ));
}

#[test]
fn completed_records_round_trip_binary_bodies() {
    let c = cfg();
    let s = RedisStore::new(&c);
    let (_, t) = s.claim(&[3; 32], &[1; 32], 7, 1000, 30_000);
    let resp = StoredResponse::new(
        201,
        vec![("content-type".into(), "application/octet-stream".into())],
        vec![0, 159, 255, 10],
    );
    let (cmd, tombstone) = s.complete(&t, &resp, 1024, 86_400_000, 30_000);
    assert!(!tombstone);
    assert_eq!(cmd.name, "EVAL");
    // The record that Redis would now hold, read back by the next claim.
    let record = format!("C|0000000000000007|x{}|1000|201|", "01".repeat(16));
    assert!(percent_decode(&cmd.body).contains(&record));
    let stored = percent_decode(cmd.body.split('/').nth(5).unwrap());
    let reply = serde_json::json!({ "SET": stored }).to_string();
    match s.parse_claim(&[1; 32], 200, reply.as_bytes()).unwrap() {
        Claim::Completed { status: 201, response: Some(r), first_seen_ms: 1000, payload: Payload::Same } => {
            assert_eq!(r.body, vec![0, 159, 255, 10]);
        }
        other => panic!("{other:?}"),
    }
    let (_, tombstone) = s.complete(&t, &resp, 3, 1000, 30_000);
    assert!(tombstone);
}

#[test]
fn fenced_updates_read_one_or_zero() {
    let c = cfg();
    let s = RedisStore::new(&c);
    assert!(s.parse_update(200, br#"{"EVAL":1}"#).unwrap());
    assert!(!s.parse_update(200, br#"{"EVAL":0}"#).unwrap());
}

#[test]
fn every_failure_is_a_store_error() {
    let c = cfg();
    let s = RedisStore::new(&c);
    let cases: [(u16, &[u8], &str); 7] = [
        (200, br#"{"SET":[false,"ERR syntax error"]}"#, "redis error: ERR syntax error"),
        (200, br#"{"EVAL":[false,"NOSCRIPT"]}"#, "no \"SET\""),
        (0, b"", "no answer from Redis"),
        // Envoy answers a callout that timed out itself, with a 504.
        (504, b"upstream request timeout", "HTTP 504"),
        (503, b"Service Unavailable", "HTTP 503"),
        (403, b"", "HTTP 403"),
        (200, b"<html>", "not JSON"),
    ];
    for (status, body, want) in cases {
        match s.parse_claim(&[1; 32], status, body) {
            Err(e) => assert!(e.to_string().contains(want), "{e} vs {want}"),
            other => panic!("{status}: {other:?}"),
        }
    }
    assert!(matches!(s.parse_claim(&[1; 32], 0, b""), Err(StoreError::NoAnswer)));
    assert!(matches!(
        s.parse_claim(&[1; 32], 200, br#"{"SET":"garbage"}"#),
        Err(StoreError::Unreadable(m)) if m.contains("garbage")
    ));
    // Redis Cluster's refusal of a call across hash slots is its own kind (the batching reacts
    // to it), in a single reply and in a batch's.
    let crossslot = br#"{"EVAL":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#;
    assert!(matches!(s.parse_batch(2, 200, crossslot), Err(StoreError::CrossSlot(_))));
    assert!(matches!(
        s.parse_batch(1, 200, br#"{"EVAL":[false,"ERR unknown command"]}"#),
        Err(StoreError::Redis(m)) if m == "ERR unknown command"
    ));
}

#[test]
fn tokens_issue_use_and_restore() {
    let c = cfg();
    let s = RedisStore::new(&c);
    let issue = s.issue_token(&[9; 32], 5000, 600_000);
    assert!(
        issue.body.starts_with("SET/t%3At%3A0909") && issue.body.ends_with("/K%7C5000/PX/600000"),
        "{}",
        issue.body
    );
    s.parse_ok(200, br#"{"SET":[true,"OK"]}"#).unwrap();
    let (cmd, t) = s.use_token(&[9; 32], 0x42, 6000);
    assert_eq!(cmd.name, "EVAL");
    assert_eq!(s.parse_use_token(t.clone(), 200, br#"{"EVAL":"K|5000"}"#).unwrap(), TokenUse::Consumed(t.clone()));
    assert_eq!(
        s.parse_use_token(t.clone(), 200, br#"{"EVAL":"U|0000000000000001|5500"}"#).unwrap(),
        TokenUse::Used { used_at_ms: 5500 }
    );
    assert_eq!(s.parse_use_token(t.clone(), 200, br#"{"EVAL":null}"#).unwrap(), TokenUse::Unknown);
    assert!(percent_decode(&s.restore_token(&t).body).contains("U|0000000000000042|6000"));
}

#[test]
fn records_of_earlier_versions_compare_by_their_sha256_fingerprint() {
    // Before xxh3, a record held SHA-256's first 16 bytes, bare hex (no `x`).
    let c = cfg();
    let s = RedisStore::new(&c);
    let legacy = [7u8; 16];
    let reply = format!(r#"{{"SET":"T|0000000000000007|{}|1000|201"}}"#, "07".repeat(16));
    let found = s.parse_claim(&[1; 32], 200, reply.as_bytes()).unwrap();
    assert!(matches!(found, Claim::Completed { payload: Payload::Legacy(l), .. } if l == legacy), "{found:?}");
    // Settled by the request's own SHA-256 fingerprint, taken only now.
    let same = found.clone().resolve_legacy(|| Some(legacy));
    assert!(matches!(same, Claim::Completed { payload: Payload::Same, status: 201, .. }), "{same:?}");
    let other = found.clone().resolve_legacy(|| Some([8; 16]));
    assert!(matches!(other, Claim::Completed { payload: Payload::Different, .. }));
    assert!(matches!(found.resolve_legacy(|| None), Claim::Completed { payload: Payload::Different, .. }));
    // A record of this version is never taken for a legacy one: its fingerprint is compared as is.
    let mut taken = false;
    let now = format!(r#"{{"SET":"T|0000000000000007|x{}|1000|201"}}"#, "07".repeat(16));
    let found = s.parse_claim(&[1; 32], 200, now.as_bytes()).unwrap().resolve_legacy(|| {
        taken = true;
        Some(legacy)
    });
    assert!(matches!(found, Claim::Completed { payload: Payload::Different, .. }) && !taken);
}

#[test]
fn unknown_outcome_records_and_renewals_carry_the_claims_record() {
    let c = cfg();
    let s = RedisStore::new(&c);
    let (_, t) = s.claim(&[4; 32], &[1; 32], 9, 1000, 30_000);
    let note = HeldNote::new("create-order", Some("a|b"));
    let hold = percent_decode(&s.hold_unknown(&t, 3_600_000, 5000, 30_000, &note).body);
    let unknown = format!("U|0000000000000009|x{}|1000|3605000||create-order|a%7Cb", "01".repeat(16));
    assert!(hold.contains(&unknown), "{hold}");
    assert!(hold.contains(&t.record), "fenced by our in-flight record: {hold}");
    let reply = serde_json::json!({ "SET": unknown }).to_string();
    assert_eq!(
        s.parse_claim(&[1; 32], 200, reply.as_bytes()).unwrap(),
        Claim::Unknown { first_seen_ms: 1000, held_until_ms: 3_605_000, payload: Payload::Same, held: None }
    );
    assert_eq!(idem_filter::store::operator::held(&unknown).and_then(|h| h.note), Some(note));
    // What the scripts do with another owner's record is tested on a real Redis
    // (tests/redis_owner_checks.rs); here, only what they are given.
    let renew = percent_decode(&s.renew(&t, 30_000).body);
    assert!(renew.contains(&t.record) && renew.ends_with("/30000"), "{renew}");
}

#[test]
fn hash_slots_are_redis_clusters() {
    use idem_filter::store::redis::hash_slot;
    // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
    assert_eq!(hash_slot("123456789"), 0x31C3, "CRC16/XMODEM check value, below 16384");
    assert_eq!(hash_slot("foo"), 12182);
    assert_eq!(hash_slot("bar"), 5061);
    assert_eq!(hash_slot("{user1000}.following"), hash_slot("user1000"));
    assert_ne!(hash_slot("foo{}{bar}"), hash_slot("bar"), "an empty tag hashes the whole key");
}

/// Encoding copies runs of unreserved bytes whole: the same text as encoding byte by byte, for
/// text that slides runs across every kind of byte (ASCII punctuation, multi-byte characters,
/// runs at either end, nothing at all).
#[test]
fn percent_encoding_by_runs_is_byte_by_byte_encoding() {
    fn byte_by_byte(value: &str) -> String {
        value
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => char::from(b).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }
    let samples = ["", "a", "/", "订", "订a", "a订", "caf\u{e9}/x", "%41", "~_-.", "C|0f|x1+/=|12", "a b\r\nc", "😀😀"];
    for s in samples {
        let mut out = String::new();
        idem_filter::policy::percent_encode_into(&mut out, s);
        assert_eq!(out, byte_by_byte(s), "{s:?}");
    }
    let long: String = (0..3000u32).filter_map(char::from_u32).collect();
    let mut out = String::new();
    idem_filter::policy::percent_encode_into(&mut out, &long);
    assert_eq!(out, byte_by_byte(&long));
}
