//! Who an operation's caller is, as its `security` declares it (the operation's own requirement,
//! else the document's): what the policy generator scopes keys on, and what the cross-check holds
//! a policy's scope to.

use crate::loader::{At, Workspace};
use crate::model::Operation;
use crate::node::Node;

/// The caller identity an operation's `security` declares (its first requirement's first
/// scheme).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// No security requirement (absent everywhere, `[]`, or only `{}`).
    Nobody,
    /// A credential in a header (lower-case name): an API key header, or HTTP basic or an
    /// opaque bearer token (`authorization`); the scheme's name.
    Header(String, String),
    /// A token whose verified subject names the caller: a JWT bearer (`bearerFormat: JWT`),
    /// OAuth2 or OpenID Connect (all sent in `authorization`); the scheme's name.
    Token(String),
    /// Something else (an API key in the query or a cookie, mutual TLS, an unknown scheme).
    Other,
}

impl Caller {
    /// The request header that carries the credential, if any.
    pub fn header(&self) -> Option<&str> {
        match self {
            Caller::Header(h, _) => Some(h),
            Caller::Token(_) => Some("authorization"),
            Caller::Nobody | Caller::Other => None,
        }
    }
}

/// The operation's effective security, as a [`Caller`].
pub fn caller(ws: &Workspace, op: &Operation<'_>) -> Caller {
    let root = ws.root();
    let requirements = op.at.node.get("security").or_else(|| root.node.get("security"));
    let Some(list) = requirements.and_then(Node::as_seq) else {
        return Caller::Nobody;
    };
    let names: Vec<&str> = list.iter().filter_map(Node::as_map).flatten().map(|e| e.key.as_str()).collect();
    let Some(name) = names.first() else {
        return Caller::Nobody;
    };
    let schemes = root
        .node
        .get("components")
        .and_then(|c| c.get("securitySchemes"))
        .or_else(|| root.node.get("securityDefinitions"));
    let Some(scheme) = schemes.and_then(|s| s.get(name)) else {
        return Caller::Other;
    };
    let scheme = ws.resolve(At { file: 0, node: scheme }).map_or(scheme, |a| a.node);
    let field = |k: &str| scheme.get(k).and_then(Node::as_str).unwrap_or_default().to_ascii_lowercase();
    let named = name.to_string();
    match (field("type").as_str(), field("scheme").as_str(), field("in").as_str()) {
        ("apikey", _, "header") => {
            let header = scheme.get("name").and_then(Node::as_str).unwrap_or_default().to_ascii_lowercase();
            Caller::Header(header, named)
        }
        ("http", "bearer", _) if field("bearerFormat") == "jwt" => Caller::Token(named),
        ("http", "bearer" | "basic", _) | ("basic", _, _) => Caller::Header("authorization".into(), named),
        ("oauth2", _, _) | ("openidconnect", _, _) => Caller::Token(named),
        _ => Caller::Other,
    }
}
