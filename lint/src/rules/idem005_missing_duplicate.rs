//! ## What it checks
//!
//! The operation is declared idempotent, but the statement does not say what a repeat gets back,
//! or names a code without a status (`重复请求：DUPLICATE_REQUEST`).
//!
//! ## Why
//!
//! Callers must be able to tell "already done" from "failed". Without a documented duplicate
//! answer they treat a rejected repeat as an error, or a replayed one as a new result.
//!
//! ## Example
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! ```
//!
//! ## Fix
//!
//! Name the status and, ideally, the stable business code of the duplicate answer —
//! `409 DUPLICATE_REQUEST` when a repeat is rejected, or `200 SUCCESS` when the first result is
//! replayed (payment callbacks):
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! - 重复请求：409 DUPLICATE_REQUEST
//! ```

use super::{Ctx, RawFinding, Rule, Severity};
use crate::value::Tri;

/// IDEM005 missing-duplicate: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM005",
    name: "missing-duplicate",
    severity: Severity::Error,
    summary: "idempotent, but no duplicate response named, or one without a status",
    source: include_str!("idem005_missing_duplicate.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(st) = ctx.merged else {
        return;
    };
    if !matches!(st.idempotent.as_ref().map(|f| &f.value), Some(Tri::Yes)) {
        return;
    }
    match &st.duplicate {
        None => out.push(ctx.at(
            &RULE,
            &st.loc,
            format!(
                "{} is declared idempotent but {} does not name the duplicate response ({})",
                ctx.label(),
                st.describe(),
                st.hint("duplicate")
            ),
        )),
        Some(f) if f.value.status.is_none() && f.value.class.is_none() => out.push(ctx.at(
            &RULE,
            &f.loc,
            format!(
                "the duplicate response of {} (\"{}\") names no HTTP status: {}",
                ctx.label(),
                f.raw,
                st.hint("duplicate").replacen("add e.g.", "write the status before the code, e.g.", 1)
            ),
        )),
        Some(_) => {}
    }
}
