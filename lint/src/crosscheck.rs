//! `--policies`: the spec and the gateway's policy files must agree (rules IDEM101+).
//!
//! Every operation of every spec given (any method) is paired with the policy routes that match
//! it: a `match = { method, path }` route matches an operation with that method (any method when
//! the route names none) whose path has the same shape (literal segments equal, `{param}`
//! segments match each other whatever their names); a `match = { route = … }` route, or a route
//! with no `match`, matches by Envoy route name, which a spec does not carry: it pairs with the
//! operation whose `operationId` is the same name ignoring case, `-` and `_` (`create-order` ↔
//! `createOrder`). Paths are compared as written in `paths` (no `servers` base path).
//!
//! Findings carry two places: the primary location, and a related one (the other side).
//!
//! Dependency direction: this module depends on `crate::rules` (the rule registry `RULES` and
//! the context the IDEM1xx rules see, `crate::rules::cross`); `crate::rules` never depends on
//! this module. It builds that context, runs the rules and positions their findings.

use idem_filter::policy::{Matcher, RoutePolicy};

use crate::config::Config;
use crate::lint::{ignored, snippet, Finding, Related};
use crate::loader::Workspace;
use crate::model::{operations, Operation, METHODS};
use crate::policy::{PolicySet, RouteRef};
use crate::rules::cross::{same_shape, Op, Place, PolicyCtx};
use crate::rules::RULES;
use crate::statement::statements;

/// The context of the cross-check rules: every operation of the specs (any method), every
/// route of the set, and the operations each route matches.
pub fn context<'a>(
    workspaces: &'a [Workspace],
    policies: &'a PolicySet,
    policy_args: &'a [String],
    cfg: &Config,
) -> PolicyCtx<'a> {
    let all: Vec<String> = METHODS.iter().map(|m| m.to_string()).collect();
    let mut ops = Vec::new();
    for (wi, ws) in workspaces.iter().enumerate() {
        for op in operations(ws, &all) {
            let statement = statements(ws, &op, &cfg.section_titles, true).merged();
            ops.push(Op { ws: wi, op, statement });
        }
    }
    let routes: Vec<RouteRef<'a>> = policies.routes().collect();
    let matches = routes
        .iter()
        .map(|r| ops.iter().enumerate().filter(|(_, o)| route_matches(r.route, &o.op)).map(|(i, _)| i).collect())
        .collect();
    PolicyCtx { workspaces, ops, policies, routes, matches, policy_args }
}

fn normalize_id(s: &str) -> String {
    s.chars().filter(|c| *c != '-' && *c != '_').flat_map(char::to_lowercase).collect()
}

/// Whether a policy route matches an operation (see the module documentation).
fn route_matches(r: &RoutePolicy, op: &Operation<'_>) -> bool {
    match &r.matcher {
        Matcher::Request { method, path } => {
            method.as_ref().is_none_or(|m| m.eq_ignore_ascii_case(op.method)) && same_shape(&path.source, op.path)
        }
        Matcher::RouteName(n) => op
            .at
            .node
            .get("operationId")
            .and_then(crate::node::Node::as_str)
            .is_some_and(|id| normalize_id(id) == normalize_id(n)),
    }
}

/// Runs the enabled IDEM1xx rules and positions their findings.
fn cross_check(workspaces: &[Workspace], policies: &PolicySet, policy_args: &[String], cfg: &Config) -> Vec<Finding> {
    let ctx = context(workspaces, policies, policy_args, cfg);
    let mut out = Vec::new();
    for rule in &RULES {
        let crate::rules::Check::Policies(check) = rule.check else { continue };
        let Some(sev) = cfg.severity(rule.code) else { continue };
        let mut found = Vec::new();
        check(&ctx, &mut found);
        for f in found {
            if let Some(oi) = f.op {
                let o = &ctx.ops[oi];
                let ptr = match &f.primary {
                    Place::Spec { loc, .. } => loc.pointer.clone(),
                    Place::Policy { .. } => o.op.pointer.clone(),
                };
                if ignored(&workspaces[o.ws], &o.op, &ptr, f.code) {
                    continue;
                }
            }
            let (file, position, pointer, snip) = place(&ctx, &f.primary);
            let related = f
                .related
                .iter()
                .map(|(p, message)| {
                    let (file, position, pointer, snippet) = place(&ctx, p);
                    Related { file, position, pointer, message: message.clone(), snippet }
                })
                .collect();
            out.push(Finding {
                code: f.code,
                severity: sev,
                file,
                position,
                pointer,
                message: f.message,
                snippet: snip,
                related,
            });
        }
    }
    crate::lint::sort(&mut out);
    out.dedup();
    out
}

fn place(ctx: &PolicyCtx<'_>, p: &Place) -> (String, crate::source::Position, String, crate::lint::Snippet) {
    match p {
        Place::Spec { ws, loc } => {
            let src = ctx.workspaces[*ws].file(loc.file);
            let pos = src.position(loc.offset);
            (src.name.clone(), pos, loc.pointer.clone(), snippet(src, pos.line, loc.offset))
        }
        Place::Policy { file, span, pointer } => {
            let f = &ctx.policies.files[*file];
            let pos = f.position(span);
            (f.name().to_string(), pos, pointer.clone(), snippet(&f.source, pos.line, span.start as u32))
        }
    }
}

/// What linting a set of specs found: every finding (spec rules, and IDEM1xx when policies were
/// given), and the specs that could not be read.
#[derive(Debug, Default)]
pub struct Linted {
    pub findings: Vec<Finding>,
    pub errors: Vec<crate::source::FatalError>,
}

/// Lints every spec and, with `policies` (loaded from `policy_paths`), cross-checks them: the
/// one orchestration `idem-lint` runs. A spec that cannot be read is an error of its own while the
/// others are still linted; the cross-check then waits, since with a spec missing every policy
/// of its operations would look orphaned.
pub fn lint_specs(specs: &[String], policies: Option<&PolicySet>, policy_paths: &[String], cfg: &Config) -> Linted {
    let mut linted = Linted::default();
    let mut workspaces = Vec::new();
    for spec in specs {
        match Workspace::load(spec) {
            Ok(ws) => {
                linted.findings.extend(crate::lint::lint_workspace(&ws, cfg));
                workspaces.push(ws);
            }
            Err(e) => linted.errors.push(e),
        }
    }
    if let (Some(set), true) = (policies, linted.errors.is_empty()) {
        linted.findings.extend(cross_check(&workspaces, set, policy_paths, cfg));
    }
    crate::lint::sort(&mut linted.findings);
    linted
}
