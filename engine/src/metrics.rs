//! Prometheus metrics. Labels take only bounded, non-private values: channel,
//! outcome, method, status code, stage. Never an id, token, URL or topic (PUSH-254).

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};
use strum::VariantArray;

use crate::domain::Channel;

pub struct Metrics {
    pub registry: Registry,
    pub deliveries: IntCounterVec,
    pub attempts: IntCounterVec,
    pub retries: IntCounterVec,
    pub unsent: IntCounterVec,
    pub suppressed: IntCounter,
    pub webhook_refused_at_register: IntCounter,
    pub webhook_refused_at_send: IntCounter,
    pub envelopes_published: IntCounterVec,
    pub rpc_requests: IntCounterVec,
    pub http_requests: IntCounterVec,
    pub publish_to_attempt: HistogramVec,
    pub provider_latency: HistogramVec,
    pub in_flight: IntGaugeVec,
    pub retry_queue: IntGauge,
    pub recipients_deleted: IntCounterVec,
    pub windows: IntCounter,
    pub window_replays: IntCounter,
    pub window_duration: Histogram,
    pub dispatch_lag: IntGauge,
    pub shard_restarts: IntCounter,
    pub owned_shards: IntGauge,
    pub lease_renewals: IntCounterVec,
    pub store_errors: IntCounterVec,
    pub store_latency: HistogramVec,
    pub retry_delay: HistogramVec,
    pub delivery_queue: IntGauge,
    pub provider_token_refreshes: IntCounterVec,
    pub provider_connections_opened: IntCounterVec,
    pub provider_waiting_sends: IntGaugeVec,
    pub provider_token_failures: IntCounterVec,
    /// Spec 003 §4's counters, by `event`.
    pub relay_pushes: IntCounterVec,
    pub relay_queue_devices: IntGauge,
    pub relay_retry_waiting: IntGauge,
    limit_refusals: IntCounterVec,
    pub relay_ingress_webhooks: IntCounterVec,
    pub relay_ingress_rejected: IntCounterVec,
    pub relay_ingress_pushes: IntCounterVec,
    pub relay_records_expired: IntCounter,
    /// Spec 002's gateway (`GatewayMetrics` below).
    pub gateway: GatewayMetrics,
    /// Breakers and parked deliveries (`ParkingMetrics` below).
    pub parking: ParkingMetrics,
}

/// What became of one shard lease renewal, as the `outcome` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum LeaseRenewal {
    Renewed,
    /// Failed or unanswered in time: the lease may still be this node's;
    /// the shard is kept until its local deadline.
    InDoubt,
    /// Another node holds it, or its deadline passed unrenewed.
    Lost,
}

impl LeaseRenewal {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A configured input limit (docs/OPERATIONS.md "Limits"), as the `limit` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Limit {
    /// `engine.ingest.max_data_bytes`: one envelope refused.
    EnvelopeData,
    /// `engine.max_subscription_changes`: one UpdateSubscriptions refused.
    SubscriptionChanges,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why the engine deleted a recipient, as the `reason` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum Deleted {
    /// A terminal outcome, the stored registration unchanged (PUSH-234).
    Terminal,
    /// The retention pass (PUSH-226).
    Expired,
}

impl Deleted {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What became of a published envelope, as the `result` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum PublishResult {
    Stored,
    Rejected,
}

impl PublishResult {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A provider's credential series (APNs provider tokens, FCM access
/// tokens), created at zero with its channel: a token outage at start-up
/// must show in `increase()`, which needs a series before the first failure.
#[derive(Clone)]
pub struct TokenMetrics {
    pub refreshes: IntCounter,
    pub failures: IntCounter,
}

impl TokenMetrics {
    pub fn new(metrics: &Metrics, channel: Channel) -> Self {
        let channel = channel.as_str();
        Self {
            refreshes: metrics.provider_token_refreshes.with_label_values(&[channel]),
            failures: metrics.provider_token_failures.with_label_values(&[channel]),
        }
    }
}

/// Every histogram's buckets (docs/METRICS.md), the binary's own included.
pub const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        let counter = |name: &str, help: &str| register(&registry, IntCounter::new(name, help));
        let latency = |name: &str, help: &str| HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec());
        let histogram_vec = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, HistogramVec::new(latency(name, help), labels))
        };
        let gauge = |name: &str, help: &str| register(&registry, IntGauge::new(name, help));
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            register(&registry, IntGaugeVec::new(Opts::new(name, help), labels))
        };
        let metrics = Self {
            deliveries: counter_vec(
                "fanout_deliveries_total",
                "Deliveries finished, by channel and final outcome",
                &["channel", "outcome"],
            ),
            attempts: counter_vec(
                "fanout_attempts_total",
                "Provider attempts, by channel and outcome",
                &["channel", "outcome"],
            ),
            retries: counter_vec("fanout_retries_total", "Attempts scheduled for retry, by channel", &["channel"]),
            unsent: counter_vec(
                "fanout_unsent_total",
                "Sends that never reached the provider (credential failure, watchdog), tried again; not attempts",
                &["channel"],
            ),
            suppressed: counter("fanout_suppressed_total", "Deliveries suppressed as the sender's own (PUSH-230)"),
            webhook_refused_at_register: counter(
                "fanout_webhook_refused_register_total",
                "Webhook registrations refused by destination safety (PUSH-256)",
            ),
            webhook_refused_at_send: counter(
                "fanout_webhook_refused_send_total",
                "Webhook attempts not sent because the destination failed the check (PUSH-256)",
            ),
            envelopes_published: counter_vec(
                "fanout_envelopes_published_total",
                "Envelopes received on the publish service, by result",
                &["result"],
            ),
            rpc_requests: counter_vec(
                "fanout_rpc_requests_total",
                "gRPC requests by method and status code",
                &["method", "code"],
            ),
            http_requests: counter_vec(
                "fanout_http_requests_total",
                "API listener requests (spec 003 registration) by route and result (ok or the problem code)",
                &["route", "code"],
            ),
            publish_to_attempt: histogram_vec(
                "fanout_publish_to_attempt_seconds",
                "Time from envelope storage to the answer of its first attempt",
                &["channel"],
            ),
            provider_latency: histogram_vec(
                "fanout_provider_latency_seconds",
                "Duration of one provider attempt",
                &["channel"],
            ),
            in_flight: gauge_vec("fanout_in_flight_attempts", "Attempts awaiting a provider answer", &["channel"]),
            retry_queue: gauge("fanout_retry_queue_depth", "Deliveries waiting for a retry timer"),
            recipients_deleted: counter_vec(
                "fanout_recipients_deleted_total",
                "Recipients deleted by the engine, by reason",
                &["reason"],
            ),
            relay_pushes: counter_vec(
                "fanout_relay_pushes_total",
                "Relay channel pushes (spec 003 section 4 counters), by event: enqueued, coalesced, upgraded, \
                 dropped, sent, skipped, invalid_token, retried, failed",
                &["event"],
            ),
            relay_queue_devices: gauge("fanout_relay_queue_devices", "Devices with a pending relay push"),
            relay_retry_waiting: gauge("fanout_relay_retry_waiting", "Relay pushes waiting for a retry timer"),
            windows: counter("fanout_windows_total", "Dispatch windows completed"),
            window_replays: counter(
                "fanout_window_replays_total",
                "Windows abandoned and replayed from the checkpoint",
            ),
            window_duration: register(
                &registry,
                Histogram::with_opts(latency(
                    "fanout_window_duration_seconds",
                    "Time from reading a window to its checkpoint",
                )),
            ),
            dispatch_lag: gauge("fanout_dispatch_lag_envelopes", "Sum over shards of boundary minus checkpoint"),
            shard_restarts: counter("fanout_shard_restarts_total", "Shard actors restarted by the supervisor"),
            owned_shards: gauge(
                "fanout_owned_shards",
                "Topic shards this node runs a shard actor for (all of them on one node; its lease share on several)",
            ),
            lease_renewals: counter_vec(
                "fanout_lease_renewals_total",
                "Shard lease renewals by outcome: renewed, in_doubt (failed or unanswered, kept until the lease's \
                 deadline), lost (another owner, or the deadline passed)",
                &["outcome"],
            ),
            store_errors: counter_vec(
                "fanout_store_errors_total",
                "Storage operations that failed in the backend, by operation",
                &["operation"],
            ),
            store_latency: histogram_vec(
                "fanout_store_operation_seconds",
                "Duration of storage operations, by operation",
                &["operation"],
            ),
            retry_delay: histogram_vec(
                "fanout_retry_delay_seconds",
                "Delay before each scheduled retry, by channel",
                &["channel"],
            ),
            delivery_queue: gauge("fanout_delivery_queue_batches", "Batches waiting in the delivery workers' queues"),
            provider_token_refreshes: counter_vec(
                "fanout_provider_token_refreshes_total",
                "Provider credentials (APNs provider token, FCM access token) obtained, by channel",
                &["channel"],
            ),
            provider_connections_opened: counter_vec(
                "fanout_provider_connections_opened_total",
                "HTTP/2 connections opened to a provider (APNs, FCM), by channel; a rate means reconnects",
                &["channel"],
            ),
            provider_waiting_sends: gauge_vec(
                "fanout_provider_waiting_sends",
                "Sends waiting for a provider's in-flight slot or rate limit",
                &["channel"],
            ),
            provider_token_failures: counter_vec(
                "fanout_provider_token_failures_total",
                "Provider credentials that could not be obtained, by channel",
                &["channel"],
            ),
            limit_refusals: counter_vec(
                "fanout_limit_refusals_total",
                "Inputs refused by a configured limit, by limit (envelopes for envelope_data, requests otherwise)",
                &["limit"],
            ),
            relay_ingress_webhooks: counter_vec(
                "fanout_relay_ingress_webhooks_total",
                "Spec 003 webhooks answered without an error: accepted (verified, sent to the provider) or duplicate \
                 (a settled delivery_id, no provider request)",
                &["result"],
            ),
            relay_ingress_rejected: counter_vec(
                "fanout_relay_ingress_rejected_total",
                "Spec 003 webhooks answered with an error status, by reason",
                &["reason"],
            ),
            relay_ingress_pushes: counter_vec(
                "fanout_relay_ingress_pushes_total",
                "Provider attempts of relayed pushes, by channel and outcome (delivered, dead_token, rejected, \
                 payload_too_large, transient)",
                &["channel", "outcome"],
            ),
            relay_records_expired: counter(
                "fanout_relay_records_expired_total",
                "Relay delivery records deleted by retention once their ttl ran out (embedded store)",
            ),
            gateway: GatewayMetrics::register(&registry),
            parking: ParkingMetrics::register(&registry),
            registry,
        };
        for result in ["accepted", "duplicate"] {
            metrics.relay_ingress_webhooks.with_label_values(&[result]);
        }
        // At zero from the start: a rate of in-doubt or lost renewals is worth an alert.
        for outcome in LeaseRenewal::VARIANTS {
            metrics.lease_renewals.with_label_values(&[outcome.as_str()]);
        }
        // At zero from the start: a refusal rate is worth an alert.
        for limit in Limit::VARIANTS {
            metrics.limit_refusals.with_label_values(&[limit.as_str()]);
        }
        // The publish service and the retention pass run on every engine.
        for result in PublishResult::VARIANTS {
            metrics.envelopes_published.with_label_values(&[result.as_str()]);
        }
        metrics.recipients_deleted_by(Deleted::Expired);
        metrics
    }

    /// The series of recipients deleted for `reason`.
    pub fn recipients_deleted_by(&self, reason: Deleted) -> IntCounter {
        self.recipients_deleted.with_label_values(&[reason.as_str()])
    }

    /// The series of envelopes published with `result`.
    pub fn envelopes_published_as(&self, result: PublishResult) -> IntCounter {
        self.envelopes_published.with_label_values(&[result.as_str()])
    }

    /// Counts one shard lease renewal's outcome.
    pub fn lease_renewed(&self, outcome: LeaseRenewal) {
        self.lease_renewals.with_label_values(&[outcome.as_str()]).inc();
    }

    /// Counts `n` inputs refused by `limit`.
    pub fn limit_refused(&self, limit: Limit, n: u64) {
        self.limit_refusals.with_label_values(&[limit.as_str()]).inc_by(n);
    }

    /// Creates the series of a label vector up front, so dashboards and alerts
    /// see them at zero before the first event.
    pub fn initialise_labels(&self, operations: &[&str]) {
        for op in operations {
            self.store_errors.with_label_values(&[op]);
            self.store_latency.with_label_values(&[op]);
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        // Encoding into a String cannot fail for well-formed families.
        let _ = encoder.encode_utf8(&self.registry.gather(), &mut out);
        out
    }
}

// ---- spec 002, the push gateway ----

/// The push gateway's families (docs/METRICS.md "Push gateway"). Label values
/// are the fixed symbols of `crate::gateway` (gateway status, reason code,
/// wake-up outcome, refusal reason), never an id, pseudonym, token or
/// service DID. Created with the registry; their children are created at
/// zero by `GatewayService::new` (the notify refusal reasons by the HTTP
/// router, `api/src/gateway.rs`), so they show only with `[engine.gateway]`.
pub struct GatewayMetrics {
    /// Per-device notify outcomes by `result` (§5.2 gateway_status).
    pub device_outcomes: IntCounterVec,
    /// Rejected devices by `reason` (§5.2 reason_code).
    pub device_rejections: IntCounterVec,
    /// Notify requests answered 401, by `reason`.
    pub notify_unauthorized: IntCounterVec,
    /// Station route changes by `result`.
    pub registrations: IntCounterVec,
    /// What became of each leased wake-up, by `outcome`.
    pub wakeups: IntCounterVec,
    /// Wake-ups leased and being sent.
    pub wakeups_in_flight: IntGauge,
    /// How long past its due time the longest-waiting wake-up of the last
    /// lease waited for a worker.
    pub wakeup_lateness: prometheus::Gauge,
    /// How long the worker has had work and finished none.
    pub worker_stalled: prometheus::Gauge,
}

impl GatewayMetrics {
    fn register(registry: &Registry) -> Self {
        let counter_vec = |name: &str, help: &str, label: &str| {
            register(registry, IntCounterVec::new(Opts::new(name, help), &[label]))
        };
        let gauge = |name: &str, help: &str| register(registry, prometheus::Gauge::new(name, help));
        Self {
            device_outcomes: counter_vec(
                "fanout_gateway_device_outcomes_total",
                "Spec 002 notify outcomes per device, by gateway_status (replays not counted)",
                "result",
            ),
            device_rejections: counter_vec(
                "fanout_gateway_device_rejections_total",
                "Spec 002 notify devices answered rejected, by reason_code",
                "reason",
            ),
            notify_unauthorized: counter_vec(
                "fanout_gateway_notify_unauthorized_total",
                "Spec 002 notify requests answered 401, by reason (unknown source, Content-Digest, signature check)",
                "reason",
            ),
            registrations: counter_vec(
                "fanout_gateway_registrations_total",
                "Spec 002 Station route changes: registered, superseded, revoked, not_registered",
                "result",
            ),
            wakeups: counter_vec(
                "fanout_gateway_wakeups_total",
                "Spec 002 wake-up attempts by what followed: delivered, retried, dead_token, rejected, exhausted, revoked",
                "outcome",
            ),
            wakeups_in_flight: register(
                registry,
                IntGauge::new(
                    "fanout_gateway_wakeups_in_flight",
                    "Spec 002 wake-ups leased by this node's worker and being sent to APNs/FCM",
                ),
            ),
            wakeup_lateness: gauge(
                "fanout_gateway_wakeup_lateness_seconds",
                "Spec 002: how long past its due time the longest-waiting wake-up of the worker's last lease waited",
            ),
            worker_stalled: gauge(
                "fanout_gateway_worker_stalled_seconds",
                "Spec 002: how long the wake-up worker has had work (or an unreadable store) without finishing any",
            ),
        }
    }
}

// ---- channels that fail alone ----

/// Circuit breakers and parked deliveries (docs/METRICS.md "Channel
/// outages"), by `channel`, and for breakers by `scope`: `channel` (the
/// provider as a whole) or `host` (one webhook or Web Push host, never
/// named). Created at zero with each configured channel.
pub struct ParkingMetrics {
    /// Deliveries stored in the parked table instead of attempted, by
    /// `reason`: `breaker` (open), `saturated` (the channel could not take
    /// them while another channel could), `retry` (a retry due while its
    /// breaker was open, or beyond the channel's retry bound), `in_flight`
    /// (a first attempt still in flight after a second while another
    /// channel was active).
    pub parked: IntCounterVec,
    /// Parked deliveries handed to the workers again.
    pub unparked: IntCounterVec,
    /// Park writes that failed: their first attempts are sent by the
    /// window's replay; a failed retry's is counted exhausted.
    pub park_failures: IntCounterVec,
    /// Breakers opened, by `scope`.
    pub breaker_opened: IntCounterVec,
    /// 1 while the channel's breaker is open.
    pub breaker_open: IntGaugeVec,
}

impl ParkingMetrics {
    fn register(registry: &Registry) -> Self {
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            register(registry, IntCounterVec::new(Opts::new(name, help), labels))
        };
        Self {
            parked: counter_vec(
                "fanout_parked_total",
                "Deliveries parked durably instead of attempted, by channel and reason (breaker, saturated, retry, in_flight)",
                &["channel", "reason"],
            ),
            unparked: counter_vec(
                "fanout_unparked_total",
                "Parked deliveries handed to the delivery workers again, by channel",
                &["channel"],
            ),
            park_failures: counter_vec(
                "fanout_park_failures_total",
                "Deliveries whose park write failed (first attempts replayed, retries exhausted), by channel",
                &["channel"],
            ),
            breaker_opened: counter_vec(
                "fanout_breaker_opened_total",
                "Circuit breakers opened after failed attempts in a row, by channel and scope (channel or host)",
                &["channel", "scope"],
            ),
            breaker_open: register(
                registry,
                IntGaugeVec::new(
                    Opts::new("fanout_breaker_open", "1 while the channel's circuit breaker is open"),
                    &["channel"],
                ),
            ),
        }
    }

    /// Creates `channel`'s series at zero.
    pub fn initialise(&self, channel: Channel) {
        let label = channel.as_str();
        for reason in ParkReason::VARIANTS {
            self.parked.with_label_values(&[label, reason.as_str()]);
        }
        self.unparked.with_label_values(&[label]);
        self.park_failures.with_label_values(&[label]);
        for scope in ["channel", "host"] {
            self.breaker_opened.with_label_values(&[label, scope]);
        }
        self.breaker_open.with_label_values(&[label]);
    }
}

/// Why a delivery was parked, as the `reason` label names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum ParkReason {
    Breaker,
    Saturated,
    Retry,
    /// A first attempt detached from its page while in flight
    /// (`delivery::detach`).
    InFlight,
}

impl ParkReason {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// `metric`, registered in `registry`.
fn register<M: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: prometheus::Result<M>) -> M {
    let metric = metric.expect("valid metric");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Tests: every one of `series` (a whole exposition line, value included)
/// is in `exposed`.
#[cfg(test)]
pub(crate) fn assert_exposed(exposed: &str, series: &[&str]) {
    for line in series {
        assert!(exposed.lines().any(|l| l == *line), "{line} missing:\n{exposed}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_registry_has_the_engine_wide_series_at_zero_and_no_channel_series() {
        let exposed = Metrics::new().render();
        crate::metrics::assert_exposed(
            &exposed,
            &[
                r#"fanout_envelopes_published_total{result="stored"} 0"#,
                r#"fanout_envelopes_published_total{result="rejected"} 0"#,
                r#"fanout_recipients_deleted_total{reason="expired"} 0"#,
                r#"fanout_limit_refusals_total{limit="envelope_data"} 0"#,
            ],
        );
        // A channel's series come with the channel, and none is configured.
        assert!(!exposed.contains("channel="), "{exposed}");
        assert!(!exposed.contains(r#"reason="terminal""#), "{exposed}");
    }
}
