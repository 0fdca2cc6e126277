//! A policy set: the files behind the command-line arguments, each parsed on its own, then
//! checked across files as one bundle, and the routes of all of them.

use std::ops::Range;
use std::path::Path;

use idem_filter::policy::{parse_bundle, RoutePolicy};

use super::file::{fatal, fatal_at, PolicyFile, RouteSpans};
use crate::source::FatalError;

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
    pub(crate) fn check_across_files(&self) -> Result<(), FatalError> {
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
}

/// Path template shape: literal segments, `None` for `{param}`.
pub fn shape(path: &str) -> Vec<Option<&str>> {
    path.trim_start_matches('/')
        .split('/')
        .map(|s| if s.starts_with('{') && s.ends_with('}') && s.len() > 2 { None } else { Some(s) })
        .collect()
}
