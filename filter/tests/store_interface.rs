#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The one store interface ([`Store`]) on both stores: the shared store answers every operation
//! at once; Redis names the Webdis call whose reply answers it — unless the answer cache in
//! front of it already knows the key.

mod common;
use common::percent_decode;
use idem_filter::policy::{parse_bundle, SharedConfig};
use idem_filter::response::StoredResponse;
use idem_filter::store::operator::HeldNote;
use idem_filter::store::remote::Remote;
use idem_filter::store::shared::SharedStore;
use idem_filter::store::{Call, Claim, Payload, Step, Store, StoreError, StoreTicket, TokenUse, Write, Written};
use idem_filter::testing::FakeHost;

const NOW: u64 = 1_800_000_000_000;
const FP: [u8; 32] = [7; 32];

fn shared(host: &FakeHost) -> SharedStore {
    let cfg = SharedConfig { buckets: 4, entries_per_bucket: 8, max_response_bytes: 4096, namespace: None };
    let mut s = SharedStore::new(&cfg);
    s.initialise(host).unwrap();
    s
}

fn redis_cfg() -> idem_filter::policy::RedisConfig {
    parse_bundle("[redis]\ncluster = \"webdis\"\nprefix = \"t:\"\nanswer_cache = \"10s\"\n", "p")
        .unwrap()
        .redis
        .unwrap()
}

fn now<T: std::fmt::Debug>(step: Step<T>) -> Result<T, StoreError> {
    match step {
        Step::Now(r) => r,
        Step::Call(c) => panic!("expected an answer at once, got a call: {}", c.cmd.body),
    }
}

fn call<T: std::fmt::Debug>(step: Step<T>) -> Call {
    match step {
        Step::Call(c) => c,
        Step::Now(r) => panic!("expected a call, got an answer at once: {r:?}"),
    }
}

fn response() -> StoredResponse {
    StoredResponse::new(201, vec![("content-type".into(), b"application/json".to_vec())], b"{\"order\":1}".to_vec())
}

fn complete() -> Write {
    Write::Complete { response: response(), max_response_bytes: 4096, ttl_ms: 60_000 }
}

#[test]
fn the_shared_store_answers_every_operation_at_once() {
    let host = FakeHost::new(NOW);
    let s = shared(&host);
    let store: &dyn Store = &s;
    let t = match now(store.claim(&host, &[1; 32], &FP, 30_000, 60_000, NOW)).unwrap() {
        Claim::Claimed(t) => t,
        other => panic!("{other:?}"),
    };
    assert!(matches!(now(store.claim(&host, &[1; 32], &FP, 30_000, 60_000, NOW)), Ok(Claim::InFlight { .. })));
    assert_eq!(now(store.renew(&host, &t, 30_000)), Ok(true));
    assert_eq!(now(store.write(&host, &t, &complete(), 30_000, NOW)), Ok(Written::Applied));
    let found = now(store.claim(&host, &[1; 32], &FP, 30_000, 60_000, NOW)).unwrap();
    assert!(matches!(found, Claim::Completed { status: 201, payload: Payload::Same, .. }), "{found:?}");
    // A write fenced by a ticket that no longer holds the key (its lease ran out, another
    // request took the key over) writes nothing.
    let Claim::Claimed(late) = now(store.claim(&host, &[4; 32], &FP, 1_000, 60_000, NOW)).unwrap() else { panic!() };
    host.advance(2_000);
    assert!(matches!(now(store.claim(&host, &[4; 32], &FP, 30_000, 60_000, NOW)), Ok(Claim::Claimed(_))));
    assert_eq!(now(store.write(&host, &late, &Write::Release, 30_000, NOW)), Ok(Written::NotOurs));

    now(store.issue_token(&host, &[2; 32], 60_000, NOW)).unwrap();
    let used = now(store.use_token(&host, &[2; 32], NOW)).unwrap();
    let TokenUse::Consumed(token) = used else { panic!("{used:?}") };
    assert_eq!(now(store.write(&host, &token, &Write::RestoreToken, 30_000, NOW)), Ok(Written::Applied));

    // An unknown outcome: its lookup is taken once, and absent makes the key the repeat's claim.
    let Claim::Claimed(u) = now(store.claim(&host, &[3; 32], &FP, 30_000, 60_000, NOW)).unwrap() else { panic!() };
    let hold = Write::HoldUnknown { hold_ms: 86_400_000, note: HeldNote::new("r", Some("k3")) };
    assert_eq!(now(store.write(&host, &u, &hold, 30_000, NOW)), Ok(Written::Applied));
    let listed = s.held(&host).unwrap();
    let note = listed.iter().find_map(|h| h.note.clone());
    assert_eq!(note, Some(HeldNote::new("r", Some("k3"))), "the hold is listed for the operator with its note");
    let held = match now(store.claim(&host, &[3; 32], &FP, 30_000, 60_000, NOW)).unwrap() {
        Claim::Unknown { held: Some(h), .. } => h,
        other => panic!("{other:?}"),
    };
    let lookup = now(store.take_lookup(&host, &held, 5_000, NOW)).unwrap().expect("the lookup is ours");
    assert_eq!(now(store.take_lookup(&host, &held, 5_000, NOW)), Ok(None), "one lookup at a time");
    assert!(matches!(now(store.lookup_absent(&host, &lookup, 30_000, NOW)), Ok(Some(StoreTicket::Shared(_)))));
}

#[test]
fn a_ticket_of_the_other_store_is_an_error_not_a_write() {
    let host = FakeHost::new(NOW);
    let s = shared(&host);
    let cfg = redis_cfg();
    let remote = Remote::new(&cfg, &s);
    let redis_ticket = call(remote.claim(&host, &[1; 32], &FP, 30_000, 60_000, NOW)).ticket.unwrap();
    let wrong = StoreTicket::Redis(redis_ticket);
    assert!(matches!(now(Store::write(&s, &host, &wrong, &Write::Release, 30_000, NOW)), Err(StoreError::Host(_))));
    let Claim::Claimed(shared_ticket) = now(Store::claim(&s, &host, &[9; 32], &FP, 1, 1, NOW)).unwrap() else {
        panic!()
    };
    assert!(matches!(now(remote.renew(&host, &shared_ticket, 30_000)), Err(StoreError::Host(_))));
}

#[test]
fn redis_names_the_call_of_every_operation() {
    let host = FakeHost::new(NOW);
    let s = shared(&host);
    let cfg = redis_cfg();
    let store = Remote::new(&cfg, &s);
    let claim = call(store.claim(&host, &[0xab; 32], &FP, 30_000, 60_000, NOW));
    assert!(claim.cmd.body.starts_with("SET/t%3Ak%3Aabab") && claim.cmd.body.ends_with("/NX/PX/30000/GET"));
    let ticket = StoreTicket::Redis(claim.ticket.clone().expect("a claim's ticket"));
    assert!(call(store.renew(&host, &ticket, 30_000)).cmd.body.starts_with("EVAL/"));
    let done = call(store.write(&host, &ticket, &complete(), 30_000, NOW));
    assert!(done.cmd.step.is_some() && !done.tombstone, "a fenced write, batchable: {}", done.cmd.body);
    assert!(record_written(&done).starts_with("C|"), "{}", record_written(&done));
    let big = Write::Complete { response: response(), max_response_bytes: 4, ttl_ms: 60_000 };
    let tomb = call(store.write(&host, &ticket, &big, 30_000, NOW));
    assert!(tomb.tombstone && record_written(&tomb).starts_with("T|"), "over the limit: a tombstone");
    let hold = Write::HoldUnknown { hold_ms: 86_400_000, note: HeldNote::new("r", Some("k")) };
    assert!(record_written(&call(store.write(&host, &ticket, &hold, 30_000, NOW))).starts_with("U|"));
    assert!(call(store.issue_token(&host, &[5; 32], 60_000, NOW)).cmd.body.starts_with("SET/t%3At%3A"));
    assert!(call(store.use_token(&host, &[5; 32], NOW)).ticket.is_some());
}

#[test]
fn the_answer_cache_answers_redis_claims_it_knows_at_once() {
    let host = FakeHost::new(NOW);
    let s = shared(&host);
    let cfg = redis_cfg();
    let store = Remote::new(&cfg, &s);
    let claim = call(store.claim(&host, &[1; 32], &FP, 30_000, 60_000, NOW));
    let mine = claim.ticket.unwrap();
    // Redis answers the claim with this very request's completed record: kept here.
    let write = call(store.write(&host, &StoreTicket::Redis(mine.clone()), &complete(), 30_000, NOW));
    let record = record_written(&write);
    let found = store.claim_answered(&host, mine, &FP, Ok(serde_json::Value::String(record)), 60_000, NOW).unwrap();
    assert!(matches!(found, Claim::Completed { payload: Payload::Same, .. }));
    let again = now(store.claim(&host, &[1; 32], &FP, 30_000, 60_000, NOW)).unwrap();
    assert!(matches!(again, Claim::Completed { status: 201, payload: Payload::Same, .. }), "{again:?}");
    let other = now(store.claim(&host, &[1; 32], &[8; 32], 30_000, 60_000, NOW)).unwrap();
    assert!(matches!(other, Claim::Completed { payload: Payload::Different, .. }), "another body: {other:?}");

    // A key whose answer is still being written: neither claimed nor replayed.
    let mark = store.cache.mark_unwritten(&host, &[2; 32], NOW + 5_000).expect("marked");
    assert_eq!(
        now(store.claim(&host, &[2; 32], &FP, 30_000, 60_000, NOW)),
        Ok(Claim::Unwritten { first_seen_ms: NOW })
    );
    store.cache.unmark(&host, &mark);
    assert!(
        matches!(store.claim(&host, &[2; 32], &FP, 30_000, 60_000, NOW), Step::Call(_)),
        "unmarked: Redis decides again"
    );
}

/// The record a fenced write puts in place of the ticket's (`EVAL/script/1/key/old/new/…`).
fn record_written(c: &Call) -> String {
    let args: Vec<&str> = c.cmd.body.split('/').collect();
    percent_decode(args[5])
}
