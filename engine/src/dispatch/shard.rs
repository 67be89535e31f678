use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;

use super::unpark::{BatchDone, Unparking};
use super::window::Window;
use super::window_pages::WindowPages;
use super::{Decision, DispatchContext, decide, suppression};
use crate::domain::{Answered, Channel, HmacKey, Partly, ShardId, ShardProgress, StoredEnvelope};
use crate::ticker::spawn_ticker;

pub enum ShardMsg {
    /// New envelopes may be above the checkpoint.
    Wake,
    /// Periodic: look for work, replay the pages of a window that made no
    /// progress for too long.
    Tick,
    /// Produce the next page of deliveries of the current window.
    Pump,
    /// Every delivery of page `page` of window `window` had its first attempt.
    PageDone { window: u64, page: u64 },
    /// Shutdown: start no new window, finish the current one, then stop.
    Drain,
    /// Periodic (`progress_interval_ms`): record what the window answered
    /// above the checkpoint, for the shard's next owner to skip.
    RecordProgress,
    /// Another node takes this shard (this node is above its fair share):
    /// hand out no more pages; once every page in flight had its first
    /// attempts, store the checkpoint just below the oldest envelope not
    /// fully done (and, when progress is recorded, how far into it), then
    /// stop. The next owner replays from there, so it repeats at most the
    /// pages of a partly paged envelope, not the rest of a window that could
    /// not finish within the drain bound.
    Release,
    /// Every delivery of unpark batch `batch` of `channel` was attempted or
    /// parked again (`unpark::Unparking`).
    Unparked { channel: Channel, batch: u64 },
}

/// Owns one topic shard's dispatch. Holds no durable state in memory: a
/// restarted actor resumes from the stored checkpoint.
pub struct ShardActor;

pub struct ShardState {
    shard: ShardId,
    ctx: Arc<DispatchContext>,
    /// Set by the supervisor when it queues a Wake, cleared when one is handled.
    wake_pending: Arc<AtomicBool>,
    window: Option<Window>,
    next_window_id: u64,
    /// This shard's last contribution to the summed lag gauge.
    lag: i64,
    draining: bool,
    /// `Release`: no more pages; stop once the pages in flight are answered.
    releasing: bool,
    /// The fence was down at the last check (logged once per episode).
    fenced: bool,
    ticker: tokio::task::JoinHandle<()>,
    /// Sends `RecordProgress`, when progress is recorded.
    progress_ticker: Option<tokio::task::JoinHandle<()>>,
    /// The shard's parked deliveries being handed back to the workers.
    unparking: Unparking,
}

impl Actor for ShardActor {
    type Msg = ShardMsg;
    type State = ShardState;
    type Arguments = (ShardId, Arc<DispatchContext>, Arc<AtomicBool>);

    async fn pre_start(
        &self,
        myself: ActorRef<ShardMsg>,
        (shard, ctx, wake_pending): Self::Arguments,
    ) -> Result<ShardState, ActorProcessingErr> {
        let interval = ctx.settings.poll_interval;
        let progress_ticker =
            ctx.progress_interval.map(|every| spawn_ticker(myself.clone(), every, || ShardMsg::RecordProgress));
        let ticker = spawn_ticker(myself, interval, || ShardMsg::Tick);
        // Rows a former owner (or this node, before a restart) parked.
        let mut unparking = Unparking::default();
        unparking.look_everywhere(&ctx);
        Ok(ShardState {
            shard,
            ctx,
            wake_pending,
            window: None,
            next_window_id: 0,
            lag: 0,
            draining: false,
            releasing: false,
            fenced: false,
            ticker,
            progress_ticker,
            unparking,
        })
    }

    async fn post_stop(&self, _: ActorRef<ShardMsg>, state: &mut ShardState) -> Result<(), ActorProcessingErr> {
        state.ticker.abort();
        if let Some(t) = &state.progress_ticker {
            t.abort();
        }
        // Whoever runs this shard next replays from the checkpoint.
        state.drop_window();
        state.set_lag(0);
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<ShardMsg>,
        message: ShardMsg,
        state: &mut ShardState,
    ) -> Result<(), ActorProcessingErr> {
        let result = match message {
            ShardMsg::Wake => {
                // Wakes that arrive from now on queue a new one.
                state.wake_pending.store(false, Ordering::Release);
                state.start_window(&myself).await
            }
            ShardMsg::Tick => match state.replay_if_stalled(&myself).await {
                Ok(()) => {
                    // A window paused by the fence goes on once the lease is renewed.
                    state.queue_pump(&myself);
                    state.unpark(&myself, true).await;
                    state.start_window(&myself).await
                }
                Err(e) => Err(e),
            },
            ShardMsg::Unparked { channel, batch } => {
                state.unparking.done(state.shard, &state.ctx, channel, batch).await;
                state.unpark(&myself, false).await;
                Ok(())
            }
            ShardMsg::Pump => state.pump(&myself).await,
            ShardMsg::PageDone { window, page } => state.page_done(&myself, window, page).await,
            ShardMsg::RecordProgress => {
                state.record_progress().await;
                Ok(())
            }
            ShardMsg::Drain => {
                state.draining = true;
                Ok(())
            }
            ShardMsg::Release => {
                state.draining = true;
                state.releasing = true;
                state.release_if_answered().await
            }
        };
        if state.draining && state.window.is_none() {
            // The last window's checkpoint is stored: nothing is left in memory.
            myself.stop(Some("drained".into()));
        }
        if let Err(e) = result {
            // Drop the window; the next tick replays it from the durable checkpoint.
            tracing::warn!(shard = state.shard.index(), error = %e, "dispatch step failed; window will be replayed");
            state.drop_window();
        }
        Ok(())
    }
}

/// Why a step stopped: the store failed (the window is read again), or the
/// delivery workers are gone (shutting down).
type StepResult = Result<(), crate::store::StoreError>;

impl ShardState {
    /// Drops the running window (`Drop for Window`).
    fn drop_window(&mut self) {
        self.window = None;
    }

    /// Fencing: whether this node surely still holds the shard's
    /// lease. While it does not, no window starts, no page is produced and
    /// nothing is re-sent; the workers hold the first attempts they have of it.
    fn fenced(&mut self) -> bool {
        let fenced = !self.ctx.fence.holds(self.shard);
        if fenced && !self.fenced {
            tracing::warn!(shard = self.shard.index(), "shard lease not renewed in time; dispatch paused");
        }
        self.fenced = fenced;
        fenced
    }

    /// Hands parked deliveries back to the workers as their channels can
    /// take them (`unpark`); on a tick, first lets go of batches that made
    /// no progress for `window_timeout_seconds`. Not while fenced (the
    /// shard may be another node's) nor while draining. A failed read is
    /// logged and tried again at the next tick: it holds nothing back.
    async fn unpark(&mut self, myself: &ActorRef<ShardMsg>, tick: bool) {
        if self.draining || self.fenced() {
            return;
        }
        if tick {
            self.unparking.forget_stalled(self.shard, &self.ctx, self.ctx.settings.window_timeout).await;
        }
        let me = myself.clone();
        let on_done: BatchDone = Arc::new(move |channel, batch| {
            let _ = me.cast(ShardMsg::Unparked { channel, batch });
        });
        if let Err(e) = self.unparking.pump(self.shard, &self.ctx, &on_done).await {
            tracing::warn!(shard = self.shard.index(), error = %e, "reading parked deliveries failed");
        }
    }

    /// Reads a window from the checkpoint up to the boundary, unless one runs.
    async fn start_window(&mut self, myself: &ActorRef<ShardMsg>) -> StepResult {
        if self.window.is_some() || self.draining || self.fenced() {
            return Ok(());
        }
        let store = self.ctx.store.clone();
        let position = store.shard_position(self.shard).await?;
        self.set_lag(position.boundary.saturating_sub(position.checkpoint) as i64);
        if position.boundary <= position.checkpoint {
            return Ok(());
        }
        let limit = self.ctx.settings.window_envelopes.get();
        // PUSH-257: nothing above the boundary read now; nothing below the checkpoint.
        let window = store.read_window(self.shard, position.checkpoint, position.boundary, limit);
        let (envelopes, answered) = match self.ctx.progress_interval {
            Some(_) => tokio::try_join!(window, store.shard_progress(self.shard))?,
            None => (window.await?, ShardProgress::default()),
        };
        let end = match envelopes.last() {
            Some(last) if envelopes.len() == limit => last.sequence_id,
            _ => position.boundary,
        };
        if envelopes.is_empty() {
            // Only ineligible envelopes in between: nothing to attempt.
            store.advance_checkpoint(self.shard, end).await?;
            self.set_lag(position.boundary.saturating_sub(end) as i64);
            return Ok(());
        }
        self.next_window_id += 1;
        let now = Instant::now();
        let ids: Vec<u64> = envelopes.iter().map(|e| e.sequence_id).collect();
        // What a former owner (or this node, before a restart) recorded it
        // answered of these envelopes is not sent again.
        let (mut resume, mut skip, mut partly) = (HashMap::new(), HashMap::new(), 0);
        let envelopes: VecDeque<Arc<StoredEnvelope>> = envelopes
            .into_iter()
            .filter(|e| match answered.of(e.sequence_id) {
                Some(Answered::Whole) => false,
                Some(Answered::Partly(Partly { upto, also })) => {
                    partly += 1;
                    resume.extend(upto.map(|r| (e.sequence_id, r)));
                    if !also.is_empty() {
                        skip.insert(e.sequence_id, also);
                    }
                    true
                }
                None => true,
            })
            .map(Arc::new)
            .collect();
        if envelopes.len() < ids.len() || partly > 0 {
            tracing::info!(
                shard = self.shard.index(),
                answered = ids.len() - envelopes.len(),
                partly,
                "window resumes from recorded progress"
            );
        }
        let cursor = envelopes.front().and_then(|e| resume.remove(&e.sequence_id));
        let mut pages_read = WindowPages::new(
            self.ctx.pages_ahead,
            envelopes.iter().filter(|e| !resume.contains_key(&e.sequence_id)).map(|e| &e.topic),
        );
        let starts = envelopes
            .iter()
            .enumerate()
            .map(|(i, e)| (&e.topic, if i == 0 { cursor } else { resume.get(&e.sequence_id).copied() }));
        pages_read.start(&store, starts, self.ctx.settings.subscriber_page.get());
        let (id, me) = (self.next_window_id, myself.clone());
        self.window = Some(Window {
            id,
            page_done: Arc::new(move |page| {
                let _ = me.cast(ShardMsg::PageDone { window: id, page });
            }),
            envelopes,
            cursor,
            ids,
            resume,
            skip,
            recorded: answered,
            pages_read,
            end,
            checkpoint: position.checkpoint,
            checkpoint_written: now,
            pages: HashMap::new(),
            next_page_id: 0,
            pump_queued: false,
            started: now,
            queued: HashMap::new(),
            progress: Arc::default(),
            seen_progress: 0,
            last_progress: now,
        });
        self.queue_pump(myself);
        Ok(())
    }

    fn queue_pump(&mut self, myself: &ActorRef<ShardMsg>) {
        if let Some(w) = self.window.as_mut()
            && !w.pump_queued
        {
            w.pump_queued = true;
            let _ = myself.cast(ShardMsg::Pump);
        }
    }

    /// Produces one page of deliveries for the front envelope.
    async fn pump(&mut self, myself: &ActorRef<ShardMsg>) -> StepResult {
        let ctx = self.ctx.clone();
        if self.fenced() {
            if let Some(w) = self.window.as_mut() {
                w.pump_queued = false; // the next tick pumps again
            }
            return Ok(());
        }
        let Some(w) = self.window.as_mut() else {
            return Ok(());
        };
        w.pump_queued = false;
        if self.releasing {
            // No more pages: the held deliveries of those in flight go out.
            w.release_queued();
            return Ok(());
        }
        if w.pages.len() >= ctx.settings.max_pages_in_flight.get() {
            w.release_queued();
            return Ok(()); // PageDone pumps again.
        }
        let Some(envelope) = w.envelopes.front().cloned() else {
            w.release_queued();
            return self.complete_if_done(myself).await;
        };
        let page_size = ctx.settings.subscriber_page.get();
        let page = w.pages_read.take(&ctx.store, &envelope.topic, w.cursor, page_size).await?;
        let after = w.cursor;
        if page.len() < page_size {
            w.envelopes.pop_front();
            w.cursor = w.envelopes.front().and_then(|e| w.resume.remove(&e.sequence_id));
        } else {
            w.cursor = page.last().map(|s| s.recipient.id);
        }
        let next = w
            .envelopes
            .iter()
            .enumerate()
            .map(|(i, e)| (&e.topic, if i == 0 { w.cursor } else { w.resume.get(&e.sequence_id).copied() }));
        w.pages_read.start(&ctx.store, next, page_size);
        // PUSH-257 per subscriber; PUSH-230 for the page at once, so the data
        // is read once per page and hashed once per distinct key.
        let mut candidates = Vec::with_capacity(page.len());
        let skip = w.skip.get(&envelope.sequence_id).map_or(&[][..], Vec::as_slice);
        for subscriber in page.iter() {
            if skip.binary_search(&subscriber.recipient.id).is_ok() {
                continue; // its first attempt was made before a handover
            }
            let key = match decide(&envelope, subscriber, &ctx.channels) {
                Decision::Excluded => continue,
                Decision::Deliver => None,
                Decision::DeliverUnlessOwn(key) => Some(key.clone()),
            };
            candidates.push((subscriber.recipient.clone(), key));
        }
        let keys: HashSet<HmacKey> = candidates.iter().filter_map(|(_, key)| key.clone()).collect();
        let own = suppression::own_keys(ctx.store.as_ref(), &envelope, keys).await?;
        let mut recipients = Vec::with_capacity(candidates.len());
        for (recipient, key) in candidates {
            if key.is_some_and(|key| own.contains(&key)) {
                ctx.metrics.suppressed.inc();
            } else {
                recipients.push(recipient);
            }
        }
        if !recipients.is_empty() {
            let batch = w.hand_out(envelope, after, recipients);
            let handoffs = w.route(&ctx, batch);
            if w.envelopes.is_empty() {
                w.release_queued(); // the read is fully handed out
            }
            // Waits while the workers are full: backpressure.
            for handoff in handoffs {
                if handoff.await.is_err() {
                    return Ok(()); // Shutting down; the window is replayed at next start.
                }
            }
        } else if w.envelopes.is_empty() {
            w.release_queued();
        }
        self.maybe_panic_for_test();
        self.queue_pump(myself);
        Ok(())
    }

    async fn page_done(&mut self, myself: &ActorRef<ShardMsg>, window: u64, page: u64) -> StepResult {
        let Some(w) = self.window.as_mut().filter(|w| w.id == window) else {
            return Ok(()); // A dropped window's late answer.
        };
        if w.pages.remove(&page).is_none() {
            return Ok(()); // A replayed page's late answer.
        }
        if w.envelopes.is_empty() && w.pages.is_empty() {
            return self.complete_if_done(myself).await;
        }
        if self.releasing {
            return self.release_if_answered().await;
        }
        self.checkpoint_within_window(false).await?;
        if self.window.as_ref().is_some_and(|w| !w.envelopes.is_empty()) {
            self.queue_pump(myself);
        }
        Ok(())
    }

    /// PUSH-257 holds: the checkpoint moves to just below the oldest envelope
    /// of the window that is not fully paged or has a page whose first
    /// attempts are not all answered, so everything at or below it had every
    /// first attempt. At most every `checkpoint_interval_ms`, not on every
    /// page: each move is a store write (on ScyllaDB it also drops the
    /// envelopes below), and the repeats after a failover are bounded by
    /// what was in flight plus that much progress, not by the whole window.
    /// `now`: whatever the interval (a release moves it on every answered page).
    async fn checkpoint_within_window(&mut self, now: bool) -> StepResult {
        let interval = self.ctx.settings.checkpoint_interval;
        let Some(w) = self.window.as_mut() else { return Ok(()) };
        if !now && w.checkpoint_written.elapsed() < interval {
            return Ok(());
        }
        let oldest_open = w
            .envelopes
            .front()
            .map(|e| e.sequence_id)
            .into_iter()
            .chain(w.pages.values().map(|p| p.envelope.sequence_id))
            .min();
        let Some(below) = oldest_open.map(|s| s.saturating_sub(1)).filter(|&below| below > w.checkpoint) else {
            return Ok(());
        };
        w.checkpoint = below;
        w.checkpoint_written = Instant::now();
        self.ctx.store.advance_checkpoint(self.shard, below).await?;
        Ok(())
    }

    /// `RecordProgress`: stores what the window answered above the
    /// checkpoint when it changed. Not while fenced: another node may own
    /// the shard by now, and a stale record would only cost it repeats. A
    /// failed write costs repeats after a handover too, nothing else, so it
    /// is logged and the window goes on.
    async fn record_progress(&mut self) {
        if self.ctx.progress_interval.is_none() || self.fenced() {
            return;
        }
        let Some(w) = self.window.as_mut() else { return };
        let answered = w.answered();
        if answered == w.recorded {
            return;
        }
        match self.ctx.store.record_progress(self.shard, &answered).await {
            Ok(()) => w.recorded = answered,
            Err(e) => tracing::warn!(shard = self.shard.index(), error = %e, "recording dispatch progress failed"),
        }
    }

    /// `Release`: moves the checkpoint up to just below the oldest envelope
    /// that is not fully paged or has a page in flight (PUSH-257: everything
    /// at or below it had every first attempt; a partly paged envelope is
    /// replayed whole by the next owner); once no page is in flight the
    /// window is done here and the actor stops.
    async fn release_if_answered(&mut self) -> StepResult {
        self.checkpoint_within_window(true).await?;
        if self.window.as_ref().is_some_and(|w| w.pages.is_empty()) {
            // How far into the envelope it stopped in, for the next owner.
            self.record_progress().await;
        }
        if let Some(w) = self.window.as_mut()
            && w.pages.is_empty()
        {
            if w.envelopes.is_empty() {
                // Fully paged and answered: the window's own end.
                self.ctx.store.advance_checkpoint(self.shard, w.end).await?;
            }
            w.release_queued();
            self.window = None;
        }
        Ok(())
    }

    /// The checkpoint moves only when every page has had its first attempts.
    async fn complete_if_done(&mut self, myself: &ActorRef<ShardMsg>) -> StepResult {
        let Some(w) = self.window.as_ref() else { return Ok(()) };
        if !w.envelopes.is_empty() || !w.pages.is_empty() {
            return Ok(());
        }
        self.ctx.store.advance_checkpoint(self.shard, w.end).await?;
        self.ctx.metrics.windows.inc();
        self.ctx.metrics.window_duration.observe(w.started.elapsed().as_secs_f64());
        self.window = None;
        let _ = myself.cast(ShardMsg::Wake);
        Ok(())
    }

    /// Liveness over age: a window is replayed only when no first attempt
    /// of it has been answered for `window_timeout_seconds` (a delivery lost
    /// to a crashed or panicking attempt). A long window that keeps making
    /// progress runs to completion. The replay re-sends, within the running
    /// window, only the deliveries whose first attempt never came; the
    /// workers drop the old copies of those.
    async fn replay_if_stalled(&mut self, myself: &ActorRef<ShardMsg>) -> StepResult {
        let timeout = self.ctx.settings.window_timeout;
        if self.fenced() {
            return Ok(());
        }
        let Some(w) = self.window.as_mut() else { return Ok(()) };
        let progress = w.progress.load(Ordering::Relaxed);
        if progress != w.seen_progress || w.pages.is_empty() {
            w.seen_progress = progress;
            w.last_progress = Instant::now();
            return Ok(());
        }
        if w.last_progress.elapsed() < timeout {
            return Ok(());
        }
        w.last_progress = Instant::now();
        let stalled: Vec<u64> = w.pages.keys().copied().collect();
        let mut batch = Vec::new();
        for old in stalled {
            let missing = w.pages[&old].latch.abandon();
            if missing.is_empty() {
                continue; // under way or answered: the page stays
            }
            let Some(page) = w.pages.remove(&old) else { continue };
            let recipients = missing.into_iter().map(|i| page.recipients[i].clone()).collect();
            batch.extend(w.hand_out(page.envelope, page.after, recipients));
        }
        if batch.is_empty() {
            // Every first attempt is under way (slow answers): nothing lost.
            return Ok(());
        }
        self.ctx.metrics.window_replays.inc();
        tracing::warn!(shard = self.shard.index(), "window made no progress; re-sending its lost deliveries");
        let handoffs = w.route(&self.ctx, batch);
        w.release_queued();
        for handoff in handoffs {
            if handoff.await.is_err() {
                return Ok(()); // Shutting down.
            }
        }
        self.complete_if_done(myself).await
    }

    fn set_lag(&mut self, lag: i64) {
        self.ctx.metrics.dispatch_lag.add(lag - self.lag);
        self.lag = lag;
    }

    fn maybe_panic_for_test(&self) {
        if self.ctx.panic_hook.page_done() {
            panic!("injected shard actor panic (FANOUT_DANGEROUS_PANIC_AFTER_PAGES)");
        }
    }
}

#[cfg(test)]
mod tests {
    //! The shard actor over a real store and real delivery workers, with an
    //! in-memory provider and tokio's paused clock.

    use std::collections::HashMap;
    use std::num::NonZeroUsize;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use tokio::sync::Semaphore;

    use super::*;
    use crate::channel::{Channels, Outcome, Provider, Push, Refusal};
    use crate::delivery::{DeliverySettings, DeliveryWorkers, Parking, WorkerContext};
    use crate::dispatch::{DispatchSettings, PanicHook, Routes};
    use crate::domain::{
        Channel, DeliveryTarget, EnvelopeKind, NewEnvelope, RecipientId, RecipientSecret, Subscription,
        SubscriptionUpdate, Topic,
    };
    use crate::metrics::Metrics;
    use crate::ownership::{Fence, OwnedShards};
    use crate::store::{RedbStore, ShardPosition, Store};

    const SHARDS: u16 = 1;

    /// Answers `Delivered` once a permit is available (at once for the
    /// recipients in `free`); panics (losing the attempt) for the recipients
    /// in `lose_once`, the first time only.
    struct Gate {
        latency: Duration,
        permits: Semaphore,
        free: Mutex<Vec<RecipientId>>,
        waiting: AtomicUsize,
        sent: Mutex<HashMap<(u64, RecipientId), usize>>,
        lose_once: Mutex<Vec<RecipientId>>,
    }

    #[async_trait]
    impl Provider for Gate {
        fn channel(&self) -> Channel {
            Channel::Apns
        }
        async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
            let Push::Envelope { recipient, envelope } = push else { return Err(Refusal::Unsupported) };
            let key = (envelope.sequence_id, recipient.id);
            *self.sent.lock().unwrap().entry(key).or_default() += 1;
            let lost = {
                let mut lose = self.lose_once.lock().unwrap();
                let found = lose.iter().position(|r| *r == recipient.id);
                found.map(|i| lose.remove(i)).is_some()
            };
            if lost {
                panic!("attempt lost (test)");
            }
            if self.free.lock().unwrap().contains(&recipient.id) {
                return Ok(Outcome::Delivered);
            }
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let permit = self.permits.acquire().await.unwrap();
            permit.forget();
            tokio::time::sleep(self.latency).await;
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            Ok(Outcome::Delivered)
        }
        fn timed_out(&self) -> Outcome {
            Outcome::Rejected
        }
    }

    struct Fixture {
        store: Arc<dyn Store>,
        gate: Arc<Gate>,
        metrics: Arc<Metrics>,
        actor: ActorRef<ShardMsg>,
        ctx: Arc<DispatchContext>,
        recipients: Vec<RecipientId>,
        _dir: tempfile::TempDir,
    }

    impl Fixture {
        /// `recipients` subscribed to one topic, `envelopes` published to it,
        /// and a shard actor started with `settings`; the gate starts closed.
        async fn start(recipients: u8, envelopes: usize, settings: DispatchSettings, lose_once: usize) -> Self {
            let delivery = DeliverySettings::default();
            Self::start_with(recipients, envelopes, settings, lose_once, Duration::ZERO, delivery, Fence::default())
                .await
        }

        /// Like `start`, with the shard's progress recorded as `progress` of
        /// the recipients says before the actor starts.
        async fn start_recorded(
            recipients: u8,
            envelopes: usize,
            settings: DispatchSettings,
            progress: impl FnOnce(&[RecipientId]) -> ShardProgress,
        ) -> Self {
            let delivery = DeliverySettings::default();
            let fence = Fence::default();
            Self::start_after(recipients, envelopes, settings, 0, Duration::ZERO, delivery, fence, progress).await
        }

        /// Like `start`, each answer taking `latency`, with these workers.
        async fn start_with(
            recipients: u8,
            envelopes: usize,
            settings: DispatchSettings,
            lose_once: usize,
            latency: Duration,
            delivery: DeliverySettings,
            fence: Fence,
        ) -> Self {
            Self::start_after(recipients, envelopes, settings, lose_once, latency, delivery, fence, |_| {
                ShardProgress::default()
            })
            .await
        }

        #[allow(clippy::too_many_arguments)]
        async fn start_after(
            recipients: u8,
            envelopes: usize,
            settings: DispatchSettings,
            lose_once: usize,
            latency: Duration,
            delivery: DeliverySettings,
            fence: Fence,
            progress: impl FnOnce(&[RecipientId]) -> ShardProgress,
        ) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), SHARDS).unwrap());
            let topic = Topic::parse(&[0, 42]).unwrap();
            let mut ids = Vec::new();
            for i in 0..recipients {
                let id = RecipientId::from_bytes([i + 1; 32]);
                let hash = RecipientSecret::parse(&[i + 1; 32]).unwrap().hash();
                let target = DeliveryTarget::Apns { token: format!("t{i}") };
                store.register(&id, &hash, &target, 1).await.unwrap();
                let add = Subscription { topic: topic.clone(), keys: None, include_commits: false };
                let update = SubscriptionUpdate::new(vec![add], vec![]).unwrap();
                store.update_subscriptions(&id, &hash, &update, 1, 100).await.unwrap();
                ids.push(id);
            }
            let new = |_| NewEnvelope::new(topic.clone(), SHARDS, EnvelopeKind::Application, true, None, vec![], None);
            let batch: Vec<NewEnvelope> = (0..envelopes).map(|i| new(i).unwrap()).collect();
            store.append(&batch, 2).await.unwrap();
            store.record_progress(ShardId::FIRST, &progress(&ids)).await.unwrap();

            let gate = Arc::new(Gate {
                latency,
                permits: Semaphore::new(0),
                free: Mutex::default(),
                waiting: AtomicUsize::new(0),
                sent: Mutex::default(),
                lose_once: Mutex::new(ids.iter().take(lose_once).copied().collect()),
            });
            let metrics = Arc::new(Metrics::new());
            let mut channels = Channels::default();
            channels.insert(gate.clone());
            let (workers, _handles) = DeliveryWorkers::start(WorkerContext::for_tests(
                512 * delivery.workers.get(),
                delivery,
                channels.clone(),
                store.clone(),
                metrics.clone(),
                Arc::new(Parking::of_providers(&channels, 512, SHARDS, metrics.clone())),
                fence.clone(),
            ));
            let ctx = Arc::new(DispatchContext {
                store: store.clone(),
                routes: Routes::new(Arc::new(workers.clone()), &channels),
                workers,
                channels,
                progress_interval: settings.progress_interval(false),
                settings,
                pages_ahead: 2,
                metrics: metrics.clone(),
                fence,
                panic_hook: PanicHook::default(),
            });
            let actor = Self::spawn(&ctx).await;
            Self { store, gate, metrics, actor, ctx, recipients: ids, _dir: dir }
        }

        async fn spawn(ctx: &Arc<DispatchContext>) -> ActorRef<ShardMsg> {
            let (actor, _) =
                Actor::spawn(None, ShardActor, (ShardId::FIRST, ctx.clone(), Arc::default())).await.unwrap();
            let _ = actor.cast(ShardMsg::Wake);
            actor
        }

        async fn position(&self) -> ShardPosition {
            self.store.shard_position(ShardId::FIRST).await.unwrap()
        }

        /// Lets the paused clock run, 100 ms at a time, until `done` holds.
        /// Gives up after a minute of real time, not of the paused clock:
        /// the store answers on its own threads, and while the runtime waits
        /// for them the paused clock jumps ahead, so a bound in virtual time
        /// can run out before a slow (loaded) store write lands.
        async fn until(&self, what: &str, done: impl AsyncFn(&Self) -> bool) {
            let give_up = std::time::Instant::now() + Duration::from_secs(60);
            while std::time::Instant::now() < give_up {
                if done(self).await {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("never: {what}");
        }

        /// Lets the paused clock run until the checkpoint reaches `checkpoint`.
        async fn until_checkpoint(&self, checkpoint: u64) {
            let reached = async |f: &Self| f.position().await.checkpoint >= checkpoint;
            self.until(&format!("the checkpoint reaches {checkpoint}"), reached).await;
        }

        fn waiting(&self) -> usize {
            self.gate.waiting.load(Ordering::SeqCst)
        }

        fn sends(&self) -> HashMap<(u64, RecipientId), usize> {
            self.gate.sent.lock().unwrap().clone()
        }
    }

    /// One worker sending one request at a time.
    fn one_at_a_time() -> DeliverySettings {
        DeliverySettings {
            workers: NonZeroUsize::MIN,
            max_in_flight_per_worker: Some(NonZeroUsize::MIN),
            ..DeliverySettings::default()
        }
    }

    fn settings(page: usize, pages_in_flight: usize) -> DispatchSettings {
        DispatchSettings {
            subscriber_page: NonZeroUsize::new(page).unwrap(),
            max_pages_in_flight: NonZeroUsize::new(pages_in_flight).unwrap(),
            poll_interval: Duration::from_millis(100),
            ..DispatchSettings::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_checkpoint_moves_only_after_every_first_attempt() {
        let f = Fixture::start(3, 2, settings(10, 16), 0).await;
        f.until("all six attempts are waiting", async |f| f.waiting() == 6).await;
        let held = f.position().await;
        assert_eq!((held.checkpoint, held.boundary), (0, 2), "no checkpoint while attempts are out");
        f.gate.permits.add_permits(5);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(f.position().await.checkpoint, 0, "one first attempt still unanswered");
        f.gate.permits.add_permits(1);
        f.until_checkpoint(2).await;
        let sends = f.sends();
        assert_eq!(sends.len(), 6, "every (envelope, subscription) once");
        assert!(sends.values().all(|n| *n == 1));
        // The checkpoint can be read a moment before the actor, answered by
        // the store's writer thread, counts the window.
        f.until("the window is counted", async |f| f.metrics.windows.get() == 1).await;
        assert_eq!(f.metrics.window_replays.get(), 0);
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn pages_in_flight_are_bounded() {
        // One subscriber per page, two pages at once: two attempts out, never three.
        let f = Fixture::start(5, 1, settings(1, 2), 0).await;
        f.until("two pages out", async |f| f.waiting() == 2).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(f.waiting(), 2, "a third page waits for one of the first two");
        for released in 1..=5 {
            f.gate.permits.add_permits(1);
            f.until("the next page", async |f| f.sends().len() == (released + 2).min(5)).await;
            assert!(f.waiting() <= 2);
        }
        f.gate.permits.add_permits(5);
        f.until_checkpoint(1).await;
        assert_eq!(f.sends().len(), 5);
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_with_a_lost_first_attempt_is_replayed_from_the_checkpoint() {
        let mut s = settings(10, 16);
        s.window_timeout = Duration::from_secs(5);
        let f = Fixture::start(2, 1, s, 1).await;
        f.gate.permits.add_permits(100);
        f.until("a replay", async |f| f.metrics.window_replays.get() == 1).await;
        f.until_checkpoint(1).await; // the replay completes the window
        let sends = f.sends();
        assert_eq!(sends[&(1, f.recipients[0])], 2, "the lost attempt is made again");
        assert_eq!(sends[&(1, f.recipients[1])], 1, "an answered first attempt is not re-sent");
        // The checkpoint can be read a moment before the actor, answered by
        // the store's writer thread, counts the window.
        f.until("the window is counted", async |f| f.metrics.windows.get() == 1).await;
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_slower_than_the_timeout_are_waited_for_not_re_sent() {
        // A slow but progressing window (PUSH-257), in small: every receiver answers after 3 s,
        // the window timeout is 2 s. Every first attempt is under way, so
        // nothing is re-sent.
        let mut s = settings(10, 16);
        s.window_timeout = Duration::from_secs(2);
        let f = Fixture::start_with(30, 2, s, 0, Duration::from_secs(3), DeliverySettings::default(), Fence::default())
            .await;
        f.gate.permits.add_permits(1000);
        f.until_checkpoint(2).await;
        let sends = f.sends();
        assert_eq!(sends.len(), 60);
        assert!(sends.values().all(|n| *n == 1), "no duplicates: {sends:?}");
        assert_eq!(f.metrics.window_replays.get(), 0);
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_window_that_keeps_progressing_is_never_replayed() {
        // 40 deliveries one at a time, 1 s each: a 40 s window, a 2 s timeout.
        let mut s = settings(10, 16);
        s.window_timeout = Duration::from_secs(2);
        let f = Fixture::start_with(40, 1, s, 0, Duration::from_secs(1), one_at_a_time(), Fence::default()).await;
        f.gate.permits.add_permits(1000);
        let started = Instant::now();
        f.until_checkpoint(1).await;
        assert!(started.elapsed() >= Duration::from_secs(40));
        assert_eq!(f.metrics.window_replays.get(), 0, "progress, so no replay");
        let sends = f.sends();
        assert_eq!(sends.len(), 40);
        assert!(sends.values().all(|n| *n == 1), "no duplicates");
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_window_moves_the_checkpoint_below_its_oldest_envelope_in_flight() {
        // Three envelopes to two recipients, one delivery at a time, 1 s each.
        // Permits for the first two envelopes only: the window cannot end
        // while the third is held, and the checkpoint must still follow the
        // first ones, so a replay after a kill -9 or a handover would repeat
        // only what is left.
        let f =
            Fixture::start_with(2, 3, settings(10, 16), 0, Duration::from_secs(1), one_at_a_time(), Fence::default())
                .await;
        f.gate.permits.add_permits(4);
        f.until_checkpoint(1).await;
        let checkpoint = f.position().await.checkpoint;
        assert!((1..3).contains(&checkpoint), "inside the window: {checkpoint}");
        let third = f.sends().keys().filter(|(seq, _)| *seq == 3).count();
        assert!(third <= 1, "envelope 3 waits for a permit: {third} of its deliveries under way");
        assert_eq!(f.metrics.windows.get(), 0, "the window is still running");
        f.gate.permits.add_permits(1000);
        f.until_checkpoint(3).await;
        let sends = f.sends();
        assert_eq!(sends.len(), 6);
        assert!(sends.values().all(|n| *n == 1), "no duplicates");
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_shard_stops_at_its_pages_in_flight_with_the_checkpoint_above_them() {
        // Four envelopes to three recipients, two pages (envelopes) at once:
        // released while envelopes 1 and 2 are out, it hands out no more,
        // stores the checkpoint once both are answered, and stops; the next
        // owner starts at envelope 3 and repeats nothing.
        let f = Fixture::start(3, 4, settings(10, 2), 0).await;
        f.until("two pages out", async |f| f.waiting() == 6).await;
        let _ = f.actor.cast(ShardMsg::Release);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(f.actor.get_status(), ractor::ActorStatus::Running, "pages are still in flight");
        f.gate.permits.add_permits(100);
        f.until("the actor stopped", async |f| f.actor.get_status() == ractor::ActorStatus::Stopped).await;
        assert_eq!(f.position().await.checkpoint, 2, "just above the answered pages");
        let sends = f.sends();
        assert_eq!(sends.len(), 6, "no page after the release: {sends:?}");
        assert!(sends.keys().all(|(seq, _)| *seq <= 2));
        assert_eq!(f.metrics.windows.get(), 0, "the window was handed over, not completed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_killed_shard_actors_first_attempts_not_yet_sent_are_never_sent() {
        // One worker sending one request at a time: the first delivery waits
        // at the provider, the other three in the worker, when the actor is
        // killed (a lost lease) and runs no post_stop.
        let f = Fixture::start_with(4, 1, settings(10, 4), 0, Duration::ZERO, one_at_a_time(), Fence::default()).await;
        f.until("the first delivery is at the provider", async |f| f.waiting() == 1).await;
        f.actor.kill();
        f.until("the actor stopped", async |f| f.actor.get_status() == ractor::ActorStatus::Stopped).await;
        f.gate.permits.add_permits(100);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(f.sends().len(), 1, "only the attempt under way: the replay sends the rest");
        assert_eq!(f.position().await.checkpoint, 0);
    }

    fn recording(page: usize, pages_in_flight: usize) -> DispatchSettings {
        DispatchSettings { progress_interval_ms: Some(100), ..settings(page, pages_in_flight) }
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_shard_records_how_far_into_its_envelope_it_got_and_the_next_owner_goes_on_from_there() {
        // Two envelopes to four recipients, one subscriber per page: released
        // while the first page of envelope 1 is out. The checkpoint cannot
        // pass envelope 1, but the record says it was answered up to the
        // first subscriber, so the next owner sends every delivery once.
        let f = Fixture::start(4, 2, recording(1, 1), 0).await;
        f.until("the first page is out", async |f| f.waiting() == 1).await;
        let _ = f.actor.cast(ShardMsg::Release);
        f.gate.permits.add_permits(1);
        f.until("the actor stopped", async |f| f.actor.get_status() == ractor::ActorStatus::Stopped).await;
        assert_eq!(f.position().await.checkpoint, 0, "envelope 1 is only partly answered");
        let recorded = f.store.shard_progress(ShardId::FIRST).await.unwrap();
        assert_eq!(recorded.of(1), Some(Answered::Partly(Partly::upto(f.recipients[0]))));
        assert_eq!(recorded.of(2), None);

        let next = Fixture::spawn(&f.ctx).await;
        f.gate.permits.add_permits(100);
        f.until_checkpoint(2).await;
        let sends = f.sends();
        assert_eq!(sends.len(), 8, "every delivery: {sends:?}");
        assert!(sends.values().all(|n| *n == 1), "nothing sent twice: {sends:?}");
        next.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_skips_what_a_former_owner_recorded_it_answered() {
        // Recorded: envelope 1 whole, envelope 2 up to the second subscriber.
        let f = Fixture::start_recorded(3, 3, recording(10, 4), |ids| {
            let after_second = Answered::Partly(Partly::upto(ids[1]));
            ShardProgress::of_window([(1, Some(Answered::Whole)), (2, Some(after_second)), (3, None)])
        })
        .await;
        let third = f.recipients[2];
        f.gate.permits.add_permits(100);
        f.until_checkpoint(3).await;
        let mut sent: Vec<_> = f.sends().into_keys().collect();
        sent.sort();
        let everyone = f.recipients.iter().map(|r| (3, *r));
        let expected: Vec<_> = [(2, third)].into_iter().chain(everyone).collect();
        assert_eq!(sent, expected, "envelope 1 skipped, envelope 2 resumed after the second subscriber");
        assert!(f.sends().values().all(|n| *n == 1));
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_window_skips_the_subscribers_a_former_owner_answered_out_of_order() {
        // Recorded: envelope 1 answered to the second subscriber only,
        // envelope 2 up to the first and to the third.
        let f = Fixture::start_recorded(4, 2, recording(10, 4), |ids| {
            let one = Partly::new(None, [ids[1]]).map(Answered::Partly);
            let two = Partly::new(Some(ids[0]), [ids[2]]).map(Answered::Partly);
            ShardProgress::of_window([(1, one), (2, two)])
        })
        .await;
        let r = f.recipients.clone();
        f.gate.permits.add_permits(100);
        f.until_checkpoint(2).await;
        let mut sent: Vec<_> = f.sends().into_keys().collect();
        sent.sort();
        assert_eq!(sent, [(1, r[0]), (1, r[2]), (1, r[3]), (2, r[1]), (2, r[3])]);
        assert!(f.sends().values().all(|n| *n == 1));
        f.actor.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_killed_owners_answers_beyond_its_oldest_open_delivery_are_not_repeated() {
        // One page of four: the first delivery waits at the provider, the
        // other three are answered at once. The record names those three, so
        // after the actor is killed (a lost lease) the next owner sends only
        // the first again: the one in flight at the handover.
        let f = Fixture::start(4, 1, recording(10, 4), 0).await;
        let r = f.recipients.clone();
        f.gate.free.lock().unwrap().extend(&r[1..]);
        let expected = Answered::Partly(Partly::new(None, r[1..].iter().copied()).unwrap());
        let recorded =
            async |f: &Fixture| f.store.shard_progress(ShardId::FIRST).await.unwrap().of(1) == Some(expected.clone());
        f.until("the answered deliveries beyond the open one are recorded", recorded).await;
        f.actor.kill();
        f.until("the actor stopped", async |f| f.actor.get_status() == ractor::ActorStatus::Stopped).await;

        let next = Fixture::spawn(&f.ctx).await;
        f.gate.permits.add_permits(100);
        f.until_checkpoint(1).await;
        let sends = f.sends();
        assert_eq!(sends[&(1, r[0])], 2, "in flight at the handover: sent by each owner");
        assert!(r[1..].iter().all(|id| sends[&(1, *id)] == 1), "answered before it: never again: {sends:?}");
        next.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_shard_dispatches_nothing_until_its_lease_is_renewed() {
        // The lease deadline is 2 s away and no renewal comes.
        let deadline = Instant::now() + Duration::from_secs(2);
        let owned = OwnedShards { shards: [(ShardId::FIRST, deadline)].into(), settled: true, ..Default::default() };
        let (tx, rx) = tokio::sync::watch::channel(owned);
        let s = settings(1, 1); // one subscriber per page, one page at a time
        let delivery = DeliverySettings::default();
        let f = Fixture::start_with(4, 1, s, 0, Duration::ZERO, delivery, Fence::leased(rx)).await;
        f.until("the first page is out", async |f| f.waiting() == 1).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        f.gate.permits.add_permits(10);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(f.sends().len(), 1, "past the deadline no further page is produced");
        assert_eq!(f.position().await.checkpoint, 0);
        // A late renewal lifts the fence: the window goes on from where it was.
        tx.send_modify(|o| {
            o.shards.insert(ShardId::FIRST, Instant::now() + Duration::from_secs(60));
        });
        f.until_checkpoint(1).await;
        let sends = f.sends();
        assert_eq!(sends.len(), 4);
        assert!(sends.values().all(|n| *n == 1), "nothing sent twice");
        f.actor.stop(None);
    }
}
