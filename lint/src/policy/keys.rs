//! A spec's key as the filter reads it: each name of the statement's key, with its location, as
//! the filter's [`Source`] (`header:…`, `query:…`, `path:…`, and for the body `body:/…`, or
//! `form:…` when the operation's body is form-encoded, `xml:/<root>/…` when it is XML, or
//! `cloudevent:…` when it takes CloudEvents). The
//! policy generator writes these; IDEM103 compares a policy's key with them.

use crate::loader::Workspace;
use crate::model::Operation;
use crate::value::{KeyIn, KeySpec};
use idem_filter::policy::Source;

/// The filter's sources for a statement's key, in the statement's order; `Err` says why a name
/// cannot be read by the filter as documented.
pub fn spec_sources(ws: &Workspace, op: &Operation<'_>, key: &KeySpec) -> Result<Vec<Source>, String> {
    key.parts
        .iter()
        .map(|part| {
            let name = part.name.trim().trim_matches('`');
            let location = match &part.location {
                Some(l) => l.clone(),
                None => declared_location(ws, op, name).ok_or_else(|| {
                    format!("its key \"{name}\" has no location and is not declared as a header, query, path parameter or body property (IDEM004)")
                })?,
            };
            source_of(op, &location, name)
        })
        .collect()
}

fn source_of(op: &Operation<'_>, location: &KeyIn, name: &str) -> Result<Source, String> {
    Ok(match location {
        KeyIn::Header => Source::Header(name.to_string()),
        KeyIn::Query => Source::Query(name.to_string()),
        KeyIn::Path if op.path.contains(&format!("{{{name}}}")) && idem_filter::policy::is_param_name(name) => {
            Source::Path(name.to_string())
        }
        KeyIn::Path => return Err(format!("its key \"{name}\" is not a parameter of the path {}", op.path)),
        KeyIn::Body if op.body.form => Source::Form(name.to_string()),
        KeyIn::Body if op.body.cloudevents => Source::CloudEvent(name.trim_start_matches('/').to_string()),
        KeyIn::Body => match &op.body.xml_root {
            Some(root) => {
                let path = format!("/{root}/{}", name.trim_start_matches('/'));
                Source::Xml(idem_filter::policy::xml_path(&path).map_err(|e| format!("its key \"{name}\": {e}"))?)
            }
            None => Source::Body(body_pointer(name)),
        },
        KeyIn::Other(o) => return Err(format!("its key location \"{o}\" is unknown (IDEM004)")),
    })
}

/// Whether two sources read the same value: header names compare case-insensitively, body
/// pointers as pointers (a dotted spec path and its pointer are one key), a digest as the value
/// it digests.
fn same_source(a: &Source, b: &Source) -> bool {
    match (a, b) {
        // A value by its digest is that value: the spec names the field, the policy hashes it.
        (Source::Digest(x), y) | (y, Source::Digest(x)) => same_source(x, y),
        (Source::Header(x), Source::Header(y)) => x.eq_ignore_ascii_case(y),
        (Source::Body(x), Source::Body(y)) => x == y || x.replace('.', "/") == y.replace('.', "/"),
        _ => a == b,
    }
}

/// Whether a policy's key parts are the spec's, in any order (the order only changes how the
/// gateway hashes them, not which request is a repeat).
pub fn same_sources(policy: &[Source], spec: &[Source]) -> bool {
    policy.len() == spec.len()
        && policy.iter().all(|p| spec.iter().any(|s| same_source(p, s)))
        && spec.iter().all(|s| policy.iter().any(|p| same_source(p, s)))
}

/// Where an operation declares a key without a stated location: a header, then a query
/// parameter, then a path parameter, then a body property.
fn declared_location(ws: &Workspace, op: &Operation<'_>, name: &str) -> Option<KeyIn> {
    if op.params.iter().any(|p| p.location == "header" && p.name.eq_ignore_ascii_case(name)) {
        return Some(KeyIn::Header);
    }
    if op.params.iter().any(|p| p.location == "query" && p.name == name) {
        return Some(KeyIn::Query);
    }
    if op.params.iter().any(|p| p.location == "path" && p.name == name) {
        return Some(KeyIn::Path);
    }
    let segments = crate::node::split_pointer(&body_pointer(name))?;
    let in_body = op.body.fields.iter().any(|f| segments.len() == 1 && f.name == segments[0])
        || op.body.schemas.iter().any(|s| {
            let mut seen = std::collections::HashSet::new();
            crate::rules::idem004_undeclared_key::schema_has(ws, *s, &segments, &mut seen)
        });
    in_body.then_some(KeyIn::Body)
}

/// A body key as the filter's JSON pointer: a pointer stays, a JSONPath `$.data.id` is
/// `/data/id`, a property name is a top-level property (`transaction_id` → `/transaction_id`;
/// `a.b` is the property called `a.b`, as IDEM004 reads it).
fn body_pointer(name: &str) -> String {
    if name.starts_with('/') {
        return name.to_string();
    }
    match name.strip_prefix("$.") {
        Some(path) => crate::node::pointer(path.split('.')),
        None => crate::node::pointer([name]),
    }
}

/// How a policy writes a key: `from` + `name` for one part, `parts` for several.
pub fn key_toml(sources: &[Source]) -> String {
    let q = |s: &str| toml::Value::String(s.to_string()).to_string();
    match sources {
        // Azure's (OASIS Repeatable Requests) header is a protocol, not only a key: its
        // First-Sent window and its answers come with it.
        [Source::Header(n)] if n.eq_ignore_ascii_case(idem_filter::policy::REPEATABILITY_REQUEST_ID) => {
            "protocol = \"repeatable-requests\"\n".to_string()
        }
        [one] => {
            let (from, name) = match one {
                Source::Header(n) => ("header", n.clone()),
                Source::Query(n) => ("query", n.clone()),
                Source::Body(p) => ("body", p.clone()),
                Source::Form(n) => ("form", n.clone()),
                Source::Xml(path) => ("xml", format!("/{}", path.join("/"))),
                Source::Path(n) => ("path", n.clone()),
                Source::CloudEvent(a) => ("cloudevent", a.clone()),
                other => return format!("parts = [{}]\n", q(&other.to_string())),
            };
            format!("from = {}\nname = {}\n", q(from), q(&name))
        }
        many => {
            let parts: Vec<String> = many.iter().map(|s| q(&s.to_string())).collect();
            format!("parts = [{}]\n", parts.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_and_comparisons() {
        assert_eq!(body_pointer("transaction_id"), "/transaction_id");
        assert_eq!(body_pointer("$.data.id"), "/data/id");
        assert_eq!(body_pointer("/a/b"), "/a/b");
        assert_eq!(body_pointer("a.b"), "/a.b");
        assert_eq!(body_pointer("a/b"), "/a~1b");
        assert!(same_source(&Source::Header("Idempotency-Key".into()), &Source::Header("idempotency-key".into())));
        assert!(same_sources(
            &[Source::Form("app_id".into()), Source::Form("out_trade_no".into())],
            &[Source::Form("out_trade_no".into()), Source::Form("app_id".into())]
        ));
        assert!(!same_sources(&[Source::Body("/a".into())], &[Source::Body("/a".into()), Source::Body("/b".into())]));
        assert_eq!(key_toml(&[Source::Path("id".into())]), "from = \"path\"\nname = \"id\"\n");
        assert_eq!(
            key_toml(&[Source::Body("/mchid".into()), Source::Body("/out_trade_no".into())]),
            "parts = [\"body:/mchid\", \"body:/out_trade_no\"]\n"
        );
    }
}
