#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! Every callout reply reaches the call that sent it: the module's own dispatcher
//! ([`Contexts`]) driven as Envoy drives it — each call kept on the context effective when it
//! was sent, its reply delivered there, cancelled when that context ends — including replies
//! delivered on another context than their owner's, which is how a Webdis reply once reached
//! the wrong owner (issue 35).

use idem_filter::lifecycle::{Contexts, Flow, STRAY_REPLIES_COUNTER};
use idem_filter::testing::{Act, FakeHost, FakeStream};

const ROOT: u32 = 1;
const POLICY: &str = r#"
[redis]
cluster = "webdis"
timeout = "500ms"
prefix = "t:"

[[route]]
name = "r"
match = { method = "POST", path = "/r" }
store = "redis"
"#;
const BODY: &[u8] = br#"{"sku":"A1"}"#;
const PROBE_REPLY: &[u8] = br#"{"EVAL":"noeviction|0"}"#;
const CLAIMED: &[u8] = br#"{"SET":null}"#;

fn root(host: &FakeHost) -> Contexts {
    let mut c = Contexts::default();
    host.enter(ROOT);
    c.create(ROOT, 0);
    assert!(c.configure(host, host, ROOT, POLICY.as_bytes()));
    host.take_acts();
    c
}

/// Opens stream `ctx` with key `key`, its whole request delivered.
fn request(host: &FakeHost, c: &mut Contexts, ctx: u32, key: &str) -> Flow {
    let req =
        FakeStream::request("POST", "/r", &[("idempotency-key", key.as_bytes()), ("authorization", b"Bearer a")], BODY);
    host.open(ctx, req);
    c.create(ctx, ROOT);
    c.on_stream(ctx, |s| s.on_request_headers(host, false));
    c.on_stream(ctx, |s| s.on_request_body(host, BODY.len(), true))
}

fn dispatched_by(acts: &[Act], context: u32) -> Vec<(u32, String)> {
    acts.iter()
        .filter_map(|a| match a {
            Act::Dispatch { context: c, token, body, .. } if *c == context => {
                Some((*token, String::from_utf8_lossy(body).into_owned()))
            }
            _ => None,
        })
        .collect()
}

/// Envoy delivers `token`'s reply on context `on`.
fn deliver(host: &FakeHost, c: &mut Contexts, on: u32, token: u32, body: &[u8]) -> Vec<Act> {
    host.enter(on);
    host.deliver_to(token, 200, body);
    c.on_call_response(host, on, token, 1, body.len());
    host.take_acts()
}

#[test]
fn a_reply_delivered_on_another_context_still_reaches_the_call_that_sent_it() {
    let host = FakeHost::new(1_800_000_000_000);
    let mut c = root(&host);
    // The worker's first tick asks Redis whether it evicts; a first request's claim is out too.
    c.on_tick(&host, ROOT);
    let probe = dispatched_by(&host.take_acts(), ROOT)[0].0;
    assert_eq!(request(&host, &mut c, 10, "k1"), Flow::Pause);
    let claim = dispatched_by(&host.take_acts(), 10)[0].0;
    // The probe's reply arrives on the stream's context (the SDK's dispatcher and Envoy once
    // disagreed on where a call was kept): the stream must not read it as its claim's.
    let acts = deliver(&host, &mut c, 10, probe, PROBE_REPLY);
    assert!(acts.is_empty(), "the stream read another call's reply: {acts:?}");
    assert_eq!(c.stream(10).unwrap().call_out(), Some(claim), "the stream still waits for its own claim");
    assert!(host.logs().iter().any(|(_, l)| l.contains("noeviction")), "the probe's reply reached the root");
    // The claim's own reply, on the root's context this time: the stream gets it.
    let acts = deliver(&host, &mut c, ROOT, claim, CLAIMED);
    assert!(acts.contains(&Act::ResumeRequest { context: 10 }), "{acts:?}");
    // A reply under a token nobody sent, or sent again: counted, never read.
    let acts = deliver(&host, &mut c, 10, claim, br#"{"SET":"I|x"}"#);
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(host.counter(STRAY_REPLIES_COUNTER), 1);
    assert_eq!(host.logs().iter().filter(|(_, l)| l.contains("no waiting call owns")).count(), 1, "logged once");
}

#[test]
fn a_stream_never_reads_a_reply_under_another_token() {
    let host = FakeHost::new(1_800_000_000_000);
    let mut c = root(&host);
    request(&host, &mut c, 10, "k1");
    let claim = dispatched_by(&host.take_acts(), 10)[0].0;
    host.enter(10);
    host.deliver(200, PROBE_REPLY);
    // Handed straight to the stream (as the SDK's dispatcher would) under the wrong token.
    c.stream(10).unwrap().on_call_response(&host, claim + 1000, 1, PROBE_REPLY.len());
    assert!(host.take_acts().is_empty());
    assert_eq!(c.stream(10).unwrap().call_out(), Some(claim));
    assert_eq!(host.counter(STRAY_REPLIES_COUNTER), 1);
}

/// Envoy 1.40 keeps a stream's callout on the root context and answers it after the stream
/// ended (docs/design.md, "Where a callout lives"): that reply is expected — dropped unread,
/// not a stray — and the claim is still released, owner-checked, for the client that left. A
/// reply that never comes (a host that cancels the call instead) is forgotten after its time.
#[test]
fn a_claim_answered_after_its_client_left_is_expected_not_a_stray() {
    let host = FakeHost::new(1_800_000_000_000);
    let mut c = root(&host);
    for (ctx, key) in [(10, "k-left"), (11, "k-never-answered")] {
        assert_eq!(request(&host, &mut c, ctx, key), Flow::Pause);
    }
    let acts = host.take_acts();
    let (left, never) = (dispatched_by(&acts, 10)[0].0, dispatched_by(&acts, 11)[0].0);
    for ctx in [10, 11] {
        host.enter(ctx);
        c.on_log(&host, ctx);
        host.close(ctx);
        c.delete(ctx);
    }
    // The orphan releases (owner-checked) go from the root's queue, as before.
    host.enter(ROOT);
    c.on_queue_ready(&host, ROOT);
    let releases = dispatched_by(&host.take_acts(), ROOT);
    let keys_released: usize = releases.iter().map(|(_, body)| body.matches("t%3Ak%3A").count()).sum();
    assert_eq!(keys_released, 2, "both claims released: {releases:?}");
    // The claim's reply arrives on the root, after its stream ended: nobody reads it, nothing counts it.
    let acts = deliver(&host, &mut c, ROOT, left, br#"{"SET":"I|00000000000000aa|x|1|2"}"#);
    assert!(acts.is_empty(), "{acts:?}");
    assert_eq!(host.counter(STRAY_REPLIES_COUNTER), 0, "an expected reply counted as a stray");
    assert!(!host.logs().iter().any(|(_, l)| l.contains("no waiting call owns")), "{:?}", host.logs());
    // Delivered again, the same token is nobody's: a stray.
    deliver(&host, &mut c, ROOT, left, CLAIMED);
    assert_eq!(host.counter(STRAY_REPLIES_COUNTER), 1);
    // The other claim is never answered: its token is forgotten once its time is up, and a reply
    // that late counts as a stray.
    host.advance(5 * 60 * 1000);
    host.enter(ROOT);
    c.on_tick(&host, ROOT);
    host.take_acts();
    deliver(&host, &mut c, ROOT, never, CLAIMED);
    assert_eq!(host.counter(STRAY_REPLIES_COUNTER), 2, "a reply past its time is a stray");
}

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);
impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 33) as usize) % n.max(1)
    }
}

/// Interleavings of stream claims (alone and batched by group commit), the eviction probe,
/// root ticks and queue events, streams ending mid-call, and replies delivered on their own
/// context or another one: no reply is read by anyone but its sender, and every call is
/// answered or cancelled.
#[test]
fn no_interleaving_hands_a_reply_to_another_owner() {
    for seed in 0..300u64 {
        let mut rng = Lcg(seed);
        let host = FakeHost::new(1_800_000_000_000);
        let mut c = root(&host);
        let mut next_ctx = 10u32;
        let mut gone: Vec<u32> = Vec::new();
        let mut resumed: Vec<u32> = Vec::new();
        let mut contexts = vec![ROOT];
        for _step in 0..60 {
            match rng.below(6) {
                0 | 1 => {
                    let ctx = next_ctx;
                    next_ctx += 1;
                    contexts.push(ctx);
                    request(&host, &mut c, ctx, &format!("k{ctx}"));
                }
                2 => {
                    host.enter(ROOT);
                    if rng.below(2) == 0 {
                        c.on_tick(&host, ROOT);
                    } else {
                        c.on_queue_ready(&host, ROOT);
                    }
                }
                3 => {
                    // A client leaves.
                    let live: Vec<u32> = contexts.iter().copied().filter(|x| *x != ROOT && !gone.contains(x)).collect();
                    if let Some(&ctx) = live.get(rng.below(live.len())) {
                        host.enter(ctx);
                        c.on_log(&host, ctx);
                        host.close(ctx);
                        c.delete(ctx);
                        gone.push(ctx);
                    }
                }
                _ => {
                    // A reply: on the context its call was kept on, or (one in three) another.
                    let out = host.callouts();
                    if let Some(&(token, kept_on)) = out.get(rng.below(out.len())) {
                        // Envoy delivers only on a live context.
                        let live: Vec<u32> = contexts.iter().copied().filter(|x| !gone.contains(x)).collect();
                        let on = if rng.below(3) == 0 { live[rng.below(live.len())] } else { kept_on };
                        resumed.extend(answer(&host, &mut c, on, token));
                    }
                }
            }
            for a in host.take_acts() {
                if let Act::ResumeRequest { context } = a {
                    resumed.push(context);
                }
            }
        }
        // Drain: answer everything still out, where it was kept, until nothing is.
        for _ in 0..50 {
            host.enter(ROOT);
            c.on_queue_ready(&host, ROOT);
            let out = host.callouts();
            if out.is_empty() {
                break;
            }
            for (token, kept_on) in out {
                resumed.extend(answer(&host, &mut c, kept_on, token));
            }
        }
        for a in host.take_acts() {
            if let Act::ResumeRequest { context } = a {
                resumed.push(context);
            }
        }
        let streams: Vec<u32> = contexts.iter().copied().filter(|x| *x != ROOT).collect();
        for ctx in &streams {
            let n = resumed.iter().filter(|r| *r == ctx).count();
            if gone.contains(ctx) {
                assert!(n <= 1, "seed {seed}: stream {ctx} resumed {n} times");
            } else {
                assert_eq!(n, 1, "seed {seed}: stream {ctx} resumed {n} times (its claim's reply lost or misread)");
                assert_eq!(c.stream(*ctx).unwrap().call_out(), None, "seed {seed}: {ctx} still waits");
            }
        }
        let errors = host.logs().into_iter().filter(|(_, l)| l.contains("store_error") || l.contains("could not read"));
        assert_eq!(errors.count(), 0, "seed {seed}: a reply was read by the wrong owner: {:?}", host.logs());
        assert!(host.callouts().is_empty(), "seed {seed}: calls left out");
    }
}

/// Redis answers call `token` (Envoy delivers it on context `on`): the streams resumed meanwhile.
fn answer(host: &FakeHost, c: &mut Contexts, on: u32, token: u32) -> Vec<u32> {
    host.take_callout(token);
    let body = reply_for(host, token);
    let acts = deliver(host, c, on, token, &body);
    acts.into_iter()
        .filter_map(|a| match a {
            Act::ResumeRequest { context } => Some(context),
            _ => None,
        })
        .collect()
}

/// The reply Redis would give to the call `token` carried: every claim is won, the probe says
/// noeviction, writes succeed.
fn reply_for(host: &FakeHost, token: u32) -> Vec<u8> {
    let cmd = host.dispatched(token).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    if cmd.contains("maxmemory") {
        return PROBE_REPLY.to_vec();
    }
    if cmd.starts_with("SET/") {
        return CLAIMED.to_vec();
    }
    if let Some(n) = batch_size(&cmd) {
        let members = vec!["\"\""; n].join(",");
        return format!(r#"{{"EVAL":[{members}]}}"#).into_bytes();
    }
    br#"{"EVAL":1}"#.to_vec()
}

/// The number of claims a `CLAIM_BATCH` call carries (its `numkeys`), if it is one.
fn batch_size(cmd: &str) -> Option<usize> {
    if !cmd.starts_with("EVAL/") || !cmd.contains("local%20out%3D") {
        return None;
    }
    cmd.split('/').nth(2)?.parse().ok()
}
