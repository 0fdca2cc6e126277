//! `idem-admin show`: what the store holds for one client key — the operator's question "what
//! happened to refund rf-0001?". The key's stored identity is a SHA-256 over the route, the
//! caller's scope and the key (the store never holds raw keys): it is computed here exactly as the
//! filter computes it, from the route's policy and what the caller sends (its headers — the
//! `Authorization` of a default scope —, a body field, verified token metadata), then looked up.

use idem_filter::policy::{parse_bundle_all, Bundle, RoutePolicy};
use std::path::{Path, PathBuf};

/// A value an Envoy filter verified: its metadata path (`filter/field/…`) and the value.
pub type Verified = (Vec<String>, Vec<u8>);

/// The request a client sends, as far as the key's identity goes.
pub type Caller = idem_filter::request::PlainRequest;

/// The policy files of `paths` (a directory: its `*.toml`, sorted), each parsed as the filter
/// does; a route file that leaves `[redis]` to another file is read with a stand-in table (the
/// key's identity does not depend on it).
fn bundles(paths: &[PathBuf]) -> Result<Vec<(String, Bundle)>, String> {
    let mut files = Vec::new();
    for p in paths {
        if p.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(p)
                .map_err(|e| format!("--policy {}: {e}", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "toml"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(p.clone());
        }
    }
    let mut out = Vec::new();
    for f in files {
        let name = f.display().to_string();
        let text = std::fs::read_to_string(&f).map_err(|e| format!("--policy {name}: {e}"))?;
        let parsed = parse_bundle_all(&text, &name).or_else(|first| {
            if text.contains("[redis]") {
                return Err(first);
            }
            parse_bundle_all(&format!("{text}\n[redis]\ncluster = \"-\"\n"), &name).map_err(|_| first)
        });
        let bundle = parsed.map_err(|errors| {
            let all: Vec<String> = errors.iter().map(ToString::to_string).collect();
            format!("--policy {name}: {}", all.join("; "))
        })?;
        out.push((name, bundle));
    }
    Ok(out)
}

/// The route named `route` in the policy files.
pub fn route(paths: &[PathBuf], route: &str) -> Result<RoutePolicy, String> {
    let all = bundles(paths)?;
    let found = all.iter().flat_map(|(_, b)| b.routes.iter()).find(|r| r.name == route);
    found.cloned().ok_or_else(|| {
        let names: Vec<&str> = all.iter().flat_map(|(_, b)| b.routes.iter().map(|r| r.name.as_str())).collect();
        format!("no route {route:?} in {}; routes: {}", describe(paths), names.join(", "))
    })
}

fn describe(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// The key's stored identity on `route` for what `caller` sends.
pub fn scoped_id(route: &RoutePolicy, key: &str, caller: &Caller) -> Result<[u8; 32], String> {
    use idem_filter::request::KeyError;
    idem_filter::key::scoped_id(&route.name, &route.key.scope, route.key.anonymous, key, route.template(), caller)
        .map_err(|e| {
            let why = match e {
                KeyError::Missing(m) | KeyError::Invalid(m) | KeyError::ScopeMissing(m) | KeyError::Unsupported(m) => m,
            };
            format!(
                "route {:?}: {why} (give what the caller sends with --header, --metadata or --body-file)",
                route.name
            )
        })
}

/// `name: value` header flags.
pub fn headers(flags: &[String]) -> Result<Vec<(String, Vec<u8>)>, String> {
    flags
        .iter()
        .map(|h| match h.split_once(':') {
            Some((n, v)) if !n.trim().is_empty() => Ok((n.trim().to_ascii_lowercase(), v.trim().as_bytes().to_vec())),
            _ => Err(format!("--header {h:?}: expected `name: value`")),
        })
        .collect()
}

/// `filter/field/…=value` metadata flags.
pub fn metadata(flags: &[String]) -> Result<Vec<Verified>, String> {
    flags
        .iter()
        .map(|m| match m.split_once('=') {
            Some((path, v)) if path.contains('/') => {
                Ok((path.split('/').map(str::to_string).collect(), v.as_bytes().to_vec()))
            }
            _ => Err(format!("--metadata {m:?}: expected `filter/field/…=value`")),
        })
        .collect()
}

pub fn read_body(path: Option<&Path>) -> Result<Option<Vec<u8>>, String> {
    path.map(|p| std::fs::read(p).map_err(|e| format!("--body-file {}: {e}", p.display()))).transpose()
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_identity_is_the_filters_and_the_caller_is_part_of_it() {
        let dir = std::env::temp_dir().join(format!("idem-admin-show-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A Redis route whose [redis] is in another file still reads.
        std::fs::write(
            dir.join("r.toml"),
            "[[route]]\nname = \"create-refund\"\nmatch = { method = \"POST\", path = \"/refunds\" }\nstore = \"redis\"\n",
        )
        .unwrap();
        let r = route(std::slice::from_ref(&dir), "create-refund").unwrap();
        let caller = |auth: &str| Caller {
            method: "POST".into(),
            path: "/refunds".into(),
            headers: headers(&[format!("Authorization: {auth}")]).unwrap(),
            body: None,
            metadata: vec![],
        };
        let alice = scoped_id(&r, "rf-0001", &caller("Bearer alice")).unwrap();
        assert_ne!(alice, scoped_id(&r, "rf-0001", &caller("Bearer bob")).unwrap(), "another caller, another key");
        assert_eq!(alice, scoped_id(&r, "rf-0001", &caller("Bearer alice")).unwrap());
        let none = Caller { headers: vec![], ..caller("") };
        assert!(scoped_id(&r, "rf-0001", &none).unwrap_err().contains("keeps keys per caller"));
        assert!(route(std::slice::from_ref(&dir), "nope").unwrap_err().contains("routes: create-refund"));
        assert!(headers(&["no colon".into()]).is_err());
        assert_eq!(metadata(&["jwt/sub=alice".into()]).unwrap()[0].0, vec!["jwt", "sub"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
