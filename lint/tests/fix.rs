//! `idem-lint --fix`: the duplicate status a statement names is added to `responses`, in the
//! file's own style, everything else byte for byte; `--fix --diff` shows it and writes nothing;
//! a second run has nothing left to fix.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-lint")).args(args).current_dir(dir).output().unwrap()
}

fn temp(name: &str, file: &str, text: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("idem-lint-fix-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Fixes `text` (as `file`), checks the result lints clean, a second `--fix` changes nothing,
/// and returns the fixed text.
fn fixed(name: &str, file: &str, text: &str) -> String {
    let (dir, path) = temp(name, file, text);
    let before = run(&dir, &["--color", "never", file]);
    assert_eq!(before.status.code(), Some(1), "{}", stdout(&before));
    assert!(stdout(&before).contains("error[IDEM006]"), "{}", stdout(&before));
    // --diff shows the change and writes nothing.
    let diff = run(&dir, &["--fix", "--diff", file]);
    assert_eq!(diff.status.code(), Some(1), "something to fix");
    assert!(stdout(&diff).contains(&format!("+++ b/{file}")), "{}", stdout(&diff));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "--diff wrote the file");
    let o = run(&dir, &["--fix", "--color", "never", file]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    let after = std::fs::read_to_string(&path).unwrap();
    let again = run(&dir, &["--fix", "--diff", file]);
    assert_eq!((again.status.code(), stdout(&again)), (Some(0), String::new()), "nothing left to fix");
    let _ = std::fs::remove_dir_all(&dir);
    after
}

const STATEMENT: &str =
    "### 幂等性说明\\n- 是否幂等：是\\n- 幂等键：Idempotency-Key（header）\\n- 重复请求：409 DUPLICATE_REQUEST\\n";

#[test]
fn yaml_block_map_with_comments_and_anchors() {
    let text = format!(
        "# the shop\nopenapi: 3.0.3\ninfo: {{ title: t, version: \"1\" }}\nx-key: &key\n  name: Idempotency-Key\n  in: header\n  schema: {{ type: string }}\npaths:\n  /orders:\n    post:\n      description: \"{STATEMENT}\"\n      parameters:\n        - *key\n      responses:\n        '201': # created\n          description: created   # the order\n        # more answers later\n\n  /health:\n    get:\n      responses: {{ '200': {{ description: ok }} }}\n"
    );
    let after = fixed("block", "openapi.yaml", &text);
    let want = text.replace(
        "        # more answers later\n",
        "        # more answers later\n        '409': { description: \"DUPLICATE_REQUEST：重复请求（该请求已处理过）\" }\n",
    );
    assert_eq!(after, want);
}

#[test]
fn yaml_flow_map() {
    let text = format!(
        "openapi: 3.0.3\ninfo: {{ title: t, version: \"1\" }}\npaths:\n  /orders:\n    post:\n      description: \"{STATEMENT}\"\n      parameters: [{{ name: Idempotency-Key, in: header, schema: {{ type: string }} }}]\n      responses: {{ '201': {{ description: created }} }}\n"
    );
    let after = fixed("flow", "openapi.yaml", &text);
    assert!(after.contains(
        "responses: { '201': { description: created }, '409': { description: \"DUPLICATE_REQUEST：重复请求（该请求已处理过）\" } }"
    ), "{after}");
}

#[test]
fn minified_and_pretty_json() {
    let statement = STATEMENT;
    let min = format!(
        r#"{{"openapi":"3.0.3","info":{{"title":"t","version":"1"}},"paths":{{"/orders":{{"post":{{"description":"{statement}","parameters":[{{"name":"Idempotency-Key","in":"header","schema":{{"type":"string"}}}}],"responses":{{"201":{{"description":"created"}}}}}}}}}}}}"#
    );
    let after = fixed("min", "openapi.json", &min);
    assert!(after.contains(r#""responses":{"201":{"description":"created"},"409":{"description": "DUPLICATE_REQUEST：重复请求（该请求已处理过）"}}"#), "{after}");
    assert_eq!(after.lines().count(), 1, "still one line");
    let pretty = serde_json::to_string_pretty(&serde_json::from_str::<serde_json::Value>(&min).unwrap()).unwrap();
    let after = fixed("pretty", "openapi.json", &pretty);
    serde_json::from_str::<serde_json::Value>(&after).expect("still JSON");
    assert!(after.contains("\n          \"409\": {\"description\""), "{after}");
}

#[test]
fn shared_responses_and_missing_statements_are_left_alone() {
    // responses by $ref: the shared object serves other operations; no statement: nothing to add.
    let text = format!(
        "openapi: 3.0.3\ninfo: {{ title: t, version: \"1\" }}\npaths:\n  /orders:\n    post:\n      description: \"{STATEMENT}\"\n      parameters: [{{ name: Idempotency-Key, in: header, schema: {{ type: string }} }}]\n      responses: {{ $ref: '#/components/x-responses/created' }}\n    put:\n      responses: {{ '200': {{ description: ok }} }}\ncomponents:\n  x-responses:\n    created: {{ '201': {{ description: created }} }}\n"
    );
    let (dir, path) = temp("shared", "openapi.yaml", &text);
    let o = run(&dir, &["--fix", "--diff", "openapi.yaml"]);
    assert_eq!((o.status.code(), stdout(&o)), (Some(0), String::new()));
    let o = run(&dir, &["--fix", "--color", "never", "openapi.yaml"]);
    assert_eq!(o.status.code(), Some(1), "the findings stay");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--fix` writes in the statement's language: an English statement gets English text, a
/// Chinese one Chinese (above).
#[test]
fn an_english_statement_gets_an_english_description() {
    let text = "openapi: 3.0.3\ninfo: { title: t, version: \"1\" }\npaths:\n  /orders:\n    post:\n      description: \
                \"### Idempotency\\n- Idempotent: yes\\n- Key: Idempotency-Key (header)\\n- Duplicate: 409 DUPLICATE_REQUEST\\n\"\n      \
                parameters: [{ name: Idempotency-Key, in: header, schema: { type: string } }]\n      responses: { '201': { description: created } }\n";
    let after = fixed("english", "openapi.yaml", text);
    assert!(
        after.contains("'409': { description: \"DUPLICATE_REQUEST: a repeat of a request already processed\" }"),
        "{after}"
    );
}

/// With `--policies`, `--fix` adds the gateway's own answers the responses lack altogether
/// (IDEM109), in the statement's language; a second run has nothing left to add and the spec then
/// lints clean against its policies.
#[test]
fn the_gateways_answers_are_added_in_the_statements_language() {
    let policy =
        "[[route]]\nname = \"o\"\nmatch = { method = \"POST\", path = \"/orders\" }\n\n[route.key]\nscope = []\n";
    for (name, statement, want) in [
        (
            "zh",
            "### 幂等性说明\\n- 是否幂等：是\\n- 幂等键：Idempotency-Key（header）\\n- 重复请求：200 SUCCESS\\n",
            "'409': { description: \"网关应答：REQUEST_IN_PROGRESS（同一幂等键的首次请求仍在处理中，稍后重试） / \
             IDEMPOTENCY_OUTCOME_UNKNOWN（首次请求已转发但结果未知，先核实，切勿换新键重试）\" }",
        ),
        (
            "en",
            "### Idempotency\\n- Idempotent: yes\\n- Key: Idempotency-Key (header)\\n- Duplicate: 200 SUCCESS\\n",
            "'409': { description: \"The gateway's answer: REQUEST_IN_PROGRESS (the first request with this key is \
             still running; retry shortly) / IDEMPOTENCY_OUTCOME_UNKNOWN (the first request's outcome is unknown; \
             check it before sending new work)\" }",
        ),
    ] {
        let text = format!(
            "openapi: 3.0.3\ninfo: {{ title: t, version: \"1\" }}\npaths:\n  /orders:\n    post:\n      description: \
             \"{statement}\"\n      parameters: [{{ name: Idempotency-Key, in: header, schema: {{ type: string }} }}]\n      \
             responses:\n        '200':\n          description: SUCCESS\n"
        );
        let (dir, path) = temp(&format!("gateway-{name}"), "openapi.yaml", &text);
        std::fs::write(dir.join("o.toml"), policy).unwrap();
        let lint = |extra: &[&str]| {
            let mut args = vec!["--color", "never", "openapi.yaml", "--policies", "o.toml"];
            args.extend_from_slice(extra);
            run(&dir, &args)
        };
        let before = lint(&[]);
        assert!(stdout(&before).contains("warning[IDEM109]"), "{}", stdout(&before));
        let o = lint(&["--fix"]);
        assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
        let after = std::fs::read_to_string(&path).unwrap();
        assert!(after.contains(want), "{name}: {after}");
        assert!(after.contains("'400': { description:") && after.contains("IDEMPOTENCY_KEY_MISSING"), "{after}");
        assert!(after.contains("'422': { description:") && after.contains("IDEMPOTENCY_KEY_REUSED"), "{after}");
        assert!(stdout(&lint(&[])).contains("no findings"), "{}", stdout(&lint(&[])));
        let again = lint(&["--fix", "--diff"]);
        assert_eq!(again.status.code(), Some(0), "nothing left to fix: {}", stdout(&again));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A duplicate status the statement names (IDEM006) and the gateway's answers on that same status
/// (IDEM109) make one entry, never two keys `409` in one map.
#[test]
fn the_duplicate_and_the_gateways_answers_share_one_entry() {
    let text = "openapi: 3.0.3\ninfo: { title: t, version: \"1\" }\npaths:\n  /orders:\n    post:\n      description: \
                \"### 幂等性说明\\n- 是否幂等：是\\n- 幂等键：Idempotency-Key（header）\\n- 重复请求：409 DUPLICATE_REQUEST\\n\"\n      \
                parameters: [{ name: Idempotency-Key, in: header, schema: { type: string } }]\n      responses:\n        \
                '201':\n          description: created\n";
    let (dir, path) = temp("shared-409", "openapi.yaml", text);
    std::fs::write(
        dir.join("o.toml"),
        "[[route]]\nname = \"o\"\nmatch = { method = \"POST\", path = \"/orders\" }\n\n[route.key]\n\
         scope = []\non_completed = \"reject\"\n\n[route.duplicate]\nstatus = 409\ncode = \"DUPLICATE_REQUEST\"\n",
    )
    .unwrap();
    let o = run(&dir, &["--fix", "openapi.yaml", "--policies", "o.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    let after = std::fs::read_to_string(&path).unwrap();
    assert_eq!(after.matches("'409':").count(), 1, "{after}");
    assert!(
        after.contains(
            "'409': { description: \"DUPLICATE_REQUEST：重复请求（该请求已处理过）；网关应答：REQUEST_IN_PROGRESS"
        ),
        "{after}"
    );
    assert!(stdout(&run(&dir, &["--color", "never", "openapi.yaml", "--policies", "o.toml"])).contains("no findings"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_delivery_gets_its_event_id_and_at_least_once_and_a_section_its_delivery_line() {
    let text = "openapi: 3.1.0\ninfo: { title: t, version: \"1\" }\nwebhooks:\n  orderPaid:\n    post:\n      parameters:\n        - { name: webhook-id, in: header, required: true, schema: { type: string } }\n      responses: { '200': { description: ok } }\n  orderShipped:\n    post:\n      parameters:\n        - { name: webhook-id, in: header, required: true, schema: { type: string } }\n      description: |\n        ### 幂等性说明\n        - 幂等键：webhook-id（header）\n      responses: { '200': { description: ok } }\n";
    let (dir, path) = temp("delivery", "openapi.yaml", text);
    let before = run(&dir, &["--color", "never", "openapi.yaml"]);
    assert_eq!(before.status.code(), Some(1));
    assert_eq!(stdout(&before).matches("error[IDEM013]").count(), 2, "{}", stdout(&before));
    let o = run(&dir, &["--fix", "--color", "never", "openapi.yaml"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stderr).contains("2 delivery statement(s) completed"), "{o:?}");
    let after = std::fs::read_to_string(&path).unwrap();
    // The one id-like header is the event id; the section gets its line in its own list.
    assert!(after.contains(
        "      responses: { '200': { description: ok } }\n      x-idempotency: { key: { in: header, name: \"webhook-id\" }, delivery: at-least-once }\n"
    ), "{after}");
    assert!(after.contains("        - 幂等键：webhook-id（header）\n        - 投递：至少一次\n"), "{after}");
    let again = run(&dir, &["--fix", "--diff", "openapi.yaml"]);
    assert_eq!((again.status.code(), stdout(&again)), (Some(0), String::new()), "nothing left to fix");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where a line cannot be added safely — a quoted description, a folded one, an item that wraps
/// onto the next line — nothing is written; a callback shared by two operations is one delivery.
#[test]
fn a_delivery_line_is_never_forced_into_a_description_it_would_break() {
    let text = include_str!("fixtures/fix/deliveries_left_alone.yaml");
    let (dir, path) = temp("delivery-alone", "openapi.yaml", text);
    let before = run(&dir, &["--color", "never", "openapi.yaml"]);
    assert_eq!(stdout(&before).matches("error[IDEM013]").count(), 3, "{}", stdout(&before));
    let o = run(&dir, &["--fix", "--diff", "openapi.yaml"]);
    assert_eq!((o.status.code(), stdout(&o)), (Some(0), String::new()), "nothing it could add safely");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A delivery whose IDEM013 is suppressed (`x-idem-lint-ignore`) is left as it is by `--fix`.
#[test]
fn a_suppressed_delivery_is_not_fixed() {
    let text = "openapi: 3.1.0\ninfo: { title: t, version: \"1\" }\nwebhooks:\n  orderPaid:\n    post:\n      x-idem-lint-ignore: IDEM013\n      parameters:\n        - { name: webhook-id, in: header, required: true, schema: { type: string } }\n      responses: { '200': { description: ok } }\n";
    let (dir, path) = temp("delivery-suppressed", "openapi.yaml", text);
    let o = run(&dir, &["--fix", "--diff", "openapi.yaml"]);
    assert_eq!((o.status.code(), stdout(&o)), (Some(0), String::new()), "suppressed: nothing to fix");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let _ = std::fs::remove_dir_all(&dir);
}
