//! `[engine.delivery]`: how many delivery workers and how much each holds.

use std::num::NonZeroUsize;
use std::time::Duration;

use serde::Deserialize;

use super::BreakerRules;
use crate::duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliverySettings {
    /// Delivery workers; recipients are partitioned across them by id.
    pub workers: NonZeroUsize,
    /// Batches a worker's queue holds before senders wait.
    pub queue_batches: NonZeroUsize,
    /// Attempts a worker runs concurrently. Absent: the configured
    /// channels' `max_in_flight` summed and shared over the workers
    /// (`in_flight_per_worker`).
    pub max_in_flight_per_worker: Option<NonZeroUsize>,
    /// Deliveries of one channel a worker holds waiting for a retry timer;
    /// a retry beyond is parked (stored, sent when the channel takes it),
    /// so a failing provider fills neither memory nor another channel's
    /// place.
    pub max_retrying_per_worker: NonZeroUsize,
    /// Failed attempts in a row (transient outcomes, or sends that made no
    /// request) after which a channel's breaker opens, or a webhook or Web
    /// Push host's: its deliveries are parked instead of sent until a probe
    /// is answered. 0 never opens a breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before its first probe.
    #[serde(rename = "breaker_cooldown_ms", deserialize_with = "duration::millis")]
    pub breaker_cooldown: Duration,
    /// The longest wait between probes (it doubles after each failed one).
    #[serde(rename = "breaker_max_cooldown_seconds", deserialize_with = "duration::seconds")]
    pub breaker_max_cooldown: Duration,
}

impl DeliverySettings {
    pub fn breaker(&self) -> BreakerRules {
        BreakerRules {
            failures: self.breaker_failures,
            cooldown: self.breaker_cooldown,
            max_cooldown: self.breaker_max_cooldown.max(self.breaker_cooldown),
        }
    }

    /// The bound on one worker's attempts: as set, or else the channels'
    /// requests in flight (`channels_in_flight`, the sum of their
    /// `max_in_flight`) over the workers, rounded up. An attempt beyond its
    /// channel's slots only waits in the pool's semaphore, a spawned task
    /// costing memory and CPU for nothing: with 4,096 attempts for a channel
    /// of 1,000 slots, the engine spent a third more CPU per delivery
    /// (docs/BENCHMARKS-HISTORY.md). So the bound is enforced where
    /// attempts are spawned.
    pub fn in_flight_per_worker(&self, channels_in_flight: usize) -> NonZeroUsize {
        self.max_in_flight_per_worker.unwrap_or_else(|| {
            NonZeroUsize::new(channels_in_flight.div_ceil(self.workers.get())).unwrap_or(NonZeroUsize::MIN)
        })
    }
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            workers: NonZeroUsize::new(8).unwrap(),
            queue_batches: NonZeroUsize::new(32).unwrap(),
            max_in_flight_per_worker: None,
            max_retrying_per_worker: NonZeroUsize::new(20_000).unwrap(),
            breaker_failures: 20,
            breaker_cooldown: Duration::from_secs(1),
            breaker_max_cooldown: Duration::from_secs(30),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_per_worker_is_the_channels_share_unless_set() {
        let derived = DeliverySettings::default();
        assert_eq!(derived.in_flight_per_worker(1000).get(), 125);
        assert_eq!(derived.in_flight_per_worker(2001).get(), 251);
        assert_eq!(derived.in_flight_per_worker(0).get(), 1);
        let set = DeliverySettings { max_in_flight_per_worker: NonZeroUsize::new(512), ..derived };
        assert_eq!(set.in_flight_per_worker(1000).get(), 512);
    }
}
