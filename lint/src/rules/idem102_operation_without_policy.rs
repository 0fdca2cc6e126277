//! IDEM102 operation-without-policy (error)
//!
//! The spec documents an operation as idempotent (`是否幂等：是`, `idempotent: true`), but no
//! policy route given to `--policies` matches it: the 幂等性说明 promises something the gateway
//! does not enforce. Add a `[[route]]` whose `match` names the operation's method and path.
//!
//! Only checked with `--policies`. When the service itself guarantees the idempotency (a unique
//! index, a state machine) and the gateway is deliberately not involved, suppress the rule on
//! that operation with `x-idem-lint-ignore: [IDEM102]`.
//!
//! The finding points at the statement's "idempotent" field in the spec; policy routes on the same
//! path with another method are related locations (the likely counterpart).
//!
//! Bad:
//!
//! ```text
//! /api/internal/transfers:
//!   post:
//!     x-idempotency: { idempotent: true, key: { in: header, name: Idempotency-Key }, … }
//! # and no policy file matches POST /api/internal/transfers
//! ```
//!
//! Good:
//!
//! ```text
//! # policies/internal-transfer.toml
//! [[route]]
//! name = "internal-transfer"
//! match = { method = "POST", path = "/api/internal/transfers" }
//! ```

use super::cross::{same_shape, CrossFinding, Place, PolicyCtx};
use crate::section::Tri;
use idem_filter::policy::Matcher;

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (oi, op) in ctx.ops.iter().enumerate() {
        if op.idempotent() != Some(&Tri::Yes) {
            continue;
        }
        if ctx.matches.iter().any(|m| m.contains(&oi)) {
            continue;
        }
        let Some(st) = &op.statement else { continue };
        let loc = st.idempotent.as_ref().map_or_else(|| st.loc.clone(), |f| f.loc.clone());
        // Policy routes on the same path with another method: the likely counterpart.
        let related = (0..ctx.routes.len())
            .filter(|&ri| match &ctx.routes[ri].route.matcher {
                Matcher::Request { path, .. } => same_shape(&path.source, op.op.path),
                Matcher::RouteName(_) => false,
            })
            .map(|ri| {
                let s = ctx.spans(ri);
                let place = ctx.policy_place(ri, &[(&s.method, "match/method"), (&s.path, "match/path")]);
                (
                    place,
                    format!("policy {:?} is on {} (another method)", ctx.routes[ri].route.name, ctx.route_label(ri)),
                )
            })
            .collect();
        out.push(CrossFinding {
            code: "IDEM102",
            primary: Place::Spec { ws: op.ws, loc },
            message: format!(
                "{} is documented as idempotent, but no policy in {} protects it: add a [[route]] with match = {{ method = \"{}\", path = \"{}\" }}",
                op.label(),
                ctx.policy_args.join(", "),
                op.op.method.to_ascii_uppercase(),
                op.op.path
            ),
            related,
            op: Some(oi),
        });
    }
}
