//! `idem-lint policies SPEC --receiver -o DIR`: the receivers' side of the spec's webhooks and
//! callbacks — one policy per delivery whose statement names its event id, for the gateway in
//! front of a service that receives it.
//!
//! | the sender's statement | the receiver's policy |
//! |---|---|
//! | the webhook's name (`orderPaid`), the callback's `operationId` or name | `name` (kebab-case), the file name |
//! | the delivery's method | `match.method`; `match.path` the receiver's own path, given as `--path NAME=PATH` (a sender's spec cannot know it), else `/webhooks/<name>` |
//! | the event id (`幂等键` / `key`) | `[route.key]` `from`, `name` (or `parts`) |
//! | expiry | `ttl`, else `"3d"` (senders redeliver for days: Stripe 3 days) |
//! | — | `scope = []` (the sender signs each delivery anew; event ids are unique per sender), `fingerprint = []` (a redelivery may be re-serialised and re-signed), `on_in_flight = "wait"`, `remember = ["2xx"]` (a failure releases the key, so the next delivery runs), a duplicate answered `200` (a redelivery is acknowledged) |
//!
//! A delivery without an event id is skipped with the reason (IDEM013 reports it).

use super::{base_name, place, unique_name, Generated, Skipped};
use crate::config::Config;
use crate::loader::Workspace;
use crate::model::{deliveries, Kind, Operation, METHODS};
use crate::node::{split_pointer, Node};
use crate::policy::keys::{key_toml, spec_sources};
use crate::statement::{statements, Loc, Statement};
use crate::value::Tri;

/// How long a receiver remembers an event when the statement names no expiry.
const DEFAULT_TTL: &str = "3d";

/// The receivers' policies of every delivery of the specs that names its event id. `paths`
/// maps a route name to the path the receiver takes that delivery on (`--path NAME=PATH`);
/// the others get `/webhooks/<name>`.
pub fn generate_receivers(
    workspaces: &[Workspace],
    cfg: &Config,
    paths: &[(String, String)],
) -> (Vec<Generated>, Vec<Skipped>) {
    let all: Vec<String> = METHODS.iter().map(|m| m.to_string()).collect();
    let mut out: Vec<Generated> = Vec::new();
    let mut skipped = Vec::new();
    for ws in workspaces {
        for op in deliveries(ws, &all) {
            let here = place(ws, &Loc { file: op.key_file, offset: op.key_offset, pointer: String::new() });
            let Some(st) = statements(ws, &op, &cfg.section_titles, true).merged() else {
                skipped.push(Skipped {
                    operation: op.label(),
                    place: here,
                    reason:
                        "it says nothing of its deliveries (IDEM013): name the event id its receivers deduplicate on"
                            .into(),
                });
                continue;
            };
            let name = unique_name(&receiver_name(&op), &out);
            let path = paths.iter().find(|(n, _)| *n == name).map(|(_, p)| p.as_str());
            match receiver_policy(ws, &op, &st, &name, path) {
                Ok(body) => match super::checked(ws, &op, &name, body, here) {
                    Ok(g) => out.push(g),
                    Err(s) => skipped.push(s),
                },
                Err((loc, reason)) => skipped.push(Skipped { operation: op.label(), place: place(ws, &loc), reason }),
            }
        }
    }
    (out, skipped)
}

/// A webhook's name; a callback's `operationId`, else the operation that registers it and the
/// callback's name (`createSubscription` + `onEvent` → `create-subscription-on-event`); in
/// kebab-case.
fn receiver_name(op: &Operation<'_>) -> String {
    if op.at.node.get("operationId").and_then(Node::as_str).is_some() {
        return base_name(op);
    }
    let name = match op.kind {
        // `…/<parent operation>/callbacks/<name>/<expression>/<method>`; the parent operation is
        // the fourth of the ancestors (root, `paths`, its path item, it).
        Kind::Callback => {
            let callback = split_pointer(&op.pointer)
                .and_then(|s| s.len().checked_sub(3).and_then(|i| s.get(i).cloned()))
                .unwrap_or_default();
            let parent = op.ancestors.get(3).and_then(|p| p.node.get("operationId")).and_then(Node::as_str);
            parent.map_or(callback.clone(), |p| format!("{p}-{callback}"))
        }
        _ => op.path.to_string(),
    };
    let name = super::kebab(&name);
    if name.is_empty() {
        "webhook".into()
    } else {
        name.chars().take(64).collect::<String>().trim_end_matches('-').to_string()
    }
}

fn receiver_policy(
    ws: &Workspace,
    op: &Operation<'_>,
    st: &Statement,
    name: &str,
    path: Option<&str>,
) -> Result<String, (Loc, String)> {
    let key = match &st.key {
        Some(k) if !k.value.is_none() => k,
        Some(k) => return Err((k.loc.clone(), "its statement says its deliveries carry no id".into())),
        None => return Err((
            st.loc.clone(),
            "it names no event id its receivers deduplicate on (IDEM013): the gateway has nothing to deduplicate on"
                .into(),
        )),
    };
    let sources = spec_sources(ws, op, &key.value).map_err(|why| (key.loc.clone(), why))?;
    let ttl = super::statement_ttl(st).unwrap_or_else(|| DEFAULT_TTL.to_string());
    let promise = match st.delivery.as_ref().map(|f| &f.value) {
        Some(Tri::Yes) => "delivers at least once",
        Some(Tri::No) => "promises one delivery, which no HTTP sender can keep (IDEM013)",
        _ => "does not say it delivers again (IDEM013), but every HTTP sender does",
    };
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    let mut t =
        format!("# The receiving side of {} (the sender {promise}).\n[[route]]\nname = {}\n", op.label(), q(name));
    let path = match path {
        Some(p) => p.to_string(),
        None => {
            t.push_str(&format!(
                "# The path your service receives it on, which the sender's spec cannot know: give it as\n\
                 # `--path {name}=/your/path` (a hand edit makes the file yours).\n"
            ));
            format!("/webhooks/{name}")
        }
    };
    t.push_str(&format!(
        "match = {{ method = {}, path = {} }}\nmode = \"key\"\n\n[route.key]\n",
        q(&op.method.to_ascii_uppercase()),
        q(&path)
    ));
    t.push_str(&key_toml(&sources));
    t.push_str("# The sender signs every delivery anew: its Authorization names no caller, and event ids are unique per sender.\nscope = []\n");
    t.push_str("# A redelivery may be serialised and signed anew (a new timestamp): only the event id must match.\nfingerprint = []\n");
    t.push_str(
        "# A redelivery while the first is still being handled waits for its answer.\non_in_flight = \"wait\"\n",
    );
    t.push_str("# Only a 2xx is kept: a failure releases the id, so the sender's next delivery runs again.\nremember = [\"2xx\"]\n");
    t.push_str(&format!("# How long the sender keeps delivering one event.\nttl = {}\n", q(&ttl)));
    t.push_str("\n# A redelivery of an event handled before is acknowledged, so the sender stops.\n[route.duplicate]\nstatus = 200\ncode = \"ALREADY_PROCESSED\"\n");
    Ok(t)
}
