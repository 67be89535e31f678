//! `[engine.dispatch]`: how shard actors read windows and pages.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchSettings {
    /// Most envelopes a shard reads into one window.
    pub window_envelopes: usize,
    /// Subscribers read per page; one page becomes one batch of deliveries.
    pub subscriber_page: usize,
    /// Pages a shard may have awaiting first attempts at once.
    pub max_pages_in_flight: usize,
    /// How often an idle shard looks for work it was not woken for.
    pub poll_interval_ms: u64,
    /// A window whose first attempts have not all finished by then is replayed
    /// from the checkpoint (at-least-once, never skipped).
    pub window_timeout_seconds: u64,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            window_envelopes: 512,
            subscriber_page: 1000,
            max_pages_in_flight: 16,
            poll_interval_ms: 1000,
            window_timeout_seconds: 120,
        }
    }
}
