#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! Every row of the README's outcome table, through the engine with the fake host.

mod common;
use common::Req;
use idem_filter::engine::*;
use idem_filter::host::Host;
use idem_filter::policy::{parse_bundle, RouteId};
use idem_filter::response::LocalReply;
use idem_filter::testing::FakeHost;

const POLICY: &str = r#"
[shared]
buckets = 8
entries_per_bucket = 4
max_response_bytes = 1024

[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
max_body_bytes = 100
max_response_bytes = 256
[route.key]
lock_ttl = "10s"
unknown_outcome_hold = "60s"
[route.duplicate]
message = "请勿重复提交"

[[route]]
name = "reject-completed"
match = { method = "POST", path = "/api/reject" }
[route.key]
on_completed = "reject"
anonymous = "shared"

[[route]]
name = "callback"
match = { method = "POST", path = "/api/pay/callback" }
[route.key]
from = "body"
name = "/transaction_id"
scope = []
fingerprint = []

[[route]]
name = "optional"
match = { path = "/api/optional" }
[route.key]
required = false

[[route]]
name = "shadow"
match = { path = "/api/shadow" }
mode = "shadow"
[route.key]
scope = []
"#;

fn engine_with(policy: &str) -> (FakeHost, Engine) {
    let host = FakeHost::new(1_764_400_000_000);
    let mut engine = Engine::new(parse_bundle(policy, "p").unwrap());
    engine.initialise(&host).unwrap();
    (host, engine)
}

fn setup() -> (FakeHost, Engine) {
    engine_with(POLICY)
}

/// The bundle's `i`th route.
fn nth(e: &Engine, i: usize) -> RouteId {
    e.bundle.route_ids().nth(i).unwrap()
}

fn route(e: &Engine, req: &Req) -> RouteId {
    e.bundle.find(|| req.method.clone(), &req.path, || None).unwrap()
}

fn decide(host: &FakeHost, e: &Engine, req: &Req) -> Verdict {
    let r = route(e, req);
    if let Some(v) = e.precheck(r, req, || host.now_ms()) {
        return v;
    }
    e.decide_shared(host, r, req).unwrap()
}

fn reply(v: &Verdict) -> (&LocalReply, serde_json::Value) {
    match &v.action {
        Action::Reply(r) => (r, serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null)),
        _ => panic!("expected a reply, got {v:?}"),
    }
}

fn ticket(v: &Verdict) -> Ticket {
    match &v.action {
        Action::Forward(Some(t)) => t.clone(),
        _ => panic!("expected a claimed forward, got {v:?}"),
    }
}

fn ok(status: u16, body: &str) -> Ending {
    Ending::Response {
        status,
        headers: vec![("content-type".into(), "application/json".into()), ("set-cookie".into(), "s=1".into())],
        body: Body::Whole(body.as_bytes().to_vec()),
        trailers: vec![],
        details: "via_upstream".into(),
        grpc: false,
    }
}

fn order(key: &str, body: &str) -> Req {
    Req::post("/api/order/create").key(key).header("authorization", "Bearer alice").body(body)
}

#[test]
fn first_request_forwards_and_repeat_replays() {
    let (host, e) = setup();
    let v = decide(&host, &e, &order("k1", "{}"));
    assert_eq!(v.outcome, Outcome::Forwarded);
    let r = route(&e, &order("k1", "{}"));
    assert_eq!(e.finish_shared(&host, r, &ticket(&v), ok(201, "{\"order\":1}")).0, Some(Outcome::Stored));
    let again = decide(&host, &e, &order("k1", "{}"));
    assert_eq!(again.outcome, Outcome::Replayed);
    let (rep, body) = reply(&again);
    assert_eq!(rep.status, 201);
    assert_eq!(body["order"], 1);
    assert!(rep.headers.contains(&("idempotent-replayed".into(), "true".into())));
    assert!(!rep.headers.iter().any(|(n, _)| n == "set-cookie"), "set-cookie must not be replayed");
}

#[test]
fn repeat_in_flight_gets_409_with_retry_after() {
    let (host, e) = setup();
    decide(&host, &e, &order("k", "{}"));
    host.advance(2500);
    let v = decide(&host, &e, &order("k", "{}"));
    assert_eq!(v.outcome, Outcome::InFlight);
    let (r, body) = reply(&v);
    assert_eq!(r.status, 409);
    assert_eq!(body["code"], "REQUEST_IN_PROGRESS");
    // A short Retry-After, never the lease end (8 s here): an SDK that sleeps for it and comes
    // back as the lease ends would take the claim over and run the business twice.
    assert!(r.headers.contains(&("retry-after".into(), "1".into())), "{:?}", r.headers);
    assert!(body["first_seen_at"].as_str().unwrap().ends_with('Z'));
}

#[test]
fn same_key_other_payload_is_422() {
    let (host, e) = setup();
    let v = decide(&host, &e, &order("k", "{\"a\":1}"));
    e.finish_shared(&host, nth(&e, 0), &ticket(&v), ok(200, "{}"));
    let v = decide(&host, &e, &order("k", "{\"a\":2}"));
    assert_eq!(v.outcome, Outcome::KeyReused);
    let (r, body) = reply(&v);
    assert_eq!((r.status, body["code"].as_str()), (422, Some("IDEMPOTENCY_KEY_REUSED")));
    // Also while the first is still in flight.
    decide(&host, &e, &order("k2", "{\"a\":1}"));
    assert_eq!(decide(&host, &e, &order("k2", "{\"a\":2}")).outcome, Outcome::KeyReused);
}

#[test]
fn missing_and_invalid_keys_are_400() {
    let (host, e) = setup();
    let v = decide(&host, &e, &Req::post("/api/order/create").body("{}"));
    let (r, body) = reply(&v);
    assert_eq!(
        (v.outcome, r.status, body["code"].as_str()),
        (Outcome::MissingKey, 400, Some("IDEMPOTENCY_KEY_MISSING"))
    );
    let v = decide(&host, &e, &order(&"x".repeat(300), "{}"));
    let (r, body) = reply(&v);
    assert_eq!(
        (v.outcome, r.status, body["code"].as_str()),
        (Outcome::InvalidKey, 400, Some("IDEMPOTENCY_KEY_INVALID"))
    );
    // Answered from headers alone, before any body is buffered.
    let headers_only = Req::post("/api/order/create");
    assert!(e.precheck(nth(&e, 0), &headers_only, || 0).is_some());
}

#[test]
fn key_not_required_passes_unprotected() {
    let (host, e) = setup();
    let v = decide(&host, &e, &Req::post("/api/optional"));
    assert_eq!((v.outcome, v.action), (Outcome::NoKey, Action::Forward(None)));
}

#[test]
fn body_too_large_is_413() {
    let (_, e) = setup();
    let v = e.body_too_large(nth(&e, 0));
    let (r, body) = reply(&v);
    assert_eq!((r.status, body["code"].as_str()), (413, Some("IDEMPOTENCY_BODY_TOO_LARGE")));
}

#[test]
fn on_completed_reject_answers_the_duplicate_response() {
    let (host, e) = setup();
    let req = Req::post("/api/reject").key("k").body("{}");
    let r = route(&e, &req);
    let v = decide(&host, &e, &req);
    e.finish_shared(&host, r, &ticket(&v), ok(200, "{}"));
    let v = decide(&host, &e, &req);
    assert_eq!(v.outcome, Outcome::RejectedDuplicate);
    let (rep, body) = reply(&v);
    assert_eq!((rep.status, body["code"].as_str()), (409, Some("DUPLICATE_REQUEST")));
    assert!(body["first_seen_at"].is_string());
}

#[test]
fn upstream_5xx_releases_so_the_retry_runs() {
    let (host, e) = setup();
    let v = decide(&host, &e, &order("k", "{}"));
    assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), ok(503, "down")).0, Some(Outcome::Released));
    assert_eq!(decide(&host, &e, &order("k", "{}")).outcome, Outcome::Forwarded);
}

#[test]
fn forgotten_statuses_release_too() {
    let (host, e) = setup();
    for status in [408, 409, 425, 429] {
        let key = format!("k{status}");
        let v = decide(&host, &e, &order(&key, "{}"));
        assert_eq!(
            e.finish_shared(&host, nth(&e, 0), &ticket(&v), ok(status, "{}")).0,
            Some(Outcome::Released),
            "{status}"
        );
    }
    let v = decide(&host, &e, &order("k404", "{}"));
    assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), ok(404, "{}")).0, Some(Outcome::Stored));
}

#[test]
fn unknown_outcome_holds_the_claim_past_its_lease() {
    let (host, e) = setup();
    for (i, ending) in [
        Ending::NoResponse { forwarded: true },
        Ending::Response {
            status: 504,
            headers: vec![],
            body: Body::Whole(vec![]),
            trailers: vec![],
            grpc: false,
            details: "upstream_response_timeout".into(),
        },
        Ending::Response {
            status: 503,
            headers: vec![],
            body: Body::Whole(vec![]),
            trailers: vec![],
            grpc: false,
            details: "upstream_reset_before_response_started{connection_termination}".into(),
        },
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("unknown-{i}");
        let v = decide(&host, &e, &order(&key, "{}"));
        assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), ending).0, Some(Outcome::Held));
        let retry = decide(&host, &e, &order(&key, "{}"));
        assert_eq!(retry.outcome, Outcome::OutcomeUnknown, "retry must not run twice");
        let (r, body) = reply(&retry);
        assert_eq!((r.status, body["code"].as_str()), (409, Some("IDEMPOTENCY_OUTCOME_UNKNOWN")));
        assert!(r.headers.contains(&("x-should-retry".into(), "false".into())), "{:?}", r.headers);
        assert!(!r.headers.iter().any(|(n, _)| n == "retry-after"), "no Retry-After invites a retry: {:?}", r.headers);
    }
    // Past the 10 s lease: still held, never taken over.
    host.advance(10_001);
    assert_eq!(decide(&host, &e, &order("unknown-0", "{}")).outcome, Outcome::OutcomeUnknown);
    // Past unknown_outcome_hold (60 s): the key is free again.
    host.advance(50_000);
    assert_eq!(decide(&host, &e, &order("unknown-0", "{}")).outcome, Outcome::Forwarded);
}

#[test]
fn never_reaching_the_upstream_releases() {
    let (host, e) = setup();
    let v = decide(&host, &e, &order("k", "{}"));
    let refused = Ending::Response {
        status: 503,
        headers: vec![],
        body: Body::Whole(vec![]),
        trailers: vec![],
        grpc: false,
        details: "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}"
            .into(),
    };
    assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), refused).0, Some(Outcome::Released));
    let v = decide(&host, &e, &order("k2", "{}"));
    assert_eq!(
        e.finish_shared(&host, nth(&e, 0), &ticket(&v), Ending::NoResponse { forwarded: false }).0,
        Some(Outcome::Released)
    );
}

#[test]
fn oversized_or_unfinished_response_is_a_tombstone() {
    let (host, e) = setup();
    let v = decide(&host, &e, &order("big", "{}"));
    assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), ok(200, &"x".repeat(300))).0, Some(Outcome::Tombstoned));
    let again = decide(&host, &e, &order("big", "{}"));
    assert_eq!(again.outcome, Outcome::RejectedDuplicate);
    let (r, body) = reply(&again);
    assert_eq!((r.status, body["message"].as_str()), (409, Some("请勿重复提交")));
    // Status seen, body not seen to the end (the upstream reset it, the client went away): what
    // the service answered is lost, so the outcome is unknown — held, never a tombstone.
    let v = decide(&host, &e, &order("cut", "{}"));
    let cut = Ending::Response {
        status: 200,
        headers: vec![],
        body: Body::Cut,
        trailers: vec![],
        details: String::new(),
        grpc: false,
    };
    assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), cut).0, Some(Outcome::Held));
    let again = decide(&host, &e, &order("cut", "{}"));
    assert_eq!(again.outcome, Outcome::OutcomeUnknown);
    assert_eq!(reply(&again).1["code"], "IDEMPOTENCY_OUTCOME_UNKNOWN");
}

#[test]
fn another_caller_never_gets_someone_elses_response() {
    let (host, e) = setup();
    let v = decide(&host, &e, &order("shared-key", "{}"));
    e.finish_shared(&host, nth(&e, 0), &ticket(&v), ok(200, "{\"owner\":\"alice\"}"));
    let bob = Req::post("/api/order/create").key("shared-key").header("authorization", "Bearer bob").body("{}");
    assert_eq!(decide(&host, &e, &bob).outcome, Outcome::Forwarded);
}

#[test]
fn body_keyed_callback_replays_the_first_success() {
    let (host, e) = setup();
    let cb = |body: &str| Req::post("/api/pay/callback").body(body);
    let first = cb(r#"{"transaction_id":"T-1","amount":100}"#);
    let r = route(&e, &first);
    let v = decide(&host, &e, &first);
    e.finish_shared(&host, r, &ticket(&v), ok(200, "{\"return_code\":\"SUCCESS\"}"));
    // The provider re-serializes and retries; fingerprint = [] so it is still a replay.
    let retry = cb(r#"{"amount":100,"transaction_id":"T-1"}"#);
    let v = decide(&host, &e, &retry);
    assert_eq!(v.outcome, Outcome::Replayed);
    assert_eq!(reply(&v).1["return_code"], "SUCCESS");
    let v = decide(&host, &e, &cb("not json"));
    assert_eq!(v.outcome, Outcome::MissingKey);
}

#[test]
fn shadow_mode_never_blocks_but_says_what_it_would_do() {
    let (host, e) = setup();
    let req = Req::post("/api/shadow").key("k").body("{}");
    let r = route(&e, &req);
    let v = decide(&host, &e, &req);
    assert_eq!(v.outcome, Outcome::Forwarded);
    e.finish_shared(&host, r, &ticket(&v), ok(200, "{}"));
    let v = decide(&host, &e, &req);
    assert_eq!((v.outcome, &v.action), (Outcome::ShadowWouldBlock, &Action::Forward(None)));
    assert!(v.cause.starts_with("would_replayed"), "{}", v.cause);
    let v = decide(&host, &e, &Req::post("/api/shadow"));
    assert_eq!((v.outcome, v.action), (Outcome::ShadowWouldBlock, Action::Forward(None)));
    assert_eq!(e.body_too_large(r).action, Action::Forward(None));
}

#[test]
fn store_failure_is_503_store_unavailable() {
    let (host, e) = setup();
    host.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let v = decide(&host, &e, &order("k", "{}"));
    let (r, body) = reply(&v);
    assert_eq!((v.outcome, r.status), (Outcome::StoreError, 503));
    assert_eq!(body["code"], "IDEMPOTENCY_STORE_UNAVAILABLE");
}

#[test]
fn outcome_names_are_unique_and_indexed() {
    for (i, o) in Outcome::ALL.iter().enumerate() {
        assert_eq!(o.index(), i);
        assert_eq!(Outcome::ALL.iter().filter(|p| p.name() == o.name()).count(), 1);
    }
}

const WAIT_POLICY: &str = r#"
[[route]]
name = "wait"
match = { path = "/api/wait" }
[route.key]
on_in_flight = "wait"
wait_timeout = "2s"
scope = []
"#;

fn wait_setup() -> (FakeHost, Engine) {
    engine_with(WAIT_POLICY)
}

fn held(v: &Verdict) -> (Prepared, u64) {
    match &v.action {
        Action::Wait { prepared, deadline_ms } => ((**prepared).clone(), *deadline_ms),
        other => panic!("expected the duplicate to be held, got {other:?}"),
    }
}

#[test]
fn wait_mode_holds_then_replays_the_first_response() {
    let (host, e) = wait_setup();
    let req = Req::post("/api/wait").key("k").body("{}");
    let first = decide(&host, &e, &req);
    let (prepared, deadline) = held(&decide(&host, &e, &req));
    assert_eq!(deadline, host.now_ms() + 2000);
    host.advance(100);
    held(&e.run_shared(&host, &prepared, Some(deadline), None));
    e.finish_shared(&host, nth(&e, 0), &ticket(&first), ok(201, "{\"first\":true}"));
    let v = e.run_shared(&host, &prepared, Some(deadline), None);
    assert_eq!((v.outcome, v.cause.as_str()), (Outcome::Replayed, "completed_while_waiting"));
    assert_eq!(reply(&v).1["first"], true);
}

#[test]
fn wait_mode_takes_over_when_the_first_fails() {
    let (host, e) = wait_setup();
    let req = Req::post("/api/wait").key("k").body("{}");
    let first = decide(&host, &e, &req);
    let hold = decide(&host, &e, &req);
    assert_eq!(hold.outcome, Outcome::Waited, "a held duplicate is counted waited, once");
    let (prepared, deadline) = held(&hold);
    e.finish_shared(&host, nth(&e, 0), &ticket(&first), ok(500, "boom"));
    let v = e.run_shared(&host, &prepared, Some(deadline), None);
    assert_eq!((v.outcome, v.cause.as_str()), (Outcome::Forwarded, "took_over_after_wait"));
    ticket(&v);
    // Exactly one waiter takes over: the next one keeps waiting.
    held(&e.run_shared(&host, &prepared, Some(deadline), None));
}

#[test]
fn wait_mode_gives_up_with_409_after_wait_timeout() {
    let (host, e) = wait_setup();
    let req = Req::post("/api/wait").key("k").body("{}");
    decide(&host, &e, &req);
    let (prepared, deadline) = held(&decide(&host, &e, &req));
    host.advance(2000);
    let v = e.run_shared(&host, &prepared, Some(deadline), None);
    assert_eq!((v.outcome, v.cause.as_str()), (Outcome::InFlight, "in_flight_wait_timeout"));
    assert_eq!(reply(&v).0.status, 409);
}

const TOKEN_POLICY: &str = r#"
[[route]]
name = "submit"
match = { method = "POST", path = "/api/form/submit" }
mode = "token"
[route.token]
ttl = "1m"

[[route]]
name = "publish"
match = { method = "POST", path = "/api/publish" }
mode = "token"
[route.token]
restore_on_failure = false
"#;

fn token_setup() -> (FakeHost, Engine) {
    engine_with(TOKEN_POLICY)
}

fn issue(host: &FakeHost, e: &Engine, path: &str, auth: &str, seed: u8) -> Result<String, LocalReply> {
    let req = Req::post(path).header("authorization", auth);
    match e.issue("POST", path, &req, [seed; 16]).unwrap() {
        Issue::Token { route, token, id } => {
            let v = e.issued(route, &token, host.now_ms(), e.issue_shared(host, route, &id));
            let (r, body) = reply(&v);
            assert_eq!((r.status, body["token"].as_str()), (200, Some(token.as_str())));
            assert!(r.headers.contains(&("cache-control".into(), "no-store".into())));
            Ok(token)
        }
        Issue::Reply { reply, .. } => Err(reply),
    }
}

fn submit(path: &str, auth: &str, token: Option<&str>) -> Req {
    let r = Req::post(path).header("authorization", auth);
    match token {
        Some(t) => r.header("idempotency-token", t),
        None => r,
    }
}

#[test]
fn token_is_issued_consumed_once_and_bound_to_route_and_caller() {
    let (host, e) = token_setup();
    // Two routes share the default issue path: the request must name one.
    let err = issue(&host, &e, "/api/idempotent/token", "A", 1).unwrap_err();
    assert_eq!(err.status, 400);
    let t = issue(&host, &e, "/api/idempotent/token?route=submit", "A", 1).unwrap();
    assert_eq!(t.len(), 32, "16 random bytes and an 8-byte tag, base64url");
    assert!(e.is_issue_path("/api/idempotent/token?route=submit") && !e.is_issue_path("/api/form/submit"));
    // Another caller, another route: refused, and the token stays valid for its owner. Another
    // route's token is not one that route issued: 400, not the duplicate answer.
    assert_eq!(decide(&host, &e, &submit("/api/form/submit", "B", Some(&t))).outcome, Outcome::TokenRejected);
    let elsewhere = decide(&host, &e, &submit("/api/publish", "A", Some(&t)));
    assert_eq!((elsewhere.outcome, reply(&elsewhere).0.status), (Outcome::TokenRejected, 400));
    let v = decide(&host, &e, &submit("/api/form/submit", "A", Some(&t)));
    assert_eq!(v.outcome, Outcome::TokenConsumed);
    ticket(&v);
    let again = decide(&host, &e, &submit("/api/form/submit", "A", Some(&t)));
    let (r, body) = reply(&again);
    assert_eq!(
        (again.outcome, r.status, body["code"].as_str()),
        (Outcome::TokenRejected, 409, Some("DUPLICATE_REQUEST"))
    );
    assert!(body["first_seen_at"].is_string(), "used before: says when");
    // A token this gateway never issued (made up, mistyped, cut short) is not a duplicate.
    for forged in ["never-issued".to_string(), t[..31].to_string(), format!("{}A", &t[..31]), t.replace('A', "B")] {
        if forged == t {
            continue;
        }
        let v = decide(&host, &e, &submit("/api/form/submit", "A", Some(&forged)));
        let (r, body) = reply(&v);
        assert_eq!(
            (r.status, body["code"].as_str(), v.cause.as_str()),
            (400, Some("IDEMPOTENCY_TOKEN_INVALID"), "token_not_issued"),
            "{forged}"
        );
    }
    let missing = decide(&host, &e, &submit("/api/form/submit", "A", None));
    assert_eq!(reply(&missing).1["code"], "IDEMPOTENCY_TOKEN_MISSING");
}

#[test]
fn tokens_verify_across_envoys_with_one_secret_and_nowhere_else() {
    let with = |secret: &str| {
        engine_with(&format!(
            "[tokens]\nsecret = \"{secret}\"\n[[route]]\nname = \"submit\"\nmatch = {{ method = \"POST\", path = \"/f\" }}\nmode = \"token\"\n"
        ))
        .1
    };
    let (a, b) = (with(&"s".repeat(32)), with(&"s".repeat(32)));
    let token = a.signed_token("submit", [7; 16]);
    assert!(b.issued_here("submit", &token), "another Envoy with the same secret");
    assert!(!b.issued_here("other", &token), "another route");
    assert!(!with(&"t".repeat(32)).issued_here("submit", &token), "another secret");
    // Without a secret, each process signs with its own (the shared store is per process too).
    let (_, p1) = engine_with(TOKEN_POLICY);
    let other_process = FakeHost::new(1_764_400_000_000);
    let _ = idem_filter::host::Host::random_u64(&other_process); // its generator is elsewhere
    let mut p2 = Engine::new(parse_bundle(TOKEN_POLICY, "p").unwrap());
    p2.initialise(&other_process).unwrap();
    let t1 = p1.signed_token("submit", [7; 16]);
    assert!(p1.issued_here("submit", &t1));
    assert!(!p2.issued_here("submit", &t1), "two processes draw two secrets");
}

#[test]
fn token_expires() {
    let (host, e) = token_setup();
    let t = issue(&host, &e, "/api/idempotent/token?route=submit", "A", 2).unwrap();
    host.advance(60_001);
    assert_eq!(decide(&host, &e, &submit("/api/form/submit", "A", Some(&t))).cause, "token_unknown_or_expired");
}

#[test]
fn failed_submission_restores_the_token_unless_the_outcome_is_unknown() {
    let (host, e) = token_setup();
    let t = issue(&host, &e, "/api/idempotent/token?route=submit", "A", 3).unwrap();
    let v = decide(&host, &e, &submit("/api/form/submit", "A", Some(&t)));
    assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), ok(503, "down")).0, Some(Outcome::TokenRestored));
    let v = decide(&host, &e, &submit("/api/form/submit", "A", Some(&t)));
    assert_eq!(v.outcome, Outcome::TokenConsumed);
    assert_eq!(e.finish_shared(&host, nth(&e, 0), &ticket(&v), Ending::NoResponse { forwarded: true }).0, None);
    assert_eq!(decide(&host, &e, &submit("/api/form/submit", "A", Some(&t))).outcome, Outcome::TokenRejected);
    // restore_on_failure = false keeps a failed token used.
    let t2 = issue(&host, &e, "/api/idempotent/token?route=publish", "A", 4).unwrap();
    let v = decide(&host, &e, &submit("/api/publish", "A", Some(&t2)));
    assert_eq!(e.finish_shared(&host, nth(&e, 1), &ticket(&v), ok(500, "x")).0, None);
    assert_eq!(decide(&host, &e, &submit("/api/publish", "A", Some(&t2))).outcome, Outcome::TokenRejected);
}

#[test]
fn issue_endpoint_refuses_other_methods() {
    let (_, e) = token_setup();
    let req = Req::post("/api/idempotent/token");
    match e.issue("GET", "/api/idempotent/token?route=submit", &req, [0; 16]).unwrap() {
        Issue::Reply { reply, .. } => {
            assert_eq!(reply.status, 405);
            assert!(reply.headers.contains(&("allow".into(), "POST".into())));
        }
        other => panic!("{other:?}"),
    }
    assert!(e.issue("POST", "/elsewhere", &req, [0; 16]).is_none());
}

/// A small deterministic generator (no test dependency needed for a byte sweep).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn bytes(&mut self) -> Vec<u8> {
        let len = (self.next() % 40) as usize;
        (0..len).map(|_| self.next() as u8).collect()
    }
}

#[test]
fn arbitrary_header_bytes_always_get_a_decision() {
    // Through the fake host, what Envoy may hand over (any byte in the key, the scope, the token
    // and other headers, repeated or not): every request is decided, none panics.
    let (host, e) = setup();
    let mut rng = Lcg(7);
    for i in 0..5000 {
        let mut req = Req::post(if i % 2 == 0 { "/api/order/create" } else { "/api/reject" }).body("{}");
        for _ in 0..(rng.next() % 3) {
            req = req.raw_header("idempotency-key", &rng.bytes());
        }
        for _ in 0..(rng.next() % 3) {
            req = req.raw_header("authorization", &rng.bytes());
        }
        req = req.raw_header("cookie", &rng.bytes());
        let r = route(&e, &req);
        let v = match e.precheck(r, &req, || 0) {
            Some(v) => v,
            None => e.decide_shared(&host, r, &req).unwrap(),
        };
        match &v.action {
            Action::Forward(Some(t)) => {
                e.finish_shared(&host, r, t, ok(200, "{}"));
            }
            Action::Reply(rep) => assert!([400, 409, 422].contains(&rep.status) || rep.status == 200, "{v:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}

const SHAPED: &str = r#"
[answers]
format = "problem"
type_base = "https://errors.example.com/idem/"

[[route]]
name = "stripe"
match = { method = "POST", path = "/v1/charges" }
[route.key]
scope = []
[route.answers]
template = '{"error":{"type":"idempotency_error","code":"{{code}}","message":"{{message}}"}}'
headers = { "Stripe-Should-Retry" = "{{should_retry}}" }

[[route]]
name = "problem"
match = { method = "POST", path = "/orders" }
[route.key]
scope = []

[[route]]
name = "alipay"
match = { method = "POST", path = "/notify" }
[route.key]
from = "form"
name = "notify_id"
scope = []
fingerprint = []
on_completed = "reject"
[route.duplicate]
status = 200
body = "success"
"#;

fn header<'a>(r: &'a LocalReply, name: &str) -> Option<&'a str> {
    r.headers.iter().find(|(n, _)| n == name).and_then(|(_, v)| std::str::from_utf8(v).ok())
}

#[test]
fn answers_take_the_apis_own_shape() {
    let (host, e) = engine_with(SHAPED);
    let charge = |key: &str, body: &str| Req::post("/v1/charges").key(key).body(body);
    decide(&host, &e, &charge("c1", r#"{"amount":100}"#));
    // In progress, in Stripe's envelope: retryable, with Retry-After beside Stripe's header.
    let busy = decide(&host, &e, &charge("c1", r#"{"amount":100}"#));
    let (r, v) = reply(&busy);
    assert_eq!((r.status, v["error"]["code"].as_str()), (409, Some("REQUEST_IN_PROGRESS")));
    assert_eq!(v["error"]["type"], "idempotency_error");
    assert_eq!((header(r, "stripe-should-retry"), header(r, "retry-after")), (Some("true"), Some("1")));
    // Another payload under the key: not retryable.
    let reused = decide(&host, &e, &charge("c1", r#"{"amount":999}"#));
    let (r, v) = reply(&reused);
    assert_eq!((r.status, v["error"]["code"].as_str()), (422, Some("IDEMPOTENCY_KEY_REUSED")));
    assert_eq!(header(r, "stripe-should-retry"), Some("false"));
    // A route without its own shape takes the bundle's: RFC 9457.
    let missing = decide(&host, &e, &Req::post("/orders"));
    let (r, v) = reply(&missing);
    assert_eq!(header(r, "content-type"), Some("application/problem+json"));
    assert_eq!(v["type"], "https://errors.example.com/idem/idempotency-key-missing");
    assert_eq!((v["status"].as_u64(), v["code"].as_str()), (Some(400), Some("IDEMPOTENCY_KEY_MISSING")));
    assert!(v["detail"].as_str().unwrap().contains("Idempotency-Key"));
    // A duplicate with its own body: the provider's exact success answer.
    let notify = Req::post("/notify").body("notify_id=n1&trade_status=TRADE_SUCCESS");
    let first = decide(&host, &e, &notify);
    let r = route(&e, &notify);
    e.finish_shared(&host, r, &ticket(&first), ok(200, "success"));
    let again = decide(&host, &e, &notify);
    let (r, _) = reply(&again);
    assert_eq!(
        (r.status, r.body.as_slice(), header(r, "content-type")),
        (200, &b"success"[..], Some("text/plain; charset=utf-8"))
    );
}

#[test]
fn a_callback_answer_without_the_success_marker_releases_the_key() {
    let (host, e) = engine_with(
        "[[route]]\nname = \"n\"\nmatch = { method = \"POST\", path = \"/notify\" }\n[route.key]\nfrom = \"form\"\n\
         name = \"notify_id\"\nscope = []\nfingerprint = []\nsuccess_body_contains = \"success\"\n",
    );
    let notify = Req::post("/notify").body("notify_id=n1");
    let r = route(&e, &notify);
    // The merchant answers 200 "fail": Alipay re-delivers, and the re-delivery must run again.
    let first = decide(&host, &e, &notify);
    assert_eq!(e.finish_shared(&host, r, &ticket(&first), ok(200, "fail")).0, Some(Outcome::Released));
    let second = decide(&host, &e, &notify);
    assert_eq!(second.outcome, Outcome::Forwarded);
    assert_eq!(e.finish_shared(&host, r, &ticket(&second), ok(200, "success")).0, Some(Outcome::Stored));
    assert_eq!(decide(&host, &e, &notify).outcome, Outcome::Replayed);
}

#[test]
fn a_record_written_before_xxh3_fingerprints_is_replayed_across_the_upgrade() {
    // The shared store's entry as an earlier version wrote it: SHA-256 fingerprint, digest byte 0.
    let (host, e) = setup();
    let first = order("k1", r#"{"sku":"A1"}"#);
    let r = route(&e, &first);
    let v = decide(&host, &e, &first);
    assert_eq!(e.finish_shared(&host, r, &ticket(&v), ok(201, "{\"order\":1}")).0, Some(Outcome::Stored));
    let legacy = e.legacy_fingerprint(r, &first).unwrap();
    e.shared_store().rewrite_as_earlier_version(&host, 0, legacy);
    assert_eq!(decide(&host, &e, &first).outcome, Outcome::Replayed, "same request: replayed, not 422");
    assert_eq!(decide(&host, &e, &order("k1", r#"{"sku":"B2"}"#)).outcome, Outcome::KeyReused);
}

/// An alias of the route's path (`/Create/`, `%63reate`, `//`, `..`, a trailing `/`) is the same
/// request to the service's framework, so the fingerprint reads the path as the matcher does: a
/// repeat through an alias is a replay, never a 422 for "another request".
#[test]
fn a_repeat_through_a_path_alias_is_a_replay() {
    let (host, e) = setup();
    let v = decide(&host, &e, &order("alias-1", "{}"));
    let r = route(&e, &order("alias-1", "{}"));
    assert_eq!(e.finish_shared(&host, r, &ticket(&v), ok(201, "{\"order\":1}")).0, Some(Outcome::Stored));
    for alias in [
        "/api/order/create/",
        "/api/order/Create",
        "/api//order/create",
        "/api/order/%63reate",
        "/api/x/../order/./create",
    ] {
        let req = Req::post(alias).key("alias-1").header("authorization", "Bearer alice").body("{}");
        assert_eq!(decide(&host, &e, &req).outcome, Outcome::Replayed, "{alias}");
    }
}
