//! `--policies` (IDEM1xx) and `idem-lint bundle`: fixtures that fire and twins that stay quiet,
//! policy errors with their position, bundles that parse back with the filter's own parser, and
//! the example Envoy configs checked against `policies/` so they cannot drift.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use idem_filter::policy::{parse_bundle, Bundle, RoutePolicy, SharedConfig, StoreKind};
use idem_lint::config::Config;
use idem_lint::crosscheck::lint_specs;
use idem_lint::policy::PolicySet;
use idem_lint::rules::RULES;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn repo() -> PathBuf {
    root().join("..")
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem-lint")).args(args).current_dir(dir).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn cases(rule: &str, prefix: &str) -> Vec<PathBuf> {
    let dir = root().join("tests/fixtures").join(rule);
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir() && p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .collect();
    v.sort();
    v
}

/// `IDEM103 policies/a.toml:8:8 -> spec.yaml:9:15` for each finding of `code` in a case directory
/// (`spec.yaml` + `policies/`), file names relative to the case.
fn findings_in(case: &Path, code: Option<&str>) -> Vec<String> {
    let prefix = format!("{}/", case.display());
    let rel = |f: &str| f.strip_prefix(&prefix).unwrap_or(f).to_string();
    let spec = case.join("spec.yaml").to_string_lossy().into_owned();
    let pol = case.join("policies").to_string_lossy().into_owned();
    let paths = [pol];
    let set = PolicySet::load(&paths).unwrap_or_else(|e| panic!("{}: {e}", case.display()));
    let linted = lint_specs(&[spec], Some(&set), &paths, &Config::default());
    assert!(linted.errors.is_empty(), "{}: {:?}", case.display(), linted.errors);
    linted
        .findings
        .iter()
        .filter(|f| code.is_none_or(|c| f.code == c))
        .map(|f| {
            let mut s = format!("{} {}:{}:{}", f.code, rel(&f.file), f.position.line, f.position.column);
            for r in &f.related {
                s.push_str(&format!(" -> {}:{}:{}", rel(&r.file), r.position.line, r.position.column));
            }
            s.push_str(&format!("  [{}]", f.message));
            s
        })
        .collect()
}

fn strip_message(s: &str) -> &str {
    s.split("  [").next().unwrap_or(s)
}

#[test]
fn every_policy_rule_fires_on_its_bad_fixtures_at_the_expected_places() {
    let rules: Vec<_> = RULES.iter().filter(|r| r.checks_policies()).collect();
    assert_eq!(
        rules.iter().map(|r| r.code).collect::<Vec<_>>(),
        ["IDEM101", "IDEM102", "IDEM103", "IDEM104", "IDEM105", "IDEM106", "IDEM107", "IDEM108", "IDEM109"]
    );
    for rule in rules {
        let bad = cases(rule.code, "bad");
        assert!(!bad.is_empty(), "{}: no bad fixture", rule.code);
        for case in bad {
            let expected: Vec<String> = std::fs::read_to_string(case.join("expect"))
                .unwrap()
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect();
            assert!(!expected.is_empty(), "{}: no expectations", case.display());
            let got = findings_in(&case, Some(rule.code));
            let got_places: Vec<&str> = got.iter().map(|s| strip_message(s)).collect();
            assert_eq!(got_places, expected, "{}: {got:#?}", case.display());
        }
    }
}

#[test]
fn every_policy_rule_stays_quiet_on_its_good_twin() {
    for rule in RULES.iter().filter(|r| r.checks_policies()) {
        let good = cases(rule.code, "good");
        assert!(!good.is_empty(), "{}: no good fixture", rule.code);
        for case in good {
            // A twin is about its own rule; the gateway's own answers (IDEM109) are documented
            // only in IDEM109's twins.
            let got: Vec<String> = findings_in(&case, None)
                .into_iter()
                .filter(|f| rule.code == "IDEM109" || !f.starts_with("IDEM109 "))
                .collect();
            assert!(got.is_empty(), "{}: {got:#?}", case.display());
        }
    }
}

#[test]
fn policy_rules_are_listed_and_explained() {
    let o = run_in(&root(), &["rules"]);
    let out = stdout(&o);
    for code in ["IDEM101", "IDEM102", "IDEM103", "IDEM104", "IDEM105", "IDEM106", "IDEM107", "IDEM108", "IDEM109"] {
        assert!(out.lines().any(|l| l.starts_with(code)), "{code} not listed:\n{out}");
        let doc = stdout(&run_in(&root(), &["--explain", code]));
        assert!(doc.starts_with(code), "{doc}");
        for section in ["\nWhat it checks\n", "\nWhy\n", "\nExample\n", "\nFix\n"] {
            assert!(doc.contains(section), "{code}: no {section:?} in {doc}");
        }
    }
    let doc = stdout(&run_in(&root(), &["--explain", "IDEM104"]));
    assert!(doc.contains("on_completed = \"replay\"") && doc.contains("200 SUCCESS"), "{doc}");
}

#[test]
fn the_example_spec_and_the_project_policies_agree() {
    let mut args = vec!["--color".to_string(), "never".into(), "examples/openapi.yaml".into(), "--policies".into()];
    args.extend(policy_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = run_in(&repo(), &args);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o).trim(), "idem-lint: no findings in 1 spec");
    // One policy per row of the scenario table in lint/POLICIES.md, each on an operation of the spec.
    let files: Vec<String> = policy_files().iter().map(|f| f.to_string_lossy().into_owned()).collect();
    let set = idem_lint::policy::PolicySet::load(&files).unwrap();
    let names: Vec<&str> = set.routes().map(|r| r.route.name.as_str()).collect();
    for n in [
        "submit-form",
        "pay-callback",
        "webhook-events",
        "order-pay",
        "internal-transfer",
        "reconcile-job",
        "create-order",
    ] {
        assert!(names.contains(&n), "no policy {n}: {names:?}");
    }
}

/// A real drift: the payment callback policy switched to answering repeats itself with 409.
#[test]
fn a_drifted_policy_is_caught_with_both_places() {
    let dir = std::env::temp_dir().join(format!("idem-drift-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for p in policy_files() {
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let cb = dir.join("pay-callback.toml");
    let text = std::fs::read_to_string(&cb).unwrap();
    let text = text
        .replace("on_completed = \"replay\"", "on_completed = \"reject\"")
        .replace("status = 200\ncode = \"SUCCESS\"", "status = 409\ncode = \"DUPLICATE_CALLBACK\"")
        .replace("name = \"/transaction_id\"", "name = \"/out_trade_no\"");
    std::fs::write(&cb, &text).unwrap();
    let spec = repo().join("examples/openapi.yaml");
    let o = run_in(&repo(), &["--format", "json", spec.to_str().unwrap(), "--policies", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let f = v["findings"].as_array().unwrap();
    let codes: Vec<&str> = f.iter().map(|x| x["code"].as_str().unwrap()).collect();
    assert_eq!(codes, ["IDEM103", "IDEM104"], "{f:#?}");
    let line_of = |needle: &str| text.lines().position(|l| l.starts_with(needle)).unwrap() + 1;
    assert_eq!(f[0]["line"], line_of("name = \"/out_trade_no\""));
    assert_eq!(f[0]["column"], 8);
    assert_eq!(f[1]["line"], line_of("status = 409"));
    assert!(f[1]["message"].as_str().unwrap().contains("200 SUCCESS"), "{f:#?}");
    for x in f {
        assert!(x["file"].as_str().unwrap().ends_with("pay-callback.toml"));
        let rel = &x["related"][0];
        assert!(rel["file"].as_str().unwrap().ends_with("examples/openapi.yaml"), "{x}");
        assert!(rel["pointer"].as_str().unwrap().starts_with("/paths/~1api~1pay~1callback/post/x-idempotency"), "{x}");
    }
    // SARIF: relatedLocations; text: the second file:line:col line.
    let o = run_in(&repo(), &["--format", "sarif", spec.to_str().unwrap(), "--policies", dir.to_str().unwrap()]);
    let sarif: serde_sarif::sarif::Sarif = serde_json::from_str(&stdout(&o)).unwrap();
    let results = sarif.runs[0].results.as_ref().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        let related = r.related_locations.as_ref().unwrap();
        assert_eq!(related.len(), 1);
        let uri =
            related[0].physical_location.as_ref().unwrap().artifact_location.as_ref().unwrap().uri.as_ref().unwrap();
        assert!(uri.ends_with("examples/openapi.yaml"), "{uri}");
    }
    let o = run_in(&repo(), &["--color", "never", spec.to_str().unwrap(), "--policies", dir.to_str().unwrap()]);
    let out = stdout(&o);
    let spec_line = std::fs::read_to_string(&spec)
        .unwrap()
        .lines()
        .position(|l| l.contains("key: { in: body, name: /transaction_id }"))
        .unwrap()
        + 1;
    assert!(out.contains(&format!("examples/openapi.yaml:{spec_line}:14: related: ")), "{out}");
    let o = run_in(&repo(), &["--format", "github", spec.to_str().unwrap(), "--policies", dir.to_str().unwrap()]);
    assert!(stdout(&o).contains("(see "), "{}", stdout(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_typo_in_a_policy_is_a_fatal_error_with_file_line_and_column() {
    let dir = std::env::temp_dir().join(format!("idem-typo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(repo().join("policies/order-pay.toml")).unwrap().replace("lock_ttl", "lock_tll");
    let line = text.lines().position(|l| l.starts_with("lock_tll")).unwrap() + 1;
    let file = dir.join("order-pay.toml");
    std::fs::write(&file, &text).unwrap();
    let want = format!("{}:{line}:1: unknown field `lock_tll`, expected one of", file.display());
    for args in [
        vec!["examples/openapi.yaml", "--policies", dir.to_str().unwrap()],
        vec!["bundle", dir.to_str().unwrap()],
        vec!["bundle", file.to_str().unwrap(), "--envoy-filter"],
    ] {
        let o = run_in(&repo(), &args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).starts_with(&format!("idem-lint: error: {want}")), "{args:?}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "{args:?}");
    }
    // A spec swallowed by --policies is named as such.
    let o = run_in(&repo(), &["--policies", "policies/", "examples/openapi.yaml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("idem-lint: error: examples/openapi.yaml: a YAML file is not a policy file"),
        "{}",
        stderr(&o)
    );
    // The same message the filter gives when Envoy loads it.
    let e = parse_bundle(&text, &file.to_string_lossy()).unwrap_err();
    assert!(e.to_string().starts_with(&want), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bundles_across_files_reject_two_redis_tables_and_duplicate_names_naming_both_files() {
    let dir = std::env::temp_dir().join(format!("idem-two-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.toml"), "[redis]\ncluster = \"webdis\"\n").unwrap();
    std::fs::write(dir.join("b.toml"), "# fleet\n\n[redis]\ncluster = \"other\"\n").unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let a = dir.join("a.toml");
    let b = dir.join("b.toml");
    assert_eq!(
        stderr(&o).trim(),
        format!("idem-lint: error: {}:3:1: [redis] differs from the one in {}:1:1; a bundle has one [redis]: state it once (in any one file, or a file of its own) or identically", b.display(), a.display())
    );
    std::fs::remove_file(&b).unwrap();
    std::fs::copy(repo().join("policies/order-pay.toml"), dir.join("c.toml")).unwrap();
    std::fs::copy(repo().join("policies/order-pay.toml"), dir.join("d.toml")).unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains(&format!(
            "{}:3:8: route \"order-pay\": duplicate route name (also at {}:3:8)",
            dir.join("d.toml").display(),
            dir.join("c.toml").display()
        )),
        "{}",
        stderr(&o)
    );
    let renamed =
        std::fs::read_to_string(dir.join("d.toml")).unwrap().replace("name = \"order-pay\"", "name = \"order-pay-2\"");
    std::fs::write(dir.join("d.toml"), renamed).unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("conflicting matchers: it matches the same requests as route \"order-pay\""),
        "{}",
        stderr(&o)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The bundle the filter would build from each file on its own, concatenated.
fn expected_bundle(files: &[PathBuf]) -> Bundle {
    let mut out = parse_bundle("", "empty").unwrap();
    for f in files {
        let b = parse_bundle(&std::fs::read_to_string(f).unwrap(), &f.to_string_lossy()).unwrap();
        out.routes.extend(b.routes);
        if b.redis.is_some() {
            out.redis = b.redis;
        }
        if b.shared != SharedConfig::default() {
            out.shared = b.shared;
        }
    }
    out
}

/// The policy files the project ships: those git tracks (a user's own policy saved in policies/
/// while trying idem is not one of them); every policies/*.toml without git.
fn policy_files() -> Vec<PathBuf> {
    let tracked = Command::new("git")
        .args(["ls-files", "policies/*.toml"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(|l| repo().join(l)).collect::<Vec<_>>())
        .unwrap_or_default();
    let mut v: Vec<PathBuf> = if tracked.is_empty() {
        std::fs::read_dir(repo().join("policies"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect()
    } else {
        tracked
    };
    v.sort();
    v
}

/// [`policy_files`] as arguments, relative to the repository.
fn policy_args() -> Vec<String> {
    repo_relative(&policy_files())
}

/// `idem-lint bundle <the shipped policies> <extra>` in the repository.
fn bundle_shipped(extra: &[&str]) -> Output {
    let mut args = vec!["bundle".to_string()];
    args.extend(policy_args());
    args.extend(extra.iter().map(|s| s.to_string()));
    run_in(&repo(), &args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[test]
fn bundle_toml_and_json_parse_back_to_the_same_bundle() {
    let files = policy_files();
    assert!(files.len() >= 7, "{files:?}");
    let want = expected_bundle(&files);
    let toml_out = bundle_shipped(&[]);
    assert_eq!(toml_out.status.code(), Some(0), "{}", stderr(&toml_out));
    let json_out = bundle_shipped(&["--format", "json"]);
    assert_eq!(json_out.status.code(), Some(0), "{}", stderr(&json_out));
    let t = stdout(&toml_out);
    let j = stdout(&json_out);
    assert!(j.trim_start().starts_with('{'));
    assert_eq!(parse_bundle(&t, "toml bundle").unwrap(), want);
    assert_eq!(parse_bundle(&j, "json bundle").unwrap(), want);
    // The TOML keeps the files' comments, under a line naming each file.
    for f in &files {
        assert!(t.contains(&format!("# ---- policies/{}", f.file_name().unwrap().to_string_lossy())), "{t}");
    }
    assert!(t.contains("providers re-serialize the same event on retry"));

    // A [shared] table in one file and a JSON policy file: still one equal bundle.
    let dir = std::env::temp_dir().join(format!("idem-bundle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("0-store.toml"),
        "[shared]\nbuckets = 64\nentries_per_bucket = 4\nmax_response_bytes = 4096\n",
    )
    .unwrap();
    std::fs::copy(repo().join("policies/create-order.toml"), dir.join("create-order.toml")).unwrap();
    std::fs::write(
        dir.join("1-pay.json"),
        stdout(&run_in(&repo(), &["bundle", "policies/order-pay.toml", "--format", "json"])),
    )
    .unwrap();
    let args = [dir.join("0-store.toml"), dir.join("create-order.toml"), dir.join("1-pay.json")];
    let argv: Vec<&str> = std::iter::once("bundle").chain(args.iter().map(|p| p.to_str().unwrap())).collect();
    let mut want = expected_bundle(&args);
    assert_eq!(want.shared.buckets, 64);
    // A route without its own max_response_bytes takes the bundle's [shared] one, whichever
    // file the table is in.
    for r in &mut want.routes {
        r.max_response_bytes = want.shared.max_response_bytes;
    }
    for fmt in ["toml", "json"] {
        let mut a = argv.clone();
        a.extend(["--format", fmt]);
        let o = run_in(&repo(), &a);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        assert_eq!(parse_bundle(&stdout(&o), fmt).unwrap(), want, "{fmt}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The one `http_filters` entry `bundle --envoy-filter` prints, parsed with the linter's own YAML
/// reader (a YAML 1.2 parser with positions): named `idem`, disabled (enabled per route), of `typed`.
fn disabled_idem_entry(yaml: &str, typed: &str) -> idem_lint::node::Node {
    let root = idem_lint::loader::parse_text("filter.yaml", yaml).unwrap();
    let entry = root.as_seq().unwrap()[0].clone();
    assert_eq!(entry.get("name").unwrap().as_str(), Some("idem"));
    assert_eq!(entry.get("disabled").unwrap().as_bool(), Some(true));
    assert_eq!(entry.get("typed_config").unwrap().get("@type").unwrap().as_str(), Some(typed));
    entry
}

#[test]
fn envoy_filter_entry_is_the_documented_shape_and_carries_the_bundle() {
    let o = bundle_shipped(&["--envoy-filter", "--wasm", "/opt/idem/idem_filter.wasm"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let y = stdout(&o);
    let entry = disabled_idem_entry(&y, "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm");
    let c = entry.get("typed_config").unwrap().get("config").unwrap();
    assert_eq!(c.get("allow_on_headers_stop_iteration").unwrap().as_bool(), Some(true));
    assert_eq!(c.get("failure_policy").unwrap().as_str(), Some("FAIL_CLOSED"));
    let vm = c.get("vm_config").unwrap();
    assert_eq!(vm.get("vm_id").unwrap().as_str(), Some("idem"));
    assert_eq!(vm.get("runtime").unwrap().as_str(), Some("envoy.wasm.runtime.v8"));
    let filename = vm.get("code").unwrap().get("local").unwrap().get("filename").unwrap();
    assert_eq!(filename.as_str(), Some("/opt/idem/idem_filter.wasm"));
    let conf = c.get("configuration").unwrap();
    assert_eq!(conf.get("@type").unwrap().as_str(), Some("type.googleapis.com/google.protobuf.StringValue"));
    let value = conf.get("value").unwrap().as_str().unwrap();
    assert_eq!(parse_bundle(value, "value").unwrap(), expected_bundle(&policy_files()));
    assert!(y.contains("envoy.config.route.v3.FilterConfig") && y.contains("config: {}"), "{y}");
    // The header's route table names the bundled policies' own routes, not a fixed example.
    let o = run_in(&repo(), &["bundle", "policies/order-pay.toml", "--envoy-filter"]);
    let header = stdout(&o);
    assert!(
        header.contains("#   - name: order-pay\n#     match: { prefix: /api/orders/, case_sensitive: false }"),
        "{header}"
    );
    assert!(!header.contains("create-order"), "{header}");
    let o = bundle_shipped(&["--envoy-filter", "--format", "json"]);
    let root = idem_lint::loader::parse_text("filter.yaml", &stdout(&o)).unwrap();
    let v = root.as_seq().unwrap()[0].get("typed_config").unwrap().get("config").unwrap();
    let value = v.get("configuration").unwrap().get("value").unwrap().as_str().unwrap();
    assert!(value.trim_start().starts_with('{'));
    assert_eq!(parse_bundle(value, "value").unwrap(), expected_bundle(&policy_files()));
}

#[test]
fn envoy_filter_entry_for_the_native_build_names_the_module_and_refuses_what_it_cannot_serve() {
    let dir = std::env::temp_dir().join(format!("idem-lint-bundle-native-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A stand-in module file: idem-lint reads only its name and directory.
    std::fs::write(dir.join("libidem_native.so"), b"\x7fELF").unwrap();
    let module = dir.join("libidem_native.so");
    let policy = repo().join("policies/create-order.toml");
    let o =
        run_in(&repo(), &["bundle", policy.to_str().unwrap(), "--envoy-filter", "--native", module.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let y = stdout(&o);
    let entry = disabled_idem_entry(
        &y,
        "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter",
    );
    let tc = entry.get("typed_config").unwrap();
    assert_eq!(tc.get("dynamic_module_config").unwrap().get("name").unwrap().as_str(), Some("idem_native"));
    assert_eq!(tc.get("filter_name").unwrap().as_str(), Some("idem"));
    let conf = tc.get("filter_config").unwrap();
    assert_eq!(conf.get("@type").unwrap().as_str(), Some("type.googleapis.com/google.protobuf.StringValue"));
    let value = conf.get("value").unwrap().as_str().unwrap();
    assert_eq!(parse_bundle(value, "value").unwrap(), expected_bundle(std::slice::from_ref(&policy)));
    assert!(!y.contains("envoy.wasm.runtime.v8"), "no Wasm VM: {y}");
    let err = stderr(&o);
    assert!(err.contains(&format!("ENVOY_DYNAMIC_MODULES_SEARCH_PATH={}", dir.display())), "{err}");
    // The shipped policies include detached callbacks: refused at the route, with the reason.
    let o = bundle_shipped(&["--envoy-filter", "--native", module.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("pay-callback.toml:") && err.contains("the native build cannot serve"), "{err}");
    assert!(stdout(&o).is_empty(), "nothing printed when refused: {}", stdout(&o));
    // --native is for the entry, and names a module that exists.
    let o = run_in(&repo(), &["bundle", policy.to_str().unwrap(), "--native", module.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--envoy-filter"), "{}", stderr(&o));
    let o = run_in(&repo(), &["bundle", policy.to_str().unwrap(), "--envoy-filter", "--native", "missing.so"]);
    assert!(stderr(&o).contains("missing.so does not exist"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The inline `value: |` block of an example Envoy config, and the policy files its comment names.
fn example_block(name: &str) -> (String, Vec<PathBuf>) {
    let text = std::fs::read_to_string(repo().join("examples").join(name)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let at = lines.iter().position(|l| l.trim() == "value: |").unwrap_or_else(|| panic!("{name}: no `value: |`"));
    let indent = lines[at].len() - lines[at].trim_start().len();
    let mut block = String::new();
    for l in &lines[at + 1..] {
        let ind = l.len() - l.trim_start().len();
        if !l.trim().is_empty() && ind <= indent {
            break;
        }
        block.push_str(l.get(indent + 2..).unwrap_or(""));
        block.push('\n');
    }
    let mut files = Vec::new();
    for l in lines[..at].iter().rev().take_while(|l| l.trim_start().starts_with('#')) {
        for w in l.split_whitespace().rev() {
            if w.starts_with("policies/") && w.ends_with(".toml") {
                files.insert(0, repo().join(w));
            }
        }
    }
    assert!(!files.is_empty(), "{name}: the comment above `value: |` names no policy files");
    (block.trim_end().to_string() + "\n", files)
}

/// The example's inline bundle is `idem-lint bundle <its policy files>`, byte for byte, and the
/// same routes field for field through the filter's model; its comment names `want`.
fn assert_example_is_the_bundle_of(example: &str, want: &[&str]) {
    let (block, files) = example_block(example);
    let names = repo_relative(&files);
    assert_eq!(names, want, "{example}");
    let mut args = vec!["bundle"];
    args.extend(names.iter().map(String::as_str));
    let o = run_in(&repo(), &args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        block,
        stdout(&o),
        "examples/{example} is stale: regenerate its inline bundle with `idem-lint {}`",
        args.join(" ")
    );
    assert_eq!(parse_bundle(&block, example).unwrap(), expected_bundle(&files));
}

fn repo_relative(files: &[PathBuf]) -> Vec<String> {
    files.iter().map(|f| f.strip_prefix(repo()).unwrap().to_string_lossy().into_owned()).collect()
}

const EXAMPLE_POLICIES: [&str; 4] = [
    "policies/create-order.toml",
    "policies/pay-callback.toml",
    "policies/order-pay.toml",
    "policies/submit-form.toml",
];

#[test]
fn examples_envoy_yaml_inline_bundle_is_the_bundle_of_its_policy_files() {
    assert_example_is_the_bundle_of("envoy.yaml", &EXAMPLE_POLICIES);
}

#[test]
fn examples_grpc_envoy_yaml_inline_bundle_is_the_bundle_of_its_policy_file() {
    assert_example_is_the_bundle_of("grpc/envoy.yaml", &["policies/grpc-create-order.toml"]);
}

#[test]
fn examples_envoy_redis_yaml_routes_are_the_policy_files_on_the_redis_store() {
    let (block, files) = example_block("envoy-redis.yaml");
    assert_eq!(repo_relative(&files), EXAMPLE_POLICIES);
    let got = parse_bundle(&block, "examples/envoy-redis.yaml").unwrap();
    assert!(got.redis.is_some(), "the Redis example needs its [redis] table");
    let want: Vec<RoutePolicy> =
        expected_bundle(&files).routes.into_iter().map(|r| RoutePolicy { store: StoreKind::Redis, ..r }).collect();
    assert_eq!(got.routes.len(), want.len());
    for (g, w) in got.routes.iter().zip(&want) {
        assert_eq!(g, w, "examples/envoy-redis.yaml route {:?} differs from its policy file", w.name);
    }
}

/// A policy per route, with `[redis]` stated once for the bundle (in a file of its own, or in one
/// of the route files): every layout bundles; two files that state it differently are refused.
#[test]
fn bundle_wide_tables_are_stated_once_for_every_file() {
    let dir = std::env::temp_dir().join(format!("idem-compose-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let redis = "[redis]\ncluster = \"webdis\"\ntimeout = \"500ms\"\n";
    let route = |name: &str, path: &str| {
        format!("[[route]]\nname = \"{name}\"\nmatch = {{ method = \"POST\", path = \"{path}\" }}\nstore = \"redis\"\n")
    };
    std::fs::write(dir.join("create-payout.toml"), route("create-payout", "/payouts")).unwrap();
    std::fs::write(dir.join("create-refund.toml"), route("create-refund", "/refunds")).unwrap();
    std::fs::write(dir.join("redis.toml"), redis).unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let bundle = parse_bundle(&stdout(&o), "bundle").unwrap();
    assert_eq!(bundle.routes.len(), 2);
    assert_eq!(bundle.redis.as_ref().map(|r| r.cluster.as_str()), Some("webdis"));
    // In one of the route files instead, and the same table twice: the same bundle.
    std::fs::remove_file(dir.join("redis.toml")).unwrap();
    std::fs::write(dir.join("create-refund.toml"), format!("{redis}\n{}", route("create-refund", "/refunds"))).unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::write(dir.join("create-payout.toml"), format!("{redis}\n{}", route("create-payout", "/payouts"))).unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(parse_bundle(&stdout(&o), "bundle").unwrap().routes.len(), 2);
    // Two files that disagree: refused, naming both.
    let other = redis.replace("500ms", "2s");
    std::fs::write(dir.join("create-payout.toml"), format!("{other}\n{}", route("create-payout", "/payouts"))).unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("[redis] differs from the one in")
            && e.contains("create-payout.toml")
            && e.contains("create-refund.toml"),
        "{e}"
    );
    // A route file alone still says what it lacks.
    let o = run_in(&repo(), &["bundle", dir.join("create-payout.toml").to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    std::fs::write(dir.join("lonely.toml"), route("lonely", "/lonely")).unwrap();
    let o = run_in(&repo(), &["bundle", dir.join("lonely.toml").to_str().unwrap()]);
    assert!(stderr(&o).contains("needs a top-level [redis] table"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every policy error of a run is reported, each on its own line with its file and line: two
/// routes wrong in one file, and a typo in another file, in one run (the parser used to stop at
/// the first).
#[test]
fn every_policy_error_of_a_run_is_reported() {
    let dir = std::env::temp_dir().join(format!("idem-all-errors-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let two_wrong =
        "[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/a\" }\nupstream_timeout = \"0s\"\n\n\
                     [[route]]\nname = \"fine\"\nmatch = { method = \"POST\", path = \"/fine\" }\n\n\
                     [[route]]\nname = \"b\"\nmatch = { method = \"POST\", path = \"/b\" }\nmode = \"token\"\n\n\
                     [route.key]\nttl = \"1h\"\n";
    std::fs::write(dir.join("a-two-wrong.toml"), two_wrong).unwrap();
    let typo = std::fs::read_to_string(repo().join("policies/order-pay.toml")).unwrap().replace("lock_ttl", "lock_tll");
    std::fs::write(dir.join("b-typo.toml"), &typo).unwrap();
    let o = run_in(&repo(), &["bundle", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 3, "{err}");
    let a = dir.join("a-two-wrong.toml");
    assert!(lines[0].starts_with(&format!("idem-lint: error: {}:1:", a.display())), "{err}");
    assert!(lines[0].contains("route \"a\": upstream_timeout must be positive"), "{err}");
    assert!(lines[1].starts_with(&format!("idem-lint: error: {}:10:", a.display())), "{err}");
    assert!(lines[1].contains("route \"b\": mode = \"token\" takes [route.token]"), "{err}");
    assert!(lines[2].contains("b-typo.toml") && lines[2].contains("unknown field `lock_tll`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_envoy_bootstrap_names_the_filter_by_absolute_path_and_says_how_to_build_a_missing_one() {
    let outside = std::env::temp_dir().join(format!("idem-lint-envoy-{}", std::process::id()));
    std::fs::create_dir_all(&outside).unwrap();
    let policy = repo().join("policies/create-order.toml");
    let policy = policy.to_str().unwrap();
    // Run from outside the repository: the default is the .wasm built beside this idem-lint.
    let built = repo().join("target/wasm32-wasip1/release/idem_filter.wasm");
    assert!(built.is_file(), "build the filter first: `make build-filter` (make check and make unit do)");
    let built = built.canonicalize().unwrap();
    let o = run_in(&outside, &["envoy", policy, "--upstream", "127.0.0.1:8080"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The bootstrap loads its listeners from the file it names (absolute), which Envoy watches.
    let bootstrap = String::from_utf8_lossy(&o.stdout).into_owned();
    let listeners = outside.join("idem-listeners.json");
    assert!(bootstrap.contains(&format!("\"path\": \"{}\"", listeners.display())), "{bootstrap}");
    let text = std::fs::read_to_string(&listeners).unwrap();
    assert!(text.contains(&format!("\"filename\": \"{}\"", built.display())), "absolute path: {text}");
    assert!(text.contains("%FILTER_STATE(wasm.idem:PLAIN)%"), "an access log with idem's fields");
    // --update rewrites only the listeners file.
    let o = run_in(&outside, &["envoy", policy, "--upstream", "127.0.0.1:8080", "--update"]);
    assert!(o.status.success() && o.stdout.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    // A path that does not exist: refused, with the command that builds it.
    let o = run_in(&outside, &["envoy", policy, "--upstream", "127.0.0.1:8080", "--wasm", "nowhere/idem_filter.wasm"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(err.contains(&format!("{}/nowhere/idem_filter.wasm does not exist", outside.display())), "{err}");
    assert!(err.contains("make build-filter") && err.contains("--wasm PATH"), "{err}");
    // A relative --wasm that exists is written absolute.
    std::fs::write(outside.join("f.wasm"), b"\0asm").unwrap();
    let o = run_in(&outside, &["envoy", policy, "--upstream", "127.0.0.1:8080", "--wasm", "f.wasm"]);
    assert!(o.status.success());
    let text = std::fs::read_to_string(&listeners).unwrap();
    assert!(text.contains(&format!("\"filename\": \"{}/f.wasm\"", outside.display())), "{text}");
    // --update without a listeners file to update says how to start.
    std::fs::remove_file(&listeners).unwrap();
    let o = run_in(&outside, &["envoy", policy, "--upstream", "127.0.0.1:8080", "--update"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("without --update first"));
}

#[test]
fn envoy_refuses_a_bundle_whose_redis_is_only_direct() {
    // The bootstrap loads the .wasm, which reaches Redis through Webdis only.
    let dir = std::env::temp_dir().join(format!("idem-direct-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = "[redis]\ndirect = \"127.0.0.1:6379\"\n\n[[route]]\nname = \"a\"\nmatch = { path = \"/a\" }\nstore = \"redis\"\n";
    std::fs::write(dir.join("direct.toml"), policy).unwrap();
    let o = run_in(
        &dir,
        &["envoy", "direct.toml", "--upstream", "127.0.0.1:8080", "--webdis", "127.0.0.1:7379", "--wasm", "x.wasm"],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.contains("names only `direct`") && err.contains("add `cluster`"), "{err}");
    assert!(!dir.join("idem-listeners.json").exists(), "nothing is written");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn envoy_native_loads_the_module_by_name_and_refuses_what_it_cannot_serve() {
    let dir = std::env::temp_dir().join(format!("idem-lint-native-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A stand-in module file: idem-lint reads only its name and directory.
    std::fs::write(dir.join("libidem_native.so"), b"\x7fELF").unwrap();
    let policy = repo().join("policies/create-order.toml");
    let o = run_in(
        &dir,
        &["envoy", policy.to_str().unwrap(), "--upstream", "127.0.0.1:8080", "--native", "libidem_native.so"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let listeners = std::fs::read_to_string(dir.join("idem-listeners.json")).unwrap();
    let lds: serde_json::Value = serde_json::from_str(&listeners).unwrap();
    let filters: Vec<&serde_json::Value> = lds["resources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"].as_array().unwrap())
        .filter(|f| f["name"] == "idem")
        .collect();
    assert_eq!(filters.len(), 2, "the gateway's filter and the echo's: {listeners}");
    for f in &filters {
        let t = &f["typed_config"];
        assert_eq!(
            t["@type"],
            "type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter"
        );
        assert_eq!(t["dynamic_module_config"]["name"], "idem_native");
        assert_eq!(t["filter_name"], "idem");
    }
    assert!(filters[0]["typed_config"]["filter_config"]["value"].as_str().unwrap().contains("name = \"create-order\""));
    assert!(!listeners.contains("envoy.wasm.runtime.v8"), "no Wasm VM: {listeners}");
    let err = stderr(&o);
    let search_path = format!("ENVOY_DYNAMIC_MODULES_SEARCH_PATH={}", dir.display());
    assert!(err.contains(&search_path) && err.contains("libidem_native.so"), "{err}");
    // What the native build refuses at load is refused here, at the route, with the reason.
    let detached = "[[route]]\nname = \"d\"\nmatch = { path = \"/d\" }\nforward = \"detached\"\n";
    std::fs::write(dir.join("detached.toml"), detached).unwrap();
    let o = run_in(&dir, &["envoy", "detached.toml", "--upstream", "127.0.0.1:8080", "--native", "libidem_native.so"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("detached.toml:2:8: the native build cannot serve route \"d\": forward = \"detached\""),
        "{err}"
    );
    assert!(err.contains("Use the .wasm for this route"), "{err}");
    // The module must exist and be named lib<name>.so.
    let o = run_in(&dir, &["envoy", "detached.toml", "--upstream", "127.0.0.1:8080", "--native", "missing.so"]);
    assert!(stderr(&o).contains("missing.so does not exist") && stderr(&o).contains("make build-native"));
    std::fs::write(dir.join("idem.so"), b"").unwrap();
    let o = run_in(&dir, &["envoy", "detached.toml", "--upstream", "127.0.0.1:8080", "--native", "idem.so"]);
    assert!(stderr(&o).contains("from a file named lib<name>.so"), "{}", stderr(&o));
    // A bundle whose Redis is only `direct` needs no Webdis natively.
    let direct = "[redis]\ndirect = \"127.0.0.1:6379\"\n\n[[route]]\nname = \"a\"\nmatch = { path = \"/a\" }\nstore = \"redis\"\n";
    std::fs::write(dir.join("direct.toml"), direct).unwrap();
    let o = run_in(&dir, &["envoy", "direct.toml", "--upstream", "127.0.0.1:8080", "--native", "libidem_native.so"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).unwrap();
}
