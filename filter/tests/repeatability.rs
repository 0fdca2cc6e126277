#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! OASIS Repeatable Requests routes (`key.protocol = "repeatable-requests"`) through the fake
//! host: the key and the window from the two headers, and `Repeatability-Result` on every answer.

use idem_filter::lifecycle::{Flow, Stream, Worker};
use idem_filter::policy::parse_bundle;
use idem_filter::response::LocalReply;
use idem_filter::testing::{Act, FakeHost, FakeStream};
use std::rc::Rc;
use std::time::{Duration, UNIX_EPOCH};

const ROOT: u32 = 1;
const NOW_MS: u64 = 1_800_000_000_000;

const POLICY: &str = r#"
[[route]]
name = "rooms"
match = { method = "POST", path = "/rooms" }
[route.key]
protocol = "repeatable-requests"
ttl = "10m"
first_sent_skew = "1m"
scope = ["azurehmac:credential"]
"#;

fn setup() -> (FakeHost, Rc<Worker>) {
    let host = FakeHost::new(NOW_MS);
    host.enter(ROOT);
    let w = Worker::configure(&host, &host, ROOT, POLICY.as_bytes()).unwrap();
    host.take_acts();
    (host, Rc::new(w))
}

/// An HTTP-date `offset_s` seconds from the fake host's now.
fn date(offset_s: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(NOW_MS) + Duration::from_secs(offset_s.unsigned_abs());
    let at = if offset_s < 0 { at - Duration::from_secs(2 * offset_s.unsigned_abs()) } else { at };
    httpdate::fmt_http_date(at)
}

/// Azure's HMAC header: the credential stays, the signature changes with every attempt.
fn hmac(signature: &str) -> String {
    format!("HMAC-SHA256 Credential=acct-1&SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature={signature}")
}

/// Sends a request as context `ctx` with these headers and body; returns the stream, its flow
/// and what the host did.
fn send(
    host: &FakeHost,
    w: &Rc<Worker>,
    ctx: u32,
    headers: &[(&str, String)],
    body: &[u8],
) -> (Stream, Flow, Vec<Act>) {
    let headers: Vec<(&str, &[u8])> = headers.iter().map(|(n, v)| (*n, v.as_bytes())).collect();
    host.open(ctx, FakeStream::request("POST", "/rooms", &headers, body));
    let mut s = Stream::new(Rc::clone(w), ctx);
    let mut flow = s.on_request_headers(host, body.is_empty());
    if flow == Flow::Pause && !body.is_empty() {
        flow = s.on_request_body(host, body.len(), true);
    }
    (s, flow, host.take_acts())
}

fn repeatable(id: &str, first_sent: String, signature: &str) -> Vec<(&'static str, String)> {
    vec![
        ("repeatability-request-id", id.to_string()),
        ("repeatability-first-sent", first_sent),
        ("authorization", hmac(signature)),
    ]
}

fn reply(acts: &[Act], ctx: u32) -> LocalReply {
    let replies: Vec<&LocalReply> = acts
        .iter()
        .filter_map(|a| match a {
            Act::Reply { context, reply } if *context == ctx => Some(reply),
            _ => None,
        })
        .collect();
    assert_eq!(replies.len(), 1, "one reply expected: {acts:?}");
    replies[0].clone()
}

fn header<'r>(r: &'r LocalReply, name: &str) -> Option<&'r str> {
    r.headers.iter().find(|(n, _)| n == name).map(|(_, v)| std::str::from_utf8(v).unwrap())
}

fn code(r: &LocalReply) -> String {
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    body["code"].as_str().unwrap_or_default().to_string()
}

/// The upstream answers `ctx` with 201; returns what the filter did to the answer.
fn upstream_answers(host: &FakeHost, s: &mut Stream, ctx: u32) -> Vec<Act> {
    let body = br#"{"id":"room-1"}"#;
    host.update(ctx, |st| *st = st.clone().with_response(201, &[("content-type", b"application/json")], body));
    host.enter(ctx);
    s.on_response_headers(host, false);
    s.on_response_body(host, body.len(), true);
    host.take_acts()
}

#[test]
fn the_first_answer_is_accepted_and_a_repeat_signed_anew_replays_it_accepted() {
    let (host, w) = setup();
    let (mut s, flow, _) = send(&host, &w, 10, &repeatable("r-1", date(-2), "sig-a"), b"{}");
    assert_eq!(flow, Flow::Continue, "a first request goes upstream");
    let acts = upstream_answers(&host, &mut s, 10);
    assert!(
        acts.iter().any(|a| matches!(a, Act::ResponseHeader { context: 10, name, value }
            if name == "repeatability-result" && value == b"accepted")),
        "the first execution's answer says accepted: {acts:?}"
    );
    s.on_log(&host);
    // The SDK's retry: same id and First-Sent, a new HMAC signature.
    let (_, flow, acts) = send(&host, &w, 11, &repeatable("r-1", date(-2), "sig-b"), b"{}");
    assert_eq!(flow, Flow::Pause);
    let r = reply(&acts, 11);
    assert_eq!(r.status, 201, "{r:?}");
    assert_eq!(r.body, br#"{"id":"room-1"}"#);
    assert_eq!(header(&r, "repeatability-result"), Some("accepted"));
    assert_eq!(header(&r, "idempotent-replayed"), Some("true"));
}

#[test]
fn a_repeat_while_the_first_runs_is_409_rejected() {
    let (host, w) = setup();
    let (_s, flow, _) = send(&host, &w, 10, &repeatable("r-2", date(0), "a"), b"{}");
    assert_eq!(flow, Flow::Continue);
    let (_, _, acts) = send(&host, &w, 11, &repeatable("r-2", date(0), "b"), b"{}");
    let r = reply(&acts, 11);
    assert_eq!((r.status, code(&r).as_str()), (409, "REQUEST_IN_PROGRESS"));
    assert_eq!(header(&r, "repeatability-result"), Some("rejected"));
}

#[test]
fn the_same_id_with_another_body_is_400_rejected() {
    let (host, w) = setup();
    let (mut s, _, _) = send(&host, &w, 10, &repeatable("r-3", date(0), "a"), br#"{"a":1}"#);
    upstream_answers(&host, &mut s, 10);
    s.on_log(&host);
    let (_, _, acts) = send(&host, &w, 11, &repeatable("r-3", date(0), "b"), br#"{"a":2}"#);
    let r = reply(&acts, 11);
    assert_eq!((r.status, code(&r).as_str()), (400, "IDEMPOTENCY_KEY_REUSED"), "OASIS §5: 400, not 422");
    assert_eq!(header(&r, "repeatability-result"), Some("rejected"));
}

#[test]
fn first_sent_outside_the_window_is_412_rejected_without_asking_the_store() {
    let (host, w) = setup();
    for (first_sent, why) in [(date(-601), "before the window"), (date(61), "ahead of the clock")] {
        let (_, _, acts) = send(&host, &w, 10, &repeatable("r-4", first_sent, "a"), b"{}");
        let r = reply(&acts, 10);
        assert_eq!((r.status, code(&r).as_str()), (412, "REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW"), "{why}");
        assert_eq!(header(&r, "repeatability-result"), Some("rejected"), "{why}");
    }
    // Inside the window and within the skew: it runs, so the id was never claimed above.
    let (_, flow, _) = send(&host, &w, 12, &repeatable("r-4", date(59), "a"), b"{}");
    assert_eq!(flow, Flow::Continue);
}

#[test]
fn one_header_without_the_other_or_a_bad_date_is_400_rejected() {
    let (host, w) = setup();
    let cases: Vec<(Vec<(&str, String)>, &str)> = vec![
        (
            vec![("repeatability-request-id", "r-5".into()), ("authorization", hmac("a"))],
            "without Repeatability-First-Sent",
        ),
        (vec![("repeatability-first-sent", date(0)), ("authorization", hmac("a"))], "without Repeatability-Request-ID"),
        (repeatable("r-5", "2026-12-06T12:00:00Z".into(), "a"), "is not an HTTP-date"),
    ];
    for (headers, says) in cases {
        let (_, _, acts) = send(&host, &w, 10, &headers, b"{}");
        let r = reply(&acts, 10);
        assert_eq!((r.status, code(&r).as_str()), (400, "IDEMPOTENCY_KEY_INVALID"), "{says}");
        assert!(String::from_utf8_lossy(&r.body).contains(says), "{says}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(header(&r, "repeatability-result"), Some("rejected"));
    }
}

#[test]
fn without_either_header_it_is_an_ordinary_request_forwarded_each_time() {
    let (host, w) = setup();
    for ctx in [10, 11] {
        let (mut s, flow, _) = send(&host, &w, ctx, &[("authorization", hmac("a"))], b"{}");
        assert_eq!(flow, Flow::Continue, "OASIS §5: no headers, no repeatability");
        let acts = upstream_answers(&host, &mut s, ctx);
        assert!(!acts.iter().any(|a| matches!(a, Act::ResponseHeader { .. })), "nothing to accept: {acts:?}");
        s.on_log(&host);
    }
}

#[test]
fn a_window_below_five_minutes_or_another_key_source_refuses_to_load() {
    let short = POLICY.replace("ttl = \"10m\"", "ttl = \"4m\"");
    let e = parse_bundle(&short, "rooms.toml").unwrap_err().to_string();
    assert!(e.contains("at least 5 minutes") && e.contains("rooms"), "{e}");
    let named =
        POLICY.replace("protocol = \"repeatable-requests\"", "protocol = \"repeatable-requests\"\nname = \"X-Id\"");
    let e = parse_bundle(&named, "rooms.toml").unwrap_err().to_string();
    assert!(e.contains("drop key.from, key.name and key.parts"), "{e}");
    let wrong = POLICY.replace("repeatable-requests", "repeatable");
    let e = parse_bundle(&wrong, "rooms.toml").unwrap_err().to_string();
    assert!(e.contains("protocol") && e.contains("repeatable-requests"), "{e}");
    // `required` unset is false for this protocol, true for any other.
    let bundle = parse_bundle(POLICY, "rooms.toml").unwrap();
    assert!(!bundle.routes[0].key.required);
    let required = POLICY.replace("first_sent_skew", "required = true\nfirst_sent_skew");
    assert!(parse_bundle(&required, "rooms.toml").unwrap().routes[0].key.required);
}

#[test]
fn the_obsolete_http_date_forms_are_read_and_a_first_sent_sent_twice_is_400() {
    let (host, w) = setup();
    // RFC 9110 §5.6.7: a recipient reads RFC 850 and asctime dates too.
    // The other two forms of the fake host's now, written from its IMF-fixdate.
    let imf = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_millis(NOW_MS));
    let parts: Vec<&str> = imf.split([' ', ',']).filter(|p| !p.is_empty()).collect();
    let (day, mday, month, year, time) = (parts[0], parts[1], parts[2], parts[3], parts[4]);
    let long_day = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
        .into_iter()
        .find(|d| d.starts_with(day))
        .unwrap();
    let rfc850 = format!("{long_day}, {mday}-{month}-{} {time} GMT", &year[2..]);
    let asctime = format!("{day} {month} {:>2} {time} {year}", mday.trim_start_matches('0'));
    for (i, form) in [rfc850, asctime].into_iter().enumerate() {
        let (_, flow, acts) =
            send(&host, &w, 10 + i as u32, &repeatable(&format!("r-7-{i}"), form.clone(), "a"), b"{}");
        assert_eq!(flow, Flow::Continue, "{form}: {acts:?}");
    }
    let mut twice = repeatable("r-8", date(0), "a");
    twice.push(("repeatability-first-sent", date(0)));
    let (_, _, acts) = send(&host, &w, 20, &twice, b"{}");
    let r = reply(&acts, 20);
    assert_eq!((r.status, code(&r).as_str()), (400, "IDEMPOTENCY_KEY_INVALID"));
    assert!(String::from_utf8_lossy(&r.body).contains("2 times"), "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn the_window_is_the_ttl_less_the_skew_so_a_fast_clock_still_meets_its_record() {
    let (host, w) = setup();
    // Inside key.ttl (10m) but not inside ttl - skew (9m): a client whose clock ran 1m ahead
    // could have sent it 11m ago, past its record.
    let (_, _, acts) = send(&host, &w, 10, &repeatable("r-9", date(-9 * 60 - 30), "a"), b"{}");
    let r = reply(&acts, 10);
    assert_eq!((r.status, code(&r).as_str()), (412, "REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW"));
    let (_, flow, _) = send(&host, &w, 11, &repeatable("r-9", date(-8 * 60), "a"), b"{}");
    assert_eq!(flow, Flow::Continue);
}

#[test]
fn a_required_key_missing_is_400_rejected_and_a_duplicate_answer_is_accepted() {
    let policy = POLICY.replace("first_sent_skew", "required = true\non_completed = \"reject\"\nfirst_sent_skew");
    let host = FakeHost::new(NOW_MS);
    host.enter(ROOT);
    let w = Rc::new(Worker::configure(&host, &host, ROOT, policy.as_bytes()).unwrap());
    host.take_acts();
    let (_, _, acts) = send(&host, &w, 10, &[("authorization", hmac("a"))], b"{}");
    let r = reply(&acts, 10);
    assert_eq!((r.status, code(&r).as_str()), (400, "IDEMPOTENCY_KEY_MISSING"));
    assert_eq!(header(&r, "repeatability-result"), Some("rejected"));
    // The route's duplicate answer to a request completed before: the request's result.
    let (mut s, _, _) = send(&host, &w, 11, &repeatable("r-10", date(0), "a"), b"{}");
    upstream_answers(&host, &mut s, 11);
    s.on_log(&host);
    let (_, _, acts) = send(&host, &w, 12, &repeatable("r-10", date(0), "b"), b"{}");
    let r = reply(&acts, 12);
    assert_eq!((r.status, code(&r).as_str()), (409, "DUPLICATE_REQUEST"));
    assert_eq!(header(&r, "repeatability-result"), Some("accepted"));
}

#[test]
fn an_answer_envoy_made_itself_or_the_service_marked_is_left_alone() {
    let (host, w) = setup();
    for (ctx, headers, details) in [
        (10u32, vec![], "upstream_reset_before_response_started{connection_termination}"),
        (11, vec![("repeatability-result", &b"rejected"[..])], "via_upstream"),
    ] {
        let (mut s, flow, _) = send(&host, &w, ctx, &repeatable(&format!("r-11-{ctx}"), date(0), "a"), b"{}");
        assert_eq!(flow, Flow::Continue);
        host.update(ctx, |st| {
            *st = st.clone().with_response(503, &headers, b"{}");
            st.properties.insert("response.code_details".into(), details.as_bytes().to_vec());
        });
        host.enter(ctx);
        s.on_response_headers(&host, false);
        let acts = host.take_acts();
        assert!(!acts.iter().any(|a| matches!(a, Act::ResponseHeader { .. })), "{details}: {acts:?}");
    }
}
