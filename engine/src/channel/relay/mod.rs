//! The relay channel: spec 003's hub side. Devices register a push route
//! (provider, token, ...; §1); each envelope addressed to them becomes a
//! notification (§3), queued per device with coalescing (§4), and sent as
//! one signed webhook (§2) to the operator's push server, which owns the
//! platform credentials. Provider `log` stays in-process (§5).
//!
//! - `settings`: `[engine.channels.relay]`.
//! - `event`: envelope → notifications (type, gid, seq, message_id).
//! - `payload`: the device payload, the size rule, minimal mode (§3).
//! - `body`: the webhook body (§2.3); `signing`: `X-Gim-Signature` (§2.2).
//! - `classify`: the answer table and the retry schedule (§2.4).
//! - `coalesce`: the merge rules (§4); `queue`: the per-device queue;
//!   `sender`: the senders and the retry timer.
//! - `log`: the log provider, recording into the context's debug ring (§5).
//!
//! Unlike the other channels, this one is no `Provider` but a dispatch
//! `Sink` beside the delivery workers: dispatch hands it its deliveries, the
//! queue coalesces them, settles their first-attempt latches (PUSH-257)
//! when they are sent, coalesced away or dropped, and retries on its own
//! schedule, so the delivery workers' retry rules (spec 000 section 7)
//! never apply to it.

mod body;
mod classify;
mod coalesce;
mod event;
mod log;
mod payload;
mod queue;
mod sender;
mod settings;
mod signing;

use std::sync::Arc;
use std::time::Duration;

pub use event::{gid, stand_in_message_id};
pub use settings::{HubId, RelaySettings, RelayUrl};
pub use signing::{HEADER_DELIVERY, HEADER_SIGNATURE, signature_header};

use self::coalesce::RelayPush;
use self::queue::{Counters, HoldId, Queue};
use self::sender::{Senders, Webhook};
use self::signing::WebhookSecret;
use crate::channel::provider::{BuildError, ChannelContext};
use crate::domain::{Channel, DeliveryTarget, RecipientId};
use crate::page::{Batch, Delivery, Handoff, Sink};
use crate::transport::client_tls_config;
use crate::transport::pool::{ClientOptions, Pool, PoolMetrics, PoolOptions, Protocols, Resolver};

/// The push server is one trusted host: HTTP/2 or HTTP/1.1 as it prefers.
const CLIENT_OPTIONS: ClientOptions =
    ClientOptions { protocols: Protocols::Http1Or2, idle_timeout: Duration::from_secs(90) };
/// In-flight requests to the push server: the senders are the real bound.
const MAX_IN_FLIGHT: std::num::NonZeroUsize = std::num::NonZeroUsize::new(1024).unwrap();

/// The queue as dispatch sees it.
pub struct Relay {
    queue: Arc<Queue>,
    member_events: bool,
}

impl Relay {
    /// Builds the channel and starts its senders (inside a tokio runtime).
    pub fn start(settings: &RelaySettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
        let webhook = match &settings.url {
            None => None,
            Some(url) => {
                if !url.is_https() && !settings.dangerous_allow_plain_http {
                    return Err(BuildError::new(
                        "engine.channels.relay.url",
                        "must be an https URL (dangerous_allow_plain_http allows http, for tests only)",
                    ));
                }
                let path = settings.secret_file.as_ref().ok_or_else(|| {
                    BuildError::new("engine.channels.relay.secret_file", "must be set when url is set")
                })?;
                let contents = std::fs::read(path).map_err(|e| {
                    BuildError::new("engine.channels.relay.secret_file", format!("cannot read the file: {e}"))
                })?;
                let secret = WebhookSecret::from_file_contents(&contents)
                    .map_err(|rule| BuildError::new("engine.channels.relay.secret_file", rule))?;
                let tls = client_tls_config(&settings.extra_ca_files)
                    .map_err(|e| BuildError::new("engine.channels.relay.extra_ca_files", e))?;
                let options = PoolOptions {
                    connections: settings.connections,
                    max_in_flight: MAX_IN_FLIGHT,
                    rate_limit_per_second: 0,
                    client: CLIENT_OPTIONS,
                };
                // Trusted configuration: the system resolver, not PUSH-256's checks.
                let metrics = PoolMetrics::new(&ctx.metrics, Channel::Relay);
                let dialer = ctx.dialer(Channel::Relay, Resolver::system());
                let pool = if settings.dangerous_allow_plain_http {
                    Pool::allowing_plain_http(&tls, options, dialer, metrics)
                } else {
                    Pool::new(&tls, options, dialer, metrics)
                };
                Some(Webhook { url: url.clone(), secret, pool })
            }
        };
        let counters = Counters::new(&ctx.metrics);
        let queue = Arc::new(Queue::new(settings.queue_capacity.get(), counters.clone()));
        Senders {
            queue: queue.clone(),
            webhook,
            log: ctx.push_log.clone(),
            hub_id: settings.hub_id.clone(),
            minimal: settings.minimal,
            timeout: settings.timeout,
            store: ctx.store.clone(),
            counters,
            metrics: ctx.metrics.clone(),
        }
        .start(settings.senders.get());
        Ok(Self { queue, member_events: settings.member_events })
    }
}

impl Sink for Relay {
    fn open(&self) -> Box<dyn Batch> {
        Box::new(RelayBatch {
            hold: self.queue.open_hold(),
            queue: self.queue.clone(),
            member_events: self.member_events,
            devices: Vec::new(),
        })
    }
}

/// The pushes of one dispatch read (003 §4: "queued at once, so the pushes
/// of one write coalesce per device before any of them is sent").
struct RelayBatch {
    queue: Arc<Queue>,
    hold: HoldId,
    member_events: bool,
    devices: Vec<RecipientId>,
}

impl Batch for RelayBatch {
    /// Queued at once: nothing to wait for.
    fn take(&mut self, deliveries: Vec<Delivery>) -> Handoff {
        for delivery in deliveries {
            self.push(delivery);
        }
        Box::pin(std::future::ready(Ok(())))
    }
}

impl RelayBatch {
    fn push(&mut self, delivery: Delivery) {
        let Delivery { envelope, recipient, mut first_attempt, .. } = delivery;
        // A pending copy of an abandoned page: the replay sends it.
        if first_attempt.as_ref().is_some_and(|f| !f.accept()) {
            return;
        }
        // 003 §1: a device whose registration was removed keeps its
        // subscriptions and gets no push until it registers again.
        if matches!(recipient.target, DeliveryTarget::Relay(None)) {
            if let Some(first) = first_attempt {
                first.settle();
            }
            return;
        }
        let notifications = event::notifications(&envelope, self.member_events);
        let last = notifications.len().saturating_sub(1);
        for (i, n) in notifications.into_iter().enumerate() {
            // The latch goes with the last: the device's pushes of one
            // envelope coalesce into it before any is sent.
            let first = if i == last { first_attempt.take() } else { None };
            self.queue.enqueue(RelayPush::new(recipient.clone(), n, first), Some(self.hold));
        }
        // A Proposal is never pushed (003 §4): nothing to wait for.
        if let Some(first) = first_attempt {
            first.settle();
        }
        self.devices.push(recipient.id);
    }
}

impl Drop for RelayBatch {
    fn drop(&mut self) {
        self.queue.release(self.hold, &self.devices);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn exposed(url: Option<&str>) -> String {
        let dir = tempfile::tempdir().unwrap();
        let secret_file = dir.path().join("secret");
        std::fs::write(&secret_file, "0123456789abcdef0123").unwrap();
        let settings = RelaySettings {
            url: url.map(|u| RelayUrl::try_from(u.to_owned()).unwrap()),
            secret_file: Some(secret_file),
            ..RelaySettings::default()
        };
        let metrics = Arc::new(Metrics::new());
        Relay::start(&settings, &ChannelContext::new(metrics.clone())).unwrap();
        metrics.render()
    }

    #[tokio::test]
    async fn a_relay_with_a_url_has_its_attempt_series_at_zero_from_the_start() {
        let exposed = exposed(Some("https://push.example/hook"));
        crate::metrics::assert_exposed(
            &exposed,
            &[
                r#"fanout_attempts_total{channel="relay",outcome="delivered"} 0"#,
                r#"fanout_attempts_total{channel="relay",outcome="transient"} 0"#,
                r#"fanout_attempts_total{channel="relay",outcome="terminal"} 0"#,
                r#"fanout_attempts_total{channel="relay",outcome="rejected"} 0"#,
                r#"fanout_in_flight_attempts{channel="relay"} 0"#,
                r#"fanout_provider_latency_seconds_count{channel="relay"} 0"#,
                r#"fanout_retry_delay_seconds_count{channel="relay"} 0"#,
                r#"fanout_provider_connections_opened_total{channel="relay"} 0"#,
                r#"fanout_relay_pushes_total{event="failed"} 0"#,
            ],
        );
        // The relay never answers mismatch, and its deliveries are not the workers'.
        assert!(!exposed.contains(r#"outcome="mismatch""#), "{exposed}");
        assert!(!exposed.contains("fanout_deliveries_total{"), "{exposed}");
    }

    #[tokio::test]
    async fn a_relay_without_a_url_makes_no_attempts_and_has_no_attempt_series() {
        let exposed = exposed(None);
        assert!(exposed.contains(r#"fanout_relay_pushes_total{event="skipped"} 0"#), "{exposed}");
        assert!(!exposed.contains(r#"channel="relay""#), "{exposed}");
    }
}
