#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The filter's modules form layers: no two top-level modules use each other, directly or
//! around a loop, and `policy` uses nothing above it (only the leaf `codes`). Read from the
//! source (`crate::<module>` outside comments and `#[cfg(test)]` code), so a new loop fails here
//! rather than in a reader's head. `lifecycle`'s concern files may use each other: they are one
//! module, its state split by concern.

mod common;

use std::collections::{BTreeMap, BTreeSet};

/// Top-level module -> the top-level modules its code names.
fn uses() -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, code) in common::filter_sources() {
        let module = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
        // The glue and the fake host sit outside the layers (they see everything).
        if matches!(module.as_str(), "lib" | "glue" | "testing") {
            continue;
        }
        let used = out.entry(module.clone()).or_default();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..].chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
                if !name.is_empty() && name != module {
                    used.insert(name);
                }
            }
        }
    }
    out
}

/// A loop through `from`, if there is one: the modules around it.
fn loop_through(uses: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap();
        for next in uses.get(last).into_iter().flatten() {
            if next == from {
                return Some(path.clone());
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_two_modules_use_each_other_around_a_loop() {
    let uses = uses();
    assert!(uses.len() >= 15, "{uses:?}");
    let loops: Vec<String> =
        uses.keys().filter_map(|m| loop_through(&uses, m)).map(|l| format!("{} -> {}", l.join(" -> "), l[0])).collect();
    assert!(loops.is_empty(), "import loops between the filter's modules:\n{}", loops.join("\n"));
}

#[test]
fn policy_uses_nothing_above_it() {
    let uses = uses();
    let policy = &uses["policy"];
    let allowed: BTreeSet<String> = ["codes"].iter().map(|s| s.to_string()).collect();
    assert!(policy.is_subset(&allowed), "policy uses {:?}; it may use only {allowed:?}", policy);
}
