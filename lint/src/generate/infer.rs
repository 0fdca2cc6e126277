//! What the rest of the operation says, beyond its statement: who the caller is (its
//! `security`), whether it is a provider's delivery (a callback or notification with a JSON
//! body), and whether the spec has the lookup a repeat can be answered from — and the
//! `x-idempotency` fields that say outright what the spec cannot (scope, fingerprint,
//! forwarding, what is remembered). (`store = "redis"` needs the bundle's `[redis]` table: it
//! stays a hand edit of the file, which regeneration keeps.) Each choice carries the comment the generated file
//! writes above it, naming the part of the spec it came from.

use crate::loader::Workspace;
use crate::model::Operation;
use crate::node::Node;
use crate::security::{caller, Caller};
use idem_filter::policy::Source;

/// One line the generated policy writes, with the comment that says where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The route's own fields (before `[route.key]`), `[route.key]`, `[route.token]`, or
    /// `[route.reconcile]`.
    pub table: Table,
    /// `scope = []`
    pub line: String,
    /// `# no security declared …`
    pub why: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    Route,
    Key,
    /// `[route.token]` of a token route: only the caller (`scope`) applies there.
    Token,
    Reconcile,
}

/// The body fields that name the sender's account, for a scope where no security is declared.
const ACCOUNT_FIELDS: [&str; 8] =
    ["mchid", "mch_id", "merchant_id", "app_id", "appid", "account_id", "partner_id", "seller_id"];

/// Words in a path, operationId or summary that say the operation receives deliveries.
const DELIVERY_WORDS: [&str; 7] = ["notify", "notification", "callback", "webhook", "通知", "回调", "推送"];

/// The statement's own fields of `x-idempotency` (read by `statement`).
use crate::statement::EXTENSION_FIELDS as STATEMENT_FIELDS;

/// The policy fields an operation's `x-idempotency` may set beside its statement: what the
/// statement cannot say (who the caller is, what must match, how the request is forwarded, where
/// keys live, what is remembered), written into its policy by `idem-lint policies`.
pub const POLICY_FIELDS: [&str; 10] = [
    "forward",
    "scope",
    "anonymous",
    "fingerprint",
    "fingerprint_body",
    "on_in_flight",
    "wait_timeout",
    "lock_ttl",
    "remember",
    "unknown_outcome_hold",
];

/// Where a policy field of `x-idempotency` goes: the route's own fields, or `[route.key]`.
fn table_of(field: &str) -> Table {
    if field == "forward" {
        Table::Route
    } else {
        Table::Key
    }
}

/// The body field that names the sender's account, if the body declares one.
fn account_field(ws: &Workspace, op: &Operation<'_>) -> Option<&'static str> {
    ACCOUNT_FIELDS.into_iter().find(|f| {
        op.body.fields.iter().any(|p| p.name == *f)
            || op.body.schemas.iter().any(|s| {
                let mut seen = std::collections::HashSet::new();
                crate::rules::idem004_undeclared_key::schema_has(ws, *s, &[f.to_string()], &mut seen)
            })
    })
}

/// Whether the operation receives a provider's deliveries: its path, operationId or summary
/// says notify / callback / webhook (通知, 回调, 推送).
fn is_delivery(op: &Operation<'_>) -> bool {
    let text = |k: &str| op.at.node.get(k).and_then(Node::as_str).unwrap_or_default().to_lowercase();
    let said = format!("{} {} {}", op.path.to_lowercase(), text("operationId"), text("summary"));
    DELIVERY_WORDS.iter().any(|w| said.contains(w))
}

/// The spec's own lookup for a one-part key: a `GET` whose path ends in one parameter named as
/// the key is (`GET /refunds/{out_refund_no}` for the key `out_refund_no`), as the policy's
/// `lookup` with that parameter as `{key}`.
fn lookup(ops: &[Operation<'_>], key: &[Source]) -> Option<String> {
    let name = match key {
        [Source::Header(n) | Source::Query(n) | Source::Form(n) | Source::Path(n)] => n.clone(),
        [Source::Body(pointer)] => pointer.rsplit('/').next().unwrap_or_default().to_string(),
        _ => return None,
    };
    let norm = |s: &str| s.chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase();
    ops.iter().filter(|o| o.method == "get").find_map(|o| {
        let (head, last) = o.path.rsplit_once('/')?;
        let param = last.strip_prefix('{')?.strip_suffix('}')?;
        (norm(param) == norm(&name) && !head.contains('{')).then(|| format!("{head}/{{key}}"))
    })
}

/// Everything the operation says beyond its statement, as the policy's lines. `key` is the
/// statement's key; `replays` says the statement's duplicate answer is the first result (2xx).
pub fn choices(
    ws: &Workspace,
    ops: &[Operation<'_>],
    op: &Operation<'_>,
    key: &[Source],
    replays: bool,
) -> Vec<Choice> {
    let choice = |table, line: String, why: String| Choice { table, line, why };
    let mut out = Vec::new();
    let json_body = !op.body.form && op.body.xml_root.is_none();
    let delivery = is_delivery(op) && !key.is_empty();
    match caller(ws, op) {
        Caller::Nobody => match account_field(ws, op) {
            Some(f) => {
                let source = if op.body.form { format!("form:{f}") } else { format!("body:/{f}") };
                out.push(choice(
                    Table::Key,
                    format!("scope = [{}]", quoted(&source)),
                    format!("no security declared; the body names the sender's account (`{f}`)"),
                ));
            }
            None if delivery => out.push(choice(
                Table::Key,
                "scope = []".into(),
                "no security declared on a delivery: keys are global to the route (the sender signs its \
                 calls; verify the signature in front of idem)"
                    .into(),
            )),
            None => out.push(choice(
                Table::Key,
                "scope = []".into(),
                "no security declared: keys are global to the route, so any caller sending a key gets the \
                 first answer under it; declare the operation's security (or x-idempotency.scope) if callers \
                 must be kept apart"
                    .into(),
            )),
        },
        Caller::Header(header, name) if header != "authorization" => out.push(choice(
            Table::Key,
            format!("scope = [{}]", quoted(&format!("header:{header}"))),
            format!("the caller is the API key header of `{name}` in the operation's security"),
        )),
        Caller::Token(name) => out.push(choice(
            Table::Key,
            "scope = [\"metadata:envoy.filters.http.jwt_authn/jwt_payload/sub\"]".into(),
            format!(
                "`{name}` in the operation's security is a token: its verified subject (Envoy's jwt_authn \
                 with payload_in_metadata: jwt_payload), which a token refresh between retries keeps"
            ),
        )),
        Caller::Header(..) | Caller::Other => {}
    }
    if delivery {
        if json_body && key.iter().any(|s| matches!(s, Source::Body(_))) {
            out.push(choice(
                Table::Key,
                "fingerprint_body = \"canonical-json\"".into(),
                "a delivery with a JSON body: a re-delivery may re-serialize it (members in another order)".into(),
            ));
        }
        out.push(choice(
            Table::Key,
            "remember = [\"2xx\"]".into(),
            "a delivery: the sender delivers again until it gets a 2xx, so only a 2xx ends it".into(),
        ));
    }
    if delivery || replays {
        let why = if delivery { "a delivery" } else { "the statement's duplicate answer is the first result" };
        out.push(choice(
            Table::Key,
            "on_in_flight = \"wait\"".into(),
            format!("{why}: a repeat while the first runs waits for its answer"),
        ));
        match lookup(ops, key) {
            Some(path) => out.push(choice(
                Table::Reconcile,
                format!("lookup = {}", quoted(&path)),
                format!(
                    "the spec's GET {} says whether a first attempt with no answer ran",
                    path.replace("{key}", "{…}")
                ),
            )),
            None if delivery => out.push(choice(
                Table::Route,
                "forward = \"detached\"".into(),
                "a delivery: its run finishes even when the sender gives up waiting, and the next delivery \
                 gets its answer"
                    .into(),
            )),
            None => {}
        }
    }
    out
}

/// The `x-idempotency` fields of the operation, as policy lines that replace what was inferred;
/// an unknown field or a value of the wrong shape is an error naming it.
pub fn overrides(op: &Operation<'_>) -> Result<Vec<Choice>, String> {
    let Some(x) = op.at.node.get("x-idempotency") else {
        return Ok(Vec::new());
    };
    let Some(entries) = x.as_map() else {
        return Err("x-idempotency is not a mapping of policy fields".into());
    };
    let mut out = Vec::new();
    for e in entries.iter().filter(|e| !STATEMENT_FIELDS.contains(&e.key.as_str())) {
        if !POLICY_FIELDS.contains(&e.key.as_str()) {
            let known = STATEMENT_FIELDS.iter().chain(&POLICY_FIELDS).copied().collect::<Vec<_>>().join(", ");
            return Err(format!("x-idempotency.{} is not a field it can set (one of {known})", e.key));
        }
        let value = toml_value(&e.value)
            .ok_or_else(|| format!("x-idempotency.{}: a string, a number, a boolean or a list of them", e.key))?;
        out.push(Choice {
            table: table_of(&e.key),
            line: format!("{} = {value}", e.key),
            why: format!("x-idempotency.{} in the spec", e.key),
        });
    }
    Ok(out)
}

/// A scalar or a list of scalars as TOML.
fn toml_value(n: &Node) -> Option<String> {
    if let Some(items) = n.as_seq() {
        let items: Option<Vec<String>> = items.iter().map(scalar).collect();
        return Some(format!("[{}]", items?.join(", ")));
    }
    scalar(n)
}

fn scalar(n: &Node) -> Option<String> {
    if let Some(s) = n.as_str() {
        return Some(quoted(s));
    }
    if let Some(b) = n.as_bool() {
        return Some(b.to_string());
    }
    let text = n.scalar_text()?;
    text.parse::<i64>().ok().map(|i| i.to_string())
}

fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The choices with the overrides applied: an override replaces what was inferred for its field.
pub fn merged(inferred: Vec<Choice>, overrides: Vec<Choice>) -> Vec<Choice> {
    let field = |c: &Choice| c.line.split(" = ").next().unwrap_or_default().to_string();
    let set: Vec<String> = overrides.iter().map(field).collect();
    let mut out: Vec<Choice> = inferred.into_iter().filter(|c| !set.contains(&field(c))).collect();
    out.extend(overrides);
    out
}
