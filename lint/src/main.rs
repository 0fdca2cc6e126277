//! `idem-lint [OPTIONS] <SPEC>... [--policies <DIR|FILE>...]`, `idem-lint rules`,
//! `idem-lint --explain CODE`, `idem-lint bundle <DIR|FILE>... [--format toml|json] [--envoy-filter]`,
//! `idem-lint policies <SPEC>... -o DIR [--force]`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use idem_lint::config::{Config, FailOn, Severity};
use idem_lint::crosscheck::{lint_specs, Linted};
use idem_lint::generate::{generate, write_all, Action};
use idem_lint::loader::Workspace;
use idem_lint::policy::{envoy_filter, PolicySet};
use idem_lint::report::{render, Format, Run};
use idem_lint::rules::{find, RULES};
use idem_lint::source::{FatalError, FatalErrors};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum FailOnArg {
    Error,
    Warning,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ColorArg {
    Auto,
    Always,
    Never,
}

/// Check OpenAPI 3.0/3.1 and Swagger 2.0 specs for the 幂等性说明 (idempotency statement) on
/// every non-safe operation.
///
/// Exit status: 0 clean, 1 findings at or above --fail-on, 2 usage, I/O or parse error.
#[derive(Debug, Parser)]
#[command(name = "idem-lint", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// OpenAPI spec files (YAML or JSON), or directories: every OpenAPI document in them and
    /// below (files with a top-level `openapi` or `swagger` field; fragments of multi-file specs
    /// are skipped).
    #[arg(value_name = "SPEC")]
    specs: Vec<String>,

    /// Output format.
    #[arg(long, short = 'f', value_enum, default_value = "text")]
    format: Format,

    /// Lowest severity that makes the exit status 1 (default: error, or `fail-on` in the config).
    #[arg(long, value_enum)]
    fail_on: Option<FailOnArg>,

    /// Config file (default: ./idem-lint.toml when it exists).
    #[arg(long, value_name = "FILE")]
    config: Option<String>,

    /// Colour in text output (auto: only on a terminal, and never with NO_COLOR set).
    #[arg(long, value_enum, default_value = "auto")]
    color: ColorArg,

    /// Print the documentation of a rule and exit.
    #[arg(long, value_name = "CODE")]
    explain: Option<String>,

    /// Gateway policy files or directories (their *.toml files) to cross-check against the
    /// specs (rules IDEM101+). Put it after the SPECs, or repeat it: `--policies policies/`.
    #[arg(long, value_name = "DIR|FILE", num_args = 1.., action = clap::ArgAction::Append)]
    policies: Vec<String>,

    /// Repair what is mechanical (IDEM006: add the duplicate status the statement names to
    /// `responses`), in place, keeping formatting and comments; then lint the result.
    #[arg(long)]
    fix: bool,

    /// With --fix: print the changes as a unified diff and write nothing (exit 1 when there is
    /// something to fix).
    #[arg(long, requires = "fix")]
    diff: bool,

    /// Debug: print the parsed SPEC back as YAML (all strings double-quoted) and exit.
    #[arg(long, hide = true)]
    dump_yaml: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a complete Envoy bootstrap that runs the policies (run it with `envoy -c FILE.yaml`):
    /// a loopback listener with the policies' routes (the filter enabled on each) and a catch-all,
    /// the upstream cluster, the Webdis cluster for Redis routes, the internal listeners detached
    /// forwarding and gRPC replays need, and the stats tags that label the counters.
    Envoy(EnvoyArgs),
    /// Print the documentation of a rule (the same as --explain CODE).
    Explain {
        /// The rule's code, e.g. IDEM004.
        code: String,
    },
    /// List the rules with their default severity.
    Rules {
        /// Print the rule table of lint/README.md (Markdown) instead.
        #[arg(long)]
        markdown: bool,
        /// Print the accepted item labels of a 幂等性说明 (by meaning; first match wins) instead.
        #[arg(long, conflicts_with = "markdown")]
        labels: bool,
    },
    /// Validate policy files with the filter's parser and write the filter's plugin
    /// configuration (the bundle) to stdout, or with --envoy-filter the Envoy http_filters entry.
    Bundle(BundleArgs),
    /// Write the gateway policies from the spec: one policy file per operation documented as
    /// idempotent (key source and name, duplicate status and code, expiry, token endpoint).
    ///
    /// Each file is checked with the filter's parser before anything is written; a second run
    /// changes nothing ("unchanged"). Files carry a `# idem-lint-generated sha256:` header line: a
    /// file edited by hand since (or not written by this command) is never overwritten without
    /// --force — the run then writes nothing at all. Operations that cannot be expressed as a
    /// policy are named on stderr with the reason.
    ///
    /// Exit status: 0 every idempotent operation has its file, 1 some were skipped, 2 usage, I/O
    /// or parse error, or a file refused.
    Policies(PoliciesArgs),
}

#[derive(Debug, clap::Args)]
struct PoliciesArgs {
    /// OpenAPI 3 or Swagger 2.0 spec files, or directories of them.
    #[arg(value_name = "SPEC", required = true)]
    specs: Vec<String>,

    /// Directory the policy files are written to (created when missing).
    #[arg(long, short = 'o', value_name = "DIR")]
    out: String,

    /// Overwrite files edited by hand, or not written by `idem-lint policies`.
    #[arg(long)]
    force: bool,

    /// Write the receivers' side instead: a policy per webhook or callback the spec sends that
    /// names its event id, for the gateway in front of a service that receives it.
    #[arg(long)]
    receiver: bool,

    /// With --receiver: the path the receiver takes a delivery on, by its policy's name
    /// (`--path order-paid=/hooks/orders`); repeat it. Without one, `/webhooks/<name>`.
    #[arg(long = "path", value_name = "NAME=PATH", requires = "receiver", value_parser = name_path)]
    paths: Vec<(String, String)>,

    /// Config file (default: ./idem-lint.toml when it exists): extra section titles.
    #[arg(long, value_name = "FILE")]
    config: Option<String>,
}

#[derive(Debug, clap::Args)]
struct EnvoyArgs {
    /// Policy files, or directories whose *.toml files (sorted by name) are read.
    #[arg(value_name = "DIR|FILE", required = true)]
    paths: Vec<String>,
    /// The service behind the gateway.
    #[arg(long, value_name = "HOST:PORT")]
    upstream: String,
    /// Webdis, for routes with store = "redis" (required when there are any).
    #[arg(long, value_name = "HOST:PORT")]
    webdis: Option<String>,
    /// The listener's port (on 127.0.0.1).
    #[arg(long, value_name = "PORT", default_value_t = 10000)]
    listen: u16,
    /// The admin port (on 127.0.0.1: /stats, /stats/prometheus).
    #[arg(long, value_name = "PORT", default_value_t = 9901)]
    admin: u16,
    /// The filter's .wasm (written into the bootstrap as an absolute path, so Envoy finds it
    /// from any directory). Default: the one built in this idem-lint's repository
    /// (`target/wasm32-wasip1/release/idem_filter.wasm`), else in the current directory's.
    #[arg(long, value_name = "PATH")]
    wasm: Option<String>,
    /// Load idem's native build instead of the .wasm: the Envoy dynamic module
    /// (`libidem_native.so`, `make build-native`). The bootstrap names the module; Envoy 1.40
    /// finds `lib<name>.so` in the directory `ENVOY_DYNAMIC_MODULES_SEARCH_PATH` names, which
    /// is printed to stderr. Routes the native build cannot serve (`forward = "detached"`, a scope
    /// nested in metadata) are refused with the reason.
    #[arg(long, value_name = "PATH", conflicts_with = "wasm")]
    native: Option<String>,
    /// The listeners file the bootstrap loads its listeners (and the policies) from, and that
    /// Envoy watches: written beside the bootstrap, named in it by absolute path.
    #[arg(long, value_name = "PATH", default_value = "idem-listeners.json")]
    listeners: String,
    /// Rewrite only the listeners file (print no bootstrap): a running Envoy started from this
    /// command's bootstrap applies the policy edit within a second, without a restart — the
    /// embedded store's keys are kept (a restart forgets them).
    #[arg(long)]
    update: bool,
}

/// Replaces `path` with `text` by a rename in its directory: Envoy's watched directory sees one
/// move, never a half-written file.
fn replace_file(path: &Path, text: &str) -> Result<(), FatalError> {
    let name = path.to_string_lossy().into_owned();
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
    ));
    std::fs::write(&tmp, text).map_err(|e| FatalError::whole_file(&name, format!("cannot write: {e}")))?;
    std::fs::rename(&tmp, path).map_err(|e| FatalError::whole_file(&name, format!("cannot replace: {e}")))
}

/// Where a repository builds the filter.
const BUILT_WASM: &str = "target/wasm32-wasip1/release/idem_filter.wasm";

/// `--native PATH`: the module's name (`lib<name>.so`) and its directory, absolute.
fn native_module(given: &str) -> Result<(String, String), FatalError> {
    let path = std::path::absolute(given).unwrap_or_else(|_| PathBuf::from(given));
    let shown = path.to_string_lossy().into_owned();
    if !path.is_file() {
        return Err(FatalError::whole_file(
            "--native",
            format!(
                "{shown} does not exist: build the native module in the idem repository with `make build-native` \
                 (or `cargo build --profile native -p idem-native`: target/native/libidem_native.so)"
            ),
        ));
    }
    let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let name = file.strip_prefix("lib").and_then(|n| n.strip_suffix(".so")).filter(|n| !n.is_empty());
    let (Some(name), Some(dir)) = (name, path.parent()) else {
        return Err(FatalError::whole_file(
            "--native",
            format!("{shown}: Envoy 1.40 loads a dynamic module by name, from a file named lib<name>.so"),
        ));
    };
    Ok((name.to_string(), dir.to_string_lossy().into_owned()))
}

/// `--native PATH` for these policies: the module (see [`native_module`]), once no route of
/// theirs is one the native build would refuse at load; `None` without `--native`.
fn native_build(given: Option<&str>, set: &PolicySet) -> Result<Option<(String, String)>, FatalErrors> {
    let Some(given) = given else {
        return Ok(None);
    };
    let module = native_module(given)?;
    refuse_what_the_native_build_cannot_serve(set)?;
    Ok(Some(module))
}

/// Envoy finds a dynamic module only through its search path: the one thing the user must add.
fn say_where_envoy_finds(what: &str, name: &str, dir: &str) {
    eprintln!(
        "idem-lint: {what} loads the native build: start Envoy with \
         ENVOY_DYNAMIC_MODULES_SEARCH_PATH={dir} (Envoy 1.40 finds lib{name}.so there)"
    );
}

/// The routes the native build would refuse at load (the core's `policy::native_build`), refused
/// here first, each named with its file and the reason.
fn refuse_what_the_native_build_cannot_serve(set: &PolicySet) -> Result<(), FatalErrors> {
    let refused: Vec<FatalError> = set
        .files
        .iter()
        .flat_map(|f| {
            idem_filter::policy::native_build::refusals(&f.bundle).into_iter().map(|(route, why)| {
                let at = f.spans.get(route).map_or(0, |s| s.name.start);
                FatalError::at(&f.source.name, &f.source.text, at, format!("the native build cannot serve {why}"))
            })
        })
        .collect();
    if refused.is_empty() {
        Ok(())
    } else {
        Err(FatalErrors(refused))
    }
}

/// The filter's .wasm for the bootstrap, absolute: `--wasm`, else the one built beside this
/// idem-lint (`target/release/idem-lint` → `target/wasm32-wasip1/…`), else in the current
/// directory's repository. It must exist: Envoy otherwise exits with "Invalid path".
fn filter_wasm(given: Option<&str>) -> Result<String, FatalError> {
    let candidates: Vec<PathBuf> = match given {
        Some(path) => vec![PathBuf::from(path)],
        None => {
            let beside_exe = std::env::current_exe().ok().and_then(|exe| {
                exe.parent().and_then(Path::parent).map(|target| target.join("wasm32-wasip1/release/idem_filter.wasm"))
            });
            beside_exe.into_iter().chain([PathBuf::from(BUILT_WASM)]).collect()
        }
    };
    for c in &candidates {
        if c.is_file() {
            let abs = std::path::absolute(c).unwrap_or_else(|_| c.clone());
            return Ok(abs.to_string_lossy().into_owned());
        }
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|c| std::path::absolute(c).unwrap_or_else(|_| c.clone()).to_string_lossy().into_owned())
        .collect();
    Err(FatalError::whole_file(
        "--wasm",
        format!(
            "the filter is not built ({} does not exist): build it in the idem repository with \
             `make build-filter` (or `cargo build --release --target wasm32-wasip1 -p idem-filter`), \
             or give its path with --wasm PATH",
            tried.join(", ")
        ),
    ))
}

/// `host:port` of a flag.
fn host_port<'a>(flag: &str, v: &'a str) -> Result<(&'a str, u16), FatalError> {
    v.rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse().ok()?)))
        .filter(|(h, _)| !h.is_empty())
        .ok_or_else(|| FatalError::whole_file(flag, format!("{v:?} is not HOST:PORT")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BundleFormat {
    /// TOML, what the example Envoy configs carry in `configuration`.
    Toml,
    /// JSON, what Istio WasmPlugin `pluginConfig` and Envoy Gateway pass.
    Json,
}

#[derive(Debug, clap::Args)]
struct BundleArgs {
    /// Policy files, or directories whose *.toml files (sorted by name) are read.
    #[arg(value_name = "DIR|FILE", required = true)]
    paths: Vec<String>,

    /// Format of the bundle.
    #[arg(long, short = 'f', value_enum, default_value = "toml")]
    format: BundleFormat,

    /// Write the complete Envoy `http_filters` entry (YAML) holding the bundle.
    #[arg(long)]
    envoy_filter: bool,

    /// The filter's .wasm path in the --envoy-filter entry.
    #[arg(long, value_name = "PATH", default_value = "target/wasm32-wasip1/release/idem_filter.wasm")]
    wasm: String,

    /// The --envoy-filter entry loads idem's native build (`libidem_native.so`, `make
    /// build-native`) instead of the .wasm: a DynamicModuleFilter naming the module. Routes the
    /// native build cannot serve are refused as `idem-lint envoy --native` refuses them.
    #[arg(long, value_name = "PATH", requires = "envoy_filter", conflicts_with = "wasm")]
    native: Option<String>,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(FatalErrors(errors)) => {
            for e in errors {
                eprintln!("idem-lint: error: {e}");
            }
            ExitCode::from(2)
        }
    }
}

fn print(s: &str) {
    let mut out = std::io::stdout().lock();
    // A closed pipe (`idem-lint … | head`) is not an error worth a panic.
    let _ = out.write_all(s.as_bytes());
    let _ = out.flush();
}

fn run(cli: Cli) -> Result<u8, FatalErrors> {
    if let Some(Command::Policies(p)) = &cli.command {
        let config = match &p.config {
            Some(path) => load_config(path)?,
            None if Path::new("idem-lint.toml").is_file() => load_config("idem-lint.toml")?,
            None => Config::default(),
        };
        return write_policies(p, &config);
    }
    if let Some(Command::Envoy(e)) = &cli.command {
        let set = PolicySet::load(&e.paths)?;
        let bundle = set.bundle_toml()?;
        let routes: Vec<_> = set.routes().map(|r| r.route).collect();
        let redis = set.files.iter().find_map(|f| f.bundle.redis.as_ref()).map(|r| r.cluster.clone());
        let uses_redis = routes.iter().any(|r| r.store == idem_filter::policy::StoreKind::Redis);
        let native = native_build(e.native.as_deref(), &set)?;
        // The native build speaks RESP to `direct` itself; the .wasm reaches Redis through Webdis.
        let through_webdis = uses_redis && !(native.is_some() && redis.as_deref() == Some(""));
        if uses_redis && native.is_none() && redis.as_deref() == Some("") {
            return Err(FatalError::whole_file(
                "[redis]",
                "names only `direct`, which the native build speaks to; the bootstrap loads the .wasm, which \
                 reaches Redis through Webdis: add `cluster` (and give --webdis HOST:PORT)",
            )
            .into());
        }
        if through_webdis && e.webdis.is_none() {
            return Err(FatalError::whole_file(
                "--webdis",
                "a route keeps its keys in Redis: give Webdis as --webdis HOST:PORT",
            )
            .into());
        }
        let wasm;
        let filter = match &native {
            Some((name, _)) => idem_lint::policy::Filter::Native { module: name },
            None => {
                wasm = filter_wasm(e.wasm.as_deref())?;
                idem_lint::policy::Filter::Wasm { path: &wasm }
            }
        };
        let listeners = std::path::absolute(&e.listeners).map_err(|err| {
            FatalError::whole_file("--listeners", format!("{:?} is not a usable path: {err}", e.listeners))
        })?;
        let listeners_path = listeners.to_string_lossy().into_owned();
        let b = idem_lint::policy::Bootstrap {
            bundle: &bundle,
            filter,
            upstream: host_port("--upstream", &e.upstream)?,
            webdis: e.webdis.as_deref().map(|w| host_port("--webdis", w)).transpose()?,
            listen: e.listen,
            admin: e.admin,
            listeners: &listeners_path,
        };
        let written = idem_lint::policy::bootstrap(&b, &routes, redis.as_deref());
        for name in &written.skipped {
            eprintln!("idem-lint: note: route {name:?} matches an Envoy route by name: add that route yourself");
        }
        if e.update && !listeners.is_file() {
            return Err(FatalError::whole_file(
                &listeners_path,
                "no listeners file to update: start Envoy from `idem-lint envoy …` without --update first",
            )
            .into());
        }
        replace_file(&listeners, &written.listeners)?;
        if e.update {
            eprintln!("idem-lint: {listeners_path} updated: Envoy applies the policies within a second, keys kept");
        } else {
            eprintln!("idem-lint: listeners in {listeners_path} (edit the policies, then rerun with --update)");
            if let Some((name, dir)) = &native {
                say_where_envoy_finds("the bootstrap", name, dir);
            }
            print(&written.bootstrap);
        }
        return Ok(0);
    }
    if let Some(Command::Bundle(b)) = &cli.command {
        let set = PolicySet::load(&b.paths)?;
        let text = match b.format {
            BundleFormat::Toml => set.bundle_toml()?,
            BundleFormat::Json => set.bundle_json()?,
        };
        if b.envoy_filter {
            let files: Vec<String> = set.files.iter().map(|f| f.name().to_string()).collect();
            let routes: Vec<_> = set.routes().map(|r| r.route).collect();
            let native = native_build(b.native.as_deref(), &set)?;
            let filter = match &native {
                Some((name, dir)) => {
                    say_where_envoy_finds("the entry", name, dir);
                    idem_lint::policy::Filter::Native { module: name }
                }
                None => idem_lint::policy::Filter::Wasm { path: &b.wasm },
            };
            print(&envoy_filter(&text, filter, &files, &routes));
        } else {
            print(&text);
        }
        return Ok(0);
    }
    if let Some(Command::Rules { markdown, labels }) = cli.command {
        if labels {
            print(&idem_lint::section::label_table());
            return Ok(0);
        }
        if markdown {
            print(&idem_lint::rules::markdown_table());
            return Ok(0);
        }
        let mut s = String::new();
        for r in &RULES {
            s.push_str(&format!("{}  {:<8} {:<27} {}\n", r.code, r.severity.to_string(), r.name, r.summary));
        }
        print(&s);
        return Ok(0);
    }
    let explain = match &cli.command {
        Some(Command::Explain { code }) => Some(code),
        _ => cli.explain.as_ref(),
    };
    if let Some(code) = explain {
        let Some(rule) = find(code) else {
            return Err(FatalError::whole_file(code, "unknown rule code (see `idem-lint rules`)").into());
        };
        print(&rule.doc());
        return Ok(0);
    }
    let specs = idem_lint::loader::expand_specs(&cli.specs)?;
    if specs.is_empty() {
        // `--policies DIR spec.yaml` takes the spec for a policy: say so rather than "no SPEC".
        if !cli.policies.is_empty() {
            PolicySet::load(&cli.policies)?;
        }
        eprintln!("idem-lint: error: no SPEC given (usage: idem-lint [OPTIONS] <SPEC>...; see --help)");
        return Ok(2);
    }
    if cli.dump_yaml {
        let mut s = String::new();
        for spec in &specs {
            let ws = idem_lint::loader::Workspace::load(spec)?;
            s.push_str(&idem_lint::yaml::dump(ws.root().node));
        }
        print(&s);
        return Ok(0);
    }
    let config = match &cli.config {
        Some(path) => load_config(path)?,
        None if Path::new("idem-lint.toml").is_file() => load_config("idem-lint.toml")?,
        None => Config::default(),
    };
    let fail_on = match cli.fail_on {
        Some(FailOnArg::Error) => FailOn::Error,
        Some(FailOnArg::Warning) => FailOn::Warning,
        Some(FailOnArg::Never) => FailOn::Never,
        None => config.fail_on.unwrap_or_default(),
    };
    // Policy errors are fatal before any spec is read: the same message the filter gives.
    let policies = if cli.policies.is_empty() { None } else { Some(PolicySet::load(&cli.policies)?) };
    if cli.fix {
        let changed = fix_specs(&specs, policies.as_ref(), &cli.policies, &config, cli.diff)?;
        if cli.diff {
            return Ok(u8::from(changed));
        }
    }
    let Linted { findings, errors } = lint_specs(&specs, policies.as_ref(), &cli.policies, &config);
    let color = match cli.color {
        ColorArg::Always => true,
        ColorArg::Never => false,
        ColorArg::Auto => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let run = Run { specs: &specs, findings: &findings, errors: &errors };
    print(&render(cli.format, &run, color));
    for e in &errors {
        eprintln!("idem-lint: error: {e}");
    }
    if !errors.is_empty() {
        return Ok(2);
    }
    let failing = findings.iter().any(|f| match fail_on {
        FailOn::Error => f.severity == Severity::Error,
        FailOn::Warning => true,
        FailOn::Never => false,
    });
    Ok(u8::from(failing))
}

/// `--fix`: the edits of every spec, written (or printed as a diff). Whether anything changes.
/// With `--policies`, the gateway's own answers the spec lacks are added too (IDEM109).
fn fix_specs(
    specs: &[String],
    policies: Option<&PolicySet>,
    policy_args: &[String],
    config: &Config,
    diff: bool,
) -> Result<bool, FatalError> {
    let mut changed = false;
    for spec in specs {
        let Ok(ws) = Workspace::load(spec) else {
            continue; // reported by the lint that follows
        };
        let mut edits = idem_lint::fix::fixes(&ws, config);
        if let Some(set) = policies {
            let workspaces = std::slice::from_ref(&ws);
            let ctx = idem_lint::crosscheck::context(workspaces, set, policy_args, config);
            edits = idem_lint::fix::merge_gateway_answers(edits, idem_lint::fix::gateway_answer_fixes(&ctx, config));
        }
        for (name, old, new) in idem_lint::fix::changed_files(&ws, &edits) {
            changed = true;
            if diff {
                print(&idem_lint::fix::unified_diff(&name, &old, &new));
            } else {
                std::fs::write(&name, new)
                    .map_err(|e| FatalError::whole_file(&name, format!("cannot write the fix: {e}")))?;
                // An edit may add several entries to one map: count the entries.
                let mine = || edits.iter().filter(|e| ws.file(e.file).name == name);
                let added: usize = mine().map(|e| e.text.matches("description").count()).sum();
                let deliveries = mine()
                    .filter(|e| {
                        e.text.contains("at-least-once") || e.text.contains("投递") || e.text.contains("Delivery:")
                    })
                    .count();
                let what = match deliveries {
                    0 => format!("{added} response(s) added"),
                    n => format!("{added} response(s) added, {n} delivery statement(s) completed"),
                };
                eprintln!("idem-lint: fixed {name} ({what})");
            }
        }
    }
    Ok(changed)
}

fn write_policies(p: &PoliciesArgs, config: &Config) -> Result<u8, FatalErrors> {
    let specs = idem_lint::loader::expand_specs(&p.specs)?;
    let workspaces = specs.iter().map(|s| Workspace::load(s)).collect::<Result<Vec<_>, _>>()?;
    let (generated, skipped) = if p.receiver {
        idem_lint::generate::generate_receivers(&workspaces, config, &p.paths)
    } else {
        generate(&workspaces, config)
    };
    let unused: Vec<&str> =
        p.paths.iter().filter(|(n, _)| !generated.iter().any(|g| g.route == *n)).map(|(n, _)| n.as_str()).collect();
    if !unused.is_empty() {
        return Err(FatalError::whole_file(
            "--path",
            format!(
                "no delivery's policy is named {}: the names are {}",
                unused.join(", "),
                generated.iter().map(|g| g.route.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )
        .into());
    }
    let (plan, stale) = write_all(Path::new(&p.out), &generated, p.force)?;
    let mut out = String::new();
    for f in &plan {
        out.push_str(&format!("{:<9} {} ({})\n", f.action.verb(), f.path.display(), f.generated.operation));
    }
    print(&out);
    for f in &plan {
        if let Action::Keep(why, changes) = &f.action {
            let what = match changes.is_empty() {
                true => "the run would have changed nothing in its policy".to_string(),
                false => format!("the run would have changed:\n    {}", changes.join("\n    ")),
            };
            eprintln!("idem-lint: note: {} kept: {why}; {what}\n  (--force overwrites it)", f.path.display());
        }
    }
    for s in &skipped {
        eprintln!("idem-lint: skipped {} ({}): {}", s.operation, s.place, s.reason);
    }
    for s in &stale {
        eprintln!(
            "idem-lint: note: {s} was generated for an operation that is no longer documented as idempotent; left in place (delete it if that is intended)"
        );
    }
    if generated.is_empty() && skipped.is_empty() {
        let what = if p.receiver { "sends a webhook or callback" } else { "is documented as idempotent" };
        eprintln!("idem-lint: no operation of {} {what}: no policy written", specs.join(", "));
    }
    Ok(u8::from(!skipped.is_empty()))
}

/// `NAME=PATH` of `--path`: a policy name and a path that starts with `/`.
fn name_path(arg: &str) -> Result<(String, String), String> {
    match arg.split_once('=') {
        Some((name, path)) if !name.is_empty() && path.starts_with('/') => Ok((name.to_string(), path.to_string())),
        _ => Err(format!("{arg:?} is not NAME=PATH (a policy name, then a path starting with /)")),
    }
}

fn load_config(path: &str) -> Result<Config, FatalError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| FatalError::whole_file(path, format!("cannot read config: {e}")))?;
    Config::parse(path, &text)
}
