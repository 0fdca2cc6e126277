//! ## What it checks
//!
//! The operation carries both a 幂等性说明 section and `x-idempotency`, and they disagree on
//! whether it is idempotent, on the key (names, compared case-insensitively, and location), on
//! the duplicate status or code, or on the expiry (`24h` and `24 小时` agree). Fields only one of
//! them states are not a disagreement. The finding points at the `x-idempotency` field.
//!
//! ## Why
//!
//! Tools read `x-idempotency`, people read the description: when they differ, one audience is
//! misled.
//!
//! ## Example
//!
//! ```text
//! description: |
//!   ### 幂等性说明
//!   - 是否幂等：是
//!   - 幂等键：Idempotency-Key（header）
//! x-idempotency:
//!   idempotent: true
//!   key: { in: header, name: X-Request-Id }
//! ```
//!
//! ## Fix
//!
//! Make both say the same thing, or keep only one of them:
//!
//! ```text
//! x-idempotency:
//!   idempotent: true
//!   key: { in: header, name: Idempotency-Key }
//! ```

use super::{Ctx, RawFinding, Rule, Severity};
use crate::value::{duration_secs, KeyIn, KeySpec, Tri};

/// IDEM009 statements-disagree: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM009",
    name: "statements-disagree",
    severity: Severity::Error,
    summary: "description section and `x-idempotency` disagree (idempotent, key, duplicate, expiry)",
    source: include_str!("idem009_statements_disagree.rs"),
    check: super::Check::Operation(check),
};

/// The same parts in any order; a part's location counts when both statements give one.
fn same_key(a: &KeySpec, b: &KeySpec) -> bool {
    let sorted = |k: &KeySpec| {
        let mut v: Vec<(String, Option<KeyIn>)> =
            k.parts.iter().map(|p| (p.name.to_lowercase(), p.location.clone())).collect();
        v.sort_by(|x, y| x.0.cmp(&y.0));
        v
    };
    let (a, b) = (sorted(a), sorted(b));
    a.len() == b.len()
        && a.iter().zip(&b).all(|((n, x), (m, y))| {
            n == m
                && match (x, y) {
                    (Some(x), Some(y)) => x == y,
                    _ => true,
                }
        })
}

fn same_expiry(a: &str, b: &str) -> bool {
    match (duration_secs(a), duration_secs(b)) {
        (Some(x), Some(y)) => x == y,
        _ => {
            let n =
                |s: &str| -> String { s.chars().filter(|c| !c.is_whitespace()).flat_map(char::to_lowercase).collect() };
            n(a) == n(b)
        }
    }
}

fn tri(t: &Tri) -> &str {
    match t {
        Tri::Yes => "idempotent",
        Tri::No => "not idempotent",
        Tri::Unknown(s) => s,
    }
}

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let (Some(sec), Some(ext)) = (&ctx.statements.section, &ctx.statements.extension) else {
        return;
    };
    let label = ctx.label();
    if let (Some(a), Some(b)) = (&sec.idempotent, &ext.idempotent) {
        if a.value != b.value {
            out.push(ctx.at(
                &RULE,
                &b.loc,
                format!(
                    "x-idempotency says {label} is {} but the 幂等性说明 section says {}",
                    tri(&b.value),
                    tri(&a.value)
                ),
            ));
        }
    }
    if let (Some(a), Some(b)) = (&sec.key, &ext.key) {
        if !same_key(&a.value, &b.value) {
            out.push(ctx.at(
                &RULE,
                &b.loc,
                format!(
                    "x-idempotency names the key of {label} {} but the 幂等性说明 section names {}",
                    b.value.text(),
                    a.value.text()
                ),
            ));
        }
    }
    if let (Some(a), Some(b)) = (&sec.duplicate, &ext.duplicate) {
        let status_differs = matches!((a.value.status, b.value.status), (Some(x), Some(y)) if x != y);
        let code_differs = matches!((&a.value.code, &b.value.code), (Some(x), Some(y)) if x != y);
        if status_differs || code_differs {
            let show = |s: Option<u16>, c: &Option<String>| {
                format!("{} {}", s.map_or("?".to_string(), |v| v.to_string()), c.as_deref().unwrap_or(""))
                    .trim()
                    .to_string()
            };
            out.push(ctx.at(
                &RULE,
                &b.loc,
                format!(
                    "x-idempotency answers a duplicate of {label} with {} but the 幂等性说明 section says {}",
                    show(b.value.status, &b.value.code),
                    show(a.value.status, &a.value.code)
                ),
            ));
        }
    }
    if let (Some(a), Some(b)) = (&sec.expiry, &ext.expiry) {
        if !same_expiry(&a.value, &b.value) {
            out.push(ctx.at(
                &RULE,
                &b.loc,
                format!(
                    "x-idempotency gives {label} an expiry of {} but the 幂等性说明 section says {}",
                    b.value, a.value
                ),
            ));
        }
    }
}
