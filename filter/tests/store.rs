#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The shared-data store against a fake host with Envoy's exact shared-data semantics.

use idem_filter::host::{Host, HostError};
use idem_filter::policy::SharedConfig;
use idem_filter::response::StoredResponse;
use idem_filter::store::shared::*;
use idem_filter::store::{Answer, Claim, Completion, Payload, StoreError, TokenUse};
use idem_filter::testing::FakeHost;
use sha2::{Digest, Sha256};
use std::sync::Arc;

fn id(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}
const FP: [u8; 32] = [7; 32];

fn store(buckets: u32, entries: u32) -> (FakeHost, SharedStore) {
    store_at(1_700_000_000_000, buckets, entries)
}

/// A store whose host's clock reads `now_ms`.
fn store_at(now_ms: u64, buckets: u32, entries: u32) -> (FakeHost, SharedStore) {
    let host = FakeHost::new(now_ms);
    let mut s = SharedStore::new(&SharedConfig {
        buckets,
        entries_per_bucket: entries,
        max_response_bytes: 4096,
        namespace: None,
    });
    assert_eq!(s.initialise(&host).unwrap(), buckets);
    (host, s)
}

fn ok_response(body: &str) -> StoredResponse {
    StoredResponse::new(201, vec![("content-type".into(), "application/json".into())], body.as_bytes().to_vec())
}

/// Runs `f(thread index)` on `n` threads released at the same instant (Envoy's workers sharing
/// one store).
fn race<T: Send + 'static>(n: usize, f: impl Fn(usize) -> T + Send + Sync + 'static) -> Vec<T> {
    let f = Arc::new(f);
    let barrier = Arc::new(std::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (f, barrier) = (f.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                f(i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

fn claimed(c: Claim<Ticket>) -> Ticket {
    match c {
        Claim::Claimed(t) => t,
        other => panic!("expected a claim, got {other:?}"),
    }
}

#[test]
fn fake_host_reproduces_envoy_shared_data() {
    let h = FakeHost::new(0);
    // CAS does not protect an absent key: the insert happens whatever CAS is passed.
    h.shared_set("k", b"1", Some(12345)).unwrap();
    let (v, cas1) = h.shared_get("k").unwrap().unwrap();
    assert_eq!(v, b"1");
    assert_eq!(h.shared_set("k", b"2", Some(cas1 + 1)), Err(HostError::CasMismatch));
    h.shared_set("k", b"2", Some(cas1)).unwrap();
    // One global counter: CAS values increase across keys.
    h.shared_set("other", b"x", None).unwrap();
    let (_, cas_other) = h.shared_get("other").unwrap().unwrap();
    let (_, cas2) = h.shared_get("k").unwrap().unwrap();
    assert!(cas_other > cas2 && cas2 > cas1);
    // Stale CAS after someone else wrote.
    assert_eq!(h.shared_set("k", b"3", Some(cas1)), Err(HostError::CasMismatch));
    // No delete: writing an empty value keeps the key.
    h.shared_set("k", b"", None).unwrap();
    assert_eq!(h.footprint().0, 2);
}

#[test]
fn initialise_creates_buckets_once() {
    let (host, mut s) = store(8, 4);
    assert_eq!(s.initialise(&host).unwrap(), 0, "existing buckets are kept");
    assert_eq!(host.footprint().0, 8 + 2, "8 buckets, the bucket secret and the store's shape");
}

/// A store keeps its shape for the life of the process (shared-data keys cannot be deleted):
/// another configuration of the namespace asking for other entries (a bucket rewritten would
/// lose the claims in flight) or another bucket count (a key would land in another bucket, where
/// its repeat finds nothing) refuses to load, naming the namespace and both shapes; the same
/// shape, or another namespace, loads, and nothing of the first store changed.
#[test]
fn a_store_of_another_shape_in_the_namespace_refuses_to_load() {
    let (host, s) = store(8, 4);
    let t = claimed(s.claim(&host, &id("in flight"), &FP, 30_000, 60_000).unwrap());
    let before = host.footprint();
    let shape = |buckets, entries, namespace: Option<&str>| {
        let cfg = SharedConfig {
            buckets,
            entries_per_bucket: entries,
            max_response_bytes: 1,
            namespace: namespace.map(str::to_string),
        };
        SharedStore::new(&cfg).initialise(&host)
    };
    for (buckets, entries) in [(8, 5), (16, 4), (4, 4)] {
        let e = shape(buckets, entries, None).expect_err("another shape must not load").to_string();
        assert!(e.contains("namespace default") && e.contains("8 buckets × 4 entries"), "{e}");
        assert!(e.contains(&format!("asks for {buckets} × {entries}")), "{e}");
    }
    assert_eq!(shape(8, 4, None).unwrap(), 0, "the same shape loads");
    assert_eq!(shape(16, 5, Some("other")).unwrap(), 16, "another namespace is another store");
    assert_eq!(host.footprint().0, before.0 + 16 + 2, "the first store untouched");
    assert!(matches!(s.claim(&host, &id("in flight"), &FP, 30_000, 60_000).unwrap(), Claim::InFlight { .. }));
    assert!(s.release(&host, &t).unwrap());
}

/// Two workers start together: each finds no secret, and the second stores its own between the
/// first's read and its write. Both must end with one secret — with two, one key would land in
/// two buckets and be claimed twice. (Envoy's shared data inserts an absent key whatever CAS is
/// passed, so "set if absent" alone would let the first overwrite the second's.)
const SECRET_KEY: &str = "idem:v1:default:secret";

/// A first worker initialising its store while a second one runs all the way through just before
/// the first's next write of the secret: the first worker's store, and the secret the second kept.
fn second_worker_before_the_next_secret_write(host: &Arc<FakeHost>, cfg: &SharedConfig) -> (SharedStore, [u8; 16]) {
    let seen_by_second = Arc::new(std::sync::Mutex::new(None));
    let (h, seen, c) = (Arc::clone(host), Arc::clone(&seen_by_second), cfg.clone());
    host.before_next_set(
        SECRET_KEY,
        Box::new(move || {
            let mut second = SharedStore::new(&c);
            second.initialise(&*h).unwrap();
            *seen.lock().unwrap() = Some(second.secret());
        }),
    );
    let mut first = SharedStore::new(cfg);
    first.initialise(&**host).unwrap();
    let second = seen_by_second.lock().unwrap().expect("the second worker ran before the first's write");
    (first, second)
}

#[test]
fn workers_starting_together_agree_on_one_secret() {
    let host = Arc::new(FakeHost::new(1_700_000_000_000));
    let cfg = SharedConfig { buckets: 64, entries_per_bucket: 8, max_response_bytes: 1, namespace: None };
    let (first, second) = second_worker_before_the_next_secret_write(&host, &cfg);
    assert_eq!(first.secret(), second, "two secrets in one namespace");
    assert_eq!(host.shared_get(SECRET_KEY).unwrap().map(|(v, _)| v), Some(second.to_vec()));
    let mut third = SharedStore::new(&cfg);
    third.initialise(&*host).unwrap();
    assert_eq!(third.secret(), second, "a later worker reads the same secret");
    for k in ["a", "b", "order-1", "order-2"] {
        assert_eq!(first.bucket_of(&id(k)), third.bucket_of(&id(k)));
    }
}

/// A secret of the wrong length (written by hand, or cut short) is replaced once, and kept.
#[test]
fn a_malformed_secret_is_replaced_once() {
    let host = FakeHost::new(1_700_000_000_000);
    host.shared_set("idem:v1:default:secret", b"short", None).unwrap();
    let cfg = SharedConfig { buckets: 4, entries_per_bucket: 4, max_response_bytes: 1, namespace: None };
    let mut a = SharedStore::new(&cfg);
    a.initialise(&host).unwrap();
    let mut b = SharedStore::new(&cfg);
    b.initialise(&host).unwrap();
    assert_eq!(a.secret(), b.secret());
    assert_ne!(a.secret(), [0; 16]);
}

/// Buckets an earlier version created carry no shape record: their length still tells
/// another entry count apart, and a store of the same entries gets its record.
#[test]
fn buckets_without_a_shape_record_are_checked_by_their_length() {
    let host = FakeHost::new(1_700_000_000_000);
    let bucket = |entries: usize| vec![0u8; entries * 60]; // 60 bytes an entry
    for b in 0..4 {
        host.shared_set(&format!("idem:v1:default:b:{b}"), &bucket(4), None).unwrap();
    }
    let cfg =
        |entries| SharedConfig { buckets: 4, entries_per_bucket: entries, max_response_bytes: 1, namespace: None };
    let e = SharedStore::new(&cfg(8)).initialise(&host).expect_err("another entry count").to_string();
    assert!(e.contains("? buckets × 4 entries") && e.contains("asks for 4 × 8"), "{e}");
    assert_eq!(SharedStore::new(&cfg(4)).initialise(&host).unwrap(), 0);
    assert_eq!(host.shared_get("idem:v1:default:shape").unwrap().map(|(v, _)| v), Some(b"4x4".to_vec()));
}

#[test]
fn claim_complete_replay() {
    let (host, s) = store(4, 4);
    let t = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    match s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap() {
        Claim::InFlight { payload: Payload::Same, first_seen_ms, lease_ends_ms } => {
            assert_eq!(first_seen_ms, host.now_ms());
            assert_eq!(lease_ends_ms, host.now_ms() + 30_000);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.complete(&host, &t, &ok_response("{\"id\":1}"), 4096, 60_000).unwrap(), Completion::Stored);
    host.advance(1000);
    match s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap() {
        Claim::Completed { status: 201, response: Some(r), payload: Payload::Same, first_seen_ms } => {
            assert_eq!(r.body, b"{\"id\":1}");
            assert_eq!(r.headers, vec![("content-type".to_string(), b"application/json".to_vec())]);
            assert_eq!(first_seen_ms, t.first_seen_ms);
        }
        other => panic!("{other:?}"),
    }
    // A different payload under the same key is reported as such.
    assert!(matches!(
        s.claim(&host, &id("a"), &[1; 32], 30_000, 60_000).unwrap(),
        Claim::Completed { payload: Payload::Different, .. }
    ));
    // After the ttl the key is free again.
    host.advance(60_000);
    claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
}

#[test]
fn release_lets_a_retry_run() {
    let (host, s) = store(4, 4);
    let t = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    assert!(s.release(&host, &t).unwrap());
    let t2 = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    assert_ne!(t.owner, t2.owner);
    // The old ticket can neither release the new claim nor make it look completed.
    assert!(!s.release(&host, &t).unwrap());
    let _ = s.complete(&host, &t, &ok_response("x"), 4096, 1000);
    assert!(matches!(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap(), Claim::InFlight { .. }));
}

#[test]
fn expired_lease_is_taken_over_and_the_late_owner_is_fenced() {
    let (host, s) = store(1, 4);
    let first = claimed(s.claim(&host, &id("a"), &FP, 100, 60_000).unwrap());
    host.advance(150);
    taken_over_and_fenced(&host, &s, "a", &first);
}

/// `first`, a claim of `key` whose lease has ended: a new request takes the key over, `first`'s
/// late completion must not overwrite the new owner's record, and the new owner's answer is the
/// one replayed.
fn taken_over_and_fenced(host: &FakeHost, s: &SharedStore, key: &str, first: &Ticket) {
    let second = claimed(s.claim(host, &id(key), &FP, 30_000, 60_000).unwrap());
    assert_eq!(s.complete(host, first, &ok_response("late"), 4096, 60_000).unwrap(), Completion::LostOwnership);
    assert!(matches!(s.claim(host, &id(key), &FP, 30_000, 60_000).unwrap(), Claim::InFlight { .. }));
    assert_eq!(s.complete(host, &second, &ok_response("second"), 4096, 60_000).unwrap(), Completion::Stored);
    match s.claim(host, &id(key), &FP, 30_000, 60_000).unwrap() {
        Claim::Completed { response: Some(r), .. } => assert_eq!(r.body, b"second"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn oversized_response_becomes_a_tombstone() {
    let (host, s) = store(4, 4);
    let t = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    let big = ok_response(&"x".repeat(5000));
    assert_eq!(s.complete(&host, &t, &big, 4096, 60_000).unwrap(), Completion::Tombstoned);
    assert!(matches!(
        s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap(),
        Claim::Completed { status: 201, response: None, .. }
    ));
}

#[test]
fn full_bucket_evicts_completed_never_in_flight() {
    let (host, s) = store(1, 2);
    let a = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    host.advance(1);
    let _b = claimed(s.claim(&host, &id("b"), &FP, 30_000, 60_000).unwrap());
    assert_eq!(s.claim(&host, &id("c"), &FP, 30_000, 60_000), Err(StoreError::Full));
    // What fills it is logged: both claims in flight, their slots without an answer.
    let census = host.logs().into_iter().map(|(_, l)| l).filter(|l| l.contains("bucket 0 full")).collect::<Vec<_>>();
    assert_eq!(census.len(), 1, "{census:?}");
    assert!(census[0].contains("(2 entries): 2 claims whose slot holds no answer yet, 0 claims inside"), "{census:?}");
    s.complete(&host, &a, &ok_response("a"), 4096, 60_000).unwrap();
    claimed(s.claim(&host, &id("c"), &FP, 30_000, 60_000).unwrap());
    // "b" is still in flight inside its lease: never evicted.
    assert!(matches!(s.claim(&host, &id("b"), &FP, 30_000, 60_000).unwrap(), Claim::InFlight { .. }));
    // Once leases end, new keys can take the positions.
    host.advance(30_001);
    claimed(s.claim(&host, &id("d"), &FP, 30_000, 60_000).unwrap());
}

#[test]
fn memory_stays_bounded_by_capacity_whatever_the_number_of_keys() {
    let (host, s) = store(64, 8);
    let body = "y".repeat(200);
    let mut after_first_pass = None;
    for i in 0..100_000u32 {
        let t = claimed(s.claim(&host, &id(&i.to_string()), &FP, 30_000, 60_000).unwrap());
        s.complete(&host, &t, &ok_response(&body), 4096, 86_400_000).unwrap();
        if i == 10_000 {
            after_first_pass = Some(host.footprint());
        }
    }
    let (keys, bytes) = host.footprint();
    assert!(keys <= 2 + 64 + 64 * 8, "{keys} keys");
    assert_eq!(Some((keys, bytes)), after_first_pass, "no growth between 10k and 100k keys");
}

/// A claim, tried again while it gives up as `Contended` (its bounded CAS retries ran out on a
/// starved thread), as a client retries a 503.
fn claim_retrying(s: &SharedStore, host: &dyn Host, key: &[u8; 32]) -> Result<Claim<Ticket>, StoreError> {
    let mut last = Err(StoreError::Contended);
    for _ in 0..100 {
        last = s.claim(host, key, &FP, 30_000, 60_000);
        if !matches!(last, Err(StoreError::Contended)) {
            break;
        }
    }
    last
}

#[test]
fn concurrent_claims_of_one_key_have_exactly_one_winner() {
    let (host, s) = store(16, 8);
    let host = Arc::new(host);
    let s = Arc::new(s);
    for round in 0..50 {
        let key = id(&format!("k{round}"));
        let (host, s) = (host.clone(), s.clone());
        let results = race(8, move |_| claim_retrying(&s, &*host, &key).unwrap());
        let winners = results.iter().filter(|c| matches!(c, Claim::Claimed(_))).count();
        let in_flight = results.iter().filter(|c| matches!(c, Claim::InFlight { .. })).count();
        assert_eq!((winners, in_flight), (1, 7), "round {round}: {results:?}");
    }
}

#[test]
fn concurrent_distinct_keys_in_one_bucket_all_succeed() {
    // One bucket: every claim contends on the same CAS, and none may be lost. A claim may give
    // up as `Contended` after its bounded CAS retries (by design, on a starved thread); the
    // client retries then, as a caller does on 503, and must get its key.
    let (host, s) = store(1, 64);
    let host = Arc::new(host);
    let s = Arc::new(s);
    let (h, st) = (host.clone(), s.clone());
    let total: usize = race(8, move |t| {
        (0..8).filter(|i| matches!(claim_retrying(&st, &*h, &id(&format!("{t}-{i}"))), Ok(Claim::Claimed(_)))).count()
    })
    .into_iter()
    .sum();
    assert_eq!(total, 64);
    for t in 0..8 {
        for i in 0..8 {
            assert!(matches!(
                s.claim(&*host, &id(&format!("{t}-{i}")), &FP, 30_000, 60_000).unwrap(),
                Claim::InFlight { .. }
            ));
        }
    }
}

#[test]
fn store_outage_is_an_error_not_a_claim() {
    let (host, s) = store(4, 4);
    host.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(s.claim(&host, &id("a"), &FP, 30_000, 60_000), Err(StoreError::Host(_))));
}

#[test]
fn stored_response_round_trips_and_drops_unsafe_headers() {
    let r = StoredResponse::new(
        200,
        vec![
            ("content-type".into(), "text/plain; charset=utf-8".into()),
            ("set-cookie".into(), "sid=secret".into()),
            ("Connection".into(), "keep-alive, x-hop".into()),
            ("x-hop".into(), "1".into()),
            ("transfer-encoding".into(), "chunked".into()),
            ("content-length".into(), "3".into()),
            ("date".into(), "Sun".into()),
            ("x-envoy-upstream-service-time".into(), "3".into()),
            ("x-order-id".into(), "订单-1".into()),
        ],
        vec![0, 255, 10],
    );
    let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, vec!["content-type", "x-order-id"]);
    let mut buf = Vec::new();
    r.encode_into(&mut buf);
    assert_eq!(buf.len(), r.encoded_len());
    assert_eq!(StoredResponse::decode(&buf).unwrap(), r);
    assert!(StoredResponse::decode(&buf[..3]).is_none());
    let replay = r.replay();
    assert!(replay.headers.contains(&("idempotent-replayed".into(), "true".into())));
}

#[test]
fn tokens_are_used_once_and_restored_by_their_user_only() {
    let (host, s) = store(4, 4);
    s.issue_token(&host, &id("tok"), 60_000).unwrap();
    let t = match s.use_token(&host, &id("tok")).unwrap() {
        TokenUse::Consumed(t) => t,
        other => panic!("{other:?}"),
    };
    host.advance(5);
    assert_eq!(s.use_token(&host, &id("tok")).unwrap(), TokenUse::Used { used_at_ms: t.first_seen_ms });
    assert_eq!(s.use_token(&host, &id("never-issued")).unwrap(), TokenUse::Unknown);
    assert!(s.restore_token(&host, &t).unwrap());
    assert!(!s.restore_token(&host, &t).unwrap(), "a restore is fenced like a release");
    assert!(matches!(s.use_token(&host, &id("tok")).unwrap(), TokenUse::Consumed(_)));
    // Expired tokens are unknown.
    s.issue_token(&host, &id("short"), 100).unwrap();
    host.advance(101);
    assert_eq!(s.use_token(&host, &id("short")).unwrap(), TokenUse::Unknown);
}

#[test]
fn concurrent_presentations_of_one_token_consume_it_once() {
    let (host, s) = store(8, 8);
    let host = Arc::new(host);
    let s = Arc::new(s);
    for round in 0..30 {
        let tok = id(&format!("t{round}"));
        s.issue_token(&*host, &tok, 60_000).unwrap();
        let (host, s) = (host.clone(), s.clone());
        let results = race(8, move |_| s.use_token(&*host, &tok).unwrap());
        let consumed = results.iter().filter(|u| matches!(u, TokenUse::Consumed(_))).count();
        let used = results.iter().filter(|u| matches!(u, TokenUse::Used { .. })).count();
        assert_eq!((consumed, used), (1, 7), "round {round}");
    }
}

#[test]
fn ten_thousand_tokens_stay_within_capacity() {
    let (host, s) = store(32, 8);
    let before = host.footprint();
    for i in 0..10_000u32 {
        s.issue_token(&host, &id(&format!("tok-{i}")), 600_000).unwrap();
    }
    assert_eq!(host.footprint(), before, "tokens live inside the fixed buckets");
    // The newest tokens are still valid; the oldest were evicted for them.
    assert!(matches!(s.use_token(&host, &id("tok-9999")).unwrap(), TokenUse::Consumed(_)));
    assert_eq!(s.use_token(&host, &id("tok-0")).unwrap(), TokenUse::Unknown);
}

#[test]
fn a_client_cannot_aim_its_keys_at_one_bucket() {
    // An attacker who can compute the bucket of a key picks 9 keys of one bucket (8 entries) and
    // abandons their requests: the bucket is full of in-flight claims and every caller whose key
    // lands there gets 503 for lock_ttl. The bucket index is keyed by a per-process secret, so
    // keys that collide in one Envoy process (found by trying them there) spread out in another.
    let (host, s) = store(64, 8);
    let other_host = FakeHost::new(1_000);
    let _ = other_host.random_u64(); // another process draws another secret
    let mut other = SharedStore::new(&SharedConfig {
        buckets: 64,
        entries_per_bucket: 8,
        max_response_bytes: 4096,
        namespace: None,
    });
    other.initialise(&other_host).unwrap();

    let target = s.bucket_of(&id("victim"));
    let colliding: Vec<[u8; 32]> =
        (0..).map(|i| id(&format!("attacker-{i}"))).filter(|k| s.bucket_of(k) == target).take(9).collect();
    for k in &colliding[..8] {
        claimed(s.claim(&host, k, &FP, 60_000, 60_000).unwrap());
    }
    assert_eq!(s.claim(&host, &colliding[8], &FP, 60_000, 60_000), Err(StoreError::Full), "aimed keys fill a bucket");
    assert_eq!(s.claim(&host, &id("victim"), &FP, 60_000, 60_000), Err(StoreError::Full), "and lock its callers out");

    let spread: std::collections::HashSet<u32> = colliding.iter().map(|k| other.bucket_of(k)).collect();
    assert!(spread.len() >= 6, "the same keys land in {} buckets elsewhere", spread.len());
    for k in &colliding {
        claimed(other.claim(&other_host, k, &FP, 60_000, 60_000).unwrap());
    }
    claimed(other.claim(&other_host, &id("victim"), &FP, 60_000, 60_000).unwrap());
}

#[test]
fn a_renewed_lease_is_not_taken_over_and_a_lost_one_cannot_be_renewed() {
    let (host, s) = store(4, 4);
    let t = claimed(s.claim(&host, &id("slow"), &FP, 1_000, 60_000).unwrap());
    host.advance(900);
    assert!(s.renew(&host, &t, 1_000).unwrap());
    host.advance(900); // 1.8 s after the claim: past the first lease, inside the renewed one
    assert!(matches!(s.claim(&host, &id("slow"), &FP, 1_000, 60_000).unwrap(), Claim::InFlight { .. }));
    assert!(matches!(
        s.lookup(&host, &id("slow"), &FP).unwrap(),
        Some(Claim::InFlight { first_seen_ms: 1_700_000_000_000, .. })
    ));
    // Not renewed (the gateway died): taken over, and the old ticket cannot renew any more.
    host.advance(1_100);
    let _new = claimed(s.claim(&host, &id("slow"), &FP, 1_000, 60_000).unwrap());
    assert!(!s.renew(&host, &t, 1_000).unwrap());
    assert_eq!(s.complete(&host, &t, &ok_response("{}"), 4096, 60_000).unwrap(), Completion::LostOwnership);
}

#[test]
fn an_unknown_outcome_is_held_past_the_lease_then_freed() {
    let (host, s) = store(4, 4);
    let t = claimed(s.claim(&host, &id("gone"), &FP, 1_000, 60_000).unwrap());
    assert!(s.hold_unknown(&host, &t, 60_000).unwrap());
    host.advance(5_000);
    assert!(matches!(
        s.claim(&host, &id("gone"), &FP, 1_000, 60_000).unwrap(),
        Claim::Unknown { held_until_ms, payload: Payload::Same, .. } if held_until_ms == 1_700_000_060_000
    ));
    assert!(matches!(s.lookup(&host, &id("gone"), &FP).unwrap(), Some(Claim::Unknown { .. })));
    host.advance(55_001);
    claimed(s.claim(&host, &id("gone"), &FP, 1_000, 60_000).unwrap());
}

#[test]
fn a_remembered_answer_is_looked_up_read_only_until_it_expires() {
    let (host, s) = store(4, 4);
    fn answer(first_seen_ms: u64, response: Option<&StoredResponse>) -> Answer<'_> {
        Answer { fingerprint: [7; 16], first_seen_ms, status: 201, response }
    }
    assert_eq!(s.lookup(&host, &id("copy"), &FP).unwrap(), None, "nothing yet, and nothing claimed by looking");
    assert_eq!(s.lookup(&host, &id("copy"), &FP).unwrap(), None);
    let r = ok_response(r#"{"order":1}"#);
    let until = 1_700_000_010_000;
    assert!(s.remember(&host, &id("copy"), &answer(1_699_999_999_000, Some(&r)), until).unwrap());
    match s.lookup(&host, &id("copy"), &FP).unwrap() {
        Some(Claim::Completed { status: 201, response: Some(got), payload: Payload::Same, first_seen_ms }) => {
            assert_eq!((got, first_seen_ms), (r.clone(), 1_699_999_999_000));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        s.lookup(&host, &id("copy"), &[9; 32]).unwrap(),
        Some(Claim::Completed { payload: Payload::Different, .. })
    ));
    // Remembered again (another copy read back): one entry, the latest.
    assert!(s.remember(&host, &id("copy"), &answer(1_699_999_999_000, None), until).unwrap());
    assert!(matches!(s.lookup(&host, &id("copy"), &FP).unwrap(), Some(Claim::Completed { response: None, .. })));
    host.advance(10_001);
    assert_eq!(s.lookup(&host, &id("copy"), &FP).unwrap(), None, "expired");
    // A bucket whose every entry is in flight keeps its claims: the copy is not kept.
    let (host, s) = store(1, 2);
    claimed(s.claim(&host, &id("a"), &FP, 60_000, 60_000).unwrap());
    claimed(s.claim(&host, &id("b"), &FP, 60_000, 60_000).unwrap());
    assert!(!s.remember(&host, &id("c"), &answer(0, Some(&r)), until).unwrap());
    assert!(matches!(s.claim(&host, &id("a"), &FP, 60_000, 60_000).unwrap(), Claim::InFlight { .. }));
}

/// Two idem plugins in one Envoy without a `vm_id` share Envoy's shared data: each keeps to its
/// namespace, so a key claimed by one is unknown to the other.
#[test]
fn two_namespaces_in_one_shared_data_never_see_each_other() {
    let host = FakeHost::new(1_700_000_000_000);
    let cfg = |ns: &str| SharedConfig {
        buckets: 8,
        entries_per_bucket: 4,
        max_response_bytes: 4096,
        namespace: Some(ns.into()),
    };
    let mut a = SharedStore::new(&cfg("istio-system.idem-a"));
    let mut b = SharedStore::new(&cfg("istio-system.idem-b"));
    assert_eq!(a.initialise(&host).unwrap(), 8);
    assert_eq!(b.initialise(&host).unwrap(), 8, "b's buckets are its own, not a's");
    claimed(a.claim(&host, &id("k"), &FP, 30_000, 60_000).unwrap());
    claimed(b.claim(&host, &id("k"), &FP, 30_000, 60_000).unwrap());
    assert!(matches!(a.claim(&host, &id("k"), &FP, 30_000, 60_000).unwrap(), Claim::InFlight { .. }));
}

#[test]
fn entries_of_earlier_versions_compare_by_their_sha256_fingerprint() {
    let (host, s) = store(1, 4);
    let t = claimed(s.claim(&host, &id("old"), &FP, 30_000, 60_000).unwrap());
    assert_eq!(s.complete(&host, &t, &ok_response("{}"), 4096, 60_000).unwrap(), Completion::Stored);
    let (bucket, _) = host.shared_get("idem:v1:default:b:0").unwrap().unwrap();
    let at = bucket.chunks(60).position(|e| e[16] != 0).unwrap() * 60;
    assert_eq!(bucket[at + 17], 2, "this version marks its layout");
    // Make it the entry an earlier version wrote: layout byte 0, SHA-256's first 16 bytes.
    s.rewrite_as_earlier_version(&host, 0, [5; 16]);
    let found = s.claim(&host, &id("old"), &FP, 30_000, 60_000).unwrap();
    assert!(matches!(found, Claim::Completed { payload: Payload::Legacy(l), .. } if l == [5; 16]), "{found:?}");
    assert!(matches!(found.resolve_legacy(|| Some([5; 16])), Claim::Completed { payload: Payload::Same, .. }));
}

/// Entries the version before slot completions wrote (layout byte 1: a 16-byte xxh3 fingerprint,
/// the lease's end in `until`, the answer after the owner in the slot) read as they did: a
/// completed one replays (its whole fingerprint compared), an in-flight one is in flight until
/// its lease ends and is taken over after, and its old owner's late completion is fenced off.
#[test]
fn entries_of_the_version_before_slot_completions_read_across_the_upgrade() {
    let (host, s) = store(1, 4);
    let mut fp16 = [0u8; 16];
    fp16.copy_from_slice(&FP[..16]);
    let done = claimed(s.claim(&host, &id("done"), &FP, 30_000, 60_000).unwrap());
    s.complete(&host, &done, &ok_response("kept"), 4096, 60_000).unwrap();
    let running = claimed(s.claim(&host, &id("running"), &FP, 5_000, 60_000).unwrap());
    s.rewrite_as_earlier_version(&host, 1, fp16);
    let (bucket, _) = host.shared_get("idem:v1:default:b:0").unwrap().unwrap();
    assert!(bucket.chunks(60).filter(|e| e[16] != 0).all(|e| e[17] == 1), "both entries are of the older layout");

    match s.claim(&host, &id("done"), &FP, 30_000, 60_000).unwrap() {
        Claim::Completed { response: Some(r), payload: Payload::Same, .. } => assert_eq!(r.body, b"kept"),
        other => panic!("{other:?}"),
    }
    // The last 4 bytes of the fingerprint still count in the older layout.
    let mut near = FP;
    near[15] ^= 1;
    assert!(matches!(
        s.claim(&host, &id("done"), &near, 30_000, 60_000).unwrap(),
        Claim::Completed { payload: Payload::Different, .. }
    ));
    assert!(matches!(s.claim(&host, &id("running"), &FP, 30_000, 60_000).unwrap(), Claim::InFlight { .. }));
    host.advance(5_001);
    taken_over_and_fenced(&host, &s, "running", &running);
}

/// A claim with its lease well ahead completes through its response slot alone: one shared-data
/// write, no bucket read or write (the bucket's CAS does not move), and every reader takes the
/// entry as completed; a tombstone too. Its entry keeps 12 bytes of the fingerprint.
#[test]
fn a_completion_inside_its_lease_writes_its_slot_alone() {
    let (host, s) = store(1, 4);
    let t = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    let (_, cas) = host.shared_get("idem:v1:default:b:0").unwrap().unwrap();
    let counting = idem_filter::testing::CountingHost::new(&host);
    assert_eq!(s.complete(&counting, &t, &ok_response("once"), 4096, 60_000).unwrap(), Completion::Stored);
    let calls: Vec<(&str, u64)> = counting.take().into_iter().map(|(name, n, _)| (name, n)).collect();
    assert!(calls.contains(&("set_shared_data", 1)), "{calls:?}");
    assert!(!calls.iter().any(|(name, _)| *name == "get_shared_data"), "{calls:?}");
    assert_eq!(host.shared_get("idem:v1:default:b:0").unwrap().unwrap().1, cas, "the bucket is untouched");
    match s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap() {
        Claim::Completed { status: 201, response: Some(r), payload: Payload::Same, .. } => assert_eq!(r.body, b"once"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(s.lookup(&host, &id("a"), &FP).unwrap(), Some(Claim::Completed { .. })));
    // Another body: the 12 bytes kept tell it apart.
    let mut other = FP;
    other[3] ^= 1;
    assert!(matches!(
        s.claim(&host, &id("a"), &other, 30_000, 60_000).unwrap(),
        Claim::Completed { payload: Payload::Different, .. }
    ));

    let big = claimed(s.claim(&host, &id("big"), &FP, 30_000, 60_000).unwrap());
    assert_eq!(s.complete(&host, &big, &ok_response(&"x".repeat(5000)), 4096, 60_000).unwrap(), Completion::Tombstoned);
    assert!(matches!(
        s.claim(&host, &id("big"), &FP, 30_000, 60_000).unwrap(),
        Claim::Completed { status: 201, response: None, .. }
    ));
}

/// An earlier version, serving beside this one during a drain, reads a response slot as the owner
/// then a response. In a slot this version wrote it finds none (as a slot being rewritten: in
/// flight), never a wrong response — even for an expiry whose low bytes are zero, which without
/// the record's mark would read as an answer with no headers.
#[test]
fn an_earlier_version_finds_no_answer_in_a_slot_of_this_one() {
    const TTL: u64 = 60_000;
    let expires = (1_700_000_000_000u64 >> 24).saturating_add(1) << 24;
    let (host, s) = store_at(expires - TTL, 1, 4);
    let t = claimed(s.claim(&host, &id("a"), &FP, 30_000, TTL).unwrap());
    assert_eq!(s.complete(&host, &t, &ok_response("{}"), 4096, TTL).unwrap(), Completion::Stored);
    let (slot, _) = host.shared_get("idem:v1:default:r:0:0").unwrap().unwrap();
    assert_eq!(slot[..8], t.owner.to_le_bytes());
    assert_eq!(StoredResponse::decode(&slot[8..]), None, "an earlier version decodes a response: {slot:?}");
    assert!(matches!(s.claim(&host, &id("a"), &FP, 30_000, TTL).unwrap(), Claim::Completed { .. }));
}

/// An answer completed through its slot lives as long as the route's `ttl` from its completion,
/// not as long as the bound its entry carries: after it, the key runs again.
#[test]
fn an_answer_completed_through_its_slot_expires_with_its_ttl() {
    let (host, s) = store(1, 4);
    let t = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    host.advance(10_000);
    s.complete(&host, &t, &ok_response("a"), 4096, 60_000).unwrap();
    host.advance(59_999);
    assert!(matches!(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap(), Claim::Completed { .. }));
    assert!(s.lookup(&host, &id("a"), &FP).unwrap().is_some());
    host.advance(1);
    assert!(s.lookup(&host, &id("a"), &FP).unwrap().is_none());
    claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
}

/// A claim near the end of its lease (renewed past it, or slow) completes through the bucket,
/// checked against the owner there: a claim taken over meanwhile is never overwritten.
#[test]
fn a_completion_near_its_lease_end_goes_through_the_bucket() {
    let (host, s) = store(1, 4);
    let t = claimed(s.claim(&host, &id("slow"), &FP, 3_000, 60_000).unwrap());
    host.advance(2_500);
    assert!(s.renew(&host, &t, 3_000).unwrap());
    host.advance(2_500);
    let (_, cas) = host.shared_get("idem:v1:default:b:0").unwrap().unwrap();
    assert_eq!(s.complete(&host, &t, &ok_response("slow"), 4096, 60_000).unwrap(), Completion::Stored);
    assert_ne!(host.shared_get("idem:v1:default:b:0").unwrap().unwrap().1, cas, "written through the bucket");
    match s.claim(&host, &id("slow"), &FP, 3_000, 60_000).unwrap() {
        Claim::Completed { response: Some(r), .. } => assert_eq!(r.body, b"slow"),
        other => panic!("{other:?}"),
    }
    // The renewal moved the answer's bound with the lease: it is kept its whole ttl.
    host.advance(59_999);
    assert!(matches!(s.claim(&host, &id("slow"), &FP, 3_000, 60_000).unwrap(), Claim::Completed { .. }));
}

/// A renewed lease moves the bound on its entry's life with it: a route whose `ttl` is shorter
/// than the renewed lease never sees its claim taken over or evicted while the request runs.
#[test]
fn a_renewed_claim_outlives_a_short_ttl() {
    let (host, s) = store(1, 1);
    let t = claimed(s.claim(&host, &id("slow"), &FP, 3_000, 100).unwrap());
    host.advance(2_500);
    assert!(s.renew(&host, &t, 3_000).unwrap());
    host.advance(1_000);
    assert!(matches!(s.claim(&host, &id("slow"), &FP, 3_000, 100).unwrap(), Claim::InFlight { .. }));
    assert_eq!(s.claim(&host, &id("other"), &FP, 3_000, 100), Err(StoreError::Full));
}

/// A bucket turned over faster than the lease (every entry claimed less than `lock_ttl` ago)
/// still takes new keys: the oldest entry that completed through its slot gives way; one still
/// in flight never does.
#[test]
fn a_bucket_full_of_fresh_completions_gives_way_to_new_keys() {
    let (host, s) = store(1, 3);
    let a = claimed(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap());
    host.advance(1);
    let b = claimed(s.claim(&host, &id("b"), &FP, 30_000, 60_000).unwrap());
    host.advance(1);
    let _c = claimed(s.claim(&host, &id("c"), &FP, 30_000, 60_000).unwrap());
    s.complete(&host, &b, &ok_response("b"), 4096, 60_000).unwrap();
    claimed(s.claim(&host, &id("d"), &FP, 30_000, 60_000).unwrap());
    assert!(matches!(s.claim(&host, &id("a"), &FP, 30_000, 60_000).unwrap(), Claim::InFlight { .. }), "a stays");
    assert!(s.lookup(&host, &id("b"), &FP).unwrap().is_none(), "b gave way");
    assert_eq!(s.claim(&host, &id("e"), &FP, 30_000, 60_000), Err(StoreError::Full));
    s.complete(&host, &a, &ok_response("a"), 4096, 60_000).unwrap();
    claimed(s.claim(&host, &id("e"), &FP, 30_000, 60_000).unwrap());
}

// ---- gRPC replay slots (issue 35): allocated, never drawn at random

mod replay_slots {
    use idem_filter::response::StoredResponse;
    use idem_filter::store::replay::{ReplaySlots, SLOTS, STALE_MS};
    use idem_filter::store::StoreError;
    use idem_filter::testing::FakeHost;
    use std::collections::HashSet;
    use std::sync::Arc;

    fn answer(n: u64) -> StoredResponse {
        StoredResponse { status: 200, headers: vec![], body: n.to_string().into_bytes(), trailers: vec![] }
    }

    #[test]
    fn every_replay_in_flight_has_its_own_slot_until_the_pool_is_full() {
        let host = FakeHost::new(1_800_000_000_000);
        // Two workers' pools over one shared data, as two VMs of one Envoy.
        let (a, b) = (ReplaySlots::new("ns"), ReplaySlots::new("ns"));
        let mut tokens = Vec::new();
        for n in 0..SLOTS {
            let pool = if n % 2 == 0 { &a } else { &b };
            tokens.push((n, pool.put(&host, &answer(n)).unwrap()));
        }
        let slots: HashSet<&str> = tokens.iter().map(|(_, t)| t.split('.').next().unwrap()).collect();
        assert_eq!(slots.len() as u64, SLOTS, "no two replays share a slot");
        assert_eq!(a.put(&host, &answer(999)), Err(StoreError::Full), "a full pool says so");
        // Each echo takes exactly its own answer, once.
        for (n, token) in &tokens {
            assert_eq!(b.take(&host, token).unwrap().body, n.to_string().into_bytes());
            assert!(a.take(&host, token).is_none(), "a token is used once");
        }
        // Emptied slots are free again.
        let again = a.put(&host, &answer(7)).unwrap();
        assert_eq!(a.take(&host, &again).unwrap().body, b"7");
    }

    /// Another worker puts a fresh answer in the one free slot between this worker's read of it
    /// and its write: the slot stays the other's (its answer survives, its echo gets it), and this
    /// put finds no other free slot — a retryable error, never a slot shared by two replays.
    #[test]
    fn a_slot_another_worker_takes_between_the_read_and_the_write_stays_its_own() {
        let host = Arc::new(FakeHost::new(1_800_000_000_000));
        let pool = ReplaySlots::new("ns");
        let tokens: Vec<String> = (0..SLOTS).map(|n| pool.put(&*host, &answer(n)).unwrap()).collect();
        // One slot is free again: the only one either worker can take.
        let freed = &tokens[7];
        assert!(pool.take(&*host, freed).is_some());
        let slot = freed.split('.').next().unwrap();
        let other = Arc::new(std::sync::Mutex::new(None));
        let (h, o) = (Arc::clone(&host), Arc::clone(&other));
        host.before_next_set(
            &format!("idem:v1:ns:replay:{slot}"),
            Box::new(move || {
                let second_worker = ReplaySlots::new("ns");
                *o.lock().unwrap() = Some(second_worker.put(&*h, &answer(4242)).unwrap());
            }),
        );
        assert_eq!(pool.put(&*host, &answer(1)), Err(StoreError::Full), "the slot was taken meanwhile");
        let theirs = other.lock().unwrap().clone().expect("the other worker put its answer in between");
        assert_eq!(theirs.split('.').next(), Some(slot));
        assert_eq!(pool.take(&*host, &theirs).unwrap().body, b"4242", "the other worker's answer survives");
    }

    #[test]
    fn a_slot_whose_echo_never_came_is_free_again_after_a_while() {
        let host = FakeHost::new(1_800_000_000_000);
        let pool = ReplaySlots::new("ns");
        let first: Vec<String> = (0..SLOTS).map(|n| pool.put(&host, &answer(n)).unwrap()).collect();
        assert_eq!(pool.put(&host, &answer(0)), Err(StoreError::Full));
        host.advance(STALE_MS);
        let late = pool.put(&host, &answer(1000)).unwrap();
        // The stale slot's old token reads as gone, never as the new answer.
        let reused = first.iter().find(|t| t.split('.').next() == late.split('.').next()).unwrap();
        assert!(pool.take(&host, reused).is_none());
        assert_eq!(pool.take(&host, &late).unwrap().body, b"1000");
    }
}

/// A placeholder (or a malformed secret) is already stored, and a second worker runs all the
/// way through between the first worker's read and its swap: the swap must fail on the changed
/// version, and the first reads the second's secret — one secret, one bucket per key.
#[test]
fn a_worker_that_swaps_in_its_secret_after_another_did_reads_the_others() {
    for stored in [&b"-"[..], &b"short"[..]] {
        let host = Arc::new(FakeHost::new(1_700_000_000_000));
        host.shared_set(SECRET_KEY, stored, None).unwrap();
        let cfg = SharedConfig { buckets: 64, entries_per_bucket: 8, max_response_bytes: 1, namespace: None };
        let (first, second) = second_worker_before_the_next_secret_write(&host, &cfg);
        assert_eq!(first.secret(), second, "two secrets in one namespace (stored {stored:?})");
        let kept = host.shared_get(SECRET_KEY).unwrap().map(|(v, _)| v);
        assert_eq!(kept, Some(second.to_vec()), "the second's secret is the one stored");
    }
}

/// The admin listener's view: an instance whose own [shared] sizes differ attaches to the shape
/// the gateway created, lists the unknown outcomes, and releases or resolves one only while it is
/// still that unknown outcome (of that owner).
#[test]
fn an_operator_lists_releases_and_resolves_unknown_outcomes_fenced() {
    use idem_filter::store::operator::{Change, RecordKind};
    use idem_filter::store::shared::held::parse_store_key;
    let (host, gateway) = store(16, 4);
    let other_shape =
        SharedStore::new(&SharedConfig { buckets: 2, entries_per_bucket: 64, max_response_bytes: 1, namespace: None });
    let admin = other_shape.attach(&host).unwrap().expect("the gateway's store");
    assert!(admin.held(&host).unwrap().is_empty());

    let gone = claimed(gateway.claim(&host, &id("gone"), &FP, 1_000, 60_000).unwrap());
    let ran = claimed(gateway.claim(&host, &id("ran"), &FP, 1_000, 60_000).unwrap());
    let _busy = claimed(gateway.claim(&host, &id("busy"), &FP, 1_000, 60_000).unwrap());
    host.advance(10);
    assert!(gateway.hold_unknown(&host, &gone, 60_000).unwrap());
    assert!(gateway.hold_unknown(&host, &ran, 60_000).unwrap());
    let held = admin.held(&host).unwrap();
    assert_eq!(held.len(), 2, "only the unknown outcomes: {held:?}");
    assert!(held.iter().all(|h| h.held_until_ms == 1_700_000_060_010 && !h.looking_up));
    let key = |t: &Ticket| parse_store_key(&t.store_key()).unwrap();
    assert_eq!(
        held.iter().map(|h| h.store_key()).collect::<std::collections::BTreeSet<_>>(),
        [gone.store_key(), ran.store_key()].into_iter().collect()
    );

    // Released: the repeat claims the key as a first request.
    let (b, i) = key(&gone);
    assert_eq!(
        admin.operator_release(&host, b, &i, Some(gone.owner ^ 1)).unwrap(),
        Change::OtherOwner(format!("{:016x}", gone.owner))
    );
    assert_eq!(admin.operator_release(&host, b, &i, Some(gone.owner)).unwrap(), Change::Done);
    assert_eq!(admin.operator_release(&host, b, &i, None).unwrap(), Change::Absent);
    let retry = claimed(gateway.claim(&host, &id("gone"), &FP, 1_000, 60_000).unwrap());
    // The key now holds a claim in flight: neither a release nor a resolve touches it.
    assert_eq!(admin.operator_release(&host, b, &i, None).unwrap(), Change::Holds(RecordKind::InFlight));
    let answer = ok_response(r#"{"order":"o-1"}"#);
    assert_eq!(admin.operator_resolve(&host, b, &i, None, &answer).unwrap(), Change::Holds(RecordKind::InFlight));
    assert!(gateway.renew(&host, &retry, 1_000).unwrap(), "the new claim is still its owner's");

    // Resolved: the same request gets the answer replayed, another body is a different request,
    // and the answer lasts as long as the hold would have.
    let (b, i) = key(&ran);
    assert_eq!(admin.operator_resolve(&host, b, &i, None, &answer).unwrap(), Change::Done);
    match gateway.claim(&host, &id("ran"), &FP, 1_000, 60_000).unwrap() {
        Claim::Completed { status: 201, response: Some(r), payload: Payload::Same, .. } => assert_eq!(r, answer),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        gateway.claim(&host, &id("ran"), &[9; 32], 1_000, 60_000).unwrap(),
        Claim::Completed { payload: Payload::Different, .. }
    ));
    assert_eq!(admin.operator_resolve(&host, b, &i, None, &answer).unwrap(), Change::Holds(RecordKind::Completed));
    host.advance(60_001);
    claimed(gateway.claim(&host, &id("ran"), &FP, 1_000, 60_000).unwrap());
    // A bucket the gateway never made.
    assert_eq!(admin.operator_release(&host, 99, &i, None).unwrap(), Change::Absent);
}

#[test]
fn an_admin_instance_before_any_gateway_finds_no_store() {
    let host = FakeHost::new(0);
    let s =
        SharedStore::new(&SharedConfig { buckets: 4, entries_per_bucket: 4, max_response_bytes: 64, namespace: None });
    assert!(s.attach(&host).unwrap().is_none());
}

/// The operator's list says which route and key each unknown outcome is: the note written when
/// it was held, read only while the entry it names is still at its position (a later hold at the
/// same position does not inherit it), and read back exactly whatever the key holds.
#[test]
fn a_held_unknown_outcome_is_listed_with_its_route_and_key_prefix() {
    use idem_filter::store::operator::HeldNote;
    // One bucket of one entry: every claim takes the same position.
    let (host, gateway) = store(1, 1);
    let first = claimed(gateway.claim(&host, &id("first"), &FP, 1_000, 60_000).unwrap());
    assert!(gateway.hold_unknown(&host, &first, 60_000).unwrap());
    let note = HeldNote::new("create-order", Some("|%7C\r\n\"zz\" and more"));
    gateway.note_held(&host, &first, &note).unwrap();
    let held = gateway.held(&host).unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(
        held[0].note.as_ref().map(|n| (n.route.as_str(), n.key_prefix.as_deref())),
        Some(("create-order", Some("|%7C\r\n\"z…")))
    );

    // Released; a new unknown outcome takes the position without a note of its own.
    let (b, i) = idem_filter::store::shared::held::parse_store_key(&first.store_key()).unwrap();
    assert_eq!(gateway.operator_release(&host, b, &i, None).unwrap(), idem_filter::store::operator::Change::Done);
    let second = claimed(gateway.claim(&host, &id("second"), &FP, 1_000, 60_000).unwrap());
    assert!(gateway.hold_unknown(&host, &second, 60_000).unwrap());
    let held = gateway.held(&host).unwrap();
    assert_eq!((held.len(), held[0].store_key(), held[0].note.clone()), (1, second.store_key(), None));
    gateway.note_held(&host, &second, &HeldNote::new("pay-callback", None)).unwrap();
    assert_eq!(gateway.held(&host).unwrap()[0].note, Some(HeldNote { route: "pay-callback".into(), key_prefix: None }));
}
