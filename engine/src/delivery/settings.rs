//! `[engine.delivery]`: how many delivery workers and how much each holds.

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliverySettings {
    /// Delivery workers; recipients are partitioned across them by id.
    pub workers: usize,
    /// Batches a worker's queue holds before senders wait.
    pub queue_batches: usize,
    /// Attempts a worker runs concurrently.
    pub max_in_flight_per_worker: usize,
    /// Deliveries a worker holds waiting for a retry timer before it stops
    /// taking new batches: a failing provider slows dispatch instead of
    /// filling memory.
    pub max_retrying_per_worker: usize,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self { workers: 8, queue_batches: 32, max_in_flight_per_worker: 512, max_retrying_per_worker: 20_000 }
    }
}
