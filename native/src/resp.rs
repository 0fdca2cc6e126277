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
//! wrong password, a pipeline not answered within its commands' timeout (one deadline for the
//! whole pipeline), a reset. The connection is then dropped — a reply it still owed cannot be
//! told from the next one's — and made again for the next pipeline; the first failure of a
//! streak is logged with its cause. A command queued behind a pipeline Redis does not answer
//! waits for that pipeline's deadline first: at most twice its own timeout.
//! Whether a command whose reply was lost ran is unknown, as with a Webdis timeout; the core
//! treats it so (an unanswered claim is released, owner-checked).

use crate::abi;
use crate::calls;
use crate::config::Config;
use crate::host::CallAnswer;
use idem_filter::host::Level;
use idem_filter::policy::{split_address, RedisConfig};
use idem_filter::store::resp::{self, Reply};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    let mut failing = false;
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_PIPELINE {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let (values, failure) = exchange(&target, &mut connection, &batch);
        if let Some(e) = &failure {
            connection = None;
            // Once per failing streak: a wrong password or address reads as "no answer" to the
            // core, and the log says which.
            if !failing {
                abi::log(
                    Level::Warn as u32,
                    &format!(
                        "idem: Redis {} ([redis] direct): {e}; its commands fail until it answers",
                        target.address
                    ),
                );
            }
        } else if failing {
            abi::log(Level::Info as u32, &format!("idem: Redis {} ([redis] direct) answers again", target.address));
        }
        failing = failure.is_some();
        let mut values = values.into_iter();
        for job in batch {
            let answer = match values.next() {
                Some(value) => CallAnswer {
                    headers: vec![(b":status".to_vec(), b"200".to_vec())],
                    body: resp::webdis_json(&command_name(&job.args), &reply_of(value)),
                },
                None => CallAnswer::default(),
            };
            calls::deliver_answer(&job.config, job.slot, job.root, job.token, answer);
        }
    }
}

/// Sends `batch` as one pipeline on the connection (made first if there is none) and reads its
/// replies until the longest of the commands' timeouts has passed: the replies read, in order,
/// and what stopped the reading early (the commands after it get no answer).
fn exchange(
    target: &Target,
    connection: &mut Option<redis::Connection>,
    batch: &[Job],
) -> (Vec<redis::Value>, Option<redis::RedisError>) {
    let timeout = batch.iter().map(|j| j.timeout).max().unwrap_or(Duration::from_millis(500));
    let deadline = Instant::now() + timeout;
    let mut values = Vec::with_capacity(batch.len());
    let failure = (|| {
        if connection.is_none() {
            *connection = Some(connect(target, timeout)?);
        }
        let Some(con) = connection.as_mut() else {
            return Err(redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "no connection")));
        };
        let mut pipeline = redis::pipe();
        for job in batch {
            let mut cmd = redis::Cmd::new();
            for arg in &job.args {
                cmd.arg(arg.as_slice());
            }
            pipeline.add_command(cmd);
        }
        con.set_write_timeout(Some(timeout))?;
        con.send_packed_command(&pipeline.get_packed_pipeline())?;
        // One deadline for the whole pipeline: each read may wait only for what is left of it.
        while values.len() < batch.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(redis::RedisError::from((redis::ErrorKind::IoError, "no reply within the timeout")));
            }
            con.set_read_timeout(Some(left))?;
            values.push(con.recv_response()?);
        }
        Ok(())
    })()
    .err();
    (values, failure)
}

fn connect(target: &Target, timeout: Duration) -> redis::RedisResult<redis::Connection> {
    let Some((host, port)) = split_address(&target.address) else {
        return Err(redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "not host:port")));
    };
    let password = target.password_env.as_ref().and_then(|name| std::env::var(name).ok());
    let info = redis::ConnectionInfo {
        addr: redis::ConnectionAddr::Tcp(host.trim_start_matches('[').trim_end_matches(']').to_string(), port),
        redis: redis::RedisConnectionInfo { username: target.user.clone(), password, ..Default::default() },
    };
    redis::Client::open(info)?.get_connection_with_timeout(timeout)
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
