#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! A request the gateway answers never also reaches the service, and a request it forwards goes
//! once — over every decision (forward, replay, 409 in flight, held then replayed, held then
//! taken over, unknown outcome, a lookup that says ran / absent / still running, 422, 400) ×
//! when it is made (at the headers, or at the body's end) × the body (none, ended with the
//! headers' callback, still arriving while the decision is out, at several points) × the
//! store (shared, and Redis on a real Redis behind a real Webdis).
//!
//! Driven as Envoy drives the module: every callback through `Contexts` (the dispatcher the
//! glue calls), each request callback's status told to the host, callout replies delivered
//! where the host kept the call and routed by token, the root's queue and ticks. The host
//! counts what reached the upstream and what was answered (`FakeHost::fate`), with Envoy's
//! semantics for a continue or resume after a local reply and for a local reply after the
//! request went on.

mod common;
use common::webdis::Live;
use idem_filter::lifecycle::{Contexts, Flow, Stream};
use idem_filter::testing::{Act, FakeHost, FakeStream, RequestFate};
use std::collections::VecDeque;

const ROOT: u32 = 1;
const BODY: &[u8] = br#"{"sku":"A1","amount":"100.00"}"#;
const OTHER_BODY: &[u8] = br#"{"sku":"B2","amount":"250.00"}"#;

/// The store a run uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Store {
    Shared,
    Redis,
}

/// What the key holds when the repeat comes, and what then happens to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// Nothing: the request is claimed and forwarded.
    Fresh,
    /// A completed first request: the repeat is replayed.
    Completed,
    /// The first is in flight, `on_in_flight = "reject"`: 409.
    InFlight,
    /// The first is in flight, `wait`: held, then the first's answer replayed.
    HeldThenReplayed,
    /// The first is in flight, `wait`: held, then the first fails and the repeat takes over.
    HeldThenTakenOver,
    /// The first's outcome is unknown, no lookup: 409.
    Unknown,
    /// Unknown, the lookup says it ran: the lookup's answer.
    LookupRan,
    /// Unknown, the lookup says it never ran: the repeat is forwarded.
    LookupAbsent,
    /// Unknown, the lookup says it is still running (409): the repeat gets the 409.
    LookupRunning,
    /// Completed with another body (fingerprint on only): 422.
    Reused,
    /// No key: 400.
    Missing,
    /// A token issued by the gateway, used once: forwarded.
    TokenFirst,
    /// A token used already: the duplicate answer (409).
    TokenUsed,
}

const CASES: [Case; 13] = [
    Case::Fresh,
    Case::Completed,
    Case::InFlight,
    Case::HeldThenReplayed,
    Case::HeldThenTakenOver,
    Case::Unknown,
    Case::LookupRan,
    Case::LookupAbsent,
    Case::LookupRunning,
    Case::Reused,
    Case::Missing,
    Case::TokenFirst,
    Case::TokenUsed,
];

/// How the repeat's body arrives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// No body: the headers end the request.
    None,
    /// The whole body in the callback after the headers', before any callout is answered.
    Ended,
    /// Half the body after the headers; `.0` callouts answered (and the case's event, when
    /// `.1`); then the rest.
    Arriving(usize, bool),
}

const BODIES: [Body; 8] = [
    Body::None,
    Body::Ended,
    Body::Arriving(0, false),
    Body::Arriving(1, false),
    Body::Arriving(3, false),
    Body::Arriving(0, true),
    Body::Arriving(1, true),
    Body::Arriving(3, true),
];

/// One run's routes: a fingerprint with or without the body's decision, by in-flight mode.
fn policy(store: Store, fingerprint: bool, prefix: &str) -> String {
    let store_line = match store {
        Store::Shared => "",
        Store::Redis => "store = \"redis\"\n",
    };
    let fp = if fingerprint { "" } else { "fingerprint = []\n" };
    let route = |name: &str, extra: &str, reconcile: bool| {
        let rc = if reconcile {
            "\n[route.reconcile]\nlookup = \"/lookup/{key}\"\ncluster = \"service\"\ntimeout = \"2s\"\n"
        } else {
            ""
        };
        format!(
            "[[route]]\nname = \"{name}\"\nmatch = {{ method = \"POST\", path = \"/{name}\" }}\n{store_line}\n\
             [route.key]\n{fp}{extra}{rc}\n"
        )
    };
    let token_route = format!(
        "[[route]]\nname = \"tok\"\nmatch = {{ method = \"POST\", path = \"/tok\" }}\nmode = \"token\"\n{store_line}\n"
    );
    let redis = match store {
        Store::Shared => String::new(),
        Store::Redis => format!("[redis]\ncluster = \"webdis\"\ntimeout = \"500ms\"\nprefix = \"{prefix}\"\n\n"),
    };
    format!(
        "[tokens]\nsecret = \"{}\"\n\n{redis}{token_route}{}{}{}",
        "s".repeat(40),
        route("reject", "", false),
        route("wait", "on_in_flight = \"wait\"\nwait_timeout = \"5s\"\n", false),
        route("rc", "", true),
    )
}

fn route_of(case: Case) -> &'static str {
    match case {
        Case::HeldThenReplayed | Case::HeldThenTakenOver => "wait",
        Case::LookupRan | Case::LookupAbsent | Case::LookupRunning => "rc",
        Case::TokenFirst | Case::TokenUsed => "tok",
        _ => "reject",
    }
}

/// Envoy with one worker running the module, its upstream and the service's lookups.
struct Gateway<'a> {
    host: FakeHost,
    contexts: Contexts,
    webdis: Option<&'a Live>,
    /// What the service answers a lookup with.
    lookup_status: u16,
    /// Callouts out, oldest first: (token, cluster, body).
    out: VecDeque<(u32, String, Vec<u8>)>,
    /// Everything the module did, in order.
    acts: Vec<Act>,
    wake: bool,
}

impl<'a> Gateway<'a> {
    fn new(policy: &str, webdis: Option<&'a Live>) -> Self {
        let host = FakeHost::new(1_800_000_000_000);
        let mut contexts = Contexts::default();
        contexts.create(ROOT, 0);
        host.enter(ROOT);
        assert!(contexts.configure(&host, &host, ROOT, policy.as_bytes()), "{:?}", host.logs());
        let mut gw =
            Gateway { host, contexts, webdis, lookup_status: 0, out: VecDeque::new(), acts: vec![], wake: false };
        gw.collect();
        gw.settle();
        gw
    }

    fn collect(&mut self) {
        for act in self.host.take_acts() {
            match &act {
                Act::Dispatch { token, cluster, body, .. } => {
                    self.out.push_back((*token, cluster.clone(), body.clone()))
                }
                Act::Enqueue { .. } => self.wake = true,
                _ => {}
            }
            self.acts.push(act);
        }
    }

    /// A request callback of `ctx`, its status told to the host as Envoy acts on it.
    fn request_callback(&mut self, ctx: u32, event: impl FnOnce(&mut Stream, &FakeHost) -> Flow) -> Flow {
        self.host.enter(ctx);
        let host = &self.host;
        let flow = self.contexts.on_stream(ctx, |s| event(s, host));
        self.host.returned(ctx, flow == Flow::Continue);
        self.collect();
        flow
    }

    fn open(&mut self, ctx: u32, route: &str, key: Option<&str>, body: &[u8]) {
        let mut headers: Vec<(&str, &[u8])> = vec![("authorization", b"Bearer merchant-7"), (":authority", b"shop")];
        let name = if route == "tok" { "idempotency-token" } else { "idempotency-key" };
        if let Some(k) = key {
            headers.push((name, k.as_bytes()));
        }
        self.host.open(ctx, FakeStream::request("POST", &format!("/{route}"), &headers, body));
        self.contexts.create(ctx, ROOT);
    }

    fn headers(&mut self, ctx: u32, end_of_stream: bool) -> Flow {
        self.request_callback(ctx, |s, h| s.on_request_headers(h, end_of_stream))
    }

    fn body(&mut self, ctx: u32, size: usize, end_of_stream: bool) -> Flow {
        self.request_callback(ctx, |s, h| s.on_request_body(h, size, end_of_stream))
    }

    /// A request sent whole: headers, then its body in one callback.
    fn send(&mut self, ctx: u32, route: &str, key: &str, body: &[u8]) {
        self.open(ctx, route, Some(key), body);
        if body.is_empty() {
            self.headers(ctx, true);
        } else {
            self.headers(ctx, false);
            self.body(ctx, body.len(), true);
        }
    }

    /// A token from the gateway's issue endpoint.
    fn issue_token(&mut self, ctx: u32) -> String {
        let headers: &[(&str, &[u8])] = &[("authorization", b"Bearer merchant-7"), (":authority", b"shop")];
        self.host.open(ctx, FakeStream::request("POST", "/api/idempotent/token", headers, b""));
        self.contexts.create(ctx, ROOT);
        self.headers(ctx, true);
        self.settle();
        let body = self.acts.iter().find_map(|a| match a {
            Act::Reply { context, reply } if *context == ctx => Some(reply.body.clone()),
            _ => None,
        });
        let issued: serde_json::Value = serde_json::from_slice(&body.expect("the token's answer")).unwrap();
        self.end(ctx);
        issued["token"].as_str().unwrap_or_else(|| panic!("{issued}")).to_string()
    }

    /// Answers the oldest callout out: a Webdis call through the real Webdis, a lookup as the
    /// service answers it. `false` when none is out.
    fn answer_one(&mut self) -> bool {
        let Some((token, cluster, body)) = self.out.pop_front() else {
            return false;
        };
        let Some(kept) = self.host.take_callout(token) else {
            return true; // cancelled with its context
        };
        let (status, reply) = match cluster.as_str() {
            "webdis" => {
                let live = self.webdis.expect("a Webdis call on a run without Redis");
                let (status, reply) = live.try_call(&String::from_utf8(body).unwrap()).unwrap();
                (status, reply.into_bytes())
            }
            "service" => (self.lookup_status, br#"{"order":"ord-1","ran":true}"#.to_vec()),
            other => panic!("a callout to {other}"),
        };
        self.host.enter(kept);
        self.host.deliver_to(token, status, &reply);
        self.contexts.on_call_response(&self.host, kept, token, 1, reply.len());
        self.collect();
        true
    }

    /// The root's wake-up queue, if a stream signalled it.
    fn wake_root(&mut self) -> bool {
        if !std::mem::take(&mut self.wake) {
            return false;
        }
        self.host.enter(ROOT);
        self.contexts.on_queue_ready(&self.host, ROOT);
        self.collect();
        true
    }

    fn tick(&mut self) {
        self.host.advance(20);
        self.host.enter(ROOT);
        self.contexts.on_tick(&self.host, ROOT);
        self.collect();
    }

    /// Runs the callouts, the queue and the root's ticks until nothing more happens.
    fn settle(&mut self) {
        let mut quiet = 0;
        for _ in 0..2000 {
            if self.answer_one() || self.wake_root() {
                quiet = 0;
                continue;
            }
            quiet += 1;
            if quiet > 10 {
                return;
            }
            self.tick();
        }
        panic!("the gateway never settled: {:?}", self.out);
    }

    /// `n` callouts answered (the root's queue run when signalled), no ticks.
    fn answer(&mut self, n: usize) {
        for _ in 0..n {
            self.wake_root();
            self.answer_one();
        }
    }

    /// The upstream answers a forwarded request of `ctx` with `status`; the stream ends.
    fn upstream_answers(&mut self, ctx: u32, status: u16) {
        let body = br#"{"order":"ord-7"}"#;
        self.host
            .update(ctx, |st| *st = st.clone().with_response(status, &[("content-type", b"application/json")], body));
        self.host.enter(ctx);
        let host = &self.host;
        self.contexts.on_stream(ctx, |s| s.on_response_headers(host, false));
        self.contexts.on_stream(ctx, |s| s.on_response_body(host, body.len(), true));
        self.collect();
        self.settle();
        self.end(ctx);
    }

    /// The stream of `ctx` ends (its client got the answer, or left).
    fn end(&mut self, ctx: u32) {
        self.host.enter(ctx);
        self.contexts.on_log(&self.host, ctx);
        self.contexts.delete(ctx);
        self.host.close(ctx);
        self.collect();
        self.settle();
    }

    fn replies(&self, ctx: u32) -> Vec<u16> {
        let replies = self.acts.iter().filter_map(|a| match a {
            Act::Reply { context, reply } if *context == ctx => Some(reply.status),
            _ => None,
        });
        replies.collect()
    }
}

/// What the repeat must get.
#[derive(Debug, PartialEq, Eq)]
enum Expect {
    Upstream,
    Answer(u16),
}

fn expected(case: Case) -> Expect {
    match case {
        Case::Fresh | Case::HeldThenTakenOver | Case::LookupAbsent => Expect::Upstream,
        Case::Completed | Case::HeldThenReplayed => Expect::Answer(201),
        Case::LookupRan => Expect::Answer(200),
        Case::InFlight | Case::Unknown | Case::LookupRunning => Expect::Answer(409),
        Case::Reused => Expect::Answer(422),
        Case::Missing => Expect::Answer(400),
        Case::TokenFirst => Expect::Upstream,
        Case::TokenUsed => Expect::Answer(409),
    }
}

const FIRST: u32 = 10;
const REPEAT: u32 = 20;

const ISSUE: u32 = 5;
/// Streams claiming other keys at the same time (`crowd`): on Redis, the repeat's claim then
/// waits for the next batch and the root decides for it.
const CROWD: [u32; 4] = [30, 31, 32, 33];

/// One run: the key prepared for `case`, the repeat sent as `body` says (with a crowd of other
/// claims out when `crowd`), every request's fate checked. Returns what went wrong, if anything.
fn run(
    store: Store,
    fingerprint: bool,
    case: Case,
    body: Body,
    crowd: bool,
    webdis: Option<&Live>,
    n: usize,
) -> Option<String> {
    let prefix = format!("idem:fates:{}:{n}:", std::process::id());
    let mut gw = Gateway::new(&policy(store, fingerprint, &prefix), webdis);
    let route = route_of(case);
    let key = match case {
        Case::TokenFirst | Case::TokenUsed => gw.issue_token(ISSUE),
        _ => format!("k-{n}"),
    };
    gw.lookup_status = match case {
        Case::LookupRan => 200,
        Case::LookupAbsent => 404,
        _ => 409,
    };

    // A request without a body repeats a first without one.
    let first_body = if body == Body::None { &[][..] } else { BODY };
    // The key's state when the repeat comes.
    match case {
        Case::Fresh | Case::Missing => {}
        Case::TokenFirst => {}
        Case::Completed | Case::Reused | Case::TokenUsed => {
            gw.send(FIRST, route, &key, first_body);
            gw.settle();
            gw.upstream_answers(FIRST, 201);
        }
        Case::InFlight | Case::HeldThenReplayed | Case::HeldThenTakenOver => {
            gw.send(FIRST, route, &key, first_body);
            gw.settle();
        }
        Case::Unknown | Case::LookupRan | Case::LookupAbsent | Case::LookupRunning => {
            gw.send(FIRST, route, &key, first_body);
            gw.settle();
            gw.end(FIRST); // the client left with the request upstream: unknown outcome
        }
    }
    // What happens to the first while the repeat waits.
    let event = |gw: &mut Gateway| match case {
        Case::HeldThenReplayed => gw.upstream_answers(FIRST, 201),
        Case::HeldThenTakenOver => gw.upstream_answers(FIRST, 503),
        _ => {}
    };

    let repeat_body = if case == Case::Reused { OTHER_BODY } else { BODY };
    let key = (case != Case::Missing).then_some(key);
    let repeat_body = if body == Body::None { &[][..] } else { repeat_body };
    if crowd {
        for (i, ctx) in CROWD.into_iter().enumerate() {
            gw.open(ctx, "reject", Some(&format!("crowd-{n}-{i}")), BODY);
            gw.headers(ctx, false);
            gw.body(ctx, BODY.len(), true);
        }
    }
    gw.open(REPEAT, route, key.as_deref(), repeat_body);
    let half = repeat_body.len() / 2;
    let mut event_done = false;
    match body {
        Body::None => {
            gw.headers(REPEAT, true);
        }
        Body::Ended => {
            gw.headers(REPEAT, false);
            gw.body(REPEAT, repeat_body.len(), true);
        }
        Body::Arriving(k, early_event) => {
            gw.headers(REPEAT, false);
            gw.body(REPEAT, half, false);
            gw.answer(k);
            if early_event {
                gw.settle();
                event(&mut gw);
                event_done = true;
            }
            gw.body(REPEAT, repeat_body.len(), true);
        }
    }
    gw.settle();
    if !event_done {
        event(&mut gw);
    }
    gw.settle();
    let fate = gw.host.fate(REPEAT);
    if fate.upstream == 1 {
        gw.upstream_answers(REPEAT, 200);
    } else {
        gw.end(REPEAT);
    }
    let mut wrong = Vec::new();
    if crowd {
        for ctx in CROWD {
            if gw.host.fate(ctx).upstream != 1 {
                wrong.push(format!("crowd stream {ctx} not forwarded once: {:?}", gw.host.fate(ctx)));
            }
            gw.upstream_answers(ctx, 200);
        }
    }
    let streams = [FIRST, REPEAT, ISSUE].into_iter().chain(if crowd { CROWD } else { [0; 4] });
    for (ctx, fate) in streams.filter(|c| *c != 0).map(|c| (c, gw.host.fate(c))) {
        if !fate.crossed.is_empty() {
            wrong.push(format!("stream {ctx}: {:?}", fate.crossed));
        }
        if fate.upstream > 1 || fate.replies > 1 || fate.echo > 0 {
            wrong.push(format!("stream {ctx}: {fate:?}"));
        }
    }
    let RequestFate { upstream, replies, .. } = fate;
    let got = match (upstream, replies) {
        (1, 0) => Some(Expect::Upstream),
        (0, 1) => gw.replies(REPEAT).first().map(|s| Expect::Answer(*s)),
        _ => None,
    };
    if got.as_ref() != Some(&expected(case)) {
        wrong.push(format!(
            "the repeat: expected {:?}, got {got:?} (upstream {upstream}, replies {replies})",
            expected(case)
        ));
    }
    if wrong.is_empty() {
        return None;
    }
    let logs: Vec<String> = gw.host.logs().into_iter().map(|(_, l)| l).filter(|l| l.contains("bug")).collect();
    Some(format!("{store:?} fingerprint={fingerprint} crowd={crowd} {case:?} {body:?}: {} {logs:?}", wrong.join("; ")))
}

fn every_run(store: Store, webdis: Option<&Live>) -> (usize, Vec<String>) {
    let mut n = 0;
    let mut failures = Vec::new();
    for fingerprint in [true, false] {
        for case in CASES {
            for body in BODIES {
                for crowd in [false, true] {
                    if case == Case::Reused && (!fingerprint || body == Body::None) {
                        continue; // without a fingerprint (or a body) another body is the same request
                    }
                    n += 1;
                    failures.extend(run(store, fingerprint, case, body, crowd, webdis, n));
                }
            }
        }
    }
    (n, failures)
}

#[test]
fn on_the_shared_store_no_answered_request_is_forwarded_and_each_forwarded_one_goes_once() {
    let (runs, failures) = every_run(Store::Shared, None);
    assert!(runs > 350, "{runs}");
    assert!(failures.is_empty(), "{} of {runs} runs wrong:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn on_redis_no_answered_request_is_forwarded_and_each_forwarded_one_goes_once() {
    let live = Live::start("fates");
    let (runs, failures) = every_run(Store::Redis, Some(&live));
    assert!(runs > 350, "{runs}");
    assert!(failures.is_empty(), "{} of {runs} runs wrong:\n{}", failures.len(), failures.join("\n"));
}
