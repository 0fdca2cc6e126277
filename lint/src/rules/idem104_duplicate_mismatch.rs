//! ## What it checks
//!
//! The spec's duplicate response (`重复请求：409 DUPLICATE_REQUEST`) has another status or code
//! than the one the policy answers with (`[route.duplicate]`). The rule compares only where the
//! policy itself answers a repeat with `[route.duplicate]`:
//!
//! - token mode: a used or unknown token gets `[route.duplicate]`, always compared;
//! - key mode with `on_completed = "reject"`: a completed repeat gets `[route.duplicate]`,
//!   always compared;
//! - key mode with `on_completed = "replay"` (the default): a completed repeat gets the *first
//!   response replayed*, so the spec's duplicate describes that original answer — the payment
//!   callback's `200 SUCCESS`, which stops the provider's retries — and is not compared, as
//!   long as the policy remembers responses of that status (`remember`/`forget`; by default
//!   2xx–4xx except 408/409/425/429). When the policy never remembers the spec's status, the
//!   only answer with that status a repeat can get is `[route.duplicate]` (the answer for a
//!   response too large to store, a tombstone), and it is compared;
//! - shadow mode never answers a repeat: not compared.
//!
//! The finding points at the policy's `duplicate.status` or `duplicate.code` (or, when the
//! default applies, at the `[route.duplicate]` table, `on_completed`, `mode` or the route's
//! name); the related location is the spec's duplicate.
//!
//! ## Why
//!
//! Clients handle the documented answer; they will get the other one, and treat a harmless
//! repeat as a failure.
//!
//! ## Example
//!
//! ```text
//! # spec:   - 重复请求：409 RECONCILE_ALREADY_RUNNING
//! # policy: on_completed = "reject"
//! [route.duplicate]
//! status = 409
//! code = "DUPLICATE_REQUEST"
//! ```
//!
//! ## Fix
//!
//! Answer with what the spec documents (or correct the spec):
//!
//! ```text
//! [route.duplicate]
//! status = 409
//! code = "RECONCILE_ALREADY_RUNNING"
//! ```

use super::cross::{answers_with_duplicate, CrossFinding, Place, PolicyCtx};
use super::{Rule, Severity};
use idem_filter::policy::{Mode, OnCompleted};

/// IDEM104 duplicate-mismatch: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM104",
    name: "duplicate-mismatch",
    severity: Severity::Error,
    summary: "policy and spec disagree on the duplicate response's status or code",
    source: include_str!("idem104_duplicate_mismatch.rs"),
    check: super::Check::Policies(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        let s = ctx.spans(ri);
        for &oi in matched {
            let op = &ctx.ops[oi];
            let Some(st) = &op.statement else { continue };
            let Some(dup) = &st.duplicate else { continue };
            let Some(status) = dup.value.status else { continue };
            if !answers_with_duplicate(route, status) {
                continue;
            }
            let why = match (route.mode, route.key.on_completed) {
                (Mode::Token, _) => "a used token gets the route's [route.duplicate]".to_string(),
                (_, OnCompleted::Reject) => {
                    "with on_completed = \"reject\" a completed repeat gets the route's [route.duplicate]".to_string()
                }
                _ => format!(
                    "the policy replays completed requests but never remembers a {status} response, so a repeat answered {status} can only be the route's [route.duplicate]"
                ),
            };
            let related = vec![(
                Place::Spec { ws: op.ws, loc: dup.loc.clone() },
                format!("the duplicate in {} of {}", st.origin.describe(), op.label()),
            )];
            let fallback = [(&s.duplicate, "duplicate"), (&s.on_completed, "key/on_completed"), (&s.mode, "mode")];
            if route.duplicate.status != status {
                let mut c = vec![(&s.duplicate_status, "duplicate/status")];
                c.extend(fallback);
                out.push(CrossFinding {
                    code: RULE.code,
                    primary: ctx.policy_place(ri, &c),
                    message: format!(
                        "policy {:?} answers a duplicate with {} {}, but the spec says {status}{} for {} ({why})",
                        route.name,
                        route.duplicate.status,
                        route.duplicate.code,
                        dup.value.code.as_ref().map(|c| format!(" {c}")).unwrap_or_default(),
                        op.label()
                    ),
                    related,
                    op: Some(oi),
                });
                continue;
            }
            if let Some(code) = &dup.value.code {
                if *code != route.duplicate.code {
                    let mut c = vec![(&s.duplicate_code, "duplicate/code")];
                    c.extend(fallback);
                    out.push(CrossFinding {
                        code: RULE.code,
                        primary: ctx.policy_place(ri, &c),
                        message: format!(
                            "policy {:?} answers a duplicate with code {:?}, but the spec says {code:?} for {} ({why})",
                            route.name,
                            route.duplicate.code,
                            op.label()
                        ),
                        related,
                        op: Some(oi),
                    });
                }
            }
        }
    }
}
