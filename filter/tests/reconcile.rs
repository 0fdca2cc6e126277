#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! `[route.reconcile]` through the fake host: a repeat that meets an unknown outcome asks the
//! service with one lookup per key, and the lookup's answer decides (ran, absent, failed) — also
//! when the asking client leaves, when the lookup's lease runs out, and when a held duplicate
//! waits meanwhile.

use idem_filter::engine::outcome::counter_name;
use idem_filter::engine::Outcome;
use idem_filter::lifecycle::{Flow, Stream, Worker, STRAY_REPLIES_COUNTER};
use idem_filter::testing::{Act, FakeHost, FakeStream};
use std::rc::Rc;

const ROOT: u32 = 1;
const BODY: &[u8] = br#"{"amount":"100.00"}"#;

fn policy(extra_key: &str) -> String {
    format!(
        r#"
[[route]]
name = "o"
match = {{ method = "POST", path = "/o" }}

[route.key]
{extra_key}

[route.reconcile]
lookup = "/orders/by-key/{{key}}?src=idem"
cluster = "orders"
timeout = "2s"
"#
    )
}

fn setup(policy: &str) -> (FakeHost, Rc<Worker>) {
    let host = FakeHost::new(1_800_000_000_000);
    host.enter(ROOT);
    let w = Worker::configure(&host, &host, ROOT, policy.as_bytes()).unwrap();
    host.take_acts();
    (host, Rc::new(w))
}

fn count(host: &FakeHost, outcome: &str) -> u64 {
    let o = Outcome::ALL.iter().find(|o| o.name() == outcome).unwrap();
    host.counter(&counter_name("o", *o))
}

fn send(host: &FakeHost, w: &Rc<Worker>, ctx: u32, key: &str) -> (Stream, Flow) {
    let headers: &[(&str, &[u8])] =
        &[("idempotency-key", key.as_bytes()), ("authorization", b"Bearer a"), (":authority", b"shop.example")];
    host.open(ctx, FakeStream::request("POST", "/o", headers, BODY));
    host.enter(ctx);
    let mut s = Stream::new(Rc::clone(w), ctx);
    assert_eq!(s.on_request_headers(host, false), Flow::Pause);
    let flow = s.on_request_body(host, BODY.len(), true);
    (s, flow)
}

/// A first attempt forwarded whose client leaves before any answer: the outcome is unknown.
fn unknown_outcome(host: &FakeHost, w: &Rc<Worker>, key: &str) {
    let (mut first, flow) = send(host, w, 10, key);
    assert_eq!(flow, Flow::Continue, "the first attempt is forwarded");
    host.close(10);
    first.on_log(host);
    assert_eq!(count(host, "held"), 1, "the outcome is held as unknown");
    host.take_acts();
}

/// The lookups dispatched: (context, token, cluster, path).
fn lookups(acts: &[Act]) -> Vec<(u32, u32, String, String)> {
    acts.iter()
        .filter_map(|a| match a {
            Act::Dispatch { context, token, cluster, path, .. } => {
                Some((*context, *token, cluster.clone(), path.clone()))
            }
            _ => None,
        })
        .collect()
}

fn replies(acts: &[Act], ctx: u32) -> Vec<idem_filter::response::LocalReply> {
    acts.iter()
        .filter_map(|a| match a {
            Act::Reply { context, reply } if *context == ctx => Some(reply.clone()),
            _ => None,
        })
        .collect()
}

fn header<'a>(r: &'a idem_filter::response::LocalReply, name: &str) -> Option<&'a [u8]> {
    r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
}

fn code(r: &idem_filter::response::LocalReply) -> String {
    let j: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    j["error"]["code"].as_str().or(j["code"].as_str()).unwrap_or_default().to_string()
}

/// The lookup's answer, delivered where Envoy delivers it (the asking stream).
fn answer_lookup(host: &FakeHost, s: &mut Stream, ctx: u32, status: u16, body: &[u8]) -> Vec<Act> {
    host.enter(ctx);
    host.deliver_with(
        &[(":status", status.to_string().as_bytes()), ("content-type", b"application/json"), ("set-cookie", b"s=1")],
        body,
        &[],
    );
    let token = s.call_out().expect("a lookup out");
    host.take_callout(token);
    s.on_call_response(host, token, 3, body.len());
    host.take_acts()
}

#[test]
fn the_lookup_says_it_ran_and_its_answer_becomes_the_keys_answer() {
    let (host, w) = setup(&policy(""));
    let key = "k/../1%00";
    unknown_outcome(&host, &w, key);

    let (mut repeat, flow) = send(&host, &w, 11, key);
    assert_eq!(flow, Flow::Pause, "the repeat waits for the lookup");
    let sent = lookups(&host.take_acts());
    assert_eq!(sent.len(), 1, "{sent:?}");
    let (ctx, _, cluster, path) = &sent[0];
    assert_eq!((*ctx, cluster.as_str()), (11, "orders"));
    assert_eq!(path, "/orders/by-key/k%2F%2E%2E%2F1%2500?src=idem", "the key stays in its segment");

    // Another repeat meanwhile: the lookup is out, so it is answered as in flight, asks nothing.
    let (_third, flow) = send(&host, &w, 12, key);
    assert_eq!(flow, Flow::Pause);
    let acts = host.take_acts();
    assert!(lookups(&acts).is_empty(), "one lookup per key: {acts:?}");
    assert_eq!(replies(&acts, 12).iter().map(code).collect::<Vec<_>>(), ["REQUEST_IN_PROGRESS"]);

    let acts = answer_lookup(&host, &mut repeat, 11, 200, br#"{"order_id":"ord-7","amount":"100.00"}"#);
    let reply = &replies(&acts, 11)[0];
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, br#"{"order_id":"ord-7","amount":"100.00"}"#);
    assert_eq!(header(reply, "idempotent-replayed"), Some(&b"true"[..]));
    assert_eq!(header(reply, "idempotency-reconciled"), Some(&b"true"[..]));
    assert_eq!(header(reply, "set-cookie"), None, "never replayed");
    assert_eq!((count(&host, "reconciled_ran"), count(&host, "forwarded")), (1, 1));

    // Later repeats replay the stored answer, without a lookup and without the reconciled mark.
    let (_later, _) = send(&host, &w, 13, key);
    let acts = host.take_acts();
    assert!(lookups(&acts).is_empty());
    let reply = &replies(&acts, 13)[0];
    assert_eq!((reply.status, reply.body.as_slice()), (200, &br#"{"order_id":"ord-7","amount":"100.00"}"#[..]));
    assert_eq!(header(reply, "idempotency-reconciled"), None);
    assert_eq!(count(&host, "replayed"), 1);
}

#[test]
fn the_lookup_says_it_did_not_run_and_the_repeat_runs_once() {
    let (host, w) = setup(&policy(""));
    unknown_outcome(&host, &w, "k2");
    let (mut repeat, _) = send(&host, &w, 11, "k2");
    host.take_acts();
    let acts = answer_lookup(&host, &mut repeat, 11, 404, br#"{"error":"no such order"}"#);
    assert!(acts.contains(&Act::ResumeRequest { context: 11 }), "forwarded as the first request: {acts:?}");
    assert!(replies(&acts, 11).is_empty());
    assert_eq!(count(&host, "reconciled_absent"), 1);

    // While it runs, a repeat is in flight; once it answers, repeats replay its answer.
    let (_during, _) = send(&host, &w, 12, "k2");
    assert_eq!(replies(&host.take_acts(), 12).iter().map(code).collect::<Vec<_>>(), ["REQUEST_IN_PROGRESS"]);
    let answer = br#"{"order_id":"ord-8"}"#;
    host.update(11, |st| *st = st.clone().with_response(201, &[("content-type", b"application/json")], answer));
    host.enter(11);
    repeat.on_response_headers(&host, false);
    repeat.on_response_body(&host, answer.len(), true);
    repeat.on_log(&host);
    assert_eq!(count(&host, "stored"), 1);
    let (_after, _) = send(&host, &w, 13, "k2");
    let reply = &replies(&host.take_acts(), 13)[0];
    assert_eq!((reply.status, reply.body.as_slice()), (201, &answer[..]));
}

#[test]
fn a_lookup_that_settles_nothing_is_409_and_the_next_repeat_asks_again() {
    let (host, w) = setup(&policy(""));
    unknown_outcome(&host, &w, "k3");
    for (status, ctx) in [(503u16, 11u32), (0, 12)] {
        let (mut repeat, _) = send(&host, &w, ctx, "k3");
        assert_eq!(lookups(&host.take_acts()).len(), 1, "status {status}: a lookup is sent");
        let acts = answer_lookup(&host, &mut repeat, ctx, status, b"");
        let reply = &replies(&acts, ctx)[0];
        assert_eq!((reply.status, code(reply).as_str()), (409, "IDEMPOTENCY_OUTCOME_UNKNOWN"), "status {status}");
    }
    assert_eq!(count(&host, "reconcile_failed"), 2);
}

#[test]
fn a_client_that_leaves_during_its_lookup_frees_it_at_once_and_its_late_reply_is_expected() {
    let (host, w) = setup(&policy(""));
    unknown_outcome(&host, &w, "k4");
    let (mut gone, _) = send(&host, &w, 11, "k4");
    let lookup = lookups(&host.take_acts())[0].1;
    host.close(11);
    gone.on_log(&host);
    let (_next, _) = send(&host, &w, 12, "k4");
    assert_eq!(lookups(&host.take_acts()).len(), 1, "the next repeat asks without waiting for the lease");
    // Envoy 1.40 keeps the lookup on the root context and answers it there after the stream
    // ended: expected, dropped unread — not a stray, and nothing warned about.
    assert_eq!(host.take_callout(lookup), Some(ROOT), "the lookup goes on after its stream ended");
    host.enter(ROOT);
    host.deliver(200, br#"{"order":"ord-1"}"#);
    w.on_call_response(&host, lookup, 1, 17);
    assert_eq!(host.counter(STRAY_REPLIES_COUNTER), 0, "the late reply is not a stray");
    let warned = host.logs().into_iter().any(|(_, l)| l.contains("no waiting call owns"));
    assert!(!warned, "{:?}", host.logs());
    assert!(host.take_acts().is_empty(), "nothing done with it");
}

#[test]
fn under_a_host_that_cancels_a_streams_calls_the_lookup_ends_with_its_client() {
    let (host, w) = setup(&policy(""));
    unknown_outcome(&host, &w, "k5");
    let (mut gone, _) = send(&host, &w, 11, "k5");
    assert_eq!(lookups(&host.take_acts()).len(), 1);
    host.close_cancelling_callouts(11);
    gone.on_log(&host);
    assert!(host.callouts().is_empty(), "the lookup is cancelled with its stream");
    let (_next, _) = send(&host, &w, 12, "k5");
    assert_eq!(lookups(&host.take_acts()).len(), 1, "the next repeat asks without waiting for the lease");
}

#[test]
fn a_lookup_whose_lease_ran_out_is_fenced_off() {
    let (host, w) = setup(&policy(""));
    unknown_outcome(&host, &w, "k5");
    let (mut slow, _) = send(&host, &w, 11, "k5");
    assert_eq!(lookups(&host.take_acts()).len(), 1);
    // The lease is the timeout and one to three seconds more (whole seconds, odd): past it,
    // another repeat takes the lookup.
    host.advance(5_100);
    let (mut second, _) = send(&host, &w, 12, "k5");
    assert_eq!(lookups(&host.take_acts()).len(), 1, "the lapsed lookup is taken over");
    // The first lookup's late answer finds the key under another lookup: it writes nothing.
    let acts = answer_lookup(&host, &mut slow, 11, 200, br#"{"order_id":"late"}"#);
    let reply = &replies(&acts, 11)[0];
    assert_eq!(code(reply), "REQUEST_IN_PROGRESS", "{:?}", String::from_utf8_lossy(&reply.body));
    let acts = answer_lookup(&host, &mut second, 12, 404, b"");
    assert!(acts.contains(&Act::ResumeRequest { context: 12 }));
    assert_eq!((count(&host, "reconciled_ran"), count(&host, "reconciled_absent")), (0, 1));
}

#[test]
fn held_duplicates_wait_for_the_lookup_and_get_its_answer() {
    let (host, w) = setup(&policy("on_in_flight = \"wait\"\nwait_timeout = \"10s\""));
    unknown_outcome(&host, &w, "k6");
    let (mut asking, _) = send(&host, &w, 11, "k6");
    host.take_acts();
    let mut held = Vec::new();
    for ctx in 12..32 {
        let (s, flow) = send(&host, &w, ctx, "k6");
        assert_eq!(flow, Flow::Pause);
        held.push(s);
    }
    assert!(lookups(&host.take_acts()).is_empty(), "twenty held duplicates, one lookup");
    answer_lookup(&host, &mut asking, 11, 200, br#"{"order_id":"ord-9"}"#);
    // The root polls the held duplicates: each gets the reconciled answer as a replay.
    host.advance(600);
    host.enter(ROOT);
    w.on_tick(&host);
    let acts = host.take_acts();
    for ctx in 12..32 {
        let got = replies(&acts, ctx);
        assert_eq!(got.len(), 1, "ctx {ctx}: {acts:?}");
        assert_eq!((got[0].status, got[0].body.as_slice()), (200, &br#"{"order_id":"ord-9"}"#[..]));
    }
    assert_eq!(count(&host, "reconciled_ran"), 1);
}

#[test]
fn reconcile_tables_that_cannot_work_refuse_to_load() {
    for (extra, says) in [
        ("[route.reconcile]\nlookup = \"/o/{key}\"\ntimeout = \"90s\"", "at most 60s"),
        ("[route.reconcile]\nlookup = \"/o/{key}\"\nran = [200]\nabsent = [\"2xx\"]", "status 200 is in both"),
        ("[route.reconcile]\nlookup = \"/o/{key.2}\"", "the key has 1 part"),
        ("[route.reconcile]\nlookup = \"/o/{id}\"", "unknown placeholder {id}"),
        ("[route.reconcile]\nlookup = \"/o/{key}\"\nmethod = \"POST\"", "unknown field `method`"),
    ] {
        let p = format!("[[route]]\nname = \"o\"\nmatch = {{ method = \"POST\", path = \"/o\" }}\n{extra}\n");
        let host = FakeHost::new(1);
        host.enter(ROOT);
        let err = match Worker::configure(&host, &host, ROOT, p.as_bytes()) {
            Ok(_) => panic!("loaded: {extra}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(says), "{extra}: {err}");
    }
}
