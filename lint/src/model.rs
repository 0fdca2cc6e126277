//! A thin typed view over the positioned tree: the operations of a spec with their resolved,
//! merged parameters. Only what the rules need; everything else stays in the tree.

use crate::loader::{At, FileId, Workspace};
use crate::node::{pointer, Node};

/// HTTP methods an OpenAPI 3.0/3.1 path item can hold, in the order the spec lists them.
pub const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// A parameter after `$ref` resolution.
#[derive(Debug, Clone, Copy)]
pub struct Param<'a> {
    pub name: &'a str,
    pub location: &'a str,
    pub at: At<'a>,
}

#[derive(Debug, Clone)]
pub struct Operation<'a> {
    /// Lower-case method as written in the spec (`post`).
    pub method: &'a str,
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
}

impl Operation<'_> {
    pub fn label(&self) -> String {
        format!("{} {}", self.method.to_ascii_uppercase(), self.path)
    }
}

/// All operations whose method is in `methods` (lower-case), in document order.
pub fn operations<'a>(ws: &'a Workspace, methods: &[String]) -> Vec<Operation<'a>> {
    let root = ws.root();
    let mut out = Vec::new();
    let Some(paths) = root.node.get("paths") else {
        return out;
    };
    let Some(paths_map) = paths.as_map() else {
        return out;
    };
    let paths_at = At { file: 0, node: paths };
    for pe in paths_map {
        let Some(item) = ws.resolve(At { file: 0, node: &pe.value }) else {
            continue;
        };
        let Some(item_map) = item.node.as_map() else {
            continue;
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
            out.push(Operation {
                method: oe.key.as_str(),
                path: pe.key.as_str(),
                at: op,
                key_file: item.file,
                key_offset: oe.key_start,
                pointer: pointer(["paths", pe.key.as_str(), oe.key.as_str()]),
                params,
                ancestors: vec![root, paths_at, item, op],
            });
        }
    }
    out
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
