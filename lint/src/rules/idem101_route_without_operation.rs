//! ## What it checks
//!
//! A policy route (`--policies`) matches no operation of the spec. A `match = { method, path }`
//! route matches an operation with that method (any method when `method` is left out) whose path
//! has the same shape: literal segments equal, and a `{param}` segment matches a `{param}` segment
//! whatever its name (`/api/orders/{id}/pay` matches `/api/orders/{orderId}/pay`). Paths are
//! compared as written under `paths` (a `servers` base path is not added). A route matched by
//! Envoy route name (`match = { route = "create-order" }` or no `match`) pairs with the operation
//! whose `operationId` is the same name ignoring case, `-` and `_` (`createOrder`).
//!
//! A route on a gRPC method path (`/package.Service/Method`: two segments, a dotted service name
//! and a method, each component an identifier starting with a letter, the service and method
//! capitalised) is not expected in an OpenAPI description and is not reported.
//!
//! The finding points at the route's `path` (or its `match`) in the policy file; operations on
//! the same path with another method are related locations (the likely counterpart).
//!
//! ## Why
//!
//! The gateway enforces a policy on an endpoint the API description does not have. Usually the
//! path or method was renamed on one side only — so the real endpoint is unprotected — or the
//! policy protects an endpoint that was removed.
//!
//! ## Example
//!
//! ```text
//! # policies/create-order.toml
//! match = { method = "POST", path = "/api/orders/create" }
//! # the spec has POST /api/order/create
//! ```
//!
//! ## Fix
//!
//! Match the operation as the spec names it (or delete the stale policy):
//!
//! ```text
//! match = { method = "POST", path = "/api/order/create" }
//! ```

use super::cross::{same_shape, CrossFinding, PolicyCtx};
use super::{Rule, Severity};
use idem_filter::policy::Matcher;

/// IDEM101 route-without-operation: its code, name, default severity and documentation (this file's `//!` comment).
pub static RULE: Rule = Rule {
    code: "IDEM101",
    name: "route-without-operation",
    severity: Severity::Error,
    summary: "policy route that matches no operation of the spec",
    source: include_str!("idem101_route_without_operation.rs"),
    check: super::Check::Policies(check),
};

pub fn check(ctx: &PolicyCtx<'_>, out: &mut Vec<CrossFinding>) {
    for (ri, matched) in ctx.matches.iter().enumerate() {
        if !matched.is_empty() {
            continue;
        }
        let s = ctx.spans(ri);
        let primary = ctx.policy_place(ri, &[(&s.path, "match/path"), (&s.matcher, "match")]);
        let route = ctx.routes[ri].route;
        if matches!(&route.matcher, Matcher::Request { path, .. } if is_grpc_method_path(&path.source)) {
            continue;
        }
        // The operations on the same path with another method: the likely counterpart.
        let related = match &route.matcher {
            Matcher::Request { path, .. } => ctx
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| same_shape(&path.source, o.op.path))
                .map(|(oi, o)| (ctx.op_place(oi), format!("the spec has {} (another method)", o.label())))
                .collect(),
            Matcher::RouteName(_) => Vec::new(),
        };
        out.push(CrossFinding {
            code: RULE.code,
            primary,
            message: format!(
                "policy route {:?} ({}) matches no operation in {}",
                route.name,
                ctx.route_label(ri),
                ctx.spec_names()
            ),
            related,
            op: None,
        });
    }
}

/// `/package.Service/Method`: the path of a gRPC method, which no OpenAPI spec describes.
fn is_grpc_method_path(path: &str) -> bool {
    let ident = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let capitalised = |s: &str| s.starts_with(|c: char| c.is_ascii_uppercase());
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return false;
    };
    let parts: Vec<&str> = service.split('.').collect();
    parts.len() >= 2
        && parts.iter().all(|p| ident(p))
        && parts.last().is_some_and(|s| capitalised(s))
        && ident(method)
        && capitalised(method)
}

#[cfg(test)]
mod tests {
    use super::is_grpc_method_path;

    #[test]
    fn grpc_method_paths_are_told_from_http_paths() {
        for yes in ["/shop.Orders/Create", "/grpc.health.v1.Health/Check", "/a.b_c.Svc/Do2"] {
            assert!(is_grpc_method_path(yes), "{yes}");
        }
        for no in [
            "/api/order/create",
            "/v1.0/orders",
            "/shop.orders/Create",
            "/Orders/Create",
            "/shop.Orders/create",
            "/shop.Orders/Create/x",
            "/shop.Orders/{id}",
        ] {
            assert!(!is_grpc_method_path(no), "{no}");
        }
    }
}
