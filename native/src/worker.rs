//! What one Envoy worker thread holds: the core's [`Contexts`] (a root per filter config, a
//! stream per filter), which Envoy filter each stream context is, the callouts out, the actions
//! waiting for the core to return, and this worker's share of the ticker.
//!
//! On Wasm, Envoy gives each worker a VM with root contexts, a timer and a queue; a dynamic
//! module gets none of these, only streams. The same model is rebuilt here, per thread:
//! - **roots**: made on a worker's first stream of a config, with the policy the config carried;
//! - **effective context**: a root acting on a held stream addresses its filter pointer;
//! - **deferred actions**: Envoy runs a local reply (and a resume) synchronously, calling our
//!   response hooks before `send_response` returns — on Wasm they are deferred until the callback
//!   returns. Replies and resumes are queued while the core runs and sent once it has returned,
//!   so a hook never re-enters the core mid-event;
//! - **ticks**: one process thread ([`crate::ticker`]) commits a tick to a scheduler made on one
//!   live stream of each worker (Envoy 1.40 has no per-worker timer for modules; a stream's
//!   scheduler runs its event on that stream's worker). When that stream ends, another live
//!   stream of the worker takes over; a worker with no live stream has its ticks and mail run
//!   by Envoy's main thread, under the worker's lock ([`WorkerThread::idle_work`]);
//! - **wake-ups**: `enqueue` marks the root woken; its queue handler runs on the worker's next
//!   loop iteration (a `ROOTS` event committed to the carrier stream's scheduler), as Envoy runs
//!   a `.wasm` root's queue handler: the writes several streams queue meanwhile go out in one
//!   call (group commit). With no live stream to carry it, it runs once the current event is done.

use crate::abi::{FilterPtr, SchedulerPtr};
use crate::calls::{self, Call};
use crate::config::{Config, Series};
use crate::host::Native;
use crate::{resp, ticker};
use idem_filter::host::{Host, HostError, Level};
use idem_filter::lifecycle::{Contexts, Flow, Stream};
use idem_filter::pairs::Headers;
use idem_filter::policy::RedisConfig;
use idem_filter::response::LocalReply;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// An action on a stream, sent to Envoy after the core's event returned.
pub enum Deferred {
    Reply(FilterPtr, Box<LocalReply>),
    Resume(FilterPtr),
    ResumeResponse(FilterPtr),
}

/// A root context of this worker: its config and timer period.
struct Root {
    config: Arc<Config>,
    id: u32,
    /// It accepted its policy (the main thread checked it; only a store that cannot start fails).
    configured: bool,
    /// `None`: the policy needs no timer, or the root refused its policy.
    tick_ms: Option<u64>,
    last_tick_ms: Cell<u64>,
    /// The root's queue was signalled during the current hook.
    woken: Cell<bool>,
}

#[derive(Default)]
pub struct WorkerThread {
    contexts: RefCell<Contexts>,
    next_id: Cell<u32>,
    roots: RefCell<Vec<Root>>,
    /// Live stream contexts: their Envoy filter and root.
    streams: RefCell<HashMap<u32, (FilterPtr, u32), foldhash::fast::FixedState>>,
    /// The token of the last call sent (the core tells its calls' answers apart by token).
    next_token: Cell<u32>,
    deferred: RefCell<Vec<Deferred>>,
    /// Series by the handle the core was given ([`Host::define_counter`]).
    series: RefCell<Vec<(Arc<Config>, Series)>>,
    /// What each counter series was counted since it was last handed to Envoy (see
    /// [`WorkerThread::add_to_series`]), by handle; `counting` while any is not zero.
    unflushed: RefCell<Vec<u64>>,
    counting: Cell<bool>,
    /// The stream whose scheduler ticks this worker, and that scheduler.
    ticker: RefCell<Option<(u32, SchedulerPtr)>>,
    ticker_slot: Cell<Option<usize>>,
    /// A `ROOTS` event is committed to the carrier's scheduler and has not run yet.
    roots_due: Cell<bool>,
    /// The current event is the roots' turn: woken roots run now.
    roots_turn: Cell<bool>,
}

/// A worker's state behind a lock: taken once per hook by its own thread, and by Envoy's main
/// thread to run the worker's root work while it has no live stream ([`WorkerThread::idle_work`];
/// Envoy 1.40 gives a module no other way to act on a worker with no stream, `ticker.rs`).
pub struct WorkerCell(Mutex<WorkerThread>);

// SAFETY: a `WorkerThread` holds the core's contexts (`Rc`s inside) and Envoy's raw pointers, so
// it is not `Send` by itself. It is reached only through its `WorkerCell`'s lock, so from one
// thread at a time, and every `Rc` of it lives inside it (none is kept in a thread-local or
// outlives the lock). Another thread (Envoy's main thread) takes the lock only to run
// `idle_work`, which acts only when the worker has no live stream — so no stream's filter
// pointer is ever used off its own worker (a stream's scheduler may be committed to from any
// thread, which the ABI allows).
unsafe impl Send for WorkerThread {}

thread_local! {
    static OWN: Arc<WorkerCell> = Arc::new(WorkerCell(Mutex::new(WorkerThread::default())));
    /// The state whose lock this thread holds now (set by [`WorkerCell::run`]): nested calls
    /// (the core calling the host inside a hook) reach it without locking again.
    static CURRENT: Cell<*const WorkerThread> = const { Cell::new(std::ptr::null()) };
}

/// Runs `f` on this thread's worker state (or the state this thread is running for now).
pub fn with<T>(f: impl FnOnce(&WorkerThread) -> T) -> T {
    let current = CURRENT.with(Cell::get);
    if !current.is_null() {
        // SAFETY: `WorkerCell::run` set it on this thread and holds its lock until it clears it.
        return f(unsafe { &*current });
    }
    OWN.with(|cell| cell.run(f))
}

impl WorkerCell {
    /// Runs `f` with the lock held (a worker's hook, or the main thread's idle work).
    pub fn run<T>(&self, f: impl FnOnce(&WorkerThread) -> T) -> T {
        /// Puts [`CURRENT`] back before the lock is released, also when `f` unwinds.
        struct Restore(*const WorkerThread);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let guard = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let _restore = Restore(CURRENT.with(|c| c.replace(&*guard as *const WorkerThread)));
        f(&guard)
    }
}

impl WorkerThread {
    fn next_context(&self) -> u32 {
        let id = self.next_id.get().wrapping_add(1).max(1);
        self.next_id.set(id);
        id
    }

    /// Runs one event on the core's contexts with `host`, then what it deferred. If the contexts
    /// are busy (a hook re-entered while the core runs: never expected, since replies and resumes
    /// are deferred), the event is skipped with `default`, logged.
    pub fn enter<T>(&self, host: &Native, default: T, event: impl FnOnce(&mut Contexts, &Native) -> T) -> T {
        let out = match self.contexts.try_borrow_mut() {
            Ok(mut contexts) => event(&mut contexts, host),
            Err(_) => {
                host.log(Level::Critical, "idem: a hook arrived while another was running; it continues untouched");
                return default;
            }
        };
        self.after_event();
        out
    }

    /// What the event left for after it: roots to wake, then replies and resumes (which may
    /// run our own hooks again, each with its own event).
    fn after_event(&self) {
        loop {
            if !self.roots_wait_their_turn() {
                let woken: Vec<(u32, Arc<Config>)> = self
                    .roots
                    .borrow()
                    .iter()
                    .filter(|r| r.woken.replace(false))
                    .map(|r| (r.id, Arc::clone(&r.config)))
                    .collect();
                for (root, config) in woken {
                    let root_host = Native::new(config, None);
                    if let Ok(contexts) = self.contexts.try_borrow() {
                        contexts.on_queue_ready(&root_host, root);
                    }
                }
            }
            let actions = std::mem::take(&mut *self.deferred.borrow_mut());
            if actions.is_empty() {
                return;
            }
            for action in actions {
                match action {
                    Deferred::Reply(filter, reply) => send_reply(filter, &reply),
                    Deferred::Resume(filter) => filter.continue_decoding(),
                    Deferred::ResumeResponse(filter) => filter.continue_encoding(),
                }
            }
        }
    }

    /// Whether woken roots wait for their turn, the next loop iteration: a `ROOTS` event is
    /// committed to the carrier's scheduler (once), so the writes that the streams of this
    /// iteration queue go out together. Not from the roots' own turn, nor without a live stream.
    fn roots_wait_their_turn(&self) -> bool {
        if self.roots_turn.get() || !self.roots.borrow().iter().any(|r| r.woken.get()) {
            return false;
        }
        let Some((_, scheduler)) = *self.ticker.borrow() else {
            return false;
        };
        if !self.roots_due.replace(true) {
            scheduler.commit(ticker::ROOTS);
        }
        true
    }

    /// The roots' turn (`ROOTS`): every root woken since runs its queue, then what it deferred.
    pub fn run_roots(&self) {
        self.roots_due.set(false);
        let outer = self.roots_turn.replace(true);
        self.after_event();
        self.roots_turn.set(outer);
    }

    pub fn defer(&self, action: Deferred) {
        self.deferred.borrow_mut().push(action);
    }

    // ---- roots and streams

    /// This worker's root for `config`, made and configured on first use (`None` if it refused
    /// its policy, which the main thread already checked, so only on a store that cannot start).
    fn root_for(&self, config: &Arc<Config>) -> Option<u32> {
        if let Some(r) = self.roots.borrow().iter().find(|r| Arc::ptr_eq(&r.config, config)) {
            return r.configured.then_some(r.id);
        }
        let id = self.next_context();
        let host = Native::new(Arc::clone(config), None);
        let setup = crate::host::Setup { host: &host, root: id, tick_ms: Cell::new(None) };
        let ok = {
            let mut contexts = self.contexts.borrow_mut();
            contexts.create(id, 0);
            contexts.configure(&setup, &host, id, &config.policy)
        };
        let tick_ms = setup.tick_ms.get().filter(|_| ok);
        let now = host.now_ms();
        self.roots.borrow_mut().push(Root {
            config: Arc::clone(config),
            id,
            configured: ok,
            tick_ms,
            last_tick_ms: Cell::new(now),
            woken: Cell::new(false),
        });
        let slot = self.ticker_slot.get().unwrap_or_else(|| ticker::new_slot(OWN.with(Arc::clone)));
        self.ticker_slot.set(Some(slot));
        if let Some(ms) = tick_ms {
            ticker::set_period(slot, ms);
        }
        ok.then_some(id)
    }

    /// A new stream of `config` on this worker: its context id (0 when it is not ours: its root
    /// refused the policy, and every hook lets it through).
    pub fn new_stream(&self, config: &Arc<Config>, filter: FilterPtr) -> u32 {
        let Some(root) = self.root_for(config) else {
            return 0;
        };
        let id = self.next_context();
        self.contexts.borrow_mut().create(id, root);
        self.streams.borrow_mut().insert(id, (filter, root));
        id
    }

    /// The filter of a live stream context.
    pub fn filter_of(&self, context: u32) -> Option<FilterPtr> {
        self.streams.borrow().get(&context).map(|(f, _)| *f)
    }

    /// A stream's first hook: if none of this worker's streams carries its ticks and wake-ups,
    /// this one does.
    pub fn carry_ticks(&self, context: u32, filter: FilterPtr) {
        let Some(slot) = self.ticker_slot.get() else {
            return;
        };
        if self.ticker.borrow().is_some() {
            return;
        }
        if let Some(scheduler) = filter.scheduler() {
            *self.ticker.borrow_mut() = Some((context, scheduler));
            ticker::attach(slot, scheduler);
            // Answers that came while the worker had no stream to wake go now.
            if calls::waiting(slot) {
                scheduler.commit(ticker::WAKE);
            }
        }
    }

    /// Envoy destroyed a stream's filter: the context goes, and if it carried the ticks another
    /// live stream takes them over.
    pub fn end_stream(&self, context: u32) {
        self.streams.borrow_mut().remove(&context);
        if self.streams.borrow().is_empty() {
            self.flush_counts();
        }
        if let Ok(mut contexts) = self.contexts.try_borrow_mut() {
            contexts.delete(context);
        }
        let carried = matches!(*self.ticker.borrow(), Some((c, _)) if c == context);
        if carried {
            if let (Some(slot), Some((_, scheduler))) = (self.ticker_slot.get(), self.ticker.borrow_mut().take()) {
                ticker::detach(slot, scheduler);
            }
            // The roots' turn committed to that scheduler is lost with it.
            let roots_due = self.roots_due.replace(false);
            let next = self.streams.borrow().iter().next().map(|(c, (f, _))| (*c, *f));
            match (next, self.ticker_slot.get()) {
                (Some((c, f)), _) => self.carry_ticks(c, f),
                // The last stream: a wake-up committed to its scheduler just now is lost with it,
                // so mail already waiting goes to the main thread (`ticker.rs`).
                (None, Some(slot)) if calls::waiting(slot) => ticker::wake(slot),
                (None, _) => {}
            }
            if roots_due {
                // On the next carrier's scheduler, or now when no stream is left to carry it.
                self.after_event();
            }
        }
    }

    /// A tick from the ticker: each root whose period has passed runs its timer, with a host of
    /// its own config; the counts held go to Envoy.
    pub fn tick(&self) {
        let now = crate::host::wall_ms();
        let due: Vec<(u32, Arc<Config>)> = self
            .roots
            .borrow()
            .iter()
            .filter(|r| r.config.is_alive())
            .filter(|r| r.tick_ms.is_some_and(|ms| now.saturating_sub(r.last_tick_ms.get()) + 2 >= ms))
            .map(|r| {
                r.last_tick_ms.set(now);
                (r.id, Arc::clone(&r.config))
            })
            .collect();
        for (root, config) in due {
            let root_host = Native::new(config, None);
            self.enter(&root_host, (), |c, h| c.on_tick(h, root));
        }
        self.flush_counts();
    }

    /// Envoy's main thread runs this worker's root work — answers in its mailbox, roots whose
    /// tick is due — because the worker has no live stream whose scheduler could (`ticker.rs`).
    /// A worker that has one again is left to it: its streams' filters are used on their own
    /// worker only.
    pub fn idle_work(&self) {
        if !self.streams.borrow().is_empty() {
            // A stream came meanwhile: its scheduler (any thread may commit to it) carries the
            // mail; a stream not yet started carries it from its first hook (`carry_ticks`).
            if let Some((_, scheduler)) = *self.ticker.borrow() {
                scheduler.commit(ticker::TICK);
            }
            return;
        }
        self.take_answers();
        self.tick();
    }

    /// Marks a root's queue signalled (by its queue id, which is its context id here).
    pub fn wake(&self, queue: u32) {
        if let Some(r) = self.roots.borrow().iter().find(|r| r.id == queue) {
            r.woken.set(true);
        }
    }

    // ---- calls

    /// Queues an HTTP call for the main thread (`calls.rs`): the token the core will know its
    /// answer by.
    pub fn send_call(
        &self,
        config: &Arc<Config>,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        let (root, slot, token) = self.next_call(config)?;
        let call = Call {
            slot,
            root,
            token,
            cluster: cluster.to_string(),
            headers: Headers::from_pairs(headers),
            body: body.to_vec(),
            timeout_ms: timeout_ms.max(1),
        };
        if config.calls.queue(call) {
            Ok(token)
        } else {
            Err(HostError::Failed(format!("call to cluster {cluster}: the filter config is being destroyed")))
        }
    }

    /// Queues a Redis command for `[redis] direct`'s client thread (`resp.rs`): the token the core
    /// will know its answer by.
    pub fn send_redis(
        &self,
        config: &Arc<Config>,
        redis: &RedisConfig,
        command: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, HostError> {
        let args = idem_filter::store::resp::args(command).map_err(HostError::Failed)?;
        let (root, slot, token) = self.next_call(config)?;
        let timeout = std::time::Duration::from_millis(timeout_ms.max(1));
        let job = resp::Job { args, timeout, config: Arc::clone(config), slot, root, token };
        resp::send(redis, job).map_err(HostError::Failed)?;
        Ok(token)
    }

    /// The root of `config` on this worker, the worker's ticker slot (its mailbox) and a new
    /// token, for a call going out.
    fn next_call(&self, config: &Arc<Config>) -> Result<(u32, usize, u32), HostError> {
        let root = self.roots.borrow().iter().find(|r| Arc::ptr_eq(&r.config, config)).map(|r| r.id);
        let (Some(root), Some(slot)) = (root, self.ticker_slot.get()) else {
            return Err(HostError::Failed("a call from a worker with no root for its config".into()));
        };
        let token = self.next_token.get().wrapping_add(1).max(1);
        self.next_token.set(token);
        Ok((root, slot, token))
    }

    /// Hands the answers waiting in this worker's mailbox to the core, each delivered where its
    /// root is (the core routes it on to the stream that owns it).
    pub fn take_answers(&self) {
        let Some(slot) = self.ticker_slot.get() else {
            return;
        };
        for d in calls::take(slot) {
            let (num_headers, body_size) = (d.answer.headers.iter().count(), d.answer.body.len());
            let host = Native::new(d.config, None);
            host.deliver(d.answer);
            let (root, token) = (d.root, d.token);
            self.enter(&host, (), |c, h| c.on_call_response(h, root, token, num_headers, body_size));
        }
    }

    // ---- metrics

    /// A handle for a core metric name (defined on this worker's first use).
    pub fn series_handle(&self, config: &Arc<Config>, name: &str) -> Option<u32> {
        let series = config.series(name)?;
        let mut all = self.series.borrow_mut();
        if let Some(at) = all.iter().position(|(c, s)| Arc::ptr_eq(c, config) && *s == series) {
            return u32::try_from(at).ok();
        }
        // A counter exists in Envoy once added to: at zero, as the core defines it. A histogram
        // is not touched: recording a 0 would be an observation (its `_count` one too high, a
        // zero in its lowest bucket), so it appears with its first real value.
        if !series.histogram {
            config.add(&series, 0);
        }
        all.push((Arc::clone(config), series));
        u32::try_from(all.len() - 1).ok()
    }

    /// A counter is counted here and handed to Envoy in batches ([`WorkerThread::flush_counts`]):
    /// Envoy 1.40 looks a labelled series up at every `config_increment_counter` (its tags
    /// built, the symbol table locked: about 4.8k instructions, two per fresh key). Counts reach
    /// Envoy when the worker's last live stream ends, or within [`ticker::FLUSH_AFTER`] of the
    /// first one held while streams stay open. A histogram value goes at once (values do not add up).
    pub fn add_to_series(&self, handle: u32, value: u64) {
        let series = self.series.borrow();
        let Some((config, series)) = series.get(handle as usize) else {
            return;
        };
        if series.histogram {
            config.add(series, value);
            return;
        }
        let mut unflushed = self.unflushed.borrow_mut();
        if unflushed.len() <= handle as usize {
            unflushed.resize(handle as usize + 1, 0);
        }
        unflushed[handle as usize] += value;
        if !self.counting.replace(true) {
            if let Some(slot) = self.ticker_slot.get() {
                ticker::flush_soon(slot);
            }
        }
    }

    /// Hands the counts held on this worker to Envoy, one increment per series.
    pub fn flush_counts(&self) {
        if !self.counting.replace(false) {
            return;
        }
        let series = self.series.borrow();
        for (handle, n) in self.unflushed.borrow_mut().iter_mut().enumerate() {
            if let (Some((config, series)), true) = (series.get(handle), *n > 0) {
                config.add(series, std::mem::take(n));
            }
        }
    }
}

/// A stream's event on this worker, `Continue` for a stream that is not ours.
pub fn on_stream(host: &Native, context: u32, event: impl FnOnce(&mut Stream, &Native) -> Flow) -> Flow {
    with(|w| w.enter(host, Flow::Continue, |c, h| c.on_stream(context, |s| event(s, h))))
}

/// Sends a local reply: the core's headers as bytes; a gRPC trailers-only answer carries its
/// `grpc-status` (and the message) in the headers, since the ABI's `send_response` has no
/// gRPC status of its own; an answer with trailers is sent in its three parts.
fn send_reply(filter: FilterPtr, reply: &LocalReply) {
    let mut headers: Vec<(&[u8], &[u8])> = reply.headers.iter().map(|(n, v)| (n.as_bytes(), v.as_slice())).collect();
    if !reply.trailers.is_empty() {
        // A replayed gRPC answer from the echo instance: headers, message, then its trailers.
        let status = reply.status.to_string();
        headers.insert(0, (b":status", status.as_bytes()));
        let trailers: Vec<(&[u8], &[u8])> = reply.trailers.iter().map(|(n, v)| (n.as_bytes(), v.as_slice())).collect();
        filter.send_with_trailers(&headers, &reply.body, &trailers);
        return;
    }
    let status_text;
    if let Some(code) = reply.grpc_status {
        status_text = code.to_string();
        headers.push((b"grpc-status", status_text.as_bytes()));
    }
    filter.send_response(reply.status, &headers, &reply.body, "idem");
}
