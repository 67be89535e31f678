//! The senders (003 §4: `senders` of them, four by default) and the retry
//! timer: each sender takes a push from the queue, makes one attempt, and
//! applies §2.4's answer; retries wait in one timer wheel, not a task each.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::time::DelayQueue;

use super::body::{BodyInput, webhook_body};
use super::classify::{Answer, NO_ANSWER, classify, next_delay};
use super::payload::{Payload, WEBHOOK_PAYLOAD_LIMIT};
use super::queue::{Counters, Queue, Taken};
use super::settings::{HubId, RelayUrl};
use super::signing::{HEADER_DELIVERY, HEADER_SIGNATURE, WebhookSecret, signature_header};
use crate::channel::push_log::PushLog;
use crate::domain::Timestamp;
use crate::domain::{Channel, DeliveryTarget};
use crate::metrics::Metrics;
use crate::store::{RegistrationRemoval, Store};
use crate::transport::pool::Pool;

/// Where webhook pushes go; absent when no URL is configured (pushes skipped).
pub struct Webhook {
    pub url: RelayUrl,
    pub secret: WebhookSecret,
    pub pool: Pool,
}

/// What every sender shares.
pub struct Senders {
    pub queue: Arc<Queue>,
    pub webhook: Option<Webhook>,
    pub log: Arc<PushLog>,
    pub hub_id: HubId,
    pub minimal: bool,
    pub timeout: Duration,
    pub store: Option<Arc<dyn Store>>,
    pub counters: Counters,
    pub metrics: Arc<Metrics>,
}

impl Senders {
    /// Spawns `count` senders and the retry timer. They run for the life of
    /// the process: the queue is in memory, and pushes are hints (003: "may
    /// be coalesced, dropped or duplicated"); what had no first attempt is
    /// above the checkpoint and sent again after a restart.
    pub fn start(self, count: usize) {
        if self.webhook.is_some() {
            self.initialise_metrics();
        }
        let (retry_tx, retry_rx) = mpsc::unbounded_channel();
        let senders = Arc::new(self);
        tokio::spawn(retry_timer(senders.queue.clone(), retry_rx));
        for _ in 0..count {
            let (senders, retry_tx) = (senders.clone(), retry_tx.clone());
            tokio::spawn(async move {
                loop {
                    let taken = senders.queue.next().await;
                    senders.attempt(taken, &retry_tx).await;
                }
            });
        }
    }

    async fn attempt(&self, mut taken: Taken, retries: &mpsc::UnboundedSender<(Taken, Duration)>) {
        let push = &mut taken.push;
        let id = push.recipient.id;
        let recipient = push.recipient.clone();
        // A device without a registration (003 §1: removed) gets no push.
        let DeliveryTarget::Relay(Some(registration)) = &recipient.target else {
            push.settle();
            self.queue.finished(id);
            return;
        };
        let sent_at_ms = *push.sent_at_ms.get_or_insert(Timestamp::now().as_millis());
        push.attempts += 1;
        // 003 §4: provider `log` goes to the log provider, never the webhook.
        if registration.is_log() {
            super::log::record(&self.log, push, registration.token(), self.minimal, sent_at_ms);
            self.counters.sent.inc();
            push.settle();
            self.queue.finished(id);
            return;
        }
        let Some(webhook) = &self.webhook else {
            tracing::debug!("no relay webhook URL configured: push skipped");
            self.counters.skipped.inc();
            push.settle();
            self.queue.finished(id);
            return;
        };
        let payload = Payload::new(&push.notification, self.minimal, WEBHOOK_PAYLOAD_LIMIT);
        let body = webhook_body(&BodyInput {
            hub_id: self.hub_id.as_str(),
            delivery_id: &push.delivery_id,
            sent_at_ms,
            registration,
            priority: push.priority,
            payload: &payload,
        });
        // 003 §2.2: the timestamp of this attempt is bound into the MAC.
        let signature = signature_header(&webhook.secret, Timestamp::now().as_secs(), &body);
        let request = http::Request::post(webhook.url.uri().clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(HEADER_SIGNATURE, signature)
            .header(HEADER_DELIVERY, push.delivery_id.as_str())
            .body(Bytes::from(body));
        let channel = Channel::Relay.as_str();
        let (answer, status) = match request {
            Err(_) => (Answer::Permanent, None),
            Ok(request) => {
                let gauge = self.metrics.in_flight.with_label_values(&[channel]);
                gauge.inc();
                let started = Instant::now();
                // `timeout_seconds` (at most 10 s) bounds the attempt once it has
                // its in-flight slot: waiting for one is not an attempt.
                let answer = webhook.pool.send_within(request, self.timeout).await;
                gauge.dec();
                self.metrics.provider_latency.with_label_values(&[channel]).observe(started.elapsed().as_secs_f64());
                match answer {
                    Ok(a) => {
                        let retry_after = a.headers.get(http::header::RETRY_AFTER).and_then(|v| v.to_str().ok());
                        (classify(a.status.as_u16(), retry_after, SystemTime::now()), Some(a.status.as_u16()))
                    }
                    // 003 §2.4: a timeout or a transport error is retried.
                    Err(_) => (NO_ANSWER, None),
                }
            }
        };
        self.metrics.attempts.with_label_values(&[channel, label(answer)]).inc();
        push.settle(); // PUSH-257: the first attempt has its answer.
        match answer {
            Answer::Delivered => {
                self.counters.sent.inc();
                self.queue.finished(id);
            }
            Answer::InvalidToken => {
                self.queue.finished(id);
                self.remove_if_unchanged(recipient.clone());
            }
            Answer::Permanent => {
                self.counters.failed.inc();
                tracing::warn!(status, "the push server refused a push; dropped, registration kept");
                self.queue.finished(id);
            }
            Answer::Retry { retry_after } => match next_delay(push.attempts, retry_after) {
                None => {
                    self.counters.failed.inc();
                    tracing::warn!(status, attempts = push.attempts, "relay push failed on every attempt; dropped");
                    self.queue.finished(id);
                }
                Some(delay) => {
                    if let Some(taken) = self.queue.failed_retryably(taken) {
                        self.counters.retried.inc();
                        self.metrics.retry_delay.with_label_values(&[channel]).observe(delay.as_secs_f64());
                        let _ = retries.send((taken, delay));
                    }
                }
            },
        }
    }

    /// The series the webhook's attempts count, at zero before the first:
    /// an outage of the push server at start-up must show in `increase()`.
    fn initialise_metrics(&self) {
        let channel = Channel::Relay.as_str();
        for answer in [Answer::Delivered, Answer::InvalidToken, NO_ANSWER, Answer::Permanent] {
            self.metrics.attempts.with_label_values(&[channel, label(answer)]);
        }
        self.metrics.in_flight.with_label_values(&[channel]);
        self.metrics.provider_latency.with_label_values(&[channel]);
        self.metrics.retry_delay.with_label_values(&[channel]);
    }

    /// 003 §2.4: remove the registration unless the device registered a
    /// different provider or token meanwhile. Only the registration goes
    /// (§1): the device keeps its subscriptions, and a later PUT resumes its
    /// pushes. Counted once the store has answered, so the count follows
    /// the removal.
    fn remove_if_unchanged(&self, recipient: Arc<crate::domain::Recipient>) {
        let counted = self.counters.invalid_token.clone();
        let Some(store) = self.store.clone() else {
            counted.inc();
            return;
        };
        tokio::spawn(async move {
            let removal = RegistrationRemoval::Invalid { sent: recipient };
            if let Err(e) = store.remove_relay_registration(&removal).await {
                tracing::warn!(error = %e, "could not remove a relay registration the push server declared invalid");
            }
            counted.inc();
        });
    }
}

fn label(answer: Answer) -> &'static str {
    match answer {
        Answer::Delivered => "delivered",
        Answer::InvalidToken => "terminal",
        Answer::Retry { .. } => "transient",
        Answer::Permanent => "rejected",
    }
}

/// One timer wheel for every waiting retry. The channel is unbounded, but
/// what waits in it is bounded by the queue (`failed_retryably` refuses
/// beyond `capacity` retries).
async fn retry_timer(queue: Arc<Queue>, mut incoming: mpsc::UnboundedReceiver<(Taken, Duration)>) {
    let mut timers: DelayQueue<Taken> = DelayQueue::new();
    let mut open = true;
    loop {
        tokio::select! {
            next = incoming.recv(), if open => match next {
                Some((taken, delay)) => {
                    timers.insert(taken, delay);
                }
                None => open = false,
            },
            Some(expired) = std::future::poll_fn(|cx| timers.poll_expired(cx)) => {
                queue.retry_due(expired.into_inner());
            }
            else => break,
        }
    }
}
