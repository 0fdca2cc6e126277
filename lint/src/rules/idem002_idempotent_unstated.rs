//! IDEM002 idempotent-unstated (error)
//!
//! The statement exists but does not say whether the operation is idempotent, or says it in
//! a way that cannot be read as yes or no. Everything else in the statement (the key, the
//! duplicate response) only makes sense once that is settled.
//!
//! Bad:
//!
//! ```text
//! ### 幂等性说明
//! - 幂等键：Idempotency-Key（header）
//! ```
//!
//! Good:
//!
//! ```text
//! ### 幂等性说明
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! ```
//!
//! Accepted values: 是 / 否, 支持 / 不支持, yes / no, true / false (x-idempotency:
//! `idempotent: true`). Hints are in the section's language: an English section
//! (`**Idempotency**`) gets `Idempotent: yes`.

use super::{Ctx, RawFinding};
use crate::section::Tri;

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(st) = ctx.merged else {
        return;
    };
    match &st.idempotent {
        None => out.push(ctx.at(
            "IDEM002",
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
                    "IDEM002",
                    &f.loc,
                    format!("cannot tell whether {} is idempotent from \"{raw}\"; write {}", ctx.label(), st.yes_no()),
                ));
            }
        }
    }
}
