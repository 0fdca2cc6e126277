//! ## What it checks
//!
//! The idempotency key is unstable or too coarse:
//!
//! - a user id alone (`user_id`, `uid`, `member_id`, `customer_id`, `account_id`);
//! - a timestamp (`timestamp`, `ts`, `time`, `created_at`, `request_time`, and any name whose
//!   last word is time/date/timestamp/ts, ends in `_at`/`At`, or starts with `gmt_`:
//!   `notify_time`, `reqTime`, `createDate`, `gmt_create`);
//! - a signature (`sign`, `signature`, `x-signature`);
//! - a whole-body hash (`body_hash`, `request_hash`, `md5`, `sha256`, `digest`).
//!
//! A header that Envoy, a tracer or a proxy writes (`X-Request-Id`, `traceparent`, …) is worse:
//! the gateway refuses it, and IDEM012 reports it as an error.
//!
//! A user id as one part of a composite key (`user_id + order_no`) is fine.
//!
//! ## Why
//!
//! With a user id alone every request of that user becomes "the same request", so the second
//! legitimate order is rejected. A retry sent a second later carries a different timestamp, and a
//! signature is computed per request over a timestamp or nonce, so neither recognises a repeat.
//! With a body hash two deliberate, identical purchases collide, and a retry whose JSON is
//! re-serialised does not.
//!
//! ## Example
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：user_id（body）
//! ```
//!
//! ## Fix
//!
//! Use a client-generated unique key (`Idempotency-Key`), a token, or a business number that
//! identifies exactly one intended action (order number, the provider's transaction id):
//!
//! ```text
//! - 幂等键：user_id + order_no（body）
//! ```
//!
//! Suppress on purpose with `x-idem-lint-ignore: [IDEM008]` on the operation.

use super::{Ctx, RawFinding, Rule, Severity};

/// The words of a name: `notify_time` / `reqTime` / `X-Request-Time` → `[notify, time]` …
/// IDEM008 unstable-key: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM008",
    name: "unstable-key",
    severity: Severity::Warning,
    summary: "unstable or too-coarse key (user id alone, timestamp, signature, whole-body hash)",
    source: include_str!("idem008_unstable_key.rs"),
    check: super::Check::Operation(check),
};

fn words(name: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in name.chars() {
        if !c.is_alphanumeric() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        cur.extend(c.to_lowercase());
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

const TIMESTAMP: &str = "a timestamp changes between a request and its retry";

fn classify(name: &str) -> Option<&'static str> {
    let last = name.rsplit('/').next().unwrap_or(name);
    let n: String = last.chars().filter(|c| c.is_alphanumeric()).flat_map(char::to_lowercase).collect();
    let w = words(last);
    let last_word = w.last().map(String::as_str).unwrap_or("");
    match n.as_str() {
        "userid" | "uid" | "memberid" | "customerid" | "accountid" | "user" | "openid" => {
            return Some("a user id alone makes every request of that user look like a duplicate")
        }
        "timestamp" | "ts" | "time" | "datetime" | "createdat" | "createtime" | "requesttime" | "requestedat"
        | "now" | "xtimestamp" | "xrequesttime" => return Some(TIMESTAMP),
        "bodyhash" | "requesthash" | "payloadhash" | "hash" | "md5" | "bodymd5" | "contentmd5" | "sha1" | "sha256"
        | "digest" | "contentdigest" | "requestdigest" => {
            return Some("a whole-body hash merges two deliberate identical requests and misses re-serialised retries")
        }
        "sign" | "sig" | "signature" | "xsign" | "xsignature" | "requestsignature" => {
            return Some(
                "a signature is computed per request (over a timestamp or nonce), so a retry carries a different one",
            )
        }
        _ => {}
    }
    let timestamp = matches!(last_word, "time" | "date" | "timestamp" | "ts" | "datetime")
        || (last_word == "at" && w.len() > 1)
        || (w.first().is_some_and(|f| f == "gmt") && w.len() > 1);
    timestamp.then_some(TIMESTAMP)
}

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(st) = ctx.merged else {
        return;
    };
    let Some(key) = &st.key else {
        return;
    };
    let composite = key.value.parts.len() > 1;
    for part in &key.value.parts {
        let name = &part.name;
        let Some(why) = classify(name) else {
            continue;
        };
        // A user id is fine as one part of a composite key.
        if composite && why.starts_with("a user id") {
            continue;
        }
        out.push(ctx.at(
            &RULE,
            &key.loc,
            format!("unstable or too-coarse idempotency key \"{name}\" for {}: {why}", ctx.label()),
        ));
    }
}
