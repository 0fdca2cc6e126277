//! A thin typed view over the positioned tree: the operations of a spec with their resolved,
//! merged parameters, request body and responses. Only what the rules need; everything else
//! stays in the tree.
//!
//! This is where Swagger 2.0 and OpenAPI 3 meet, so that the rules read one model. The nodes
//! stay the document's own (positions and pointers are those of the file as written):
//!
//! | model | OpenAPI 3.0/3.1 | Swagger 2.0 |
//! |---|---|---|
//! | [`Operation::params`] | `parameters` (path item + operation, `$ref`s followed) | the same; `in: body` and `in: formData` ones are listed too, under those locations |
//! | [`Body::schemas`] | `requestBody` (`$ref` followed) → `content.*.schema` | the `schema` of the `in: body` parameter |
//! | [`Body::fields`] | — | the `in: formData` parameters (each one a top-level body property) |
//! | [`Operation::responses`] | `responses` | `responses` (`schema`, `examples`, `headers` instead of `content`; `#/responses/…` refs followed) |
//!
//! Paths are the keys of `paths` as written: a Swagger `basePath`, like an OpenAPI `servers`
//! URL, is not prepended (the cross-check compares policies with these paths).

use crate::loader::{At, FileId, Version, Workspace};
use crate::node::{pointer, split_pointer, Node};

/// HTTP methods a path item can hold (Swagger 2.0 has all but `trace`), in the order the spec
/// lists them.
pub const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// A parameter after `$ref` resolution.
#[derive(Debug, Clone, Copy)]
pub struct Param<'a> {
    pub name: &'a str,
    pub location: &'a str,
    pub at: At<'a>,
}

/// What an operation is: a request clients send to the API, or a delivery the API sends to its
/// receivers (a webhook, a callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Under `paths`.
    Request,
    /// Under `webhooks` (OpenAPI 3.1) or `x-webhooks` (the 3.0 extension Redoc reads): `path` is
    /// the webhook's name.
    Webhook,
    /// Under an operation's `callbacks`: `path` is the callback URL's expression.
    Callback,
}

#[derive(Debug, Clone)]
pub struct Operation<'a> {
    pub kind: Kind,
    /// Lower-case method as written in the spec (`post`).
    pub method: &'a str,
    /// The `paths` key; a webhook's name; a callback's URL expression.
    pub path: &'a str,
    /// The operation object (after resolving a path-item `$ref`).
    pub at: At<'a>,
    /// Where the `post:` key is: findings about the operation as a whole point here.
    pub key_file: FileId,
    pub key_offset: u32,
    /// Logical JSON pointer in the root document, e.g. `/paths/~1api~1order~1create/post`.
    pub pointer: String,
    /// Path-level parameters merged with the operation's (the operation's win on the same
    /// name + location).
    pub params: Vec<Param<'a>>,
    /// Nodes from the root down to the operation, for `x-idem-lint-ignore` lookups.
    pub ancestors: Vec<At<'a>>,
    /// The pointer of each of `ancestors`.
    pub ancestor_pointers: Vec<String>,
    /// What the request body declares.
    pub body: Body<'a>,
    /// The `responses` object (after `$ref` resolution), when there is one.
    pub responses: Option<At<'a>>,
}

/// The request body of an operation, whichever version declared it.
#[derive(Debug, Clone, Default)]
pub struct Body<'a> {
    /// The body's schemas: one per media type (OpenAPI 3) or the body parameter's (Swagger 2.0).
    pub schemas: Vec<At<'a>>,
    /// Body fields declared one by one: Swagger 2.0 `in: formData` parameters.
    pub fields: Vec<Param<'a>>,
    /// Every media type of the body is `application/x-www-form-urlencoded` (Swagger 2.0: form
    /// fields and that media type in `consumes`, or no `consumes`).
    pub form: bool,
    /// Every media type of the body is XML, and its root element is named (the schema's
    /// `xml.name`): a body key is then an element under it.
    pub xml_root: Option<String>,
    /// The body takes CloudEvents in structured mode (`application/cloudevents+json`): a body key
    /// is an event attribute, which binary mode carries in a `ce-` header.
    pub cloudevents: bool,
}

impl Operation<'_> {
    pub fn label(&self) -> String {
        match self.kind {
            Kind::Request => format!("{} {}", self.method.to_ascii_uppercase(), self.path),
            Kind::Webhook => format!("webhook {} ({})", self.path, self.method.to_ascii_uppercase()),
            Kind::Callback => format!("callback {} {}", self.method.to_ascii_uppercase(), self.path),
        }
    }

    /// A webhook or a callback: the API sends it, its receivers deduplicate it.
    pub fn is_delivery(&self) -> bool {
        self.kind != Kind::Request
    }
}

/// All operations whose method is in `methods` (lower-case), in document order.
pub fn operations<'a>(ws: &'a Workspace, methods: &[String]) -> Vec<Operation<'a>> {
    let root = ws.root();
    let mut out = Vec::new();
    let Some(paths) = root.node.get("paths") else {
        return out;
    };
    let paths_at = At { file: 0, node: paths };
    for pe in paths.as_map().into_iter().flatten() {
        let pointer = vec!["paths".to_string(), pe.key.clone()];
        let above = vec![(root, String::new()), (paths_at, "/paths".to_string())];
        let place = Place { kind: Kind::Request, name: &pe.key, pointer, above };
        item_operations(ws, At { file: 0, node: &pe.value }, &place, methods, &mut out);
    }
    out
}

/// The deliveries the API sends, whose method is in `methods`: the operations of its `webhooks`
/// (OpenAPI 3.1) and `x-webhooks`, then of every operation's `callbacks`, in document order. A
/// delivery written once and referenced from several places (a callback under
/// `components/callbacks`) is one delivery, at its first place.
pub fn deliveries<'a>(ws: &'a Workspace, methods: &[String]) -> Vec<Operation<'a>> {
    let mut out = all_deliveries(ws, methods);
    let mut seen = std::collections::HashSet::new();
    out.retain(|op| seen.insert((op.at.file, op.at.node.start)));
    out
}

fn all_deliveries<'a>(ws: &'a Workspace, methods: &[String]) -> Vec<Operation<'a>> {
    let root = ws.root();
    let mut out = Vec::new();
    for table in ["webhooks", "x-webhooks"] {
        let Some(hooks) = root.node.get(table) else {
            continue;
        };
        let hooks_at = At { file: 0, node: hooks };
        for he in hooks.as_map().into_iter().flatten() {
            let pointer = vec![table.to_string(), he.key.clone()];
            let above = vec![(root, String::new()), (hooks_at, format!("/{table}"))];
            let place = Place { kind: Kind::Webhook, name: &he.key, pointer, above };
            item_operations(ws, At { file: 0, node: &he.value }, &place, methods, &mut out);
        }
    }
    let every: Vec<String> = METHODS.iter().map(|m| m.to_string()).collect();
    for op in operations(ws, &every) {
        let Some(callbacks) = op.at.node.get("callbacks").and_then(Node::as_map) else {
            continue;
        };
        for ce in callbacks {
            let Some(callback) = ws.resolve(At { file: op.at.file, node: &ce.value }) else {
                continue;
            };
            let mut callback_pointer = split_pointer(&op.pointer).unwrap_or_default();
            callback_pointer.extend(["callbacks".to_string(), ce.key.clone()]);
            for ue in callback.node.as_map().into_iter().flatten() {
                let mut pointer = callback_pointer.clone();
                pointer.push(ue.key.clone());
                let mut above: Vec<(At<'_>, String)> =
                    op.ancestors.iter().copied().zip(op.ancestor_pointers.iter().cloned()).collect();
                above.push((callback, crate::node::pointer(&callback_pointer)));
                let place = Place { kind: Kind::Callback, name: &ue.key, pointer, above };
                item_operations(ws, At { file: callback.file, node: &ue.value }, &place, methods, &mut out);
            }
        }
    }
    out
}

/// Where a path item sits: what its operations are, their `path`, the pointer to the item, and
/// the nodes above it.
struct Place<'a> {
    kind: Kind,
    name: &'a str,
    /// The item's pointer, segment by segment (unescaped).
    pointer: Vec<String>,
    /// The nodes above the item, with their pointers.
    above: Vec<(At<'a>, String)>,
}

/// The operations of one path item (a `paths` entry, a webhook, a callback expression).
fn item_operations<'a>(
    ws: &'a Workspace,
    item: At<'a>,
    place: &Place<'a>,
    methods: &[String],
    out: &mut Vec<Operation<'a>>,
) {
    let Some(item) = ws.resolve(item) else {
        return;
    };
    let Some(item_map) = item.node.as_map() else {
        return;
    };
    let path_params = resolve_params(ws, item, item.node.get("parameters"));
    for oe in item_map {
        if !METHODS.contains(&oe.key.as_str()) || !methods.contains(&oe.key) {
            continue;
        }
        let Some(op) = ws.resolve(At { file: item.file, node: &oe.value }) else {
            continue;
        };
        if op.node.as_map().is_none() {
            continue;
        }
        let own = resolve_params(ws, op, op.node.get("parameters"));
        let mut params: Vec<Param<'_>> =
            path_params.iter().filter(|p| !own.iter().any(|o| same_param(o, p))).copied().collect();
        params.extend(own);
        let body = match ws.version {
            Version::OpenApi3 => body_v3(ws, op),
            Version::Swagger2 => body_v2(ws, op, &params),
        };
        let responses = op.node.get("responses").and_then(|r| ws.resolve(At { file: op.file, node: r }));
        let mut segments = place.pointer.clone();
        segments.push(oe.key.clone());
        let op_pointer = pointer(segments.iter().map(String::as_str));
        let (mut ancestors, mut ancestor_pointers): (Vec<At<'a>>, Vec<String>) = place.above.iter().cloned().unzip();
        ancestors.extend([item, op]);
        ancestor_pointers.extend([pointer(&place.pointer), op_pointer.clone()]);
        out.push(Operation {
            kind: place.kind,
            method: oe.key.as_str(),
            path: place.name,
            at: op,
            key_file: item.file,
            key_offset: oe.key_start,
            pointer: op_pointer,
            params,
            ancestors,
            ancestor_pointers,
            body,
            responses,
        });
    }
}

/// OpenAPI 3: `requestBody.content.*.schema`.
fn body_v3<'a>(ws: &'a Workspace, op: At<'a>) -> Body<'a> {
    let mut body = Body::default();
    let Some(rb) = op.node.get("requestBody").and_then(|rb| ws.resolve(At { file: op.file, node: rb })) else {
        return body;
    };
    if let Some(content) = rb.node.get("content").and_then(Node::as_map) {
        body.schemas =
            content.iter().filter_map(|m| m.value.get("schema")).map(|n| At { file: rb.file, node: n }).collect();
        let media: Vec<String> = content.iter().map(|m| media_type(&m.key)).collect();
        body.form = !media.is_empty() && media.iter().all(|m| m == "application/x-www-form-urlencoded");
        body.cloudevents = media.iter().any(|m| m == "application/cloudevents+json");
        if !media.is_empty() && media.iter().all(|m| m == "application/xml" || m == "text/xml") {
            body.xml_root = body.schemas.iter().find_map(|s| {
                let schema = ws.resolve(*s)?;
                schema.node.get("xml")?.get("name")?.as_str().map(str::to_string)
            });
        }
    }
    body
}

/// A media type without parameters, lower-case: `Application/JSON; charset=utf-8` → `application/json`.
fn media_type(key: &str) -> String {
    key.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

/// Swagger 2.0: the `in: body` parameter's `schema`, and the `in: formData` parameters.
fn body_v2<'a>(ws: &'a Workspace, op: At<'a>, params: &[Param<'a>]) -> Body<'a> {
    let mut body = Body::default();
    let consumes = op.node.get("consumes").or_else(|| ws.root().node.get("consumes")).and_then(Node::as_seq);
    let urlencoded = match consumes {
        Some(list) => {
            let media: Vec<String> = list.iter().filter_map(Node::as_str).map(media_type).collect();
            !media.is_empty() && media.iter().all(|m| m == "application/x-www-form-urlencoded")
        }
        None => true,
    };
    body.form = urlencoded && params.iter().any(|p| p.location == "formData");
    for p in params {
        match p.location {
            "body" => {
                if let Some(schema) = p.at.node.get("schema") {
                    body.schemas.push(At { file: p.at.file, node: schema });
                }
            }
            "formData" => body.fields.push(*p),
            _ => {}
        }
    }
    body
}

fn same_param(a: &Param<'_>, b: &Param<'_>) -> bool {
    a.location == b.location
        && if a.location == "header" { a.name.eq_ignore_ascii_case(b.name) } else { a.name == b.name }
}

fn resolve_params<'a>(ws: &'a Workspace, ctx: At<'a>, list: Option<&'a Node>) -> Vec<Param<'a>> {
    let mut out = Vec::new();
    let Some(items) = list.and_then(Node::as_seq) else {
        return out;
    };
    for n in items {
        let Some(p) = ws.resolve(At { file: ctx.file, node: n }) else {
            continue;
        };
        let (Some(name), Some(location)) =
            (p.node.get("name").and_then(Node::as_str), p.node.get("in").and_then(Node::as_str))
        else {
            continue;
        };
        out.push(Param { name, location, at: p });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn path_level_params_merge_and_op_overrides() {
        let t = r#"openapi: 3.0.3
paths:
  /a/{id}:
    parameters:
      - {name: id, in: path, required: true, description: path-level}
      - $ref: '#/components/parameters/Key'
    get: {}
    post:
      parameters:
        - {name: id, in: path, required: true, description: op-level}
components:
  parameters:
    Key: {name: Idempotency-Key, in: header}
"#;
        let ws = Workspace::from_text("m.yaml", t).unwrap();
        let ops = operations(&ws, &["post".to_string()]);
        assert_eq!(ops.len(), 1);
        let op = &ops[0];
        assert_eq!(op.label(), "POST /a/{id}");
        assert_eq!(op.pointer, "/paths/~1a~1{id}/post");
        assert_eq!(op.params.len(), 2);
        let id = op.params.iter().find(|p| p.name == "id").unwrap();
        assert_eq!(id.at.node.get("description").unwrap().as_str(), Some("op-level"));
        assert!(op.params.iter().any(|p| p.name == "Idempotency-Key"));
    }
}
