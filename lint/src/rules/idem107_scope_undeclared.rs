//! ## What it checks
//!
//! A policy's `scope` names who the caller is, and every request must carry it: a request
//! without it is `400 IDEMPOTENCY_SCOPE_MISSING` (unless `anonymous = "shared"`). This rule
//! reports a scope part the operation it protects does not declare:
//!
//! - `header:<name>` (also inside `… ~ regex` and `sha256:…`) when the operation has neither a
//!   `header` parameter of that name nor a security scheme that sends it (an API key header;
//!   `Authorization` for HTTP basic and bearer, OAuth2 and OpenID Connect) — the default scope,
//!   `header:authorization`, included;
//! - `metadata:…` (a value an Envoy filter verified, such as jwt_authn's token subject) when the
//!   operation's security declares no token (HTTP bearer, OAuth2, OpenID Connect).
//!
//! The operation's security is its own `security`, else the document's; `security: []` declares
//! none. The finding points at the policy's `scope` (or its `[route.key]` table, or its name,
//! when the default applies); the related location is the operation.
//!
//! ## Why
//!
//! A provider's notification declares no security and sends no `Authorization`: a policy written
//! with the default scope answers its first delivery `400 IDEMPOTENCY_SCOPE_MISSING`, and the
//! provider retries until it gives up. The spec and the policy each looked right alone.
//!
//! ## Example
//!
//! ```text
//! # spec: POST /refunds/notify, security: [] (the provider signs its calls)
//! [route.key]
//! from = "body"
//! name = "/out_refund_no"            # scope: the default, header:authorization
//! ```
//!
//! ## Fix
//!
//! Scope on what identifies the operation's callers — `scope = []` for a provider's signed
//! deliveries, `scope = ["body:/mchid"]` for an account the body names — or declare the security
//! (or the header) the callers really send. `idem-lint policies` writes the scope from the
//! operation's security.

use super::cross::{route_scope, CrossFinding, PolicyCtx};
use super::{Rule, Severity};
use crate::security::{caller, Caller};
use idem_filter::policy::Source;

/// IDEM107 scope-undeclared: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM107",
    name: "scope-undeclared",
    severity: Severity::Error,
    summary: "policy scope (header or verified credential) the operation does not declare",
    source: include_str!("idem107_scope_undeclared.rs"),
    check: super::Check::Policies(check),
};

/// The header a scope part reads, if it reads one.
pub(super) fn scope_header(s: &Source) -> Option<String> {
    match s {
        Source::Header(h) => Some(h.to_ascii_lowercase()),
        Source::Capture(inner, _) | Source::Digest(inner) => scope_header(inner),
        _ => None,
    }
}

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        let scope = route_scope(route);
        let s = ctx.spans(ri);
        for &oi in matched {
            let op = &ctx.ops[oi];
            let who = caller(&ctx.workspaces[op.ws], &op.op);
            for part in scope {
                let missing = match part {
                    Source::Metadata(_) if !matches!(who, Caller::Token(_)) => Some(format!(
                        "a credential an Envoy filter verified ({}), but {} declares no token in its security \
                         (HTTP bearer, OAuth2, OpenID Connect)",
                        source_text(part),
                        op.label()
                    )),
                    _ => scope_header(part)
                        .filter(|h| {
                            let param =
                                op.op.params.iter().any(|p| p.location == "header" && p.name.eq_ignore_ascii_case(h));
                            !param && who.header() != Some(h.as_str())
                        })
                        .map(|h| {
                            let security = match &who {
                                Caller::Nobody => "no security".to_string(),
                                Caller::Header(_, n) | Caller::Token(n) => {
                                    format!("security `{n}`, which does not send it")
                                }
                                Caller::Other => "a security scheme that does not send it".to_string(),
                            };
                            format!(
                                "the {h} header, but {} declares no {h} header parameter and {security}",
                                op.label()
                            )
                        }),
                };
                let Some(what) = missing else { continue };
                out.push(CrossFinding {
                    code: RULE.code,
                    primary: ctx.policy_place(ri, &[(&s.key_scope, "key/scope"), (&s.key, "key")]),
                    message: format!(
                        "policy {:?} scopes keys on {what}: its callers' requests get 400 IDEMPOTENCY_SCOPE_MISSING; \
                         scope on what identifies them (scope = [] for a provider's signed deliveries), or declare it",
                        route.name
                    ),
                    related: vec![(ctx.op_place(oi), format!("{} (its parameters and security)", op.label()))],
                    op: Some(oi),
                });
            }
        }
    }
}

/// A scope part as a policy writes it (for messages).
fn source_text(s: &Source) -> String {
    match s {
        Source::Metadata(path) => format!("metadata:{}", path.join("/")),
        other => format!("{other:?}"),
    }
}
