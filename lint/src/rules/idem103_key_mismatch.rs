//! ## What it checks
//!
//! The policy takes the idempotency key (or, in token mode, the token) from another place, or
//! under another name, than the operation's 幂等性说明 says. For every policy route and operation it
//! matches, the policy's key parts (`key.from` + `key.name`, or `key.parts`; token mode:
//! `token.header`) are compared with the spec's key, each name with its location, read as the
//! filter reads it: a body key is a JSON pointer (the spec's `transaction_id` is the policy's
//! `/transaction_id`), a form field when the operation's body is form-encoded, an XML element
//! under the schema's `xml.name` root when it is XML; header names compare case-insensitively. A
//! key made of several names (`out_trade_no + trade_no`) must be the policy's `parts`, in any order.
//!
//! Operations whose statement names no key are IDEM003's business, and keys the filter cannot
//! read as documented IDEM004's, not this rule's. The finding points at the policy's `key.from`
//! when the kinds of place differ, else at `key.name` or `key.parts` (`token.header`); the related
//! location is the spec's key.
//!
//! ## Why
//!
//! Clients follow the spec; the gateway follows the policy: one of them is wrong, and every
//! request will be rejected as missing its key, or keyed on the wrong thing.
//!
//! ## Example
//!
//! ```text
//! # spec:   - 幂等键：transaction_id（body）
//! # policy: [route.key]
//! from = "header"
//! name = "X-Transaction-Id"
//! ```
//!
//! ## Fix
//!
//! Take the key from where the spec says it is (or correct the spec):
//!
//! ```text
//! [route.key]
//! from = "body"
//! name = "/transaction_id"
//! ```

use super::cross::{CrossFinding, Place, PolicyCtx};
use super::{Rule, Severity};
use crate::policy::keys::{same_sources, spec_sources};
use idem_filter::policy::{Mode, Source};
use std::mem::discriminant;

/// IDEM103 key-mismatch: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM103",
    name: "key-mismatch",
    severity: Severity::Error,
    summary: "policy and spec disagree on where the key is or what it is called",
    source: include_str!("idem103_key_mismatch.rs"),
    check: super::Check::Policies(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        let s = ctx.spans(ri);
        let (policy, what, kind_place, name_place) = if route.mode == Mode::Token {
            let token =
                ctx.policy_place(ri, &[(&s.token_header, "token/header"), (&s.token, "token"), (&s.mode, "mode")]);
            (vec![Source::Header(route.token.header.clone())], "token", token.clone(), token)
        } else {
            (
                route.key.sources.clone(),
                "key",
                ctx.policy_place(ri, &[(&s.key_from, "key/from"), (&s.key_parts, "key/parts"), (&s.key, "key")]),
                ctx.policy_place(ri, &[(&s.key_name, "key/name"), (&s.key_parts, "key/parts"), (&s.key, "key")]),
            )
        };
        for &oi in matched {
            let op = &ctx.ops[oi];
            let Some(st) = &op.statement else { continue };
            let Some(key) = &st.key else { continue };
            if key.value.is_none() {
                continue;
            }
            // A key the filter cannot read as documented is IDEM004's (or the generator's) finding.
            let Ok(spec) = spec_sources(&ctx.workspaces[op.ws], &op.op, &key.value) else { continue };
            if same_sources(&policy, &spec) {
                continue;
            }
            let kinds = |v: &[Source]| {
                let mut k: Vec<_> = v.iter().map(discriminant).collect();
                k.dedup();
                k
            };
            let primary = if kinds(&policy) != kinds(&spec) { kind_place.clone() } else { name_place.clone() };
            let list = |v: &[Source]| v.iter().map(Source::to_string).collect::<Vec<_>>().join(" + ");
            let spec_place = Place::Spec { ws: op.ws, loc: key.loc.clone() };
            out.push(CrossFinding {
                code: RULE.code,
                primary,
                message: format!(
                    "policy {:?} reads the {what} from {}, but the spec's key for {} is {} ({})",
                    route.name,
                    list(&policy),
                    op.label(),
                    list(&spec),
                    key.raw.trim()
                ),
                related: vec![(spec_place, format!("the key in {} of {}", st.origin.describe(), op.label()))],
                op: Some(oi),
            });
        }
    }
}
