//! Every outcome the filter counts.

/// Every outcome the filter counts, as `idem_requests_total{route, outcome}` (see [`counter_name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Forwarded,
    Replayed,
    RejectedDuplicate,
    InFlight,
    KeyReused,
    MissingKey,
    InvalidKey,
    BodyTooLarge,
    StoreError,
    Stored,
    Released,
    Held,
    Tombstoned,
    LeaseLost,
    NoKey,
    ShadowWouldBlock,
    Waited,
    TokenIssued,
    TokenConsumed,
    TokenRejected,
    TokenRestored,
    OutcomeUnknown,
    MissingScope,
    WriteRetried,
    WriteDropped,
    OrphanReleased,
    Misconfigured,
    Unsupported,
    Unprotected,
    ReconciledRan,
    ReconciledAbsent,
    ReconcileFailed,
}

impl Outcome {
    pub const ALL: [Outcome; 32] = [
        Outcome::Forwarded,
        Outcome::Replayed,
        Outcome::RejectedDuplicate,
        Outcome::InFlight,
        Outcome::KeyReused,
        Outcome::MissingKey,
        Outcome::InvalidKey,
        Outcome::BodyTooLarge,
        Outcome::StoreError,
        Outcome::Stored,
        Outcome::Released,
        Outcome::Held,
        Outcome::Tombstoned,
        Outcome::LeaseLost,
        Outcome::NoKey,
        Outcome::ShadowWouldBlock,
        Outcome::Waited,
        Outcome::TokenIssued,
        Outcome::TokenConsumed,
        Outcome::TokenRejected,
        Outcome::TokenRestored,
        Outcome::OutcomeUnknown,
        Outcome::MissingScope,
        Outcome::WriteRetried,
        Outcome::WriteDropped,
        Outcome::OrphanReleased,
        Outcome::Misconfigured,
        Outcome::Unsupported,
        Outcome::Unprotected,
        Outcome::ReconciledRan,
        Outcome::ReconciledAbsent,
        Outcome::ReconcileFailed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::Replayed => "replayed",
            Outcome::RejectedDuplicate => "rejected_duplicate",
            Outcome::InFlight => "in_flight",
            Outcome::KeyReused => "key_reused",
            Outcome::MissingKey => "missing_key",
            Outcome::InvalidKey => "invalid_key",
            Outcome::BodyTooLarge => "body_too_large",
            Outcome::StoreError => "store_error",
            Outcome::Stored => "stored",
            Outcome::Released => "released",
            Outcome::Held => "held",
            Outcome::Tombstoned => "tombstoned",
            Outcome::LeaseLost => "lease_lost",
            Outcome::NoKey => "no_key",
            Outcome::ShadowWouldBlock => "shadow_would_block",
            Outcome::Waited => "waited",
            Outcome::TokenIssued => "token_issued",
            Outcome::TokenConsumed => "token_consumed",
            Outcome::TokenRejected => "token_rejected",
            Outcome::TokenRestored => "token_restored",
            Outcome::OutcomeUnknown => "outcome_unknown",
            Outcome::MissingScope => "missing_scope",
            Outcome::WriteRetried => "write_retried",
            Outcome::WriteDropped => "write_dropped",
            Outcome::OrphanReleased => "orphan_released",
            Outcome::Misconfigured => "misconfigured",
            Outcome::Unsupported => "unsupported",
            Outcome::Unprotected => "unprotected",
            Outcome::ReconciledRan => "reconciled_ran",
            Outcome::ReconciledAbsent => "reconciled_absent",
            Outcome::ReconcileFailed => "reconcile_failed",
        }
    }

    /// The outcomes the shipped alert rules and dashboard read (`examples/prometheus/`): their
    /// series exist from the start, at zero, so `increase()` sees the first count. `token` routes
    /// get the token ones.
    pub fn alerted(token_route: bool) -> &'static [Outcome] {
        if token_route {
            &[Outcome::TokenConsumed, Outcome::TokenRejected, Outcome::StoreError, Outcome::Misconfigured]
        } else {
            &[
                Outcome::Forwarded,
                Outcome::Replayed,
                Outcome::RejectedDuplicate,
                Outcome::InFlight,
                Outcome::KeyReused,
                Outcome::OutcomeUnknown,
                Outcome::Held,
                Outcome::StoreError,
                Outcome::LeaseLost,
                Outcome::WriteDropped,
                Outcome::Misconfigured,
            ]
        }
    }

    /// Position in [`Outcome::ALL`] (declaration order), for counter ids.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The counter of one route and outcome, named for Envoy's tag extraction (the `name=.=value;.;`
/// convention Istio uses): with the `stats_tags` of `examples/envoy.yaml`, Prometheus sees one
/// family, `idem_requests_total{route="…",outcome="…"}`. Without them the full name still reads.
pub fn counter_name(route: &str, outcome: Outcome) -> String {
    format!("route=.={route};.;outcome=.={};.;idem_requests_total", outcome.name())
}

/// How long held duplicates waited (`on_in_flight = "wait"`), in ms: `idem_wait_time{route}`.
pub fn wait_histogram_name(route: &str) -> String {
    format!("route=.={route};.;idem_wait_time")
}

/// How long Redis calls took through Webdis (claims, token uses, writes), in ms:
/// `idem_store_call_time{route}`.
pub fn store_call_histogram_name(route: &str) -> String {
    format!("route=.={route};.;idem_store_call_time")
}

/// The counter of requests on a filter route that no policy matched: `idem_unmatched_total{outcome}`
/// with `outcome` `passed` or `rejected`.
pub fn unmatched_counter_name(rejected: bool) -> String {
    format!("outcome=.={};.;idem_unmatched_total", if rejected { "rejected" } else { "passed" })
}
