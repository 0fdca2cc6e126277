//! idem-admin: what an operator does with the unknown outcomes idem holds, on either store.
//!
//! A forwarded request that got no answer may have run, so idem holds its key as an unknown
//! outcome and answers every repeat `409 IDEMPOTENCY_OUTCOME_UNKNOWN`. Once the operator knows
//! what happened, `release` lets the client's next repeat run (it did not run), `resolve` gives
//! the client the answer it should have had (it ran). Both are fenced: a key that another request
//! has claimed since is never touched. On Redis it talks to Redis directly (not through Webdis),
//! as an ACL user of its own; on the shared store, whose records live inside Envoy, to the
//! filter's admin listener (`--shared`), which makes the change there (docs/unknown-outcomes.md).
//!
//! Exit codes: 0 done (or listed), 1 nothing changed (the key is not that unknown outcome any
//! more), 2 bad usage or Redis unreachable.

mod http;
mod on_redis;
mod on_shared;
mod resp;
mod show;

use clap::{Parser, Subcommand};
use idem_filter::response::{rfc3339, StoredResponse};
use idem_filter::store::operator;
use idem_filter::store::shared::held::parse_store_key;
use serde_json::json;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "idem-admin",
    version,
    about = "Show what idem holds for a key; list, release or resolve the unknown outcomes it holds"
)]
struct Cli {
    /// The shared store: the filter's admin listener, http://host:port (its bearer secret in
    /// IDEM_ADMIN_SECRET). Without it, the Redis store (--redis).
    #[arg(long, env = "IDEM_ADMIN_URL", conflicts_with = "redis")]
    shared: Option<String>,
    /// Redis to talk to: redis://[user[:password]@]host:port[/db] (an ACL user allowed
    /// SCAN, GET, EVAL, DEL and SET on the prefix's keys; docs/unknown-outcomes.md).
    #[arg(long, env = "IDEM_REDIS_URL", hide_env_values = true)]
    redis: Option<String>,
    /// The bundle's `[redis] prefix`.
    #[arg(long, default_value = "idem:")]
    prefix: String,
    /// JSON for scripts instead of text for people.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// What the store holds for one client key: absent, claimed, completed (its status), or an
    /// unknown outcome (held until when), with when it was first seen and its owner. The key's
    /// identity is computed as the filter computes it, from the route's policy and what the
    /// caller sends (its scope: the `Authorization` header by default).
    Show {
        /// The policy files (or directories of them) the route is in.
        #[arg(long = "policy", value_name = "PATH", required = true)]
        policies: Vec<std::path::PathBuf>,
        /// The route's name.
        #[arg(long)]
        route: String,
        /// The client's key (`Idempotency-Key`, the body field, …).
        #[arg(long)]
        key: String,
        /// A header the caller sends, `name: value` (repeatable): the route's `header:` scope
        /// parts, `Authorization` by default.
        #[arg(long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// A value an Envoy filter verified, `filter/field/…=value` (a `metadata:` scope part).
        #[arg(long = "metadata", value_name = "PATH=VALUE")]
        metadata: Vec<String>,
        /// The request's path (a `path:` scope part).
        #[arg(long, default_value = "/")]
        path: String,
        /// The request's body (a `body:` or `form:` scope part).
        #[arg(long)]
        body_file: Option<std::path::PathBuf>,
    },
    /// The unknown outcomes held now, oldest first (route, key prefix, when the first attempt
    /// was seen, when the hold ends, the store key, the owner that fences it).
    List,
    /// It did not run: release the key, so the client's next repeat runs as a first request.
    Release {
        /// The store key, as `list` and the filter's `unknown_outcome` log line give it.
        store_key: String,
        /// Release only the unknown outcome of this owner (as `list` showed it): if the key was
        /// released and held again by another request since, nothing changes.
        #[arg(long)]
        owner: Option<String>,
    },
    /// It ran: store the answer the client should get; its repeats replay it until the hold ends.
    Resolve {
        store_key: String,
        #[arg(long)]
        owner: Option<String>,
        /// The answer's HTTP status (200–599).
        #[arg(long, value_parser = clap::value_parser!(u16).range(200..=599))]
        status: u16,
        /// An answer header, `name: value` (repeatable). Without `content-type`, a body that is
        /// JSON is `application/json`, any other `text/plain; charset=utf-8`.
        #[arg(long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// The answer's body.
        #[arg(long, conflicts_with = "body_file")]
        body: Option<String>,
        /// The answer's body, read from a file.
        #[arg(long)]
        body_file: Option<std::path::PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("idem-admin: {message}");
            ExitCode::from(2)
        }
    }
}

/// One held unknown outcome, as `list` prints it (either store).
pub struct Row {
    pub store_key: String,
    pub owner: String,
    pub first_seen_at: String,
    pub held_until: String,
    /// A lookup is asking the service about it right now (shared store).
    pub looking_up: bool,
    /// The route and the first characters of the client's key, noted when it was held (`None`
    /// for records written before notes were kept).
    pub route: Option<String>,
    pub key_prefix: Option<String>,
}

/// What a release or resolve did: `result` for scripts, `message` for people.
pub struct Outcome {
    pub changed: bool,
    pub result: String,
    pub message: String,
}

/// Where the unknown outcomes are.
enum Store {
    Redis { con: resp::Connection, url: String, prefix: String },
    Shared(on_shared::Listener),
}

impl Store {
    fn list(&mut self) -> Result<Vec<Row>, String> {
        match self {
            Store::Redis { con, url, prefix } => {
                let entries = on_redis::list(con, prefix).map_err(|e| format!("Redis at {}: {e}", redacted(url)))?;
                Ok(entries
                    .into_iter()
                    .map(|e| Row {
                        store_key: e.store_key,
                        owner: e.held.owner,
                        first_seen_at: rfc3339(e.held.first_seen_ms),
                        held_until: rfc3339(e.held.held_until_ms),
                        looking_up: e.held.lookup_lease_ms.is_some_and(|l| l > now_ms()),
                        route: e.held.note.as_ref().map(|n| n.route.clone()),
                        key_prefix: e.held.note.and_then(|n| n.key_prefix),
                    })
                    .collect())
            }
            Store::Shared(listener) => listener.list(),
        }
    }

    /// What the store holds for the scoped id `id` (the admin listener's JSON, on either store).
    fn show(&mut self, id: &[u8; 32]) -> Result<serde_json::Value, String> {
        let hex = show::hex(id);
        match self {
            Store::Redis { con, url, prefix } => {
                let store_key = format!("{prefix}k:{hex}");
                let reply = con.call(&["GET", &store_key]).map_err(|e| format!("Redis at {}: {e}", redacted(url)))?;
                let state = match reply.text() {
                    None => operator::KeyState::Absent,
                    Some(record) => operator::KeyState::of_record(&record, now_ms())
                        .ok_or_else(|| format!("{store_key} holds a record that is not a claim: {record:.40}"))?,
                };
                Ok(state.to_json(&store_key))
            }
            Store::Shared(listener) => listener.show(&hex),
        }
    }

    fn change(&mut self, key: &str, owner: Option<&str>, answer: Option<&StoredResponse>) -> Result<Outcome, String> {
        let done = if answer.is_some() { "resolved" } else { "released" };
        match self {
            Store::Redis { con, url, .. } => {
                let change = match answer {
                    Some(a) => on_redis::resolve(con, key, owner, a),
                    None => on_redis::release(con, key, owner),
                }
                .map_err(|e| format!("Redis at {}: {e}", redacted(url)))?;
                let (result, message) = change.describe(done, key);
                Ok(Outcome { changed: change == operator::Change::Done, result, message })
            }
            Store::Shared(listener) => match answer {
                Some(a) => listener.resolve(key, owner, a),
                None => listener.release(key, owner),
            },
        }
    }
}

fn run(cli: &Cli) -> Result<ExitCode, String> {
    // Checked before connecting: a malformed key or answer is the operator's typo.
    if let Command::Show { policies, route, key, headers, metadata, path, body_file } = &cli.command {
        let policy = show::route(policies, route)?;
        let caller = show::Caller {
            method: "POST".into(),
            path: path.clone(),
            headers: show::headers(headers)?,
            body: show::read_body(body_file.as_deref())?,
            metadata: show::metadata(metadata)?,
        };
        let id = show::scoped_id(&policy, key, &caller)?;
        let mut state = open(cli)?.show(&id)?;
        state["route"] = route.as_str().into();
        state["key"] = key.as_str().into();
        state["scoped_id"] = show::hex(&id).into();
        state["key_digest"] = idem_filter::key::key_digest(route, key).into();
        print_show(&state, cli.json);
        return Ok(ExitCode::SUCCESS);
    }
    let key = match &cli.command {
        Command::Show { .. } | Command::List => None,
        Command::Release { store_key, .. } | Command::Resolve { store_key, .. } => Some(store_key),
    };
    if let Some(key) = key {
        check_store_key(cli, key)?;
    }
    let answer = match &cli.command {
        Command::Resolve { status, headers, body, body_file, .. } => Some(answer(*status, headers, body, body_file)?),
        _ => None,
    };
    let mut store = open(cli)?;
    match &cli.command {
        Command::Show { .. } => Ok(ExitCode::SUCCESS),
        Command::List => {
            print_list(&store.list()?, cli.json);
            Ok(ExitCode::SUCCESS)
        }
        Command::Release { store_key, owner } | Command::Resolve { store_key, owner, .. } => {
            let outcome = store.change(store_key, owner.as_deref(), answer.as_ref())?;
            Ok(report(store_key, &outcome, cli.json))
        }
    }
}

fn check_store_key(cli: &Cli, key: &str) -> Result<(), String> {
    if cli.shared.is_some() {
        if parse_store_key(key).is_none() {
            return Err(format!("{key:?} is not a shared-store key: expected s:<bucket>:<32 lowercase hex digits> (the store_key of `idem-admin list` or of the filter's unknown_outcome log line)"));
        }
    } else if !operator::is_claim_key(&cli.prefix, key) {
        return Err(format!(
            "{key:?} is not a claim key: expected {}k: and 64 lowercase hex digits (the store_key of `idem-admin list` or of the filter's unknown_outcome log line; --prefix is the bundle's [redis] prefix)",
            cli.prefix
        ));
    }
    Ok(())
}

fn open(cli: &Cli) -> Result<Store, String> {
    if let Some(url) = &cli.shared {
        let target = http::Target::parse(url).map_err(|e| format!("--shared {url}: {e}"))?;
        let secret = std::env::var("IDEM_ADMIN_SECRET").map_err(|_| {
            "--shared needs the admin listener's bearer secret in IDEM_ADMIN_SECRET ([admin] secret)".to_string()
        })?;
        return Ok(Store::Shared(on_shared::Listener { target, secret }));
    }
    let url = cli.redis.clone().unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let target = resp::Target::parse(&url).map_err(|e| format!("--redis {}: {e}", redacted(&url)))?;
    let con = resp::Connection::open(&target, Duration::from_secs(5))
        .map_err(|e| format!("cannot use Redis at {}: {e}", redacted(&url)))?;
    Ok(Store::Redis { con, url, prefix: cli.prefix.clone() })
}

/// The answer `resolve` stores, from its flags.
fn answer(
    status: u16,
    headers: &[String],
    body: &Option<String>,
    body_file: &Option<std::path::PathBuf>,
) -> Result<StoredResponse, String> {
    let body = match (body, body_file) {
        (Some(b), _) => b.clone().into_bytes(),
        (None, Some(path)) => std::fs::read(path).map_err(|e| format!("--body-file {}: {e}", path.display()))?,
        (None, None) => Vec::new(),
    };
    let mut parsed = Vec::with_capacity(headers.len() + 1);
    for h in headers {
        let Some((name, value)) = h.split_once(':') else {
            return Err(format!("--header {h:?}: expected `name: value`"));
        };
        let name = name.trim().to_ascii_lowercase();
        let valid =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !valid || value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!(
                "--header {h:?}: not a valid HTTP header (a token name, a value without CR, LF or NUL)"
            ));
        }
        parsed.push((name, value.trim().as_bytes().to_vec()));
    }
    if !body.is_empty() && !parsed.iter().any(|(n, _)| n == "content-type") {
        let json = serde_json::from_slice::<serde_json::Value>(&body).is_ok();
        let content_type = if json { "application/json" } else { "text/plain; charset=utf-8" };
        parsed.push(("content-type".into(), content_type.as_bytes().to_vec()));
    }
    Ok(StoredResponse::new(status, parsed, body))
}

fn print_list(rows: &[Row], as_json: bool) {
    if as_json {
        let rows: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                json!({
                    "store_key": r.store_key,
                    "route": r.route,
                    "key_prefix": r.key_prefix,
                    "owner": r.owner,
                    "first_seen_at": r.first_seen_at,
                    "held_until": r.held_until,
                    "looking_up": r.looking_up,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return;
    }
    if rows.is_empty() {
        println!("no unknown outcomes held");
        return;
    }
    let width = |header: &str, cell: &dyn Fn(&Row) -> usize| rows.iter().map(cell).max().unwrap_or(0).max(header.len());
    let route = |r: &Row| r.route.as_deref().unwrap_or("?").to_string();
    // A key prefix comes from a client: shown escaped, so no control character reaches a terminal.
    let prefix = |r: &Row| r.key_prefix.as_deref().map_or_else(|| "-".to_string(), |p| p.escape_debug().to_string());
    let (rw, pw) = (width("ROUTE", &|r| route(r).chars().count()), width("KEY", &|r| prefix(r).chars().count()));
    let kw = width("STORE KEY", &|r| r.store_key.len());
    println!(
        "{:<rw$}  {:<pw$}  {:<24}  {:<24}  {:<kw$}  OWNER",
        "ROUTE", "KEY", "FIRST SEEN", "HELD UNTIL", "STORE KEY"
    );
    for r in rows {
        let note = if r.looking_up { "  (a lookup is asking the service)" } else { "" };
        println!(
            "{:<rw$}  {:<pw$}  {:<24}  {:<24}  {:<kw$}  {}{note}",
            route(r),
            prefix(r),
            r.first_seen_at,
            r.held_until,
            r.store_key,
            r.owner
        );
    }
    println!("{} unknown outcome{} held", rows.len(), if rows.len() == 1 { "" } else { "s" });
}

/// Prints what `show` found: the JSON, or one line per fact for people.
fn print_show(state: &serde_json::Value, as_json: bool) {
    if as_json {
        println!("{state}");
        return;
    }
    let text = |f: &str| state.get(f).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    // The key comes from the operator: shown escaped, as keys are in `list`.
    println!("route {}, key {:?}", text("route"), text("key"));
    let what = match text("state").as_str() {
        "absent" => "absent: nothing held (never claimed, released, expired or evicted)".to_string(),
        "claimed" => {
            format!("claimed: a request holds it, its outcome not in yet (lease until {})", text("lease_ends_at"))
        }
        "completed" => {
            let kept = if state.get("answer_kept").and_then(|v| v.as_bool()) == Some(true) {
                "its answer stored"
            } else {
                "its status only (a tombstone: the answer was too large to keep)"
            };
            format!("completed: {} — {kept}", state.get("status").map(ToString::to_string).unwrap_or_default())
        }
        "unknown_outcome" => {
            let asking = if state.get("looking_up").and_then(|v| v.as_bool()) == Some(true) {
                "; a lookup is asking the service now"
            } else {
                ""
            };
            format!("unknown outcome: forwarded, no answer; held until {}{asking}", text("held_until"))
        }
        other => other.to_string(),
    };
    println!("  {what}");
    if !text("first_seen_at").is_empty() {
        println!("  first seen {}, owner {}", text("first_seen_at"), text("owner"));
    }
    println!("  store key {}  (scoped id {})", text("store_key"), text("scoped_id"));
    println!("  its log lines: key_digest={}", text("key_digest"));
}

/// Prints what a release or resolve did; exit 0 if it changed the key, 1 if not.
fn report(store_key: &str, outcome: &Outcome, as_json: bool) -> ExitCode {
    if as_json {
        println!("{}", json!({ "store_key": store_key, "result": outcome.result, "message": outcome.message }));
    } else if outcome.changed {
        println!("{}", outcome.message);
    } else {
        eprintln!("idem-admin: {}", outcome.message);
    }
    if outcome.changed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The URL without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = url.get(scheme + 3..at).unwrap_or("");
            let user = creds.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", url.get(..scheme + 3).unwrap_or(""), url.get(at..).unwrap_or(""))
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_password_never_reaches_a_message() {
        assert_eq!(redacted("redis://op:s3cret@127.0.0.1:6379/0"), "redis://op:***@127.0.0.1:6379/0");
        assert_eq!(redacted("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
    }

    #[test]
    fn an_answer_gets_a_content_type_and_refuses_bad_headers() {
        let a = answer(200, &[], &Some(r#"{"order":"o-1"}"#.into()), &None).unwrap();
        assert_eq!(a.headers, vec![("content-type".to_string(), b"application/json".to_vec())]);
        let a =
            answer(201, &["Content-Type: text/csv".into(), "X-Order: 1".into()], &Some("a,b".into()), &None).unwrap();
        assert_eq!(a.headers.len(), 2);
        assert_eq!(a.headers[0], ("content-type".to_string(), b"text/csv".to_vec()));
        for bad in ["no colon", "bad name: v", "x: a\r\nset-cookie: s=1", ": v"] {
            assert!(answer(200, &[bad.into()], &None, &None).is_err(), "{bad:?}");
        }
    }
}
