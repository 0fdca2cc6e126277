//! The process' ticker: one thread that commits a tick, at each worker's period, to the scheduler
//! of one live stream of that worker (Envoy then runs `on_http_filter_scheduled` on the worker's
//! own thread). It stands in for proxy-wasm's per-worker `set_tick_period`, which dynamic modules
//! lack in Envoy 1.40.
//!
//! A slot per worker thread holds its period (if its roots want ticks) and, while the worker has
//! a live stream, that stream's scheduler — also what wakes the worker when a call's answer is in
//! its mailbox (`calls.rs`). The lock is held while committing and while a worker
//! detaches (and deletes) a scheduler, so no commit reaches a deleted one.
//!
//! A worker with no live stream has no scheduler to be reached through (1.40 has no worker-level
//! one, and a stream's scheduler ends with its stream). Its tick or its mail is then marked due
//! on its slot and Envoy's main thread is asked to run it (`calls::run_idle_on_main`): the main
//! thread takes the worker's state lock and runs its root work ([`WorkerThread::idle_work`]) —
//! a write Redis refused is retried, the claim of a client that left is released — exactly as
//! a tick on the worker would, with no stream of the worker to touch.
//!
//! [`WorkerThread::idle_work`]: crate::worker::WorkerThread::idle_work

use crate::abi::SchedulerPtr;
use crate::calls;
use crate::worker::WorkerCell;
use std::sync::Arc;
use std::sync::{Mutex, MutexGuard, Once, OnceLock};
use std::time::{Duration, Instant};

/// The event id of a tick (`on_http_filter_scheduled`).
pub const TICK: u64 = 1;
/// The event id of a wake-up: answers wait in the worker's mailbox (`calls.rs`).
pub const WAKE: u64 = 2;
/// The event id of a flush: counts held on the worker go to Envoy (`WorkerThread::flush_counts`).
pub const FLUSH: u64 = 3;
/// The event id of the roots' turn: roots woken since it was committed run their queue
/// (`WorkerThread::run_roots`), committed by the worker itself.
pub const ROOTS: u64 = 4;

/// The longest a count waits on its worker while streams stay open (a held duplicate, a slow
/// upload); a worker whose last stream ends hands its counts over at once.
pub const FLUSH_AFTER: Duration = Duration::from_millis(20);

struct Slot {
    period: Option<Duration>,
    scheduler: Option<SchedulerPtr>,
    next: Option<Instant>,
    /// The worker's state, for the main thread to run its root work while it has no stream.
    worker: Arc<WorkerCell>,
    /// Root work waits for the main thread: a tick or mail came while the worker had no stream.
    idle_due: bool,
    /// Counts held on the worker are to be handed to Envoy then.
    flush_at: Option<Instant>,
}

static SLOTS: Mutex<Vec<Slot>> = Mutex::new(Vec::new());
static START: Once = Once::new();
/// The ticker thread, unparked when a flush is asked for sooner than it would wake.
static THREAD: OnceLock<std::thread::Thread> = OnceLock::new();

/// The finest period the thread sleeps for when no worker needs sooner.
const IDLE: Duration = Duration::from_millis(50);

fn slots() -> MutexGuard<'static, Vec<Slot>> {
    SLOTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A slot for a new worker thread; starts the ticker thread the first time.
pub fn new_slot(worker: Arc<WorkerCell>) -> usize {
    START.call_once(|| {
        if let Ok(handle) = std::thread::Builder::new().name("idem-ticker".into()).spawn(run) {
            let _ = THREAD.set(handle.thread().clone());
        }
    });
    let mut all = slots();
    all.push(Slot { period: None, scheduler: None, next: None, worker, idle_due: false, flush_at: None });
    all.len() - 1
}

/// A worker's period: the shortest its roots asked for.
pub fn set_period(slot: usize, period_ms: u64) {
    if let Some(s) = slots().get_mut(slot) {
        let period = Duration::from_millis(period_ms.max(1));
        s.period = Some(s.period.map_or(period, |p| p.min(period)));
    }
}

/// A live stream of the worker carries its ticks from now on.
pub fn attach(slot: usize, scheduler: SchedulerPtr) {
    if let Some(s) = slots().get_mut(slot) {
        s.scheduler = Some(scheduler);
    }
}

/// The stream carrying the worker's ticks ends: its scheduler is deleted under the lock.
pub fn detach(slot: usize, scheduler: SchedulerPtr) {
    let mut all = slots();
    if let Some(s) = all.get_mut(slot) {
        if s.scheduler == Some(scheduler) {
            s.scheduler = None;
        }
    }
    scheduler.delete();
}

/// The worker holds counts: they are flushed within [`FLUSH_AFTER`] unless it does so first.
pub fn flush_soon(slot: usize) {
    if let Some(s) = slots().get_mut(slot) {
        if s.flush_at.is_none() {
            s.flush_at = Some(Instant::now() + FLUSH_AFTER);
            if let Some(thread) = THREAD.get() {
                thread.unpark();
            }
        }
    }
}

/// Wakes a worker now, through its live stream's scheduler; a worker with none has its mail
/// taken by the main thread.
pub fn wake(slot: usize) {
    let mut all = slots();
    let Some(s) = all.get_mut(slot) else {
        return;
    };
    match s.scheduler {
        Some(scheduler) => scheduler.commit(WAKE),
        None => {
            s.idle_due = true;
            calls::run_idle_on_main();
        }
    }
}

/// Main thread: runs the root work of each worker marked due, under its state's lock (a
/// worker that has a live stream again is left to it, `idle_work`).
pub fn run_idle() {
    let due: Vec<Arc<WorkerCell>> =
        slots().iter_mut().filter_map(|s| std::mem::take(&mut s.idle_due).then(|| Arc::clone(&s.worker))).collect();
    for worker in due {
        worker.run(|w| w.idle_work());
    }
}

fn run() {
    loop {
        let now = Instant::now();
        let mut sleep = IDLE;
        let mut idle = false;
        {
            let mut all = slots();
            for s in all.iter_mut() {
                match s.flush_at {
                    Some(at) if at <= now => {
                        s.flush_at = None;
                        match s.scheduler {
                            Some(scheduler) => scheduler.commit(FLUSH),
                            None => {
                                s.idle_due = true;
                                idle = true;
                            }
                        }
                    }
                    Some(at) => sleep = sleep.min(at - now),
                    None => {}
                }
                let Some(period) = s.period else {
                    continue;
                };
                let next = *s.next.get_or_insert(now + period);
                if next <= now {
                    match s.scheduler {
                        Some(scheduler) => scheduler.commit(TICK),
                        None => {
                            s.idle_due = true;
                            idle = true;
                        }
                    }
                    s.next = Some(now + period);
                    sleep = sleep.min(period);
                } else {
                    sleep = sleep.min(next - now);
                }
            }
        }
        if idle {
            calls::run_idle_on_main();
        }
        std::thread::park_timeout(sleep);
    }
}
