//! The publisher side of a run, over gRPC: registers the scenario's webhook
//! recipients and their subscriptions with bounded concurrency, then
//! publishes its envelopes (a burst, or a steady rate) and tells the
//! collector each envelope's sequence id as its Publish RPC returns.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use fanout_proto::v1 as pb;
use fanout_proto::v1::notification_service_client::NotificationServiceClient;
use fanout_proto::v1::publish_service_client::PublishServiceClient;
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::collector::{Collector, Percentiles, latency_histogram, webpush_endpoint};
use super::ids::RunIds;
use super::progress::Progress;
use super::scenario::{Envelopes, Plan, ScenarioChannel, Setup};

/// A few gRPC connections to the engine, used round-robin.
#[derive(Clone)]
pub struct Grpc {
    channels: Vec<Channel>,
    next: Arc<AtomicUsize>,
}

impl Grpc {
    /// Connects `connections` channels, retrying until `timeout`.
    pub async fn connect(addr: SocketAddr, connections: usize, timeout: Duration) -> anyhow::Result<Grpc> {
        let deadline = Instant::now() + timeout;
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(60));
        let mut channels = Vec::new();
        while channels.len() < connections.max(1) {
            match endpoint.connect().await {
                Ok(channel) => channels.push(channel),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| format!("connecting to the engine's gRPC at {addr}"));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
        Ok(Grpc { channels, next: Arc::new(AtomicUsize::new(0)) })
    }

    fn channel(&self) -> Channel {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.channels.len();
        self.channels[i].clone()
    }

    fn notifications(&self) -> NotificationServiceClient<Channel> {
        NotificationServiceClient::new(self.channel())
    }

    fn publisher(&self) -> PublishServiceClient<Channel> {
        PublishServiceClient::new(self.channel())
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SetupStats {
    pub recipients: u64,
    pub subscriptions: u64,
    /// Register and UpdateSubscriptions calls.
    pub rpcs: u64,
    pub seconds: f64,
    pub recipients_per_second: f64,
    pub rpcs_per_second: f64,
}

/// Calls `f` up to three times (with a short pause) before giving up.
async fn with_retries<T, F, Fut>(what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, tonic::Status>>,
{
    let mut last = None;
    for attempt in 0..3 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
        }
        match f().await {
            Ok(v) => return Ok(v),
            Err(status) => last = Some(status),
        }
    }
    let status = last.expect("three attempts were made");
    bail!("{what} failed: {} {}", status.code(), status.message())
}

/// Registers every recipient (webhook URL `urls[r % urls.len()]`, its derived
/// signing key; or its device token, or its Web Push subscription) and
/// subscribes it to its topics.
pub async fn setup(
    grpc: &Grpc,
    plan: &Arc<Plan>,
    ids: RunIds,
    urls: &[String],
    settings: &Setup,
    progress: &Progress,
    timeout: Duration,
) -> anyhow::Result<SetupStats> {
    progress.phase("register", u64::from(plan.recipients));
    let started = Instant::now();
    let rpcs = Arc::new(AtomicUsize::new(0));
    let per_request = settings.subscriptions_per_request;
    let work = futures::stream::iter(0..plan.recipients)
        .map(|r| {
            let (grpc, plan, rpcs) = (grpc.clone(), plan.clone(), rpcs.clone());
            let url = urls[r as usize % urls.len()].clone();
            async move {
                let (id, secret) = (ids.recipient_id(r).to_vec(), ids.secret(r).to_vec());
                // Relay and APNs scenarios: the device token is the recipient
                // id in hex, so the collector knows the device from the request.
                let delivery = match plan.channel {
                    ScenarioChannel::Relay => pb::register_request::Delivery::Relay(pb::RelayDelivery {
                        provider: "apns".into(),
                        token: hex::encode(&id),
                        ..Default::default()
                    }),
                    ScenarioChannel::Apns => {
                        pb::register_request::Delivery::Apns(pb::ApnsDelivery { token: hex::encode(&id) })
                    }
                    // Web Push: the endpoint names the recipient, and the keys
                    // are derived from the run's ids so the receiver decrypts.
                    ScenarioChannel::WebPush => {
                        let subscriber = ids.webpush_subscriber(r);
                        pb::register_request::Delivery::Webpush(pb::WebPushDelivery {
                            endpoint: webpush_endpoint(&url, &id),
                            p256dh: subscriber.p256dh(),
                            auth: subscriber.auth().to_vec(),
                        })
                    }
                    ScenarioChannel::Http => pb::register_request::Delivery::Http(pb::HttpDelivery {
                        url,
                        signing_key: ids.signing_key(r).to_vec(),
                    }),
                };
                let register = pb::RegisterRequest {
                    recipient_id: id.clone(),
                    recipient_secret: secret.clone(),
                    delivery: Some(delivery),
                };
                with_retries("Register", || {
                    let (mut client, request) = (grpc.notifications(), register.clone());
                    async move { client.register(request).await }
                })
                .await?;
                rpcs.fetch_add(1, Ordering::Relaxed);
                let topics: Vec<u32> = plan.topics_of(r).collect();
                for chunk in topics.chunks(per_request) {
                    let update = pb::UpdateSubscriptionsRequest {
                        recipient_id: id.clone(),
                        recipient_secret: secret.clone(),
                        adds: chunk
                            .iter()
                            .map(|t| pb::Subscription {
                                topic: ids.topic(*t),
                                hmac_epoch_base: 0,
                                hmac_keys: vec![],
                                include_commits: false,
                            })
                            .collect(),
                        removes: vec![],
                    };
                    with_retries("UpdateSubscriptions", || {
                        let (mut client, request) = (grpc.notifications(), update.clone());
                        async move { client.update_subscriptions(request).await }
                    })
                    .await?;
                    rpcs.fetch_add(1, Ordering::Relaxed);
                }
                progress.add(1);
                anyhow::Ok(topics.len() as u64)
            }
        })
        .buffer_unordered(settings.concurrency);
    let subscriptions = tokio::time::timeout(timeout, async move {
        let mut work = std::pin::pin!(work);
        let mut subscriptions = 0;
        while let Some(result) = work.next().await {
            subscriptions += result?;
        }
        anyhow::Ok(subscriptions)
    })
    .await
    .with_context(|| format!("setup did not finish within {timeout:?} (timeouts.setup_seconds)"))??;
    let seconds = started.elapsed().as_secs_f64();
    let rpcs = rpcs.load(Ordering::Relaxed) as u64;
    Ok(SetupStats {
        recipients: u64::from(plan.recipients),
        subscriptions,
        rpcs,
        seconds,
        recipients_per_second: f64::from(plan.recipients) / seconds.max(1e-9),
        rpcs_per_second: rpcs as f64 / seconds.max(1e-9),
    })
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct PublishStats {
    pub envelopes: u64,
    pub stored: u64,
    /// Envelopes refused, or lost with a failed RPC (never retried: that could publish twice).
    pub errors: u64,
    pub first_error: Option<String>,
    /// From the first Publish RPC sent to the last one answered.
    pub seconds: f64,
    /// Envelopes stored per second of `seconds`: the ingest rate of a burst
    /// (issue 18), the achieved rate of a steady run.
    pub envelopes_per_second: f64,
    /// Envelopes per Publish RPC, and RPCs in flight at once.
    pub batch_size: usize,
    pub concurrency: usize,
    /// Duration of the Publish RPCs themselves.
    pub rpc_latency: Percentiles,
}

/// What the publish tasks share.
struct Shared {
    stored: u64,
    errors: u64,
    first_error: Option<String>,
    rpc_us: Histogram<u64>,
}

/// Publishes envelopes `start..end` in one RPC and reports them to the collector.
async fn publish_batch(
    grpc: Grpc,
    plan: Arc<Plan>,
    ids: RunIds,
    collector: Arc<Collector>,
    shared: Arc<Mutex<Shared>>,
    progress: Arc<Progress>,
    (start, end): (u64, u64),
) {
    let envelopes = (start..end)
        .map(|e| pb::Envelope {
            topic: ids.topic(plan.topic_of_envelope(e)),
            kind: pb::EnvelopeKind::Application as i32,
            should_push: true,
            sender_hmac: vec![],
            data: b"loadtest ciphertext".to_vec(),
            ..pb::Envelope::default()
        })
        .collect();
    let sent = Instant::now();
    let result = grpc.publisher().publish(pb::PublishRequest { envelopes }).await;
    let returned = Instant::now();
    let mut shared = shared.lock().unwrap_or_else(|p| p.into_inner());
    shared.rpc_us.saturating_record(returned.duration_since(sent).as_micros() as u64);
    match result {
        Ok(response) => {
            for (i, r) in response.into_inner().results.into_iter().enumerate() {
                match r.result {
                    Some(pb::publish_result::Result::SequenceId(seq)) => {
                        collector.envelope_published(plan.topic_of_envelope(start + i as u64), seq, returned);
                        shared.stored += 1;
                    }
                    other => {
                        shared.errors += 1;
                        shared.first_error.get_or_insert_with(|| format!("{other:?}"));
                    }
                }
            }
        }
        Err(status) => {
            shared.errors += end - start;
            shared.first_error.get_or_insert_with(|| format!("{} {}", status.code(), status.message()));
        }
    }
    progress.add(end - start);
}

/// Publishes the plan's envelopes: all at once with `concurrency` RPCs in
/// flight (burst), or at `rate` per second in small batches (steady).
pub async fn publish(
    grpc: &Grpc,
    plan: &Arc<Plan>,
    ids: RunIds,
    settings: &Envelopes,
    collector: &Arc<Collector>,
    progress: &Arc<Progress>,
    timeout: Duration,
) -> anyhow::Result<PublishStats> {
    progress.phase("publish", plan.envelopes);
    let shared = Arc::new(Mutex::new(Shared { stored: 0, errors: 0, first_error: None, rpc_us: latency_histogram() }));
    let started = Instant::now();
    collector.mark_start(started);
    let batch = |range| {
        publish_batch(grpc.clone(), plan.clone(), ids, collector.clone(), shared.clone(), progress.clone(), range)
    };
    let size = settings.batch_size as u64;
    let run = async {
        match plan.rate {
            None => {
                let ranges =
                    (0..plan.envelopes.div_ceil(size)).map(|b| (b * size, ((b + 1) * size).min(plan.envelopes)));
                futures::stream::iter(ranges).map(batch).buffer_unordered(settings.concurrency).collect::<()>().await;
            }
            Some(rate) => {
                // Every 5 ms, publish what the schedule says is due; at most
                // `concurrency` RPCs in flight (the schedule slips if the engine is slower).
                let permits = Arc::new(tokio::sync::Semaphore::new(settings.concurrency));
                let mut tasks = tokio::task::JoinSet::new();
                let mut next = 0u64;
                let mut ticker = tokio::time::interval(Duration::from_millis(5));
                while next < plan.envelopes {
                    ticker.tick().await;
                    let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(plan.envelopes);
                    while next < due {
                        let end = (next + size).min(due);
                        let permit = permits.clone().acquire_owned().await.expect("semaphore is never closed");
                        let work = batch((next, end));
                        tasks.spawn(async move {
                            work.await;
                            drop(permit);
                        });
                        next = end;
                    }
                    while tasks.try_join_next().is_some() {}
                }
                while tasks.join_next().await.is_some() {}
            }
        }
    };
    tokio::time::timeout(timeout, run)
        .await
        .with_context(|| format!("publishing did not finish within {timeout:?}"))?;
    let seconds = started.elapsed().as_secs_f64();
    let shared = shared.lock().unwrap_or_else(|p| p.into_inner());
    Ok(PublishStats {
        envelopes: plan.envelopes,
        stored: shared.stored,
        errors: shared.errors,
        first_error: shared.first_error.clone(),
        seconds,
        envelopes_per_second: shared.stored as f64 / seconds.max(1e-9),
        batch_size: settings.batch_size,
        concurrency: settings.concurrency,
        rpc_latency: Percentiles::from_histogram_us(&shared.rpc_us),
    })
}

impl PublishStats {
    /// The summary's publish line.
    pub fn line(&self) -> String {
        format!(
            "{} stored, {} errors in {:.2} s: {:.0} envelopes/s (batches of {}, {} RPCs in flight); Publish RPC p50 {:.1} ms p99 {:.1} ms",
            self.stored,
            self.errors,
            self.seconds,
            self.envelopes_per_second,
            self.batch_size,
            self.concurrency,
            self.rpc_latency.p50_ms,
            self.rpc_latency.p99_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_line_gives_the_ingest_rate_and_batching() {
        let stats = PublishStats {
            envelopes: 100_000,
            stored: 100_000,
            seconds: 2.5,
            envelopes_per_second: 40_000.0,
            batch_size: 100,
            concurrency: 64,
            rpc_latency: Percentiles { p50_ms: 3.3, p99_ms: 12.0, ..Percentiles::default() },
            ..PublishStats::default()
        };
        assert_eq!(
            stats.line(),
            "100000 stored, 0 errors in 2.50 s: 40000 envelopes/s (batches of 100, 64 RPCs in flight); \
             Publish RPC p50 3.3 ms p99 12.0 ms"
        );
        let json = serde_json::to_value(&stats).unwrap();
        assert_eq!(json["envelopes_per_second"], 40_000.0);
        assert_eq!((json["batch_size"].as_u64(), json["concurrency"].as_u64()), (Some(100), Some(64)));
    }
}
