#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::string_slice)]
//! The error table (`idem_filter::codes`) is the one place the gateway's answers come from: the
//! docs' guarantee table says what it says, every answer rendered (HTTP, problem+json, gRPC)
//! carries its status, title and gRPC code, and no code is spelt anywhere else in the filter.

mod common;

use idem_filter::answers::Answers;
use idem_filter::codes::ErrorCode;

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The rows of policies/README.md's "What a client gets": (status cell, code cell).
fn guarantee_table() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo().join("policies/README.md")).unwrap();
    let at = text.find("## What a client gets").expect("policies/README.md: no \"## What a client gets\"");
    let section = &text[at..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            (cells[cells.len() - 2].to_string(), cells[cells.len() - 1].to_string())
        })
        .collect()
}

#[test]
fn the_docs_guarantee_table_says_what_the_error_table_says() {
    let rows = guarantee_table();
    assert!(rows.len() >= 15, "{rows:?}");
    for code in ErrorCode::ALL {
        if code == ErrorCode::ReplayGone {
            continue; // the echo listener's internal answer, never a client's
        }
        let quoted = format!("`{}`", code.as_str());
        let mine: Vec<&(String, String)> = rows.iter().filter(|(_, c)| c.starts_with(&quoted)).collect();
        assert!(!mine.is_empty(), "policies/README.md's guarantee table has no row for {}", code.as_str());
        for (status, cell) in mine {
            // A protocol that fixes its own status for a code says so in the row.
            let route_dependent = cell.contains("depends on the route");
            assert!(
                status.starts_with(&code.status().to_string()) || route_dependent,
                "policies/README.md says {} for {}; the error table says {}",
                status,
                code.as_str(),
                code.status()
            );
        }
    }
    // And every code the docs table names is one of the gateway's (or a route's own duplicate).
    for (_, cell) in &rows {
        if let Some(code) = cell.strip_prefix('`').and_then(|c| c.split('`').next()) {
            assert!(
                ErrorCode::parse(code).is_some(),
                "policies/README.md names {code}, which the filter never answers"
            );
        }
    }
}

#[test]
fn every_answer_carries_the_tables_status_title_and_grpc_code() {
    let problem: Answers = toml::from_str("format = \"problem\"").unwrap();
    for code in ErrorCode::ALL.into_iter().filter(|c| c.shaped()) {
        let reply = idem_filter::replies::error(&Answers::default(), code, "m");
        assert_eq!(reply.status, code.status(), "{code:?}");
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["code"], code.as_str());
        let reply = idem_filter::replies::error(&problem, code, "m");
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(
            (body["title"].as_str(), body["status"].as_u64()),
            (Some(code.title()), Some(u64::from(code.status())))
        );
        let grpc = idem_filter::replies::error(&Answers::default(), code, "m").for_grpc();
        assert_eq!(grpc.grpc_status, Some(code.grpc()), "{code:?}");
        assert_eq!(
            grpc.headers.iter().any(|(n, _)| n == "grpc-retry-pushback-ms"),
            code.retryable(),
            "{code:?}: a retry pushback exactly for the retryable answers"
        );
    }
    for code in ErrorCode::ALL.into_iter().filter(|c| !c.shaped()) {
        let reply = idem_filter::replies::plain_error(code, "m");
        assert_eq!(reply.status, code.status());
        let body: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["code"], code.as_str());
    }
}

/// No code is spelt outside the table: a typo at a call site cannot fall through to a default.
#[test]
fn no_code_is_spelt_outside_the_table() {
    let mut offenders = Vec::new();
    for (rel, code) in common::filter_sources() {
        if rel == "codes.rs" {
            continue;
        }
        for (n, line) in code.lines().enumerate() {
            let spelt = ErrorCode::ALL.iter().any(|c| line.contains(&format!("\"{}\"", c.as_str())));
            if spelt && !line.trim_start().starts_with("//") {
                offenders.push(format!("filter/src/{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    // The admin listener's API has its own codes (`METHOD_NOT_ALLOWED` among them).
    offenders.retain(|o| !o.contains("lifecycle/admin.rs"));
    assert!(offenders.is_empty(), "codes spelt outside filter/src/codes.rs:\n{}", offenders.join("\n"));
}
