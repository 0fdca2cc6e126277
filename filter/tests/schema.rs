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
    assert_eq!(props, ["redis", "route", "shared", "unmatched"]);
    assert_eq!(schema["additionalProperties"], false, "unknown tables (and Higress' _rules_) are refused");
    let route = &schema["$defs"]["Route"];
    assert_eq!(route["additionalProperties"], false);
    assert_eq!(route["required"], serde_json::json!(["name"]));
}
