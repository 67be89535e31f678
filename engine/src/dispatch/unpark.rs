//! A shard's parked deliveries, handed back to the delivery workers when
//! their channel can take them (`delivery::Parking`, docs/ARCHITECTURE.md
//! "Channels fail alone"). The shard's lease holder does it, so one node
//! drains a shard's rows at a time; a row is deleted once its delivery had
//! an attempt, so a crash or a handover before that sends it again
//! (at-least-once, as for a window).
//!
//! Rows are read in key order from a cursor per channel, from the start
//! only when the actor starts. A row parked behind the cursor (parked
//! again because its breaker opened, a retry of an older envelope, or one
//! of a batch let go) lowers the channel's *floor*; once the cursor finds
//! nothing more it goes back to the floor, at most every `REVISIT`, so a
//! channel that stays down costs a read every `REVISIT`, not a loop, and a
//! read never walks the rows (on ScyllaDB, the tombstones) drained before
//! the floor.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::try_join_all;
use tokio::time::Instant;

use super::DispatchContext;
use crate::delivery::{Delivery, FirstAttempt, FirstAttemptLatch};
use crate::domain::{Channel, ParkedDelivery, ParkedKey, RecipientId, ShardId, StoredEnvelope};
use crate::store::StoreError;

/// Parked deliveries handed back at once, per shard and channel.
const BATCH: usize = 256;
/// How often the cursor may go back to a channel's floor.
const REVISIT: Duration = Duration::from_secs(5);

/// Told (channel, batch id) once every delivery of a batch handed out was
/// attempted or parked again; the shard answers with [`Unparking::done`].
pub(super) type BatchDone = Arc<dyn Fn(Channel, u64) + Send + Sync>;

/// One shard's drains, by channel.
#[derive(Default)]
pub(super) struct Unparking {
    drains: HashMap<Channel, Drain>,
    next_batch: u64,
}

struct Drain {
    /// The last row handed out.
    cursor: Option<ParkedKey>,
    /// The lowest sequence id parked behind the cursor.
    floor: Option<u64>,
    /// When the cursor last went back to the floor.
    revisited: Option<Instant>,
    batches: HashMap<u64, Out>,
    /// The rows of those batches: a read from the floor finds them again
    /// while their attempts are in flight, and must not hand them out twice.
    out: HashSet<ParkedKey>,
}

impl Drain {
    /// Batch `out` is done or let go: its rows may be handed out again.
    fn let_go(&mut self, out: &Out) {
        for key in &out.keys {
            self.out.remove(key);
        }
    }
}

/// A batch handed to the workers whose attempts are not all made.
struct Out {
    latch: Arc<FirstAttemptLatch>,
    keys: Vec<ParkedKey>,
    progress: Arc<AtomicU64>,
    seen: u64,
    last_progress: Instant,
}

/// A batch's deliveries not yet sent are never sent once their shard actor
/// stops (its lease was lost, or it was handed over): the next owner reads
/// the rows, which are still there.
impl Drop for Unparking {
    fn drop(&mut self) {
        for out in self.drains.values().flat_map(|d| d.batches.values()) {
            out.latch.drop_window();
        }
    }
}

impl Unparking {
    /// Every channel may have rows (a new owner, or a restart).
    pub(super) fn look_everywhere(&mut self, ctx: &DispatchContext) {
        for channel in ctx.workers.parking().channels() {
            self.look(channel, None);
        }
    }

    /// Rows of `channel` may exist from sequence id `from` on (from the
    /// start when `None`).
    fn look(&mut self, channel: Channel, from: Option<u64>) {
        let drain = self.drains.entry(channel).or_insert_with(|| Drain {
            cursor: None,
            floor: None,
            revisited: None,
            batches: HashMap::new(),
            out: HashSet::new(),
        });
        if let Some(from) = from {
            drain.floor = Some(drain.floor.map_or(from, |f| f.min(from)));
        }
    }

    /// Hands out what each channel can take now.
    pub(super) async fn pump(
        &mut self,
        shard: ShardId,
        ctx: &DispatchContext,
        on_done: &BatchDone,
    ) -> Result<(), StoreError> {
        let parking = ctx.workers.parking().clone();
        for (channel, from) in parking.take_parked(shard) {
            self.look(channel, Some(from));
        }
        let channels: Vec<Channel> = self.drains.keys().copied().collect();
        for channel in channels {
            let now = Instant::now();
            let granted = parking.reserve_unpark(channel, BATCH, now);
            if granted == 0 {
                continue;
            }
            let drain = self.drains.get_mut(&channel).expect("listed");
            let read = ctx.store.parked().parked(shard, channel, drain.cursor, granted).await;
            let rows = match read {
                Ok(rows) => rows,
                Err(e) => {
                    parking.unparked(channel, granted);
                    return Err(e);
                }
            };
            if rows.is_empty() {
                parking.unparked(channel, granted);
                match drain.floor {
                    // Read to the end with nothing behind: done once its
                    // batches are.
                    None if drain.batches.is_empty() => {
                        self.drains.remove(&channel);
                    }
                    None => {}
                    Some(floor) if drain.revisited.is_none_or(|at| now.saturating_duration_since(at) >= REVISIT) => {
                        drain.cursor = floor.checked_sub(1).map(|below| ParkedKey {
                            sequence_id: below,
                            recipient: RecipientId::from_bytes([0xff; 32]),
                        });
                        drain.floor = None;
                        drain.revisited = Some(now);
                    }
                    Some(_) => {}
                }
                continue;
            }
            drain.cursor = rows.last().map(ParkedDelivery::key);
            let (id, batch) = (self.next_batch, self.next_batch + 1);
            self.next_batch = batch;
            let handed = self.hand_out(shard, ctx, on_done, channel, id, rows).await;
            parking.unparked(channel, granted - handed.min(granted));
            if handed > 0 {
                parking.count_unparked(channel, handed);
            }
        }
        Ok(())
    }

    /// Loads the rows' recipients and hands their deliveries to the
    /// workers as one batch `id`; returns how many. A row whose recipient
    /// is gone, or now on a channel the workers do not send through (PUSH-257:
    /// a recipient stored on a configured channel), is deleted unsent.
    async fn hand_out(
        &mut self,
        shard: ShardId,
        ctx: &DispatchContext,
        on_done: &BatchDone,
        channel: Channel,
        id: u64,
        rows: Vec<ParkedDelivery>,
    ) -> usize {
        let store = &ctx.store;
        let parking = ctx.workers.parking();
        // A first attempt detached from its page while in flight has its row
        // here already; its answer deletes or rewrites it (and lowers the
        // floor when it stays), so sending it now would only repeat it.
        // A row of a batch still out was read again from the floor.
        let out = &self.drains.get(&channel).expect("listed").out;
        let rows: Vec<ParkedDelivery> =
            rows.into_iter().filter(|row| !parking.is_detached(&row.place()) && !out.contains(&row.key())).collect();
        let recipients = match try_join_all(rows.iter().map(|row| store.recipient(&row.recipient))).await {
            Ok(recipients) => recipients,
            Err(e) => {
                tracing::warn!(shard = shard.index(), error = %e, "reading parked deliveries' recipients failed");
                return 0;
            }
        };
        let mut unsendable = Vec::new();
        let mut sendable = Vec::with_capacity(rows.len());
        for (row, recipient) in rows.into_iter().zip(recipients) {
            match recipient {
                Some(r) if parking.channels().any(|c| c == r.target.channel()) => sendable.push((row, Arc::new(r))),
                _ => unsendable.push(row.key()),
            }
        }
        if !unsendable.is_empty()
            && let Err(e) = store.parked().unpark(shard, channel, &unsendable).await
        {
            tracing::warn!(shard = shard.index(), error = %e, "deleting parked deliveries failed");
        }
        if sendable.is_empty() {
            return 0;
        }
        let progress = Arc::new(AtomicU64::new(0));
        let on_done = on_done.clone();
        let latch = Arc::new(FirstAttemptLatch::new(sendable.len(), progress.clone(), move || on_done(channel, id)));
        let keys = sendable.iter().map(|(row, _)| row.key()).collect();
        let mut envelope: Option<Arc<StoredEnvelope>> = None;
        let deliveries: Vec<Delivery> = sendable
            .into_iter()
            .enumerate()
            .map(|(index, (row, recipient))| {
                // Rows of one envelope share its copy.
                let same = envelope.as_ref().is_some_and(|e| e.sequence_id == row.sequence_id);
                if !same {
                    envelope = Some(Arc::new(StoredEnvelope {
                        shard: row.shard,
                        sequence_id: row.sequence_id,
                        topic: row.topic.clone(),
                        kind: row.kind,
                        server_ts_ns: row.server_ts_ns,
                        sender_hmac: None,
                        data: Vec::new(),
                        relay: Default::default(),
                    }));
                }
                Delivery {
                    envelope: envelope.clone().expect("set above"),
                    recipient,
                    first_attempt: Some(FirstAttempt { latch: latch.clone(), index }),
                    attempts: row.attempts,
                    all_gone: row.all_gone,
                    unparked: true,
                    first_sent_at: None,
                }
            })
            .collect();
        let handed = deliveries.len();
        let out = Out { latch, keys, progress, seen: 0, last_progress: Instant::now() };
        let drain = self.drains.get_mut(&channel).expect("listed");
        drain.out.extend(out.keys.iter().copied());
        drain.batches.insert(id, out);
        if ctx.workers.submit(deliveries).await.is_err() {
            return 0; // Shutting down: the rows stay.
        }
        handed
    }

    /// Every delivery of batch `id` was attempted or parked again: the rows
    /// of the attempted ones go.
    pub(super) async fn done(&mut self, shard: ShardId, ctx: &DispatchContext, channel: Channel, id: u64) {
        let Some(out) = self.drains.get_mut(&channel).and_then(|d| d.batches.remove(&id)) else { return };
        delete_attempted(shard, ctx, channel, &out).await;
        if let Some(drain) = self.drains.get_mut(&channel) {
            drain.let_go(&out);
        }
    }

    /// Liveness over age: a batch none of whose deliveries was taken or
    /// answered for `timeout` (lost with a panicking attempt, or held by a
    /// fence) is let go: its attempted rows are deleted, the others stay
    /// and are read again.
    pub(super) async fn forget_stalled(&mut self, shard: ShardId, ctx: &DispatchContext, timeout: Duration) {
        let now = Instant::now();
        let mut stalled = Vec::new();
        for (&channel, drain) in &mut self.drains {
            for (&id, out) in &mut drain.batches {
                let progress = out.progress.load(Ordering::Relaxed);
                if progress != out.seen {
                    out.seen = progress;
                    out.last_progress = now;
                } else if now.saturating_duration_since(out.last_progress) >= timeout {
                    stalled.push((channel, id));
                }
            }
        }
        for (channel, id) in stalled {
            let Some(drain) = self.drains.get_mut(&channel) else { continue };
            let Some(out) = drain.batches.remove(&id) else { continue };
            drain.let_go(&out);
            out.latch.abandon();
            // Its rows not attempted stay, behind the cursor.
            if let Some(lowest) = out.keys.iter().map(|k| k.sequence_id).min() {
                drain.floor = Some(drain.floor.map_or(lowest, |f| f.min(lowest)));
            }
            delete_attempted(shard, ctx, channel, &out).await;
        }
    }
}

/// Deletes the rows of `out`'s deliveries that had their attempt; a failed
/// delete costs a repeat later, never a loss.
async fn delete_attempted(shard: ShardId, ctx: &DispatchContext, channel: Channel, out: &Out) {
    let attempted: Vec<ParkedKey> = out.latch.attempted().map(|i| out.keys[i]).collect();
    if attempted.is_empty() {
        return;
    }
    if let Err(e) = ctx.store.parked().unpark(shard, channel, &attempted).await {
        tracing::warn!(shard = shard.index(), error = %e, "deleting attempted parked deliveries failed");
    }
}

#[cfg(test)]
mod tests {
    //! A shard actor over a real store and real delivery workers, with two
    //! in-memory providers, on real time: parks and unparks are store
    //! writes on the blocking pool. Every wait is bounded.

    use std::collections::HashMap;
    use std::num::NonZeroUsize;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use async_trait::async_trait;
    use ractor::Actor;

    use super::*;
    use crate::channel::{Channels, Outcome, Provider, Push, Refusal};
    use crate::delivery::{BreakerRules, DeliverySettings, DeliveryWorkers, Parking, WorkerContext};
    use crate::dispatch::shard::ShardMsg;
    use crate::dispatch::{DispatchSettings, PanicHook, Routes, ShardActor};
    use crate::domain::{
        DeliveryTarget, EnvelopeKind, NewEnvelope, RecipientId, RecipientSecret, Subscription, SubscriptionUpdate,
        Topic,
    };
    use crate::metrics::Metrics;
    use crate::ownership::Fence;
    use crate::store::{RedbStore, Store};

    /// Answers `Delivered` while up, 503-like transient while down; counts
    /// what it delivered by (sequence id, recipient).
    struct Provider503 {
        channel: Channel,
        up: AtomicBool,
        delivered: Mutex<HashMap<(u64, RecipientId), usize>>,
    }

    #[async_trait]
    impl Provider for Provider503 {
        fn channel(&self) -> Channel {
            self.channel
        }
        async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
            let Push::Envelope { recipient, envelope } = push else { return Err(Refusal::Unsupported) };
            if !self.up.load(Ordering::SeqCst) {
                return Ok(Outcome::transient(Duration::from_millis(50)));
            }
            *self.delivered.lock().unwrap().entry((envelope.sequence_id, recipient.id)).or_default() += 1;
            Ok(Outcome::Delivered)
        }
        fn timed_out(&self) -> Outcome {
            Outcome::transient(Duration::from_millis(50))
        }
    }

    fn provider(channel: Channel, up: bool) -> Arc<Provider503> {
        Arc::new(Provider503 { channel, up: AtomicBool::new(up), delivered: Mutex::default() })
    }

    /// One page per envelope of `page` subscribers; a short poll so that
    /// unparking goes soon.
    fn context(
        store: &Arc<dyn Store>,
        workers: DeliveryWorkers,
        channels: Channels,
        metrics: &Arc<Metrics>,
        page: usize,
    ) -> Arc<DispatchContext> {
        let settings = DispatchSettings {
            subscriber_page: NonZeroUsize::new(page).unwrap(),
            poll_interval: Duration::from_millis(50),
            ..DispatchSettings::default()
        };
        Arc::new(DispatchContext {
            store: store.clone(),
            routes: Routes::new(Arc::new(workers.clone()), &channels),
            workers,
            channels,
            progress_interval: None,
            settings,
            pages_ahead: 0,
            metrics: metrics.clone(),
            fence: Fence::default(),
            panic_hook: PanicHook::default(),
        })
    }

    /// Holds every send until opened, then answers `Delivered`; counts sends.
    struct Gate {
        open: tokio::sync::watch::Sender<bool>,
        sent: AtomicUsize,
    }

    #[async_trait]
    impl Provider for Gate {
        fn channel(&self) -> Channel {
            Channel::Apns
        }
        async fn send(&self, _push: Push<'_>) -> Result<Outcome, Refusal> {
            self.sent.fetch_add(1, Ordering::SeqCst);
            let _ = self.open.subscribe().wait_for(|open| *open).await;
            Ok(Outcome::Delivered)
        }
        fn timed_out(&self) -> Outcome {
            Outcome::transient(Duration::from_secs(1))
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rows_of_a_batch_still_out_are_not_handed_out_again_when_the_cursor_goes_back_to_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), 1).unwrap());
        let topic = Topic::parse(&[0, 7]).unwrap();
        let mut rows = Vec::new();
        for i in 1..=3u8 {
            let id = RecipientId::from_bytes([i; 32]);
            let hash = RecipientSecret::parse(&[i; 32]).unwrap().hash();
            store.register(&id, &hash, &DeliveryTarget::Apns { token: format!("a{i}") }, 1).await.unwrap();
            rows.push(ParkedDelivery {
                shard: ShardId::FIRST,
                channel: Channel::Apns,
                sequence_id: 1,
                recipient: id,
                topic: topic.clone(),
                kind: EnvelopeKind::Application,
                server_ts_ns: 1,
                attempts: 0,
                all_gone: true,
            });
        }
        store.parked().park(&rows).await.unwrap();
        let gate = Arc::new(Gate { open: tokio::sync::watch::channel(false).0, sent: AtomicUsize::new(0) });
        let mut channels = Channels::default();
        channels.insert(gate.clone());
        let metrics = Arc::new(Metrics::new());
        let parking = Arc::new(Parking::of_providers(&channels, 8, 1, metrics.clone()));
        let delivery = DeliverySettings { workers: NonZeroUsize::MIN, ..DeliverySettings::default() };
        let (workers, _handles) = DeliveryWorkers::start(WorkerContext::for_tests(
            8,
            delivery,
            channels.clone(),
            store.clone(),
            metrics.clone(),
            parking.clone(),
            Fence::default(),
        ));
        let ctx = context(&store, workers, channels, &metrics, 8);
        let on_done: BatchDone = Arc::new(|_, _| {});
        let mut unparking = Unparking::default();
        unparking.look_everywhere(&ctx);
        unparking.pump(ShardId::FIRST, &ctx, &on_done).await.unwrap();
        until("the three rows are sent", || gate.sent.load(Ordering::SeqCst) == 3).await;
        // Something is parked behind the cursor while the three attempts are
        // in flight: the cursor finds nothing more, goes back to the floor,
        // and reads the three rows again.
        parking.parked(ShardId::FIRST, Channel::Apns, 1);
        unparking.pump(ShardId::FIRST, &ctx, &on_done).await.unwrap();
        unparking.pump(ShardId::FIRST, &ctx, &on_done).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(gate.sent.load(Ordering::SeqCst), 3, "a row of a batch still out was handed out again");
        gate.open.send_replace(true);
    }

    async fn until(what: &str, done: impl Fn() -> bool) {
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while !done() {
            assert!(std::time::Instant::now() < give_up, "never: {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_window_moves_past_a_failing_channel_and_its_parked_deliveries_go_once_it_answers_even_after_a_restart() {
        const RECIPIENTS: u8 = 20;
        const ENVELOPES: usize = 10;
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), 1).unwrap());
        let topic = Topic::parse(&[0, 7]).unwrap();
        // Even recipients on APNs, odd ones on FCM, all on one topic.
        for i in 0..RECIPIENTS {
            let id = RecipientId::from_bytes([i + 1; 32]);
            let hash = RecipientSecret::parse(&[i + 1; 32]).unwrap().hash();
            let target = if i % 2 == 0 {
                DeliveryTarget::Apns { token: format!("a{i}") }
            } else {
                DeliveryTarget::Fcm { token: format!("f{i}") }
            };
            store.register(&id, &hash, &target, 1).await.unwrap();
            let add = Subscription { topic: topic.clone(), keys: None, include_commits: false };
            let update = SubscriptionUpdate::new(vec![add], vec![]).unwrap();
            store.update_subscriptions(&id, &hash, &update, 1, 100).await.unwrap();
        }
        let new = || NewEnvelope::new(topic.clone(), 1, EnvelopeKind::Application, true, None, vec![], None);
        let batch: Vec<NewEnvelope> = (0..ENVELOPES).map(|_| new().unwrap()).collect();
        store.append(&batch, 2).await.unwrap();

        let apns = provider(Channel::Apns, false);
        let fcm = provider(Channel::Fcm, true);
        let mut channels = Channels::default();
        channels.insert(apns.clone());
        channels.insert(fcm.clone());
        let metrics = Arc::new(Metrics::new());
        let rules = BreakerRules {
            failures: 3,
            cooldown: Duration::from_millis(100),
            max_cooldown: Duration::from_millis(200),
        };
        let parking = Arc::new(Parking::new(rules, &[(Channel::Apns, 8), (Channel::Fcm, 8)], 1, metrics.clone()));
        let delivery = DeliverySettings { workers: NonZeroUsize::new(2).unwrap(), ..DeliverySettings::default() };
        let (workers, _handles) = DeliveryWorkers::start(WorkerContext::for_tests(
            16,
            delivery,
            channels.clone(),
            store.clone(),
            metrics.clone(),
            parking,
            Fence::default(),
        ));
        // One page per envelope; a short poll so that unparking goes soon.
        let ctx = context(&store, workers, channels, &metrics, usize::from(RECIPIENTS));
        let spawn = || async {
            let (actor, _) =
                Actor::spawn(None, ShardActor, (ShardId::FIRST, ctx.clone(), Arc::default())).await.unwrap();
            let _ = actor.cast(ShardMsg::Wake);
            actor
        };
        let actor = spawn().await;
        let fcm_count = || fcm.delivered.lock().unwrap().len();
        let apns_count = || apns.delivered.lock().unwrap().len();
        let per_channel = usize::from(RECIPIENTS / 2) * ENVELOPES;

        // APNs answers 503: its breaker opens, its deliveries are parked,
        // and the window moves past them while FCM delivers everything.
        until("FCM delivers every envelope", || fcm_count() == per_channel).await;
        let checkpoint = async || store.shard_position(ShardId::FIRST).await.unwrap().checkpoint;
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while checkpoint().await < ENVELOPES as u64 {
            assert!(std::time::Instant::now() < give_up, "the checkpoint waited for APNs");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(apns_count(), 0);
        let parked = store.parked().parked(ShardId::FIRST, Channel::Apns, None, 1000).await.unwrap();
        assert!(!parked.is_empty(), "APNs's deliveries wait in the parked table");
        assert!(metrics.render().contains(r#"fanout_breaker_open{channel="apns"} 1"#));

        // The shard's actor stops (a restart, a handover) while APNs is
        // still down; a new one finds the rows and, once APNs answers,
        // sends every one of them.
        actor.stop(None);
        tokio::time::sleep(Duration::from_millis(100)).await;
        apns.up.store(true, Ordering::SeqCst);
        let _actor = spawn().await;
        until("APNs gets every delivery once it answers", || apns_count() == per_channel).await;
        let give_up = std::time::Instant::now() + Duration::from_secs(60);
        while !store.parked().parked(ShardId::FIRST, Channel::Apns, None, 10).await.unwrap().is_empty() {
            assert!(std::time::Instant::now() < give_up, "the rows of attempted deliveries stay");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(fcm.delivered.lock().unwrap().values().all(|&n| n == 1), "FCM never repeated");
        assert!(apns.delivered.lock().unwrap().values().all(|&n| n == 1), "nor APNs");
        assert!(metrics.render().contains(r#"fanout_breaker_open{channel="apns"} 0"#));
    }
}
