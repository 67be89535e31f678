//! One worker's handles on the delivery metrics' series, looked up on first
//! use. `with_label_values` hashes its labels, takes the vector's lock and
//! clones an `Arc` on every call, and an attempt made five such calls; the
//! handles also let the worker, not the attempt, count an attempt in flight,
//! so one that panics is counted out too (docs/BENCHMARKS-HISTORY.md, finding 10:
//! the rate did not change beyond the noise). A handle is the same series,
//! so the exposition is unchanged: `initialise` creates a configured
//! channel's series at zero at start-up, and a handle finds them.

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use crate::channel::Outcome;
use crate::domain::Channel;
use crate::metrics::{Deleted, Metrics};

/// One slot per row of the channel table (`Channel::slot`).
const CHANNEL_SLOTS: usize = Channel::ALL.len();

/// Creates every series the workers count for `channel` at zero: a failure
/// before the first scrape is invisible to `rate()` and `increase()` when its
/// series first appears already counted.
pub(super) fn initialise(m: &Metrics, channel: Channel) {
    let label = channel.as_str();
    m.in_flight.with_label_values(&[label]);
    for histogram in [&m.provider_latency, &m.publish_to_attempt, &m.retry_delay] {
        histogram.with_label_values(&[label]);
    }
    for counter in [&m.unsent, &m.retries] {
        counter.with_label_values(&[label]);
    }
    for outcome in Outcome::ATTEMPTED {
        m.attempts.with_label_values(&[label, outcome.label()]);
        m.deliveries.with_label_values(&[label, outcome.delivery_label()]);
    }
    m.recipients_deleted_by(Deleted::Terminal);
}

#[derive(Default)]
pub(super) struct Series {
    channels: [ChannelSeries; CHANNEL_SLOTS],
}

impl Series {
    pub(super) fn of(&mut self, channel: Channel) -> ChannelHandles<'_> {
        ChannelHandles { label: channel.as_str(), series: &mut self.channels[channel.slot()] }
    }
}

#[derive(Default)]
struct ChannelSeries {
    in_flight: Option<IntGauge>,
    provider_latency: Option<Histogram>,
    publish_to_attempt: Option<Histogram>,
    unsent: Option<IntCounter>,
    retries: Option<IntCounter>,
    retry_delay: Option<Histogram>,
    /// By outcome label: a handful, so a list.
    attempts: Vec<(&'static str, IntCounter)>,
    deliveries: Vec<(&'static str, IntCounter)>,
}

/// The series of one channel.
pub(super) struct ChannelHandles<'a> {
    label: &'static str,
    series: &'a mut ChannelSeries,
}

impl ChannelHandles<'_> {
    pub(super) fn in_flight(&mut self, m: &Metrics) -> &IntGauge {
        gauge(&mut self.series.in_flight, &m.in_flight, self.label)
    }
    pub(super) fn provider_latency(&mut self, m: &Metrics) -> &Histogram {
        histogram(&mut self.series.provider_latency, &m.provider_latency, self.label)
    }
    pub(super) fn publish_to_attempt(&mut self, m: &Metrics) -> &Histogram {
        histogram(&mut self.series.publish_to_attempt, &m.publish_to_attempt, self.label)
    }
    pub(super) fn retry_delay(&mut self, m: &Metrics) -> &Histogram {
        histogram(&mut self.series.retry_delay, &m.retry_delay, self.label)
    }
    pub(super) fn unsent(&mut self, m: &Metrics) -> &IntCounter {
        counter(&mut self.series.unsent, &m.unsent, &[self.label])
    }
    pub(super) fn retries(&mut self, m: &Metrics) -> &IntCounter {
        counter(&mut self.series.retries, &m.retries, &[self.label])
    }
    pub(super) fn attempts(&mut self, m: &Metrics, outcome: &'static str) -> &IntCounter {
        by_outcome(&mut self.series.attempts, &m.attempts, self.label, outcome)
    }
    pub(super) fn deliveries(&mut self, m: &Metrics, outcome: &'static str) -> &IntCounter {
        by_outcome(&mut self.series.deliveries, &m.deliveries, self.label, outcome)
    }
}

fn gauge<'a>(slot: &'a mut Option<IntGauge>, vec: &IntGaugeVec, channel: &str) -> &'a IntGauge {
    slot.get_or_insert_with(|| vec.with_label_values(&[channel]))
}

fn histogram<'a>(slot: &'a mut Option<Histogram>, vec: &HistogramVec, channel: &str) -> &'a Histogram {
    slot.get_or_insert_with(|| vec.with_label_values(&[channel]))
}

fn counter<'a>(slot: &'a mut Option<IntCounter>, vec: &IntCounterVec, labels: &[&str]) -> &'a IntCounter {
    slot.get_or_insert_with(|| vec.with_label_values(labels))
}

fn by_outcome<'a>(
    list: &'a mut Vec<(&'static str, IntCounter)>,
    vec: &IntCounterVec,
    channel: &str,
    outcome: &'static str,
) -> &'a IntCounter {
    let i = match list.iter().position(|(label, _)| *label == outcome) {
        Some(i) => i,
        None => {
            list.push((outcome, vec.with_label_values(&[channel, outcome])));
            list.len() - 1
        }
    };
    &list[i].1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_counts_into_the_series_with_its_labels() {
        let m = Metrics::new();
        let mut series = Series::default();
        series.of(Channel::Fcm).attempts(&m, "delivered").inc();
        series.of(Channel::Fcm).attempts(&m, "delivered").inc();
        series.of(Channel::Fcm).attempts(&m, "transient").inc();
        series.of(Channel::Apns).deliveries(&m, "exhausted").inc();
        series.of(Channel::Http).in_flight(&m).inc();
        series.of(Channel::Http).retry_delay(&m).observe(2.0);
        assert_eq!(m.attempts.with_label_values(&["fcm", "delivered"]).get(), 2);
        assert_eq!(m.attempts.with_label_values(&["fcm", "transient"]).get(), 1);
        assert_eq!(m.deliveries.with_label_values(&["apns", "exhausted"]).get(), 1);
        assert_eq!(m.in_flight.with_label_values(&["http"]).get(), 1);
        assert_eq!(m.retry_delay.with_label_values(&["http"]).get_sample_count(), 1);
    }

    #[test]
    fn every_channel_has_a_slot() {
        for channel in Channel::ALL {
            assert!(channel.slot() < CHANNEL_SLOTS, "{channel:?}");
        }
    }

    #[test]
    fn series_appear_only_once_counted() {
        let m = Metrics::new();
        let mut series = Series::default();
        series.of(Channel::WebPush).unsent(&m).inc();
        let exposed = m.render();
        assert!(exposed.contains(r#"fanout_unsent_total{channel="webpush"} 1"#), "{exposed}");
        assert!(!exposed.contains(r#"fanout_retries_total{channel="webpush"}"#), "{exposed}");
    }
}
