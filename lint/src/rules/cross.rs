//! What a spec ↔ policy cross-check rule (IDEM1xx, `--policies`) sees: every operation of the
//! specs, every route of the policy set and which operations each route matches, plus the
//! places a finding can point at. `crate::crosscheck` builds the context (it pairs routes with
//! operations) and runs the rules; nothing here depends on it.

use std::ops::Range;

use idem_filter::policy::{Matcher, Mode, OnCompleted, RoutePolicy};

use crate::loader::Workspace;
use crate::model::Operation;
use crate::node::pointer;
use crate::policy::{shape, PolicySet, RouteRef, RouteSpans};
use crate::statement::{Loc, Statement};
use crate::value::Tri;

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

    pub fn idempotent(&self) -> Option<&Tri> {
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

/// What a cross-check rule sees (built by `crate::crosscheck::context`).
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

/// The check of a cross-check rule.
pub type CrossCheck = fn(&PolicyCtx<'_>, &mut Vec<CrossFinding>);

impl PolicyCtx<'_> {
    /// The index of a route's file in the set.
    fn file_index(&self, r: &RouteRef<'_>) -> usize {
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

/// Whether two path templates have the same shape: literal segments equal, `{param}` segments
/// matching each other whatever their names.
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

/// The caller scope a route keys on: `[route.token] scope` for a token route, else
/// `[route.key] scope` (IDEM107, IDEM108).
pub fn route_scope(r: &RoutePolicy) -> &[idem_filter::policy::Source] {
    match r.mode {
        Mode::Token => &r.token.scope,
        Mode::Key | Mode::Shadow => &r.key.scope,
    }
}
