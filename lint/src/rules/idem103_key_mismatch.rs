//! ## What it checks
//!
//! The policy takes the idempotency key (or, in token mode, the token) from another place, or
//! under another name, than the operation's 幂等性说明 says. Compared, for every policy route and
//! operation it matches:
//!
//! - the location: the policy's `key.from` (`header`, `query`, `body`; token mode: `header`)
//!   against the spec's key location, when the spec names one;
//! - the name: the policy's `key.name` (token mode: `token.header`) against the spec's key name.
//!   Header names compare case-insensitively; a body key compares as a JSON pointer, so the spec's
//!   `transaction_id` and the policy's `/transaction_id` are the same key. A spec key made of
//!   several fields (`merchant_id + bill_date`) cannot match a policy, which takes one value.
//!
//! Operations whose statement names no key are IDEM003's business, not this rule's. The finding
//! points at the policy's `key.from` or `key.name` (`token.header`); the related location is the
//! spec's key.
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
use crate::section::KeyIn;
use idem_filter::policy::{KeySource, Mode};

/// IDEM103 key-mismatch: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM103",
    name: "key-mismatch",
    severity: Severity::Error,
    summary: "policy and spec disagree on where the key is or what it is called",
    source: include_str!("idem103_key_mismatch.rs"),
    check: super::spec_only_with_policies,
    cross: Some(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        let route = ctx.routes[ri].route;
        let s = ctx.spans(ri);
        let (from, name, what, from_place, name_place) = if route.mode == Mode::Token {
            (
                KeySource::Header,
                route.token.header.as_str(),
                "token",
                ctx.policy_place(ri, &[(&s.token_header, "token/header"), (&s.token, "token"), (&s.mode, "mode")]),
                ctx.policy_place(ri, &[(&s.token_header, "token/header"), (&s.token, "token"), (&s.mode, "mode")]),
            )
        } else {
            (
                route.key.from,
                route.key.name.as_str(),
                "key",
                ctx.policy_place(ri, &[(&s.key_from, "key/from"), (&s.key, "key")]),
                ctx.policy_place(ri, &[(&s.key_name, "key/name"), (&s.key, "key")]),
            )
        };
        let from_str = match from {
            KeySource::Header => "header",
            KeySource::Query => "query",
            KeySource::Body => "body",
        };
        for &oi in matched {
            let op = &ctx.ops[oi];
            let Some(st) = &op.statement else { continue };
            let Some(key) = &st.key else { continue };
            let spec_place = Place::Spec { ws: op.ws, loc: key.loc.clone() };
            let related = vec![(spec_place, format!("the key in {} of {}", st.origin.describe(), op.label()))];
            if let Some(loc) = &key.value.location {
                let same = matches!(
                    (loc, from),
                    (KeyIn::Header, KeySource::Header)
                        | (KeyIn::Query, KeySource::Query)
                        | (KeyIn::Body, KeySource::Body)
                );
                if !same {
                    out.push(CrossFinding {
                        code: RULE.code,
                        primary: from_place.clone(),
                        message: format!(
                            "policy {:?} takes the {what} from the {from_str}, but the spec says {} of {} has it in the {}",
                            route.name,
                            key.value.names.join(" + "),
                            op.label(),
                            loc.as_str()
                        ),
                        related: related.clone(),
                        op: Some(oi),
                    });
                    continue;
                }
            }
            let names = &key.value.names;
            if names.is_empty() {
                continue;
            }
            let matches_name = names.len() == 1 && same_name(from, name, &names[0]);
            if !matches_name {
                let spec_names = names.join(" + ");
                let hint = if names.len() > 1 {
                    " (a policy key is one value: document a single key, e.g. one the caller derives from these fields)"
                } else {
                    ""
                };
                out.push(CrossFinding {
                    code: RULE.code,
                    primary: name_place.clone(),
                    message: format!(
                        "policy {:?} names the {what} {name:?} ({from_str}), but the spec names {spec_names:?} for {}{hint}",
                        route.name,
                        op.label()
                    ),
                    related,
                    op: Some(oi),
                });
            }
        }
    }
}

fn same_name(from: KeySource, policy: &str, spec: &str) -> bool {
    let spec = spec.trim().trim_matches('`');
    match from {
        KeySource::Header => policy.eq_ignore_ascii_case(spec),
        KeySource::Query => policy == spec,
        KeySource::Body => {
            let p = policy.strip_prefix('/').unwrap_or(policy);
            let s = spec.strip_prefix("$.").or_else(|| spec.strip_prefix('/')).unwrap_or(spec);
            p == s || p == s.replace('.', "/")
        }
    }
}
