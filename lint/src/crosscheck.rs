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

use std::ops::Range;

use idem_filter::policy::{Matcher, Mode, OnCompleted, RoutePolicy};

use crate::config::Config;
use crate::lint::{ignored, snippet, Finding, Related};
use crate::loader::Workspace;
use crate::model::{operations, Operation, METHODS};
use crate::node::pointer;
use crate::policy::{shape, PolicySet, RouteRef, RouteSpans};
use crate::rules::RULES;
use crate::statement::{statements, Loc, Statement};

/// One operation of one spec, with its merged statement.
pub struct Op<'a> {
    pub ws: usize,
    pub op: Operation<'a>,
    pub statement: Option<Statement>,
}

impl Op<'_> {
    pub fn label(&self) -> String {
        self.op.label()
    }

    pub fn idempotent(&self) -> Option<&crate::section::Tri> {
        self.statement.as_ref().and_then(|s| s.idempotent.as_ref()).map(|f| &f.value)
    }
}

/// A place a finding points at.
#[derive(Debug, Clone)]
pub enum Place {
    /// In a spec: the workspace index and the location.
    Spec { ws: usize, loc: Loc },
    /// In a policy file: the file's index in the set, the byte range and a JSON pointer into it.
    Policy { file: usize, span: Range<usize>, pointer: String },
}

/// A cross-check finding before severities, suppressions and positions.
#[derive(Debug, Clone)]
pub struct CrossFinding {
    pub code: &'static str,
    pub primary: Place,
    pub message: String,
    pub related: Vec<(Place, String)>,
    /// The operation concerned, for `x-idem-lint-ignore`.
    pub op: Option<usize>,
}

/// What a cross-check rule sees.
pub struct PolicyCtx<'a> {
    pub workspaces: &'a [Workspace],
    pub ops: Vec<Op<'a>>,
    pub policies: &'a PolicySet,
    pub routes: Vec<RouteRef<'a>>,
    /// For each route (index into `routes`), the operations it matches (indexes into `ops`).
    pub matches: Vec<Vec<usize>>,
    /// The file names given to `--policies`, for messages.
    pub policy_args: &'a [String],
}

pub type CrossCheck = fn(&PolicyCtx<'_>, &mut Vec<CrossFinding>);

impl<'a> PolicyCtx<'a> {
    pub fn new(workspaces: &'a [Workspace], policies: &'a PolicySet, policy_args: &'a [String], cfg: &Config) -> Self {
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

    /// The index of a route's file in the set.
    pub fn file_index(&self, r: &RouteRef<'_>) -> usize {
        self.policies.files.iter().position(|f| std::ptr::eq(f, r.file)).unwrap_or(0)
    }

    /// A place in a route's policy file: the first field span present, else the route name.
    pub fn policy_place(&self, ri: usize, candidates: &[(&Option<Range<usize>>, &str)]) -> Place {
        let r = &self.routes[ri];
        let (span, field) = candidates
            .iter()
            .find_map(|(s, f)| (*s).clone().map(|s| (s, *f)))
            .unwrap_or_else(|| (r.spans.name.clone(), "name"));
        let mut segs = vec!["route".to_string(), r.index.to_string()];
        segs.extend(field.split('/').filter(|s| !s.is_empty()).map(str::to_string));
        Place::Policy { file: self.file_index(r), span, pointer: pointer(segs.iter().map(String::as_str)) }
    }

    pub fn spans(&self, ri: usize) -> &RouteSpans {
        self.routes[ri].spans
    }

    /// A place in a spec: where the operation's `post:` key is.
    pub fn op_place(&self, oi: usize) -> Place {
        let o = &self.ops[oi];
        Place::Spec {
            ws: o.ws,
            loc: Loc { file: o.op.key_file, offset: o.op.key_offset, pointer: o.op.pointer.clone() },
        }
    }

    /// `POST /api/order/create` or `route create-order` — how a route matches, for messages.
    pub fn route_label(&self, ri: usize) -> String {
        let r = self.routes[ri].route;
        match &r.matcher {
            Matcher::Request { method: Some(m), path } => format!("{m} {}", path.source),
            Matcher::Request { method: None, path } => format!("any method {}", path.source),
            Matcher::RouteName(n) => format!("Envoy route {n:?}"),
        }
    }

    pub fn spec_names(&self) -> String {
        let names: Vec<&str> = self.workspaces.iter().map(|w| w.file(0).name.as_str()).collect();
        names.join(", ")
    }
}

fn normalize_id(s: &str) -> String {
    s.chars().filter(|c| *c != '-' && *c != '_').flat_map(char::to_lowercase).collect()
}

/// Whether a policy route matches an operation (see the module documentation).
pub fn route_matches(r: &RoutePolicy, op: &Operation<'_>) -> bool {
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

pub fn same_shape(a: &str, b: &str) -> bool {
    shape(a) == shape(b)
}

/// Whether a repeat of a completed request is answered with the route's `[route.duplicate]`
/// for a response of this status (see IDEM104).
pub fn answers_with_duplicate(r: &RoutePolicy, spec_status: u16) -> bool {
    match r.mode {
        Mode::Token => true,
        Mode::Shadow => false,
        Mode::Key => match r.key.on_completed {
            OnCompleted::Reject => true,
            OnCompleted::Replay => !r.key.remembers(spec_status),
        },
    }
}

/// Runs the enabled IDEM1xx rules and positions their findings.
pub fn cross_check(
    workspaces: &[Workspace],
    policies: &PolicySet,
    policy_args: &[String],
    cfg: &Config,
) -> Vec<Finding> {
    let ctx = PolicyCtx::new(workspaces, policies, policy_args, cfg);
    let mut out = Vec::new();
    for rule in &RULES {
        let Some(check) = rule.cross else { continue };
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

/// Lints specs and cross-checks them with a policy set: every finding, spec rules and IDEM1xx.
pub fn lint_with_policies(
    specs: &[String],
    policies: &[String],
    cfg: &Config,
) -> Result<Vec<Finding>, crate::source::FatalError> {
    let set = PolicySet::load(policies)?;
    let mut workspaces = Vec::new();
    let mut out = Vec::new();
    for s in specs {
        let ws = Workspace::load(s)?;
        out.extend(crate::lint::lint_workspace(&ws, cfg));
        workspaces.push(ws);
    }
    out.extend(cross_check(&workspaces, &set, policies, cfg));
    crate::lint::sort(&mut out);
    Ok(out)
}
