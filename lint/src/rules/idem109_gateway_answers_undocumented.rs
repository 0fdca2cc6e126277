//! ## What it checks
//!
//! A key-mode policy answers some requests itself, whatever the service would have said. This
//! rule lists the answers the gateway gives on an operation and reports those its `responses`
//! do not document — by status (the exact code, or its class such as `4XX`) and by the answer's
//! `code` named somewhere in that response (its description, an example):
//!
//! - `409 REQUEST_IN_PROGRESS`: a repeat while the first request runs;
//! - `409 IDEMPOTENCY_OUTCOME_UNKNOWN`: a repeat of a request that got no answer (it may have run);
//! - `422 IDEMPOTENCY_KEY_REUSED`: the key again with another request (when the policy has a
//!   `fingerprint`);
//! - `400 IDEMPOTENCY_KEY_MISSING`: no key (unless `required = false`);
//! - `400 IDEMPOTENCY_SCOPE_MISSING`: no caller identity (a `scope` with `anonymous = "reject"`).
//!
//! One finding per operation, on its `responses`; the related location is the policy.
//!
//! ## Why
//!
//! Clients and their SDKs handle what the spec documents. An undocumented 409 or 422 is treated as
//! a failure, or retried forever, or shown to a user; an undocumented unknown outcome is retried
//! with a new key — the double charge the gateway exists to prevent.
//!
//! ## Example
//!
//! ```text
//! responses:
//!   '201': { description: created }
//!   '409': { description: DUPLICATE_REQUEST }     # REQUEST_IN_PROGRESS, IDEMPOTENCY_OUTCOME_UNKNOWN?
//! ```
//!
//! ## Fix
//!
//! Document each answer with its status and code. `idem-lint SPEC --policies DIR --fix` adds
//! the statuses that are missing altogether, naming the codes in the statement's language; a
//! status that is there without the code is the author's to complete:
//!
//! ```text
//! responses:
//!   '400': { description: "IDEMPOTENCY_KEY_MISSING / IDEMPOTENCY_SCOPE_MISSING" }
//!   '409': { description: "DUPLICATE_REQUEST / REQUEST_IN_PROGRESS (retry) / IDEMPOTENCY_OUTCOME_UNKNOWN (check before a new key)" }
//!   '422': { description: IDEMPOTENCY_KEY_REUSED }
//! ```

use super::cross::{CrossFinding, Place, PolicyCtx};
use super::{Rule, Severity};
use crate::loader::{At, Workspace};
use crate::node::{Node, Value};
use crate::statement::Loc;
use idem_filter::policy::{Anonymous, Mode, RoutePolicy};

/// IDEM109 gateway-answers-undocumented: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM109",
    name: "gateway-answers-undocumented",
    severity: Severity::Warning,
    summary: "the gateway's own answers on an operation (409, 422, 400) its responses do not document",
    source: include_str!("idem109_gateway_answers_undocumented.rs"),
    check: super::Check::Policies(check),
};

/// The answers a key-mode policy gives itself on its operations: (status, code).
fn gateway_answers(r: &RoutePolicy) -> Vec<(u16, &'static str)> {
    use idem_filter::repeatability;
    let mut out = vec![(409, "REQUEST_IN_PROGRESS"), (409, "IDEMPOTENCY_OUTCOME_UNKNOWN")];
    let repeatable = repeatability::speaks(r);
    if !r.key.fingerprint.is_empty() {
        // OASIS Repeatable Requests answers a reused id with 400.
        out.push((if repeatable { repeatability::KEY_REUSED_STATUS } else { 422 }, "IDEMPOTENCY_KEY_REUSED"));
    }
    if repeatable {
        out.push((412, "REPEATABILITY_FIRST_SENT_OUTSIDE_WINDOW"));
    }
    if r.key.required {
        out.push((400, "IDEMPOTENCY_KEY_MISSING"));
    }
    if !r.key.scope.is_empty() && r.key.anonymous == Anonymous::Reject {
        out.push((400, "IDEMPOTENCY_SCOPE_MISSING"));
    }
    out
}

/// Every string scalar under `n` (descriptions, examples, enums).
fn texts<'a>(n: &'a Node, out: &mut Vec<&'a str>) {
    match &n.value {
        Value::String(s) => out.push(s),
        Value::Seq(items) => items.iter().for_each(|i| texts(i, out)),
        Value::Map(entries) => entries.iter().for_each(|e| texts(&e.value, out)),
        _ => {}
    }
}

/// Whether `responses` documents `status` with `code` named in that response.
fn documents(ws: &Workspace, responses: At<'_>, status: u16, code: &str) -> bool {
    let class = format!("{}XX", status / 100);
    let Some(entries) = responses.node.as_map() else {
        return false;
    };
    entries.iter().filter(|e| e.key == status.to_string() || e.key.eq_ignore_ascii_case(&class)).any(|e| {
        let at = At { file: responses.file, node: &e.value };
        let response = ws.resolve(at).unwrap_or(at);
        let mut found = Vec::new();
        texts(response.node, &mut found);
        found.iter().any(|t| t.contains(code))
    })
}

/// The gateway's answers on `op` (protected by `route`) that its `responses` do not document.
pub fn missing_answers(
    ws: &Workspace,
    op: &crate::model::Operation<'_>,
    route: &RoutePolicy,
) -> Vec<(u16, &'static str)> {
    if route.mode != Mode::Key {
        return Vec::new();
    }
    gateway_answers(route)
        .into_iter()
        .filter(|(status, code)| !op.responses.is_some_and(|r| documents(ws, r, *status, code)))
        .collect()
}

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        for &oi in matched {
            let op = &ctx.ops[oi];
            let ws = &ctx.workspaces[op.ws];
            let missing: Vec<String> =
                missing_answers(ws, &op.op, route).iter().map(|(status, code)| format!("{status} {code}")).collect();
            if missing.is_empty() {
                continue;
            }
            let primary = match op.op.responses {
                Some(r) => Place::Spec {
                    ws: op.ws,
                    loc: Loc { file: r.file, offset: r.node.start, pointer: format!("{}/responses", op.op.pointer) },
                },
                None => ctx.op_place(oi),
            };
            out.push(CrossFinding {
                code: RULE.code,
                primary,
                message: format!(
                    "{}: the gateway itself answers {} (policy {:?}), which its responses do not document: add \
                     each status with its code in the description, so clients handle them",
                    op.label(),
                    missing.join(", "),
                    route.name,
                ),
                related: vec![(ctx.policy_place(ri, &[]), format!("policy {:?}", route.name))],
                op: Some(oi),
            });
        }
    }
}
