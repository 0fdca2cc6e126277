//! ## What it checks
//!
//! The duplicate status named by the statement is not one of the operation's responses, or the
//! duplicate's code appears nowhere in that response. The status matches a response key exactly
//! (`"409"`) or by range (`"4XX"`); `default` does not count. The code is looked for as a whole
//! word in every string and key of the response, following `$ref`s: its description, headers,
//! schemas (`enum`, `example`, `const`) and examples (Swagger 2.0's `schema` and `examples` of
//! the response alike).
//!
//! ## Why
//!
//! A documented duplicate answer that the responses do not list is invisible to client
//! generators, mocks and contract tests.
//!
//! ## Example
//!
//! ```text
//! - 重复请求：409 DUPLICATE_REQUEST
//! responses:
//!   "201": { description: created }
//! ```
//!
//! ## Fix
//!
//! `idem-lint --fix` adds a missing duplicate status to the operation's `responses` (a one-line
//! entry whose description names the code), keeping the file's formatting and comments; a code
//! missing from an existing response is left to you. By hand — document the duplicate response,
//! with its code:
//!
//! ```text
//! responses:
//!   "201": { description: created }
//!   "409":
//!     description: 重复请求
//!     content:
//!       application/json:
//!         example: { code: DUPLICATE_REQUEST, first_seen_at: "2024-05-01T08:00:00Z" }
//! ```

use super::{any_text, contains_word, Ctx, RawFinding, Rule, Severity};
use crate::loader::At;
use crate::node::Node;

/// IDEM006 duplicate-not-in-responses: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM006",
    name: "duplicate-not-in-responses",
    severity: Severity::Error,
    summary: "duplicate status not among the responses, or its code not in that response",
    source: include_str!("idem006_duplicate_not_in_responses.rs"),
    check: super::Check::Operation(check),
};

/// The operation's `responses` map and the statement's duplicate status it lacks (and the code),
/// when the status is not among the responses: what the finding reports and `--fix` adds.
pub struct MissingStatus<'a> {
    pub responses: Option<At<'a>>,
    pub status: u16,
    pub code: Option<String>,
}

/// The response the statement's duplicate status names, or what is missing.
fn duplicate_response<'a>(ctx: &Ctx<'a>) -> Option<Result<At<'a>, MissingStatus<'a>>> {
    let (dup, status) = ctx.duplicate_status()?;
    let responses = ctx.op.responses;
    let exact = status.to_string();
    let range = format!("{}XX", status / 100);
    let entries = responses.and_then(|r| r.node.as_map().map(|m| (r.file, m)));
    let found = entries.and_then(|(file, m)| {
        m.iter()
            .find(|e| e.key == exact)
            .or_else(|| m.iter().find(|e| e.key.eq_ignore_ascii_case(&range)))
            .map(|e| At { file, node: &e.value })
    });
    Some(found.ok_or(MissingStatus { responses, status, code: dup.value.code.clone() }))
}

/// What `--fix` may add: the missing status of an operation whose statement names it.
pub fn missing_status<'a>(ctx: &Ctx<'a>) -> Option<MissingStatus<'a>> {
    duplicate_response(ctx)?.err()
}

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some((dup, status)) = ctx.duplicate_status() else {
        return;
    };
    let Some(found) = duplicate_response(ctx) else {
        return;
    };
    let entries = ctx.op.responses.and_then(|r| r.node.as_map());
    let Ok(resp) = found else {
        let declared: Vec<&str> = entries.map(|m| m.iter().map(|e| e.key.as_str()).collect()).unwrap_or_default();
        out.push(ctx.at(
            &RULE,
            &dup.loc,
            format!(
                "duplicate status {status} is not among the responses of {} (declared: {})",
                ctx.label(),
                if declared.is_empty() { "none".to_string() } else { declared.join(", ") }
            ),
        ));
        return;
    };
    let Some(code) = &dup.value.code else {
        return;
    };
    if !any_text(ctx.ws, resp, &mut |s: &str| contains_word(s, code)) {
        let key = resp.node.get("$ref").and_then(Node::as_str).map(|r| format!(" ({r})")).unwrap_or_default();
        out.push(ctx.at(
            &RULE,
            &dup.loc,
            format!(
                "duplicate code {code} appears nowhere in the {status} response{key} of {}: put it in the response's description, schema (enum/example) or examples",
                ctx.label()
            ),
        ));
    }
}
