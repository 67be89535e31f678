//! The delivery workers' own CPU per attempt, without a
//! network or a receiver: 1,000,000 deliveries through `DeliveryWorkers`
//! (eight workers, 1,000 attempts in flight in all, as for one channel of
//! 1,000 slots) to a provider that answers `Delivered` after one yield, so
//! every attempt waits once as a network send does. Per attempt that is the
//! queue hand-off, the attempt's future and its watchdog timer, the outcome,
//! the first-attempt latch and the metrics: the engine's share of a delivery
//! that the harness's runs cannot separate from their receiver's noise.
//!
//! Two providers: one whose boxed future is small, and one whose future is
//! about as large as the webhook channel's (2 KiB), above the size glibc's
//! allocator serves from its per-thread caches. The small one runs twice:
//! without and with the delivery history (`engine.history`), whose
//! difference is what keeping the history costs per delivery.
//!
//! ```sh
//! cargo bench -p fanout-engine --bench delivery_worker
//! ROUNDS=9 DELIVERIES=2000000 cargo bench -p fanout-engine --bench delivery_worker
//! ```
//!
//! Each round prints wall time and the process's CPU time (utime + stime
//! from /proc/self/stat) per delivery; the summary gives their medians.
//! Compare two builds by their medians, on an otherwise idle machine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fanout_engine::channel::{Channels, Outcome, Provider, Push, Refusal};
use fanout_engine::delivery::{
    Delivery, DeliverySettings, DeliveryWorkers, FirstAttempt, FirstAttemptLatch, History, HistorySettings, Parking,
    WorkerContext,
};
use fanout_engine::domain::{
    Channel, DeliveryTarget, EnvelopeKind, Recipient, RecipientId, SecretHash, ShardId, StoredEnvelope, Topic,
};
use fanout_engine::metrics::Metrics;
use fanout_engine::store::{RedbStore, Store};

/// Deliveries per page (one first-attempt latch each), as a window's page.
const PAGE: usize = 1_000;
/// Distinct recipients, spread over the workers by id.
const RECIPIENTS: usize = 1_000;
/// Attempts in flight over all workers: one channel of 1,000 slots.
const CHANNEL_IN_FLIGHT: usize = 1_000;
/// About the size of the webhook channel's send future.
const LARGE_FUTURE_BYTES: usize = 2_048;

/// Answers `Delivered` after one yield; with `LARGE`, its future holds a
/// buffer of `LARGE_FUTURE_BYTES` across the yield.
struct Answers<const LARGE: bool>;

#[async_trait]
impl<const LARGE: bool> Provider for Answers<LARGE> {
    fn channel(&self) -> Channel {
        Channel::Apns
    }
    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        let Push::Envelope { recipient, .. } = push else { return Err(Refusal::Unsupported) };
        if LARGE {
            let mut state = [0u8; LARGE_FUTURE_BYTES];
            state[0] = recipient.id.as_bytes()[0];
            tokio::task::yield_now().await;
            std::hint::black_box(&mut state);
        } else {
            tokio::task::yield_now().await;
        }
        Ok(Outcome::Delivered)
    }
    fn timed_out(&self) -> Outcome {
        Outcome::transient(Duration::from_secs(1))
    }
}

fn main() -> anyhow::Result<()> {
    let rounds = env_usize("ROUNDS", 5);
    let deliveries = env_usize("DELIVERIES", 1_000_000).div_ceil(PAGE) * PAGE;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    for (name, provider, history) in [
        ("small future", Arc::new(Answers::<false>) as Arc<dyn Provider>, false),
        ("small future, delivery history", Arc::new(Answers::<false>) as Arc<dyn Provider>, true),
        ("2 KiB future", Arc::new(Answers::<true>) as Arc<dyn Provider>, false),
    ] {
        let mut cpu = Vec::new();
        let mut wall = Vec::new();
        for round in 1..=rounds {
            let (w, c) = runtime.block_on(one_round(provider.clone(), deliveries, history))?;
            let (w_ns, c_ns) = (w * 1e9 / deliveries as f64, c * 1e9 / deliveries as f64);
            println!(
                "{name}, round {round}: {deliveries} deliveries, {w_ns:.0} ns wall and {c_ns:.0} ns CPU per delivery"
            );
            wall.push(w_ns);
            cpu.push(c_ns);
        }
        println!(
            "{name}: median {:.0} ns wall, {:.0} ns CPU per delivery over {rounds} rounds",
            median(&mut wall),
            median(&mut cpu)
        );
    }
    Ok(())
}

/// `deliveries` through fresh workers, with the delivery history at its
/// default size or without: (wall seconds, CPU seconds) from the first batch
/// handed over to the last first attempt answered.
async fn one_round(provider: Arc<dyn Provider>, deliveries: usize, history: bool) -> anyhow::Result<(f64, f64)> {
    let dir = tempfile::tempdir()?;
    let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), 4)?);
    let settings = DeliverySettings::default();
    let mut channels = Channels::default();
    channels.insert(provider);
    let metrics = Arc::new(Metrics::new());
    let parking = Arc::new(Parking::of_providers(&channels, CHANNEL_IN_FLIGHT, 1, metrics.clone()));
    let history = if history { History::start(&HistorySettings::default()) } else { None };
    let ctx = Arc::new(WorkerContext {
        max_in_flight: settings.in_flight_per_worker(CHANNEL_IN_FLIGHT),
        settings,
        max_attempts: 3,
        channels,
        store,
        metrics,
        // One node: every shard held.
        fence: Default::default(),
        parking,
        history: history.clone(),
        dangerous_panic_attempts: Default::default(),
    });
    let (workers, handles) = DeliveryWorkers::start(ctx);
    let recipients: Vec<Arc<Recipient>> = (0..RECIPIENTS).map(recipient).collect();
    let envelope = Arc::new(envelope());
    let pages = deliveries / PAGE;
    let done = Arc::new(AtomicUsize::new(0));
    let all_done = Arc::new(tokio::sync::Notify::new());

    let cpu_before = cpu_seconds()?;
    let started = Instant::now();
    for _ in 0..pages {
        let (done, all_done) = (done.clone(), all_done.clone());
        let latch = Arc::new(FirstAttemptLatch::new(PAGE, Arc::new(AtomicU64::new(0)), move || {
            if done.fetch_add(1, Ordering::AcqRel) + 1 == pages {
                all_done.notify_one();
            }
        }));
        let batch = (0..PAGE)
            .map(|index| {
                let recipient = recipients[index % RECIPIENTS].clone();
                Delivery::new(envelope.clone(), recipient, FirstAttempt { latch: latch.clone(), index })
            })
            .collect();
        workers.submit(batch).await?;
    }
    tokio::time::timeout(Duration::from_secs(600), all_done.notified()).await?;
    let wall = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu_before;
    drop(workers);
    for handle in handles {
        handle.await?;
    }
    if let Some(history) = history {
        // Records dropped on a full queue cost less than kept ones: say so.
        let dropped = history.of(recipients[0].id).await?.dropped;
        println!("  delivery history: {dropped} records dropped of {deliveries}");
    }
    Ok((wall, cpu))
}

fn recipient(i: usize) -> Arc<Recipient> {
    let mut id = [0u8; 32];
    id[..8].copy_from_slice(&(i as u64).to_le_bytes());
    Arc::new(Recipient {
        id: RecipientId::from_bytes(id),
        secret_hash: SecretHash([4; 32]),
        target: DeliveryTarget::Apns { token: format!("{i:064x}") },
        renewed_at_ns: 1,
        topic_count: 1,
    })
}

fn envelope() -> StoredEnvelope {
    StoredEnvelope {
        shard: ShardId::FIRST,
        sequence_id: 1,
        topic: Topic::parse(&[0, 9]).expect("a topic"),
        kind: EnvelopeKind::Application,
        server_ts_ns: 1,
        sender_hmac: None,
        data: vec![],
        relay: Default::default(),
    }
}

/// utime + stime of this process (fields 14 and 15 of /proc/self/stat).
fn cpu_seconds() -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow::anyhow!("no ')' in /proc/self/stat"))? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // CLK_TCK is 100 on Linux.
    Ok(ticks as f64 / 100.0)
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(default)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}
