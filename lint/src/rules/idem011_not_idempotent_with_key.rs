//! ## What it checks
//!
//! One statement — the 幂等性说明 section, or `x-idempotency` — says the operation is **not**
//! idempotent (否, 不支持, no) yet names an idempotency key or a duplicate response code itself.
//! When the two statements disagree with each other (one says no, the other names a key), that is
//! IDEM009's finding, not this one.
//!
//! ## Why
//!
//! One of the two is wrong, and a reader cannot tell which. If a repeat with the same key really
//! gets the duplicate answer, the operation *is* idempotent and the gateway (or the service) must
//! keep that promise; if it is not, the key and the duplicate code describe behaviour that does not
//! exist, and client developers will build retries on it.
//!
//! ## Example
//!
//! ```text
//! ### 幂等性说明
//! - 是否幂等：否
//! - 幂等键：out_trade_no（body）
//! - 重复请求：409 DUPLICATE_REQUEST
//! ```
//!
//! ## Fix
//!
//! Say what happens. Idempotent by the key:
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：out_trade_no（body）
//! - 重复请求：409 DUPLICATE_REQUEST
//! ```
//!
//! or not idempotent, with no key and no duplicate (`- 幂等键：无`), every call creating anew.

use super::{Ctx, RawFinding, Rule, Severity};
use crate::statement::Statement;
use crate::value::Tri;

/// IDEM011 not-idempotent-with-key: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM011",
    name: "not-idempotent-with-key",
    severity: Severity::Warning,
    summary: "statement says not idempotent, yet names a key or a duplicate code",
    source: include_str!("idem011_not_idempotent_with_key.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    // Each statement on its own: a "no" in one and a key in the other is IDEM009's conflict.
    for st in [&ctx.statements.section, &ctx.statements.extension].into_iter().flatten() {
        check_one(ctx, st, out);
    }
}

fn check_one(ctx: &Ctx<'_>, st: &Statement, out: &mut Vec<RawFinding>) {
    let Some(idem) = st.idempotent.as_ref().filter(|f| f.value == Tri::No) else {
        return;
    };
    let key = st.key.as_ref().map(|k| k.value.names().join(" + ")).filter(|n| !n.is_empty());
    let code = st.duplicate.as_ref().and_then(|d| d.value.code.clone());
    let named = match (&key, &code) {
        (Some(k), Some(c)) => format!("the key \"{k}\" and the duplicate code {c}"),
        (Some(k), None) => format!("the key \"{k}\""),
        (None, Some(c)) => format!("the duplicate code {c}"),
        (None, None) => return,
    };
    out.push(ctx.at(
        &RULE,
        &idem.loc,
        format!(
            "{} says {} is not idempotent, yet names {named}: either a repeat is recognised (then it is idempotent) or \
             there is no key and no duplicate answer",
            st.describe(),
            ctx.label()
        ),
    ));
}
