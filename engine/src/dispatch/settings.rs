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
    /// behind it. 0 reads each page when it is needed. Unset: 4 on ScyllaDB,
    /// where a page read is a round trip these overlap, and 0 on redb, whose
    /// reads are in-process and cost more as tasks than they save.
    pub subscriber_pages_ahead: Option<usize>,
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
    /// How often, in milliseconds, a running window records what it answered
    /// above the checkpoint (the envelopes that had every first attempt, and
    /// how far into the open ones), so that the shard's next owner skips it
    /// instead of sending it again: the repeats after a handover are then
    /// about what was in flight. 0 never records. Unset: 100 on ScyllaDB,
    /// where shards change owners and each record is one small write, and
    /// 0 on redb, whose single node only replays after a restart.
    pub progress_interval_ms: Option<u64>,
}

/// `progress_interval_ms` unset, on a store reached over the network.
const NETWORK_PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// `subscriber_pages_ahead` unset, on a store reached over the network.
/// Measured on the delivery scenarios against Cassandra (docs/BENCHMARKS.md).
const NETWORK_PAGES_AHEAD: usize = 4;

impl DispatchSettings {
    /// The pages read ahead per shard: as set, else by where the store is.
    pub fn pages_ahead(&self, networked_store: bool) -> usize {
        self.subscriber_pages_ahead.unwrap_or(if networked_store { NETWORK_PAGES_AHEAD } else { 0 })
    }

    /// How often a running window records its progress: as set, else by
    /// where the store is; `None` never.
    pub fn progress_interval(&self, networked_store: bool) -> Option<Duration> {
        match self.progress_interval_ms {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => networked_store.then_some(NETWORK_PROGRESS_INTERVAL),
        }
    }
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            window_envelopes: NonZeroUsize::new(512).unwrap(),
            subscriber_page: NonZeroUsize::new(1000).unwrap(),
            max_pages_in_flight: NonZeroUsize::new(16).unwrap(),
            subscriber_pages_ahead: None,
            poll_interval: Duration::from_millis(1000),
            window_timeout: Duration::from_secs(120),
            checkpoint_interval: Duration::from_millis(1000),
            progress_interval_ms: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_ahead_default_by_where_the_store_is() {
        let unset = DispatchSettings::default();
        assert_eq!((unset.pages_ahead(true), unset.pages_ahead(false)), (NETWORK_PAGES_AHEAD, 0));
        let set = DispatchSettings { subscriber_pages_ahead: Some(0), ..Default::default() };
        assert_eq!((set.pages_ahead(true), set.pages_ahead(false)), (0, 0));
    }

    #[test]
    fn progress_is_recorded_by_default_only_on_a_networked_store() {
        let unset = DispatchSettings::default();
        assert_eq!(
            (unset.progress_interval(true), unset.progress_interval(false)),
            (Some(NETWORK_PROGRESS_INTERVAL), None)
        );
        let never = DispatchSettings { progress_interval_ms: Some(0), ..Default::default() };
        assert_eq!((never.progress_interval(true), never.progress_interval(false)), (None, None));
        let set = DispatchSettings { progress_interval_ms: Some(250), ..Default::default() };
        assert_eq!(set.progress_interval(false), Some(Duration::from_millis(250)));
    }
}
