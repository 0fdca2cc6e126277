#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Key extraction, validation and caller scoping.

mod common;
use common::Req;
use idem_filter::fingerprint::{canonical_json, fingerprint};
use idem_filter::key::*;
use idem_filter::policy::{parse_bundle, KeyPolicy, ScopePart};

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

#[test]
fn scope_separates_callers_and_routes() {
    let scope = vec![ScopePart::Header("authorization".into())];
    let alice = Req::post("/").header("authorization", "Bearer alice");
    let bob = Req::post("/").header("authorization", "Bearer bob");
    let a1 = scoped_id("r", &scope, "k", &alice);
    assert_eq!(a1, scoped_id("r", &scope, "k", &alice.clone()));
    assert_ne!(a1, scoped_id("r", &scope, "k", &bob));
    assert_ne!(a1, scoped_id("other", &scope, "k", &alice));
    assert_ne!(a1, scoped_id("r", &scope, "k2", &alice));
    // Global keys (scope = []) are the same for every caller.
    assert_eq!(scoped_id("r", &[], "k", &alice), scoped_id("r", &[], "k", &bob));
    // Length-prefixing: moving bytes between route and key changes the id.
    assert_ne!(scoped_id("ab", &[], "c", &alice), scoped_id("a", &[], "bc", &alice));
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
    let base = Req::post("/o?a=1").key("k").body(r#"{"b":1,"a":2}"#);
    let fp = fingerprint(&p, &base);
    assert_eq!(fp, fingerprint(&p, &base.clone().header("x-other", "1")));
    let mut other_body = base.clone();
    other_body.body = Some(br#"{"a":2,"b":1}"#.to_vec());
    assert_ne!(fp, fingerprint(&p, &other_body), "raw body: key order matters");
    let mut other_query = base.clone();
    other_query.path = "/o?a=2".into();
    assert_ne!(fp, fingerprint(&p, &other_query));

    let canon = policy("fingerprint_body = \"canonical-json\"");
    assert_eq!(fingerprint(&canon, &base), fingerprint(&canon, &other_body));
    assert_eq!(canonical_json(b"{ \"b\": [2, 1], \"a\": {\"d\":1,\"c\":2} }"), br#"{"a":{"c":2,"d":1},"b":[2,1]}"#);
    assert_eq!(canonical_json(b"not json"), b"not json");

    let off = policy("fingerprint = []");
    assert_eq!(fingerprint(&off, &base), fingerprint(&off, &other_query));

    let hdr = policy("fingerprint = [\"header:x-sig\"]");
    assert_ne!(
        fingerprint(&hdr, &base.clone().header("x-sig", "1")),
        fingerprint(&hdr, &base.clone().header("x-sig", "2"))
    );
}
