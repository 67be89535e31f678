//! Delivery workers: per-recipient delivery state, partitioned by recipient id.
//! Each worker owns its attempts in flight, its retry timers (one timer wheel
//! per worker, not a task per delivery) and the outcome handling of section 7.

mod breaker;
mod detach;
pub mod history;
mod lanes;
mod parking;
mod series;
mod settings;
mod worker;

use std::sync::Arc;

use tokio::sync::mpsc;

pub use breaker::BreakerRules;
pub use history::{History, HistorySettings};
pub use parking::Parking;
pub use settings::DeliverySettings;
pub use worker::WorkerContext;

use crate::page::{Batch, Handoff, Sink, SinkStopped};
pub use crate::page::{Delivery, FirstAttempt, FirstAttemptLatch};

/// The senders of every worker's bounded queue.
#[derive(Clone)]
pub struct DeliveryWorkers {
    queues: Arc<Vec<mpsc::Sender<Vec<Delivery>>>>,
    parking: Arc<Parking>,
    /// fanout_delivery_queue_batches: incremented here, decremented by the worker.
    queued: prometheus::IntGauge,
}

impl DeliveryWorkers {
    /// Starts `ctx.settings.workers` workers. Each ends when every clone of
    /// the returned `DeliveryWorkers` is dropped and its work has finished.
    pub fn start(ctx: Arc<WorkerContext>) -> (Self, Vec<tokio::task::JoinHandle<()>>) {
        for provider in ctx.channels.providers() {
            series::initialise(&ctx.metrics, provider.channel());
        }
        let (queues, handles) = (0..ctx.settings.workers.get())
            .map(|_| {
                let (tx, rx) = mpsc::channel(ctx.settings.queue_batches.get());
                (tx, tokio::spawn(worker::run(ctx.clone(), rx)))
            })
            .unzip::<_, _, Vec<_>, Vec<_>>();
        let workers =
            Self { queues: Arc::new(queues), parking: ctx.parking.clone(), queued: ctx.metrics.delivery_queue.clone() };
        (workers, handles)
    }

    /// The channels' breakers and parked deliveries the workers share with
    /// dispatch.
    pub fn parking(&self) -> &Arc<Parking> {
        &self.parking
    }

    /// Hands a batch to the workers that own its recipients. Waits while a
    /// worker's queue is full: this is the backpressure on the shard actors.
    pub async fn submit(&self, batch: Vec<Delivery>) -> Result<(), SinkStopped> {
        let n = self.queues.len();
        let mut parts: Vec<Vec<Delivery>> = (0..n).map(|_| Vec::new()).collect();
        for d in batch {
            parts[d.recipient.id.partition(n)].push(d);
        }
        for (queue, part) in self.queues.iter().zip(parts) {
            if !part.is_empty() {
                queue.send(part).await.map_err(|_| SinkStopped)?;
                self.queued.inc();
            }
        }
        Ok(())
    }
}

/// The workers are the sink of every channel that has a provider.
impl Sink for DeliveryWorkers {
    fn open(&self) -> Box<dyn Batch> {
        Box::new(self.clone())
    }
}

impl Batch for DeliveryWorkers {
    fn take(&mut self, deliveries: Vec<Delivery>) -> Handoff {
        let workers = self.clone();
        Box::pin(async move { workers.submit(deliveries).await })
    }
}
