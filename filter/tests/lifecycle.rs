#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The request lifecycle through the fake host: the Redis, hold, wait, detached and token paths,
//! including the orders of events an end-to-end test cannot force (a store reply after the client
//! left, a body chunk during a callout, a completion reply after the lease ended, a refused
//! completion and a retry meanwhile).

mod common;
use common::percent_decode;
use idem_filter::engine::outcome::{counter_name, store_call_histogram_name, wait_histogram_name};
use idem_filter::engine::Outcome;
use idem_filter::lifecycle::{Flow, Stream, Worker};
use idem_filter::testing::{Act, FakeHost, FakeStream};
use std::rc::Rc;

const ROOT: u32 = 1;
const WEBDIS: &str = r#"
[redis]
cluster = "webdis"
timeout = "500ms"
prefix = "t:"
"#;

/// A counter's value by route and outcome name.
fn count(host: &FakeHost, route: &str, outcome: &str) -> u64 {
    let o = Outcome::ALL.iter().find(|o| o.name() == outcome).unwrap();
    host.counter(&counter_name(route, *o))
}

fn setup(policy: &str) -> (FakeHost, Rc<Worker>) {
    let (host, w) = setup_unprobed(policy);
    // With Redis routes, the root's first tick asks Redis whether it evicts keys: it does not.
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    if let Some(token) = acts.iter().find_map(|a| match a {
        Act::Dispatch { token, body, .. } if String::from_utf8_lossy(body).starts_with("EVAL/") => Some(*token),
        _ => None,
    }) {
        answer_root(&host, &w, token, 200, br#"{"EVAL":"noeviction|0"}"#);
    }
    (host, Rc::new(w))
}

fn setup_unprobed(policy: &str) -> (FakeHost, Worker) {
    let host = FakeHost::new(1_800_000_000_000);
    host.enter(ROOT);
    let w = Worker::configure(&host, &host, ROOT, policy.as_bytes()).unwrap();
    host.take_acts();
    (host, w)
}

fn redis_policy(extra: &str) -> String {
    format!(
        "{WEBDIS}\n[[route]]\nname = \"r\"\nmatch = {{ method = \"POST\", path = \"/r\" }}\nstore = \"redis\"\n{extra}"
    )
}

const BODY: &[u8] = br#"{"sku":"A1"}"#;

/// A request with a key and a caller, opened as context `ctx`, headers and whole body delivered.
fn send(host: &FakeHost, w: &Rc<Worker>, ctx: u32, path: &str, key: &str) -> (Stream, Flow) {
    let req =
        FakeStream::request("POST", path, &[("idempotency-key", key.as_bytes()), ("authorization", b"Bearer a")], BODY);
    host.open(ctx, req);
    let mut s = Stream::new(Rc::clone(w), ctx);
    assert_eq!(s.on_request_headers(host, false), Flow::Pause, "the body is needed for the fingerprint");
    let flow = s.on_request_body(host, BODY.len(), true);
    (s, flow)
}

/// The single Webdis command dispatched by `context`, and its token.
fn dispatched(acts: &[Act], context: u32) -> (u32, String) {
    let calls: Vec<(u32, String)> = acts
        .iter()
        .filter_map(|a| match a {
            Act::Dispatch { context: c, token, body, .. } if *c == context => {
                Some((*token, String::from_utf8(body.clone()).unwrap()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(calls.len(), 1, "expected one call from context {context}: {acts:?}");
    calls.into_iter().next().unwrap()
}

/// The streams whose request was resumed (sent upstream), in order.
fn resumed_requests(acts: &[Act]) -> Vec<u32> {
    let resumed = acts.iter().filter_map(|a| match a {
        Act::ResumeRequest { context } => Some(*context),
        _ => None,
    });
    resumed.collect()
}

fn replies(acts: &[Act], context: u32) -> Vec<(u16, serde_json::Value)> {
    acts.iter()
        .filter_map(|a| match a {
            Act::Reply { context: c, reply } if *c == context => {
                Some((reply.status, serde_json::from_slice(&reply.body).unwrap_or(serde_json::Value::Null)))
            }
            _ => None,
        })
        .collect()
}

/// The root's queue is signalled: it sends what streams queued.
fn root_sends(host: &FakeHost, w: &Worker) -> Vec<Act> {
    host.enter(ROOT);
    w.on_queue_ready(host);
    host.take_acts()
}

fn answer_root(host: &FakeHost, w: &Worker, token: u32, status: u16, body: &[u8]) -> Vec<Act> {
    host.enter(ROOT);
    host.deliver_to(token, status, body);
    w.on_call_response(host, token, 1, body.len());
    host.take_acts()
}

fn answer_stream(host: &FakeHost, s: &mut Stream, ctx: u32, status: u16, body: &[u8]) -> Vec<Act> {
    host.enter(ctx);
    host.deliver_to(s.call_out().unwrap_or(0), status, body);
    s.on_call_response(host, s.call_out().unwrap_or(0), 1, body.len());
    host.take_acts()
}

/// The upstream answers `ctx` with 201 and a JSON body, as Envoy delivers it.
fn upstream_answers(host: &FakeHost, s: &mut Stream, ctx: u32) -> (Flow, Flow) {
    let body = br#"{"order":1}"#;
    host.update(ctx, |st| *st = st.clone().with_response(201, &[("content-type", b"application/json")], body));
    host.enter(ctx);
    let h = s.on_response_headers(host, false);
    let b = s.on_response_body(host, body.len(), true);
    (h, b)
}

/// A Redis request claimed, forwarded and answered by the upstream: its completion is queued,
/// and the root has sent it. Returns the stream, the write's token and its command.
fn completion_sent(host: &FakeHost, w: &Rc<Worker>) -> (Stream, u32, String) {
    let (mut s, _) = send(host, w, 10, "/r", "k1");
    host.take_acts();
    answer_stream(host, &mut s, 10, 200, br#"{"SET":null}"#);
    upstream_answers(host, &mut s, 10);
    host.take_acts();
    let (token, complete) = dispatched(&root_sends(host, w), ROOT);
    (s, token, complete)
}

#[test]
fn redis_claim_forward_and_the_response_held_until_written() {
    let (host, w) = setup(&redis_policy(""));
    let (mut s, flow) = send(&host, &w, 10, "/r", "k1");
    assert_eq!(flow, Flow::Pause, "paused while the claim is out");
    let (_, claim) = dispatched(&host.take_acts(), 10);
    assert!(claim.starts_with("SET/t%3Ak%3A") && claim.ends_with("/NX/PX/30000/GET"), "{claim}");

    let acts = answer_stream(&host, &mut s, 10, 200, br#"{"SET":null}"#);
    assert_eq!(acts, vec![Act::ResumeRequest { context: 10 }]);

    let (h, b) = upstream_answers(&host, &mut s, 10);
    assert_eq!((h, b), (Flow::Continue, Flow::Pause), "the headers pass; the body is held until the record is written");
    let acts = host.take_acts();
    assert!(acts.contains(&Act::Enqueue { queue: 7 }), "{acts:?}");

    let (token, complete) = dispatched(&root_sends(&host, &w), ROOT);
    assert!(complete.starts_with("EVAL/"), "{complete}");
    let acts = answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    assert_eq!(acts, vec![Act::ResumeResponse { context: 10 }], "the answer goes out only now");
    assert_eq!(count(&host, "r", "stored"), 1);
    // Both Webdis calls (claim, completion) are timed in idem_store_call_time{route}.
    assert_eq!(host.histogram(&store_call_histogram_name("r")).len(), 2);
    s.on_log(&host);
}

#[test]
fn a_webdis_reply_of_another_call_is_never_read_as_this_calls() {
    // Webdis 0.1.9 writes the reply of a command whose client left (a callout that timed out)
    // into the next connection that reuses the socket. Read as this claim's reply, `null` would
    // say "claimed" — for another key — and a duplicate would run. Each call's path asks Webdis
    // to tag its reply; a reply with another tag, or none, is a failed call.
    let (host, w) = setup(&redis_policy(""));
    for (ctx, stale) in [(10, &br#"i0123456789abcdef({"SET":null});"#[..]), (11, &br#"{"SET":null}"#[..])] {
        let (mut s, _) = send(&host, &w, ctx, "/r", &format!("k{ctx}"));
        host.take_acts();
        host.enter(ctx);
        host.deliver(200, stale);
        s.on_call_response(&host, s.call_out().unwrap_or(0), 1, stale.len());
        let acts = host.take_acts();
        assert!(!acts.contains(&Act::ResumeRequest { context: ctx }), "never forwarded on that reply: {acts:?}");
        assert_eq!(replies(&acts, ctx).first().map(|r| r.0), Some(503), "{acts:?}");
        s.on_log(&host);
    }
    let logged = host.logs().iter().filter(|(_, l)| l.contains("did not carry its call's tag")).count();
    assert_eq!(logged, 1, "logged once per worker: {:?}", host.logs());
    // The same reply under its own tag is this call's: claimed, forwarded.
    let (mut s, _) = send(&host, &w, 12, "/r", "k12");
    host.take_acts();
    let acts = answer_stream(&host, &mut s, 12, 200, br#"{"SET":null}"#);
    assert_eq!(acts, vec![Act::ResumeRequest { context: 12 }]);
    s.on_log(&host);
}

#[test]
fn a_5xx_releases_the_key_before_its_headers_go() {
    // A sidecar retries a 5xx the instant its headers arrive: the release must already be in
    // Redis, or the retry meets the claim and gets 409 REQUEST_IN_PROGRESS.
    let (host, w) = setup(&redis_policy(""));
    let (mut s, _) = send(&host, &w, 10, "/r", "k1");
    host.take_acts();
    answer_stream(&host, &mut s, 10, 200, br#"{"SET":null}"#);
    host.update(10, |st| *st = st.clone().with_response(503, &[("content-type", b"application/json")], b"{}"));
    host.enter(10);
    assert_eq!(s.on_response_headers(&host, false), Flow::Pause, "the 503's headers wait for the release");
    // Envoy passes the body on (allow_on_headers_stop_iteration): continuing it would let the
    // headers go with it.
    assert_eq!(s.on_response_body(&host, 1, false), Flow::Pause, "its body waits with the headers");
    let (token, release) = dispatched(&root_sends(&host, &w), ROOT);
    assert!(release.starts_with("EVAL/"), "{release}");
    let acts = answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    assert_eq!(acts, vec![Act::ResumeResponse { context: 10 }], "the headers go once the release is written");
    assert_eq!(count(&host, "r", "released"), 1);
    host.enter(10);
    assert_eq!(s.on_response_body(&host, 2, true), Flow::Continue, "nothing else to do with its body");
    s.on_log(&host);
    assert!(host.take_acts().is_empty(), "no second write");
}

#[test]
fn a_body_chunk_during_the_claim_never_claims_twice() {
    let (host, w) = setup(&redis_policy(""));
    let (mut s, _) = send(&host, &w, 10, "/r", "k1");
    dispatched(&host.take_acts(), 10);
    // Envoy delivers one more body callback while the Webdis call is out: held, with flow
    // control (never counted against the buffer limit, which would be Envoy's 413).
    assert_eq!(s.on_request_body(&host, BODY.len(), true), Flow::Hold);
    // Continuing at the trailers would send the request upstream before the claim's answer.
    assert_eq!(s.on_request_trailers(&host), Flow::Pause);
    assert!(host.take_acts().is_empty(), "no second claim");
}

#[test]
fn a_claim_reply_after_the_client_left_is_released() {
    let (host, w) = setup(&redis_policy(""));
    let (mut s, _) = send(&host, &w, 10, "/r", "k1");
    let (_, claim) = dispatched(&host.take_acts(), 10);
    // The client leaves; Envoy cancels the stream's callout, so the reply never comes — but the
    // SET may have reached Redis. The root releases it, owner-checked.
    host.close(10);
    s.on_log(&host);
    let (token, release) = dispatched(&root_sends(&host, &w), ROOT);
    assert!(release.contains("DEL"), "{release}");
    let record = claim.split('/').nth(2).unwrap();
    assert!(release.contains(record), "fenced by the claim's own record: {release}");
    answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    assert_eq!(count(&host, "r", "orphan_released"), 1);
}

/// The root's timer fires `ms` later; what it sent.
fn root_ticks_after(host: &FakeHost, w: &Worker, ms: u64) -> Vec<Act> {
    host.advance(ms);
    host.enter(ROOT);
    w.on_tick(host);
    host.take_acts()
}

fn dispatches(acts: &[Act]) -> usize {
    acts.iter().filter(|a| matches!(a, Act::Dispatch { .. })).count()
}

/// A claim whose Webdis callout timed out (Envoy answers it 504): the client is told 503, and
/// the root's owner-checked release is on its way. Returns the release's token and command.
fn claim_timed_out(host: &FakeHost, w: &Rc<Worker>) -> (u32, String) {
    let (mut s, _) = send(host, w, 10, "/r", "k1");
    let (_, claim) = dispatched(&host.take_acts(), 10);
    host.enter(10);
    host.deliver_timeout();
    s.on_call_response(host, s.call_out().unwrap_or(0), 3, 24);
    let replied = replies(&host.take_acts(), 10);
    assert_eq!(replied.len(), 1);
    assert_eq!((replied[0].0, replied[0].1["code"].as_str()), (503, Some("IDEMPOTENCY_STORE_UNAVAILABLE")));
    let (token, release) = dispatched(&root_sends(host, w), ROOT);
    let record = claim.split('/').nth(2).unwrap();
    assert!(release.starts_with("EVAL/") && release.contains(record), "owner-checked release: {release}");
    (token, release)
}

#[test]
fn a_claim_whose_callout_timed_out_is_released_when_it_lands_late() {
    let (host, w) = setup(&redis_policy(""));
    let (token, release) = claim_timed_out(&host, &w);
    // The release reaches Redis before the late SET: nothing there yet.
    let acts = answer_root(&host, &w, token, 200, br#"{"EVAL":2}"#);
    assert_eq!(dispatches(&acts), 0, "{acts:?}");
    // The root looks again shortly; by then the SET has landed, and it is ours: deleted.
    let (token, again) = dispatched(&root_ticks_after(&host, &w, 100), ROOT);
    assert_eq!(again, release);
    answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    assert_eq!(count(&host, "r", "orphan_released"), 1);
    assert_eq!(dispatches(&root_ticks_after(&host, &w, 60_000)), 0, "done once released");
}

#[test]
fn the_look_for_a_late_claim_ends_with_another_owner_or_the_lease() {
    let (host, w) = setup(&redis_policy(""));
    let (token, _) = claim_timed_out(&host, &w);
    // Another request holds the key now: left alone, not looked for again.
    answer_root(&host, &w, token, 200, br#"{"EVAL":0}"#);
    assert_eq!(dispatches(&root_ticks_after(&host, &w, 60_000)), 0);
    assert_eq!(count(&host, "r", "orphan_released"), 0);

    // Never there: looked for about once a second, and no longer than the lease (30 s).
    let (mut token, _) = {
        host.enter(ROOT);
        let (mut s, _) = send(&host, &w, 20, "/r", "k2");
        host.take_acts();
        host.enter(20);
        host.deliver_timeout();
        s.on_call_response(&host, s.call_out().unwrap_or(0), 3, 24);
        host.take_acts();
        dispatched(&root_sends(&host, &w), ROOT)
    };
    let mut looks = 1;
    for _ in 0..100 {
        answer_root(&host, &w, token, 200, br#"{"EVAL":2}"#);
        let acts = root_ticks_after(&host, &w, 1000);
        match acts.iter().find_map(|a| match a {
            Act::Dispatch { token, .. } => Some(*token),
            _ => None,
        }) {
            Some(t) => {
                token = t;
                looks += 1;
            }
            None => break,
        }
    }
    // At once, then a second apart (100, 200, 400, 800 ms, then 1 s: each within one tick
    // here) until the lease's 30 s have passed: the look at 30 s is the last.
    assert_eq!(looks, 31, "looks within the 30 s lease");
}

#[test]
fn a_completion_reply_after_the_lease_ended_is_lease_lost() {
    let (host, w) = setup(&redis_policy(""));
    let (_s, token, _) = completion_sent(&host, &w);
    // Another owner holds the key now (our gateway froze past the lease): fenced off.
    let acts = answer_root(&host, &w, token, 200, br#"{"EVAL":0}"#);
    assert_eq!(acts, vec![Act::ResumeResponse { context: 10 }], "the client still gets its own answer");
    assert_eq!(count(&host, "r", "lease_lost"), 1);
    assert_eq!(count(&host, "r", "stored"), 0);
}

#[test]
fn a_refused_completion_is_retried_and_a_retry_meanwhile_waits() {
    let (host, w) = setup(&redis_policy(""));
    let (_s, token, complete) = completion_sent(&host, &w);
    let oom = br#"{"EVAL":[false,"OOM command not allowed when used memory > 'maxmemory'."]}"#;
    let acts = answer_root(&host, &w, token, 200, oom);
    assert_eq!(acts, vec![Act::ResumeResponse { context: 10 }], "the client is not kept waiting");
    assert_eq!(count(&host, "r", "write_retried"), 1);

    // The client's retry reaches this Envoy meanwhile: in progress, without touching Redis.
    let (_, flow) = send(&host, &w, 11, "/r", "k1");
    assert_eq!(flow, Flow::Pause);
    let acts = host.take_acts();
    assert!(!acts.iter().any(|a| matches!(a, Act::Dispatch { .. })), "no claim while the answer is unwritten");
    let r = replies(&acts, 11);
    assert_eq!(r.len(), 1);
    assert_eq!((r[0].0, r[0].1["code"].as_str()), (409, Some("REQUEST_IN_PROGRESS")));

    // Backoff, then the same write again.
    host.enter(ROOT);
    w.on_tick(&host);
    assert!(!host.take_acts().iter().any(|a| matches!(a, Act::Dispatch { .. })), "not before its backoff");
    host.advance(150);
    w.on_tick(&host);
    let (token, again) = dispatched(&host.take_acts(), ROOT);
    assert_eq!(again, complete);
    answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    assert_eq!(count(&host, "r", "stored"), 1);
    // Written: the next retry is replayed from the answer this Envoy kept, without Redis.
    let (_, flow) = send(&host, &w, 12, "/r", "k1");
    assert_eq!(flow, Flow::Pause);
    let acts = host.take_acts();
    assert!(!acts.iter().any(|a| matches!(a, Act::Dispatch { .. })), "{acts:?}");
    assert_eq!(replies(&acts, 12)[0].0, 201);
}

/// A stored answer, as Webdis returns it to a claim: `C|owner|fp|first|status|base64(response)`.
fn completed_reply(host: &FakeHost, w: &Rc<Worker>) -> Vec<u8> {
    // Have this worker complete a request, capture the record it writes, and answer the claim
    // of a second worker (another Envoy) with it.
    let (_s, token, complete) = completion_sent(host, w);
    answer_root(host, w, token, 200, br#"{"EVAL":1}"#);
    let decoded = percent_decode(&complete);
    let record = decoded.split('/').find(|a| a.starts_with("C|")).expect("a completed record").to_string();
    format!(r#"{{"SET":"{record}"}}"#).into_bytes()
}

#[test]
fn a_completed_answer_read_from_redis_is_kept_and_replayed_without_redis() {
    let (host, w) = setup(&redis_policy(""));
    let reply = completed_reply(&host, &w);
    // Another Envoy (its own shared data): its first repeat asks Redis and is replayed.
    let (host2, w2) = setup(&redis_policy(""));
    let (mut s, _) = send(&host2, &w2, 20, "/r", "k1");
    dispatched(&host2.take_acts(), 20);
    let acts = answer_stream(&host2, &mut s, 20, 200, &reply);
    assert_eq!(replies(&acts, 20)[0].0, 201, "{acts:?}");
    // Its next repeats are answered from its own copy, with no Webdis call.
    for ctx in 21..24 {
        let (_, flow) = send(&host2, &w2, ctx, "/r", "k1");
        assert_eq!(flow, Flow::Pause);
        let acts = host2.take_acts();
        assert!(!acts.iter().any(|a| matches!(a, Act::Dispatch { .. })), "{acts:?}");
        let r = replies(&acts, ctx);
        assert_eq!((r[0].0, r[0].1["order"].as_i64()), (201, Some(1)));
    }
    assert_eq!(count(&host2, "r", "replayed"), 4);
    // Another payload under the same key is refused locally too (422), as Redis would.
    let req = FakeStream::request(
        "POST",
        "/r",
        &[("idempotency-key", b"k1"), ("authorization", b"Bearer a")],
        br#"{"sku":"B2"}"#,
    );
    host2.open(30, req);
    let mut s = Stream::new(Rc::clone(&w2), 30);
    s.on_request_headers(&host2, false);
    s.on_request_body(&host2, 12, true);
    let acts = host2.take_acts();
    assert!(!acts.iter().any(|a| matches!(a, Act::Dispatch { .. })), "{acts:?}");
    assert_eq!(replies(&acts, 30)[0].1["code"].as_str(), Some("IDEMPOTENCY_KEY_REUSED"));
    // Past the local copy's life (answer_cache, 60 s by default), Redis is asked again.
    host2.advance(60_001);
    send(&host2, &w2, 31, "/r", "k1");
    dispatched(&host2.take_acts(), 31);
}

#[test]
fn the_local_copy_never_outlives_the_record_and_answer_cache_0s_turns_it_off() {
    // ttl = 10s: the local copy (60 s by default) ends with the record, 10 s after first seen.
    let (host, w) = setup(&redis_policy("[route.key]\nttl = \"10s\"\n"));
    completed_reply(&host, &w);
    let (_, _) = send(&host, &w, 11, "/r", "k1");
    assert!(!host.take_acts().iter().any(|a| matches!(a, Act::Dispatch { .. })), "kept");
    host.advance(10_001);
    send(&host, &w, 12, "/r", "k1");
    dispatched(&host.take_acts(), 12);

    let off = redis_policy("").replace("prefix = \"t:\"", "prefix = \"t:\"\nanswer_cache = \"0s\"");
    let (host, w) = setup(&off);
    completed_reply(&host, &w);
    send(&host, &w, 11, "/r", "k1");
    dispatched(&host.take_acts(), 11);
}

#[test]
fn an_answer_whose_chunks_were_held_past_the_buffer_waits_briefly_for_the_next() {
    // A header-decided Redis route: the repeat's claim is out while its body keeps coming, held
    // with flow control; past Envoy's buffer Envoy stops reading, so the 409 cannot wait for the
    // request's end (it waited PARK_MS): 200 ms for a next chunk, then it goes.
    let body_route = "\n[[route]]\nname = \"b\"\nmatch = { method = \"POST\", path = \"/b\" }\nstore = \"redis\"\n";
    let (host, w) =
        setup(&format!("{}{body_route}", redis_policy("[route.key]\nfingerprint = [\"method\", \"path\"]\n")));
    // A request that reads its body proves Envoy delivers bodies to paused requests: an answer
    // may then wait PARK_MS (10 s) for its request's end.
    send(&host, &w, 9, "/b", "other");
    host.take_acts();
    let req = |key: &str| {
        FakeStream::request("POST", "/r", &[("idempotency-key", key.as_bytes()), ("authorization", b"Bearer a")], BODY)
    };
    host.open(10, req("k1"));
    let mut first = Stream::new(Rc::clone(&w), 10);
    assert_eq!(first.on_request_headers(&host, true), Flow::Pause);
    let (_, claim) = dispatched(&host.take_acts(), 10);
    answer_stream(&host, &mut first, 10, 200, br#"{"SET":null}"#);
    host.take_acts();
    let record = percent_decode(&claim).split('/').nth(2).unwrap().to_string();

    host.open(11, req("k1"));
    let mut repeat = Stream::new(Rc::clone(&w), 11);
    host.enter(11);
    assert_eq!(repeat.on_request_headers(&host, false), Flow::Pause, "decided at the headers: the claim goes");
    host.take_acts();
    assert_eq!(repeat.on_request_body(&host, 4096, false), Flow::Hold, "held while the claim is out");
    let acts = answer_stream(&host, &mut repeat, 11, 200, format!(r#"{{"SET":"{record}"}}"#).as_bytes());
    assert!(replies(&acts, 11).is_empty(), "parked: the client still uploads");
    host.advance(199);
    host.enter(ROOT);
    w.on_tick(&host);
    assert!(replies(&host.take_acts(), 11).is_empty(), "within 200 ms a chunk may still come");
    host.advance(1);
    w.on_tick(&host);
    let r = replies(&host.take_acts(), 11);
    assert_eq!((r[0].0, r[0].1["code"].as_str()), (409, Some("REQUEST_IN_PROGRESS")), "then it goes");
}

/// `n` duplicates of a claimed Redis key, held (`on_in_flight = "wait"`), contexts 11..11+n.
/// Returns the first request's stream, the held ones, and the Webdis reply "still in flight".
fn held_on_redis(host: &FakeHost, w: &Rc<Worker>, n: u32) -> (Stream, Vec<Stream>, Vec<u8>) {
    let (mut first, _) = send(host, w, 10, "/r", "k1");
    let (_, claim) = dispatched(&host.take_acts(), 10);
    answer_stream(host, &mut first, 10, 200, br#"{"SET":null}"#);
    host.take_acts();
    // The first request's own in-flight record (same payload) is what the duplicates find.
    let record = percent_decode(&claim).split('/').nth(2).unwrap().to_string();
    let in_flight = format!(r#"{{"SET":"{record}"}}"#).into_bytes();
    let mut held = Vec::new();
    for ctx in 11..11 + n {
        let (mut s, _) = send(host, w, ctx, "/r", "k1");
        host.take_acts();
        assert!(answer_stream(host, &mut s, ctx, 200, &in_flight).is_empty(), "held");
        held.push(s);
    }
    (first, held, in_flight)
}

const WAIT: &str = "[route.key]\non_in_flight = \"wait\"\nwait_timeout = \"10s\"\n";

#[test]
fn held_duplicates_of_one_key_share_one_poll_that_backs_off() {
    let (host, w) = setup(&redis_policy(WAIT));
    let (_first, _held, in_flight) = held_on_redis(&host, &w, 50);
    // 3 s of ticks every 20 ms: one group, polls at 20, 40, 80, … ms gaps, at most 500 ms apart.
    let mut polls = 0;
    for _ in 0..150 {
        host.advance(20);
        host.enter(ROOT);
        w.on_tick(&host);
        for a in host.take_acts() {
            if let Act::Dispatch { token, body, .. } = a {
                assert!(String::from_utf8(body).unwrap().starts_with("SET/"));
                polls += 1;
                assert!(answer_root(&host, &w, token, 200, &in_flight).is_empty(), "still held");
            }
        }
    }
    assert!((6..=12).contains(&polls), "{polls} polls for 50 held requests over 3 s");
}

#[test]
fn an_answer_written_by_this_envoy_wakes_its_held_duplicates_without_a_poll() {
    let (host, w) = setup(&redis_policy(WAIT));
    let (mut first, _held, _) = held_on_redis(&host, &w, 3);
    upstream_answers(&host, &mut first, 10);
    host.take_acts();
    let (token, _) = dispatched(&root_sends(&host, &w), ROOT);
    answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    host.advance(20);
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    assert!(!acts.iter().any(|a| matches!(a, Act::Dispatch { .. })), "{acts:?}");
    for ctx in 11..14 {
        let r = replies(&acts, ctx);
        assert_eq!((r.len(), r[0].0, r[0].1["order"].as_i64()), (1, 201, Some(1)), "{acts:?}");
    }
    assert_eq!(count(&host, "r", "replayed"), 3);
    assert_eq!(host.histogram(&wait_histogram_name("r")).len(), 3);
}

#[test]
fn a_poll_that_finds_the_key_free_gives_it_to_one_held_duplicate() {
    let (host, w) = setup(&redis_policy(WAIT));
    let (_first, _held, _) = held_on_redis(&host, &w, 3);
    host.advance(20);
    host.enter(ROOT);
    w.on_tick(&host);
    let (token, _) = dispatched(&host.take_acts(), ROOT);
    // The first request's claim was released (its upstream failed): the poll's SET NX wins.
    let acts = answer_root(&host, &w, token, 200, br#"{"SET":null}"#);
    let resumed = resumed_requests(&acts);
    assert_eq!(resumed, vec![11], "the oldest held request takes the key over; {acts:?}");
    assert_eq!(count(&host, "r", "waited"), 3, "each held duplicate, once");
    assert_eq!(count(&host, "r", "in_flight"), 0, "none was answered 409");
    assert_eq!(count(&host, "r", "forwarded"), 2, "the first request and the one that took over");
    let line = host.logs().into_iter().find(|(_, l)| l.contains("cause=took_over_after_wait"));
    assert!(matches!(line, Some((idem_filter::host::Level::Info, _))), "a takeover is logged at info: {line:?}");
    let digest = idem_filter::key::key_digest("r", "k1");
    assert!(line.unwrap().1.ends_with(&format!("key=k1 cause=took_over_after_wait key_digest={digest}")));
}

#[test]
fn an_unknown_outcome_is_held_not_released() {
    let (host, w) = setup(&redis_policy(""));
    let (mut s, _) = send(&host, &w, 10, "/r", "k1");
    host.take_acts();
    answer_stream(&host, &mut s, 10, 200, br#"{"SET":null}"#);
    // Forwarded, and the client leaves before any answer: outcome unknown.
    host.close(10);
    s.on_log(&host);
    host.take_acts();
    let (token, hold) = dispatched(&root_sends(&host, &w), ROOT);
    assert!(percent_decode(&hold).contains("U|"), "{hold}");
    answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    assert_eq!(count(&host, "r", "held"), 1);
    // One structured line for the reconciliation job, with the key an operator releases.
    let logs = host.logs();
    let line = logs.iter().find_map(|(_, m)| m.strip_prefix("idem: unknown_outcome ")).expect("a reconciliation line");
    let j: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(
        (j["route"].as_str(), j["store"].as_str(), j["cause"].as_str()),
        (Some("r"), Some("redis"), Some("no_response"))
    );
    assert!(j["store_key"].as_str().unwrap().starts_with("t:k:"), "{j}");
    assert_eq!(j["key_prefix"].as_str(), Some("k1"));
}

#[test]
fn leases_are_renewed_while_the_upstream_works() {
    let (host, w) = setup(&redis_policy("[route.key]\nlock_ttl = \"3s\"\n"));
    let (mut s, _) = send(&host, &w, 10, "/r", "k1");
    host.take_acts();
    answer_stream(&host, &mut s, 10, 200, br#"{"SET":null}"#);
    host.enter(ROOT);
    host.advance(1_001);
    w.on_tick(&host);
    let (token, renew) = dispatched(&host.take_acts(), ROOT);
    assert!(percent_decode(&renew).contains("PEXPIRE"), "{renew}");
    answer_root(&host, &w, token, 200, br#"{"EVAL":1}"#);
    // Once the request finished, no more renewals.
    upstream_answers(&host, &mut s, 10);
    host.take_acts();
    root_sends(&host, &w);
    host.advance(5_000);
    w.on_tick(&host);
    assert!(!host
        .take_acts()
        .iter()
        .any(|a| matches!(a, Act::Dispatch { body, .. } if String::from_utf8_lossy(body).contains("PEXPIRE"))));
}

const SHARED: &str = r#"
[[route]]
name = "s"
match = { method = "POST", path = "/s" }
[route.key]
on_in_flight = "wait"
wait_timeout = "5s"

[[route]]
name = "d"
match = { method = "POST", path = "/d" }
forward = "detached"

[[route]]
name = "dw"
match = { method = "POST", path = "/dw" }
forward = "detached"
[route.key]
on_in_flight = "wait"
wait_timeout = "5s"
"#;

/// The root's calls among `acts` (on the shared store: detached calls only): token and body.
fn detached_calls(acts: &[Act]) -> Vec<(u32, Vec<u8>)> {
    acts.iter()
        .filter_map(|a| match a {
            Act::Dispatch { context: ROOT, token, body, .. } => Some((*token, body.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_held_duplicate_that_takes_a_detached_key_over_is_sent_detached_too() {
    let (host, w) = setup(SHARED);
    let (mut first, _) = send(&host, &w, 10, "/dw", "k1");
    let (mut second, flow) = send(&host, &w, 11, "/dw", "k1");
    assert_eq!(flow, Flow::Pause, "held while the first is out");
    host.take_acts();
    let calls = detached_calls(&root_sends(&host, &w));
    assert_eq!(calls.len(), 1, "the first request's call");
    // The first fails (5xx): its claim is released, and the held duplicate takes the key over —
    // sent by the root as well, never resumed into Envoy's router.
    answer_root(&host, &w, calls[0].0, 503, b"down");
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    assert!(!acts.iter().any(|a| matches!(a, Act::ResumeRequest { context: 11 })), "{acts:?}");
    let mut calls = detached_calls(&acts);
    if calls.is_empty() {
        calls = detached_calls(&root_sends(&host, &w));
    }
    assert_eq!(calls.len(), 1, "the duplicate's own call: {acts:?}");
    assert_eq!(calls[0].1, BODY);
    let acts = answer_root(&host, &w, calls[0].0, 201, br#"{"order":2}"#);
    let r = replies(&acts, 11);
    assert_eq!((r.len(), r[0].0, r[0].1["order"].as_i64()), (1, 201, Some(2)));
    second.on_log(&host);
    first.on_log(&host);
}

#[test]
fn a_held_duplicate_is_answered_from_the_root_once_the_first_completes() {
    let (host, w) = setup(SHARED);
    let (mut first, flow) = send(&host, &w, 10, "/s", "k1");
    assert_eq!(flow, Flow::Continue, "claimed on the shared store at once");
    let (mut second, flow) = send(&host, &w, 11, "/s", "k1");
    assert_eq!(flow, Flow::Pause, "held");
    host.take_acts();
    host.enter(ROOT);
    w.on_tick(&host);
    assert!(host.take_acts().is_empty(), "still in flight: keep holding");
    let (h, b) = upstream_answers(&host, &mut first, 10);
    assert_eq!((h, b), (Flow::Continue, Flow::Continue), "the shared store writes at once");
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    let r = replies(&acts, 11);
    assert_eq!(r.len(), 1, "{acts:?}");
    assert_eq!((r[0].0, r[0].1["order"].as_i64()), (201, Some(1)), "the first answer, replayed");
    assert_eq!(host.histogram(&wait_histogram_name("s")).len(), 1, "the wait is timed in idem_wait_time");
    assert_eq!(host.current(), ROOT, "the root switches back to itself after acting on a stream");
    second.on_log(&host);
    first.on_log(&host);
}

/// Held duplicates of one key are looked at as one group, on the shared store as on Redis: when
/// the first attempt fails and frees the key, the oldest takes it over, alone — the others wait
/// on it, and get its answer.
#[test]
fn held_duplicates_on_the_shared_store_share_one_look_and_one_takes_a_freed_key() {
    let (host, w) = setup(SHARED);
    let (mut first, _) = send(&host, &w, 10, "/s", "k1");
    let mut held: Vec<Stream> = (11..14)
        .map(|ctx| {
            let (s, flow) = send(&host, &w, ctx, "/s", "k1");
            assert_eq!(flow, Flow::Pause, "ctx {ctx} held");
            s
        })
        .collect();
    host.take_acts();
    host.update(10, |st| *st = st.clone().with_response(503, &[("content-type", b"text/plain")], b"down"));
    host.enter(10);
    first.on_response_headers(&host, false);
    first.on_response_body(&host, 4, true);
    assert_eq!(count(&host, "s", "released"), 1, "the failed attempt frees the key");
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    let resumed = resumed_requests(&acts);
    assert_eq!(resumed, vec![11], "the oldest held duplicate takes the key over, alone: {acts:?}");
    assert!((12..14).all(|ctx| replies(&acts, ctx).is_empty()), "the others wait on it: {acts:?}");
    upstream_answers(&host, &mut held[0], 11);
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    for ctx in 12..14 {
        let r = replies(&acts, ctx);
        assert_eq!(r.len(), 1, "ctx {ctx}: {acts:?}");
        assert_eq!((r[0].0, r[0].1["order"].as_i64()), (201, Some(1)), "ctx {ctx}: the new owner's answer");
    }
    assert_eq!(count(&host, "s", "forwarded"), 2, "two runs: the failed one, one retry");
    assert_eq!(count(&host, "s", "waited"), 3, "each held duplicate, once");
    assert_eq!(count(&host, "s", "replayed"), 2, "the two that went on waiting, replayed");
    assert_eq!(count(&host, "s", "in_flight"), 0);
}

#[test]
fn a_detached_answer_for_a_client_that_left_is_stored_not_sent() {
    let (host, w) = setup(SHARED);
    let (mut s, flow) = send(&host, &w, 10, "/d", "k1");
    assert_eq!(flow, Flow::Pause, "the root sends it");
    host.take_acts();
    let acts = root_sends(&host, &w);
    let call = acts.iter().find_map(|a| match a {
        Act::Dispatch { context: ROOT, token, cluster, body, .. } => Some((*token, cluster.clone(), body.clone())),
        _ => None,
    });
    let (token, cluster, body) = call.expect("a detached call from the root");
    assert_eq!(body, BODY);
    assert_eq!(cluster, "idem_reentry", "it re-enters Envoy to take the route the inline request would take");
    // The client leaves (an SDK timeout); Envoy would still accept the context for a moment.
    s.on_log(&host);
    let acts = answer_root(&host, &w, token, 200, br#"{"order":7}"#);
    assert!(replies(&acts, 10).is_empty(), "never a reply into a stream that ended: {acts:?}");
    assert_eq!(count(&host, "d", "stored"), 1);
    // The retry gets the first execution's answer.
    let (_, flow) = send(&host, &w, 11, "/d", "k1");
    assert_eq!(flow, Flow::Pause);
    let r = replies(&host.take_acts(), 11);
    assert_eq!((r[0].0, r[0].1["order"].as_i64()), (200, Some(7)));
}

#[test]
fn token_issue_and_use_on_redis() {
    let policy = format!(
        "{WEBDIS}\n[tokens]\nsecret = \"0123456789abcdef0123456789abcdef\"\n[[route]]\nname = \"t\"\nmatch = {{ method = \"POST\", path = \"/form\" }}\nmode = \"token\"\nstore = \"redis\"\n"
    );
    let (host, w) = setup(&policy);
    host.open(10, FakeStream::request("POST", "/api/idempotent/token", &[("authorization", b"Bearer a")], b""));
    let mut s = Stream::new(Rc::clone(&w), 10);
    assert_eq!(s.on_request_headers(&host, true), Flow::Pause);
    let (_, set) = dispatched(&host.take_acts(), 10);
    assert!(set.starts_with("SET/t%3At%3A"), "{set}");
    let acts = answer_stream(&host, &mut s, 10, 200, br#"{"SET":[true,"OK"]}"#);
    let r = replies(&acts, 10);
    assert_eq!((r[0].0, r[0].1["code"].as_str()), (200, Some("TOKEN_ISSUED")));
    assert!(r[0].1["token"].as_str().is_some_and(|t| t.len() == 32));
}

/// `request.total_size` as Envoy's `get_property` returns it (int64, little-endian).
fn total_size(host: &FakeHost, ctx: u32, size: i64) {
    host.update(ctx, |st| {
        st.properties.insert("request.total_size".into(), size.to_le_bytes().to_vec());
    });
}

const SHARED_BODY_ROUTE: &str = "[[route]]\nname = \"b\"\nmatch = { method = \"POST\", path = \"/b\" }\n";

/// Opens a request on /b and pauses at its headers for the body, as Envoy without
/// `allow_on_headers_stop_iteration` leaves it: no body callback follows.
fn paused_for_body(host: &FakeHost, w: &Rc<Worker>, ctx: u32) -> Stream {
    let req = FakeStream::request("POST", "/b", &[("idempotency-key", b"k"), ("authorization", b"Bearer a")], BODY);
    host.open(ctx, req);
    total_size(host, ctx, 120);
    let mut s = Stream::new(Rc::clone(w), ctx);
    assert_eq!(s.on_request_headers(host, false), Flow::Pause);
    s
}

#[test]
fn a_withheld_body_is_answered_500_misconfigured_not_left_hanging() {
    let (host, w) = setup(SHARED_BODY_ROUTE);
    let _slow = paused_for_body(&host, &w, 10);
    let _stuck = paused_for_body(&host, &w, 11);
    // A slow client: nothing received yet. The root waits, answers nothing.
    host.enter(ROOT);
    w.on_tick(&host);
    assert!(host.take_acts().is_empty());
    // Envoy has received the body of request 11 (its size grew) and never called the body callback.
    total_size(&host, 11, 120 + BODY.len() as i64);
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    for ctx in [10, 11] {
        let r = replies(&acts, ctx);
        assert_eq!(r.len(), 1, "{acts:?}");
        assert_eq!(r[0].0, 500);
        assert_eq!(r[0].1["code"], "IDEMPOTENCY_MISCONFIGURED");
    }
    assert_eq!(count(&host, "b", "misconfigured"), 2);
    let logs = host.logs();
    let said: Vec<_> = logs.iter().filter(|(_, l)| l.contains("allow_on_headers_stop_iteration: true")).collect();
    assert_eq!(said.len(), 1, "logged once per worker: {logs:?}");
    // Known now: the next such request is answered at its headers, no wait.
    let req = FakeStream::request("POST", "/b", &[("idempotency-key", b"k2"), ("authorization", b"Bearer a")], BODY);
    host.open(12, req);
    let mut s = Stream::new(Rc::clone(&w), 12);
    assert_eq!(s.on_request_headers(&host, false), Flow::Pause);
    let r = replies(&host.take_acts(), 12);
    assert_eq!((r.len(), r[0].0), (1, 500));
    assert_eq!(host.logs().iter().filter(|(_, l)| l.contains("allow_on_headers_stop_iteration")).count(), 1);
}

#[test]
fn a_delivered_body_ends_the_watch_for_good() {
    let (host, w) = setup(SHARED_BODY_ROUTE);
    let mut s = paused_for_body(&host, &w, 10);
    let waiting = paused_for_body(&host, &w, 11);
    assert_eq!(s.on_request_body(&host, BODY.len(), true), Flow::Continue, "claimed and forwarded");
    // Body bytes arrive for 11 too, but delivery was proven: no misconfigured answer.
    total_size(&host, 11, 500);
    host.enter(ROOT);
    w.on_tick(&host);
    assert!(replies(&host.take_acts(), 11).is_empty());
    assert_eq!(count(&host, "b", "misconfigured"), 0);
    drop(waiting);
}

#[test]
fn shadow_mode_lets_a_withheld_body_through_unexamined() {
    let (host, w) = setup("[[route]]\nname = \"b\"\nmatch = { method = \"POST\", path = \"/b\" }\nmode = \"shadow\"\n");
    let mut s = paused_for_body(&host, &w, 10);
    total_size(&host, 10, 1000);
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    assert!(acts.contains(&Act::ResumeRequest { context: 10 }), "{acts:?}");
    assert!(replies(&acts, 10).is_empty());
    assert_eq!(count(&host, "b", "shadow_would_block"), 1);
    // Envoy then delivers the buffered body: it passes, nothing is claimed.
    host.enter(10);
    assert_eq!(s.on_request_body(&host, BODY.len(), true), Flow::Continue);
    assert_eq!(count(&host, "b", "forwarded"), 0);
}

#[test]
fn routes_deciding_at_the_headers_never_wait_for_the_body() {
    let (host, w) = setup(
        "[[route]]\nname = \"h\"\nmatch = { method = \"POST\", path = \"/h\" }\n[route.key]\nfingerprint = [\"method\", \"path\"]\n",
    );
    let req = FakeStream::request("POST", "/h", &[("idempotency-key", b"k"), ("authorization", b"Bearer a")], BODY);
    host.open(10, req);
    let mut s = Stream::new(Rc::clone(&w), 10);
    assert_eq!(s.on_request_headers(&host, false), Flow::Continue, "decided at the headers");
    assert_eq!(count(&host, "h", "forwarded"), 1);
}

/// The host calls the bench's request costs (each one a VM exit in Envoy), counted as
/// `make bench`'s breakdown counts them, held to a budget: a change that adds calls to a hot
/// path fails here, not only as a slower bench on a noisy machine.
#[test]
fn the_bench_paths_stay_within_their_host_call_budgets() {
    use idem_filter::testing::bench::{drive, REDIS_POLICY, ROOT, SHARED_POLICY};
    use idem_filter::testing::CountingHost;
    let cases = [
        ("(c) shared store, fresh key", SHARED_POLICY, false, false, 12),
        ("(d) shared store, replay", SHARED_POLICY, false, true, 9),
        ("(e) Redis, fresh key", REDIS_POLICY, true, false, 27),
        ("(f) Redis, replay of a kept answer", REDIS_POLICY, true, true, 10),
    ];
    for (case, policy, redis, replay, budget) in cases {
        let fake = FakeHost::new(1_800_000_000_000);
        fake.set_log_level(2); // Envoy's default: info
        fake.enter(ROOT);
        let w = Rc::new(Worker::configure(&fake, &fake, ROOT, policy.as_bytes()).unwrap());
        if replay {
            drive(&fake, &fake, &|| (), &w, 2, "replayed", redis);
        }
        let counting = CountingHost::new(&fake);
        for i in 0..50u32 {
            let key = if replay { "replayed".to_string() } else { format!("k-{i}") };
            drive(&fake, &counting, &|| counting.entered(), &w, 10 + i, &key, redis);
        }
        let tally = counting.take();
        let calls: u64 = tally.iter().map(|t| t.1).sum();
        assert!(calls > 0, "{case}: nothing counted");
        // Rounded: a few calls are once per worker (the route name, read once and kept).
        let per_request = (calls as f64 / 50.0).round() as u64;
        assert!(per_request <= budget, "{case}: {per_request} host calls per request, budget {budget}: {tally:?}");
        if replay {
            let stored = tally.iter().find(|t| t.0 == "set_shared_data").map_or(0, |t| t.1);
            assert_eq!(stored, 0, "{case}: a replay writes nothing: {tally:?}");
        }
    }
}

// ---- gRPC

const GRPC: &str = r#"
[[route]]
name = "g"
match = { method = "POST", path = "/shop.Orders/Create" }
"#;

/// A unary gRPC call (one length-prefixed message), headers and body delivered.
fn grpc_call(host: &FakeHost, w: &Rc<Worker>, ctx: u32, key: &str, message: &[u8]) -> (Stream, Flow) {
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    let req = FakeStream::request(
        "POST",
        "/shop.Orders/Create",
        &[("content-type", b"application/grpc"), ("idempotency-key", key.as_bytes()), ("authorization", b"Bearer a")],
        &frame,
    );
    host.open(ctx, req);
    let mut s = Stream::new(Rc::clone(w), ctx);
    assert_eq!(s.on_request_headers(host, false), Flow::Pause);
    let flow = s.on_request_body(host, frame.len(), true);
    (s, flow)
}

/// The service answers a gRPC call: headers, a message, trailers with `grpc-status`.
fn grpc_answers(host: &FakeHost, s: &mut Stream, ctx: u32, status: &str) {
    let body = b"\0\0\0\0\x05order";
    host.update(ctx, |st| {
        *st = st.clone().with_response(200, &[("content-type", b"application/grpc")], body);
        st.response_trailers =
            vec![(b"grpc-status".to_vec(), status.as_bytes().to_vec()), (b"x-trace".to_vec(), b"t1".to_vec())];
    });
    host.enter(ctx);
    assert_eq!(s.on_response_headers(host, false), Flow::Continue);
    s.on_response_body(host, body.len(), false);
    s.on_response_trailers(host);
}

fn header_of(host: &FakeHost, ctx: u32, name: &str) -> Option<Vec<u8>> {
    host.enter(ctx);
    idem_filter::host::Host::request_header(host, name)
}

#[test]
fn a_completed_grpc_call_is_replayed_whole_through_the_echo() {
    let (host, w) = setup(GRPC);
    let (mut first, flow) = grpc_call(&host, &w, 10, "k1", b"sku=A1");
    assert_eq!(flow, Flow::Continue, "claimed and forwarded");
    grpc_answers(&host, &mut first, 10, "0");
    assert_eq!(count(&host, "g", "stored"), 1);
    first.on_log(&host);
    host.take_acts();

    // The repeat goes on — to the echo listener, with the answer in a slot — not as a local reply
    // (Envoy would make that trailers-only and drop the message).
    let (mut again, flow) = grpc_call(&host, &w, 11, "k1", b"sku=A1");
    assert_eq!(flow, Flow::Continue);
    assert!(replies(&host.take_acts(), 11).is_empty());
    assert_eq!(header_of(&host, 11, ":path").as_deref(), Some(&b"/.idem/replay"[..]));
    assert_eq!(header_of(&host, 11, "content-type").as_deref(), Some(&b"application/x-idem-replay"[..]));
    let token = header_of(&host, 11, "x-idem-replay").expect("the slot's token");

    // The echo instance (same VM, same shared data) answers with the slot's answer, once.
    let echo =
        Rc::new(Worker::configure(&host, &host, ROOT, b"role = \"echo\"\n[shared]\nnamespace = \"idem\"\n").unwrap());
    let echo_once = |ctx| {
        let req = FakeStream::request("POST", "/.idem/replay", &[("x-idem-replay", token.as_slice())], b"");
        host.open(ctx, req);
        let mut e = Stream::new(Rc::clone(&echo), ctx);
        assert_eq!(e.on_request_headers(&host, true), Flow::Pause);
        replies_raw(&host.take_acts(), ctx)
    };
    let answered = echo_once(90);
    assert_eq!(answered.len(), 1);
    assert_eq!((answered[0].status, answered[0].body.as_slice()), (200, &b"\0\0\0\0\x05order"[..]));
    assert!(answered[0].headers.contains(&("idempotent-replayed".into(), b"true".to_vec())));
    assert_eq!(echo_once(91)[0].status, 404, "a slot is taken once");

    // Back on the replaying stream: the echo's answer passes, and its end gets the trailers.
    host.update(11, |st| *st = st.clone().with_response(200, &[("content-type", b"application/grpc")], b"x"));
    host.enter(11);
    assert_eq!(again.on_response_headers(&host, false), Flow::Continue);
    assert_eq!(again.on_response_body(&host, 1, true), Flow::Continue);
    let trailers: Vec<(String, Vec<u8>)> = host
        .take_acts()
        .into_iter()
        .filter_map(|a| match a {
            Act::Trailer { context: 11, name, value } => Some((name, value)),
            _ => None,
        })
        .collect();
    assert_eq!(trailers, vec![("grpc-status".into(), b"0".to_vec()), ("x-trace".into(), b"t1".to_vec())]);
}

#[test]
fn a_failed_grpc_call_is_released_and_an_unknown_one_held() {
    let (host, w) = setup(GRPC);
    // UNAVAILABLE (a 200 at the HTTP level): the call failed, the retry runs.
    let (mut first, _) = grpc_call(&host, &w, 10, "k1", b"m");
    grpc_answers(&host, &mut first, 10, "14");
    assert_eq!(count(&host, "g", "released"), 1);
    let (_, flow) = grpc_call(&host, &w, 11, "k1", b"m");
    assert_eq!(flow, Flow::Continue, "the retry is forwarded");
    // DEADLINE_EXCEEDED from the service: it may have done the work — held, and the retry gets a
    // trailers-only gRPC answer with a code no common retry policy retries.
    let (mut slow, _) = grpc_call(&host, &w, 12, "k2", b"m");
    grpc_answers(&host, &mut slow, 12, "4");
    assert_eq!(count(&host, "g", "held"), 1);
    host.take_acts();
    let (_, flow) = grpc_call(&host, &w, 13, "k2", b"m");
    assert_eq!(flow, Flow::Pause);
    let r = replies_raw(&host.take_acts(), 13);
    assert_eq!((r[0].status, r[0].grpc_status), (200, Some(9)), "FAILED_PRECONDITION");
    assert!(String::from_utf8_lossy(&r[0].body).starts_with("IDEMPOTENCY_OUTCOME_UNKNOWN: "));
    assert!(r[0].headers.iter().any(|(n, _)| n == "grpc-status-details-bin"));
    // Another message under the key: refused (FAILED_PRECONDITION), and a repeat in flight is
    // UNAVAILABLE with a pushback.
    let (_, _) = grpc_call(&host, &w, 14, "k2", b"other");
    let r = replies_raw(&host.take_acts(), 14);
    assert!(String::from_utf8_lossy(&r[0].body).starts_with("IDEMPOTENCY_KEY_REUSED: "), "{r:?}");
    let (_inflight, _) = grpc_call(&host, &w, 15, "k3", b"m");
    host.take_acts();
    let (_, _) = grpc_call(&host, &w, 16, "k3", b"m");
    let r = replies_raw(&host.take_acts(), 16);
    assert_eq!(r[0].grpc_status, Some(14), "UNAVAILABLE");
    assert!(r[0].headers.contains(&("grpc-retry-pushback-ms".into(), b"1000".to_vec())));
}

#[test]
fn a_grpc_message_sent_compressed_is_the_same_request() {
    use std::io::Write;
    let (host, w) = setup(GRPC);
    let (mut first, _) = grpc_call(&host, &w, 10, "k1", b"sku=A1");
    grpc_answers(&host, &mut first, 10, "0");
    host.take_acts();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(b"sku=A1").unwrap();
    let compressed = gz.finish().unwrap();
    let mut frame = vec![1u8];
    frame.extend_from_slice(&(compressed.len() as u32).to_be_bytes());
    frame.extend_from_slice(&compressed);
    let headers: [(&str, &[u8]); 4] = [
        ("content-type", b"application/grpc"),
        ("grpc-encoding", b"gzip"),
        ("idempotency-key", b"k1"),
        ("authorization", b"Bearer a"),
    ];
    host.open(11, FakeStream::request("POST", "/shop.Orders/Create", &headers, &frame));
    let mut s = Stream::new(Rc::clone(&w), 11);
    s.on_request_headers(&host, false);
    assert_eq!(s.on_request_body(&host, frame.len(), true), Flow::Continue, "a replay, not 422");
    assert!(replies_raw(&host.take_acts(), 11).is_empty());
    assert_eq!(count(&host, "g", "replayed"), 1);
}

#[test]
fn a_grpc_call_sending_a_second_message_passes_unprotected_before_its_half_close() {
    let (host, w) = setup(GRPC);
    let frame = |m: &[u8]| [&[0u8][..], &(m.len() as u32).to_be_bytes(), m].concat();
    let two = [frame(b"line=1"), frame(b"line=2")].concat();
    let headers: [(&str, &[u8]); 3] =
        [("content-type", b"application/grpc"), ("idempotency-key", b"k1"), ("authorization", b"Bearer a")];
    host.open(10, FakeStream::request("POST", "/shop.Orders/Create", &headers, &two));
    let mut s = Stream::new(Rc::clone(&w), 10);
    assert_eq!(s.on_request_headers(&host, false), Flow::Pause);
    // One message, the stream still open: it may be a unary call about to half-close.
    assert_eq!(s.on_request_body(&host, frame(b"line=1").len(), false), Flow::Pause);
    // A second message: a streaming call goes on now, not at its half-close.
    assert_eq!(s.on_request_body(&host, two.len(), false), Flow::Continue);
    assert_eq!(count(&host, "g", "unprotected"), 1);
    assert_eq!(count(&host, "g", "forwarded"), 0, "nothing claimed");
    assert!(replies_raw(&host.take_acts(), 10).is_empty());
}

fn replies_raw(acts: &[Act], context: u32) -> Vec<idem_filter::response::LocalReply> {
    acts.iter()
        .filter_map(|a| match a {
            Act::Reply { context: c, reply } if *c == context => Some(reply.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn the_root_asks_redis_once_whether_it_evicts_and_warns_when_it_does() {
    let logged = |host: &FakeHost| {
        host.logs().into_iter().filter(|(_, l)| l.contains(idem_filter::lifecycle::EVICTS_LOG)).count()
    };
    let (host, w) = setup_unprobed(&redis_policy(""));
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    assert_eq!(dispatches(&acts), 1, "{acts:?}");
    let (token, body) = dispatched(&acts, ROOT);
    assert!(body.starts_with("EVAL/") && body.contains("INFO") && body.ends_with("/1/t%3Aprobe"), "{body}");
    // Webdis down: asked again later, not at every tick.
    answer_root(&host, &w, token, 0, b"");
    assert_eq!(dispatches(&root_ticks_after(&host, &w, 1_000)), 0);
    let acts = root_ticks_after(&host, &w, 30_000);
    let (token, _) = dispatched(&acts, ROOT);
    answer_root(&host, &w, token, 200, br#"{"EVAL":"allkeys-lru|104857600"}"#);
    assert_eq!(logged(&host), 1);
    assert!(host.logs().iter().any(|(_, l)| l.contains("maxmemory-policy allkeys-lru, maxmemory 104857600")));
    assert_eq!(dispatches(&root_ticks_after(&host, &w, 60_000)), 0, "asked once");
    // noeviction: no warning; an ACL without INFO: said so, without the warning.
    for (reply, says) in [
        (&br#"{"EVAL":"noeviction|0"}"#[..], "maxmemory-policy is noeviction"),
        (br#"{"EVAL":"unreadable:NOPERM this user has no permissions to run the 'info' command"}"#, "could not read"),
    ] {
        let (host, w) = setup_unprobed(&redis_policy(""));
        host.enter(ROOT);
        w.on_tick(&host);
        let (token, _) = dispatched(&host.take_acts(), ROOT);
        answer_root(&host, &w, token, 200, reply);
        assert_eq!(logged(&host), 0);
        assert!(host.logs().iter().any(|(_, l)| l.contains(says)), "{:?}", host.logs());
    }
}

#[test]
fn counters_exist_from_the_start_only_for_what_the_alerts_read() {
    let defined = |host: &FakeHost, route: &str, o: &str| {
        host.counter_defined(&counter_name(route, *Outcome::ALL.iter().find(|x| x.name() == o).unwrap()))
    };
    let two = "[[route]]\nname = \"k\"\nmatch = { method = \"POST\", path = \"/k\" }\n\
               [[route]]\nname = \"t\"\nmatch = { method = \"POST\", path = \"/t\" }\nmode = \"token\"\n";
    let (host, w) = setup(two);
    assert!(defined(&host, "k", "replayed") && defined(&host, "k", "store_error") && defined(&host, "k", "held"));
    assert!(defined(&host, "t", "token_rejected") && !defined(&host, "t", "replayed"), "token routes: token outcomes");
    assert!(!defined(&host, "k", "missing_key") && !defined(&host, "k", "token_issued"));
    // An outcome that happens gets its series then.
    host.open(10, FakeStream::request("POST", "/k", &[("authorization", b"Bearer a")], b"{}"));
    let mut s = Stream::new(Rc::clone(&w), 10);
    s.on_request_headers(&host, false);
    assert!(defined(&host, "k", "missing_key"));
    assert_eq!(count(&host, "k", "missing_key"), 1);
    for (zero_series, replayed, missing) in [("all", true, true), ("none", false, false)] {
        let (host, _) = setup(&format!("[metrics]\nzero_series = \"{zero_series}\"\n{two}"));
        assert_eq!(
            (defined(&host, "k", "replayed"), defined(&host, "k", "missing_key")),
            (replayed, missing),
            "{zero_series}"
        );
    }
}

/// Request `ctx` (key `key`) claimed, forwarded and answered by the upstream: its completion is
/// queued for the root.
fn answered_upstream(host: &FakeHost, w: &Rc<Worker>, ctx: u32, key: &str) -> Stream {
    let (mut s, _) = send(host, w, ctx, "/r", key);
    host.take_acts();
    answer_stream(host, &mut s, ctx, 200, br#"{"SET":null}"#);
    upstream_answers(host, &mut s, ctx);
    host.take_acts();
    s
}

/// The root's Webdis calls among `acts`: (token, body).
fn root_calls(acts: &[Act]) -> Vec<(u32, String)> {
    acts.iter()
        .filter_map(|a| match a {
            Act::Dispatch { context, token, body, .. } if *context == ROOT => {
                Some((*token, String::from_utf8(body.clone()).unwrap()))
            }
            _ => None,
        })
        .collect()
}

/// Requests `ctxs` (keys `k<ctx>`) claimed, forwarded and answered: their completions are queued,
/// and the root has sent them, one call each (below the calls a worker keeps out). Returns the
/// streams and the calls' tokens.
fn completions_out(host: &FakeHost, w: &Rc<Worker>, ctxs: std::ops::Range<u32>) -> (Vec<Stream>, Vec<u32>) {
    let mut streams = Vec::new();
    let mut tokens = Vec::new();
    for ctx in ctxs {
        streams.push(answered_upstream(host, w, ctx, &format!("k{ctx}")));
        let calls = root_calls(&root_sends(host, w));
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert!(!calls[0].1.contains("local%20F%3D"), "a lone write is its own command: {}", calls[0].1);
        tokens.push(calls[0].0);
    }
    (streams, tokens)
}

#[test]
fn completions_queued_while_four_writes_are_out_go_together_in_one_call() {
    let (host, w) = setup(&redis_policy(""));
    // Light load: each completion goes out at once, alone, up to four calls out.
    let (mut first, tokens) = completions_out(&host, &w, 10..14);
    // Two more finish meanwhile: they wait.
    let mut later: Vec<Stream> = [20, 21].iter().map(|c| answered_upstream(&host, &w, *c, &format!("k{c}"))).collect();
    assert!(root_calls(&root_sends(&host, &w)).is_empty(), "nothing goes out while four writes are out");
    // One write's reply sends both, in one call.
    let acts = answer_root(&host, &w, tokens[0], 200, br#"{"EVAL":1}"#);
    assert!(acts.contains(&Act::ResumeResponse { context: 10 }), "{acts:?}");
    let calls = root_calls(&acts);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (batch, body) = &calls[0];
    assert!(body.starts_with("EVAL/local%20F%3D") && body.contains("/2/t%3Ak%3A"), "{body}");
    // Each write's own reply reaches its stream; a step Redis refused is retried alone.
    let acts = answer_root(&host, &w, *batch, 200, br#"{"EVAL":[1,"ERR OOM command not allowed"]}"#);
    assert!(acts.contains(&Act::ResumeResponse { context: 20 }), "{acts:?}");
    assert!(acts.contains(&Act::ResumeResponse { context: 21 }), "the client is not kept waiting: {acts:?}");
    assert_eq!((count(&host, "r", "stored"), count(&host, "r", "write_retried")), (2, 1));
    let retry = root_calls(&root_ticks_after(&host, &w, 150));
    assert_eq!(retry.len(), 1, "{retry:?}");
    assert!(!retry[0].1.contains("local%20F%3D"), "{}", retry[0].1);
    answer_root(&host, &w, retry[0].0, 200, br#"{"EVAL":1}"#);
    assert_eq!(count(&host, "r", "stored"), 3);
    for s in first.iter_mut().chain(&mut later) {
        s.on_log(&host);
    }
}

#[test]
fn a_batch_refused_crossslot_is_sent_again_per_hash_slot() {
    let (host, w) = setup(&redis_policy(""));
    let (_first, tokens) = completions_out(&host, &w, 10..14);
    let _later: Vec<Stream> = [20, 21, 22].iter().map(|c| answered_upstream(&host, &w, *c, &format!("k{c}"))).collect();
    let calls = root_calls(&answer_root(&host, &w, tokens[0], 200, br#"{"EVAL":1}"#));
    assert_eq!(calls.len(), 1, "{calls:?}");
    let crossslot = br#"{"EVAL":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#;
    let acts = answer_root(&host, &w, calls[0].0, 200, crossslot);
    assert_eq!(count(&host, "r", "write_retried"), 0, "nothing ran: not a refused write");
    assert!(host.logs().iter().any(|(_, l)| l.contains("batched per hash slot")), "{:?}", host.logs());
    // Three keys of three different slots: three calls, each a lone write.
    let calls = root_calls(&acts);
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(calls.iter().all(|(_, b)| !b.contains("local%20F%3D")), "{calls:?}");
}

/// A request whose claim is queued: paused, nothing dispatched.
fn queued(host: &FakeHost, w: &Rc<Worker>, ctx: u32, key: &str) -> Stream {
    let (s, flow) = send(host, w, ctx, "/r", key);
    assert_eq!(flow, Flow::Pause);
    let acts = host.take_acts();
    assert_eq!(dispatches(&acts), 0, "a claim call is out: this one waits for the batch: {acts:?}");
    s
}

/// Light load: requests 6 to 9 (keys `k6`…`k9`) each send their claim at once, from their own
/// stream: four claim calls out.
fn four_claims_out(host: &FakeHost, w: &Rc<Worker>) -> Vec<Stream> {
    (6..10)
        .map(|ctx| {
            let (s, _) = send(host, w, ctx, "/r", &format!("k{ctx}"));
            let (_, claim) = dispatched(&host.take_acts(), ctx);
            assert!(claim.starts_with("SET/"), "{claim}");
            s
        })
        .collect()
}

#[test]
fn claims_made_while_four_claim_calls_are_out_go_together_in_one_call() {
    let (host, w) = setup(&redis_policy(""));
    let mut out = four_claims_out(&host, &w);
    let mut a = out.pop().unwrap();
    let mut b = queued(&host, &w, 11, "k2");
    let mut c = queued(&host, &w, 12, "k3");
    let mut gone = queued(&host, &w, 13, "k4");
    // A body chunk or trailers while queued stay paused (continuing would forward unclaimed).
    assert_eq!(b.on_request_body(&host, BODY.len(), true), Flow::Hold);
    assert_eq!(b.on_request_trailers(&host), Flow::Pause);
    // The first claim's answer wakes the root, which sends the three queued claims in one call.
    let acts = answer_stream(&host, &mut a, 10, 200, br#"{"SET":null}"#);
    assert!(
        acts.contains(&Act::ResumeRequest { context: 10 }) && acts.contains(&Act::Enqueue { queue: 7 }),
        "{acts:?}"
    );
    let calls = root_calls(&root_sends(&host, &w));
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (token, body) = &calls[0];
    assert!(body.starts_with("EVAL/local%20out%3D") && body.contains("/3/t%3Ak%3A"), "{body}");
    // One client leaves while the batch is out.
    host.enter(13);
    gone.on_log(&host);
    host.close(13);
    // k2 is ours, k3 was claimed meanwhile by another gateway for another payload, k4's claim
    // landed for nobody.
    let record = "I|00000000000000aa|x00000000000000000000000000000000|1800000000000|1800000030000";
    let reply = format!(r#"{{"EVAL":["","{record}",""]}}"#);
    let acts = answer_root(&host, &w, *token, 200, reply.as_bytes());
    assert!(acts.contains(&Act::ResumeRequest { context: 11 }), "{acts:?}");
    assert_eq!(replies(&acts, 12).first().map(|r| r.0), Some(422), "{acts:?}");
    assert_eq!(count(&host, "r", "forwarded"), 2);
    // The claim of the client that left is released (owner-checked), by the root.
    let release = root_calls(&root_sends(&host, &w));
    assert!(release.iter().any(|(_, b)| b.contains("redis%2Ecall%28%27DEL%27")), "{release:?}");
    // k2 goes on as any forwarded request: its answer is stored, its lease renewed meanwhile.
    upstream_answers(&host, &mut b, 11);
    let acts = host.take_acts();
    assert!(acts.contains(&Act::Enqueue { queue: 7 }), "{acts:?}");
    for s in out.iter_mut().chain([&mut a, &mut b, &mut c]) {
        s.on_log(&host);
    }
}

#[test]
fn claim_batches_out_together_when_the_cluster_refuses_crossslot_are_all_sent_again() {
    let (host, w) = setup(&redis_policy(""));
    let mut out = four_claims_out(&host, &w);
    // Two batches go out before the first answer: each found two claims queued.
    let mut batches = Vec::new();
    for (i, pair) in [[11, 12], [13, 14]].iter().enumerate() {
        let mut waiting: Vec<Stream> = pair.iter().map(|c| queued(&host, &w, *c, &format!("k{c}"))).collect();
        answer_stream(&host, &mut out[i], 6 + i as u32, 200, br#"{"SET":null}"#);
        let calls = root_calls(&root_sends(&host, &w));
        assert_eq!(calls.len(), 1, "{calls:?}");
        batches.push(calls[0].0);
        out.append(&mut waiting);
    }
    let crossslot = br#"{"EVAL":[false,"CROSSSLOT Keys in request don't hash to the same slot"]}"#;
    let mut resent = Vec::new();
    for token in batches {
        resent.extend(root_calls(&answer_root(&host, &w, token, 200, crossslot)));
    }
    assert_eq!(count(&host, "r", "store_error"), 0, "nothing ran: no claim failed");
    // Four keys of four slots, sent again one slot per call, four calls out at a time: two now,
    // two when a call returns.
    assert_eq!(resent.len(), 2, "{resent:?}");
    let more = root_calls(&answer_root(&host, &w, resent[0].0, 200, br#"{"EVAL":[""]}"#));
    assert_eq!(more.len(), 2, "{more:?}");
    assert!(resent.iter().chain(&more).all(|(_, b)| b.contains("/1/t%3Ak%3A")), "one key per call");
    assert_eq!(count(&host, "r", "store_error"), 0);
    let once = host.logs().iter().filter(|(_, l)| l.contains("batched per hash slot")).count();
    assert_eq!(once, 1, "logged once per worker");
}

#[test]
fn a_held_duplicate_that_takes_the_key_over_is_renewed_before_its_answer_begins() {
    let (host, w) = setup(&redis_policy(WAIT));
    let (mut first, _held, _) = held_on_redis(&host, &w, 1);
    // The first request ends without an answer; only the held one can hold a lease now.
    host.enter(10);
    first.on_log(&host);
    host.take_acts();
    let calls = root_calls(&root_ticks_after(&host, &w, 20));
    let (token, poll) = calls.iter().find(|(_, b)| b.starts_with("SET/")).expect("the held request's poll");
    let record = poll.split('/').nth(2).unwrap().to_string();
    let acts = answer_root(&host, &w, *token, 200, br#"{"SET":null}"#);
    assert!(acts.contains(&Act::ResumeRequest { context: 11 }), "it takes the key over: {acts:?}");
    // Its upstream is slow: no response headers for a third of the lease, and the lease is renewed.
    let renewals: Vec<(u32, String)> = root_calls(&root_ticks_after(&host, &w, 10_001))
        .into_iter()
        .filter(|(_, b)| percent_decode(b).contains("PEXPIRE") && b.contains(&record))
        .collect();
    assert_eq!(renewals.len(), 1, "the taken-over claim is renewed: {renewals:?}");
}

/// Header names are stored lower case whatever the upstream's spelling (an HTTP/1 upstream's
/// names reach the filter as Envoy keeps them; HTTP/2 requires lower case): the replay carries
/// the upstream's header once, under the name a client's lookup finds.
#[test]
fn an_answers_header_names_are_stored_and_replayed_lower_case() {
    let (host, w) = setup(SHARED);
    let (mut first, _) = send(&host, &w, 10, "/s", "k1");
    let body = br#"{"order":1}"#;
    let headers: [(&str, &[u8]); 2] = [("Content-Type", b"application/json"), ("X-Order-Ref", b"7")];
    host.update(10, |st| *st = st.clone().with_response(201, &headers, body));
    host.enter(10);
    first.on_response_headers(&host, false);
    first.on_response_body(&host, body.len(), true);
    first.on_log(&host);
    host.take_acts();
    let (_, flow) = send(&host, &w, 11, "/s", "k1");
    assert_eq!(flow, Flow::Pause, "replayed");
    let acts = host.take_acts();
    let replayed = acts
        .iter()
        .find_map(|a| match a {
            Act::Reply { context: 11, reply } => Some(reply.headers.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no replay: {acts:?}"));
    assert!(replayed.contains(&("x-order-ref".to_string(), b"7".to_vec())), "{replayed:?}");
    assert!(!replayed.iter().any(|(n, _)| n.bytes().any(|b| b.is_ascii_uppercase())), "{replayed:?}");
}

// ---- bodies still arriving when the decision comes (issue 36)

const HEADER_ROUTE: &str = "[route.key]\nfingerprint = [\"method\", \"path\"]\n";

/// A request on a route deciding at the headers, its body still to come.
fn uploading(host: &FakeHost, w: &Rc<Worker>, ctx: u32, path: &str, key: &str) -> (Stream, Flow) {
    let req =
        FakeStream::request("POST", path, &[("idempotency-key", key.as_bytes()), ("authorization", b"Bearer a")], BODY);
    host.open(ctx, req);
    let mut s = Stream::new(Rc::clone(w), ctx);
    let flow = s.on_request_headers(host, false);
    (s, flow)
}

#[test]
fn a_claim_decided_by_a_batch_lets_the_rest_of_its_body_through() {
    let (host, w) = setup(&redis_policy(HEADER_ROUTE));
    let mut out: Vec<Stream> = (6..10)
        .map(|ctx| {
            let (s, flow) = uploading(&host, &w, ctx, "/r", &format!("k{ctx}"));
            assert_eq!(flow, Flow::Pause);
            s
        })
        .collect();
    host.take_acts();
    // The fifth claim waits for the batch while its client still uploads.
    let (mut queued, flow) = uploading(&host, &w, 11, "/r", "k11");
    assert_eq!(flow, Flow::Pause);
    assert_eq!(dispatches(&host.take_acts()), 0, "queued for the next batch");
    assert_eq!(queued.on_request_body(&host, 4, false), Flow::Hold, "held with flow control, not buffered");
    let mut a = out.pop().unwrap();
    answer_stream(&host, &mut a, 9, 200, br#"{"SET":null}"#);
    let calls = root_calls(&root_sends(&host, &w));
    let (token, _) = &calls[0];
    let acts = answer_root(&host, &w, *token, 200, br#"{"EVAL":[""]}"#);
    assert!(acts.contains(&Act::ResumeRequest { context: 11 }), "{acts:?}");
    // The rest of the body arrives after the root resumed it: it goes upstream (it stayed
    // paused, and the request hung, when the stream did not learn it was resumed).
    host.enter(11);
    assert_eq!(queued.on_request_body(&host, 4, false), Flow::Continue);
    assert_eq!(queued.on_request_body(&host, 4, true), Flow::Continue);
    // Its answer is captured and stored as any forwarded request's.
    let (h, b) = upstream_answers(&host, &mut queued, 11);
    assert_eq!((h, b), (Flow::Continue, Flow::Pause), "held until its record is written");
    assert_eq!(count(&host, "r", "forwarded"), 2);
    for s in out.iter_mut().chain([&mut a, &mut queued]) {
        s.on_log(&host);
    }
}

#[test]
fn a_held_duplicate_that_takes_the_key_over_while_uploading_is_forwarded_whole() {
    let policy = "[[route]]\nname = \"w\"\nmatch = { method = \"POST\", path = \"/w\" }\n[route.key]\nfingerprint = [\"method\", \"path\"]\non_in_flight = \"wait\"\nwait_timeout = \"10s\"\n";
    let (host, w) = setup(policy);
    let (mut first, flow) = uploading(&host, &w, 10, "/w", "k1");
    assert_eq!(flow, Flow::Continue, "claimed at the headers");
    assert_eq!(first.on_request_body(&host, BODY.len(), true), Flow::Continue);
    let (mut second, flow) = uploading(&host, &w, 11, "/w", "k1");
    assert_eq!(flow, Flow::Pause, "held as a duplicate");
    assert_eq!(second.on_request_body(&host, 4, false), Flow::Hold);
    // The first fails with a 500: its claim is released, and the duplicate takes the key over.
    host.update(10, |st| *st = st.clone().with_response(500, &[], b"oops"));
    host.enter(10);
    first.on_response_headers(&host, false);
    first.on_response_body(&host, 4, true);
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    assert!(acts.contains(&Act::ResumeRequest { context: 11 }), "{acts:?}");
    host.enter(11);
    assert_eq!(second.on_request_body(&host, 4, false), Flow::Continue, "the rest goes upstream");
    assert_eq!(second.on_request_body(&host, 4, true), Flow::Continue);
    let (h, b) = upstream_answers(&host, &mut second, 11);
    assert_eq!((h, b), (Flow::Continue, Flow::Continue));
    assert_eq!(count(&host, "w", "stored"), 1, "the takeover's answer is stored, not an unknown outcome");
    first.on_log(&host);
    second.on_log(&host);
}

#[test]
fn an_answer_decided_while_the_body_arrives_waits_for_its_end() {
    let (host, w) =
        setup(&format!("[[route]]\nname = \"h\"\nmatch = {{ method = \"POST\", path = \"/h\" }}\n{HEADER_ROUTE}"));
    let (mut first, _) = uploading(&host, &w, 10, "/h", "k1");
    first.on_request_body(&host, BODY.len(), true);
    upstream_answers(&host, &mut first, 10);
    host.take_acts();
    // The repeat is a replay, known at its headers; its 2 MiB body is still on its way.
    let (mut repeat, flow) = uploading(&host, &w, 11, "/h", "k1");
    assert_eq!(flow, Flow::Pause);
    assert!(replies(&host.take_acts(), 11).is_empty(), "not sent under an unread body");
    for _ in 0..31 {
        assert_eq!(repeat.on_request_body(&host, 65_536, false), Flow::Discard, "read and dropped");
    }
    assert!(host.take_acts().is_empty());
    assert_eq!(repeat.on_request_body(&host, 65_536, true), Flow::Discard);
    let r = replies(&host.take_acts(), 11);
    assert_eq!((r.len(), r[0].0), (1, 201), "the replay, once the request has ended");
    // Trailers end a request too.
    let (mut third, _) = uploading(&host, &w, 12, "/h", "k1");
    host.take_acts();
    assert_eq!(third.on_request_body(&host, 10, false), Flow::Discard);
    assert_eq!(third.on_request_trailers(&host), Flow::Pause);
    assert_eq!(replies(&host.take_acts(), 12).len(), 1);
    // A client that never ends its body gets the answer after PARK_MS, from the root.
    let (_fourth, _) = uploading(&host, &w, 13, "/h", "k1");
    host.take_acts();
    host.advance(idem_filter::lifecycle::PARK_MS);
    host.enter(ROOT);
    w.on_tick(&host);
    assert_eq!(replies(&host.take_acts(), 13).len(), 1, "sent when overdue");
    // A request without a body is answered at once.
    host.open(
        14,
        FakeStream::request("POST", "/h", &[("idempotency-key", b"k1"), ("authorization", b"Bearer a")], b""),
    );
    let mut s = Stream::new(Rc::clone(&w), 14);
    assert_eq!(s.on_request_headers(&host, true), Flow::Pause);
    assert_eq!(replies(&host.take_acts(), 14).len(), 1);
}

#[test]
fn a_body_over_the_limit_gets_the_filters_413_once_the_client_has_sent_it() {
    let (host, w) = setup(&format!("{}\nmax_body_bytes = 16\n", SHARED_BODY_ROUTE));
    let mut s = paused_for_body(&host, &w, 10);
    assert_eq!(s.on_request_body(&host, 17, false), Flow::Discard, "over the limit: the rest is dropped");
    assert!(replies(&host.take_acts(), 10).is_empty());
    assert_eq!(s.on_request_body(&host, 1 << 20, true), Flow::Discard);
    let r = replies(&host.take_acts(), 10);
    assert_eq!(r.first().map(|r| r.0), Some(413), "the filter's own 413, read by the client");
}

#[test]
fn an_early_answer_waits_only_briefly_until_envoy_is_seen_to_deliver_bodies() {
    // Without allow_on_headers_stop_iteration no body chunk ever comes to a paused request:
    // an answer that waited for the body's end would wait for nothing.
    let (host, w) =
        setup(&format!("[[route]]\nname = \"h\"\nmatch = {{ method = \"POST\", path = \"/h\" }}\n{HEADER_ROUTE}"));
    let mut first = Stream::new(Rc::clone(&w), 10);
    host.open(
        10,
        FakeStream::request("POST", "/h", &[("idempotency-key", b"k1"), ("authorization", b"Bearer a")], b""),
    );
    first.on_request_headers(&host, true);
    upstream_answers(&host, &mut first, 10);
    host.take_acts();
    let (_repeat, _) = uploading(&host, &w, 11, "/h", "k1");
    assert!(replies(&host.take_acts(), 11).is_empty());
    host.advance(idem_filter::lifecycle::UNPROVEN_PARK_MS);
    host.enter(ROOT);
    w.on_tick(&host);
    assert_eq!(replies(&host.take_acts(), 11).len(), 1, "sent once the short wait is over");
}

#[test]
fn a_request_no_policy_matches_passes_with_a_warning_once_per_path() {
    // A policy on /refund under an Envoy route /refunds: one refund ran twice, silently.
    let (host, w) = setup("[[route]]\nname = \"create-refund\"\nmatch = { method = \"POST\", path = \"/refund\" }\n");
    let warnings = || host.logs().into_iter().filter(|(_, l)| l.contains("no policy matches")).count();
    for (ctx, path) in [(10, "/refunds"), (11, "/refunds?x=1"), (12, "/refunds/77"), (13, "/refunds/78")] {
        let mut req = FakeStream::request("POST", path, &[("idempotency-key", b"k")], b"");
        req.properties.insert("xds.route_name".into(), b"refunds".to_vec());
        host.open(ctx, req);
        let mut s = Stream::new(Rc::clone(&w), ctx);
        assert_eq!(s.on_request_headers(&host, true), Flow::Continue, "unmatched passes by default");
    }
    assert_eq!(warnings(), 2, "once for /refunds, once for /refunds/<n>: {:?}", host.logs());
    // A safe method needs no policy: it passes without advice that does not apply to it.
    for (ctx, method) in [(20, "GET"), (21, "HEAD"), (22, "OPTIONS")] {
        host.open(ctx, FakeStream::request(method, "/reports/today", &[], b""));
        let mut s = Stream::new(Rc::clone(&w), ctx);
        assert_eq!(s.on_request_headers(&host, true), Flow::Continue);
    }
    assert_eq!(warnings(), 2, "no warning for a safe method: {:?}", host.logs());
    let line = host.logs().into_iter().find(|(_, l)| l.contains("no policy matches")).unwrap();
    assert!(
        line.1.contains("POST /refunds on Envoy route \"refunds\"") && line.1.contains("unmatched = \"reject\""),
        "{line:?}"
    );
}

/// The echo listener's instance shares the gateway's plugin name, so its namespace; its
/// [shared] shape is the default. Configuring it (every worker does, at start and on reload)
/// must leave the gateway's buckets as they are: it once rewrote a one-bucket, 64-entry store
/// as an 8-entry bucket while requests were in flight, and the next claims found it full.
#[test]
fn the_echo_instance_leaves_the_gateways_buckets_alone() {
    use idem_filter::host::Host;
    let gateway = "[shared]\nnamespace = \"idem\"\nbuckets = 1\nentries_per_bucket = 64\n\n\
                   [[route]]\nname = \"r\"\nmatch = { method = \"POST\", path = \"/r\" }\n";
    let (host, _gateway) = setup_unprobed(gateway);
    let store = |host: &FakeHost| -> Vec<(String, Vec<u8>)> {
        let keys = host.shared_keys();
        keys.into_iter().map(|k| (k.clone(), host.shared_get(&k).unwrap().unwrap().0)).collect()
    };
    let before = store(&host);
    assert!(before.iter().any(|(_, v)| v.len() == 64 * 60), "the gateway's 64-entry bucket: {:?}", before.len());
    Worker::configure(&host, &host, ROOT, b"role = \"echo\"\n[shared]\nnamespace = \"idem\"\n").unwrap();
    assert_eq!(store(&host), before, "the echo created or rewrote shared-data keys");
}

/// A second gateway configuration of the namespace asking for another store shape (another
/// plugin of the same name, or the same one reloaded with another `[shared]`) refuses to load,
/// with the line Envoy logs, and leaves the first store's keys as they were.
#[test]
fn a_gateway_of_another_store_shape_in_the_namespace_refuses_to_load() {
    use idem_filter::host::Host;
    let gateway = |entries: u32| {
        format!(
            "[shared]\nnamespace = \"idem\"\nbuckets = 2\nentries_per_bucket = {entries}\n\n\
             [[route]]\nname = \"r\"\nmatch = {{ method = \"POST\", path = \"/r\" }}\n"
        )
    };
    let (host, _first) = setup_unprobed(&gateway(8));
    let snapshot = |host: &FakeHost| -> Vec<(String, Vec<u8>)> {
        host.shared_keys().into_iter().map(|k| (k.clone(), host.shared_get(&k).unwrap().unwrap().0)).collect()
    };
    let before = snapshot(&host);
    let Err(line) = Worker::configure(&host, &host, ROOT, gateway(64).as_bytes()) else {
        panic!("a 64-entry gateway loaded over an 8-entry store");
    };
    assert!(line.starts_with("idem: cannot initialise the shared store: namespace idem already holds"), "{line}");
    assert!(line.contains("2 buckets × 8 entries") && line.contains("asks for 2 × 64"), "{line}");
    assert_eq!(snapshot(&host), before, "the first store's keys untouched");
    assert!(Worker::configure(&host, &host, ROOT, gateway(8).as_bytes()).is_ok(), "the same shape loads");
}

#[test]
fn the_load_line_says_which_instance_loaded_how_many_routes() {
    let (host, _w) = setup_unprobed("[[route]]\nname = \"r\"\nmatch = { method = \"POST\", path = \"/r\" }\n");
    let (echo_host, _) = setup_unprobed("role = \"echo\"\n");
    let line = host.logs().into_iter().find(|(_, l)| l.contains("route policies")).unwrap().1;
    assert!(line.contains("(gateway) loaded 1 route policies"), "{line}");
    let echo = echo_host.logs().into_iter().find(|(_, l)| l.contains("route policies")).unwrap().1;
    assert!(echo.contains("(echo) loaded 0 route policies"), "an echo instance says so: {echo}");
}
