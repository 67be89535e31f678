use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::ticker::spawn_ticker;
use super::{Decision, DispatchContext, decide};
use crate::delivery::{Delivery, FirstAttemptLatch};
use crate::domain::{RecipientId, ShardId, StoredEnvelope};

pub enum ShardMsg {
    /// New envelopes may be above the checkpoint.
    Wake,
    /// Periodic: look for work, replay a window that has run too long.
    Tick,
    /// Produce the next page of deliveries of the current window.
    Pump,
    /// Every delivery of one page of window `window` had its first attempt.
    PageDone { window: u64 },
    /// Shutdown: start no new window, finish the current one, then stop.
    Drain,
}

/// Owns one topic shard's dispatch. Holds no durable state in memory: a
/// restarted actor resumes from the stored checkpoint.
pub struct ShardActor;

pub struct ShardState {
    shard: ShardId,
    ctx: Arc<DispatchContext>,
    window: Option<Window>,
    next_window_id: u64,
    /// This shard's last contribution to the summed lag gauge.
    lag: i64,
    draining: bool,
    ticker: tokio::task::JoinHandle<()>,
}

struct Window {
    id: u64,
    /// Envelopes not yet fully paged, front first.
    envelopes: VecDeque<Arc<StoredEnvelope>>,
    /// Last subscriber of the front envelope already paged.
    cursor: Option<RecipientId>,
    /// The checkpoint this window moves to when complete.
    end: u64,
    pages_in_flight: usize,
    pump_queued: bool,
    started: Instant,
}

impl Actor for ShardActor {
    type Msg = ShardMsg;
    type State = ShardState;
    type Arguments = (ShardId, Arc<DispatchContext>);

    async fn pre_start(
        &self,
        myself: ActorRef<ShardMsg>,
        (shard, ctx): Self::Arguments,
    ) -> Result<ShardState, ActorProcessingErr> {
        let interval = Duration::from_millis(ctx.settings.poll_interval_ms);
        let ticker = spawn_ticker(myself, interval, || ShardMsg::Tick);
        Ok(ShardState { shard, ctx, window: None, next_window_id: 0, lag: 0, draining: false, ticker })
    }

    async fn post_stop(&self, _: ActorRef<ShardMsg>, state: &mut ShardState) -> Result<(), ActorProcessingErr> {
        state.ticker.abort();
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
            ShardMsg::Wake => state.start_window(&myself).await,
            ShardMsg::Tick => {
                state.replay_if_stuck();
                state.start_window(&myself).await
            }
            ShardMsg::Pump => state.pump(&myself).await,
            ShardMsg::PageDone { window } => state.page_done(&myself, window).await,
            ShardMsg::Drain => {
                state.draining = true;
                Ok(())
            }
        };
        if state.draining && state.window.is_none() {
            // The last window's checkpoint is stored: nothing is left in memory.
            myself.stop(Some("drained".into()));
        }
        if let Err(e) = result {
            // Drop the window; the next tick replays it from the durable checkpoint.
            tracing::warn!(shard = state.shard.0, error = %e, "dispatch step failed; window will be replayed");
            state.window = None;
        }
        Ok(())
    }
}

type StepResult = Result<(), crate::store::StoreError>;

impl ShardState {
    /// Reads a window from the checkpoint up to the boundary, unless one runs.
    async fn start_window(&mut self, myself: &ActorRef<ShardMsg>) -> StepResult {
        if self.window.is_some() || self.draining {
            return Ok(());
        }
        let store = self.ctx.store.clone();
        let position = store.shard_position(self.shard).await?;
        self.set_lag(position.boundary.saturating_sub(position.checkpoint) as i64);
        if position.boundary <= position.checkpoint {
            return Ok(());
        }
        let limit = self.ctx.settings.window_envelopes;
        // PUSH-257: nothing above the boundary read now; nothing below the checkpoint.
        let envelopes =
            store.read_window(self.shard, position.checkpoint, position.boundary, limit).await?;
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
        self.window = Some(Window {
            id: self.next_window_id,
            envelopes: envelopes.into_iter().map(Arc::new).collect(),
            cursor: None,
            end,
            pages_in_flight: 0,
            pump_queued: false,
            started: Instant::now(),
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
        let Some(w) = self.window.as_mut() else {
            return Ok(());
        };
        w.pump_queued = false;
        if w.pages_in_flight >= ctx.settings.max_pages_in_flight {
            return Ok(()); // PageDone pumps again.
        }
        let Some(envelope) = w.envelopes.front().cloned() else {
            return self.complete_if_done(myself).await;
        };
        let page_size = ctx.settings.subscriber_page;
        let page = ctx.store.subscribers(&envelope.topic, w.cursor.as_ref(), page_size).await?;
        if page.len() < page_size {
            w.envelopes.pop_front();
            w.cursor = None;
        } else {
            w.cursor = page.last().map(|s| s.recipient.id);
        }
        let mut recipients = Vec::with_capacity(page.len());
        for subscriber in page {
            match decide(&envelope, &subscriber, &ctx.channels) {
                Decision::Deliver => recipients.push(Arc::new(subscriber.recipient)),
                Decision::Suppressed => ctx.metrics.suppressed.inc(),
                Decision::Excluded => {}
            }
        }
        if !recipients.is_empty() {
            w.pages_in_flight += 1;
            let window = w.id;
            let me = myself.clone();
            let latch = Arc::new(FirstAttemptLatch::new(recipients.len(), move || {
                let _ = me.cast(ShardMsg::PageDone { window });
            }));
            let batch = recipients
                .into_iter()
                .map(|r| Delivery::new(envelope.clone(), r, latch.clone()))
                .collect();
            // Waits while the workers are full: backpressure.
            if ctx.workers.submit(batch).await.is_err() {
                return Ok(()); // Shutting down; the window is replayed at next start.
            }
        }
        self.maybe_panic_for_test();
        self.queue_pump(myself);
        Ok(())
    }

    async fn page_done(&mut self, myself: &ActorRef<ShardMsg>, window: u64) -> StepResult {
        let Some(w) = self.window.as_mut().filter(|w| w.id == window) else {
            return Ok(()); // A replayed window's late answer.
        };
        w.pages_in_flight -= 1;
        if w.envelopes.is_empty() {
            self.complete_if_done(myself).await
        } else {
            self.queue_pump(myself);
            Ok(())
        }
    }

    /// The checkpoint moves only when every page has had its first attempts.
    async fn complete_if_done(&mut self, myself: &ActorRef<ShardMsg>) -> StepResult {
        let Some(w) = self.window.as_ref() else { return Ok(()) };
        if !w.envelopes.is_empty() || w.pages_in_flight > 0 {
            return Ok(());
        }
        self.ctx.store.advance_checkpoint(self.shard, w.end).await?;
        self.ctx.metrics.windows.inc();
        self.ctx.metrics.window_duration.observe(w.started.elapsed().as_secs_f64());
        self.window = None;
        let _ = myself.cast(ShardMsg::Wake);
        Ok(())
    }

    /// A window whose first attempts never all finish (a lost delivery, a
    /// crashed worker) is abandoned and read again from the checkpoint.
    fn replay_if_stuck(&mut self) {
        let timeout = Duration::from_secs(self.ctx.settings.window_timeout_seconds);
        if self.window.as_ref().is_some_and(|w| w.started.elapsed() > timeout) {
            self.ctx.metrics.window_replays.inc();
            tracing::warn!(shard = self.shard.0, "window timed out; replaying from the checkpoint");
            self.window = None;
        }
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
