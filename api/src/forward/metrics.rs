//! The forwarding families: envelopes forwarded, how long a forward took,
//! the envelopes whose forward failed, and those routed again while their
//! shard's owner moved, by reason. Every reason exists at zero from
//! start-up, so the first one shows in `rate()`.

use fanout_engine::metrics::LATENCY_BUCKETS;
use prometheus::{Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry};
use strum::VariantArray;

use super::failure::Failure;
use super::retry::Retry;

#[derive(Clone)]
pub struct ForwardMetrics {
    pub forwarded: IntCounter,
    pub seconds: Histogram,
    failures: IntCounterVec,
    retries: IntCounterVec,
}

impl ForwardMetrics {
    pub fn register(registry: &Registry) -> Self {
        let forwarded = IntCounter::new(
            "fanout_forwarded_envelopes_total",
            "Envelopes of another node's shard sent on to their owner (its fanout_envelopes_published_total counts them)",
        )
        .expect("valid metric");
        let seconds = Histogram::with_opts(
            HistogramOpts::new(
                "fanout_forward_seconds",
                "Duration of one forward to a shard's owner, from its send to the answer, failures included",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let failures = IntCounterVec::new(
            Opts::new(
                "fanout_forward_failures_total",
                "Envelopes whose forward to their shard's owner failed (each answered UNAVAILABLE), by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let retries = IntCounterVec::new(
            Opts::new(
                "fanout_forward_retries_total",
                "Envelopes routed again, after a pause, because nothing was stored for them while their shard's owner moved, by reason",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for metric in [
            Box::new(forwarded.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(seconds.clone()),
            Box::new(failures.clone()),
            Box::new(retries.clone()),
        ] {
            registry.register(metric).expect("unique metric");
        }
        for reason in Failure::VARIANTS {
            failures.with_label_values(&[reason.as_str()]);
        }
        for reason in Retry::VARIANTS {
            retries.with_label_values(&[reason.as_str()]);
        }
        Self { forwarded, seconds, failures, retries }
    }

    /// Counts `envelopes` routed again for `reason`.
    pub fn retried(&self, reason: Retry, envelopes: usize) {
        self.retries.with_label_values(&[reason.as_str()]).inc_by(envelopes as u64);
    }

    /// Counts `envelopes` whose forward failed for `reason`.
    pub fn failed(&self, reason: Failure, envelopes: usize) {
        self.failures.with_label_values(&[reason.as_str()]).inc_by(envelopes as u64);
    }

    #[cfg(test)]
    pub fn failures(&self, reason: Failure) -> u64 {
        self.failures.with_label_values(&[reason.as_str()]).get()
    }
}
