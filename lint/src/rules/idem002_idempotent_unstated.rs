//! ## What it checks
//!
//! The statement exists but does not say whether the operation is idempotent, or says it in a way
//! that cannot be read as yes or no. Accepted values: 是 / 否, 支持 / 不支持, yes / no, true / false
//! (x-idempotency: `idempotent: true`).
//!
//! ## Why
//!
//! Everything else in the statement (the key, the duplicate response) only makes sense once that
//! is settled; a reader cannot tell a missing answer from a "no".
//!
//! ## Example
//!
//! ```text
//! ### 幂等性说明
//! - 幂等键：Idempotency-Key（header）
//! ```
//!
//! ## Fix
//!
//! Say it, in the section's language (an English section, `**Idempotency**`, takes
//! `Idempotent: yes`):
//!
//! ```text
//! ### 幂等性说明
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! ```

use super::{Ctx, RawFinding, Rule, Severity};
use crate::value::Tri;

/// IDEM002 idempotent-unstated: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM002",
    name: "idempotent-unstated",
    severity: Severity::Error,
    summary: "statement does not say whether the operation is idempotent (or says it unreadably)",
    source: include_str!("idem002_idempotent_unstated.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(st) = ctx.merged else {
        return;
    };
    match &st.idempotent {
        None => out.push(ctx.at(
            &RULE,
            &st.loc,
            format!(
                "{} of {} does not say whether the operation is idempotent ({})",
                st.describe(),
                ctx.label(),
                st.hint("idempotent")
            ),
        )),
        Some(f) => {
            if let Tri::Unknown(raw) = &f.value {
                out.push(ctx.at(
                    &RULE,
                    &f.loc,
                    format!("cannot tell whether {} is idempotent from \"{raw}\"; write {}", ctx.label(), st.yes_no()),
                ));
            }
        }
    }
}
