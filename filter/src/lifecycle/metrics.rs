//! The worker's counters and histograms: `idem_requests_total` per route and outcome (defined on
//! first use, or at start for `[metrics] zero_series`), `idem_unmatched_total` and
//! `idem_stray_replies_total` (at start), and the wait and Redis-call histograms of the routes
//! that have them (defined on their first value). Both builds export the same series: natively
//! Envoy 1.40 makes a labelled histogram series only by recording into it, and a family without
//! labels exists from its definition.

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
    /// `idem_stray_replies_total`: callout replies no waiting call owned (at 0 from the start, so
    /// `increase()` sees the first).
    stray_replies: Option<u32>,
    /// Per route: how long held duplicates waited, and how long Redis calls took.
    wait_histograms: RouteHistograms,
    store_call_histograms: RouteHistograms,
}

/// One histogram per route that has it, defined on its first value.
struct RouteHistograms {
    /// Per route: the histogram's name, for a route that has one.
    names: Vec<Option<String>>,
    /// Per route: the histogram, once defined.
    ids: RefCell<Vec<Option<u32>>>,
}

impl RouteHistograms {
    fn new(bundle: &Bundle, wanted: impl Fn(&crate::policy::RoutePolicy) -> bool, name: fn(&str) -> String) -> Self {
        let names: Vec<Option<String>> = bundle.routes.iter().map(|r| wanted(r).then(|| name(&r.name))).collect();
        RouteHistograms { ids: RefCell::new(vec![None; names.len()]), names }
    }

    fn record(&self, host: &dyn Host, route: RouteId, value: u64) {
        let Some(Some(name)) = self.names.get(route.index()) else {
            return;
        };
        let mut ids = self.ids.borrow_mut();
        let Some(slot) = ids.get_mut(route.index()) else {
            return;
        };
        if slot.is_none() {
            *slot = host.define_histogram(name);
        }
        if let Some(id) = *slot {
            host.record(id, value);
        }
    }
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
        Metrics {
            counters: RefCell::new(counters),
            unmatched: [
                setup.define_counter(&unmatched_counter_name(false)),
                setup.define_counter(&unmatched_counter_name(true)),
            ],
            stray_replies: setup.define_counter(STRAY_REPLIES_COUNTER),
            wait_histograms: RouteHistograms::new(
                bundle,
                |r| r.key.on_in_flight == OnInFlight::Wait,
                wait_histogram_name,
            ),
            store_call_histograms: RouteHistograms::new(
                bundle,
                |r| r.store == StoreKind::Redis,
                store_call_histogram_name,
            ),
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
        self.store_call_histograms.record(host, route, now.saturating_sub(since_ms));
    }

    /// A held duplicate of this route was resolved after waiting since `since_ms`.
    pub(super) fn record_wait(&self, host: &dyn Host, route: RouteId, since_ms: u64) {
        self.wait_histograms.record(host, route, host.now_ms().saturating_sub(since_ms));
    }

    /// A callout reply reached no owner (see `Worker::stray_reply`).
    pub(super) fn count_stray_reply(&self, host: &dyn Host) {
        if let Some(id) = self.stray_replies {
            host.count(id);
        }
    }

    pub(super) fn count_unmatched(&self, host: &dyn Host, rejected: bool) {
        if let Some(id) = self.unmatched[usize::from(rejected)] {
            host.count(id);
        }
    }
}
