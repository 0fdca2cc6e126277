//! ## What it checks
//!
//! A token-mode policy (`mode = "token"`) relies on the endpoint that issues tokens
//! (`token.issue_path`, served by the gateway itself with `POST`) and the request header that
//! carries the token (`token.header`). This rule reports
//!
//! - an issue path for which the spec has no `POST` operation;
//! - a protected operation that does not declare the token header as a `header` parameter
//!   (path-level and `$ref`'d parameters count; names compare case-insensitively).
//!
//! The finding points at the policy's `token.issue_path` or `token.header` (or the `[route.token]`
//! table or `mode` when the default applies); the related location is the operation.
//!
//! ## Why
//!
//! Clients can only learn both from the spec: without them they cannot discover how to get a
//! token or where to send it, and every protected request is rejected.
//!
//! ## Example
//!
//! ```text
//! [route.token]
//! header = "Idempotency-Token"
//! issue_path = "/api/idempotent/token"   # no POST /api/idempotent/token in the spec
//! ```
//!
//! ## Fix
//!
//! Document the issue endpoint (even though the gateway answers it) and the header:
//!
//! ```text
//! paths:
//!   /api/idempotent/token:
//!     post: { … }
//!   /api/form/submit:
//!     post:
//!       parameters:
//!         - { name: Idempotency-Token, in: header, required: true, schema: { type: string } }
//! ```

use super::cross::{same_shape, CrossFinding, PolicyCtx};
use super::{Rule, Severity};
use idem_filter::policy::Mode;

/// IDEM105 token-undocumented: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM105",
    name: "token-undocumented",
    severity: Severity::Error,
    summary: "token policy whose issue endpoint or token header the spec does not document",
    source: include_str!("idem105_token_undocumented.rs"),
    check: super::Check::Policies(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        if route.mode != Mode::Token {
            continue;
        }
        let s = ctx.spans(ri);
        let issue = &route.token.issue_path;
        let documented = ctx.ops.iter().any(|o| o.op.method == "post" && same_shape(issue, o.op.path));
        if !documented {
            out.push(CrossFinding {
                code: RULE.code,
                primary: ctx.policy_place(ri, &[(&s.token_issue_path, "token/issue_path"), (&s.token, "token"), (&s.mode, "mode")]),
                message: format!(
                    "policy {:?} issues tokens at POST {issue}, but {} has no POST {issue} operation: document the token endpoint",
                    route.name,
                    ctx.spec_names()
                ),
                related: matched.iter().map(|&oi| (ctx.op_place(oi), format!("the operation {:?} protects", route.name))).collect(),
                op: None,
            });
        }
        let header = &route.token.header;
        for &oi in matched {
            let op = &ctx.ops[oi];
            let declared = op.op.params.iter().any(|p| p.location == "header" && p.name.eq_ignore_ascii_case(header));
            if !declared {
                out.push(CrossFinding {
                    code: RULE.code,
                    primary: ctx.policy_place(ri, &[(&s.token_header, "token/header"), (&s.token, "token"), (&s.mode, "mode")]),
                    message: format!(
                        "policy {:?} requires the token in the {header} header, but {} declares no {header} header parameter",
                        route.name,
                        op.label()
                    ),
                    related: vec![(ctx.op_place(oi), format!("{} (its parameters)", op.label()))],
                    op: Some(oi),
                });
            }
        }
    }
}
