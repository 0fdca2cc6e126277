//! ## What it checks
//!
//! The operation is declared idempotent, but the statement names no idempotency key, or names
//! `无` / `none`.
//!
//! ## Why
//!
//! A repeat can only be recognised by something the request carries: an `Idempotency-Key`
//! header, a token, a business number in the body (an order number, a payment provider's
//! transaction id), or the resource id in the path for a state transition. Without one, neither
//! the service nor the gateway can tell a retry from a new request.
//!
//! ## Example
//!
//! ```text
//! - 是否幂等：是
//! - 重复请求：409 DUPLICATE_REQUEST
//! ```
//!
//! ## Fix
//!
//! Name the key and where it is: header, query, path, body (a property name or a JSON pointer
//! such as `/transaction_id`). Several fields form a composite key:
//! `merchant_id + out_trade_no（body）`.
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! - 重复请求：409 DUPLICATE_REQUEST
//! ```

use super::{Ctx, RawFinding, Rule, Severity};
use crate::value::Tri;

/// IDEM003 missing-key: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM003",
    name: "missing-key",
    severity: Severity::Error,
    summary: "idempotent, but no key named (or `幂等键：无`)",
    source: include_str!("idem003_missing_key.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(st) = ctx.merged else {
        return;
    };
    if !matches!(st.idempotent.as_ref().map(|f| &f.value), Some(Tri::Yes)) {
        return;
    }
    match &st.key {
        None => out.push(ctx.at(
            &RULE,
            &st.loc,
            format!(
                "{} is declared idempotent but {} names no idempotency key ({})",
                ctx.label(),
                st.describe(),
                st.hint("key")
            ),
        )),
        Some(f) if f.value.is_none() => out.push(ctx.at(
            &RULE,
            &f.loc,
            format!(
                "{} is declared idempotent but its key is \"{}\": name the header, query/path parameter or body field that identifies a repeat",
                ctx.label(),
                f.raw
            ),
        )),
        Some(_) => {}
    }
}
