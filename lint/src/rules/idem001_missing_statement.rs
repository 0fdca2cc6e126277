//! ## What it checks
//!
//! A non-safe operation (POST, PUT, PATCH, DELETE by default; `methods` in idem-lint.toml) has
//! no 幂等性说明 (idempotency statement): neither a section of its Markdown description nor an
//! `x-idempotency` extension. An operation that is deliberately not idempotent still needs one
//! (`是否幂等：否`).
//!
//! The section may have any heading level, be a bold line, or a plain `幂等性说明：` line directly
//! followed by list items; `Idempotency` / `Idempotent` / `Key` / `Duplicate` / `Expiry` in
//! English; `:` or `：`, `()` or `（）`. The finding points at the operation's method key. When the
//! description has a line that names the section but is not a title (`幂等性说明：` followed by
//! prose, `#幂等性说明`), the message quotes it.
//!
//! ## Why
//!
//! Clients, SDKs and gateways retry. Without a statement nobody knows whether a retry creates a
//! second order or charges a card twice.
//!
//! ## Example
//!
//! ```text
//! post:
//!   summary: 创建订单
//!   description: 创建一个新订单。
//! ```
//!
//! ## Fix
//!
//! Write the statement as a section of the description:
//!
//! ```text
//! ### 幂等性说明
//! - 是否幂等：是
//! - 幂等键：Idempotency-Key（header）
//! - 重复请求：409 DUPLICATE_REQUEST
//! - 有效期：24h
//! ```
//!
//! or as the structured extension:
//!
//! ```text
//! x-idempotency:
//!   idempotent: true
//!   key: { in: header, name: Idempotency-Key }
//!   duplicate: { status: 409, code: DUPLICATE_REQUEST }
//!   expiry: 24h
//! ```

use super::{Ctx, RawFinding, Rule, Severity};
use crate::statement::Loc;

/// IDEM001 missing-statement: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM001",
    name: "missing-statement",
    severity: Severity::Error,
    summary: "non-safe operation without a 幂等性说明",
    source: include_str!("idem001_missing_statement.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    if ctx.statements.section.is_some() || ctx.statements.extension.is_some() {
        return;
    }
    let loc = Loc { file: ctx.op.key_file, offset: ctx.op.key_offset, pointer: ctx.op.pointer.clone() };
    let message = match &ctx.statements.unrecognised_title {
        Some(line) => format!(
            "{} has no 幂等性说明 (idempotency statement): the line \"{line}\" was seen but not recognised as a section title; write it as a heading (`### 幂等性说明`) or as `幂等性说明：` directly followed by list items (`- 是否幂等：是`)",
            ctx.label()
        ),
        None => format!(
            "{} has no 幂等性说明 (idempotency statement): add a `### 幂等性说明` section to its description or an `x-idempotency` extension",
            ctx.label()
        ),
    };
    out.push(ctx.at(&RULE, &loc, message));
}
