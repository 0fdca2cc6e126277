//! Every HTTP call the core sends (Webdis commands, reconcile lookups), kept where a call can
//! outlive the request that sent it — as Envoy 1.40 keeps a `.wasm`'s calls on the root context
//! and still answers them after the stream ended.
//!
//! A dynamic module in 1.40 has no worker-level callout: a stream's callout is cancelled when the
//! stream ends, and a filter config's callout runs on the main thread. So a call goes:
//! 1. worker: queued on its config with the token the core knows it by, and the config's
//!    main-thread scheduler committed (`config_scheduler_commit`, any thread);
//! 2. main thread (`on_http_filter_config_scheduled`): sent as the config's callout;
//! 3. main thread (`on_http_filter_config_http_callout_done`): the answer copied into the worker's
//!    mailbox, and the worker woken through the scheduler of one of its live streams
//!    (`ticker::wake`);
//! 4. worker (`on_http_filter_scheduled`), or the main thread for a worker with no live stream
//!    (`ticker::run_idle`, under the worker's lock): the answer handed to the core's `Contexts`,
//!    which routes it by token to the root or the stream that owns it, as on Wasm.
//!
//! The two thread hops cost a few microseconds against a Webdis round trip. `[redis] direct`
//! commands skip steps 1–3: their client thread (`resp.rs`) delivers into the same mailbox.

use crate::abi::{self, ConfigPtr, ConfigScheduler, EnvoyBuffer, EnvoyHeader};
use crate::config::Config;
use crate::host::CallAnswer;
use crate::ticker;
use idem_filter::pairs::Headers;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The config scheduler's events: calls are queued; a worker with no live stream has root work
/// (`ticker.rs`).
pub const SEND: u64 = 1;
pub const IDLE: u64 = 2;

/// Every live config's main-thread scheduler, oldest first: the first one carries [`IDLE`]
/// (the main thread runs idle workers' root work whatever config it arrives on).
static SCHEDULERS: Mutex<Vec<ConfigScheduler>> = Mutex::new(Vec::new());

/// Asks the main thread to run idle workers' root work (`ticker::run_idle`). With no live
/// config there is no scheduler, and no root either that could have work.
pub fn run_idle_on_main() {
    if let Some(first) = lock(&SCHEDULERS).first() {
        first.commit(IDLE);
    }
}

/// A call a worker asked for, until the main thread sends it.
pub struct Call {
    pub slot: usize,
    pub root: u32,
    pub token: u32,
    pub cluster: String,
    /// Serialized: one buffer, where a copy of each name and value took two allocations.
    pub headers: Headers,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// Where an answer goes back to: the worker's mailbox, its root, the core's token.
#[derive(Clone, Copy)]
struct ReturnTo {
    slot: usize,
    root: u32,
    token: u32,
}

/// An answer waiting for its worker.
pub struct Delivery {
    pub config: Arc<Config>,
    pub root: u32,
    pub token: u32,
    pub answer: CallAnswer,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One config's calls: queued by workers, sent and answered on the main thread.
#[derive(Default)]
pub struct Calls {
    scheduler: Mutex<Option<ConfigScheduler>>,
    queued: Mutex<Vec<Call>>,
    /// Calls out, by Envoy's callout id (main thread only; a mutex because `Config` is shared).
    out: Mutex<HashMap<u64, ReturnTo>>,
}

impl Calls {
    /// Makes the main-thread scheduler (at config creation, on the main thread).
    pub fn start(&self, config: ConfigPtr) {
        let scheduler = config.scheduler();
        *lock(&self.scheduler) = scheduler;
        if let Some(s) = scheduler {
            lock(&SCHEDULERS).push(s);
        }
    }

    /// Deletes the scheduler (config destroy, main thread): no call is queued after it, and no
    /// idle work is asked of it.
    pub fn stop(&self) {
        if let Some(s) = lock(&self.scheduler).take() {
            let mut all = lock(&SCHEDULERS);
            all.retain(|other| *other != s);
            s.delete();
        }
    }

    /// A worker queues a call; false when the config has no scheduler (it is being destroyed).
    pub fn queue(&self, call: Call) -> bool {
        // Held while committing: `stop` deletes the scheduler under the same lock.
        let scheduler = lock(&self.scheduler);
        let Some(s) = *scheduler else {
            return false;
        };
        lock(&self.queued).push(call);
        s.commit(SEND);
        true
    }

    /// Main thread: sends what workers queued. A call Envoy refuses is answered at once as failed.
    pub fn send_queued(&self, config: &Arc<Config>) {
        let calls = std::mem::take(&mut *lock(&self.queued));
        for call in calls {
            let back = ReturnTo { slot: call.slot, root: call.root, token: call.token };
            match config.envoy.callout(&call.cluster, call.headers.iter(), &call.body, call.timeout_ms) {
                Ok(id) => {
                    lock(&self.out).insert(id, back);
                }
                Err(code) => {
                    abi::log(
                        3,
                        &format!("idem: callout to cluster {} refused by Envoy (init result {code})", call.cluster),
                    );
                    deliver(config, back, CallAnswer::default());
                }
            }
        }
    }

    /// Main thread: a call was answered (no headers when it failed); its answer goes to its worker.
    ///
    /// # Safety
    /// `headers` and `chunks` are Envoy's arrays for this hook (null when empty).
    pub unsafe fn answered(
        &self,
        config: &Arc<Config>,
        id: u64,
        success: bool,
        headers: (*const EnvoyHeader, usize),
        chunks: (*const EnvoyBuffer, usize),
    ) {
        let Some(back) = lock(&self.out).remove(&id) else {
            return;
        };
        let mut answer = CallAnswer::default();
        if success {
            // SAFETY: as the caller promised.
            answer.headers = unsafe { abi::read_headers(headers.0, headers.1, |pairs| Headers::from_pairs(pairs)) };
            // SAFETY: as the caller promised.
            unsafe { abi::copy_chunks(chunks.0, chunks.1, &mut answer.body, usize::MAX) };
        }
        deliver(config, back, answer);
    }
}

/// Each worker's answers waiting to be taken, by ticker slot.
static MAILBOXES: Mutex<Vec<Vec<Delivery>>> = Mutex::new(Vec::new());
/// How many answers wait in all mailboxes: every hook looks, and the shared lock is taken only
/// when one does.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// An answer for the core's call `token` of `root` on the worker of ticker `slot`, from a
/// transport other than Envoy's callouts (`resp.rs`).
pub fn deliver_answer(config: &Arc<Config>, slot: usize, root: u32, token: u32, answer: CallAnswer) {
    deliver(config, ReturnTo { slot, root, token }, answer);
}

fn deliver(config: &Arc<Config>, back: ReturnTo, answer: CallAnswer) {
    {
        let mut boxes = lock(&MAILBOXES);
        if boxes.len() <= back.slot {
            boxes.resize_with(back.slot + 1, Vec::new);
        }
        boxes[back.slot].push(Delivery { config: Arc::clone(config), root: back.root, token: back.token, answer });
        WAITING.fetch_add(1, Ordering::Release);
    }
    ticker::wake(back.slot);
}

/// Whether answers wait in a worker's mailbox.
pub fn waiting(slot: usize) -> bool {
    WAITING.load(Ordering::Acquire) > 0 && lock(&MAILBOXES).get(slot).is_some_and(|b| !b.is_empty())
}

/// A worker takes its answers.
pub fn take(slot: usize) -> Vec<Delivery> {
    if WAITING.load(Ordering::Acquire) == 0 {
        return Vec::new();
    }
    let taken: Vec<Delivery> = lock(&MAILBOXES).get_mut(slot).map(std::mem::take).unwrap_or_default();
    WAITING.fetch_sub(taken.len(), Ordering::AcqRel);
    taken
}
