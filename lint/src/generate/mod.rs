//! `idem-lint policies SPEC… -o DIR`: the gateway policies written from the spec.
//!
//! One policy file per operation whose statement says it is idempotent, in the format of
//! `policies/*.toml`, with only what the statement says (everything else is the filter's
//! default):
//!
//! | statement | policy |
//! |---|---|
//! | the operation's method and path (as written under `paths`) | `match = { method, path }` |
//! | `operationId` (kebab-case), else method and path | `name`, and the file name |
//! | key in a header, the query, the path or the body (a JSON body key becomes a JSON pointer: `transaction_id` → `/transaction_id`, `$.data.id` → `/data/id`; a form-encoded body's is a `form` field; an XML body's an element under the schema's `xml.name` root) | `[route.key]` `from`, `name` |
//! | key made of several names (`out_trade_no + trade_no（body）`) | `[route.key]` `parts = ["body:/out_trade_no", "body:/trade_no"]` |
//! | key without a location | the location of the parameter or body property that declares it |
//! | a header key named `…token…` whose issue endpoint (a documented `POST`) the operation's or the header's description names | `mode = "token"`, `[route.token]` `header`, `issue_path` |
//! | expiry | `ttl` of the key or the token |
//! | duplicate status 4xx | `on_completed = "reject"` and `[route.duplicate]`: every repeat gets it, as documented |
//! | duplicate status 2xx | `on_completed = "replay"` (the first answer is replayed) and `[route.duplicate]` |
//!
//! An operation that cannot be written as a policy the filter enforces as documented (no key, a
//! path key the path does not have, a 5xx duplicate, an undeclared key without location) is
//! skipped with the reason: `idem-lint SPEC --policies DIR` then reports it (IDEM102), as it should.
//!
//! Every file is checked with the filter's parser before anything is written ([`write`]).

mod infer;
mod receiver;
mod write;

use infer::{Choice, Table};

pub use infer::POLICY_FIELDS;
pub use receiver::generate_receivers;
pub use write::{write_all, Action, Planned};

use crate::config::Config;
use crate::loader::Workspace;
use crate::model::{operations, Operation, METHODS};
use crate::node::Node;
use crate::policy::keys::{key_toml, spec_sources};
use crate::policy::PolicyFile;
use crate::statement::{statements, Loc, Statement};
use crate::value::{duration_secs, Tri};
use idem_filter::policy::Source;

/// One policy file to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// `create-order.toml`.
    pub file_name: String,
    /// The route's name.
    pub route: String,
    /// `POST /api/order/create`, for messages.
    pub operation: String,
    /// The policy (TOML), without the header [`write`] adds.
    pub body: String,
    /// The spec it came from and the operation's `file:line:col`, for the header and messages.
    pub spec: String,
    pub place: String,
}

/// An idempotent operation no policy was written for, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub operation: String,
    /// `file:line:col` of the statement field concerned.
    pub place: String,
    pub reason: String,
}

/// The policies of every documented-idempotent operation of the specs, in document order.
pub fn generate(workspaces: &[Workspace], cfg: &Config) -> (Vec<Generated>, Vec<Skipped>) {
    let all: Vec<String> = METHODS.iter().map(|m| m.to_string()).collect();
    let mut out: Vec<Generated> = Vec::new();
    let mut skipped = Vec::new();
    for ws in workspaces {
        let ops = operations(ws, &all);
        for op in &ops {
            let Some(st) = statements(ws, op, &cfg.section_titles, true).merged() else {
                continue;
            };
            if st.idempotent.as_ref().map(|f| &f.value) != Some(&Tri::Yes) {
                continue;
            }
            match route_for(ws, &ops, op, &st) {
                Ok(mut policy) => {
                    let name = unique_name(&base_name(op), &out);
                    policy.name = name;
                    let body = policy.toml();
                    let place = place(ws, &Loc { file: op.key_file, offset: op.key_offset, pointer: String::new() });
                    match checked(ws, op, &policy.name, body, place) {
                        Ok(g) => out.push(g),
                        Err(s) => skipped.push(s),
                    }
                }
                Err((loc, reason)) => {
                    skipped.push(Skipped { operation: op.label(), place: place(ws, &loc), reason });
                }
            }
        }
    }
    (out, skipped)
}

/// The file written for `op`'s route `name`, once the filter's parser — the authority — accepts
/// it; a route it refuses is not written, and the operation is named with the parser's reasons.
fn checked(ws: &Workspace, op: &Operation<'_>, name: &str, body: String, place: String) -> Result<Generated, Skipped> {
    let file_name = format!("{name}.toml");
    match PolicyFile::parse(&file_name, &body) {
        Ok(_) => Ok(Generated {
            file_name,
            route: name.to_string(),
            operation: op.label(),
            body,
            spec: ws.file(0).name.clone(),
            place,
        }),
        Err(e) => Err(Skipped {
            operation: op.label(),
            place,
            reason: format!(
                "the filter refuses the policy written for it: {}",
                e.0.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>().join("; ")
            ),
        }),
    }
}

fn place(ws: &Workspace, loc: &Loc) -> String {
    let f = ws.file(loc.file);
    let p = f.position(loc.offset);
    format!("{}:{}:{}", f.name, p.line, p.column)
}

/// What a route says, before it is written as TOML.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Policy {
    name: String,
    method: String,
    path: String,
    token: Option<String>,
    key: Vec<Source>,
    ttl: Option<String>,
    on_completed: Option<&'static str>,
    duplicate: Option<(u16, Option<String>)>,
    /// What the rest of the operation says (its security, a delivery, its lookup) and its
    /// `x-idempotency` fields, each with where it came from (see `infer`).
    choices: Vec<Choice>,
}

impl Policy {
    fn toml(&self) -> String {
        let q = |s: &str| toml::Value::String(s.to_string()).to_string();
        let lines = |table: Table| {
            let mut out = String::new();
            for c in self.choices.iter().filter(|c| c.table == table) {
                out.push_str(&format!("# {}\n{}\n", c.why, c.line));
            }
            out
        };
        let mut t = String::from("[[route]]\n");
        t.push_str(&format!("name = {}\n", q(&self.name)));
        t.push_str(&format!("match = {{ method = {}, path = {} }}\n", q(&self.method), q(&self.path)));
        t.push_str(&lines(Table::Route));
        match &self.token {
            Some(issue) => {
                t.push_str("mode = \"token\"\n\n[route.token]\n");
                let header = match self.key.as_slice() {
                    [Source::Header(h)] => h.as_str(),
                    _ => "",
                };
                t.push_str(&format!("header = {}\n", q(header)));
                t.push_str(&format!("issue_path = {}\n", q(issue)));
                if let Some(ttl) = &self.ttl {
                    t.push_str(&format!("ttl = {}\n", q(ttl)));
                }
                t.push_str(&lines(Table::Token));
            }
            None => {
                t.push_str("mode = \"key\"\n\n[route.key]\n");
                t.push_str(&key_toml(&self.key));
                if let Some(ttl) = &self.ttl {
                    t.push_str(&format!("ttl = {}\n", q(ttl)));
                }
                if let Some(c) = self.on_completed {
                    t.push_str(&format!("on_completed = {}\n", q(c)));
                }
                t.push_str(&lines(Table::Key));
            }
        }
        let reconcile = lines(Table::Reconcile);
        if !reconcile.is_empty() {
            t.push_str(&format!("\n[route.reconcile]\n{reconcile}"));
        }
        if let Some((status, code)) = &self.duplicate {
            t.push_str(&format!("\n[route.duplicate]\nstatus = {status}\n"));
            if let Some(code) = code {
                t.push_str(&format!("code = {}\n", q(code)));
            }
        }
        t
    }
}

type Refusal = (Loc, String);

fn route_for(ws: &Workspace, ops: &[Operation<'_>], op: &Operation<'_>, st: &Statement) -> Result<Policy, Refusal> {
    let Some(key) = &st.key else {
        return Err((
            st.loc.clone(),
            "it names no idempotency key (IDEM003): the gateway has nothing to deduplicate on".into(),
        ));
    };
    if key.value.is_none() {
        return Err((
            key.loc.clone(),
            "its statement says it has no key: the gateway has nothing to deduplicate on".into(),
        ));
    }
    let sources = spec_sources(ws, op, &key.value).map_err(|why| (key.loc.clone(), why))?;
    let duplicate =
        match &st.duplicate {
            Some(d) => match d.value.status {
                Some(s) if !(200..=499).contains(&s) => {
                    return Err((
                        d.loc.clone(),
                        format!(
                    "its duplicate answer is {s}: the filter answers a duplicate with 200-499, never a 5xx (IDEM007)"
                ),
                    ))
                }
                Some(s) => Some((s, d.value.code.clone())),
                None if d.value.class == Some(5) => return Err((
                    d.loc.clone(),
                    "its duplicate answer is a 5XX: the filter answers a duplicate with 200-499, never a 5xx (IDEM007)"
                        .into(),
                )),
                None => None,
            },
            None => None,
        };
    let ttl = statement_ttl(st);
    let token = match sources.as_slice() {
        [Source::Header(name)] if name.to_ascii_lowercase().contains("token") => issue_endpoint(ops, op, name),
        _ => None,
    };
    let on_completed = match (&token, &duplicate) {
        (None, Some((s, _))) if *s >= 400 => Some("reject"),
        (None, Some(_)) => Some("replay"),
        _ => None,
    };
    // A token route has no [route.key]: of what the rest of the spec says, only the caller applies.
    let choices = match &token {
        Some(_) => infer::choices(ws, ops, op, &sources, false)
            .into_iter()
            .filter(|c| c.line.starts_with("scope = "))
            .map(|c| Choice { table: Table::Token, ..c })
            .collect(),
        None => {
            let inferred = infer::choices(ws, ops, op, &sources, on_completed == Some("replay"));
            let overrides = infer::overrides(op).map_err(|why| {
                let at = op.at.node.get("x-idempotency").map_or(op.key_offset, |n| n.start);
                (Loc { file: op.at.file, offset: at, pointer: format!("{}/x-idempotency", op.pointer) }, why)
            })?;
            infer::merged(inferred, overrides)
        }
    };
    Ok(Policy {
        name: String::new(),
        method: op.method.to_ascii_uppercase(),
        path: op.path.to_string(),
        token,
        key: sources,
        ttl,
        on_completed,
        duplicate,
        choices,
    })
}

/// The token issue endpoint of a token-header operation: a documented `POST` operation whose
/// path the operation's description or the token header's description names.
fn issue_endpoint(ops: &[Operation<'_>], op: &Operation<'_>, header: &str) -> Option<String> {
    let mut texts: Vec<&str> = Vec::new();
    if let Some(d) = op.at.node.get("description").and_then(Node::as_str) {
        texts.push(d);
    }
    for p in op.params.iter().filter(|p| p.location == "header" && p.name.eq_ignore_ascii_case(header)) {
        if let Some(d) = p.at.node.get("description").and_then(Node::as_str) {
            texts.push(d);
        }
    }
    ops.iter()
        .filter(|o| o.method == "post" && o.path != op.path)
        .find(|o| texts.iter().any(|t| names_path(t, o.path)))
        .map(|o| o.path.to_string())
}

/// Does `text` name `path` as a whole (not as the prefix of a longer path)?
fn names_path(text: &str, path: &str) -> bool {
    text.match_indices(path).any(|(i, _)| {
        let after = text.get(i + path.len()..).and_then(|r| r.chars().next());
        after.is_none_or(|c| !(c.is_ascii_alphanumeric() || matches!(c, '/' | '-' | '_' | '{')))
    })
}

/// The statement's expiry as a policy duration: as the spec wrote it when the filter reads it so
/// (`24h`), else converted (`24 小时` → `1d`).
fn statement_ttl(st: &Statement) -> Option<String> {
    st.expiry.as_ref().and_then(|e| {
        let raw = e.value.trim();
        match idem_filter::policy::parse_duration(raw) {
            Ok(d) if d.millis > 0 => Some(raw.to_string()),
            _ => duration_secs(raw).filter(|s| *s > 0).map(duration_text),
        }
    })
}

/// Seconds as the policy's duration text, in the largest exact unit: `86400` → `"1d"`.
fn duration_text(secs: u64) -> String {
    for (unit, n) in [("d", 86_400), ("h", 3_600), ("m", 60)] {
        if secs.is_multiple_of(n) {
            return format!("{}{unit}", secs / n);
        }
    }
    format!("{secs}s")
}

/// The route name of an operation: its `operationId` in kebab-case (`createOrder` →
/// `create-order`), else its method and path (`post-api-orders-id-pay`); 1 to 64 of
/// `a-z 0-9 - _`, as the filter requires.
fn base_name(op: &Operation<'_>) -> String {
    let id = op.at.node.get("operationId").and_then(Node::as_str).map(kebab).filter(|s| !s.is_empty());
    let name = id.unwrap_or_else(|| kebab(&format!("{} {}", op.method, op.path)));
    let name = if name.is_empty() { "route".to_string() } else { name };
    name.chars().take(64).collect::<String>().trim_end_matches('-').to_string()
}

fn kebab(s: &str) -> String {
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        if c.is_ascii_alphanumeric() || c == '_' {
            let prev = i.checked_sub(1).and_then(|j| chars.get(j)).copied();
            let next = chars.get(i + 1).copied();
            let boundary = c.is_ascii_uppercase()
                && prev.is_some_and(|p| {
                    p.is_ascii_lowercase()
                        || p.is_ascii_digit()
                        || (p.is_ascii_uppercase() && next.is_some_and(|n| n.is_ascii_lowercase()))
                });
            if boundary && !out.ends_with('-') && !out.is_empty() {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_end_matches('-').to_string()
}

/// `name`, or `name-2`, `name-3`… when an earlier route has it.
fn unique_name(base: &str, taken: &[Generated]) -> String {
    let used = |n: &str| taken.iter().any(|g| g.route == n);
    if !used(base) {
        return base.to_string();
    }
    (2..)
        .map(|i| {
            let suffix = format!("-{i}");
            let head: String = base.chars().take(64 - suffix.len()).collect();
            format!("{head}{suffix}")
        })
        .find(|n| !used(n))
        .unwrap_or_else(|| base.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(kebab("createOrder"), "create-order");
        assert_eq!(kebab("createUsingPOST_1"), "create-using-post_1");
        assert_eq!(kebab("HTTPServerStart"), "http-server-start");
        assert_eq!(kebab("post /api/orders/{id}/pay"), "post-api-orders-id-pay");
        assert_eq!(kebab("下单"), "");
        assert_eq!(duration_text(86_400), "1d");
        assert_eq!(duration_text(36 * 3600), "36h");
        assert_eq!(duration_text(600), "10m");
        assert_eq!(duration_text(90), "90s");
        assert!(names_path("先调用 `POST /api/idempotent/token` 取令牌", "/api/idempotent/token"));
        assert!(!names_path("see /api/idempotent/tokens", "/api/idempotent/token"));
    }
}
