//! ## What it checks
//!
//! The idempotency key (or one part of it) is a header that Envoy, a tracer or a proxy writes
//! for every request or attempt: `X-Request-Id`, `traceparent`, `tracestate`, `x-b3-*`,
//! `x-datadog-*`, `X-Amzn-Trace-Id`, `x-envoy-*`, `X-Forwarded-For`, `Forwarded`, `grpc-timeout`, ….
//!
//! ## Why
//!
//! Such a header never repeats on a retry: Envoy generates `X-Request-Id` for every request that
//! lacks one, tracers write a new span per attempt, proxies append themselves. Every retry gets
//! a fresh key and runs the business again, and `required = true` never fires. The gateway refuses
//! a policy keyed on such a header when it loads, so the spec cannot be enforced as written: this
//! is an error, and CI stops, rather than a warning that lets the spec ship.
//!
//! ## Example
//!
//! ```text
//! - 是否幂等：是
//! - 幂等键：X-Request-Id（header）
//! ```
//!
//! ## Fix
//!
//! Key on a header only the client writes, generated once per intended action and sent again on
//! every retry:
//!
//! ```text
//! - 幂等键：Idempotency-Key（header）
//! ```

use super::{Ctx, RawFinding, Rule, Severity};
use crate::value::KeyIn;

/// IDEM012 generated-header-key: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM012",
    name: "generated-header-key",
    severity: Severity::Error,
    summary: "key on a header Envoy, a tracer or a proxy writes (X-Request-Id, traceparent, …): the gateway refuses it",
    source: include_str!("idem012_generated_header_key.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(key) = ctx.merged.and_then(|st| st.key.as_ref()) else {
        return;
    };
    for part in &key.value.parts {
        if !matches!(part.location, None | Some(KeyIn::Header)) {
            continue;
        }
        let Some(why) = idem_filter::policy::generated_header(&part.name) else {
            continue;
        };
        out.push(ctx.at(
            &RULE,
            &key.loc,
            format!(
                "idempotency key \"{}\" for {}: it {why}, so no retry carries it again; the gateway refuses a policy \
                 keyed on it",
                part.name,
                ctx.label()
            ),
        ));
    }
}
