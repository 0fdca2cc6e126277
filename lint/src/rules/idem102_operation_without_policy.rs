//! ## What it checks
//!
//! The spec documents an operation as idempotent (`是否幂等：是`, `idempotent: true`), but no policy
//! route given to `--policies` matches it. Only checked with `--policies`.
//!
//! The finding points at the statement's "idempotent" field in the spec; policy routes on the same
//! path with another method are related locations (the likely counterpart).
//!
//! ## Why
//!
//! The 幂等性说明 promises something the gateway does not enforce: clients rely on repeats being
//! recognised, and they are not.
//!
//! ## Example
//!
//! ```text
//! /api/internal/transfers:
//!   post:
//!     x-idempotency: { idempotent: true, key: { in: header, name: Idempotency-Key }, … }
//! # and no policy file matches POST /api/internal/transfers
//! ```
//!
//! ## Fix
//!
//! Add a `[[route]]` whose `match` names the operation's method and path:
//!
//! ```text
//! # policies/internal-transfer.toml
//! [[route]]
//! name = "internal-transfer"
//! match = { method = "POST", path = "/api/internal/transfers" }
//! ```
//!
//! When the service itself guarantees the idempotency (a unique index, a state machine) and the
//! gateway is deliberately not involved, suppress the rule on that operation with
//! `x-idem-lint-ignore: [IDEM102]`.

use super::cross::{same_shape, CrossFinding, Place, PolicyCtx};
use super::{Rule, Severity};
use crate::value::Tri;
use idem_filter::policy::Matcher;

/// IDEM102 operation-without-policy: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM102",
    name: "operation-without-policy",
    severity: Severity::Error,
    summary: "operation documented as idempotent, but no policy route protects it",
    source: include_str!("idem102_operation_without_policy.rs"),
    check: super::Check::Policies(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (oi, op) in ctx.ops.iter().enumerate() {
        if op.idempotent() != Some(&Tri::Yes) {
            continue;
        }
        if ctx.matches.iter().any(|m| m.contains(&oi)) {
            continue;
        }
        let Some(st) = &op.statement else { continue };
        let loc = st.idempotent.as_ref().map_or_else(|| st.loc.clone(), |f| f.loc.clone());
        // Policy routes on the same path with another method: the likely counterpart.
        let related = (0..ctx.routes.len())
            .filter(|&ri| match &ctx.routes[ri].route.matcher {
                Matcher::Request { path, .. } => same_shape(&path.source, op.op.path),
                Matcher::RouteName(_) => false,
            })
            .map(|ri| {
                let s = ctx.spans(ri);
                let place = ctx.policy_place(ri, &[(&s.method, "match/method"), (&s.path, "match/path")]);
                (
                    place,
                    format!("policy {:?} is on {} (another method)", ctx.routes[ri].route.name, ctx.route_label(ri)),
                )
            })
            .collect();
        out.push(CrossFinding {
            code: RULE.code,
            primary: Place::Spec { ws: op.ws, loc },
            message: format!(
                "{} is documented as idempotent, but no policy in {} protects it: add a [[route]] with match = {{ method = \"{}\", path = \"{}\" }}",
                op.label(),
                ctx.policy_args.join(", "),
                op.op.method.to_ascii_uppercase(),
                op.op.path
            ),
            related,
            op: Some(oi),
        });
    }
}
