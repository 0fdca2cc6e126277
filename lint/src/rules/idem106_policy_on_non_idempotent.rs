//! ## What it checks
//!
//! A policy route enforces idempotency (`mode = "key"`, `"token"`, or `"shadow"`, which evaluates
//! as key mode) on an operation whose 幂等性说明 says it is *not* idempotent (`是否幂等：否`,
//! `idempotent: false`). The finding points at the policy's `mode` (or the route's name when the
//! default `key` applies); the related location is the spec's "idempotent" field.
//!
//! ## Why
//!
//! Either the spec is out of date, or the gateway now rejects or replays repeats of an operation
//! callers expect to run every time (issuing a new token, appending a log entry).
//!
//! ## Example
//!
//! ```text
//! # spec: - 是否幂等：否
//! [[route]]
//! name = "issue-token"
//! match = { method = "POST", path = "/api/idempotent/token" }
//! mode = "key"
//! ```
//!
//! ## Fix
//!
//! Remove the policy from that operation, or — if the operation really is idempotent — correct the
//! statement to `是否幂等：是` with its key and duplicate response.

use super::cross::{CrossFinding, Place, PolicyCtx};
use super::{Rule, Severity};
use crate::value::Tri;
use idem_filter::policy::Mode;

/// IDEM106 policy-on-non-idempotent: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM106",
    name: "policy-on-non-idempotent",
    severity: Severity::Error,
    summary: "policy enforces idempotency on an operation the spec says is not idempotent",
    source: include_str!("idem106_policy_on_non_idempotent.rs"),
    check: super::Check::Policies(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        let s = ctx.spans(ri);
        let mode = match route.mode {
            Mode::Key => "key",
            Mode::Token => "token",
            Mode::Shadow => "shadow",
        };
        for &oi in matched {
            let op = &ctx.ops[oi];
            if op.idempotent() != Some(&Tri::No) {
                continue;
            }
            let Some(st) = &op.statement else { continue };
            let Some(field) = &st.idempotent else { continue };
            out.push(CrossFinding {
                code: RULE.code,
                primary: ctx.policy_place(ri, &[(&s.mode, "mode")]),
                message: format!(
                    "policy {:?} enforces idempotency (mode = {mode:?}) on {}, which the spec says is not idempotent",
                    route.name,
                    op.label()
                ),
                related: vec![(
                    Place::Spec { ws: op.ws, loc: field.loc.clone() },
                    format!("{} of {}: not idempotent", st.origin.describe(), op.label()),
                )],
                op: Some(oi),
            });
        }
    }
}
