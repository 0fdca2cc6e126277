//! Redis spoken directly (`[redis] direct`): no Webdis between the module and Redis.
//!
//! One client thread per Redis (its addresses, user, password variable or file), started on first
//! use, owns the connections (the `redis` crate's, synchronous): one per Redis node. Workers
//! queue commands on it and go on; the thread sends every command waiting as one pipeline per
//! node, reads the replies in order, and hands each to its worker's mailbox as a callout's answer
//! (`calls::deliver_answer`, then the worker is woken as for any call). So a reply reaches the
//! core as Webdis' would ([`idem_filter::store::resp`]), and group commit, fencing and retries are
//! the core's, unchanged.
//!
//! **Redis Cluster.** `direct` may name several nodes; a single Redis is the case where no reply
//! is ever `MOVED`. Each command goes to the node serving its key's hash slot (the slot map,
//! empty at first: a slot not in it goes to the first node that answers). A `MOVED` reply teaches
//! the slot's node and refreshes the whole map (`CLUSTER SLOTS`, when the ACL allows it), and the
//! command is sent there; an `ASK` reply sends it there once, after `ASKING`. Neither ran the
//! command, so sending it again is safe. At most [`MAX_REDIRECTS`] of them per command; then the
//! redirection itself is the reply (an error the core reads as Redis'). The core batches per hash
//! slot once Redis refuses a batch `CROSSSLOT`, as it does through Envoy's `redis_proxy`.
//!
//! Failures read as a failed callout (no headers: the store's "no answer"): Redis unreachable, a
//! wrong password, a pipeline not answered within its commands' timeout (one deadline for the
//! whole exchange), a reset. That node's connection is then dropped — a reply it still owed
//! cannot be told from the next one's — and made again for the next pipeline, and the slots the
//! map gave it are forgotten, so the next commands for them ask another node (which answers
//! `MOVED` to the promoted replica once a failover is done). The first failure of a streak is
//! logged with its cause. A command queued behind a pipeline Redis does not answer waits for that
//! pipeline's deadline first: at most twice its own timeout.
//! Whether a command whose reply was lost ran is unknown, as with a Webdis timeout; the core
//! treats it so (an unanswered claim is released, owner-checked). Such a command is never sent
//! again here.

use crate::abi;
use crate::calls;
use crate::config::Config;
use crate::host::CallAnswer;
use idem_filter::host::Level;
use idem_filter::pairs::Headers;
use idem_filter::policy::{addresses, split_address, RedisConfig};
use idem_filter::store::redis::hash_slot;
use idem_filter::store::resp::{self, Reply};
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The most commands one pipeline carries.
const MAX_PIPELINE: usize = 256;

/// The most `MOVED`/`ASK` redirections one command follows (a slot moves at most once during a
/// resharding step; a second hop is a failover on top of it).
const MAX_REDIRECTS: usize = 2;

/// Redis Cluster's hash slots.
const SLOTS: usize = 16384;

/// A `CLUSTER SLOTS` refresh at most this often: every `MOVED` of a resharding would ask again.
const MAP_REFRESH: Duration = Duration::from_millis(200);

/// A command for Redis and where its reply goes.
pub struct Job {
    pub args: Vec<Vec<u8>>,
    pub timeout: Duration,
    pub config: Arc<Config>,
    pub slot: usize,
    pub root: u32,
    pub token: u32,
}

/// Which Redis a client thread talks to: its addresses, the ACL user, where its password is.
#[derive(Clone, PartialEq, Eq)]
struct Target {
    addresses: String,
    user: Option<String>,
    password_env: Option<String>,
    password_file: Option<String>,
    tls: bool,
    tls_ca_file: Option<String>,
}

static CLIENTS: Mutex<Vec<(Target, Sender<Job>)>> = Mutex::new(Vec::new());

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Queues `job` for `redis.direct`'s client thread (started the first time).
pub fn send(redis: &RedisConfig, job: Job) -> Result<(), String> {
    let Some(address) = &redis.direct else {
        return Err("[redis] has no `direct` address".into());
    };
    let target = Target {
        addresses: address.clone(),
        user: redis.user.clone(),
        password_env: redis.password_env.clone(),
        password_file: redis.password_file.clone(),
        tls: redis.tls,
        tls_ca_file: redis.tls_ca_file.clone(),
    };
    let mut clients = lock(&CLIENTS);
    if let Some((_, sender)) = clients.iter().find(|(t, _)| *t == target) {
        return sender.send(job).map_err(|_| format!("the Redis client thread of {address} has stopped"));
    }
    let (sender, receiver) = channel();
    let client = Client::new(target.clone());
    std::thread::Builder::new()
        .name("idem-redis".into())
        .spawn(move || client.run(receiver))
        .map_err(|e| format!("cannot start the Redis client thread of {address}: {e}"))?;
    sender.send(job).map_err(|_| format!("the Redis client thread of {address} has stopped"))?;
    clients.push((target, sender));
    Ok(())
}

/// A client thread's state: its connections and what it knows of the cluster.
struct Client {
    target: Target,
    /// The nodes known: `direct`'s, then those Redis named (`MOVED`, `ASK`, `CLUSTER SLOTS`).
    nodes: Vec<String>,
    /// The node a command without a known slot goes to (an index in `nodes`): the first one
    /// that answers, the next one after it fails.
    default_node: usize,
    connections: HashMap<usize, redis::Connection>,
    /// The node serving each hash slot (an index in `nodes`), as Redis said; empty for a single
    /// Redis, which never says.
    slot_map: Vec<Option<usize>>,
    last_map_refresh: Option<Instant>,
    /// Whether the last exchange failed (its first failure is logged, and its end).
    failing: bool,
}

/// Where a command goes in one round of an exchange: its job, its node, after `ASKING` or not.
struct Send {
    job: usize,
    node: usize,
    asking: bool,
}

/// One round's outcome for a command: its reply, or a node to send it to again.
enum Outcome {
    Reply(redis::Value),
    Redirect { node: usize, asking: bool, reply: redis::Value },
    Lost,
}

impl Client {
    fn new(target: Target) -> Client {
        let nodes = addresses(&target.addresses).map(str::to_string).collect();
        Client {
            target,
            nodes,
            default_node: 0,
            connections: HashMap::new(),
            slot_map: Vec::new(),
            last_map_refresh: None,
            failing: false,
        }
    }

    /// A pipeline of what waits, its replies to their workers, for ever.
    fn run(mut self, jobs: Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut batch = vec![first];
            while batch.len() < MAX_PIPELINE {
                match jobs.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let (replies, failure) = self.exchange(&batch);
            self.log_streak(failure.as_ref());
            for (job, reply) in batch.into_iter().zip(replies) {
                let answer = match reply {
                    Some(value) => CallAnswer {
                        headers: Headers::from_pairs(&[(":status", "200")]),
                        body: resp::webdis_json(&command_name(&job.args), &reply_of(value)),
                    },
                    None => CallAnswer::default(),
                };
                calls::deliver_answer(&job.config, job.slot, job.root, job.token, answer);
            }
        }
    }

    /// Once per failing streak: a wrong password or address reads as "no answer" to the core,
    /// and the log says which.
    fn log_streak(&mut self, failure: Option<&String>) {
        let address = &self.target.addresses;
        match failure {
            Some(e) if !self.failing => abi::log(
                Level::Warn as u32,
                &format!("idem: Redis {address} ([redis] direct): {e}; its commands fail until it answers"),
            ),
            None if self.failing => {
                abi::log(Level::Info as u32, &format!("idem: Redis {address} ([redis] direct) answers again"))
            }
            _ => {}
        }
        self.failing = failure.is_some();
    }

    /// Sends `batch` (one pipeline per node, again to where Redis redirects) and reads the
    /// replies until the longest of the commands' timeouts has passed: each command's reply, or
    /// `None` where none came, and the first failure met.
    fn exchange(&mut self, batch: &[Job]) -> (Vec<Option<redis::Value>>, Option<String>) {
        let timeout = batch.iter().map(|j| j.timeout).max().unwrap_or(Duration::from_millis(500));
        let deadline = Instant::now() + timeout;
        let mut replies: Vec<Option<redis::Value>> = batch.iter().map(|_| None).collect();
        let mut failure = None;
        let mut round: Vec<Send> = Vec::with_capacity(batch.len());
        for (job, j) in batch.iter().enumerate() {
            match self.node_for(&j.args) {
                Some(node) => round.push(Send { job, node, asking: false }),
                None => failure = Some("no node of `direct` answers".to_string()),
            }
        }
        for hop in 0..=MAX_REDIRECTS {
            if round.is_empty() {
                break;
            }
            let mut again = Vec::new();
            for (send, outcome) in self.round(batch, round, deadline, &mut failure) {
                match outcome {
                    Outcome::Redirect { node, asking, reply } if hop < MAX_REDIRECTS => {
                        again.push(Send { job: send.job, node, asking });
                        replies[send.job] = Some(reply);
                    }
                    Outcome::Redirect { reply, .. } | Outcome::Reply(reply) => replies[send.job] = Some(reply),
                    Outcome::Lost => replies[send.job] = None,
                }
            }
            round = again;
        }
        (replies, failure)
    }

    /// One round: every node's commands sent as one pipeline, then every reply read, in order.
    fn round(
        &mut self,
        batch: &[Job],
        sends: Vec<Send>,
        deadline: Instant,
        failure: &mut Option<String>,
    ) -> Vec<(Send, Outcome)> {
        let mut by_node: Vec<(usize, Vec<Send>)> = Vec::new();
        for send in sends {
            match by_node.iter_mut().find(|(node, _)| *node == send.node) {
                Some((_, group)) => group.push(send),
                None => by_node.push((send.node, vec![send])),
            }
        }
        let mut sent = Vec::with_capacity(by_node.len());
        let mut out = Vec::new();
        for (node, group) in by_node {
            match self.send_pipeline(node, batch, &group, deadline) {
                Ok(()) => sent.push((node, group)),
                Err(e) => {
                    self.lost(node, &e, failure);
                    out.extend(group.into_iter().map(|s| (s, Outcome::Lost)));
                }
            }
        }
        let mut refresh_from = None;
        for (node, group) in sent {
            let mut broken = false;
            for send in group {
                if broken {
                    out.push((send, Outcome::Lost));
                    continue;
                }
                match self.read_reply(node, send.asking, deadline) {
                    Ok(value) => {
                        let outcome = self.outcome(value);
                        if let Outcome::Redirect { node: to, asking: false, .. } = &outcome {
                            refresh_from = Some(*to);
                        }
                        out.push((send, outcome));
                    }
                    Err(e) => {
                        self.lost(node, &e, failure);
                        broken = true;
                        out.push((send, Outcome::Lost));
                    }
                }
            }
        }
        if let Some(node) = refresh_from {
            self.refresh_slot_map(node, deadline);
        }
        out
    }

    /// Writes `group`'s commands to `node` as one pipeline (`ASKING` before each redirected one).
    fn send_pipeline(&mut self, node: usize, batch: &[Job], group: &[Send], deadline: Instant) -> Result<(), String> {
        let mut pipeline = redis::pipe();
        for send in group {
            if send.asking {
                pipeline.add_command(redis::cmd("ASKING"));
            }
            let mut cmd = redis::Cmd::new();
            for arg in batch.get(send.job).map_or(&[][..], |j| j.args.as_slice()) {
                cmd.arg(arg.as_slice());
            }
            pipeline.add_command(cmd);
        }
        let con = self.connection(node, deadline)?;
        let left = left(deadline)?;
        con.set_write_timeout(Some(left)).map_err(|e| e.to_string())?;
        con.send_packed_command(&pipeline.get_packed_pipeline()).map_err(|e| e.to_string())
    }

    /// The next reply from `node` (after `ASKING`'s, which is read and dropped), within what is
    /// left of the deadline.
    fn read_reply(&mut self, node: usize, asking: bool, deadline: Instant) -> Result<redis::Value, String> {
        let con = self.connections.get_mut(&node).ok_or("no connection")?;
        let mut read = || -> Result<redis::Value, String> {
            con.set_read_timeout(Some(left(deadline)?)).map_err(|e| e.to_string())?;
            con.recv_response().map_err(|e| e.to_string())
        };
        if asking {
            read()?;
        }
        read()
    }

    /// What a reply means: a redirection (`MOVED`, learnt, or `ASK`) or the command's reply.
    fn outcome(&mut self, value: redis::Value) -> Outcome {
        let redis::Value::ServerError(e) = &value else {
            return Outcome::Reply(value);
        };
        let (asking, parts) = match e.code() {
            "MOVED" => (false, e.details()),
            "ASK" => (true, e.details()),
            _ => return Outcome::Reply(value),
        };
        // `MOVED 3999 127.0.0.1:6381`: the slot, then its node.
        let mut parts = parts.unwrap_or_default().split_whitespace();
        let (Some(slot), Some(address)) = (parts.next().and_then(|s| s.parse::<usize>().ok()), parts.next()) else {
            return Outcome::Reply(value);
        };
        let node = self.node_index(&bracketed(address));
        if !asking {
            self.set_slot(slot, node);
        }
        Outcome::Redirect { node, asking, reply: value }
    }

    /// The node a command goes to: its key's slot's, else the default node.
    fn node_for(&mut self, args: &[Vec<u8>]) -> Option<usize> {
        // A single Redis never fills the map: no key to find or hash per command.
        let known = (!self.slot_map.is_empty())
            .then(|| first_key(args))
            .flatten()
            .and_then(|key| self.slot_map.get(usize::from(hash_slot(key))).copied().flatten());
        known.or_else(|| (!self.nodes.is_empty()).then_some(self.default_node % self.nodes.len()))
    }

    /// `node`'s connection, made if there is none.
    fn connection(&mut self, node: usize, deadline: Instant) -> Result<&mut redis::Connection, String> {
        if !self.connections.contains_key(&node) {
            let address = self.nodes.get(node).ok_or("no such node")?;
            let con = connect(&self.target, address, left(deadline)?).map_err(|e| format!("{address}: {e}"))?;
            self.connections.insert(node, con);
        }
        self.connections.get_mut(&node).ok_or_else(|| "no connection".to_string())
    }

    /// `node` failed: its connection dropped, its slots forgotten, the default node moved past
    /// it, and the failure kept if it is the first of this exchange.
    fn lost(&mut self, node: usize, e: &str, failure: &mut Option<String>) {
        self.connections.remove(&node);
        for entry in self.slot_map.iter_mut().filter(|n| **n == Some(node)) {
            *entry = None;
        }
        if self.default_node % self.nodes.len().max(1) == node {
            self.default_node = (node + 1) % self.nodes.len().max(1);
        }
        let address = self.nodes.get(node).map_or("?", String::as_str);
        failure.get_or_insert_with(|| if e.starts_with(address) { e.to_string() } else { format!("{address}: {e}") });
    }

    fn node_index(&mut self, address: &str) -> usize {
        match self.nodes.iter().position(|n| n == address) {
            Some(i) => i,
            None => {
                self.nodes.push(address.to_string());
                self.nodes.len() - 1
            }
        }
    }

    fn set_slot(&mut self, slot: usize, node: usize) {
        if self.slot_map.is_empty() {
            self.slot_map = vec![None; SLOTS];
        }
        if let Some(entry) = self.slot_map.get_mut(slot) {
            *entry = Some(node);
        }
    }

    /// The whole slot map from `node` (`CLUSTER SLOTS`), at most every [`MAP_REFRESH`]. An ACL
    /// that refuses it leaves the map to `MOVED` replies, slot by slot.
    fn refresh_slot_map(&mut self, node: usize, deadline: Instant) {
        if self.last_map_refresh.is_some_and(|t| t.elapsed() < MAP_REFRESH) {
            return;
        }
        self.last_map_refresh = Some(Instant::now());
        let asked = self.nodes.get(node).cloned().unwrap_or_default();
        let Ok(con) = self.connection(node, deadline) else { return };
        let Ok(left) = left(deadline) else { return };
        if con.set_read_timeout(Some(left)).is_err() {
            return;
        }
        let ranges = match redis::cmd("CLUSTER").arg("SLOTS").query::<redis::Value>(con) {
            Ok(redis::Value::Array(ranges)) => ranges,
            // A reply that came late would be read as the next command's: that connection goes.
            Err(e) if e.is_io_error() => {
                self.connections.remove(&node);
                return;
            }
            _ => return,
        };
        // [[start, end, [host, port, id, …], replicas…], …]: the primary is the first node.
        for range in ranges {
            let redis::Value::Array(fields) = range else { continue };
            let (Some(redis::Value::Int(start)), Some(redis::Value::Int(end)), Some(redis::Value::Array(primary))) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            let host = match primary.first() {
                Some(redis::Value::BulkString(h)) if !h.is_empty() && h != b"?" => {
                    String::from_utf8_lossy(h).into_owned()
                }
                _ => split_address(&asked).map(|(h, _)| h.to_string()).unwrap_or_default(),
            };
            let Some(redis::Value::Int(port)) = primary.get(1) else { continue };
            let node = self.node_index(&bracketed(&format!("{host}:{port}")));
            for slot in (*start).max(0)..=(*end).min(SLOTS as i64 - 1) {
                self.set_slot(slot as usize, node);
            }
        }
    }
}

/// `host:port` as [`split_address`] reads it: Redis names an IPv6 node `::1:7001`, unbracketed.
fn bracketed(address: &str) -> String {
    match address.rsplit_once(':') {
        Some((host, port)) if host.contains(':') && !host.starts_with('[') => format!("[{host}]:{port}"),
        _ => address.to_string(),
    }
}

/// What is left until `deadline`, or the timeout as an error.
fn left(deadline: Instant) -> Result<Duration, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err("no reply within the timeout".into())
    } else {
        Ok(left)
    }
}

/// The key a command's hash slot is taken from: `EVAL script numkeys key …`'s first key, else the
/// first argument (`GET key`). None for a script without keys.
fn first_key(args: &[Vec<u8>]) -> Option<&[u8]> {
    let name = args.first()?;
    if name.eq_ignore_ascii_case(b"EVAL") || name.eq_ignore_ascii_case(b"EVALSHA") {
        let keys = std::str::from_utf8(args.get(2)?).ok()?.parse::<usize>().ok()?;
        return if keys > 0 { args.get(3).map(Vec::as_slice) } else { None };
    }
    args.get(1).map(Vec::as_slice)
}

fn connect(target: &Target, address: &str, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let Some((host, port)) = split_address(address) else {
        return Err(redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "not host:port")));
    };
    let password = match (&target.password_env, &target.password_file) {
        (Some(name), _) => std::env::var(name).ok(),
        (None, Some(path)) => Some(
            read_password_file(path)
                .map_err(|e| redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "password_file", e)))?,
        ),
        (None, None) => None,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let addr = if target.tls {
        redis::ConnectionAddr::TcpTls { host, port, insecure: false, tls_params: None }
    } else {
        redis::ConnectionAddr::Tcp(host, port)
    };
    let info = redis::ConnectionInfo {
        addr,
        redis: redis::RedisConnectionInfo { username: target.user.clone(), password, ..Default::default() },
    };
    let client = match &target.tls_ca_file {
        Some(path) => {
            let root_cert = read_ca_file(path)
                .map_err(|e| redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "tls_ca_file", e)))?;
            redis::Client::build_with_tls(
                info,
                redis::TlsCertificates { client_tls: None, root_cert: Some(root_cert) },
            )?
        }
        None => redis::Client::open(info)?,
    };
    client.get_connection_with_timeout(timeout)
}

/// The PEM certificates in `path` (`[redis] tls_ca_file`): at least one, each one rustls reads.
pub fn read_ca_file(path: &str) -> Result<Vec<u8>, String> {
    use rustls::pki_types::pem::PemObject;
    let pem = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut count = 0;
    for cert in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| format!("not a PEM certificate file: {e:?}"))?;
        count += 1;
    }
    if count == 0 {
        return Err("it holds no PEM certificate".into());
    }
    Ok(pem)
}

/// The password in `path` (`[redis] password_file`): the file's text, one trailing newline (`\n`
/// or `\r\n`) dropped, as `echo secret > file` and Kubernetes secrets leave it.
pub fn read_password_file(path: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    let password = text.strip_suffix('\n').map_or(text.as_str(), |t| t.strip_suffix('\r').unwrap_or(t));
    if password.is_empty() {
        return Err("it is empty".into());
    }
    Ok(password.to_string())
}

/// The command's name (its first argument), the key of Webdis' reply.
fn command_name(args: &[Vec<u8>]) -> String {
    String::from_utf8_lossy(args.first().map_or(&[][..], Vec::as_slice)).into_owned()
}

/// A reply of the `redis` crate as the core's [`Reply`].
fn reply_of(value: redis::Value) -> Reply {
    match value {
        redis::Value::Nil => Reply::Bulk(None),
        redis::Value::Int(n) => Reply::Integer(n),
        redis::Value::BulkString(bytes) => Reply::Bulk(Some(bytes)),
        redis::Value::Array(items) | redis::Value::Set(items) => {
            Reply::Array(items.into_iter().map(reply_of).collect())
        }
        redis::Value::SimpleString(s) => Reply::Status(s),
        redis::Value::Okay => Reply::Status("OK".into()),
        redis::Value::ServerError(e) => {
            Reply::Error(format!("{} {}", e.code(), e.details().unwrap_or_default()).trim_end().to_string())
        }
        other => Reply::Error(format!("ERR a reply idem does not read: {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(addresses: &str) -> Client {
        Client::new(Target {
            addresses: addresses.into(),
            user: None,
            password_env: None,
            password_file: None,
            tls: false,
            tls_ca_file: None,
        })
    }

    fn args(words: &[&str]) -> Vec<Vec<u8>> {
        words.iter().map(|w| w.as_bytes().to_vec()).collect()
    }

    fn reply(resp: &str) -> redis::Value {
        redis::parse_redis_value(resp.as_bytes()).unwrap_or(redis::Value::Nil)
    }

    #[test]
    fn a_commands_slot_is_its_first_keys() {
        assert_eq!(first_key(&args(&["GET", "idem:k:a"])), Some(&b"idem:k:a"[..]));
        assert_eq!(first_key(&args(&["EVAL", "return 1", "2", "k1", "k2", "argv"])), Some(&b"k1"[..]));
        assert_eq!(first_key(&args(&["eval", "return 1", "0", "argv"])), None);
        assert_eq!(first_key(&args(&["EVAL", "return 1", "x"])), None);
    }

    #[test]
    fn moved_teaches_the_slots_node_and_ask_does_not() {
        let mut c = client("127.0.0.1:7000,127.0.0.1:7001");
        let slot = usize::from(hash_slot("idem:k:a"));
        assert_eq!(c.node_for(&args(&["GET", "idem:k:a"])), Some(0), "an unknown slot goes to the first node");
        let moved = c.outcome(reply(&format!("-MOVED {slot} 127.0.0.1:7005\r\n")));
        assert!(matches!(moved, Outcome::Redirect { node: 2, asking: false, .. }));
        assert_eq!(c.node_for(&args(&["GET", "idem:k:a"])), Some(2));
        let ask = c.outcome(reply(&format!("-ASK {slot} 127.0.0.1:7001\r\n")));
        assert!(matches!(ask, Outcome::Redirect { node: 1, asking: true, .. }));
        assert_eq!(c.node_for(&args(&["GET", "idem:k:a"])), Some(2), "ASK is for one command");
        // Any other error is the command's reply.
        assert!(matches!(c.outcome(reply("-ERR wrong number of arguments\r\n")), Outcome::Reply(_)));
        assert!(matches!(c.outcome(reply("-MOVED nonsense\r\n")), Outcome::Reply(_)));
    }

    #[test]
    fn an_ipv6_node_redis_names_is_bracketed() {
        assert_eq!(bracketed("::1:7001"), "[::1]:7001");
        assert_eq!(bracketed("[::1]:7001"), "[::1]:7001");
        assert_eq!(bracketed("10.0.0.1:7001"), "10.0.0.1:7001");
        assert!(split_address(&bracketed("fe80::1:7001")).is_some());
    }

    #[test]
    fn a_lost_node_forgets_its_slots_and_is_no_longer_the_default() {
        let mut c = client("127.0.0.1:7000,127.0.0.1:7001");
        let slot = usize::from(hash_slot("idem:k:a"));
        c.outcome(reply(&format!("-MOVED {slot} 127.0.0.1:7000\r\n")));
        let mut failure = None;
        c.lost(0, "connection refused", &mut failure);
        assert_eq!(failure.as_deref(), Some("127.0.0.1:7000: connection refused"));
        assert_eq!(c.node_for(&args(&["GET", "idem:k:a"])), Some(1));
    }

    #[test]
    fn a_password_file_loses_one_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("idem-resp-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let file = dir.join("password");
        let path = file.to_string_lossy().into_owned();
        for (text, expected) in [
            ("s3cret\n", Ok("s3cret")),
            ("s3cret\r\n", Ok("s3cret")),
            ("s3cret", Ok("s3cret")),
            ("s3cret\n\n", Ok("s3cret\n")),
            ("\n", Err("it is empty")),
        ] {
            let _ = std::fs::write(&file, text);
            assert_eq!(read_password_file(&path).as_deref(), expected.map_err(String::from).as_deref(), "{text:?}");
        }
        assert!(
            read_password_file(&dir.join("missing").to_string_lossy()).is_err_and(|e| e.starts_with("cannot read it"))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
