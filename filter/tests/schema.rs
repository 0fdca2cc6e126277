#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! policies/bundle.schema.json is generated from the types the filter parses, never written by
//! hand: it must equal what `bundle_schema()` produces now.

#[test]
fn the_published_schema_is_the_generated_one() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../policies/bundle.schema.json");
    let committed = std::fs::read_to_string(&path).unwrap();
    let generated = serde_json::to_string_pretty(&idem_filter::policy::bundle_schema()).unwrap() + "\n";
    assert!(
        committed == generated,
        "{} is out of date; regenerate it with\n  cargo run -q -p idem-filter --features schema --example bundle-schema > policies/bundle.schema.json",
        path.display()
    );
}

#[test]
fn the_schema_describes_every_top_level_table_and_refuses_others() {
    let schema = serde_json::to_value(idem_filter::policy::bundle_schema()).unwrap();
    let props: Vec<&String> = schema["properties"].as_object().unwrap().keys().collect();
    assert_eq!(
        props,
        ["admin", "answers", "detached", "grpc", "metrics", "redis", "role", "route", "shared", "tokens", "unmatched"]
    );
    assert_eq!(schema["additionalProperties"], false, "unknown tables (and Higress' _rules_) are refused");
    let route = &schema["$defs"]["Route"];
    assert_eq!(route["additionalProperties"], false);
    assert_eq!(route["required"], serde_json::json!(["name"]));
}

#[test]
fn the_filter_refuses_the_bundles_the_schema_must_refuse() {
    // The same file drives tests/e2e/test_schema.py, which checks the schema refuses each one.
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/refused-bundles.json");
    let cases: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut checked = 0;
    for (case, bundle) in cases.iter().filter(|(k, _)| !k.starts_with('_')) {
        let text = bundle.to_string();
        assert!(idem_filter::policy::parse_bundle(&text, "case").is_err(), "the filter accepts {case}: {text}");
        checked += 1;
    }
    assert_eq!(checked, 11);
    let good = r#"{"route":[{"name":"a","match":{"method":"POST","path":"/a"}}]}"#;
    assert!(idem_filter::policy::parse_bundle(good, "good").is_ok());
}
