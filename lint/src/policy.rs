//! Gateway policy files, read with the filter's own parser (`idem_filter::policy::parse_bundle`:
//! one source of truth, the same errors) plus the TOML spans of the fields the cross-check
//! rules point at, and the merge behind `idem-lint bundle`.
//!
//! A policy *set* is every `*.toml` file of the directories given (sorted by name, not
//! recursive) and every file given by name, in command-line order. Each file must be a valid
//! bundle on its own; the set is one bundle: routes concatenated, a `[shared]` or `[redis]`
//! table in at most one file, route names unique and no two routes matching the same requests.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use idem_filter::policy::{parse_bundle, Bundle, PolicyError, RoutePolicy};
use serde::Deserialize;
use toml::Spanned;

use crate::source::{position_of, FatalError, Position, SourceFile};

/// One policy file: its text, the filter's validated model and where its fields are.
#[derive(Debug)]
pub struct PolicyFile {
    pub source: SourceFile,
    pub bundle: Bundle,
    /// Spans of the fields of each route, in the order of `bundle.routes`.
    pub spans: Vec<RouteSpans>,
    /// Spans of the `[shared]` and `[redis]` tables when the file has them.
    pub shared_span: Option<Range<usize>>,
    pub redis_span: Option<Range<usize>>,
}

/// Byte ranges of the fields of one `[[route]]` (None when the field is absent and the
/// filter's default applies).
#[derive(Debug, Clone, Default)]
pub struct RouteSpans {
    pub name: Range<usize>,
    pub matcher: Option<Range<usize>>,
    pub method: Option<Range<usize>>,
    pub path: Option<Range<usize>>,
    pub mode: Option<Range<usize>>,
    pub key: Option<Range<usize>>,
    pub key_from: Option<Range<usize>>,
    pub key_name: Option<Range<usize>>,
    pub on_completed: Option<Range<usize>>,
    pub token: Option<Range<usize>>,
    pub token_header: Option<Range<usize>>,
    pub token_issue_path: Option<Range<usize>>,
    pub duplicate: Option<Range<usize>>,
    pub duplicate_status: Option<Range<usize>>,
    pub duplicate_code: Option<Range<usize>>,
}

impl RouteSpans {
    /// The first span present, else the route's `name`.
    pub fn first(&self, candidates: &[&Option<Range<usize>>]) -> Range<usize> {
        candidates.iter().find_map(|c| (*c).clone()).unwrap_or_else(|| self.name.clone())
    }
}

// ---- the thin mirror: only spans, no validation (the filter's parser has done that) ----

#[derive(Deserialize, Default)]
struct MirrorDoc {
    #[serde(default)]
    route: Vec<MirrorRoute>,
    shared: Option<Spanned<toml::Value>>,
    redis: Option<Spanned<toml::Value>>,
}

#[derive(Deserialize)]
struct MirrorRoute {
    name: Spanned<String>,
    #[serde(rename = "match")]
    matcher: Option<Spanned<MirrorMatch>>,
    mode: Option<Spanned<String>>,
    key: Option<Spanned<MirrorKey>>,
    token: Option<Spanned<MirrorToken>>,
    duplicate: Option<Spanned<MirrorDuplicate>>,
}

#[derive(Deserialize)]
struct MirrorMatch {
    method: Option<Spanned<String>>,
    path: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct MirrorKey {
    from: Option<Spanned<String>>,
    name: Option<Spanned<String>>,
    on_completed: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct MirrorToken {
    header: Option<Spanned<String>>,
    issue_path: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct MirrorDuplicate {
    status: Option<Spanned<toml::Value>>,
    code: Option<Spanned<String>>,
}

fn span<T>(s: &Option<Spanned<T>>) -> Option<Range<usize>> {
    s.as_ref().map(Spanned::span)
}

fn spans_of(r: &MirrorRoute) -> RouteSpans {
    let m = r.matcher.as_ref().map(Spanned::get_ref);
    let k = r.key.as_ref().map(Spanned::get_ref);
    let t = r.token.as_ref().map(Spanned::get_ref);
    let d = r.duplicate.as_ref().map(Spanned::get_ref);
    RouteSpans {
        name: r.name.span(),
        matcher: span(&r.matcher),
        method: m.and_then(|m| span(&m.method)),
        path: m.and_then(|m| span(&m.path)),
        mode: span(&r.mode),
        key: span(&r.key),
        key_from: k.and_then(|k| span(&k.from)),
        key_name: k.and_then(|k| span(&k.name)),
        on_completed: k.and_then(|k| span(&k.on_completed)),
        token: span(&r.token),
        token_header: t.and_then(|t| span(&t.header)),
        token_issue_path: t.and_then(|t| span(&t.issue_path)),
        duplicate: span(&r.duplicate),
        duplicate_status: d.and_then(|d| span(&d.status)),
        duplicate_code: d.and_then(|d| span(&d.code)),
    }
}

/// A policy error as the linter reports it: exit 2, `file:line:col: message`, exactly the
/// filter's message and position.
pub fn fatal(e: &PolicyError, text: &str) -> FatalError {
    let position = match (e.line, e.column) {
        (Some(line), Some(column)) => {
            let line_text = text.lines().nth(line.saturating_sub(1)).unwrap_or("");
            let column_utf16 = line_text.chars().take(column.saturating_sub(1)).map(char::len_utf16).sum::<usize>() + 1;
            Some(Position { line, column, column_utf16 })
        }
        (Some(line), None) => Some(Position { line, column: 1, column_utf16: 1 }),
        _ => None,
    };
    FatalError { file: e.origin.clone(), position, reason: e.message.replace('\n', " ") }
}

impl PolicyFile {
    /// Parses one policy file (TOML, or JSON when it starts with `{`; JSON files carry no
    /// field spans and findings then point at their first line).
    pub fn parse(name: &str, text: &str) -> Result<PolicyFile, FatalError> {
        let bundle = parse_bundle(text, name).map_err(|e| fatal(&e, text))?;
        let mirror: MirrorDoc = if text.trim_start().starts_with('{') {
            MirrorDoc::default()
        } else {
            toml::from_str(text).map_err(|e| {
                FatalError::at(name, text, e.span().map_or(0, |s| s.start), format!("invalid policy: {}", e.message()))
            })?
        };
        let mut spans: Vec<RouteSpans> = mirror.route.iter().map(spans_of).collect();
        spans.resize(bundle.routes.len(), RouteSpans::default());
        Ok(PolicyFile {
            source: SourceFile::new(name.to_string(), text.to_string()),
            bundle,
            spans,
            shared_span: span(&mirror.shared),
            redis_span: span(&mirror.redis),
        })
    }

    pub fn name(&self) -> &str {
        &self.source.name
    }

    pub fn position(&self, span: &Range<usize>) -> Position {
        position_of(&self.source.text, span.start)
    }

    fn at(&self, span: &Range<usize>) -> String {
        let p = self.position(span);
        format!("{}:{}:{}", self.name(), p.line, p.column)
    }
}

/// The files behind the arguments: a directory's `*.toml` files sorted by name, a file as is.
pub fn expand(args: &[String]) -> Result<Vec<String>, FatalError> {
    let mut out = Vec::new();
    for a in args {
        let p = Path::new(a);
        if p.is_dir() {
            let rd =
                std::fs::read_dir(p).map_err(|e| FatalError::whole_file(a, format!("cannot read directory: {e}")))?;
            let mut files: Vec<String> = Vec::new();
            for entry in rd {
                let entry = entry.map_err(|e| FatalError::whole_file(a, format!("cannot read directory: {e}")))?;
                let path = entry.path();
                if path.is_file() && path.extension().is_some_and(|x| x == "toml") {
                    files.push(path.to_string_lossy().into_owned());
                }
            }
            files.sort();
            if files.is_empty() {
                return Err(FatalError::whole_file(a, "no policy files (*.toml) in this directory"));
            }
            out.extend(files);
        } else if p.is_file() {
            if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                return Err(FatalError::whole_file(
                    a,
                    "a YAML file is not a policy file (policies are TOML or JSON): put the SPECs before --policies, or write --policies=DIR",
                ));
            }
            out.push(a.clone());
        } else {
            return Err(FatalError::whole_file(a, "no such policy file or directory"));
        }
    }
    Ok(out)
}

/// A checked policy set: the files and, route by route, where each route came from.
#[derive(Debug)]
pub struct PolicySet {
    pub files: Vec<PolicyFile>,
}

/// One route of the set with its file and spans.
pub struct RouteRef<'a> {
    pub file: &'a PolicyFile,
    pub index: usize,
    pub route: &'a RoutePolicy,
    pub spans: &'a RouteSpans,
}

impl PolicySet {
    /// Reads and checks every file (each with the filter's parser), then the set as one bundle.
    pub fn load(args: &[String]) -> Result<PolicySet, FatalError> {
        let mut files = Vec::new();
        for name in expand(args)? {
            let text = std::fs::read_to_string(&name)
                .map_err(|e| FatalError::whole_file(&name, format!("cannot read: {e}")))?;
            files.push(PolicyFile::parse(&name, &text)?);
        }
        let set = PolicySet { files };
        set.check_across_files()?;
        Ok(set)
    }

    pub fn routes(&self) -> impl Iterator<Item = RouteRef<'_>> {
        self.files.iter().flat_map(|f| {
            f.bundle.routes.iter().zip(&f.spans).enumerate().map(move |(index, (route, spans))| RouteRef {
                file: f,
                index,
                route,
                spans,
            })
        })
    }

    /// What the filter checks inside one bundle, across files, with both places named.
    fn check_across_files(&self) -> Result<(), FatalError> {
        for (table, get) in [
            ("[shared]", (|f: &PolicyFile| f.shared_span.clone()) as fn(&PolicyFile) -> Option<Range<usize>>),
            ("[redis]", |f: &PolicyFile| f.redis_span.clone()),
        ] {
            let mut first: Option<(&PolicyFile, Range<usize>)> = None;
            for f in &self.files {
                let Some(s) = get(f) else { continue };
                if let Some((pf, ps)) = &first {
                    return Err(fatal_at(
                        f,
                        &s,
                        format!(
                            "{table} appears in two policy files (first at {}); a bundle has one, keep it in one file",
                            pf.at(ps)
                        ),
                    ));
                }
                first = Some((f, s));
            }
        }
        let routes: Vec<RouteRef<'_>> = self.routes().collect();
        for (i, r) in routes.iter().enumerate() {
            for o in &routes[..i] {
                if std::ptr::eq(o.file, r.file) {
                    continue; // the filter's parser checked routes within a file
                }
                if o.route.name == r.route.name {
                    return Err(fatal_at(
                        r.file,
                        &r.spans.name,
                        format!(
                            "route {:?}: duplicate route name (also at {})",
                            r.route.name,
                            o.file.at(&o.spans.name)
                        ),
                    ));
                }
                if o.route.matcher.conflicts_with(&r.route.matcher) {
                    let s = r.spans.matcher.clone().unwrap_or_else(|| r.spans.name.clone());
                    let os = o.spans.matcher.clone().unwrap_or_else(|| o.spans.name.clone());
                    return Err(fatal_at(
                        r.file,
                        &s,
                        format!(
                            "route {:?}: conflicting matchers: it matches the same requests as route {:?} ({})",
                            r.route.name,
                            o.route.name,
                            o.file.at(&os)
                        ),
                    ));
                }
            }
        }
        let merged = self.merged_table()?;
        let text = toml::to_string(&merged).map_err(|e| FatalError::whole_file("bundle", e.to_string()))?;
        parse_bundle(&text, "bundle").map_err(|e| fatal(&e, &text))?;
        Ok(())
    }

    /// The set as one TOML table (each file's tables as written; routes concatenated).
    pub fn merged_table(&self) -> Result<toml::Table, FatalError> {
        let mut out = toml::Table::new();
        let mut routes: Vec<toml::Value> = Vec::new();
        for f in &self.files {
            let t: toml::Table = if f.source.text.trim_start().starts_with('{') {
                let v: serde_json::Value = serde_json::from_str(&f.source.text)
                    .map_err(|e| FatalError::whole_file(f.name(), format!("invalid JSON: {e}")))?;
                toml::Table::try_from(v).map_err(|e| FatalError::whole_file(f.name(), e.to_string()))?
            } else {
                toml::from_str(&f.source.text).map_err(|e| FatalError::whole_file(f.name(), e.message().to_string()))?
            };
            for (k, v) in t {
                match (k.as_str(), v) {
                    ("route", toml::Value::Array(a)) => routes.extend(a),
                    (_, v) => {
                        out.insert(k, v);
                    }
                }
            }
        }
        // Tables first, then the routes, so the TOML text reads like a policy file.
        if !routes.is_empty() {
            out.insert("route".to_string(), toml::Value::Array(routes));
        }
        Ok(out)
    }

    /// The filter's plugin configuration as TOML. The files are concatenated as written (their
    /// comments kept), each under a `# ---- file` line, when that reads back as exactly the
    /// merged bundle; otherwise (a file with top-level keys that would attach to the previous
    /// file's last table, or JSON files) the merged table is written out.
    pub fn bundle_toml(&self) -> Result<String, FatalError> {
        let merged = self.merged_table()?;
        let mut s = String::from("# idem policy bundle, generated by `idem-lint bundle` from:\n");
        for f in &self.files {
            s.push_str(&format!("#   {}\n", f.name()));
        }
        let mut verbatim = s.clone();
        for f in &self.files {
            verbatim.push_str(&format!("\n# ---- {}\n", f.name()));
            verbatim.push_str(f.source.text.trim_end());
            verbatim.push('\n');
        }
        if toml::from_str::<toml::Table>(&verbatim).is_ok_and(|t| t == merged) {
            return Ok(verbatim);
        }
        let body = toml::to_string(&merged).map_err(|e| FatalError::whole_file("bundle", e.to_string()))?;
        s.push('\n');
        s.push_str(&body);
        Ok(s)
    }

    /// The same configuration as JSON (Istio `WasmPlugin` `pluginConfig`, Envoy Gateway), keys
    /// in the order the files write them.
    pub fn bundle_json(&self) -> Result<String, FatalError> {
        let mut s = serde_json::to_string_pretty(&self.merged_table()?)
            .map_err(|e| FatalError::whole_file("bundle", e.to_string()))?;
        s.push('\n');
        Ok(s)
    }

    /// Route name → file, for messages.
    pub fn route_files(&self) -> BTreeMap<&str, &str> {
        self.routes().map(|r| (r.route.name.as_str(), r.file.name())).collect()
    }
}

fn fatal_at(f: &PolicyFile, span: &Range<usize>, reason: String) -> FatalError {
    FatalError::at(f.name(), &f.source.text, span.start, reason)
}

/// Path template shape: literal segments, `None` for `{param}`.
pub fn shape(path: &str) -> Vec<Option<&str>> {
    path.trim_start_matches('/')
        .split('/')
        .map(|s| if s.starts_with('{') && s.ends_with('}') && s.len() > 2 { None } else { Some(s) })
        .collect()
}

// ------------------------------------------------------------------------- Envoy entry

/// The Envoy HCM `http_filters` entry for the bundle (YAML), with the per-route switch as a
/// comment. `configuration` is the bundle text (TOML or JSON).
pub fn envoy_filter(bundle: &str, wasm: &str, files: &[String]) -> String {
    let mut s = String::new();
    s.push_str("# idem: the Envoy http_filters entry for the policy bundle of\n");
    for f in files {
        s.push_str(&format!("#   {f}\n"));
    }
    s.push_str(
        "# (generated by `idem-lint bundle --envoy-filter`). Put it in the HTTP connection manager's\n\
         # http_filters, before envoy.filters.http.router. The filter is declared disabled; enable it\n\
         # on each route that has a policy, so other routes never run the Wasm VM:\n\
         #\n\
         #   routes:\n\
         #   - name: create-order\n\
         #     match: { path: /api/order/create }\n\
         #     route: { cluster: upstream }\n\
         #     typed_per_filter_config:\n\
         #       idem:\n\
         #         \"@type\": type.googleapis.com/envoy.config.route.v3.FilterConfig\n\
         #         config: {}          # empty config = enabled on this route\n\
         #\n",
    );
    s.push_str("- name: idem\n");
    s.push_str("  disabled: true            # enabled per route with envoy.config.route.v3.FilterConfig\n");
    s.push_str("  typed_config:\n");
    s.push_str("    \"@type\": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm\n");
    s.push_str("    config:\n");
    s.push_str("      name: idem\n");
    s.push_str("      root_id: idem\n");
    s.push_str("      # Lets the filter see (and hash) the request body before anything goes upstream.\n");
    s.push_str("      allow_on_headers_stop_iteration: true\n");
    s.push_str("      # A crashed VM answers 503: never let traffic through unprotected.\n");
    s.push_str("      failure_policy: FAIL_CLOSED\n");
    s.push_str("      vm_config:\n");
    s.push_str("        vm_id: idem\n");
    s.push_str("        runtime: envoy.wasm.runtime.v8\n");
    s.push_str("        code:\n");
    s.push_str("          local:\n");
    s.push_str(&format!("            filename: {}\n", yaml_scalar(wasm)));
    s.push_str("      configuration:\n");
    s.push_str("        \"@type\": type.googleapis.com/google.protobuf.StringValue\n");
    s.push_str("        value: |\n");
    for line in bundle.lines() {
        if line.is_empty() {
            s.push('\n');
        } else {
            s.push_str("          ");
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

/// A YAML scalar: plain when that is unambiguous, else double-quoted (JSON escaping is valid YAML).
fn yaml_scalar(v: &str) -> String {
    let first_ok = v.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '/') || v.starts_with("./");
    let plain =
        first_ok && v.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+".contains(c)) && v.parse::<f64>().is_err();
    if plain {
        v.to_string()
    } else {
        serde_json::to_string(v).unwrap_or_else(|_| format!("{v:?}"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn yaml_scalars() {
        assert_eq!(
            yaml_scalar("target/wasm32-wasip1/release/idem_filter.wasm"),
            "target/wasm32-wasip1/release/idem_filter.wasm"
        );
        assert_eq!(yaml_scalar("./x.wasm"), "./x.wasm");
        assert_eq!(yaml_scalar("/a b/x.wasm"), "\"/a b/x.wasm\"");
        assert_eq!(yaml_scalar("1.5"), "\"1.5\"");
        assert_eq!(yaml_scalar("-x"), "\"-x\"");
    }

    #[test]
    fn spans_point_at_fields() {
        let text = "[[route]]\nname = \"a\"\nmatch = { method = \"POST\", path = \"/a\" }\n\n[route.key]\nfrom = \"body\"\nname = \"/id\"\n\n[route.duplicate]\nstatus = 200\ncode = \"OK\"\n";
        let f = PolicyFile::parse("p.toml", text).unwrap();
        let s = &f.spans[0];
        let at = |r: &Option<Range<usize>>| {
            let p = f.position(r.as_ref().unwrap());
            (p.line, p.column)
        };
        assert_eq!(at(&s.path), (3, 35));
        assert_eq!(at(&s.key_from), (6, 8));
        assert_eq!(at(&s.key_name), (7, 8));
        assert_eq!(at(&s.duplicate_status), (10, 10));
        assert_eq!(at(&s.duplicate_code), (11, 8));
        assert_eq!(s.mode, None);
    }
}
