//! ## What it checks
//!
//! An idem-lint directive that idem-lint does not understand, and would otherwise ignore
//! silently:
//!
//! - a code in `x-idem-lint-ignore` (on the root, `paths`, a path item or an operation, and
//!   for a webhook or callback the nodes above it: `webhooks`, the callback object) that is no
//!   rule's code (`*` and `all` are fine);
//! - a field of `x-idempotency` other than `idempotent`, `key`, `duplicate`, `expiry` and
//!   `delivery` (and the policy fields `idem-lint policies` writes).
//!
//! Like unknown keys in `idem-lint.toml`, but a warning: the spec is still linted.
//!
//! ## Why
//!
//! A typo'd code (`IDEM08`) suppresses nothing, so the finding it was meant to silence keeps
//! failing the build for no visible reason — or, worse, the author believes a rule is off when
//! it is not. A typo'd `x-idempotency` field (`idempotant`, `expires`) is read as missing, and
//! the statement says less than its author wrote.
//!
//! ## Example
//!
//! ```text
//! post:
//!   x-idem-lint-ignore: [IDEM08]
//!   x-idempotency:
//!     idempotent: true
//!     key: { in: header, name: Idempotency-Key }
//!     ttl: 24h
//! ```
//!
//! ## Fix
//!
//! Use a code listed by `idem-lint rules`, and the field names of `x-idempotency`:
//!
//! ```text
//! post:
//!   x-idem-lint-ignore: [IDEM008]
//!   x-idempotency:
//!     idempotent: true
//!     key: { in: header, name: Idempotency-Key }
//!     expiry: 24h
//! ```

use super::{Ctx, RawFinding, Rule, Severity};
use crate::node::{Node, Value};
use crate::statement::Loc;

/// IDEM010 unknown-directive: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM010",
    name: "unknown-directive",
    severity: Severity::Warning,
    summary: "unknown rule code in `x-idem-lint-ignore`, or unknown field in `x-idempotency`",
    source: include_str!("idem010_unknown_directive.rs"),
    check: super::Check::Operation(check),
};

/// The statement's fields of `x-idempotency` ([`crate::statement::EXTENSION_FIELDS`]); the policy
/// fields `idem-lint policies` writes (`crate::generate::POLICY_FIELDS`) are known too.
use crate::statement::EXTENSION_FIELDS;

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let op = ctx.op;
    // The nodes `x-idem-lint-ignore` is read from (`Operation::ancestors`: root, `paths`, path
    // item, operation) with their pointers. Findings on shared nodes repeat for every
    // operation; `lint_workspace` keeps one.
    for (at, base) in op.ancestors.iter().zip(op.ancestor_pointers.iter().map(String::as_str)) {
        let Some(entry) = at.node.entry("x-idem-lint-ignore") else {
            continue;
        };
        let pointer = format!("{base}/x-idem-lint-ignore");
        let items: Vec<(usize, &Node)> = match &entry.value.value {
            Value::Seq(items) => items.iter().enumerate().collect(),
            _ => vec![(0, &entry.value)],
        };
        let is_seq = matches!(entry.value.value, Value::Seq(_));
        for (i, n) in items {
            let known = match n.as_str() {
                Some(c) => c == "*" || c.eq_ignore_ascii_case("all") || super::find(c).is_some(),
                None => false,
            };
            if known {
                continue;
            }
            let text = n.scalar_text().unwrap_or_else(|| "?".into());
            let loc = Loc {
                file: at.file,
                offset: n.start,
                pointer: if is_seq { format!("{pointer}/{i}") } else { pointer.clone() },
            };
            out.push(ctx.at(
                &RULE,
                &loc,
                format!("x-idem-lint-ignore names {text:?}, which is no rule's code: it suppresses nothing (see `idem-lint rules`)"),
            ));
        }
    }
    if let Some(entry) = op.at.node.entry("x-idempotency") {
        for e in entry.value.as_map().into_iter().flatten() {
            if EXTENSION_FIELDS.contains(&e.key.as_str()) || crate::generate::POLICY_FIELDS.contains(&e.key.as_str()) {
                continue;
            }
            let loc = Loc {
                file: op.at.file,
                offset: e.key_start,
                pointer: format!("{}/x-idempotency{}", op.pointer, crate::node::pointer([e.key.as_str()])),
            };
            out.push(ctx.at(
                &RULE,
                &loc,
                format!(
                    "{} has an unknown field \"{}\" in x-idempotency, which is ignored (known fields: {})",
                    ctx.label(),
                    e.key,
                    EXTENSION_FIELDS.join(", ")
                ),
            ));
        }
    }
}
