//! `[engine.dispatch]`: how shard actors read windows and pages.

use std::num::NonZeroUsize;
use std::time::Duration;

use serde::Deserialize;

use crate::duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchSettings {
    /// Most envelopes a shard reads into one window.
    pub window_envelopes: NonZeroUsize,
    /// Subscribers read per page; one page becomes one batch of deliveries.
    pub subscriber_page: NonZeroUsize,
    /// Pages a shard may have awaiting first attempts at once.
    pub max_pages_in_flight: NonZeroUsize,
    /// Subscriber pages a shard reads ahead of the one it hands out: the
    /// next page of its current envelope and the first pages of those
    /// behind it. 0 reads each page when it is needed. On ScyllaDB a page
    /// read is a round trip, which these overlap.
    pub subscriber_pages_ahead: usize,
    /// How often an idle shard looks for work it was not woken for.
    #[serde(rename = "poll_interval_ms", deserialize_with = "duration::millis")]
    pub poll_interval: Duration,
    /// A window whose first attempts have not all finished by then is replayed
    /// from the checkpoint (at-least-once, never skipped).
    #[serde(rename = "window_timeout_seconds", deserialize_with = "duration::seconds")]
    pub window_timeout: Duration,
    /// How often a running window may move the checkpoint up to just below
    /// its oldest envelope still in flight. After a kill -9 or a lease
    /// handover the next owner replays from the checkpoint, so the repeats
    /// are what was in flight plus about this much progress; each move is
    /// one store write per busy shard.
    #[serde(rename = "checkpoint_interval_ms", deserialize_with = "duration::millis")]
    pub checkpoint_interval: Duration,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            window_envelopes: NonZeroUsize::new(512).unwrap(),
            subscriber_page: NonZeroUsize::new(1000).unwrap(),
            max_pages_in_flight: NonZeroUsize::new(16).unwrap(),
            subscriber_pages_ahead: 4,
            poll_interval: Duration::from_millis(1000),
            window_timeout: Duration::from_secs(120),
            checkpoint_interval: Duration::from_millis(1000),
        }
    }
}
