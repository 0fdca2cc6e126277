//! ## What it checks
//!
//! The statement names a key the operation does not declare. A header, query or path key must be
//! one of the operation's parameters — its own, the path item's (path-level parameters count) or a
//! `$ref`'d one; header names compare case-insensitively. A body key must be a property of the
//! request body schema (any media type; in Swagger 2.0 the `in: body` parameter's schema, or an
//! `in: formData` parameter), followed through `$ref`, `allOf`, `oneOf` and `anyOf`; a
//! plain name is a top-level property, a JSON pointer such as `/data/id` walks nested properties
//! (`/items/0/sku` walks array items). A key without a location may be declared anywhere. A
//! bracket that names no location is a remark (`out_trade_no（商户订单号）` is the key
//! `out_trade_no`, without location); one that names an unsupported location (`（cookie）`,
//! `（form）`) is reported as an unknown location.
//!
//! ## Why
//!
//! A key nobody declared is a key no client generator will send, and a gateway policy cannot be
//! checked against it.
//!
//! ## Example
//!
//! The header is never declared:
//!
//! ```text
//! post:
//!   description: |
//!     ### 幂等性说明
//!     - 是否幂等：是
//!     - 幂等键：Idempotency-Key（header）
//!   responses: ...
//! ```
//!
//! ## Fix
//!
//! Declare the key where the statement says it is:
//!
//! ```text
//! post:
//!   parameters:
//!     - { name: Idempotency-Key, in: header, required: true, schema: { type: string } }
//! ```

use std::collections::HashSet;

use super::{Ctx, RawFinding, Rule, Severity};
use crate::loader::{At, Workspace};
use crate::node::{split_pointer, Node};
use crate::value::KeyIn;

/// IDEM004 undeclared-key: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM004",
    name: "undeclared-key",
    severity: Severity::Error,
    summary: "named key is not declared by the operation",
    source: include_str!("idem004_undeclared_key.rs"),
    check: super::Check::Operation(check),
};

pub fn check(ctx: &Ctx<'_>, out: &mut Vec<RawFinding>) {
    let Some(st) = ctx.merged else {
        return;
    };
    let Some(key) = &st.key else {
        return;
    };
    if let Some(KeyIn::Other(loc)) =
        key.value.parts.iter().find_map(|p| p.location.as_ref().filter(|l| matches!(l, KeyIn::Other(_))))
    {
        out.push(ctx.at(
            &RULE,
            &key.loc,
            format!("unknown key location \"{loc}\" for {}: use header, query, path or body", ctx.label()),
        ));
        return;
    }
    for part in &key.value.parts {
        let name = &part.name;
        let found = match &part.location {
            Some(KeyIn::Header) => has_param(ctx, "header", name),
            Some(KeyIn::Query) => has_param(ctx, "query", name),
            Some(KeyIn::Path) => has_param(ctx, "path", name),
            Some(KeyIn::Body) => body_has(ctx, name),
            Some(KeyIn::Other(_)) => false,
            None => {
                ["header", "query", "path", "cookie"].iter().any(|l| has_param(ctx, l, name)) || body_has(ctx, name)
            }
        };
        if !found {
            let param = |location: &str| {
                format!(
                    "declare it: `- {{ name: {name}, in: {location}, required: true, schema: {{ type: string }} }}`"
                )
            };
            let (what, write) = match &part.location {
                Some(KeyIn::Header) => ("a header parameter", param("header")),
                Some(KeyIn::Query) => ("a query parameter", param("query")),
                Some(KeyIn::Path) => {
                    ("a path parameter", format!("put `{{{name}}}` in the path and {}", param("path")))
                }
                Some(KeyIn::Body) => (
                    "a property of the request body schema",
                    format!("add `{name}` to the request body schema's `properties`"),
                ),
                _ => (
                    "a parameter or a request body property",
                    "declare it where clients send it (a parameter, or a property of the request body schema), \
                     and name that place in the statement"
                        .to_string(),
                ),
            };
            out.push(ctx.at(
                &RULE,
                &key.loc,
                format!("idempotency key \"{name}\" is not declared by {}: it is not {what}; {write}", ctx.label()),
            ));
        }
    }
}

fn has_param(ctx: &Ctx<'_>, location: &str, name: &str) -> bool {
    ctx.op.params.iter().any(|p| {
        p.location == location && if location == "header" { p.name.eq_ignore_ascii_case(name) } else { p.name == name }
    })
}

fn body_has(ctx: &Ctx<'_>, name: &str) -> bool {
    let segments: Vec<String> = if name.starts_with('/') {
        match split_pointer(name) {
            Some(s) => s,
            None => return false,
        }
    } else {
        vec![name.to_string()]
    };
    let body = &ctx.op.body;
    // A Swagger 2.0 form field is a top-level property without a schema of its own to walk.
    if let [field] = segments.as_slice() {
        if body.fields.iter().any(|p| p.name == field) {
            return true;
        }
    }
    body.schemas.iter().any(|schema| {
        let mut seen = HashSet::new();
        schema_has(ctx.ws, *schema, &segments, &mut seen)
    })
}

/// Does the schema have the property path `segments`? Follows `$ref`, `allOf`/`oneOf`/`anyOf`
/// and array `items`; each (schema, depth) pair is visited once, so recursive schemas end.
pub fn schema_has(ws: &Workspace, at: At<'_>, segments: &[String], seen: &mut HashSet<(*const Node, usize)>) -> bool {
    let Some(first) = segments.first() else {
        return true;
    };
    let Some(s) = ws.resolve(at) else {
        return false;
    };
    if !seen.insert((s.node as *const Node, segments.len())) {
        return false;
    }
    let file = s.file;
    let sub = |n| At { file, node: n };
    if let Some(prop) = s.node.get("properties").and_then(|p| p.get(first)) {
        let mut seen2 = seen.clone();
        if schema_has(ws, sub(prop), segments.get(1..).unwrap_or(&[]), &mut seen2) {
            return true;
        }
    }
    let is_index = first.bytes().all(|b| b.is_ascii_digit()) || first == "-" || first == "*";
    if is_index {
        if let Some(items) = s.node.get("items") {
            if schema_has(ws, sub(items), segments.get(1..).unwrap_or(&[]), seen) {
                return true;
            }
        }
    }
    for comb in ["allOf", "oneOf", "anyOf"] {
        if let Some(list) = s.node.get(comb).and_then(Node::as_seq) {
            for branch in list {
                if schema_has(ws, sub(branch), segments, seen) {
                    return true;
                }
            }
        }
    }
    false
}
