#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! Key extraction, validation and caller scoping.

mod common;
use common::Req;
use idem_filter::fingerprint::fingerprint;
use idem_filter::json::canonical;
use idem_filter::key::*;
use idem_filter::policy::{parse_bundle, Anonymous, KeyPolicy, RoutePolicy, Source};

fn policy(key_toml: &str) -> KeyPolicy {
    let src = format!("[[route]]\nname = \"r\"\n[route.key]\n{key_toml}\n");
    parse_bundle(&src, "p").unwrap().routes.remove(0).key
}

#[test]
fn header_key_bare_and_structured_field_forms() {
    let p = policy("");
    assert_eq!(extract(&p, None, &Req::post("/").key("abc-1")).unwrap(), "abc-1");
    assert_eq!(extract(&p, None, &Req::post("/").key("\"8e03978e-40d5\"")).unwrap(), "8e03978e-40d5");
    assert_eq!(extract(&p, None, &Req::post("/").key(r#""a\"b\\c""#)).unwrap(), r#"a"b\c"#);
    for bad in [r#""unterminated"#, r#""a"b"#, r#""bad\escape""#, "\"caf\u{e9}\""] {
        assert!(matches!(extract(&p, None, &Req::post("/").key(bad)), Err(KeyError::Invalid(_))), "{bad}");
    }
    assert!(matches!(extract(&p, None, &Req::post("/")), Err(KeyError::Missing(m)) if m.contains("Idempotency-Key")));
}

#[test]
fn validation_bounds_length_and_control_characters() {
    assert!(validate(&"k".repeat(255)).is_ok());
    assert!(matches!(validate(&"k".repeat(256)), Err(KeyError::Invalid(m)) if m.contains("256 bytes")));
    assert!(validate("").is_err());
    assert!(validate("a\u{7}b").is_err());
    assert!(validate("订单-2024-0001").is_ok());
}

#[test]
fn query_key_is_decoded() {
    let p = policy("from = \"query\"\nname = \"request_id\"");
    let req = Req::post("/pay?x=1&request_id=a%20b%2Bc");
    assert_eq!(extract(&p, None, &req).unwrap(), "a b+c");
    assert!(matches!(extract(&p, None, &Req::post("/pay?x=1")), Err(KeyError::Missing(_))));
    assert_eq!(query_param("/p?a=1#frag", "a").unwrap().as_deref(), Some("1"));
    // A parameter sent twice is ambiguous.
    assert!(
        matches!(extract(&p, None, &Req::post("/pay?request_id=1&request_id=1")), Err(KeyError::Invalid(m)) if m.contains("more than once"))
    );
}

#[test]
fn body_key_by_json_pointer() {
    let p = policy("from = \"body\"\nname = \"/data/transaction_id\"");
    let ok = Req::post("/cb").body(r#"{"data":{"transaction_id":"tx-9"}}"#);
    assert_eq!(extract(&p, None, &ok).unwrap(), "tx-9");
    let num = Req::post("/cb").body(r#"{"data":{"transaction_id":12345}}"#);
    assert_eq!(extract(&p, None, &num).unwrap(), "12345");
    let not_json = Req::post("/cb").body("tx=1");
    assert!(matches!(extract(&p, None, &not_json), Err(KeyError::Missing(m)) if m.contains("not JSON")));
    let absent = Req::post("/cb").body(r#"{"data":{}}"#);
    assert!(matches!(extract(&p, None, &absent), Err(KeyError::Missing(m)) if m.contains("/data/transaction_id")));
    let object = Req::post("/cb").body(r#"{"data":{"transaction_id":{}}}"#);
    assert!(extract(&p, None, &object).is_err());
}

fn id(route: &str, scope: &[Source], key: &str, req: &Req) -> [u8; 32] {
    scoped_id(route, scope, Anonymous::Reject, key, None, req).unwrap()
}

#[test]
fn scope_separates_callers_and_routes() {
    let scope = vec![Source::Header("authorization".into())];
    let alice = Req::post("/").header("authorization", "Bearer alice");
    let bob = Req::post("/").header("authorization", "Bearer bob");
    let a1 = id("r", &scope, "k", &alice);
    assert_eq!(a1, id("r", &scope, "k", &alice.clone()));
    assert_ne!(a1, id("r", &scope, "k", &bob));
    assert_ne!(a1, id("other", &scope, "k", &alice));
    assert_ne!(a1, id("r", &scope, "k2", &alice));
    // Global keys (scope = []) are the same for every caller.
    assert_eq!(id("r", &[], "k", &alice), id("r", &[], "k", &bob));
    // Length-prefixing: moving bytes between route and key changes the id.
    assert_ne!(id("ab", &[], "c", &alice), id("a", &[], "bc", &alice));
}

#[test]
fn a_missing_scope_never_collapses_into_everyone() {
    let scope = vec![Source::Header("authorization".into())];
    let cookie_user = Req::post("/").header("cookie", "session=alice");
    let err = scoped_id("r", &scope, Anonymous::Reject, "k", None, &cookie_user).unwrap_err();
    assert!(matches!(&err, KeyError::ScopeMissing(m) if m.contains("header:authorization")), "{err:?}");
    // An empty value is no identity either.
    let empty = Req::post("/").header("authorization", "");
    assert!(matches!(scoped_id("r", &scope, Anonymous::Reject, "k", None, &empty), Err(KeyError::ScopeMissing(_))));
    // Shared on purpose: anonymous callers share one scope, apart from every identified one.
    let anon = scoped_id("r", &scope, Anonymous::Shared, "k", None, &cookie_user).unwrap();
    assert_eq!(anon, scoped_id("r", &scope, Anonymous::Shared, "k", None, &Req::post("/")).unwrap());
    let with_empty_value = Req::post("/").header("authorization", "x");
    assert_ne!(anon, scoped_id("r", &scope, Anonymous::Shared, "k", None, &with_empty_value).unwrap());
}

#[test]
fn cookie_scope_separates_session_users() {
    let scope = vec![Source::Cookie("session".into())];
    let alice = Req::post("/").header("cookie", "theme=dark; session=alice");
    let bob = Req::post("/").header("cookie", "session=bob;theme=dark");
    let alice2 = Req::post("/").header("cookie", "session=alice");
    assert_ne!(id("r", &scope, "k", &alice), id("r", &scope, "k", &bob));
    assert_eq!(id("r", &scope, "k", &alice), id("r", &scope, "k", &alice2));
    // `sessionx=` is another cookie.
    let other = Req::post("/").header("cookie", "sessionx=alice");
    assert!(matches!(scoped_id("r", &scope, Anonymous::Reject, "k", None, &other), Err(KeyError::ScopeMissing(_))));
}

#[test]
fn metadata_scope_reads_the_verified_identity() {
    struct WithSub(Req, &'static str);
    impl RequestView for WithSub {
        fn method(&self) -> &str {
            self.0.method()
        }
        fn path(&self) -> &str {
            self.0.path()
        }
        fn header_values(&self, name: &str) -> Vec<&[u8]> {
            self.0.header_values(name)
        }
        fn body(&self) -> Option<&[u8]> {
            None
        }
        fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
            let want = ["metadata", "filter_metadata", "envoy.filters.http.jwt_authn", "jwt_payload", "sub"];
            (path == want).then(|| self.1.as_bytes().to_vec())
        }
    }
    let scope = vec![Source::Metadata(vec!["envoy.filters.http.jwt_authn".into(), "jwt_payload".into(), "sub".into()])];
    // A refreshed token (another Authorization value) keeps the subject, so the scope stays.
    let before = WithSub(Req::post("/").header("authorization", "Bearer old"), "user-1");
    let after = WithSub(Req::post("/").header("authorization", "Bearer new"), "user-1");
    let other = WithSub(Req::post("/"), "user-2");
    let a = scoped_id("r", &scope, Anonymous::Reject, "k", None, &before).unwrap();
    assert_eq!(a, scoped_id("r", &scope, Anonymous::Reject, "k", None, &after).unwrap());
    assert_ne!(a, scoped_id("r", &scope, Anonymous::Reject, "k", None, &other).unwrap());
    assert!(matches!(
        scoped_id("r", &scope, Anonymous::Reject, "k", None, &Req::post("/")),
        Err(KeyError::ScopeMissing(_))
    ));
}

#[test]
fn a_key_header_sent_twice_or_as_a_list_is_ambiguous() {
    let p = policy("");
    let twice = Req::post("/").key("a").key("b");
    assert!(matches!(extract(&p, None, &twice), Err(KeyError::Invalid(m)) if m.contains("2 times")));
    let listed = Req::post("/").key("a, b");
    assert!(matches!(extract(&p, None, &listed), Err(KeyError::Invalid(m)) if m.contains("list")));
    // Quoted, a comma is part of the key.
    assert_eq!(extract(&p, None, &Req::post("/").key("\"a, b\"")).unwrap(), "a, b");
}

#[test]
fn non_utf8_header_bytes_are_invalid_keys_and_scopes() {
    struct Raw(Vec<(String, Vec<u8>)>);
    impl RequestView for Raw {
        fn method(&self) -> &str {
            "POST"
        }
        fn path(&self) -> &str {
            "/"
        }
        fn header_values(&self, name: &str) -> Vec<&[u8]> {
            self.0.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice()).collect()
        }
        fn body(&self) -> Option<&[u8]> {
            None
        }
    }
    let p = policy("");
    let key = Raw(vec![("idempotency-key".into(), b"caf\xe9".to_vec())]);
    assert!(matches!(extract(&p, None, &key), Err(KeyError::Invalid(m)) if m.contains("UTF-8")));
    let scope = vec![Source::Header("authorization".into())];
    let auth = Raw(vec![("authorization".into(), b"Bearer \xe9".to_vec())]);
    assert!(
        matches!(scoped_id("r", &scope, Anonymous::Reject, "k", None, &auth), Err(KeyError::Invalid(m)) if m.contains("UTF-8"))
    );
}

#[test]
fn numeric_body_keys_are_exact() {
    let p = policy("from = \"body\"\nname = \"/transaction_id\"");
    let k = |body: &str| extract(&p, None, &Req::post("/cb").body(body));
    // Two 20-digit ids that one f64 cannot tell apart stay two keys.
    assert_eq!(k(r#"{"transaction_id":42000000000000000001}"#).unwrap(), "42000000000000000001");
    assert_eq!(k(r#"{"transaction_id":42000000000000000002}"#).unwrap(), "42000000000000000002");
    // One value, one key, however it is written.
    for same in ["1001", "1001.0", "1.001e3", "10010e-1"] {
        assert_eq!(k(&format!(r#"{{"transaction_id":{same}}}"#)).unwrap(), "1001", "{same}");
    }
    // A member named twice is ambiguous (the upstream's parser may take the other one).
    assert!(matches!(k(r#"{"transaction_id":1,"transaction_id":2}"#), Err(KeyError::Invalid(_))));
}

#[test]
fn keys_are_truncated_for_logs() {
    assert_eq!(truncated("2024-0001-abcdef"), "2024-000…");
    assert_eq!(truncated("short"), "short");
    assert_eq!(truncated("12345678"), "12345678");
    assert_eq!(truncated("123456789"), "12345678…");
    assert_eq!(truncated("订单订单订单订单订单"), "订单订单订单订单…");
}

#[test]
fn fingerprint_covers_configured_parts_only() {
    let p = policy("");
    let fp = |p: &KeyPolicy, r: &Req| fingerprint(p, None, r, "/o", 65536).unwrap();
    let base = Req::post("/o?a=1").key("k").body(r#"{"b":1,"a":2}"#);
    let first = fp(&p, &base);
    assert_eq!(first, fp(&p, &base.clone().header("x-other", "1")));
    let mut other_body = base.clone();
    other_body.body = Some(br#"{"a":2,"b":1}"#.to_vec());
    assert_ne!(first, fp(&p, &other_body), "raw body: key order matters");
    let mut other_query = base.clone();
    other_query.path = "/o?a=2".into();
    assert_ne!(first, fp(&p, &other_query));
    // The path comes from the matcher (aliases are one request), not from the raw :path.
    assert_ne!(first, fingerprint(&p, None, &base, "/other", 65536).unwrap());

    let canon = policy("fingerprint_body = \"canonical-json\"");
    assert_eq!(fp(&canon, &base), fp(&canon, &other_body));
    assert_eq!(canonical(b"{ \"b\": [2, 1], \"a\": {\"d\":1,\"c\":2} }").unwrap(), br#"{"a":{"c":2,"d":1},"b":[2,1]}"#);

    let off = policy("fingerprint = []");
    assert_eq!(fp(&off, &base), fp(&off, &other_query));

    let hdr = policy("fingerprint = [\"header:x-sig\"]");
    assert_ne!(fp(&hdr, &base.clone().header("x-sig", "1")), fp(&hdr, &base.clone().header("x-sig", "2")));
}

fn route(toml: &str) -> RoutePolicy {
    parse_bundle(&format!("[[route]]\nname = \"r\"\n{toml}\n"), "p").unwrap().routes.remove(0)
}

fn key_of(r: &RoutePolicy, req: &Req) -> Result<String, KeyError> {
    extract(&r.key, r.template(), req)
}

const ALIPAY: &str = "gmt_create=2024-01-01+12%3A00%3A00&charset=utf-8&notify_time=2024-01-01+12%3A00%3A05\
&notify_id=2024010100222120005abcdef&out_trade_no=T20240101-0001&app_id=2021000000000000&trade_status=TRADE_SUCCESS\
&sign_type=RSA2&sign=aBc%2B%2Fdef%3D%3D";

#[test]
fn form_keys_are_decoded_fields_and_a_field_twice_is_ambiguous() {
    let r = route("[route.key]\nfrom = \"form\"\nname = \"notify_id\"\nscope = [\"form:app_id\"]");
    assert_eq!(key_of(&r, &Req::post("/n").body(ALIPAY)).unwrap(), "2024010100222120005abcdef");
    let twice = format!("{ALIPAY}&notify_id=other");
    assert!(
        matches!(key_of(&r, &Req::post("/n").body(&twice)), Err(KeyError::Invalid(m)) if m.contains("more than once"))
    );
    assert!(matches!(key_of(&r, &Req::post("/n").body("a=1")), Err(KeyError::Missing(m)) if m.contains("notify_id")));
    // The scope comes from the body too: two apps' notify ids are two claims.
    let a = scoped_id("r", &r.key.scope, Anonymous::Reject, "k", None, &Req::post("/n").body(ALIPAY)).unwrap();
    let other_app = ALIPAY.replace("app_id=2021000000000000", "app_id=2021000000000001");
    let b = scoped_id("r", &r.key.scope, Anonymous::Reject, "k", None, &Req::post("/n").body(&other_app)).unwrap();
    assert_ne!(a, b);
    assert!(matches!(
        scoped_id("r", &r.key.scope, Anonymous::Reject, "k", None, &Req::post("/n").body("x=1")),
        Err(KeyError::ScopeMissing(_))
    ));
}

const WECHAT_V2: &str = "<xml><appid><![CDATA[wx2421b1c4370ec43b]]></appid><mch_id><![CDATA[10000100]]></mch_id>\
<transaction_id><![CDATA[1004400740201409030005092168]]></transaction_id><out_trade_no>1409811653</out_trade_no>\
<sign><![CDATA[B552ED6B279343CB493C5DD0D78AB241]]></sign></xml>";

#[test]
fn xml_keys_read_plain_elements_and_refuse_dtds() {
    let r = route("[route.key]\nfrom = \"xml\"\nname = \"/xml/transaction_id\"\nscope = [\"xml:/xml/mch_id\"]");
    assert_eq!(key_of(&r, &Req::post("/n").body(WECHAT_V2)).unwrap(), "1004400740201409030005092168");
    let bomb =
        format!("<!DOCTYPE xml [<!ENTITY a \"aaaa\">]>{}", WECHAT_V2.replace("1004400740201409030005092168", "&a;"));
    assert!(matches!(key_of(&r, &Req::post("/n").body(&bomb)), Err(KeyError::Invalid(m)) if m.contains("DTD")));
    let entity = WECHAT_V2.replace("<out_trade_no>1409811653", "<out_trade_no>&ext;");
    assert!(matches!(key_of(&r, &Req::post("/n").body(&entity)), Err(KeyError::Invalid(m)) if m.contains("&ext;")));
    assert!(matches!(key_of(&r, &Req::post("/n").body("{}")), Err(KeyError::Missing(m)) if m.contains("not XML")));
}

#[test]
fn path_keys_read_the_template_parameter() {
    let r = route("match = { method = \"POST\", path = \"/orders/{order_id}/pay\" }\n[route.key]\nfrom = \"path\"\nname = \"order_id\"");
    assert_eq!(key_of(&r, &Req::post("/orders/A-1001/pay")).unwrap(), "A-1001");
    assert_eq!(key_of(&r, &Req::post("/orders/%E8%AE%A2%E5%8D%95/pay?x=1")).unwrap(), "订单");
    assert!(matches!(key_of(&r, &Req::post("/orders/%FF/pay")), Err(KeyError::Invalid(m)) if m.contains("UTF-8")));
}

#[test]
fn composite_keys_join_exact_parts_unambiguously() {
    let r = route("[route.key]\nparts = [\"form:app_id\", \"form:out_trade_no\"]\nscope = []");
    let k = key_of(&r, &Req::post("/n").body(ALIPAY)).unwrap();
    assert_eq!(k, format!("2021000000000000{PART_SEPARATOR}T20240101-0001"));
    // Moving text between parts makes another key.
    let a = key_of(&r, &Req::post("/n").body("app_id=ab&out_trade_no=c")).unwrap();
    let b = key_of(&r, &Req::post("/n").body("app_id=a&out_trade_no=bc")).unwrap();
    assert_ne!(a, b);
    // A separator smuggled into a part (percent-encoded) is a control character: refused.
    let smuggled = key_of(&r, &Req::post("/n").body("app_id=a%1Fb&out_trade_no=c"));
    assert!(matches!(smuggled, Err(KeyError::Invalid(m)) if m.contains("form:app_id") && m.contains("control")));
    // Every part is required.
    assert!(
        matches!(key_of(&r, &Req::post("/n").body("app_id=a")), Err(KeyError::Missing(m)) if m.contains("out_trade_no"))
    );
    // Parts from several sources, JSON numbers by their digits.
    let mixed = route(
        "match = { method = \"POST\", path = \"/m/{mchid}/pay\" }\n[route.key]\nparts = [\"path:mchid\", \"body:/out_trade_no\", \"header:x-app\"]",
    );
    let req = Req::post("/m/1900000109/pay").header("x-app", "a1").body(r#"{"out_trade_no":12345678901234567890}"#);
    assert_eq!(key_of(&mixed, &req).unwrap(), format!("1900000109{0}12345678901234567890{0}a1", PART_SEPARATOR));
}

#[test]
fn fingerprints_over_parts_of_the_body() {
    let r = route("[route.key]\nfrom = \"body\"\nname = \"/id\"\nscope = []\nfingerprint = [\"body:/data\"]");
    let fp = |body: &str| fingerprint(&r.key, None, &Req::post("/e").body(body), "/e", 65536);
    let first = fp(r#"{"id":"e1","time":"t1","data":{"a":1,"b":[1,2]}}"#).unwrap();
    // Another delivery: new time, members reordered, numbers written otherwise: the same event.
    assert_eq!(first, fp(r#"{"time":"t2","data":{"b":[1.0,2],"a":1},"id":"e1"}"#).unwrap());
    assert_ne!(first, fp(r#"{"id":"e1","time":"t1","data":{"a":2,"b":[1,2]}}"#).unwrap());
    assert_ne!(first, fp(r#"{"id":"e1","time":"t1"}"#).unwrap(), "absent is not empty");
    assert!(matches!(fp(r#"{"id":"e1","data":{"a":1,"a":2}}"#), Err(KeyError::Invalid(m)) if m.contains("twice")));
}

#[test]
fn canonical_json_fingerprints_never_round_through_floating_point() {
    let r = route("[route.key]\nfingerprint = [\"body\"]\nfingerprint_body = \"canonical-json\"");
    let fp = |body: &str| fingerprint(&r.key, None, &Req::post("/o").key("k").body(body), "/o", 65536).unwrap();
    assert_ne!(fp(r#"{"amount":12345678901234567890}"#), fp(r#"{"amount":12345678901234567891}"#));
    assert_eq!(fp(r#"{"amount":100, "id":"x"}"#), fp(r#"{"id":"x","amount":1e2}"#));
    let dup = fingerprint(&r.key, None, &Req::post("/o").body(r#"{"a":1,"a":2}"#), "/o", 65536);
    assert!(matches!(dup, Err(KeyError::Invalid(_))));
}

#[test]
fn methods_in_the_fingerprint_are_case_insensitive() {
    let r = route("");
    let mut lower = Req::post("/o").key("k").body("{}");
    lower.method = "post".into();
    let upper = Req::post("/o").key("k").body("{}");
    assert_eq!(
        fingerprint(&r.key, None, &lower, "/o", 65536).unwrap(),
        fingerprint(&r.key, None, &upper, "/o", 65536).unwrap()
    );
}

#[test]
fn cloudevent_attributes_come_from_either_mode() {
    let r = route("[route.key]\nfrom = \"cloudevent\"\nname = \"id\"\nscope = [\"cloudevent:source\"]\nfingerprint = [\"cloudevent:type\", \"cloudevent:data\"]");
    let binary = Req::post("/e")
        .header("ce-id", "e1")
        .header("ce-source", "/shop/eu")
        .header("ce-type", "order.paid")
        .header("ce-time", "2026-12-02T10:00:00Z")
        .header("content-type", "application/json")
        .body(r#"{"order":7,"amount":100}"#);
    let structured = |source: &str, time: &str, data: &str| {
        Req::post("/e").header("content-type", "application/cloudevents+json; charset=utf-8").body(&format!(
            r#"{{"specversion":"1.0","id":"e1","source":"{source}","type":"order.paid","time":"{time}","data":{data}}}"#
        ))
    };
    assert_eq!(key_of(&r, &binary).unwrap(), "e1");
    let s1 = structured("/shop/eu", "t1", r#"{"order":7,"amount":100}"#);
    assert_eq!(key_of(&r, &s1).unwrap(), "e1");
    // The scope is the source: the same id from another source is another event.
    let id = |req: &Req| scoped_id("r", &r.key.scope, Anonymous::Reject, "e1", None, req).unwrap();
    assert_eq!(id(&binary), id(&s1));
    assert_ne!(id(&s1), id(&structured("/shop/us", "t1", r#"{"order":7,"amount":100}"#)));
    // A re-delivery with a new time (and reordered data) is the same event; other data is not.
    let fp = |req: &Req| fingerprint(&r.key, None, req, "/e", 65536).unwrap();
    assert_eq!(fp(&s1), fp(&structured("/shop/eu", "t2", r#"{"amount":100,"order":7}"#)));
    assert_ne!(fp(&s1), fp(&structured("/shop/eu", "t1", r#"{"order":8,"amount":100}"#)));
    // A batch is refused, never keyed as a whole.
    let batch = Req::post("/e").header("content-type", "application/cloudevents-batch+json").body("[]");
    assert!(matches!(key_of(&r, &batch), Err(KeyError::Unsupported(m)) if m.contains("one per request")));
    let missing = Req::post("/e").header("ce-source", "/s");
    assert!(matches!(key_of(&r, &missing), Err(KeyError::Missing(m)) if m.contains("ce-id")));
}

// ---- exactness (issue 37): no key source turns bytes into text lossily

/// A small deterministic generator (no dependency for one test).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    /// Short byte strings biased to what tells lossy decoding apart: Latin-1 bytes (`caf\xE9`),
    /// broken and whole UTF-8 sequences, separators.
    fn bytes(&mut self) -> Vec<u8> {
        const ALPHABET: &[u8] = b"ab%+&=;/\"<>\xe9\xe8\xc3\xa9\xff\x80";
        let n = 1 + (self.next() % 6) as usize;
        (0..n).map(|_| ALPHABET[(self.next() as usize) % ALPHABET.len()]).collect()
    }
}

fn pct(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("%{b:02X}")).collect()
}

fn xml_text(bytes: &[u8]) -> Option<String> {
    // XML bodies are text: only UTF-8 values can be sent at all; markup escaped.
    let s = std::str::from_utf8(bytes).ok()?;
    Some(s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;"))
}

/// The key each source reads from a request carrying `value` (its decoded bytes), for every
/// source that can carry arbitrary bytes.
fn keys_for(value: &[u8]) -> Vec<(&'static str, Result<Option<String>, KeyError>)> {
    let src = |s: &str| {
        parse_bundle(
            &format!(
                "[[route]]\nname = \"r\"\nmatch = {{ method = \"POST\", path = \"/o/{{id}}\" }}\n[route.key]\n{s}\n"
            ),
            "p",
        )
        .unwrap()
    };
    let mut out = Vec::new();
    let query = Req::post(&format!("/o/1?key={}", pct(value)));
    out.push(("query", read(&Source::Query("key".into()), None, &query)));
    let mut form = Req::post("/o/1");
    form.body = Some(format!("a=1&key={}", pct(value)).into_bytes());
    out.push(("form", read(&Source::Form("key".into()), None, &form)));
    let header = Req::post("/o/1").raw_header("x-key", value);
    out.push(("header", read(&Source::Header("X-Key".into()), None, &header)));
    let bundle = src("from = \"path\"\nname = \"id\"");
    let template = match &bundle.routes[0].matcher {
        idem_filter::policy::Matcher::Request { path, .. } => Some(path.clone()),
        _ => None,
    };
    let path = Req::post(&format!("/o/{}", pct(value)));
    out.push(("path", read(&Source::Path("id".into()), template.as_ref(), &path)));
    if let Some(t) = xml_text(value) {
        let mut xml = Req::post("/o/1");
        xml.body = Some(format!("<xml><id>{t}</id></xml>").into_bytes());
        out.push(("xml", read(&Source::Xml(vec!["xml".into(), "id".into()]), None, &xml)));
    }
    out
}

#[test]
fn two_requests_share_a_key_only_if_their_decoded_values_are_equal_utf8() {
    let mut rng = Lcg(37);
    for _ in 0..3000 {
        let (a, b) = (rng.bytes(), rng.bytes());
        for ((source, ka), (_, kb)) in keys_for(&a).into_iter().zip(keys_for(&b)) {
            for (value, key) in [(&a, &ka), (&b, &kb)] {
                match key {
                    Ok(Some(k)) => {
                        // A header value is read as sent (trimmed, sf-string unquoted): compare
                        // on what can be told apart; every other source decodes exactly.
                        if source != "header" {
                            assert_eq!(k.as_bytes(), value.as_slice(), "{source}: {value:?} read as {k:?}");
                        }
                    }
                    Ok(None) => {}
                    Err(KeyError::Invalid(m)) => {
                        if std::str::from_utf8(value).is_err() {
                            assert!(m.contains("UTF-8"), "{source}: {m}");
                        }
                    }
                    Err(e) => {
                        let _ = e;
                    }
                }
            }
            if let (Ok(Some(x)), Ok(Some(y))) = (&ka, &kb) {
                assert_eq!(x == y, a == b, "{source}: {a:?} and {b:?} gave {x:?} and {y:?}");
            }
        }
    }
}

#[test]
fn a_query_key_that_is_not_utf8_once_decoded_is_refused_not_merged() {
    for bad in ["%FF", "caf%E9", "caf%E8"] {
        let r = read(&Source::Query("key".into()), None, &Req::post(&format!("/p?key={bad}")));
        assert!(
            matches!(&r, Err(KeyError::Invalid(m)) if m.contains("query parameter key is not UTF-8")),
            "{bad}: {r:?}"
        );
    }
    let ok = read(&Source::Query("key".into()), None, &Req::post("/p?key=caf%C3%A9")).unwrap();
    assert_eq!(ok.as_deref(), Some("café"));
}

#[test]
fn percent_escapes_in_a_path_are_one_path_whatever_the_case_of_their_hex_digits() {
    let bundle = parse_bundle(
        "[[route]]\nname = \"r\"\nmatch = { method = \"POST\", path = \"/o/{id}/pay\" }\n[route.key]\nfrom = \"path\"\nname = \"id\"\n",
        "p",
    )
    .unwrap();
    let m = &bundle.routes[0].matcher;
    assert_eq!(m.canonical_path("/o/a%2fb/pay"), m.canonical_path("/o/a%2Fb/pay"));
    assert_eq!(m.canonical_path("/o/a%2fb/pay"), "/o/a%2Fb/pay");
}

// ---- part of a value, and values by digest (issue 39)

const SIGV4: &str = "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20261202/us-east-1/ec2/aws4_request, \
SignedHeaders=content-type;host;x-amz-date, Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024";

#[test]
fn a_signed_callers_stable_id_is_read_out_of_a_header_signed_anew_per_request() {
    let scope = Source::parse("sigv4:access_key_id").unwrap();
    assert_eq!(scope.to_string(), "sigv4:access_key_id");
    let req = |auth: &str| Req::post("/").header("authorization", auth);
    let retry = SIGV4.replace("20261202", "20261203").replace("fe5f80f7", "0123abcd");
    assert_eq!(read(&scope, None, &req(SIGV4)).unwrap().as_deref(), Some("AKIAIOSFODNN7EXAMPLE"));
    assert_eq!(
        read(&scope, None, &req(&retry)).unwrap(),
        read(&scope, None, &req(SIGV4)).unwrap(),
        "one caller across retries"
    );
    let other = SIGV4.replace("AKIAIOSFODNN7EXAMPLE", "AKIAOTHERKEY00000000");
    assert_ne!(read(&scope, None, &req(&other)).unwrap(), read(&scope, None, &req(SIGV4)).unwrap());
    // Scoped ids follow: the same key from the same access key is one claim, from another two.
    let id = |auth: &str| {
        scoped_id("r", std::slice::from_ref(&scope), Anonymous::Reject, "tok-1", None, &req(auth)).unwrap()
    };
    assert_eq!(id(SIGV4), id(&retry));
    assert_ne!(id(SIGV4), id(&other));
    // WeChat Pay v3 signs every call with a new nonce and signature; mchid stays.
    let wx = Source::parse("wechatpay:mchid").unwrap();
    let sign = |nonce: &str| {
        format!(
            r#"WECHATPAY2-SHA256-RSA2048 mchid="1900000001",nonce_str="{nonce}",signature="c2ln",timestamp="1554208460",serial_no="1DDE55AD98ED71D6EDD4A4A16996DE7B47773A8C""#
        )
    };
    assert_eq!(read(&wx, None, &req(&sign("a"))).unwrap().as_deref(), Some("1900000001"));
    assert_eq!(read(&wx, None, &req(&sign("a"))).unwrap(), read(&wx, None, &req(&sign("b"))).unwrap());
    // Azure's HMAC (App Configuration's form): the credential stays, the signature does not; a
    // SigV4 header is not read as one (its Credential= ends with `/`, not `&`).
    let az = Source::parse("azurehmac:credential").unwrap();
    let hmac = |sig: &str| {
        format!(
            "HMAC-SHA256 Credential=1rAa-l9-s0:7Vzs&SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature={sig}"
        )
    };
    assert_eq!(read(&az, None, &req(&hmac("a+b/c="))).unwrap().as_deref(), Some("1rAa-l9-s0:7Vzs"));
    assert_eq!(read(&az, None, &req(&hmac("a"))).unwrap(), read(&az, None, &req(&hmac("b"))).unwrap());
    assert!(matches!(read(&az, None, &req(SIGV4)), Err(KeyError::Invalid(m)) if m.contains("does not match")));
    // Azure Communication Services' HMAC names no credential at all: nothing to scope on in it.
    let acs = "HMAC-SHA256 SignedHeaders=x-ms-date;host;x-ms-content-sha256&Signature=abc";
    assert!(matches!(read(&az, None, &req(acs)), Err(KeyError::Invalid(_))));
}

#[test]
fn a_capture_that_matches_nothing_or_twice_is_refused_naming_the_part() {
    let s = Source::parse(r"header:authorization ~ key=(\w+)").unwrap();
    let r = |v: &str| read(&s, None, &Req::post("/").header("authorization", v));
    assert!(
        matches!(r("Bearer x"), Err(KeyError::Invalid(m)) if m.contains("does not match") && m.contains("header:authorization"))
    );
    assert!(matches!(r("key=a key=b"), Err(KeyError::Invalid(m)) if m.contains("2 times")));
    assert_eq!(read(&s, None, &Req::post("/")).unwrap(), None, "absent is absent");
    let huge = format!("key={} {}", "a".repeat(100_000), "b ".repeat(100_000));
    assert_eq!(r(&huge).unwrap().map(|v| v.len()), Some(100_000), "linear time on a large value");
}

#[test]
fn patterns_are_refused_at_load_unless_they_capture_exactly_one_part() {
    for (bad, why) in [
        (r"header:authorization ~ Credential=\w+/", "0 capture groups"),
        (r"header:authorization ~ (a)(b)", "2 capture groups"),
        (r"header:authorization ~ (a)\1", "no backreferences"),
        (r"header:authorization ~ (?=a)(b)", "no backreferences or look-around"),
        (r"path:id ~ (a)", "a pattern applies to one value"),
        ("sha256:sha256:header:x", "one sha256: is enough"),
    ] {
        let e = Source::parse(bad).unwrap_err();
        assert!(e.contains(why), "{bad}: {e}");
    }
    let long = format!("header:a ~ ({})", "a".repeat(600));
    assert!(Source::parse(&long).unwrap_err().contains("at most 512"));
}

#[test]
fn a_value_too_long_for_a_key_identifies_the_request_by_its_digest() {
    // WeChat Pay v2's refund notify: the ids are inside req_info, 1068 bytes of base64.
    let req_info = "T".repeat(1068);
    let body = format!("<xml><return_code>SUCCESS</return_code><req_info><![CDATA[{req_info}]]></req_info></xml>");
    let mut req = Req::post("/refund-notify");
    req.body = Some(body.into_bytes());
    let plain = policy("from = \"xml\"\nname = \"/xml/req_info\"");
    assert!(matches!(extract(&plain, None, &req), Err(KeyError::Invalid(m)) if m.contains("1068 bytes")));
    let digested = policy("parts = [\"sha256:xml:/xml/req_info\"]");
    let key = extract(&digested, None, &req).unwrap();
    assert_eq!(key.len(), 64);
    assert_eq!(key, format!("{:x}", <sha2::Sha256 as sha2::Digest>::digest(req_info.as_bytes())));
    let mut other = req.clone();
    other.body = Some(format!("<xml><req_info>{}U</req_info></xml>", "T".repeat(1067)).into_bytes());
    assert_ne!(extract(&digested, None, &other).unwrap(), key);
}
