//! `[engine.delivery]`: how many delivery workers and how much each holds.

use std::num::NonZeroUsize;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliverySettings {
    /// Delivery workers; recipients are partitioned across them by id.
    pub workers: NonZeroUsize,
    /// Batches a worker's queue holds before senders wait.
    pub queue_batches: NonZeroUsize,
    /// Attempts a worker runs concurrently.
    pub max_in_flight_per_worker: NonZeroUsize,
    /// Deliveries a worker holds waiting for a retry timer before it stops
    /// taking new batches: a failing provider slows dispatch instead of
    /// filling memory.
    pub max_retrying_per_worker: NonZeroUsize,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            workers: NonZeroUsize::new(8).unwrap(),
            queue_batches: NonZeroUsize::new(32).unwrap(),
            max_in_flight_per_worker: NonZeroUsize::new(512).unwrap(),
            max_retrying_per_worker: NonZeroUsize::new(20_000).unwrap(),
        }
    }
}
