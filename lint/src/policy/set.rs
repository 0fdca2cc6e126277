//! A policy set: the files behind the command-line arguments, each parsed on its own, then
//! checked across files as one bundle, and the routes of all of them.

use std::path::Path;

use idem_filter::policy::{parse_bundle, RoutePolicy};

use super::file::{fatal, fatal_at, PolicyFile, RouteSpans};
use crate::source::{FatalError, FatalErrors};

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
    /// The bundle-wide tables (`[redis]`, `[tokens]`, `[answers]`, `[shared]`, …) may be stated in
    /// any one file, or a file of their own: every file is checked with them.
    /// Every file's errors are reported, not only the first file's.
    pub fn load(args: &[String]) -> Result<PolicySet, FatalErrors> {
        let mut texts = Vec::new();
        for name in expand(args)? {
            let text = std::fs::read_to_string(&name)
                .map_err(|e| FatalError::whole_file(&name, format!("cannot read: {e}")))?;
            texts.push((name, text));
        }
        let shared = bundle_tables(&texts)?;
        let mut files = Vec::new();
        let mut errors = Vec::new();
        for (name, text) in &texts {
            match PolicyFile::parse_with(name, text, &shared) {
                Ok(file) => files.push(file),
                Err(FatalErrors(found)) => errors.extend(found),
            }
        }
        if !errors.is_empty() {
            return Err(FatalErrors(errors));
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

/// The tables a bundle has once, whichever file states them.
const BUNDLE_TABLES: [&str; 7] = ["redis", "tokens", "answers", "shared", "detached", "grpc", "metrics"];

/// The bundle-wide tables of a set of TOML policy files: each may be stated in any one file (or
/// in several, identically); two files that state one differently are refused, naming both.
fn bundle_tables(texts: &[(String, String)]) -> Result<toml::Table, FatalError> {
    let mut out = toml::Table::new();
    let mut from: Vec<(&str, &str, &str)> = Vec::new();
    for (name, text) in texts {
        if text.trim_start().starts_with('{') {
            continue;
        }
        // A file that does not parse is reported by its own check, with the position.
        let Ok(table) = toml::from_str::<toml::Table>(text) else {
            continue;
        };
        for key in BUNDLE_TABLES {
            let Some(value) = table.get(key) else { continue };
            match out.get(key) {
                Some(seen) if seen != value => {
                    let (_, first_name, first_text) =
                        from.iter().find(|(k, _, _)| *k == key).copied().unwrap_or_default();
                    let p = crate::source::position_of(first_text, table_offset(first_text, key));
                    return Err(FatalError::at(
                        name,
                        text,
                        table_offset(text, key),
                        format!(
                            "[{key}] differs from the one in {first_name}:{}:{}; a bundle has one [{key}]: state it \
                             once (in any one file, or a file of its own) or identically",
                            p.line, p.column
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    out.insert(key.to_string(), value.clone());
                    from.push((key, name, text));
                }
            }
        }
    }
    Ok(out)
}

/// Where `[key]` starts in a TOML text (0 when it is written another way, such as dotted keys).
fn table_offset(text: &str, key: &str) -> usize {
    let header = format!("[{key}]");
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with(&header) {
            return offset + (line.len() - line.trim_start().len());
        }
        offset += line.len();
    }
    0
}

/// Path template shape: literal segments, `None` for `{param}`.
pub fn shape(path: &str) -> Vec<Option<&str>> {
    path.trim_start_matches('/')
        .split('/')
        .map(|s| if s.starts_with('{') && s.ends_with('}') && s.len() > 2 { None } else { Some(s) })
        .collect()
}
