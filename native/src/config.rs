//! One `DynamicModuleFilter` config: the policy bundle it carries, checked on Envoy's main thread
//! before any worker uses it, its metrics, defined there as labelled families, and its calls
//! (`calls.rs`).
//!
//! The core names a counter for proxy-wasm, tags and all
//! (`route=.=create-order;.;outcome=.=replayed;.;idem_requests_total`). A dynamic module must
//! define its metrics when the config is created (the ABI's `config_define_*` "called during
//! initialization"), so the families are defined here once with their label names, and a core
//! name is read back into a family and label values when a worker first uses it. Prometheus
//! then shows the same `idem_requests_total{route="…",outcome="…"}` as with the `.wasm`, and a
//! series exists only once counted (or at zero for `[metrics] zero_series`), as on Wasm.

use crate::abi::{ConfigPtr, MetricId};
use crate::calls::Calls;
use idem_filter::lifecycle::STRAY_REPLIES_COUNTER;
use std::sync::{PoisonError, RwLock};

/// A metric family: its name, label names, kind.
struct Family {
    name: &'static str,
    labels: &'static [&'static str],
    histogram: bool,
}

const FAMILIES: [Family; 5] = [
    Family { name: "idem_requests_total", labels: &["route", "outcome"], histogram: false },
    Family { name: "idem_unmatched_total", labels: &["outcome"], histogram: false },
    Family { name: STRAY_REPLIES_COUNTER, labels: &[], histogram: false },
    Family { name: "idem_wait_time", labels: &["route"], histogram: true },
    Family { name: "idem_store_call_time", labels: &["route"], histogram: true },
];

/// One series: a family's id and its label values, in the family's label order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Series {
    pub id: MetricId,
    pub histogram: bool,
    pub labels: Vec<Vec<u8>>,
}

pub struct Config {
    pub envoy: ConfigPtr,
    /// `filter_name`: what the core reads as `plugin_name` (the default store namespace).
    pub name: String,
    /// The policy bundle (`filter_config`), as the `.wasm` receives it.
    pub policy: Vec<u8>,
    /// Each family's id, in [`FAMILIES`] order (`None` if Envoy refused to define it).
    families: Vec<Option<MetricId>>,
    /// The HTTP calls of this config's roots and streams, sent from the main thread.
    pub calls: Calls,
    /// Envoy still has this config: false from `on_http_filter_config_destroy` on, after which
    /// `envoy` must not be used. Roots of the config live on in their workers (no longer ticked,
    /// but an answer still out may reach them); the lock makes an increment and the destroy never
    /// overlap.
    alive: RwLock<bool>,
}

impl Config {
    /// Defines the metric families on Envoy's main thread.
    pub fn new(envoy: ConfigPtr, name: String, policy: Vec<u8>) -> Config {
        let families = FAMILIES.iter().map(|f| envoy.define(f.name, f.labels, f.histogram)).collect();
        let calls = Calls::default();
        calls.start(envoy);
        Config { envoy, name, policy, families, calls, alive: RwLock::new(true) }
    }

    /// The series a core metric name stands for, or `None` for a name of no family.
    pub fn series(&self, core_name: &str) -> Option<Series> {
        let (tags, family_name) = split_tags(core_name);
        let at = FAMILIES.iter().position(|f| f.name == family_name)?;
        let family = &FAMILIES[at];
        let id = (*self.families.get(at)?)?;
        let labels = family
            .labels
            .iter()
            .map(|l| tags.iter().find(|(n, _)| n == l).map(|(_, v)| v.as_bytes().to_vec()))
            .collect::<Option<Vec<_>>>()?;
        (labels.len() == tags.len()).then_some(Series { id, histogram: family.histogram, labels })
    }

    /// Adds to a counter series, or records in a histogram series (nothing once Envoy destroyed
    /// the config).
    pub fn add(&self, series: &Series, value: u64) {
        let alive = self.alive.read().unwrap_or_else(PoisonError::into_inner);
        if *alive {
            self.envoy.add(series.id, &series.labels, value, series.histogram);
        }
    }

    /// Envoy destroys the config (main thread): its pointer is not used from now on, and no call
    /// of it is queued.
    pub fn destroy(&self) {
        *self.alive.write().unwrap_or_else(PoisonError::into_inner) = false;
        self.calls.stop();
    }

    /// Envoy still has the config.
    pub fn is_alive(&self) -> bool {
        *self.alive.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// `a=.=x;.;b=.=y;.;name` → (`[(a, x), (b, y)]`, `name`): proxy-wasm's tag convention.
fn split_tags(name: &str) -> (Vec<(&str, &str)>, &str) {
    let mut parts: Vec<&str> = name.split(";.;").collect();
    let family = parts.pop().unwrap_or_default();
    let tags = parts.iter().filter_map(|p| p.split_once("=.=")).collect();
    (tags, family)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_counter_name_is_read_as_its_family_and_labels() {
        let name = idem_filter::engine::outcome::counter_name("pay;x", idem_filter::engine::Outcome::Replayed);
        let (tags, family) = split_tags(&name);
        assert_eq!(family, "idem_requests_total");
        assert_eq!(tags, vec![("route", "pay;x"), ("outcome", "replayed")]);
        assert_eq!(split_tags(STRAY_REPLIES_COUNTER), (vec![], STRAY_REPLIES_COUNTER));
        let unmatched = idem_filter::engine::outcome::unmatched_counter_name(true);
        assert_eq!(split_tags(&unmatched), (vec![("outcome", "rejected")], "idem_unmatched_total"));
    }
}
