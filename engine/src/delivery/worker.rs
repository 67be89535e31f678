use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::time::DelayQueue;

use super::Delivery;
use crate::channel::{Channels, Outcome, Push};
use crate::clock::unix_now_ns;
use crate::domain::Channel;
use crate::metrics::Metrics;
use crate::settings::{ATTEMPT_TIMEOUT, DeliverySettings};
use crate::store::Store;

/// What every worker shares (read-only).
pub struct WorkerContext {
    pub settings: DeliverySettings,
    pub max_attempts: u32,
    pub channels: Channels,
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
}

/// A worker's loop: take batches while under the in-flight bound, collect
/// answers, and re-attempt from the timer wheel. Ends when its queue is closed
/// and nothing is in flight or waiting.
pub(super) async fn run(ctx: Arc<WorkerContext>, mut queue: mpsc::Receiver<Vec<Delivery>>) {
    let mut in_flight: JoinSet<(Delivery, Outcome)> = JoinSet::new();
    let mut retries: DelayQueue<Delivery> = DelayQueue::new();
    let mut queue_open = true;
    loop {
        tokio::select! {
            batch = queue.recv(), if queue_open
                && in_flight.len() < ctx.settings.max_in_flight_per_worker
                && retries.len() < ctx.settings.max_retrying_per_worker => {
                match batch {
                    Some(batch) => {
                        ctx.metrics.delivery_queue.dec();
                        batch.into_iter().for_each(|d| attempt(&ctx, &mut in_flight, d));
                    }
                    None => queue_open = false,
                }
            }
            Some(done) = in_flight.join_next() => {
                // A panicking attempt loses its delivery; its window is then replayed.
                if let Ok((delivery, outcome)) = done {
                    settle(&ctx, delivery, outcome, &mut retries);
                }
            }
            Some(expired) = std::future::poll_fn(|cx| retries.poll_expired(cx)) => {
                ctx.metrics.retry_queue.dec();
                attempt(&ctx, &mut in_flight, expired.into_inner());
            }
            else => break,
        }
        if !queue_open && in_flight.is_empty() && retries.is_empty() {
            break;
        }
    }
}

fn attempt(ctx: &Arc<WorkerContext>, in_flight: &mut JoinSet<(Delivery, Outcome)>, delivery: Delivery) {
    let ctx = ctx.clone();
    in_flight.spawn(async move {
        let channel = delivery.recipient.target.channel();
        let Some(provider) = ctx.channels.get(channel) else {
            // The channel's table was removed: fail without a provider request.
            return (delivery, Outcome::Rejected);
        };
        let gauge = ctx.metrics.in_flight.with_label_values(&[channel.as_str()]);
        gauge.inc();
        let started = Instant::now();
        let push = Push { recipient: &delivery.recipient, envelope: &delivery.envelope };
        let outcome = tokio::time::timeout(ATTEMPT_TIMEOUT, provider.send(push))
            .await
            .unwrap_or(Outcome::transient(timeout_delay(channel)));
        gauge.dec();
        ctx.metrics
            .provider_latency
            .with_label_values(&[channel.as_str()])
            .observe(started.elapsed().as_secs_f64());
        (delivery, outcome)
    });
}

/// The delay of a timed-out attempt, per the outcome tables.
fn timeout_delay(channel: Channel) -> std::time::Duration {
    match channel {
        Channel::Fcm => std::time::Duration::from_secs(10),
        Channel::Apns | Channel::Http => std::time::Duration::from_secs(1),
    }
}

/// Applies an attempt's outcome (section 7): retry a transient one up to
/// max_attempts, delete on terminal (PUSH-234), stop otherwise.
fn settle(ctx: &Arc<WorkerContext>, mut delivery: Delivery, outcome: Outcome, retries: &mut DelayQueue<Delivery>) {
    let channel = delivery.recipient.target.channel().as_str();
    delivery.attempts += 1;
    ctx.metrics.attempts.with_label_values(&[channel, outcome.label()]).inc();
    if let Some(latch) = delivery.first_attempt.take() {
        latch.count_down();
        let waited = (unix_now_ns() - delivery.envelope.server_ts_ns).max(0) as f64 / 1e9;
        ctx.metrics.publish_to_attempt.with_label_values(&[channel]).observe(waited);
    }
    let final_outcome = match outcome {
        Outcome::Transient { delay, gone } => {
            delivery.all_gone &= gone;
            if delivery.attempts < ctx.max_attempts {
                ctx.metrics.retries.with_label_values(&[channel]).inc();
                ctx.metrics.retry_delay.with_label_values(&[channel]).observe(delay.as_secs_f64());
                ctx.metrics.retry_queue.inc();
                retries.insert(delivery, delay);
                return;
            }
            // HTTPS: terminal when every one of max_attempts answered 404/410.
            if delivery.all_gone { Outcome::Terminal } else { outcome }
        }
        other => other,
    };
    let label = match final_outcome {
        Outcome::Transient { .. } => "exhausted",
        other => other.label(),
    };
    ctx.metrics.deliveries.with_label_values(&[channel, label]).inc();
    if final_outcome == Outcome::Terminal {
        // PUSH-234: only if the stored registration is still the one we used.
        let ctx = ctx.clone();
        let recipient = delivery.recipient.clone();
        tokio::spawn(async move {
            match ctx.store.delete_recipient_if_unchanged(&recipient).await {
                Ok(true) => ctx.metrics.recipients_deleted.with_label_values(&["terminal"]).inc(),
                Ok(false) => {}
                // Counted and logged by the instrumented store.
                Err(_) => {}
            }
        });
    }
}
