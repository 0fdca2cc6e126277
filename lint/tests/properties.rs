//! Property tests: the section parser and the YAML/JSON front ends never panic, keep their
//! positions inside the input, and the YAML writer/reader round-trips any JSON value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]

use idem_lint::config::Config;
use idem_lint::node::{Entry, Node, Value};
use idem_lint::section::{find_section, Label};
use idem_lint::value::{duration_secs, parse_bool, parse_delivery, parse_duplicate, parse_key};
use proptest::prelude::*;

/// Markdown-ish lines built from the pieces the parser looks for, in any order.
fn md_line() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("#".to_string()),
        Just("### ".to_string()),
        Just("**".to_string()),
        Just("__".to_string()),
        Just("幂等性说明".to_string()),
        Just("Idempotency".to_string()),
        Just("- ".to_string()),
        Just("1. ".to_string()),
        Just("| ".to_string()),
        Just("是否幂等".to_string()),
        Just("幂等键".to_string()),
        Just("重复请求".to_string()),
        Just("有效期".to_string()),
        Just("Key".to_string()),
        Just("：".to_string()),
        Just(":".to_string()),
        Just("（".to_string()),
        Just("）".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just("header".to_string()),
        Just("body".to_string()),
        Just("409".to_string()),
        Just("DUPLICATE_REQUEST".to_string()),
        Just("`".to_string()),
        Just("是".to_string()),
        Just("否".to_string()),
        Just("𠮷".to_string()),
        Just("===".to_string()),
        Just("---".to_string()),
        Just(" ".to_string()),
        Just("\t".to_string()),
        Just("\r".to_string()),
        "[a-zA-Z0-9_/+-]{0,6}",
        "\\PC{0,3}",
    ];
    prop::collection::vec(piece, 0..10).prop_map(|v| v.concat())
}

fn markdown() -> impl Strategy<Value = String> {
    prop::collection::vec(md_line(), 0..14).prop_map(|v| v.join("\n"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn section_parser_never_panics_and_ranges_are_exact(desc in markdown()) {
        let aliases = vec!["幂等设计".to_string()];
        if let Some(sec) = find_section(&desc, &aliases) {
            prop_assert_eq!(desc.get(sec.title_range.clone()), Some(sec.title));
            for item in &sec.items {
                prop_assert_eq!(desc.get(item.range.clone()), Some(item.line));
                prop_assert!(item.line.contains(item.value));
                prop_assert_eq!(item.line.get(item.value_offset..item.value_offset + item.value.len()), Some(item.value));
                match item.label {
                    Label::Idempotent => { let _ = parse_bool(item.value); }
                    Label::Key => {
                        let k = parse_key(item.value);
                        for n in &k.names() { prop_assert!(!n.is_empty()); }
                    }
                    Label::Duplicate => {
                        let d = parse_duplicate(item.value);
                        if let Some(s) = d.status { prop_assert!((100..=599).contains(&s)); }
                    }
                    Label::Expiry => { let _ = duration_secs(item.value); }
                    Label::Delivery => { let _ = parse_delivery(item.value); }
                }
            }
        }
    }

    #[test]
    fn value_parsers_never_panic(s in "\\PC{0,40}") {
        let _ = parse_bool(&s);
        let _ = parse_delivery(&s);
        let _ = parse_key(&s);
        let _ = parse_duplicate(&s);
        let _ = duration_secs(&s);
        let _ = find_section(&s, &[]);
    }

    #[test]
    fn yaml_front_end_never_panics_on_arbitrary_text(s in "\\PC{0,200}") {
        match idem_lint::yaml::parse(&s) {
            Ok(n) => check_offsets(&n, &s)?,
            Err(e) => prop_assert!(e.offset <= s.len()),
        }
        // The whole pipeline: load + lint never panics either.
        let _ = idem_lint::lint::lint_text("p.yaml", &s, &Config::default());
    }

    #[test]
    fn yaml_front_end_never_panics_on_yaml_like_text(s in yamlish()) {
        match idem_lint::yaml::parse(&s) {
            Ok(n) => check_offsets(&n, &s)?,
            Err(e) => prop_assert!(e.offset <= s.len()),
        }
        let _ = idem_lint::lint::lint_text("p.yaml", &format!("openapi: 3.1.0\npaths:\n  /a:\n    post:\n{s}"), &Config::default());
    }

    #[test]
    fn arbitrary_bytes_in_a_file_are_a_finding_list_or_a_positioned_error(
        bytes in prop::collection::vec(any::<u8>(), 0..300),
        ext in prop::sample::select(vec!["yaml", "json"]),
    ) {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join(format!("prop-{}-{}.{ext}", std::process::id(), bytes.len()));
        std::fs::write(&path, &bytes).unwrap();
        let result = idem_lint::lint::lint_path(path.to_str().unwrap(), &Config::default());
        let _ = std::fs::remove_file(&path);
        if let Err(e) = result {
            prop_assert!(e.position.is_some(), "{e}");
            prop_assert!(!e.reason.contains('\n'));
        }
    }

    #[test]
    fn json_front_end_never_panics(s in "\\PC{0,200}") {
        match idem_lint::json::parse(&s) {
            Ok(n) => check_offsets(&n, &s)?,
            Err(e) => prop_assert!(e.offset <= s.len()),
        }
    }

    #[test]
    fn json_parser_agrees_with_serde_json_and_yaml_round_trips(v in json_value()) {
        let text = serde_json::to_string_pretty(&v).unwrap();
        let ours = idem_lint::json::parse(&text).unwrap();
        check_offsets(&ours, &text)?;
        prop_assert_eq!(to_serde(&ours), v.clone());
        let yaml = idem_lint::yaml::dump(&ours);
        let back = idem_lint::yaml::parse(&yaml).unwrap();
        check_offsets(&back, &yaml)?;
        prop_assert_eq!(to_serde(&back), v);
    }
}

fn yamlish() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("      ".to_string()),
        Just("  ".to_string()),
        Just("description: ".to_string()),
        Just("x-idempotency: ".to_string()),
        Just("key: ".to_string()),
        Just("duplicate: ".to_string()),
        Just("$ref: ".to_string()),
        Just("'#/a'".to_string()),
        Just("|\n".to_string()),
        Just("- ".to_string()),
        Just("{".to_string()),
        Just("}".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just(", ".to_string()),
        Just("&a ".to_string()),
        Just("*a".to_string()),
        Just("<<: ".to_string()),
        Just("\"".to_string()),
        Just("'".to_string()),
        Just("\n".to_string()),
        Just("幂等性说明".to_string()),
        Just("𠮷".to_string()),
        Just("409".to_string()),
        Just("true".to_string()),
        "[a-z]{1,5}",
    ];
    prop::collection::vec(piece, 0..40).prop_map(|v| v.concat())
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::Value::Number(n.into())),
        "\\PC{0,12}".prop_map(serde_json::Value::String),
        prop::sample::select(vec![
            "true", "null", "409", "1.5", "~", "- x", "a: b", "#c", "", " ", "\n", "'q'", "3.0.3", "0x1F", ".inf",
            "yes"
        ])
        .prop_map(|s| serde_json::Value::String(s.to_string())),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec(("\\PC{0,8}", inner), 0..6)
                .prop_map(|kv| { serde_json::Value::Object(kv.into_iter().collect()) }),
        ]
    })
}

fn to_serde(n: &Node) -> serde_json::Value {
    match &n.value {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => serde_json::Value::Bool(*b),
        Value::Number(s) => serde_json::from_str(s).unwrap(),
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Seq(v) => serde_json::Value::Array(v.iter().map(to_serde).collect()),
        Value::Map(m) => {
            serde_json::Value::Object(m.iter().map(|e: &Entry| (e.key.clone(), to_serde(&e.value))).collect())
        }
    }
}

fn check_offsets(n: &Node, text: &str) -> Result<(), TestCaseError> {
    prop_assert!(n.start <= n.end, "start {} > end {}", n.start, n.end);
    prop_assert!(n.end as usize <= text.len());
    prop_assert!(text.is_char_boundary(n.start as usize));
    match &n.value {
        Value::Seq(v) => {
            for c in v {
                check_offsets(c, text)?;
            }
        }
        Value::Map(m) => {
            for e in m {
                prop_assert!(text.is_char_boundary(e.key_start as usize));
                prop_assert!(e.key_start as usize <= text.len());
                check_offsets(&e.value, text)?;
            }
        }
        _ => {}
    }
    Ok(())
}
