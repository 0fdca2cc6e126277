//! ## What it checks
//!
//! An operation whose security is a token that is refreshed — a JWT bearer (`bearerFormat:
//! JWT`), OAuth2, OpenID Connect — protected by a policy that scopes keys on the whole
//! `Authorization` header (`header:authorization`, the default scope).
//!
//! ## Why
//!
//! The scope is who the caller is; the whole header is the token, and a client that refreshes its
//! token between two attempts of one request (an expiry during a retry loop, a long backoff)
//! becomes another caller: its retry is not recognised, and the business runs again. The token's
//! verified subject stays the same across refreshes.
//!
//! ## Example
//!
//! ```text
//! # spec: security: [ { bearerAuth: [] } ], bearerAuth: { type: http, scheme: bearer, bearerFormat: JWT }
//! [route.key]
//! scope = ["header:authorization"]
//! ```
//!
//! ## Fix
//!
//! Verify the token in front of idem (Envoy's `jwt_authn` with `payload_in_metadata: jwt_payload`)
//! and scope on its subject:
//!
//! ```text
//! [route.key]
//! scope = ["metadata:envoy.filters.http.jwt_authn/jwt_payload/sub"]
//! ```

use super::cross::{route_scope, CrossFinding, PolicyCtx};
use super::{Rule, Severity};
use crate::security::{caller, Caller};
use idem_filter::policy::Source;

/// IDEM108 token-scoped-on-whole-header: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM108",
    name: "token-scoped-on-whole-header",
    severity: Severity::Warning,
    summary: "a refreshable token (JWT, OAuth2) scoped on the whole Authorization header",
    source: include_str!("idem108_token_scoped_on_whole_header.rs"),
    check: super::Check::Policies(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        let scope = route_scope(route);
        let whole = scope.iter().any(|p| matches!(p, Source::Header(h) if h.eq_ignore_ascii_case("authorization")));
        if !whole {
            continue;
        }
        let s = ctx.spans(ri);
        for &oi in matched {
            let op = &ctx.ops[oi];
            let Caller::Token(name) = caller(&ctx.workspaces[op.ws], &op.op) else { continue };
            out.push(CrossFinding {
                code: RULE.code,
                primary: ctx.policy_place(ri, &[(&s.key_scope, "key/scope"), (&s.key, "key")]),
                message: format!(
                    "policy {:?} scopes keys on the whole Authorization header, but {} is called with a token \
                     (`{name}`) that is refreshed: a retry after a refresh is a new caller and runs again; scope \
                     on the verified subject: scope = [\"metadata:envoy.filters.http.jwt_authn/jwt_payload/sub\"]",
                    route.name,
                    op.label()
                ),
                related: vec![(ctx.op_place(oi), format!("{} (its security)", op.label()))],
                op: Some(oi),
            });
        }
    }
}
