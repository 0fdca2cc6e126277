#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! Key extraction, validation and caller scoping.

mod common;
use common::Req;
use idem_filter::fingerprint::{canonical_json, fingerprint};
use idem_filter::key::*;
use idem_filter::policy::{parse_bundle, Anonymous, KeyPolicy, ScopePart};

fn policy(key_toml: &str) -> KeyPolicy {
    let src = format!("[[route]]\nname = \"r\"\n[route.key]\n{key_toml}\n");
    parse_bundle(&src, "p").unwrap().routes.remove(0).key
}

#[test]
fn header_key_bare_and_structured_field_forms() {
    let p = policy("");
    assert_eq!(extract(&p, &Req::post("/").key("abc-1")).unwrap(), "abc-1");
    assert_eq!(extract(&p, &Req::post("/").key("\"8e03978e-40d5\"")).unwrap(), "8e03978e-40d5");
    assert_eq!(extract(&p, &Req::post("/").key(r#""a\"b\\c""#)).unwrap(), r#"a"b\c"#);
    for bad in [r#""unterminated"#, r#""a"b"#, r#""bad\escape""#, "\"caf\u{e9}\""] {
        assert!(matches!(extract(&p, &Req::post("/").key(bad)), Err(KeyError::Invalid(_))), "{bad}");
    }
    assert!(matches!(extract(&p, &Req::post("/")), Err(KeyError::Missing(m)) if m.contains("Idempotency-Key")));
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
    assert_eq!(extract(&p, &req).unwrap(), "a b+c");
    assert!(matches!(extract(&p, &Req::post("/pay?x=1")), Err(KeyError::Missing(_))));
    assert_eq!(query_param("/p?a=1#frag", "a").as_deref(), Some("1"));
}

#[test]
fn body_key_by_json_pointer() {
    let p = policy("from = \"body\"\nname = \"/data/transaction_id\"");
    let ok = Req::post("/cb").body(r#"{"data":{"transaction_id":"tx-9"}}"#);
    assert_eq!(extract(&p, &ok).unwrap(), "tx-9");
    let num = Req::post("/cb").body(r#"{"data":{"transaction_id":12345}}"#);
    assert_eq!(extract(&p, &num).unwrap(), "12345");
    let not_json = Req::post("/cb").body("tx=1");
    assert!(matches!(extract(&p, &not_json), Err(KeyError::Missing(m)) if m.contains("not JSON")));
    let absent = Req::post("/cb").body(r#"{"data":{}}"#);
    assert!(matches!(extract(&p, &absent), Err(KeyError::Missing(m)) if m.contains("/data/transaction_id")));
    let object = Req::post("/cb").body(r#"{"data":{"transaction_id":{}}}"#);
    assert!(extract(&p, &object).is_err());
}

fn id(route: &str, scope: &[ScopePart], key: &str, req: &Req) -> [u8; 32] {
    scoped_id(route, scope, Anonymous::Reject, key, req).unwrap()
}

#[test]
fn scope_separates_callers_and_routes() {
    let scope = vec![ScopePart::Header("authorization".into())];
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
    let scope = vec![ScopePart::Header("authorization".into())];
    let cookie_user = Req::post("/").header("cookie", "session=alice");
    let err = scoped_id("r", &scope, Anonymous::Reject, "k", &cookie_user).unwrap_err();
    assert!(matches!(&err, KeyError::ScopeMissing(m) if m.contains("header:authorization")), "{err:?}");
    // An empty value is no identity either.
    let empty = Req::post("/").header("authorization", "");
    assert!(matches!(scoped_id("r", &scope, Anonymous::Reject, "k", &empty), Err(KeyError::ScopeMissing(_))));
    // Shared on purpose: anonymous callers share one scope, apart from every identified one.
    let anon = scoped_id("r", &scope, Anonymous::Shared, "k", &cookie_user).unwrap();
    assert_eq!(anon, scoped_id("r", &scope, Anonymous::Shared, "k", &Req::post("/")).unwrap());
    let with_empty_value = Req::post("/").header("authorization", "x");
    assert_ne!(anon, scoped_id("r", &scope, Anonymous::Shared, "k", &with_empty_value).unwrap());
}

#[test]
fn cookie_scope_separates_session_users() {
    let scope = vec![ScopePart::Cookie("session".into())];
    let alice = Req::post("/").header("cookie", "theme=dark; session=alice");
    let bob = Req::post("/").header("cookie", "session=bob;theme=dark");
    let alice2 = Req::post("/").header("cookie", "session=alice");
    assert_ne!(id("r", &scope, "k", &alice), id("r", &scope, "k", &bob));
    assert_eq!(id("r", &scope, "k", &alice), id("r", &scope, "k", &alice2));
    // `sessionx=` is another cookie.
    let other = Req::post("/").header("cookie", "sessionx=alice");
    assert!(matches!(scoped_id("r", &scope, Anonymous::Reject, "k", &other), Err(KeyError::ScopeMissing(_))));
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
    let scope =
        vec![ScopePart::Metadata(vec!["envoy.filters.http.jwt_authn".into(), "jwt_payload".into(), "sub".into()])];
    // A refreshed token (another Authorization value) keeps the subject, so the scope stays.
    let before = WithSub(Req::post("/").header("authorization", "Bearer old"), "user-1");
    let after = WithSub(Req::post("/").header("authorization", "Bearer new"), "user-1");
    let other = WithSub(Req::post("/"), "user-2");
    let a = scoped_id("r", &scope, Anonymous::Reject, "k", &before).unwrap();
    assert_eq!(a, scoped_id("r", &scope, Anonymous::Reject, "k", &after).unwrap());
    assert_ne!(a, scoped_id("r", &scope, Anonymous::Reject, "k", &other).unwrap());
    assert!(matches!(scoped_id("r", &scope, Anonymous::Reject, "k", &Req::post("/")), Err(KeyError::ScopeMissing(_))));
}

#[test]
fn a_key_header_sent_twice_or_as_a_list_is_ambiguous() {
    let p = policy("");
    let twice = Req::post("/").key("a").key("b");
    assert!(matches!(extract(&p, &twice), Err(KeyError::Invalid(m)) if m.contains("2 times")));
    let listed = Req::post("/").key("a, b");
    assert!(matches!(extract(&p, &listed), Err(KeyError::Invalid(m)) if m.contains("list")));
    // Quoted, a comma is part of the key.
    assert_eq!(extract(&p, &Req::post("/").key("\"a, b\"")).unwrap(), "a, b");
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
            self.0.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_slice()).collect()
        }
        fn body(&self) -> Option<&[u8]> {
            None
        }
    }
    let p = policy("");
    let key = Raw(vec![("idempotency-key".into(), b"caf\xe9".to_vec())]);
    assert!(matches!(extract(&p, &key), Err(KeyError::Invalid(m)) if m.contains("UTF-8")));
    let scope = vec![ScopePart::Header("authorization".into())];
    let auth = Raw(vec![("authorization".into(), b"Bearer \xe9".to_vec())]);
    assert!(
        matches!(scoped_id("r", &scope, Anonymous::Reject, "k", &auth), Err(KeyError::Invalid(m)) if m.contains("UTF-8"))
    );
}

#[test]
fn numeric_body_keys_are_exact() {
    let p = policy("from = \"body\"\nname = \"/transaction_id\"");
    let k = |body: &str| extract(&p, &Req::post("/cb").body(body));
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
    assert_eq!(truncated("订单订单订单订单订单"), "订单订单订单订单…");
}

#[test]
fn fingerprint_covers_configured_parts_only() {
    let p = policy("");
    let fp = |p: &KeyPolicy, r: &Req| fingerprint(p, r, "/o");
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
    assert_ne!(first, fingerprint(&p, &base, "/other"));

    let canon = policy("fingerprint_body = \"canonical-json\"");
    assert_eq!(fp(&canon, &base), fp(&canon, &other_body));
    assert_eq!(canonical_json(b"{ \"b\": [2, 1], \"a\": {\"d\":1,\"c\":2} }"), br#"{"a":{"c":2,"d":1},"b":[2,1]}"#);
    assert_eq!(canonical_json(b"not json"), b"not json");

    let off = policy("fingerprint = []");
    assert_eq!(fp(&off, &base), fp(&off, &other_query));

    let hdr = policy("fingerprint = [\"header:x-sig\"]");
    assert_ne!(fp(&hdr, &base.clone().header("x-sig", "1")), fp(&hdr, &base.clone().header("x-sig", "2")));
}
