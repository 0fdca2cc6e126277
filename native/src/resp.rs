//! Redis spoken directly (`[redis] direct`): no Webdis between the module and Redis.
//!
//! One client thread per Redis (address, user, password variable), started on first use, owns
//! one connection (the `redis` crate's, synchronous). Workers queue commands on it and go on; the
//! thread sends every command waiting as one pipeline, reads the replies in order, and hands each
//! to its worker's mailbox as a callout's answer (`calls::deliver`, then the worker is woken as
//! for any call). So a reply reaches the core as Webdis' would ([`idem_filter::store::resp`]),
//! and group commit, fencing and retries are the core's, unchanged.
//!
//! Failures read as a failed callout (no headers: the store's "no answer"): Redis unreachable, a
//! write or read past the commands' timeout, a reset. The connection is then dropped — a reply
//! it still owed cannot be told from the next one's — and made again for the next pipeline.
//! Whether a command whose reply was lost ran is unknown, as with a Webdis timeout; the core
//! treats it so (an unanswered claim is released, owner-checked).

use crate::calls;
use crate::config::Config;
use crate::host::CallAnswer;
use idem_filter::policy::RedisConfig;
use idem_filter::store::resp::{self, Reply};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// The most commands one pipeline carries.
const MAX_PIPELINE: usize = 256;

/// A command for Redis and where its reply goes.
pub struct Job {
    pub args: Vec<Vec<u8>>,
    pub timeout: Duration,
    pub config: Arc<Config>,
    pub slot: usize,
    pub root: u32,
    pub token: u32,
}

/// Which Redis a client thread talks to: the address, the ACL user, the password's variable.
#[derive(Clone, PartialEq, Eq)]
struct Target {
    address: String,
    user: Option<String>,
    password_env: Option<String>,
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
    let target =
        Target { address: address.clone(), user: redis.user.clone(), password_env: redis.password_env.clone() };
    let mut clients = lock(&CLIENTS);
    if let Some((_, sender)) = clients.iter().find(|(t, _)| *t == target) {
        return sender.send(job).map_err(|_| format!("the Redis client thread of {address} has stopped"));
    }
    let (sender, receiver) = channel();
    let thread_target = target.clone();
    std::thread::Builder::new()
        .name("idem-redis".into())
        .spawn(move || run(thread_target, receiver))
        .map_err(|e| format!("cannot start the Redis client thread of {address}: {e}"))?;
    sender.send(job).map_err(|_| format!("the Redis client thread of {address} has stopped"))?;
    clients.push((target, sender));
    Ok(())
}

/// The client thread: a pipeline of what waits, its replies to their workers, for ever.
fn run(target: Target, jobs: Receiver<Job>) {
    let mut connection: Option<redis::Connection> = None;
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_PIPELINE {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        match exchange(&target, &mut connection, &batch) {
            Ok(values) if values.len() == batch.len() => {
                for (job, value) in batch.into_iter().zip(values) {
                    let name = String::from_utf8_lossy(job.args.first().map_or(&[][..], Vec::as_slice)).to_uppercase();
                    let answer = CallAnswer {
                        headers: vec![(b":status".to_vec(), b"200".to_vec())],
                        body: resp::webdis_json(&name, &reply_of(value)),
                    };
                    calls::deliver_answer(&job.config, job.slot, job.root, job.token, answer);
                }
            }
            _ => {
                connection = None;
                for job in batch {
                    calls::deliver_answer(&job.config, job.slot, job.root, job.token, CallAnswer::default());
                }
            }
        }
    }
}

/// Sends `batch` as one pipeline on the connection (made first if there is none) and reads its
/// replies, within the longest of the commands' timeouts.
fn exchange(
    target: &Target,
    connection: &mut Option<redis::Connection>,
    batch: &[Job],
) -> redis::RedisResult<Vec<redis::Value>> {
    let timeout = batch.iter().map(|j| j.timeout).max().unwrap_or(Duration::from_millis(500));
    if connection.is_none() {
        *connection = Some(connect(target, timeout)?);
    }
    let Some(con) = connection.as_mut() else {
        return Err(redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no connection")));
    };
    con.set_read_timeout(Some(timeout))?;
    con.set_write_timeout(Some(timeout))?;
    let mut pipeline = redis::pipe();
    for job in batch {
        let mut cmd = redis::Cmd::new();
        for arg in &job.args {
            cmd.arg(arg.as_slice());
        }
        pipeline.add_command(cmd);
    }
    redis::ConnectionLike::req_packed_commands(con, &pipeline.get_packed_pipeline(), 0, batch.len())
}

fn connect(target: &Target, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let (host, port) = target.address.rsplit_once(':').unwrap_or((target.address.as_str(), "6379"));
    let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
    let port = port.parse().unwrap_or(6379);
    let password = target.password_env.as_ref().and_then(|name| std::env::var(name).ok());
    let info = redis::ConnectionInfo {
        addr: redis::ConnectionAddr::Tcp(host, port),
        redis: redis::RedisConnectionInfo { username: target.user.clone(), password, ..Default::default() },
    };
    redis::Client::open(info)?.get_connection_with_timeout(timeout)
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
