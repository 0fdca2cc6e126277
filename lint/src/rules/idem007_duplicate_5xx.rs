//! ## What it checks
//!
//! The statement answers a duplicate with a 5xx status. Full-width digits (`５００`) and a status
//! class (`5XX`, `5xx`) are read too.
//!
//! ## Why
//!
//! A repeat is an expected business outcome, not a system error: a 5xx tells clients and SDKs
//! "retry me", which turns one duplicate into a retry storm, and it pages the on-call engineer for
//! nothing. Monitoring that counts 5xx as errors will also report a healthy service as failing.
//!
//! ## Example
//!
//! ```text
//! - 重复请求：500 DUPLICATE_REQUEST
//! ```
//!
//! ## Fix
//!
//! `409 DUPLICATE_REQUEST` (reject the repeat), `200` with the first result replayed, or
//! `409 REQUEST_IN_PROGRESS` with `Retry-After` while the first attempt is still running:
//!
//! ```text
//! - 重复请求：409 DUPLICATE_REQUEST
//! ```

use super::{Ctx, RawFinding, Rule, Severity};

/// IDEM007 duplicate-5xx: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM007",
    name: "duplicate-5xx",
    severity: Severity::Error,
    summary: "duplicate answered with a 5xx",
    source: include_str!("idem007_duplicate_5xx.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(dup) = ctx.merged.and_then(|st| st.duplicate.as_ref()) else {
        return;
    };
    let status = match (dup.value.status, dup.value.class) {
        (Some(s), _) if (500..600).contains(&s) => s.to_string(),
        (None, Some(5)) => "5XX".to_string(),
        _ => return,
    };
    out.push(ctx.at(
        &RULE,
        &dup.loc,
        format!(
            "{} answers a duplicate with {status}: a duplicate is an expected outcome, use 409 (reject) or 200 (replay the first result), never a 5xx",
            ctx.label()
        ),
    ));
}
