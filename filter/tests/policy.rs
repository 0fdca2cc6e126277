#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The policy contract of policies/README.md: parsing, defaults, every error with its position.

use idem_filter::policy::*;

fn err(src: &str) -> PolicyError {
    parse_bundle(src, "p.toml").expect_err("policy should be rejected")
}

const FULL: &str = r#"
[shared]
buckets = 16
entries_per_bucket = 4
max_response_bytes = 4096

[[route]]
name = "create-order"
match = { method = "POST", path = "/api/order/create" }
mode = "key"
store = "shared"
max_body_bytes = 1024
max_response_bytes = 2048

[route.key]
from = "header"
name = "Idempotency-Key"
required = true
scope = ["header:Authorization", "header:x-tenant"]
fingerprint = ["method", "path", "body", "header:x-sig"]
fingerprint_body = "canonical-json"
lock_ttl = "250ms"
ttl = "7d"
on_in_flight = "reject"
on_completed = "reject"
remember = ["2xx", 404]
forget = [409]

[route.duplicate]
status = 200
code = "DUPLICATE"
message = "请勿重复提交"
"#;

#[test]
fn full_policy_parses_with_every_field() {
    let b = parse_bundle(FULL, "p.toml").unwrap();
    assert_eq!(
        b.shared,
        SharedConfig { buckets: 16, entries_per_bucket: 4, max_response_bytes: 4096, namespace: None }
    );
    let r = &b.routes[0];
    assert_eq!(r.name, "create-order");
    assert_eq!(
        r.matcher,
        Matcher::Request { method: Some("POST".into()), path: PathTemplate::parse("/api/order/create").unwrap() }
    );
    assert_eq!((r.max_body_bytes, r.max_response_bytes), (1024, 2048));
    assert_eq!(r.key.scope, vec![Source::Header("Authorization".into()), Source::Header("x-tenant".into())]);
    assert_eq!(r.key.fingerprint_body, FingerprintBody::CanonicalJson);
    assert_eq!(r.key.lock_ttl.millis, 250);
    assert_eq!(r.key.ttl.millis, 7 * 86_400_000);
    assert_eq!(r.key.on_completed, OnCompleted::Reject);
    assert!(r.key.remembers(201) && r.key.remembers(404));
    assert!(!r.key.remembers(409) && !r.key.remembers(500) && !r.key.remembers(400));
    assert_eq!(r.duplicate.status, 200);
    assert_eq!(r.duplicate.message, "请勿重复提交");
}

#[test]
fn defaults_follow_the_design() {
    let b = parse_bundle("[[route]]\nname = \"a\"\n", "p.toml").unwrap();
    let r = &b.routes[0];
    assert_eq!(r.matcher, Matcher::RouteName("a".into()));
    assert_eq!(r.mode, Mode::Key);
    assert_eq!(r.key.sources, vec![Source::Header("Idempotency-Key".into())]);
    assert!(r.key.required);
    assert_eq!(r.key.scope, vec![Source::Header("authorization".into())]);
    assert_eq!(r.key.lock_ttl.millis, 30_000);
    assert_eq!(r.key.ttl.millis, 86_400_000);
    assert_eq!((r.duplicate.status, r.duplicate.code.as_str()), (409, "DUPLICATE_REQUEST"));
    // 2xx-4xx are remembered except 408/409/425/429; 5xx never.
    for s in [200, 201, 302, 400, 404, 422] {
        assert!(r.key.remembers(s), "{s}");
    }
    for s in [408, 409, 425, 429, 500, 503] {
        assert!(!r.key.remembers(s), "{s}");
    }
    assert_eq!(b.shared, SharedConfig::default());
    assert!(r.needs_body());
}

#[test]
fn json_and_toml_give_the_same_bundle() {
    let json = r#"{"shared":{"buckets":16,"entries_per_bucket":4,"max_response_bytes":4096},
      "route":[{"name":"create-order","match":{"method":"POST","path":"/api/order/create"},
        "mode":"key","store":"shared","max_body_bytes":1024,"max_response_bytes":2048,
        "key":{"from":"header","name":"Idempotency-Key","required":true,
          "scope":["header:Authorization","header:x-tenant"],
          "fingerprint":["method","path","body","header:x-sig"],"fingerprint_body":"canonical-json",
          "lock_ttl":"250ms","ttl":"7d","on_in_flight":"reject","on_completed":"reject",
          "remember":["2xx",404],"forget":[409]},
        "duplicate":{"status":200,"code":"DUPLICATE","message":"请勿重复提交"}}]}"#;
    assert_eq!(parse_bundle(json, "p.json").unwrap(), parse_bundle(FULL, "p.toml").unwrap());
}

#[test]
fn unknown_field_names_file_line_column_and_field() {
    let e = err("[[route]]\nname = \"a\"\n\n[route.key]\nlock_tll = \"30s\"\n");
    assert_eq!((e.origin.as_str(), e.line, e.column), ("p.toml", Some(5), Some(1)));
    assert!(e.message.contains("unknown field `lock_tll`"), "{e}");
    assert!(e.to_string().starts_with("p.toml:5:1: unknown field `lock_tll`"), "{e}");
}

#[test]
fn value_errors_name_their_field_in_inline_tables_and_json() {
    let e = err("[[route]]\nname = \"a\"\nmatch = { method = \"post\", path = \"/x\" }\nmode = \"tokn\"\n");
    assert!(e.message.starts_with("`match`: invalid method"), "{e}");
    let e = err("[[route]]\nname = \"a\"\nmode = \"tokn\"\n");
    assert!(e.message.starts_with("`mode`: unknown variant `tokn`"), "{e}");
    let e =
        parse_bundle("{\"route\": [{\"name\": \"a\", \"key\": {\"ttl\": \"1 fortnight\"}}]}", "b.json").unwrap_err();
    assert!(e.message.starts_with("`ttl`: invalid duration"), "{e}");
}

#[test]
fn unknown_field_in_json_has_line_and_column() {
    let e = parse_bundle("{\n  \"route\": [\n    {\"name\": \"a\", \"modee\": \"key\"}\n  ]\n}", "b.json").unwrap_err();
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("unknown field `modee`"), "{e}");
}

#[test]
fn bad_duration_is_rejected_where_it_is() {
    let e = err("[[route]]\nname = \"a\"\n[route.key]\nlock_ttl = \"30 parsecs\"\n");
    assert_eq!(e.line, Some(4));
    assert!(e.message.contains("invalid duration \"30 parsecs\""), "{e}");
    assert!(e.message.starts_with("`lock_ttl`: "), "the field is named: {e}");
    for bad in ["30", "s", "-1s", "1.5s", "99999999999999999999d"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
    assert_eq!(parse_duration("10m").unwrap().millis, 600_000);
}

#[test]
fn bad_statuses_are_rejected() {
    let e = err("[[route]]\nname = \"a\"\n[route.duplicate]\nstatus = 503\n");
    assert_eq!(e.line, Some(4));
    assert!(e.message.starts_with("`status`: "), "{e}");
    assert!(e.message.contains("never a 5xx"), "{e}");
    let e = err("[[route]]\nname = \"a\"\n[route.key]\nremember = [\"6xx\"]\n");
    assert!(e.message.contains("invalid status \"6xx\""), "{e}");
    let e = err("[[route]]\nname = \"a\"\n[route.key]\nforget = [99]\n");
    assert!(e.message.contains("invalid status 99"), "{e}");
}

#[test]
fn duplicate_route_name_points_at_the_second_route() {
    let e = err("[[route]]\nname = \"a\"\n\n[[route]]\nname = \"a\"\n");
    assert_eq!((e.line, e.column), (Some(4), Some(1)));
    assert!(e.message.contains("duplicate route name"), "{e}");
}

#[test]
fn conflicting_matchers_are_rejected() {
    let e = err("[[route]]\nname = \"a\"\nmatch = { route = \"r\", path = \"/x\" }\n");
    assert_eq!(e.line, Some(3));
    assert!(e.message.contains("conflicting matchers"), "{e}");
    let two = "[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/o/{id}\" }\n\
               [[route]]\nname = \"b\"\nmatch = { path = \"/o/{order}\" }\n";
    let e = err(two);
    assert_eq!(e.line, Some(4));
    assert!(e.message.contains("same requests as route \"a\""), "{e}");
    // Different methods on the same path do not conflict.
    let ok = "[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/o\" }\n\
              [[route]]\nname = \"b\"\nmatch = { method = \"PUT\", path = \"/o\" }\n";
    assert_eq!(parse_bundle(ok, "p").unwrap().routes.len(), 2);
}

#[test]
fn key_sources_resolve_to_parts() {
    let b = parse_bundle(
        "[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/m/{mchid}/pay\" }\n[route.key]\n\
         parts = [\"path:mchid\", \"body:/out_trade_no\"]\nscope = [\"form:app_id\"]\n\
         fingerprint = [\"body:/data\", \"header:X-Sig\"]\n\
         [[route]]\nname = \"b\"\n[route.key]\nfrom = \"xml\"\nname = \"/xml/transaction_id\"\n",
        "p",
    )
    .unwrap();
    let a = &b.routes[0].key;
    assert_eq!(a.sources, vec![Source::Path("mchid".into()), Source::Body("/out_trade_no".into())]);
    assert_eq!(a.scope, vec![Source::Form("app_id".into())]);
    assert_eq!(
        a.fingerprint,
        vec![FingerprintPart::Value(Source::Body("/data".into())), FingerprintPart::Header("x-sig".into())]
    );
    assert!(b.routes[0].needs_body());
    assert_eq!(b.routes[1].key.sources, vec![Source::Xml(vec!["xml".into(), "transaction_id".into()])]);
    assert_eq!(Source::Xml(vec!["xml".into(), "id".into()]).to_string(), "xml:/xml/id");
}

#[test]
fn other_field_errors_are_precise() {
    let cases = [
        ("[[route]]\nname = \"Create Order\"\n", "invalid route name"),
        ("[[route]]\nname = \"a\"\nmode = \"tokn\"\n", "unknown variant `tokn`"),
        ("[[route]]\nname = \"a\"\nstore = \"redis\"\n", "needs a top-level [redis] table"),
        ("[redis]\ntimeout = \"1s\"\n", "[redis] needs `cluster`"),
        ("[redis]\ndirect = \"localhost\"\n", "\"localhost\" is not host:port"),
        ("[redis]\ndirect = \"127.0.0.1:0\"\n", "is not host:port"),
        ("[redis]\ndirect = \"127.0.0.1:6379\"\npassword_env = \"\"\n", "must not be empty"),
        ("[redis]\ndirect = \"redis://h:6379\"\n", "is not host:port"),
        ("[redis]\ndirect = \" :6379\"\n", "is not host:port"),
        ("[redis]\ndirect = \"10.0.0.1:7000,10.0.0.2\"\n", "\"10.0.0.2\" is not host:port"),
        ("[redis]\ndirect = \"10.0.0.1:7000,\"\n", "\"\" is not host:port"),
        ("[redis]\ndirect = \"127.0.0.1:6379\"\nuser = \"idem\"\n", "`user` needs `password_env` or `password_file`"),
        ("[redis]\ndirect = \"127.0.0.1:6379\"\npassword_file = \"\"\n", "must not be empty"),
        ("[redis]\ncluster = \"webdis\"\ntls = true\n", "are for `direct`"),
        ("[redis]\ndirect = \"127.0.0.1:6379\"\ntls_ca_file = \"/ca.pem\"\n", "`tls_ca_file` needs `tls = true`"),
        ("[redis]\ndirect = \"127.0.0.1:6379\"\ntls = \"yes\"\n", "invalid type"),
        (
            "[redis]\ndirect = \"127.0.0.1:6379\"\npassword_env = \"P\"\npassword_file = \"/run/p\"\n",
            "`password_env` or `password_file`, not both",
        ),
        ("[redis]\ncluster = \"webdis\"\non_store_error = \"ignore\"\n", "unknown variant `ignore`"),
        ("[[route]]\nname = \"a\"\nmode = \"token\"\n[route.key]\nname = \"X\"\n", "takes [route.token]"),
        ("[[route]]\nname = \"a\"\n[route.token]\nttl = \"1m\"\n", "needs mode = \"token\""),
        ("[[route]]\nname = \"a\"\nmode = \"token\"\n[route.token]\nissue_path = \"token\"\n", "must be a path"),
        ("[[route]]\nname = \"a\"\nmode = \"token\"\n[route.token]\nheadr = \"X\"\n", "unknown field `headr`"),
        ("[[route]]\nname = \"a\"\n[route.key]\non_in_flight = \"queue\"\n", "unknown variant `queue`"),
        ("[[route]]\nname = \"a\"\nmatch = { method = \"post\", path = \"/x\" }\n", "invalid method"),
        ("[[route]]\nname = \"a\"\nmatch = { path = \"x\" }\n", "must start with '/'"),
        ("[[route]]\nname = \"a\"\nmatch = { path = \"/o/x{id}\" }\n", "whole segment"),
        ("[[route]]\nname = \"a\"\n[route.key]\nfrom = \"body\"\nname = \"tx\"\n", "JSON pointer"),
        ("[[route]]\nname = \"a\"\n[route.key]\nscope = [\"cookie:\"]\n", "invalid source \"cookie:\""),
        ("[[route]]\nname = \"a\"\n[route.key]\nscope = [\"metadata:jwt\"]\n", "metadata:<filter>/<field>"),
        ("[[route]]\nname = \"a\"\n[route.key]\nanonymous = \"everyone\"\n", "unknown variant `everyone`"),
        ("[[route]]\nname = \"a\"\nforward = \"detachd\"\n", "unknown variant `detachd`"),
        ("[[route]]\nname = \"a\"\n[route.key]\nunknown_outcome_hold = \"0s\"\n", "must be positive"),
        ("unmatched = \"deny\"\n", "unknown variant `deny`"),
        ("[[route]]\nname = \"a\"\nmode = \"token\"\nforward = \"detached\"\n", "applies to key routes"),
        ("[tokens]\nsecret = \"short\"\n", "`secret` has 5 characters; at least 32"),
        (
            "[redis]\ncluster = \"webdis\"\n[[route]]\nname = \"a\"\nmode = \"token\"\nstore = \"redis\"\n",
            "needs a top-level [tokens] `secret`",
        ),
        ("[[route]]\nname = \"a\"\n[route.key]\nfingerprint = [\"bdy\"]\n", "invalid fingerprint part"),
        ("[shared]\nbuckets = 0\n", "buckets must be between 1 and 65536"),
        ("[shared]\nmax_response_bytes = 10\n[[route]]\nname = \"a\"\nmax_response_bytes = 20\n", "exceeds [shared]"),
        ("[[route]]\nname = \"a\"\n[route.key]\nttl = \"0s\"\n", "must be positive"),
        ("[[route]\nname = \"a\"\n", "unclosed array table"),
        // Key sources: forms, XML, path parameters, composite keys.
        ("[[route]]\nname = \"a\"\n[route.key]\nfrom = \"xml\"\nname = \"xml/id\"\n", "element path from the root"),
        ("[[route]]\nname = \"a\"\n[route.key]\nfrom = \"xml\"\nname = \"/xml/a b\"\n", "not an element name"),
        ("[[route]]\nname = \"a\"\n[route.key]\nfrom = \"path\"\nname = \"id\"\n", "has no match.path"),
        (
            "[[route]]\nname = \"a\"\nmatch = { path = \"/o/{order_id}/pay\" }\n[route.key]\nfrom = \"path\"\nname = \"id\"\n",
            "match.path \"/o/{order_id}/pay\" has no {id}",
        ),
        ("[[route]]\nname = \"a\"\n[route.key]\nparts = [\"form:a\"]\nfrom = \"form\"\n", "drop key.from and key.name"),
        ("[[route]]\nname = \"a\"\n[route.key]\nparts = [\"form:a\", \"form:a\"]\n", "names form:a twice"),
        ("[[route]]\nname = \"a\"\n[route.key]\nparts = [\"form\"]\n", "no `kind:`"),
        // Headers Envoy, a tracer or a proxy writes are never keys: a retry would carry a new value.
        ("[[route]]\nname = \"a\"\n[route.key]\nname = \"X-Request-Id\"\n", "generated by Envoy for every request"),
        ("[[route]]\nname = \"a\"\n[route.key]\nname = \"traceparent\"\n", "is a tracing header"),
        ("[[route]]\nname = \"a\"\n[route.key]\nname = \"x-b3-traceid\"\n", "is a tracing header"),
        ("[[route]]\nname = \"a\"\n[route.key]\nname = \"X-Envoy-Attempt-Count\"\n", "set or removed by Envoy"),
        ("[[route]]\nname = \"a\"\n[route.key]\nname = \":authority\"\n", "pseudo-header"),
        ("[[route]]\nname = \"a\"\n[route.key]\nparts = [\"header:x-request-id\", \"body:/id\"]\n", "key.parts: header"),
        ("[[route]]\nname = \"a\"\n[route.key]\nparts = [\"body:id\"]\n", "JSON pointer"),
        ("[[route]]\nname = \"a\"\n[route.key]\nscope = [\"path:merchant\"]\n", "path:merchant names a parameter"),
        ("[[route]]\nname = \"a\"\n[route.key]\nfingerprint = [\"cookie:x\"]\n", "invalid fingerprint part"),
        ("[[route]]\nname = \"a\"\nmatch = { path = \"/o/{id}/{id}\" }\n", "appears twice"),
        // Answers in the API's own shape.
        ("[answers]\ntemplate = '{\"code\":\"{{kode}}\"}'\n", "unknown placeholder `{{kode}}`"),
        ("[answers]\ntemplate = '{\"code\":{{message}}}'\n", "not JSON once its placeholders are filled in"),
        ("[answers]\nformat = \"xml\"\n", "unknown format \"xml\""),
        ("[answers]\nformat = \"template\"\n", "needs `template`"),
        ("[answers]\nheaders = { \"Bad Name\" = \"x\" }\n", "not a header name"),
        ("[answers]\ncolour = \"red\"\n", "unknown field `colour`"),
        ("[[route]]\nname = \"a\"\n[route.answers]\ntemplate = \"{{code\"\n", "unclosed placeholder"),
        (
            "[[route]]\nname = \"a\"\n[route.duplicate]\nstatus = 200\nbody = '{\"code\":SUCCESS}'\ncontent_type = \"application/json\"\n",
            "[route.duplicate] `body` is not JSON",
        ),
        ("[[route]]\nname = \"a\"\n[route.duplicate]\nbody = \"{{nope}}\"\n", "unknown placeholder `{{nope}}`"),
    ];
    for (src, want) in cases {
        let e = err(src);
        assert!(e.message.contains(want), "{src:?}: got {e}, want {want:?}");
        assert!(e.line.is_some(), "{src:?}: no line in {e}");
    }
}

#[test]
fn find_prefers_route_name_then_exact_path_then_template() {
    let src = "[[route]]\nname = \"tpl\"\nmatch = { method = \"POST\", path = \"/orders/{id}/pay\" }\n\
               [[route]]\nname = \"exact\"\nmatch = { method = \"POST\", path = \"/orders/42/pay\" }\n\
               [[route]]\nname = \"named\"\n";
    let b = parse_bundle(src, "p").unwrap();
    let name = |i: Option<RouteId>| i.map(|i| b.route(i).name.as_str());
    assert_eq!(name(b.find(|| "POST".into(), "/orders/7/pay?x=1", || None)), Some("tpl"));
    assert_eq!(name(b.find(|| "POST".into(), "/orders/42/pay", || None)), Some("exact"));
    assert_eq!(name(b.find(|| "POST".into(), "/orders/42/pay", || Some("named".into()))), Some("named"));
    assert_eq!(name(b.find(|| "GET".into(), "/orders/7/pay", || None)), None);
    // HTTP/2 lets a client send `:method: post`; frameworks run the POST handler for it.
    assert_eq!(name(b.find(|| "post".into(), "/orders/7/pay", || None)), Some("tpl"));
    assert_eq!(name(b.find(|| "POST".into(), "/orders//pay", || None)), None);
    assert_eq!(name(b.find(|| "POST".into(), "/orders/7/pay/x", || None)), None);
    assert_eq!(name(b.find(|| "POST".into(), "/other", || Some("unknown".into()))), None);
}

#[test]
fn method_is_not_asked_for_when_no_path_matches() {
    let b = parse_bundle("[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/a\" }\n", "p").unwrap();
    assert_eq!(b.find(|| panic!("method must not be read"), "/b", || None), None);
    assert_eq!(b.find(|| "POST".into(), "/a", || None), b.route_ids().next());
}

#[test]
fn route_name_is_not_asked_for_when_no_policy_uses_it() {
    let b = parse_bundle("[[route]]\nname = \"a\"\nmatch = { path = \"/a\" }\n", "p").unwrap();
    assert_eq!(b.find(|| "POST".into(), "/a", || panic!("route name must not be read")), b.route_ids().next());
}

/// The policy files of `policies/`: (path, text).
fn shipped_policies() -> Vec<(std::path::PathBuf, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_shipped_policy_parses() {
    let files = shipped_policies();
    for (path, text) in &files {
        parse_bundle(text, &path.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
    }
    assert!(!files.is_empty(), "no policy files found in policies/");
}

#[test]
fn json_route_errors_point_at_the_route_name_not_a_nested_name() {
    // `key.name` comes before the route's own `name`: the error must point at the second route's
    // `"name"` member, not at the first `"name"` text in the document.
    let src = "{\"route\": [\n  {\"key\": {\"name\": \"X-Key\"}, \"name\": \"a\"},\n  {\"key\": {\"name\": \"Y\"},\n   \"name\": \"a\"}\n]}";
    let e = err(src);
    assert!(e.message.contains("duplicate route name"), "{e}");
    assert_eq!((e.line, e.column), (Some(4), Some(4)), "{e}");
}

#[test]
fn new_scope_parts_parse() {
    let src = "[[route]]\nname = \"a\"\n[route.key]\nscope = [\"cookie:session\", \"metadata:envoy.filters.http.jwt_authn/jwt_payload/sub\", \"header:X-Tenant\"]\nanonymous = \"shared\"\n";
    let b = parse_bundle(src, "p").unwrap();
    let scope: Vec<String> = b.routes[0].key.scope.iter().map(|p| p.to_string()).collect();
    assert_eq!(scope, ["cookie:session", "metadata:envoy.filters.http.jwt_authn/jwt_payload/sub", "header:x-tenant"]);
}

#[test]
fn path_aliases_match_the_policy() {
    let b = parse_bundle("[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/api/order/create\" }\n", "p")
        .unwrap();
    for alias in [
        "/api/order/create",
        "/api/order/create/",
        "/api/order/Create",
        "/api//order/create",
        "/api/order/%63reate",
        "/api/x/../order/./create",
    ] {
        assert_eq!(b.find(|| "POST".into(), alias, || None), b.route_ids().next(), "{alias}");
    }
    assert_eq!(b.find(|| "POST".into(), "/api/order/create2", || None), None);
    assert_eq!(b.find(|| "POST".into(), "/api/order/create%2F", || None), None);
}

/// JSON with a space after every `:` and `,` between values (as protojson may write it), and
/// string contents untouched.
fn protojson_spacing(value: &serde_json::Value) -> String {
    struct Spaced;
    impl serde_json::ser::Formatter for Spaced {
        fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
        fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Spaced);
    serde::Serialize::serialize(value, &mut ser).unwrap();
    String::from_utf8(out).unwrap()
}

/// The JSON Istio hands the plugin: its WasmPlugin `pluginConfig` (YAML) becomes a protobuf
/// Struct, serialised by protojson (numbers are doubles written without a fraction, and
/// protojson may put a space after `:` and `,`). Each policy of `policies/` in that shape gives
/// the same bundle as its TOML.
#[test]
fn every_shipped_policy_in_istio_s_json_shape_is_the_same_bundle() {
    let files = shipped_policies();
    for (path, text) in &files {
        let value: serde_json::Value = toml::from_str(text).unwrap();
        let json = protojson_spacing(&value);
        let from_json =
            parse_bundle(&json, "pluginConfig").unwrap_or_else(|e| panic!("{}: {e}\n{json}", path.display()));
        assert_eq!(from_json, parse_bundle(text, "p.toml").unwrap(), "{}", path.display());
    }
    assert!(files.len() >= 4, "expected the shipped policies in policies/");
}

#[test]
fn higress_rules_are_refused_with_what_to_write_instead() {
    let json = "{\n  \"route\": [{\"name\": \"a\"}],\n  \"_rules_\": [{\"_match_route_\": [\"r1\"], \"route\": []}]\n}";
    let e = parse_bundle(json, "pluginConfig").unwrap_err();
    assert_eq!((e.line, e.column), (Some(3), Some(4)), "{e}");
    let text = e.to_string();
    assert!(text.contains("`_rules_` (Higress matchRules) is not supported"), "{text}");
    assert!(text.contains("defaultConfig") && text.contains("without `match`"), "{text}");
}

#[test]
fn a_shared_namespace_is_checked_and_kept() {
    let b = parse_bundle("[shared]\nnamespace = \"istio-system.idem_2\"\n", "p.toml").unwrap();
    assert_eq!(b.shared.namespace.as_deref(), Some("istio-system.idem_2"));
    assert_eq!(parse_bundle("", "p.toml").unwrap().shared.namespace, None, "filled in from plugin_name at load");
    for bad in ["", "a:b", "a/b", "ä"] {
        let e = err(&format!("[shared]\nnamespace = {bad:?}\n"));
        assert!(e.to_string().contains("invalid namespace"), "{bad:?}: {e}");
        assert_eq!(e.line, Some(2), "{e}");
    }
}

#[test]
fn a_generated_header_key_is_refused_at_load_with_the_reason_and_the_way_out() {
    let text = "[[route]]\nname = \"pay\"\nmatch = { method = \"POST\", path = \"/pay\" }\n[route.key]\nname = \"X-Request-Id\"\n";
    let e = parse_bundle(text, "policies/pay.toml").unwrap_err();
    assert_eq!(
        e.to_string(),
        "policies/pay.toml:1:1: route \"pay\": key.name: header \"X-Request-Id\" cannot be an idempotency key: it is \
         generated by Envoy for every request that lacks one, so it does not identify one intended action; key on a \
         value the client sends again on every retry (Idempotency-Key)"
    );
    // As a scope or a fingerprint part it is not a key, and stays allowed where it makes sense.
    let ok = "[[route]]\nname = \"pay\"\n[route.key]\nfingerprint = [\"header:x-forwarded-proto\"]\n";
    assert!(parse_bundle(ok, "ok.toml").is_ok());
}

/// `role = "admin"`: the operator's listener, with a long bearer secret and no routes; `[admin]`
/// anywhere else is refused, each with the line of what is wrong.
#[test]
fn an_admin_bundle_needs_a_long_secret_and_nothing_else() {
    let secret = "k".repeat(32);
    let ok = parse_bundle(&format!("role = \"admin\"\n\n[admin]\nsecret = \"{secret}\"\n"), "admin.toml").unwrap();
    assert_eq!((ok.role, ok.admin.map(|a| a.secret)), (Role::Admin, Some(secret.clone())));

    let e = err("role = \"admin\"\n");
    assert!(e.message.contains("needs an [admin] table with a `secret`"), "{e}");
    let e = err("role = \"admin\"\n\n[admin]\nsecret = \"short\"\n");
    assert!(e.message.contains("`secret` has 5 characters; at least 32") && e.line == Some(4), "{e}");
    let e = err(&format!("role = \"admin\"\n\n[admin]\nsecret = \"{} x\"\n", "k".repeat(32)));
    assert!(e.message.contains("printable ASCII without spaces"), "{e}");
    let e = err(&format!(
        "role = \"admin\"\n\n[admin]\nsecret = \"{secret}\"\n\n[[route]]\nname = \"r\"\nmatch = {{ path = \"/r\" }}\n"
    ));
    assert!(e.message.contains("takes no [[route]]") && e.line == Some(1), "{e}");
    let e = err(&format!("[admin]\nsecret = \"{secret}\"\n"));
    assert!(e.message.contains("a bundle of its own with role = \"admin\"") && e.line == Some(1), "{e}");
    let e = err(&format!("role = \"admin\"\n\n[admin]\nsecret = \"{secret}\"\ntoken = 1\n"));
    assert!(e.message.contains("unknown field `token`"), "{e}");
}

/// A bundle with several mistakes gets them all at once, in the order of the source: the
/// top-level `[tokens]` secret after the routes comes last; a good route between two bad ones
/// is not reported; each bad route once.
#[test]
fn every_error_of_a_bundle_is_reported_in_source_order() {
    let src = "[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/a\" }\nupstream_timeout = \"0s\"\n\n\
               [[route]]\nname = \"fine\"\nmatch = { method = \"POST\", path = \"/fine\" }\n\n\
               [[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/other\" }\n\n\
               [tokens]\nsecret = \"short\"\n";
    let errors = parse_bundle_all(src, "p.toml").unwrap_err();
    let said: Vec<(Option<usize>, &str)> = errors.iter().map(|e| (e.line, e.message.as_str())).collect();
    assert_eq!(said.len(), 3, "{said:?}");
    assert_eq!(said[0].0, Some(1));
    assert!(said[0].1.contains("upstream_timeout must be positive"), "{said:?}");
    // The duplicate name is checked against the first "a", which failed its own check: still a
    // duplicate (names are compared with every route before it, reported or not).
    assert_eq!(said[1].0, Some(10));
    assert!(said[1].1.contains("duplicate route name"), "{said:?}");
    assert_eq!(said[2].0, Some(15));
    assert!(said[2].1.contains("[tokens] `secret` has 5 characters"), "{said:?}");
    // parse_bundle gives the first.
    assert_eq!(parse_bundle(src, "p.toml").unwrap_err(), errors[0]);
}
