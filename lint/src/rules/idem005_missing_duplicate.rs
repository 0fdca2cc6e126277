//! IDEM005 missing-duplicate (error)
//!
//! The operation is declared idempotent, but the statement does not say what a repeat gets
//! back. Callers must be able to tell "already done" from "failed": name the status and, ideally,
//! the stable business code of the duplicate answer — `409 DUPLICATE_REQUEST` when a repeat is
//! rejected, or `200 SUCCESS` when the first result is replayed (payment callbacks).
//!
//! Bad:
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! ```
//!
//! Good:
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! - 重复请求：409 DUPLICATE_REQUEST
//! ```
//!
//! A code without a status (`重复请求：DUPLICATE_REQUEST`) is reported too.

use super::{Ctx, RawFinding};
use crate::section::Tri;

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(st) = ctx.merged else {
        return;
    };
    if !matches!(st.idempotent.as_ref().map(|f| &f.value), Some(Tri::Yes)) {
        return;
    }
    match &st.duplicate {
        None => out.push(ctx.at(
            "IDEM005",
            &st.loc,
            format!(
                "{} is declared idempotent but {} does not name the duplicate response ({})",
                ctx.label(),
                st.describe(),
                st.hint("duplicate")
            ),
        )),
        Some(f) if f.value.status.is_none() && f.value.class.is_none() => out.push(ctx.at(
            "IDEM005",
            &f.loc,
            format!("the duplicate response of {} (\"{}\") names no HTTP status", ctx.label(), f.raw),
        )),
        Some(_) => {}
    }
}
