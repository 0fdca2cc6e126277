//! The worker's counters and histograms: `idem_requests_total` per route and outcome (defined on
//! first use, or at start for `[metrics] zero_series`), `idem_unmatched_total`, and the wait and
//! Redis-call histograms of the routes that have them.

use crate::engine::outcome::{counter_name, store_call_histogram_name, unmatched_counter_name, wait_histogram_name};
use crate::engine::Outcome;
use crate::host::{Host, Setup};
use crate::policy::RouteId;
use crate::policy::{Bundle, Mode, OnInFlight, StoreKind, ZeroSeries};
use std::cell::RefCell;

/// The counter of callout replies that reached no owner (always 0 unless something is wrong).
pub const STRAY_REPLIES_COUNTER: &str = "idem_stray_replies_total";

pub(super) struct Metrics {
    /// `counters[route][outcome.index()]`: defined at start for `[metrics] zero_series`, the
    /// others on their first count.
    counters: RefCell<Vec<Vec<Option<u32>>>>,
    /// `idem_unmatched_total{outcome="passed"}` and `{outcome="rejected"}`.
    unmatched: [Option<u32>; 2],
    /// `idem_stray_replies_total`: callout replies no waiting call owned (defined on first use).
    stray_replies: std::cell::Cell<Option<u32>>,
    /// Per route: how long held duplicates waited, and how long Redis calls took.
    wait_histograms: Vec<Option<u32>>,
    store_call_histograms: Vec<Option<u32>>,
}

impl Metrics {
    /// Defines what must exist from the start (when the plugin configures).
    pub(super) fn define(setup: &dyn Setup, bundle: &Bundle) -> Metrics {
        let counters = bundle
            .routes
            .iter()
            .map(|r| {
                let predefined: &[Outcome] = match bundle.metrics.zero_series {
                    ZeroSeries::All => &Outcome::ALL,
                    ZeroSeries::Alerted => Outcome::alerted(r.mode == Mode::Token),
                    ZeroSeries::None => &[],
                };
                Outcome::ALL
                    .iter()
                    .map(|o| predefined.contains(o).then(|| setup.define_counter(&counter_name(&r.name, *o))).flatten())
                    .collect()
            })
            .collect();
        let histograms = |wanted: &dyn Fn(&crate::policy::RoutePolicy) -> bool, name: fn(&str) -> String| {
            bundle.routes.iter().map(|r| wanted(r).then(|| setup.define_histogram(&name(&r.name))).flatten()).collect()
        };
        Metrics {
            counters: RefCell::new(counters),
            unmatched: [
                setup.define_counter(&unmatched_counter_name(false)),
                setup.define_counter(&unmatched_counter_name(true)),
            ],
            stray_replies: std::cell::Cell::new(None),
            wait_histograms: histograms(&|r| r.key.on_in_flight == OnInFlight::Wait, wait_histogram_name),
            store_call_histograms: histograms(&|r| r.store == StoreKind::Redis, store_call_histogram_name),
        }
    }

    /// Counts `outcome` on route `route` (named `name`), defining its counter the first time.
    pub(super) fn count(&self, host: &dyn Host, route: RouteId, name: &str, outcome: Outcome) {
        let mut counters = self.counters.borrow_mut();
        let Some(slot) = counters.get_mut(route.index()).and_then(|c| c.get_mut(outcome.index())) else {
            return;
        };
        if slot.is_none() {
            *slot = host.define_counter(&counter_name(name, outcome));
        }
        if let Some(id) = *slot {
            host.count(id);
        }
    }

    /// A Redis call of this route, sent at `since_ms`, was answered.
    pub(super) fn store_call_took(&self, host: &dyn Host, route: RouteId, since_ms: u64, now: u64) {
        if let Some(Some(id)) = self.store_call_histograms.get(route.index()) {
            host.record(*id, now.saturating_sub(since_ms));
        }
    }

    /// A held duplicate of this route was resolved after waiting since `since_ms`.
    pub(super) fn record_wait(&self, host: &dyn Host, route: RouteId, since_ms: u64) {
        if let Some(Some(id)) = self.wait_histograms.get(route.index()) {
            host.record(*id, host.now_ms().saturating_sub(since_ms));
        }
    }

    /// A callout reply reached no owner (see `Worker::stray_reply`).
    pub(super) fn count_stray_reply(&self, host: &dyn Host) {
        if self.stray_replies.get().is_none() {
            self.stray_replies.set(host.define_counter(STRAY_REPLIES_COUNTER));
        }
        if let Some(id) = self.stray_replies.get() {
            host.count(id);
        }
    }

    pub(super) fn count_unmatched(&self, host: &dyn Host, rejected: bool) {
        if let Some(id) = self.unmatched[usize::from(rejected)] {
            host.count(id);
        }
    }
}
