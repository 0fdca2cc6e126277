#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The owner checks of the Redis store's scripts, run against a real `redis-server` behind a real
//! Webdis (Debian's packages; `examples/webdis.json` with its ports rewritten): the exact commands
//! the filter sends, and what Redis holds afterwards. Whatever the Lua text says, another owner's
//! record is never deleted, overwritten or renewed.

mod common;
use common::webdis::Live;

use idem_filter::policy::parse_bundle;
use idem_filter::response::StoredResponse;
use idem_filter::store::redis::{command, RedisStore, Released, Ticket};

fn store_config() -> idem_filter::policy::RedisConfig {
    parse_bundle("[redis]\ncluster = \"webdis\"\nprefix = \"idem:oc:\"\n", "test").unwrap().redis.unwrap()
}

const ID: [u8; 32] = [7; 32];
const FP: [u8; 32] = [1; 32];

/// Owner `owner` claims the key `ID`; the claim must land (the key was free).
fn claim(live: &Live, store: &RedisStore<'_>, owner: u64, now: u64) -> Ticket {
    claim_at(live, store, ID, owner, now)
}

/// Owner `owner` claims the key `id` at `now`; the claim must land.
fn claim_at(live: &Live, store: &RedisStore<'_>, id: [u8; 32], owner: u64, now: u64) -> Ticket {
    let (cmd, ticket) = store.claim(&id, &FP, owner, now, 30_000);
    let (status, body) = live.send(&cmd);
    assert_eq!(store.parse_claim(&FP, status, &body), Ok(idem_filter::store::Claim::Claimed(())));
    ticket
}

/// Owner A's claim, lost to B: A's lease ran out (the key expired) and B claimed the key.
fn taken_over(live: &Live, store: &RedisStore<'_>) -> (Ticket, Ticket) {
    let a = claim(live, store, 0xa, 1000);
    live.del(&a.key);
    let b = claim(live, store, 0xb, 40_000);
    assert_eq!(live.get(&b.key).as_deref(), Some(b.record.as_str()));
    (a, b)
}

fn answer() -> StoredResponse {
    StoredResponse::new(201, vec![("content-type".into(), b"application/json".to_vec())], b"{\"id\":1}".to_vec())
}

#[test]
fn a_release_deletes_only_its_own_claim() {
    let live = Live::start("release");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let (a, b) = taken_over(&live, &store);
    let (status, body) = live.send(&store.release(&a));
    assert_eq!(store.parse_release(status, &body), Ok(Released::NotOurs));
    assert_eq!(live.get(&b.key).as_deref(), Some(b.record.as_str()), "B's claim survives A's release");
    let (status, body) = live.send(&store.release(&b));
    assert_eq!(store.parse_release(status, &body), Ok(Released::Deleted));
    assert_eq!(live.get(&b.key), None);
    let (status, body) = live.send(&store.release(&b));
    assert_eq!(store.parse_release(status, &body), Ok(Released::Absent));
}

#[test]
fn a_completion_never_overwrites_another_owners_record() {
    let live = Live::start("complete");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let (a, b) = taken_over(&live, &store);
    let (cmd, _) = store.complete(&a, &answer(), 4096, 86_400_000, 30_000);
    let (status, body) = live.send(&cmd);
    assert_eq!(store.parse_update(status, &body), Ok(false), "fenced out");
    assert_eq!(live.get(&b.key).as_deref(), Some(b.record.as_str()), "B's claim survives A's late answer");
    let (cmd, _) = store.complete(&b, &answer(), 4096, 86_400_000, 30_000);
    let (status, body) = live.send(&cmd);
    assert_eq!(store.parse_update(status, &body), Ok(true));
    let record = live.get(&b.key).unwrap();
    assert!(record.starts_with("C|000000000000000b|"), "{record}");
    assert!(live.pttl(&b.key) > 86_000_000, "kept for the key's ttl");
    // The same final write again (its first reply lost) still reads as applied.
    let (status, body) = live.send(&cmd);
    assert_eq!(store.parse_update(status, &body), Ok(true));
}

#[test]
fn an_answer_whose_claim_expired_unclaimed_is_still_stored() {
    let live = Live::start("expired");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let a = claim(&live, &store, 0xa, 1000);
    live.del(&a.key); // A's lease ran out; nobody took the key over
    let (cmd, _) = store.complete(&a, &answer(), 4096, 86_400_000, 30_000);
    let (status, body) = live.send(&cmd);
    assert_eq!(store.parse_update(status, &body), Ok(true), "the answer in hand is not thrown away");
    assert!(live.get(&a.key).unwrap().starts_with("C|000000000000000a|"));
}

#[test]
fn an_unknown_outcome_never_overwrites_another_owners_record() {
    let live = Live::start("unknown");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let (a, b) = taken_over(&live, &store);
    let (status, body) = live.send(&store.hold_unknown(&a, 3_600_000, 50_000, 30_000, &note()));
    assert_eq!(store.parse_update(status, &body), Ok(false));
    assert_eq!(live.get(&b.key).as_deref(), Some(b.record.as_str()));
    let (status, body) = live.send(&store.hold_unknown(&b, 3_600_000, 50_000, 30_000, &note()));
    assert_eq!(store.parse_update(status, &body), Ok(true));
    assert!(live.get(&b.key).unwrap().starts_with("U|000000000000000b|"));
    assert!(live.pttl(&b.key) > 3_500_000, "held for the hold, not the lease");
}

#[test]
fn a_renewal_never_extends_another_owners_lease() {
    let live = Live::start("renew");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let (a, b) = taken_over(&live, &store);
    let (status, body) = live.send(&store.renew(&a, 600_000));
    assert_eq!(store.parse_update(status, &body), Ok(false));
    assert!(live.pttl(&b.key) <= 30_000, "B's lease is B's");
    let (status, body) = live.send(&store.renew(&b, 600_000));
    assert_eq!(store.parse_update(status, &body), Ok(true));
    assert!(live.pttl(&b.key) > 30_000);
}

#[test]
fn a_token_is_restored_only_by_the_request_that_used_it() {
    let live = Live::start("token");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let (status, body) = live.send(&store.issue_token(&ID, 1000, 600_000));
    store.parse_ok(status, &body).unwrap();
    let (cmd, first) = store.use_token(&ID, 0xa, 2000);
    let (status, body) = live.send(&cmd);
    assert!(matches!(
        store.parse_use_token(first.clone(), status, &body),
        Ok(idem_filter::store::TokenUse::Consumed(_))
    ));
    // Someone else's use of the same token (another request's record) is not ours to restore.
    let (_, other) = store.use_token(&ID, 0xb, 3000);
    let (status, body) = live.send(&store.restore_token(&other));
    assert_eq!(store.parse_update(status, &body), Ok(false));
    assert_eq!(live.get(&first.key).as_deref(), Some(first.record.as_str()), "still used");
    let (status, body) = live.send(&store.restore_token(&first));
    assert_eq!(store.parse_update(status, &body), Ok(true));
    assert!(live.get(&first.key).unwrap().starts_with("K|"), "issued again");
}

/// Owner `owner` claims `id`; the claim must land.
fn claim_id(live: &Live, store: &RedisStore<'_>, id: [u8; 32], owner: u64) -> Ticket {
    claim_at(live, store, id, owner, 1000)
}

#[test]
fn a_batch_runs_each_write_with_its_own_owner_check_and_reply() {
    use idem_filter::store::redis::{read_release, read_update};
    let live = Live::start("batch");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let ours = claim_id(&live, &store, [10; 32], 1);
    // A claim taken over: A's lease ran out and B claimed the key.
    let a = claim_id(&live, &store, [11; 32], 0xa);
    live.del(&a.key);
    let b = claim_id(&live, &store, [11; 32], 0xb);
    let released = claim_id(&live, &store, [12; 32], 3);
    let (_, never_claimed) = store.claim(&[13; 32], &FP, 4, 1000, 30_000);
    // A key Redis cannot read as a string: that one step fails, the others still run.
    let broken = claim_id(&live, &store, [14; 32], 5);
    live.del(&broken.key);
    live.try_call(&command(&["EVAL", "return redis.call('LPUSH',KEYS[1],'x')", "1", &broken.key])).unwrap();

    let writes = [
        store.complete(&ours, &answer(), 4096, 86_400_000, 30_000).0,
        store.complete(&a, &answer(), 4096, 86_400_000, 30_000).0,
        store.release(&released),
        store.release(&never_claimed),
        store.complete(&broken, &answer(), 4096, 86_400_000, 30_000).0,
    ];
    let batch = store.batch(&writes.iter().collect::<Vec<_>>()).expect("fenced writes batch");
    let (status, body) = live.send(&batch);
    let replies = store.parse_batch(writes.len(), status, &body).unwrap();
    let mut replies = replies.into_iter();
    assert_eq!(replies.next().unwrap().and_then(read_update), Ok(true));
    assert_eq!(replies.next().unwrap().and_then(read_update), Ok(false), "fenced out");
    assert_eq!(replies.next().unwrap().and_then(read_release), Ok(Released::Deleted));
    assert_eq!(replies.next().unwrap().and_then(read_release), Ok(Released::Absent));
    let failed = replies.next().unwrap();
    assert!(matches!(&failed, Err(e) if format!("{e:?}").contains("WRONGTYPE")), "{failed:?}");
    // What Redis holds: our answer, B's claim untouched, the released key gone.
    assert!(live.get(&ours.key).unwrap().starts_with("C|0000000000000001|"));
    assert!(live.pttl(&ours.key) > 86_000_000, "kept for the key's ttl");
    assert_eq!(live.get(&b.key).as_deref(), Some(b.record.as_str()), "B's claim survives A's late answer");
    assert_eq!(live.get(&released.key), None);
    // A claim or a renewal is no fenced write: it never goes into a batch.
    let (claim_cmd, _) = store.claim(&[15; 32], &FP, 6, 1000, 30_000);
    assert_eq!(store.batch(&[&writes[0], &claim_cmd]), None);
}

#[test]
fn a_claim_batch_claims_each_free_key_and_returns_the_others_records() {
    use idem_filter::store::redis::read_claim;
    use idem_filter::store::Claim;
    let live = Live::start("claim-batch");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let held = claim_id(&live, &store, [20; 32], 0xb);
    let (_, free) = store.claim(&[21; 32], &FP, 1, 2000, 30_000);
    let (_, taken) = store.claim(&[20; 32], &FP, 2, 2000, 30_000);
    let (_, broken) = store.claim(&[22; 32], &FP, 3, 2000, 30_000);
    live.try_call(&command(&["EVAL", "return redis.call('LPUSH',KEYS[1],'x')", "1", &broken.key])).unwrap();
    let batch = store.claim_batch(&[(&free, 30_000), (&taken, 30_000), (&broken, 30_000)]);
    let (status, body) = live.send(&batch);
    let mut replies = store.parse_batch(3, status, &body).unwrap().into_iter();
    assert_eq!(replies.next().unwrap().and_then(|v| read_claim(&FP, v)), Ok(Claim::Claimed(())));
    let found = replies.next().unwrap().and_then(|v| read_claim(&FP, v));
    assert!(matches!(found, Ok(Claim::InFlight { .. })), "the other owner's record: {found:?}");
    let failed = replies.next().unwrap();
    assert!(matches!(&failed, Err(e) if format!("{e:?}").contains("WRONGTYPE")), "{failed:?}");
    // What Redis holds: our claim with its lease, the other owner's untouched.
    assert_eq!(live.get(&free.key).as_deref(), Some(free.record.as_str()));
    assert!((1..=30_000).contains(&live.pttl(&free.key)), "the lock ttl applies");
    assert_eq!(live.get(&held.key).as_deref(), Some(held.record.as_str()));
}

/// A lookup of an unknown outcome (`[route.reconcile]`): one repeat takes it (fenced on the record
/// found, so a second taker is refused); while its lease runs the record reads as in flight, after
/// it lapses as the unknown outcome again; what the answer writes is fenced by the lookup's own
/// record — a lookup whose lease was taken over writes nothing.
#[test]
fn a_lookup_is_taken_once_and_only_its_owner_settles_the_key() {
    use idem_filter::store::redis::{held_ticket, read_claim_at};
    use idem_filter::store::Claim;
    let live = Live::start("lookup");
    let cfg = store_config();
    let store = RedisStore::new(&cfg);
    let first = claim(&live, &store, 0xa, 1000);
    let (status, body) = live.send(&store.hold_unknown(&first, 86_400_000, 2000, 30_000, &note()));
    assert_eq!(store.parse_update(status, &body), Ok(true));
    let unknown = serde_json::Value::String(live.get(&first.key).unwrap());
    let held = held_ticket(&first, &unknown, 3000).expect("a free unknown outcome");

    let (take_b, b) = store.take_lookup(&held, 0xb, 5000);
    let (take_c, _) = store.take_lookup(&held, 0xc, 5000);
    let (status, body) = live.send(&take_b);
    assert_eq!(store.parse_update(status, &body), Ok(true));
    let (status, body) = live.send(&take_c);
    assert_eq!(store.parse_update(status, &body), Ok(false), "one lookup per key");
    let leased = serde_json::Value::String(live.get(&first.key).unwrap());
    assert!(matches!(read_claim_at(&FP, leased.clone(), 4000), Ok(Claim::InFlight { lease_ends_ms: 5000, .. })));
    assert!(held_ticket(&first, &leased, 4000).is_none(), "no second lookup while the lease runs");
    assert!(matches!(read_claim_at(&FP, leased.clone(), 6000), Ok(Claim::Unknown { .. })), "a lapsed lease");
    let lapsed = held_ticket(&first, &leased, 6000).expect("a lapsed lease can be taken over");

    // D takes the lapsed lease over: B's late answer writes nothing, D's does.
    let (take_d, d) = store.take_lookup(&lapsed, 0xd, 9000);
    let (status, body) = live.send(&take_d);
    assert_eq!(store.parse_update(status, &body), Ok(true));
    let (ran_b, _) = store.complete(&b, &answer(), 4096, 86_400_000, 30_000);
    let (status, body) = live.send(&ran_b);
    assert_eq!(store.parse_update(status, &body), Ok(false), "B was fenced out");
    let (status, body) = live.send(&store.lookup_failed(&b));
    assert_eq!(store.parse_update(status, &body), Ok(false));
    assert_eq!(live.get(&first.key).as_deref(), Some(d.record.as_str()));
    let (status, body) = live.send(&store.lookup_failed(&d));
    assert_eq!(store.parse_update(status, &body), Ok(true));
    // D's lookup found nothing: the unknown outcome comes back without a lease, its note kept.
    let back = live.get(&first.key).unwrap();
    let given_back = idem_filter::store::operator::held(&back).unwrap();
    assert_eq!((given_back.lookup_lease_ms, given_back.note), (None, Some(note())), "{back}");
    // E asks next; the service says it did not run: the key becomes E's claim.
    let e_held = held_ticket(&first, &serde_json::Value::String(back), 9500).unwrap();
    let (take_e, e) = store.take_lookup(&e_held, 0xe, 12_000);
    let (status, body) = live.send(&take_e);
    assert_eq!(store.parse_update(status, &body), Ok(true));
    let (absent, claim) = store.lookup_absent(&e, 0xf, 10_000, 30_000);
    let (status, body) = live.send(&absent);
    assert_eq!(store.parse_update(status, &body), Ok(true));
    assert_eq!(live.get(&first.key).as_deref(), Some(claim.record.as_str()));
    assert!(claim.record.starts_with("I|000000000000000f|"), "{}", claim.record);
}

/// The note an operator lists a held key by; a key prefix holding the record's separator.
fn note() -> idem_filter::store::operator::HeldNote {
    idem_filter::store::operator::HeldNote::new("create-order", Some("o|1"))
}
