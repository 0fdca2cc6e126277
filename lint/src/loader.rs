//! Loading a spec and every file its `$ref`s reach, and resolving `$ref`s.
//!
//! All `$ref`s are checked when the spec is loaded (not only the ones a rule happens to
//! follow): a `$ref` to a missing file or to a pointer that does not exist is a fatal error at
//! the `$ref`'s own position. Resolved targets are cached as index paths, so rules resolve a
//! `$ref` in O(depth) however large `components` is.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use crate::json;
use crate::node::{split_pointer, Node, Value};
use crate::source::{FatalError, SourceFile};
use crate::yaml;

pub type FileId = usize;

/// A node together with the file it lives in.
#[derive(Debug, Clone, Copy)]
pub struct At<'a> {
    pub file: FileId,
    pub node: &'a Node,
}

/// Which specification the root document follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `swagger: "2.0"` (springfox, knife4j, …): body and form parameters instead of
    /// `requestBody`, response `schema`/`examples` instead of `content` — read by [`crate::model`]
    /// into the same operations.
    Swagger2,
    /// `openapi: 3.x`.
    OpenApi3,
}

/// The loaded spec: the root file (id 0) and every file reachable through `$ref`.
#[derive(Debug)]
pub struct Workspace {
    pub files: Vec<SourceFile>,
    pub roots: Vec<Node>,
    pub version: Version,
    keys: Vec<PathBuf>,
    /// (file, `$ref` string) → (target file, child index path from that file's root).
    refs: HashMap<(FileId, String), (FileId, Vec<u32>)>,
}

/// Maximum length of a `$ref` → `$ref` → … chain before it is treated as a cycle.
const MAX_REF_CHAIN: usize = 64;

impl Workspace {
    /// Load a spec file and everything it references. Any problem is a [`FatalError`].
    pub fn load(path: &str) -> Result<Workspace, FatalError> {
        let mut ws = Workspace {
            files: Vec::new(),
            roots: Vec::new(),
            version: Version::OpenApi3,
            keys: Vec::new(),
            refs: HashMap::new(),
        };
        ws.add_file(Path::new(path), path.to_string(), None)?;
        ws.version = check_version(&ws.files[0], &ws.roots[0])?;
        let mut next = 0;
        while next < ws.files.len() {
            ws.check_refs(next)?;
            next += 1;
        }
        Ok(ws)
    }

    /// Load from memory (tests, fuzzing). `$ref`s to other files are errors.
    pub fn from_text(name: &str, text: &str) -> Result<Workspace, FatalError> {
        let root = parse_text(name, text)?;
        let file = SourceFile::new(name.to_string(), text.to_string());
        let version = check_version(&file, &root)?;
        let mut ws = Workspace {
            files: vec![file],
            roots: vec![root],
            version,
            keys: vec![PathBuf::from(name)],
            refs: HashMap::new(),
        };
        ws.check_refs(0)?;
        Ok(ws)
    }

    pub fn root(&self) -> At<'_> {
        At { file: 0, node: &self.roots[0] }
    }

    fn add_file(&mut self, path: &Path, name: String, from: Option<(FileId, u32, &str)>) -> Result<FileId, FatalError> {
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        if let Some(id) = self.keys.iter().position(|k| *k == key) {
            return Ok(id);
        }
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) => {
                return Err(match from {
                    Some((f, off, r)) => FatalError::at(
                        &self.files[f].name,
                        &self.files[f].text,
                        off as usize,
                        format!("$ref \"{r}\": cannot read {name}: {e}"),
                    ),
                    None => FatalError::whole_file(&name, format!("cannot read file: {e}")),
                })
            }
        };
        let text = decode(&name, bytes)?;
        let root = parse_text(&name, &text)?;
        self.files.push(SourceFile::new(name, text));
        self.roots.push(root);
        self.keys.push(key);
        Ok(self.files.len() - 1)
    }

    /// Walk one file, load the files its `$ref`s name and check every target exists.
    fn check_refs(&mut self, file: FileId) -> Result<(), FatalError> {
        let mut found: Vec<(String, u32)> = Vec::new();
        let ctx = if self.version == Version::Swagger2 { RefCtx::Swagger2 } else { RefCtx::Normal };
        collect_refs(&self.roots[file], false, ctx, &mut found);
        let mut seen: HashSet<String> = HashSet::new();
        for (r, off) in found {
            if !seen.insert(r.clone()) {
                continue;
            }
            self.resolve_and_cache(file, &r, off)?;
        }
        Ok(())
    }

    fn ref_error(&self, file: FileId, off: u32, reason: String) -> FatalError {
        FatalError::at(&self.files[file].name, &self.files[file].text, off as usize, reason)
    }

    fn resolve_and_cache(&mut self, file: FileId, r: &str, off: u32) -> Result<(), FatalError> {
        if self.refs.contains_key(&(file, r.to_string())) {
            return Ok(());
        }
        let (file_part, fragment) = match r.split_once('#') {
            Some((a, b)) => (a, b),
            None => (r, ""),
        };
        let target = if file_part.is_empty() {
            file
        } else {
            if file_part.contains("://") {
                return Err(self.ref_error(
                    file,
                    off,
                    format!("$ref \"{r}\": remote references are not supported; bundle the spec first"),
                ));
            }
            let rel = percent_decode(file_part);
            let base = Path::new(&self.files[file].name).parent().map(Path::to_path_buf).unwrap_or_default();
            let joined = normalize(&base.join(&rel));
            let name = joined.to_string_lossy().into_owned();
            self.add_file(&joined, name, Some((file, off, r)))?
        };
        let fragment = percent_decode(fragment);
        let Some(segments) = split_pointer(&fragment) else {
            return Err(self.ref_error(
                file,
                off,
                format!("$ref \"{r}\": only JSON-pointer fragments (#/...) are supported"),
            ));
        };
        let mut indices = Vec::with_capacity(segments.len());
        let mut node = &self.roots[target];
        for seg in &segments {
            match child_index(node, seg) {
                Some((i, child)) => {
                    indices.push(i as u32);
                    node = child;
                }
                None => {
                    let tname = &self.files[target].name;
                    return Err(self.ref_error(
                        file,
                        off,
                        format!("$ref \"{r}\": no node at \"#{fragment}\" in {tname} (segment \"{seg}\" not found)"),
                    ));
                }
            }
        }
        self.refs.insert((file, r.to_string()), (target, indices));
        Ok(())
    }

    fn lookup(&self, file: FileId, r: &str) -> Option<At<'_>> {
        let Some((target, indices)) = self.refs.get(&(file, r.to_string())) else {
            return self.lookup_unchecked(file, r);
        };
        let mut node = self.roots.get(*target)?;
        for &i in indices {
            node = match &node.value {
                Value::Map(m) => &m.get(i as usize)?.value,
                Value::Seq(s) => s.get(i as usize)?,
                _ => return None,
            };
        }
        Some(At { file: *target, node })
    }

    /// A `$ref` that was not checked at load time (it sits in data, e.g. an example): resolved
    /// on demand within the files already loaded, or `None`.
    fn lookup_unchecked(&self, file: FileId, r: &str) -> Option<At<'_>> {
        let (file_part, fragment) = r.split_once('#').unwrap_or((r, ""));
        let target = if file_part.is_empty() {
            file
        } else {
            let base = Path::new(&self.files.get(file)?.name).parent().map(Path::to_path_buf).unwrap_or_default();
            let name = normalize(&base.join(percent_decode(file_part))).to_string_lossy().into_owned();
            self.files.iter().position(|f| f.name == name)?
        };
        let mut node = self.roots.get(target)?;
        for seg in split_pointer(&percent_decode(fragment))? {
            node = child_index(node, &seg)?.1;
        }
        Some(At { file: target, node })
    }

    /// Follow `$ref` chains from a node. Returns the node itself when it is not a reference,
    /// `None` on a cycle or a reference that was not checked at load time (inside examples).
    pub fn resolve<'a>(&'a self, at: At<'a>) -> Option<At<'a>> {
        let mut cur = at;
        for _ in 0..MAX_REF_CHAIN {
            match cur.node.get("$ref").and_then(Node::as_str) {
                Some(r) => cur = self.lookup(cur.file, r)?,
                None => return Some(cur),
            }
        }
        None
    }

    pub fn file(&self, id: FileId) -> &SourceFile {
        &self.files[id]
    }
}

fn child_index<'a>(node: &'a Node, seg: &str) -> Option<(usize, &'a Node)> {
    match &node.value {
        Value::Map(m) => m.iter().enumerate().find(|(_, e)| e.key == seg).map(|(i, e)| (i, &e.value)),
        Value::Seq(_) => {
            let c = node.child(seg)?;
            seg.parse::<usize>().ok().map(|i| (i, c))
        }
        _ => None,
    }
}

/// Where a node sits, for telling data from references.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RefCtx {
    Normal,
    /// Anywhere in a Swagger 2.0 document: an `examples` mapping there is data (media type →
    /// example value), never Example Objects.
    Swagger2,
    /// The value of an `examples` mapping: each entry is an Example Object.
    ExamplesMap,
    /// An Example Object: its `value` is data.
    ExampleObject,
}

/// `$ref`s that are checked: every string `$ref` except inside data — `example`, an Example
/// Object's `value`/`externalValue`, a JSON Schema `examples` array, `x-` extensions. (A schema
/// property that happens to be called `value` is not data: its `$ref` is checked.)
fn collect_refs(node: &Node, skip: bool, ctx: RefCtx, out: &mut Vec<(String, u32)>) {
    match &node.value {
        Value::Map(m) => {
            for e in m {
                if e.key == "$ref" {
                    if let (Some(s), false) = (e.value.as_str(), skip) {
                        out.push((s.to_string(), e.value.start));
                        continue;
                    }
                }
                let child_ctx = match ctx {
                    RefCtx::Swagger2 => RefCtx::Swagger2,
                    RefCtx::ExamplesMap => RefCtx::ExampleObject,
                    _ if e.key == "examples" => RefCtx::ExamplesMap,
                    _ => RefCtx::Normal,
                };
                let skip_child = skip
                    || e.key.starts_with("x-")
                    || e.key == "example"
                    || (e.key == "examples" && (ctx == RefCtx::Swagger2 || matches!(e.value.value, Value::Seq(_))))
                    || (ctx == RefCtx::ExampleObject && (e.key == "value" || e.key == "externalValue"));
                collect_refs(&e.value, skip_child, child_ctx, out);
            }
        }
        Value::Seq(s) => {
            let child_ctx = if ctx == RefCtx::Swagger2 { RefCtx::Swagger2 } else { RefCtx::Normal };
            for n in s {
                collect_refs(n, skip, child_ctx, out);
            }
        }
        _ => {}
    }
}

fn decode(name: &str, mut bytes: Vec<u8>) -> Result<String, FatalError> {
    if bytes.starts_with(&[0xEF, 0xBB, 0xBF]) {
        bytes.drain(..3);
    }
    if let Some(pos) = bytes.iter().position(|&b| b == 0) {
        let prefix = String::from_utf8_lossy(bytes.get(..pos).unwrap_or(&[])).into_owned();
        return Err(FatalError::at(
            name,
            &prefix,
            prefix.len(),
            "binary file (NUL byte); expected a YAML or JSON OpenAPI document",
        ));
    }
    match String::from_utf8(bytes) {
        Ok(s) => Ok(s),
        Err(e) => {
            let good = e.utf8_error().valid_up_to();
            let bytes = e.into_bytes();
            let prefix = String::from_utf8_lossy(bytes.get(..good).unwrap_or(&[])).into_owned();
            Err(FatalError::at(
                name,
                &prefix,
                prefix.len(),
                "not UTF-8 text (binary file?); expected a YAML or JSON OpenAPI document",
            ))
        }
    }
}

/// Parse a file's text as JSON (`.json`, or text starting with `{`) or YAML.
/// The specs behind the SPEC arguments: a file as it is; a directory, every OpenAPI document in
/// it and below (`*.yaml`, `*.yml`, `*.json` whose top level declares `openapi` or `swagger`),
/// sorted by path.
/// Other files there — fragments of a multi-file spec that `$ref` reaches, policies, data — are
/// skipped, not failed: their root spec reads them.
pub fn expand_specs(args: &[String]) -> Result<Vec<String>, FatalError> {
    let mut out = Vec::new();
    for a in args {
        let p = Path::new(a);
        if !p.is_dir() {
            out.push(a.clone());
            continue;
        }
        let mut found = Vec::new();
        walk(p, &mut found).map_err(|e| FatalError::whole_file(a, format!("cannot read directory: {e}")))?;
        found.retain(|f| is_openapi_root(f));
        found.sort();
        if found.is_empty() {
            return Err(FatalError::whole_file(
                a,
                "no OpenAPI document (a file with a top-level `openapi` or `swagger` field) in this directory",
            ));
        }
        out.extend(found.into_iter().map(|f| f.to_string_lossy().into_owned()));
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let hidden = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().and_then(|x| x.to_str()).is_some_and(|x| matches!(x, "yaml" | "yml" | "json")) {
            out.push(path);
        }
    }
    Ok(())
}

/// Whether a file's top level declares `openapi` or `swagger` (read from its first 64 KiB, as
/// text).
fn is_openapi_root(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::new();
    let read = std::fs::File::open(path).and_then(|f| f.take(64 * 1024).read_to_end(&mut head));
    if read.is_err() {
        return true; // let the loader report why it cannot be read
    }
    let text = String::from_utf8_lossy(&head);
    ["openapi", "swagger"].iter().any(|k| {
        text.lines().any(|l| {
            l.strip_prefix(k).is_some_and(|r| r.starts_with(':'))
                || [format!("\"{k}\""), format!("'{k}'")].iter().any(|q| l.starts_with(q.as_str()))
        }) || text.trim_start().starts_with('{') && text.contains(&format!("\"{k}\""))
    })
}

pub fn parse_text(name: &str, text: &str) -> Result<Node, FatalError> {
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Err(FatalError::at(name, text, 0, "empty file; expected an OpenAPI document"));
    }
    let is_json = name.to_ascii_lowercase().ends_with(".json") || trimmed.starts_with('{');
    if is_json {
        json::parse(text).map_err(|e| FatalError::at(name, text, e.offset, format!("invalid JSON: {}", e.reason)))
    } else {
        yaml::parse(text).map_err(|e| FatalError::at(name, text, e.offset, e.reason))
    }
}

fn check_version(file: &SourceFile, root: &Node) -> Result<Version, FatalError> {
    if root.as_map().is_none() {
        return Err(FatalError::at(
            &file.name,
            &file.text,
            root.start as usize,
            "not an OpenAPI document: the top level is not a mapping",
        ));
    }
    let at = |offset: u32, reason: String| FatalError::at(&file.name, &file.text, offset as usize, reason);
    match (root.entry("swagger"), root.entry("openapi")) {
        (Some(_), Some(o)) => Err(at(
            o.key_start,
            "both `swagger` and `openapi` at the top level: a document is either Swagger 2.0 or OpenAPI 3".into(),
        )),
        (Some(e), None) => {
            let v = e.value.scalar_text().unwrap_or_default();
            if v == "2.0" {
                Ok(Version::Swagger2)
            } else {
                Err(at(
                    e.value.start,
                    format!("unsupported Swagger version \"{v}\"; idem-lint reads Swagger 2.0 (`swagger: \"2.0\"`) and OpenAPI 3.0 and 3.1"),
                ))
            }
        }
        (None, Some(e)) => {
            let v = e.value.scalar_text().unwrap_or_default();
            if v.starts_with("3.") || v == "3" {
                Ok(Version::OpenApi3)
            } else if v.starts_with("2.") || v == "2" {
                Err(at(
                    e.value.start,
                    format!("`openapi: {v}` is not a version: Swagger 2.0 documents say `swagger: \"2.0\"`"),
                ))
            } else {
                Err(at(
                    e.value.start,
                    format!("unsupported OpenAPI version \"{v}\"; idem-lint reads Swagger 2.0 and OpenAPI 3.0 and 3.1"),
                ))
            }
        }
        (None, None) => Err(at(root.start, "not an OpenAPI document: no `openapi` (or `swagger`) field".into())),
    }
}

fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = std::str::from_utf8(b.get(i + 1..i + 3).unwrap_or(&[]))
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Lexical normalisation (`a/./b/../c` → `a/c`) so the same file reached by two spellings is
/// reported under one name.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("/paths/~1a~1%7Bid%7D"), "/paths/~1a~1{id}");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }

    #[test]
    fn local_refs_resolve_and_missing_pointer_fails() {
        let ok = "openapi: 3.0.3\ncomponents:\n  parameters:\n    K: {name: Idempotency-Key, in: header}\nx: {$ref: '#/components/parameters/K'}\n";
        let ws = Workspace::from_text("a.yaml", ok).unwrap();
        let x = ws.root().node.get("x").unwrap();
        let r = ws.resolve(At { file: 0, node: x }).unwrap();
        assert_eq!(r.node.get("name").unwrap().as_str(), Some("Idempotency-Key"));

        let bad = "openapi: 3.0.3\nx:\n  $ref: '#/components/parameters/Nope'\n";
        let e = Workspace::from_text("b.yaml", bad).unwrap_err();
        assert_eq!(e.position.unwrap().line, 3);
        assert!(e.reason.contains("no node at"), "{e}");
    }

    #[test]
    fn refs_in_data_are_not_checked_but_a_property_called_value_is() {
        let data = "openapi: 3.1.0\nx-a: {$ref: '#/nope'}\ncomponents:\n  examples:\n    E: {value: {$ref: '#/nope'}}\n  schemas:\n    S: {examples: [{$ref: '#/nope'}], example: {$ref: '#/nope'}}\n";
        assert!(Workspace::from_text("d.yaml", data).is_ok());
        let prop =
            "openapi: 3.1.0\ncomponents:\n  schemas:\n    S:\n      properties:\n        value: {$ref: '#/nope'}\n";
        let e = Workspace::from_text("p.yaml", prop).unwrap_err();
        assert!(e.reason.contains("no node at"), "{e}");
        // an unchecked local ref still resolves on demand
        let ok = "openapi: 3.1.0\nx-a: {$ref: '#/b'}\nb: {c: 1}\n";
        let ws = Workspace::from_text("o.yaml", ok).unwrap();
        let a = ws.root().node.get("x-a").unwrap();
        let r = ws.resolve(At { file: 0, node: a }).unwrap();
        assert!(r.node.get("c").is_some());
    }

    #[test]
    fn ref_cycle_resolves_to_none() {
        let t = "openapi: 3.1.0\na: {$ref: '#/b'}\nb: {$ref: '#/a'}\n";
        let ws = Workspace::from_text("c.yaml", t).unwrap();
        let a = ws.root().node.get("a").unwrap();
        assert!(ws.resolve(At { file: 0, node: a }).is_none());
    }

    #[test]
    fn versions() {
        let ws = Workspace::from_text("s.yaml", "swagger: '2.0'\ninfo: {}\n").unwrap();
        assert_eq!(ws.version, Version::Swagger2);
        let e = Workspace::from_text("s.yaml", "swagger: '1.2'\n").unwrap_err();
        assert!(e.reason.contains("unsupported Swagger version \"1.2\""), "{e}");
        let e = Workspace::from_text("s.yaml", "swagger: '2.0'\nopenapi: 3.0.0\n").unwrap_err();
        assert!(e.reason.contains("both `swagger` and `openapi`"), "{e}");
        assert_eq!(e.position.unwrap().line, 2);
        let e = Workspace::from_text("s.yaml", "openapi: 2.0\n").unwrap_err();
        assert!(e.reason.contains("`swagger: \"2.0\"`"), "{e}");
        assert!(Workspace::from_text("s.yaml", "info: {}\n").is_err());
        assert!(Workspace::from_text("s.yaml", "openapi: 4.0.0\n").is_err());
        assert!(Workspace::from_text("s.yaml", "openapi: 3.1.0\n").is_ok());
        assert!(Workspace::from_text("s.json", "{\"openapi\": \"3.0.0\"}").is_ok());
    }
}
