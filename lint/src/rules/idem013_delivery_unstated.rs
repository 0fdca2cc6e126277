//! ## What it checks
//!
//! A delivery the API sends — an operation under `webhooks` (OpenAPI 3.1), `x-webhooks` (the
//! 3.0 extension) or an operation's `callbacks` — does not tell its receivers what to
//! deduplicate on (the event id: a header or a body field, the statement's key) or that a
//! delivery may come again (the `投递` / `Delivery` line: at least once), or it promises one
//! delivery only.
//!
//! ## Why
//!
//! A sender that gets no answer in time — a receiver slower than its timeout, a connection cut
//! after the receiver acted — delivers again; every payment provider and webhook platform does
//! (Stripe, Alipay, WeChat Pay, Standard Webhooks, CloudEvents over HTTP). A receiver that does
//! not know this ships the order twice; one that knows it must also know which field is the same
//! on every delivery of one event, and it is not the signature or the timestamp, which the sender
//! computes anew. No sender over HTTP can promise exactly one delivery: the statement says at
//! least once, and names the id. `idem-lint policies --receiver` writes the receiver's gateway
//! policy from that statement.
//!
//! ## Example
//!
//! ```text
//! webhooks:
//!   orderPaid:
//!     post:
//!       description: 订单支付成功后通知商户。
//! ```
//!
//! ## Fix
//!
//! State the event id and the delivery promise (`--fix` adds the template; fill in the id):
//!
//! ```text
//!       description: |
//!         订单支付成功后通知商户。
//!
//!         ### 幂等性说明
//!         - 幂等键：webhook-id（header）
//!         - 投递：至少一次（未收到 2xx 会重试，同一事件的 webhook-id 不变）
//! ```
//!
//! In English: `Key: webhook-id (header)` and `Delivery: at least once`; in `x-idempotency`:
//! `key: { in: header, name: webhook-id }` and `delivery: at-least-once`.

use super::{Ctx, RawFinding, Rule, Severity};
use crate::statement::Loc;
use crate::value::Tri;

/// IDEM013 delivery-unstated: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM013",
    name: "delivery-unstated",
    severity: Severity::Error,
    summary: "a webhook or callback does not say what receivers deduplicate on and that it may repeat",
    source: include_str!("idem013_delivery_unstated.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    if !ctx.op.is_delivery() {
        return;
    }
    let Some(st) = ctx.merged else {
        let loc = Loc { file: ctx.op.key_file, offset: ctx.op.key_offset, pointer: ctx.op.pointer.clone() };
        out.push(ctx.at(
            &RULE,
            &loc,
            format!(
                "{} does not tell its receivers what to deduplicate on or that it may be delivered again: add a \
                 `### 幂等性说明` section to its description (`- 幂等键：<event id>（header|body）`, `- 投递：至少一次`) \
                 or an `x-idempotency` extension (`key`, `delivery: at-least-once`)",
                ctx.label()
            ),
        ));
        return;
    };
    match &st.key {
        None => out.push(ctx.at(
            &RULE,
            &st.loc,
            format!(
                "{} names no id its receivers deduplicate on ({}): name the event id, a header or body field the \
                 sender keeps the same on every delivery of one event",
                ctx.label(),
                st.hint("event-key")
            ),
        )),
        Some(f) if f.value.is_none() => out.push(ctx.at(
            &RULE,
            &f.loc,
            format!(
                "{} says its deliveries carry no id (\"{}\"): a receiver cannot tell a redelivery from a new event; \
                 name the event id",
                ctx.label(),
                f.raw
            ),
        )),
        Some(_) => {}
    }
    match st.delivery.as_ref().map(|f| (&f.value, f)) {
        None => out.push(ctx.at(
            &RULE,
            &st.loc,
            format!(
                "{} does not say that a delivery may come again ({}): receivers must expect a redelivery of one event",
                ctx.label(),
                st.hint("delivery")
            ),
        )),
        Some((Tri::No, f)) => out.push(ctx.at(
            &RULE,
            &f.loc,
            format!(
                "{} promises one delivery (\"{}\"): no sender over HTTP can keep that (an answer lost after the \
                 receiver acted is delivered again); say at least once",
                ctx.label(),
                f.raw
            ),
        )),
        Some((Tri::Unknown(raw), f)) => out.push(ctx.at(
            &RULE,
            &f.loc,
            format!(
                "{}: the delivery line \"{raw}\" says neither at least once nor once ({})",
                ctx.label(),
                st.hint("delivery")
            ),
        )),
        Some((Tri::Yes, _)) => {}
    }
}
