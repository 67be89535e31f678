use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::{AbortHandle, AbortRegistration, Abortable};
use futures::stream::{FuturesUnordered, StreamExt as _};
use futures::{Future, FutureExt as _};
use slab::Slab;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
// tokio's clock: the watchdog's sweep compares it with its interval's, which
// tests pause and advance.
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::time::DelayQueue;

use super::detach::{self, Answered, DETACH_AFTER, DETACH_CHECK, Detach, Then};
use super::history::{AttemptRecord, History};
use super::lanes::Lanes;
use super::parking::{Admission, Parking, STALLED_AFTER};
use super::series::Series;
use super::{Delivery, DeliverySettings, FirstAttempt};
use crate::channel::{Channels, Outcome, Push, Sent};
use crate::domain::{Channel, ParkedDelivery, ParkedPlace, Timestamp};
use crate::metrics::{Deleted, Metrics, ParkReason};
use crate::ownership::Fence;
use crate::store::Store;

/// What every worker shares (read-only).
pub struct WorkerContext {
    pub settings: DeliverySettings,
    /// `settings.in_flight_per_worker` for the configured channels.
    pub max_in_flight: std::num::NonZeroUsize,
    pub max_attempts: u32,
    pub channels: Channels,
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    /// The shards this node may still dispatch (all of them on one node).
    pub fence: Fence,
    /// The channels' breakers and parked deliveries, shared with dispatch.
    pub parking: Arc<Parking>,
    /// The delivery history each settled attempt is recorded in; `None`: off.
    pub history: Option<History>,
    /// Test hook (`FANOUT_DANGEROUS_PANIC_ATTEMPTS`): this many attempts
    /// panic, each losing its delivery as a bug in a provider would, so a
    /// window replay re-sends them. 0 (the default) disables it.
    pub dangerous_panic_attempts: AtomicU64,
}

#[cfg(test)]
impl WorkerContext {
    /// Tests: `in_flight` attempts at once over `settings`' workers, three
    /// attempts per delivery, no test hook.
    pub(crate) fn for_tests(
        in_flight: usize,
        settings: DeliverySettings,
        channels: Channels,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        parking: Arc<Parking>,
        fence: Fence,
    ) -> Arc<Self> {
        Arc::new(Self {
            max_in_flight: settings.in_flight_per_worker(in_flight),
            settings,
            max_attempts: 3,
            channels,
            store,
            metrics,
            fence,
            parking,
            history: None,
            dangerous_panic_attempts: AtomicU64::new(0),
        })
    }
}

/// How long a provider may take over one send, waits for a pool slot and
/// the rate limit included, before the worker gives up on it. The provider
/// bounds the request itself to `ATTEMPT_TIMEOUT`; this only catches a send
/// stuck before its request, which is then not an attempt.
const WATCHDOG: Duration = Duration::from_secs(120);
/// The delay before a send the watchdog gave up on is tried again.
const WATCHDOG_DELAY: Duration = Duration::from_secs(1);
/// How often a worker looks for sends older than `WATCHDOG`, so a stuck
/// send is given up on between `WATCHDOG` and `WATCHDOG + WATCHDOG_SWEEP`
/// after it started. One timer per worker, not one per attempt: each
/// attempt's own registered and cleared a timer-wheel entry (finding 11).
const WATCHDOG_SWEEP: Duration = Duration::from_secs(5);
/// How long a first attempt of a shard this node may no longer hold waits
/// for the lease to be renewed before it is handed back to its window
/// unsent. Longer than a lease: by then another node owns the shard and
/// replays it from the checkpoint, which this delivery is above.
const FENCED_HOLD: Duration = Duration::from_secs(30);
/// How often held first attempts look at the fence again.
const FENCE_RECHECK: Duration = Duration::from_millis(250);
/// How often a worker whose ready deliveries wait for a channel's slots
/// looks whether they waited too long (`Lanes::overdue`).
const READY_RECHECK: Duration = Duration::from_millis(100);
/// The delivery history gets a worker's records in batches of this many,
/// or what there is every `HISTORY_FLUSH`: one hand-over per record would
/// wake the history's task for each.
const HISTORY_BATCH: usize = 256;
const HISTORY_FLUSH: Duration = Duration::from_millis(50);

/// An attempt in flight, as the worker watches it.
struct Watch {
    started: Instant,
    /// Gives up on it (the watchdog).
    abort: AbortHandle,
    detach: Detach,
}

/// A worker's loop: take a batch when its channels have room (`Lanes`),
/// start attempts only while their channel has a free slot and the worker
/// fewer than `max_in_flight` in flight (first attempts and retries alike),
/// collect answers, re-attempt from the timer wheel, and park what a
/// channel cannot take now (`Parking`). Ends when its queue is closed and
/// nothing is in flight, ready, waiting or being parked.
///
/// The attempts in flight are futures of this task, not tasks of their own:
/// a task per attempt cost a spawn, a `JoinSet` entry and a cross-thread
/// wake-up per delivery (docs/BENCHMARKS-HISTORY.md, finding 9), and the runtime's
/// threads are shared by the eight workers anyway.
pub(super) async fn run(ctx: Arc<WorkerContext>, mut queue: mpsc::Receiver<Vec<Delivery>>) {
    let parking = &ctx.parking;
    let mut lanes = Lanes::new(&parking.slots(ctx.settings.workers.get()), ctx.max_in_flight.get());
    let mut in_flight = FuturesUnordered::new();
    // Every attempt in flight, by the key its `Attempted` carries back
    // (kept after its answer while a detached one's row is being written).
    let mut watched: Slab<Watch> = Slab::new();
    // Row writes of first attempts detached from their pages (`detach`), one
    // per check, answering the attempts' keys, and answers to apply, with
    // the place of a detached attempt's row.
    let mut detaching: JoinSet<(Vec<usize>, bool)> = JoinSet::new();
    let mut answers: Vec<(Answered, Option<ParkedPlace>)> = Vec::new();
    let mut detach_check = tokio::time::interval(DETACH_CHECK);
    detach_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut sweep = tokio::time::interval(WATCHDOG_SWEEP);
    sweep.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut series = Series::default();
    // A batch taken from the queue that its channels have no room for yet,
    // and since when.
    let mut held: Option<(Instant, Vec<Delivery>)> = None;
    let mut retries: DelayQueue<Delivery> = DelayQueue::new();
    // PUSH-234 compare-and-deletes; the worker ends only after they have.
    let mut deletions: JoinSet<()> = JoinSet::new();
    // Deliveries to park, and the park writes under way.
    let mut to_park: Vec<(Delivery, ParkReason)> = Vec::new();
    let mut parks: JoinSet<Parked> = JoinSet::new();
    // First attempts of shards whose lease may have run out, since when.
    let mut fenced: VecDeque<(Instant, Delivery)> = VecDeque::new();
    let mut fence_check = tokio::time::interval(FENCE_RECHECK);
    fence_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Looks for a held batch or ready queue that waited too long for a
    // channel that cannot keep up (`Lanes::takes`, `Lanes::overdue`).
    let mut ready_check = tokio::time::interval(READY_RECHECK);
    ready_check.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut queue_open = true;
    // The history's records of settled attempts, handed over together.
    let mut noted: Vec<AttemptRecord> = Vec::new();
    let mut history_flush = tokio::time::interval(HISTORY_FLUSH);
    history_flush.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        for (answer, place) in std::mem::take(&mut answers) {
            let Answered::Done(delivery, sent, sent_at) = answer else {
                // A panicking attempt: its row, if it has one, stays.
                if let Some(place) = place {
                    detach::settle(place, Then::Keep, parking, &ctx.store, &ctx.metrics, &mut deletions);
                }
                continue;
            };
            let not_sent = !sent.outcome.is_attempt();
            let retry = settle(&ctx, &mut series, delivery, sent, sent_at, &mut deletions, &mut noted);
            if let Some(place) = place {
                let then = retry.as_ref().map_or(Then::Delete, |(delivery, _)| Then::Retry(delivery));
                detach::settle(place, then, parking, &ctx.store, &ctx.metrics, &mut deletions);
                continue;
            }
            let Some((mut delivery, delay)) = retry else { continue };
            let channel = delivery.recipient.target.channel();
            let retrying = lanes.retrying(channel);
            if *retrying >= ctx.settings.max_retrying_per_worker.get() || parking.is_open(channel) {
                // Past its channel's retry bound, or its provider failing
                // every attempt: kept durably, not in memory, and sent when
                // the channel takes it.
                to_park.push((delivery, ParkReason::Retry));
            } else {
                if delivery.unparked && delivery.attempts > 0 && !not_sent {
                    // Its retry lives in memory now: its row may go.
                    settle_first(&ctx, &mut delivery);
                }
                *retrying += 1;
                ctx.metrics.retry_queue.inc();
                retries.insert(delivery, delay);
            }
        }
        if noted.len() >= HISTORY_BATCH {
            hand_over(ctx.history.as_ref(), &mut noted);
        }
        let now = Instant::now();
        if let Some((since, batch)) = held.take() {
            if lanes.takes(&batch, parking, now, since) {
                to_park.extend(lanes.take(batch, parking, now));
            } else {
                held = Some((since, batch));
            }
        }
        while let Some(delivery) = lanes.next_to_start() {
            let channel = delivery.recipient.target.channel();
            parking.held(channel, -1);
            // Its window was dropped (the shard actor stopped, e.g. its
            // lease was lost or handed over): the replay from the stored
            // checkpoint sends it, so this copy would only repeat it.
            if delivery.first_attempt.as_ref().is_some_and(FirstAttempt::window_dropped) {
                if delivery.unparked {
                    parking.unparked(channel, 1);
                }
                continue;
            }
            // A paused or partitioned node does not send first attempts of
            // a shard it may have lost: the new owner replays them from its
            // checkpoint, so sending them too would only repeat them.
            // Retries are sent: their first attempt moved the checkpoint.
            if delivery.first_attempt.is_some() && !ctx.fence.holds(delivery.envelope.shard) {
                fenced.push_back((now, delivery));
                continue;
            }
            let admission = parking.admit(&delivery.recipient.target, now);
            if admission == Admission::Shed {
                let reason = if delivery.first_attempt.is_some() { ParkReason::Breaker } else { ParkReason::Retry };
                to_park.push((delivery, reason));
                continue;
            }
            lanes.started(channel);
            series.of(channel).in_flight(&ctx.metrics).inc();
            let (abort, registration) = AbortHandle::new_pair();
            let key = watched.insert(Watch { started: now, abort, detach: Detach::of(&delivery) });
            in_flight.push(attempt(&ctx, delivery, admission, key, registration));
        }
        if !to_park.is_empty() {
            park(&ctx, std::mem::take(&mut to_park), &mut fenced, &mut parks, now);
        }
        tokio::select! {
            batch = queue.recv(), if queue_open && held.is_none() => {
                match batch {
                    Some(batch) => {
                        ctx.metrics.delivery_queue.dec();
                        // A delivery of a replayed page that was still
                        // pending is sent by the replay: drop this copy.
                        let batch: Vec<_> = batch
                            .into_iter()
                            .filter(|d| {
                                let kept = d.first_attempt.as_ref().is_none_or(FirstAttempt::accept);
                                if !kept && d.unparked {
                                    parking.unparked(d.recipient.target.channel(), 1);
                                }
                                kept
                            })
                            .collect();
                        let now = Instant::now();
                        lanes.arrived(&batch, parking, now);
                        held = Some((now, batch));
                    }
                    None => queue_open = false,
                }
            }
            Some(attempted) = in_flight.next() => {
                let watch = &mut watched[attempted.key];
                lanes.finished(attempted.channel);
                let mut channel = series.of(attempted.channel);
                channel.in_flight(&ctx.metrics).dec();
                parking.ended(attempted.channel, Instant::now());
                if attempted.answered {
                    channel.provider_latency(&ctx.metrics).observe(watch.started.elapsed().as_secs_f64());
                }
                let answer = match attempted.done {
                    Some((delivery, sent)) => {
                        if attempted.provider {
                            let success = sent.outcome.answered_by_provider();
                            parking.record(&delivery.recipient.target, success, attempted.admission, Instant::now());
                        }
                        Answered::Done(delivery, sent, attempted.sent_at)
                    }
                    None => Answered::Lost,
                };
                if let Detach::Writing { answer: kept, .. } = &mut watch.detach {
                    // Applied once its row is written.
                    *kept = Some(answer);
                } else {
                    let place = match watched.remove(attempted.key).detach {
                        Detach::Detached(place) => Some(place),
                        _ => None,
                    };
                    answers.push((answer, place));
                }
            }
            Some(written) = detaching.join_next() => {
                // A write task cannot panic short of a bug in the store; its
                // attempt's page then waits for the window's replay.
                let Ok((keys, stored)) = written else { continue };
                for key in keys {
                    if let Some(answer) = watched[key].detach.written(stored, &ctx.metrics) {
                        let Detach::Detached(place) = watched.remove(key).detach else { unreachable!("written") };
                        answers.push((answer, Some(place)));
                    }
                }
            }
            _ = detach_check.tick(), if !watched.is_empty() => {
                let now = Instant::now();
                let (mut keys, mut rows) = (Vec::new(), Vec::new());
                for (key, watch) in &mut watched {
                    let age = now.saturating_duration_since(watch.started);
                    if age < STALLED_AFTER {
                        continue;
                    }
                    // Not a first attempt of a shard this node may have lost:
                    // its new owner's replay sends it.
                    if let Some((shard, channel)) = watch.detach.may()
                        && (age >= DETACH_AFTER || parking.stalled(channel, now))
                        && ctx.fence.holds(shard)
                        && parking.others_active(channel, now)
                        && let Some(row) = watch.detach.begin(parking)
                    {
                        keys.push(key);
                        rows.push(row);
                    }
                }
                if !rows.is_empty() {
                    let store = ctx.store.clone();
                    detaching.spawn(async move {
                        let stored = store.parked().park(&rows).await.is_ok();
                        (keys, stored)
                    });
                }
            }
            Some(expired) = std::future::poll_fn(|cx| retries.poll_expired(cx)) => {
                ctx.metrics.retry_queue.dec();
                let delivery = expired.into_inner();
                *lanes.retrying(delivery.recipient.target.channel()) -= 1;
                lanes.push(delivery, parking, Instant::now());
            }
            Some(parked) = parks.join_next() => {
                if let Ok(parked) = parked {
                    parked.settle(&ctx, &mut series);
                }
            }
            Some(_) = deletions.join_next() => {}
            _ = fence_check.tick(), if !fenced.is_empty() => {
                let now = Instant::now();
                for (since, delivery) in std::mem::take(&mut fenced) {
                    if delivery.first_attempt.as_ref().is_some_and(FirstAttempt::window_dropped) {
                        // The shard actor that made it is gone (its lease was
                        // lost): its replay sends it, even if this node takes
                        // the shard again.
                        if delivery.unparked {
                            parking.unparked(delivery.recipient.target.channel(), 1);
                        }
                        continue;
                    }
                    if ctx.fence.holds(delivery.envelope.shard) {
                        lanes.push(delivery, parking, Instant::now());
                    } else if now.saturating_duration_since(since) >= FENCED_HOLD {
                        // Pending again in its page: sent by a replay if
                        // this node keeps the shard, else by the new owner.
                        if let Some(first) = &delivery.first_attempt {
                            first.lost();
                        }
                        if delivery.unparked {
                            parking.unparked(delivery.recipient.target.channel(), 1);
                        }
                    } else {
                        fenced.push_back((since, delivery));
                    }
                }
            }
            _ = ready_check.tick(), if lanes.waiting() || held.is_some() => {
                to_park.extend(lanes.overdue(parking, Instant::now()));
            }
            _ = history_flush.tick(), if !noted.is_empty() => hand_over(ctx.history.as_ref(), &mut noted),
            _ = sweep.tick(), if !watched.is_empty() => {
                let now = Instant::now();
                for (_, watch) in &watched {
                    if now.saturating_duration_since(watch.started) >= WATCHDOG {
                        watch.abort.abort();
                    }
                }
            }
            else => break,
        }
        if !queue_open
            && held.is_none()
            && lanes.is_idle()
            && retries.is_empty()
            && deletions.is_empty()
            && to_park.is_empty()
            && parks.is_empty()
            && detaching.is_empty()
            && answers.is_empty()
        {
            break;
        }
    }
}

/// Stores `deliveries` in the parked table, one write for them all. A first
/// attempt of a shard this node may have lost is held with the others the
/// fence holds back (its new owner's replay would send it; parking it would
/// only repeat it).
fn park(
    ctx: &Arc<WorkerContext>,
    deliveries: Vec<(Delivery, ParkReason)>,
    fenced: &mut VecDeque<(Instant, Delivery)>,
    parks: &mut JoinSet<Parked>,
    now: Instant,
) {
    let mut parked = Vec::with_capacity(deliveries.len());
    for (delivery, reason) in deliveries {
        if delivery.first_attempt.is_some() && !ctx.fence.holds(delivery.envelope.shard) {
            fenced.push_back((now, delivery));
        } else {
            parked.push((delivery, reason));
        }
    }
    if parked.is_empty() {
        return;
    }
    let rows: Vec<ParkedDelivery> = parked.iter().map(|(d, _)| detach::parked_row(d)).collect();
    let store = ctx.store.clone();
    parks.spawn(async move {
        let written = store.parked().park(&rows).await;
        Parked { deliveries: parked, written: written.is_ok() }
    });
}

/// A park write's deliveries and whether it was stored.
struct Parked {
    deliveries: Vec<(Delivery, ParkReason)>,
    written: bool,
}

impl Parked {
    /// Stored: each first attempt is settled for its page (PUSH-257 holds
    /// through the parked row) and its shard's owner told. Not stored: a
    /// first attempt is pending again, for the window's replay; a retry
    /// ends exhausted (spec 000 §7 retries "up to" max_attempts), counted.
    fn settle(self, ctx: &Arc<WorkerContext>, series: &mut Series) {
        let m = &ctx.metrics;
        for (mut delivery, reason) in self.deliveries {
            let channel = delivery.recipient.target.channel();
            if delivery.unparked {
                ctx.parking.unparked(channel, 1);
            }
            if self.written {
                m.parking.parked.with_label_values(&[channel.as_str(), reason.as_str()]).inc();
                ctx.parking.parked(delivery.envelope.shard, channel, delivery.envelope.sequence_id);
                if let Some(first) = delivery.first_attempt.take() {
                    first.park();
                }
                continue;
            }
            m.parking.park_failures.with_label_values(&[channel.as_str()]).inc();
            match delivery.first_attempt.take() {
                Some(first) => first.lost(),
                None => {
                    let outcome = Outcome::transient(Duration::ZERO);
                    series.of(channel).deliveries(m, outcome.delivery_label()).inc();
                }
            }
        }
    }
}

/// What an attempt's future ends with.
struct Attempted {
    /// Its key in the worker's watchdog.
    key: usize,
    channel: Channel,
    /// What the breakers let it be (`Probe`: its answer decides one).
    admission: Admission,
    /// The delivery and what its channel reported, or `None` when the
    /// attempt panicked.
    done: Option<(Delivery, Sent)>,
    /// When the attempt started.
    sent_at: Timestamp,
    /// A provider answered (not `NotSent`, not a removed channel): the
    /// time since the attempt's start is its provider latency.
    answered: bool,
    /// It went to the channel's provider (the channel is configured).
    provider: bool,
}

/// One attempt of `delivery`, `key` in the worker's watchdog, which aborts
/// it through `registration`. Its metrics are the worker's to count.
fn attempt(
    ctx: &Arc<WorkerContext>,
    delivery: Delivery,
    admission: Admission,
    key: usize,
    registration: AbortRegistration,
) -> impl Future<Output = Attempted> + use<> {
    let ctx = ctx.clone();
    let first = delivery.first_attempt.clone();
    let channel = delivery.recipient.target.channel();
    let unparked = delivery.unparked.then(|| ctx.parking.clone());
    let sent_at = Timestamp::now();
    let send = async move {
        if ctx.dangerous_panic_attempts.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            panic!("injected attempt panic (FANOUT_DANGEROUS_PANIC_ATTEMPTS)");
        }
        let Some(provider) = ctx.channels.get(channel) else {
            // The channel's table was removed: fail without a provider request.
            return (delivery, Sent::from(Outcome::Rejected), false, false);
        };
        let push = Push::Envelope { recipient: &delivery.recipient, envelope: &delivery.envelope };
        let sent = match Abortable::new(provider.send_answered(push), registration).await {
            Ok(Ok(sent)) => sent,
            // Every worker-sent channel's row takes envelopes: refused, it is stopped.
            Ok(Err(_)) => Outcome::Rejected.into(),
            Err(_) => {
                tracing::warn!(
                    channel = channel.as_str(),
                    "a send made no progress for the watchdog's time; trying again"
                );
                Outcome::NotSent { delay: WATCHDOG_DELAY }.into()
            }
        };
        let answered = sent.outcome.is_attempt();
        (delivery, sent, answered, true)
    };
    AssertUnwindSafe(send).catch_unwind().map(move |done| match done {
        Ok((delivery, sent, answered, provider)) => {
            Attempted { key, channel, admission, done: Some((delivery, sent)), sent_at, answered, provider }
        }
        // A panicking attempt loses its delivery: pending again in its
        // page, which a replay re-sends.
        Err(_) => {
            if let Some(first) = first {
                first.lost();
            }
            if let Some(parking) = unparked {
                parking.unparked(channel, 1);
            }
            Attempted { key, channel, admission, done: None, sent_at, answered: false, provider: false }
        }
    })
}

/// Settles `delivery`'s first attempt (or its unpark batch's place: its
/// parked row may go), if it still has one.
fn settle_first(ctx: &WorkerContext, delivery: &mut Delivery) {
    if let Some(first) = delivery.first_attempt.take() {
        first.settle();
        if delivery.unparked {
            delivery.unparked = false;
            ctx.parking.unparked(delivery.recipient.target.channel(), 1);
        }
    }
}

/// Applies an attempt's outcome (section 7): retry a transient one up to
/// max_attempts, delete on terminal (PUSH-234), stop otherwise. Returns the
/// delivery to retry and its delay, for the caller to keep.
fn settle(
    ctx: &Arc<WorkerContext>,
    series: &mut Series,
    mut delivery: Delivery,
    sent: Sent,
    sent_at: Timestamp,
    deletions: &mut JoinSet<()>,
    noted: &mut Vec<AttemptRecord>,
) -> Option<(Delivery, Duration)> {
    let m = &ctx.metrics;
    let outcome = sent.outcome;
    let channel = delivery.recipient.target.channel();
    let mut series = series.of(channel);
    let mut note = |delivery: &Delivery, next: Next| {
        if ctx.history.is_some() {
            noted.push(record(delivery, &sent, sent_at, next));
        }
    };
    if let Outcome::NotSent { delay } = outcome {
        // Not an attempt: no count, no first-attempt latch, just later.
        series.unsent(m).inc();
        note(&delivery, Next::RetryIn(delay));
        return Some((delivery, delay));
    }
    delivery.attempts += 1;
    series.attempts(m, outcome.label()).inc();
    if delivery.attempts == 1 {
        delivery.first_sent_at = Some(sent_at);
        let stored = Timestamp::from_unix_nanos(delivery.envelope.server_ts_ns);
        let waited = Timestamp::now().saturating_duration_since(stored).as_secs_f64();
        series.publish_to_attempt(m).observe(waited);
    }
    let retried = outcome.retry_delay().filter(|_| delivery.attempts < ctx.max_attempts);
    // An unparked delivery to retry keeps its unpark batch's latch until
    // the caller has kept it: parked again (its row stays), or in memory
    // (`settle_unparked`); settled now, its row could go first.
    if retried.is_none() || !delivery.unparked {
        settle_first(ctx, &mut delivery);
    }
    let final_outcome = match outcome.retry_delay() {
        Some(delay) => {
            delivery.all_gone &= matches!(outcome, Outcome::Gone { .. });
            if retried.is_some() {
                series.retries(m).inc();
                series.retry_delay(m).observe(delay.as_secs_f64());
                note(&delivery, Next::RetryIn(delay));
                return Some((delivery, delay));
            }
            // Gone (HTTPS 404/410): terminal when every attempt said so.
            if delivery.all_gone { Outcome::Terminal } else { outcome }
        }
        None => outcome,
    };
    series.deliveries(m, final_outcome.delivery_label()).inc();
    note(&delivery, Next::Ended(final_outcome));
    if final_outcome == Outcome::Terminal {
        // PUSH-234: only if the stored registration is still the one we used.
        let ctx = ctx.clone();
        let recipient = delivery.recipient.clone();
        deletions.spawn(async move {
            match ctx.store.delete_recipient_if_unchanged(&recipient).await {
                Ok(true) => ctx.metrics.recipients_deleted_by(Deleted::Terminal).inc(),
                Ok(false) => {}
                // Counted and logged by the instrumented store.
                Err(_) => {}
            }
        });
    }
    None
}

/// Hands the records noted so far to the history.
fn hand_over(history: Option<&History>, noted: &mut Vec<AttemptRecord>) {
    if let Some(history) = history {
        history.record(std::mem::take(noted));
    }
}

/// What follows a settled send, for its history record.
enum Next {
    /// Tried again after this long.
    RetryIn(Duration),
    /// The delivery ended with this outcome.
    Ended(Outcome),
}

/// The history's record of an attempt of `delivery` (its count already
/// includes this one) and of what `next` follows it.
fn record(delivery: &Delivery, sent: &Sent, sent_at: Timestamp, next: Next) -> AttemptRecord {
    let (retry_in, ended) = match next {
        Next::RetryIn(delay) => (Some(delay), None),
        Next::Ended(outcome) => (None, Some(outcome.delivery_label())),
    };
    AttemptRecord {
        recipient: delivery.recipient.id,
        shard: delivery.envelope.shard.index(),
        sequence_id: delivery.envelope.sequence_id,
        channel: delivery.recipient.target.channel(),
        attempt: sent.outcome.is_attempt().then_some(delivery.attempts),
        outcome: sent.outcome.label(),
        ended,
        retry_in,
        provider_status: sent.answer.as_ref().map(|a| a.status),
        provider_reason: sent.answer.as_ref().and_then(|a| a.reason.clone()),
        published_at_ms: Timestamp::from_unix_nanos(delivery.envelope.server_ts_ns).as_millis(),
        first_attempt_at_ms: delivery.first_sent_at.map(Timestamp::as_millis),
        sent_at_ms: sent_at.as_millis(),
        answered_at_ms: Timestamp::now().as_millis(),
    }
}

#[cfg(test)]
mod tests {
    //! The worker against an in-memory provider and tokio's paused clock:
    //! retry delays and the attempt bound elapse without sleeping.

    use std::collections::VecDeque;
    use std::num::NonZeroUsize;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::channel::{ChannelContext, ChannelSettings, Provider, Refusal, RelayPriority, RelayedPush};
    use crate::delivery::{DeliveryWorkers, FirstAttemptLatch};
    use crate::domain::{
        Channel, DeliveryTarget, EnvelopeKind, Recipient, RecipientId, SecretHash, ShardId, StoredEnvelope, Topic,
    };
    use crate::store::RedbStore;

    /// A channel that answers from a script (then `Delivered`); its first
    /// `hang` sends never answer, and it records how many sends overlap.
    /// It needs nothing but `Provider`.
    struct Scripted {
        channel: Channel,
        script: Mutex<VecDeque<Outcome>>,
        hang: AtomicUsize,
        /// Its first `panics` sends panic.
        panics: AtomicUsize,
        sent: AtomicUsize,
        latency: Duration,
        concurrent: AtomicUsize,
        most_concurrent: AtomicUsize,
    }

    impl Scripted {
        fn new(channel: Channel, script: &[Outcome]) -> Arc<Self> {
            Self::build(channel, script, 0, Duration::ZERO)
        }

        fn build(channel: Channel, script: &[Outcome], hang: usize, latency: Duration) -> Arc<Self> {
            Arc::new(Self {
                channel,
                script: Mutex::new(script.iter().copied().collect()),
                hang: AtomicUsize::new(hang),
                panics: AtomicUsize::new(0),
                sent: AtomicUsize::new(0),
                latency,
                concurrent: AtomicUsize::new(0),
                most_concurrent: AtomicUsize::new(0),
            })
        }
    }

    #[async_trait]
    impl Provider for Scripted {
        fn channel(&self) -> Channel {
            self.channel
        }
        async fn send(&self, _push: Push<'_>) -> Result<Outcome, Refusal> {
            self.sent.fetch_add(1, Ordering::SeqCst);
            if self.panics.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                panic!("a scripted panic");
            }
            if self.hang.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                std::future::pending::<()>().await;
            }
            let now = self.concurrent.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_concurrent.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(self.latency).await;
            self.concurrent.fetch_sub(1, Ordering::SeqCst);
            Ok(self.script.lock().unwrap().pop_front().unwrap_or(Outcome::Delivered))
        }
        fn timed_out(&self) -> Outcome {
            Outcome::transient(Duration::from_secs(7))
        }
    }

    struct Run {
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        first_attempts: Arc<AtomicUsize>,
        latch: Arc<FirstAttemptLatch>,
        _dir: tempfile::TempDir,
    }

    fn recipient(target: DeliveryTarget) -> Recipient {
        Recipient {
            id: RecipientId::from_bytes([3; 32]),
            secret_hash: SecretHash([4; 32]),
            target,
            renewed_at_ns: 1,
            topic_count: 0,
        }
    }

    fn envelope() -> StoredEnvelope {
        StoredEnvelope {
            shard: ShardId::FIRST,
            sequence_id: 1,
            topic: Topic::parse(&[0, 9]).unwrap(),
            kind: EnvelopeKind::Application,
            server_ts_ns: Timestamp::now().as_unix_nanos(),
            sender_hmac: None,
            data: vec![],
            relay: Default::default(),
        }
    }

    /// Registers `stored` in a real store, then delivers one envelope to
    /// `used` (the recipient as the window loaded it) through one worker,
    /// and waits until the worker has nothing left.
    async fn deliver(provider: Arc<Scripted>, stored: &Recipient, used: Recipient) -> Run {
        let settings = DeliverySettings { workers: NonZeroUsize::MIN, ..DeliverySettings::default() };
        deliver_all(provider, stored, vec![used], settings).await
    }

    /// Delivers one envelope to each of `used` through the workers of
    /// `settings` and waits until they have nothing left.
    async fn deliver_all(
        provider: Arc<Scripted>,
        stored: &Recipient,
        used: Vec<Recipient>,
        settings: DeliverySettings,
    ) -> Run {
        let mut channels = Channels::default();
        channels.insert(provider);
        deliver_through(channels, stored, used, settings).await
    }

    /// `deliver_all` over the channels given.
    async fn deliver_through(
        channels: Channels,
        stored: &Recipient,
        used: Vec<Recipient>,
        settings: DeliverySettings,
    ) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), 4).unwrap());
        store.register(&stored.id, &stored.secret_hash, &stored.target, 1).await.unwrap();
        let metrics = Arc::new(Metrics::new());
        let slots: Vec<_> = channels.providers().map(|p| (p.channel(), 512 * settings.workers.get())).collect();
        let parking = Arc::new(Parking::new(settings.breaker(), &slots, 4, metrics.clone()));
        let ctx = WorkerContext::for_tests(
            512 * settings.workers.get(),
            settings,
            channels,
            store.clone(),
            metrics.clone(),
            parking,
            Fence::default(),
        );
        let (workers, handles) = DeliveryWorkers::start(ctx);
        let first_attempts = Arc::new(AtomicUsize::new(0));
        let fired = first_attempts.clone();
        let latch = Arc::new(FirstAttemptLatch::new(used.len(), Arc::default(), move || {
            fired.fetch_add(1, Ordering::SeqCst);
        }));
        let envelope = Arc::new(envelope());
        let batch = used
            .into_iter()
            .enumerate()
            .map(|(index, r)| {
                Delivery::new(envelope.clone(), Arc::new(r), FirstAttempt { latch: latch.clone(), index })
            })
            .collect();
        workers.submit(batch).await.unwrap();
        drop(workers);
        for handle in handles {
            handle.await.unwrap();
        }
        Run { store, metrics, first_attempts, latch, _dir: dir }
    }

    /// One delivery worker over `channels`, with an embedded store in `dir`.
    fn one_worker(
        channels: Channels,
        metrics: Arc<Metrics>,
        fence: Fence,
        dir: &std::path::Path,
    ) -> (DeliveryWorkers, Vec<tokio::task::JoinHandle<()>>) {
        let settings = DeliverySettings { workers: NonZeroUsize::MIN, ..DeliverySettings::default() };
        let parking = Arc::new(Parking::of_providers(&channels, 8, 4, metrics.clone()));
        DeliveryWorkers::start(WorkerContext::for_tests(
            8,
            settings,
            channels,
            Arc::new(RedbStore::open(dir, 4).unwrap()),
            metrics,
            parking,
            fence,
        ))
    }

    #[tokio::test(start_paused = true)]
    async fn first_attempts_of_a_fenced_shard_wait_for_the_lease_and_go_back_unsent_after_the_hold() {
        let (owned, fence) = tokio::sync::watch::channel(crate::ownership::OwnedShards::default());
        let provider = Scripted::new(Channel::Apns, &[]);
        let mut channels = Channels::default();
        channels.insert(provider.clone());
        let dir = tempfile::tempdir().unwrap();
        let (workers, handles) = one_worker(channels, Arc::new(Metrics::new()), Fence::leased(fence), dir.path());
        let page = || Arc::new(FirstAttemptLatch::new(2, Arc::default(), || {}));
        let batch = |latch: &Arc<FirstAttemptLatch>| -> Vec<Delivery> {
            let target = DeliveryTarget::Apns { token: "t".into() };
            (0..2)
                .map(|index| {
                    let first = FirstAttempt { latch: latch.clone(), index };
                    Delivery::new(Arc::new(envelope()), Arc::new(recipient(target.clone())), first)
                })
                .collect()
        };
        let sent = || provider.sent.load(Ordering::SeqCst);

        // The shard's lease may have run out: its first attempts wait...
        let first = page();
        workers.submit(batch(&first)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(sent(), 0, "nothing sent while the shard is fenced");
        // ...and go once the lease is renewed in time.
        owned.send_modify(|o| {
            o.shards.insert(ShardId::FIRST, Instant::now() + Duration::from_secs(60));
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(sent(), 2);

        // Fenced for longer than the hold: handed back to the page unsent.
        owned.send_modify(|o| o.shards.clear());
        let second = page();
        workers.submit(batch(&second)).await.unwrap();
        tokio::time::sleep(FENCED_HOLD + Duration::from_secs(1)).await;
        assert_eq!(sent(), 2, "never sent by the fenced node");
        assert_eq!(second.abandon(), vec![0, 1], "pending again, for a replay or the new owner");

        // Held while fenced, then the lease is lost for good and the window
        // dropped (its shard actor stopped): when this node takes the shard
        // again, the held copies are not sent, the replay sends them.
        owned.send_modify(|o| o.shards.clear());
        let third = page();
        workers.submit(batch(&third)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        third.drop_window();
        owned.send_modify(|o| {
            o.shards.insert(ShardId::FIRST, Instant::now() + Duration::from_secs(60));
        });
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(sent(), 2, "a dropped window's held first attempts are never sent");

        // Queued and taken, not yet sent, when the window is dropped: not sent either.
        let fourth = page();
        fourth.drop_window();
        workers.submit(batch(&fourth)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(sent(), 2, "a dropped window's queued first attempts are never sent");
        drop(workers);
        for handle in handles {
            handle.await.unwrap();
        }
    }

    #[tokio::test]
    async fn the_configured_channels_series_are_at_zero_before_any_delivery() {
        let metrics = Arc::new(Metrics::new());
        let mut channels = Channels::default();
        channels.insert(Scripted::new(Channel::Apns, &[]));
        channels.insert(Scripted::new(Channel::Http, &[]));
        let dir = tempfile::tempdir().unwrap();
        let (workers, handles) = one_worker(channels, metrics.clone(), Fence::default(), dir.path());
        drop(workers);
        for handle in handles {
            handle.await.unwrap();
        }
        let exposed = metrics.render();
        for channel in ["apns", "http"] {
            let mut expected = vec![
                format!(r#"fanout_retries_total{{channel="{channel}"}} 0"#),
                format!(r#"fanout_unsent_total{{channel="{channel}"}} 0"#),
                format!(r#"fanout_in_flight_attempts{{channel="{channel}"}} 0"#),
                format!(r#"fanout_provider_latency_seconds_count{{channel="{channel}"}} 0"#),
                format!(r#"fanout_publish_to_attempt_seconds_count{{channel="{channel}"}} 0"#),
                format!(r#"fanout_retry_delay_seconds_count{{channel="{channel}"}} 0"#),
            ];
            for outcome in ["delivered", "transient", "rejected", "mismatch", "terminal"] {
                expected.push(format!(r#"fanout_attempts_total{{channel="{channel}",outcome="{outcome}"}} 0"#));
            }
            for outcome in ["delivered", "exhausted", "rejected", "mismatch", "terminal"] {
                expected.push(format!(r#"fanout_deliveries_total{{channel="{channel}",outcome="{outcome}"}} 0"#));
            }
            for series in expected {
                assert!(exposed.contains(&series), "{series} missing:\n{exposed}");
            }
        }
        assert!(exposed.contains(r#"fanout_recipients_deleted_total{reason="terminal"} 0"#), "{exposed}");
        for absent in ["fcm", "webpush", "relay"] {
            assert!(!exposed.contains(&format!(r#"channel="{absent}""#)), "{absent} is not configured:\n{exposed}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_attempt_leaves_its_delivery_pending_and_the_worker_going() {
        let p = Scripted::new(Channel::Apns, &[]);
        p.panics.store(1, Ordering::SeqCst);
        let r = recipient(DeliveryTarget::Apns { token: "t".into() });
        let two = vec![r.clone(), Recipient { id: RecipientId::from_bytes([9; 32]), ..r.clone() }];
        let settings = DeliverySettings { workers: NonZeroUsize::MIN, ..DeliverySettings::default() };
        let run = deliver_all(p.clone(), &r, two, settings).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 2);
        assert_eq!(count(&run.metrics.deliveries, Channel::Apns, "delivered"), 1, "the other one was delivered");
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 0, "the page waits for the lost delivery");
        assert_eq!(run.latch.abandon().len(), 1, "pending again: a replay sends it");
        assert_eq!(
            run.metrics.in_flight.with_label_values(&["apns"]).get(),
            0,
            "the panicked attempt is not in flight"
        );
        let latency = run.metrics.provider_latency.with_label_values(&["apns"]).get_sample_count();
        assert_eq!(latency, 1, "the answered attempt's latency only");
    }

    #[tokio::test(start_paused = true)]
    async fn the_in_flight_bound_holds_for_first_attempts_and_retries() {
        // Every delivery answers transient once, then delivered: 100 first
        // attempts and 100 retries, never more than 4 at once.
        let t = Outcome::transient(Duration::from_secs(1));
        let p = Scripted::build(Channel::Apns, &[t; 100], 0, Duration::from_millis(200));
        let r = recipient(DeliveryTarget::Apns { token: "t".into() });
        let many = (0..100u8).map(|i| Recipient { id: RecipientId::from_bytes([i; 32]), ..r.clone() }).collect();
        let settings = DeliverySettings {
            workers: NonZeroUsize::MIN,
            max_in_flight_per_worker: NonZeroUsize::new(4),
            // 100 transient answers in a row would open it.
            breaker_failures: 0,
            ..DeliverySettings::default()
        };
        let run = deliver_all(p.clone(), &r, many, settings).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 200);
        assert_eq!(p.most_concurrent.load(Ordering::SeqCst), 4);
        assert_eq!(count(&run.metrics.deliveries, Channel::Apns, "delivered"), 100);
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 1, "the page's latch fired once");
    }

    /// Real time: parks are store writes on the blocking pool.
    #[tokio::test]
    async fn a_provider_failing_every_attempt_opens_its_breaker_and_its_deliveries_wait_parked_not_exhausted() {
        // 30 deliveries, one attempt at a time; every answer is a 503.
        let t = Outcome::transient(Duration::from_millis(500));
        let p = Scripted::new(Channel::Fcm, &[t; 30]);
        let r = recipient(DeliveryTarget::Fcm { token: "t".into() });
        let many = (0..30u8).map(|i| Recipient { id: RecipientId::from_bytes([i; 32]), ..r.clone() }).collect();
        let settings = DeliverySettings {
            workers: NonZeroUsize::MIN,
            max_in_flight_per_worker: Some(NonZeroUsize::MIN),
            breaker_failures: 5,
            // No probe within the test: what happens while it is open.
            breaker_cooldown: Duration::from_secs(60),
            ..DeliverySettings::default()
        };
        let run = deliver_all(p.clone(), &r, many, settings).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 5, "five failures open it; nothing is sent after");
        let parked = run.store.parked().parked(ShardId::FIRST, Channel::Fcm, None, 100).await.unwrap();
        assert_eq!(parked.len(), 30, "every delivery waits in the store");
        assert_eq!(parked.iter().filter(|p| p.attempts == 1).count(), 5, "the five retries keep their attempt");
        assert_eq!(parked.iter().filter(|p| p.attempts == 0).count(), 25);
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 1, "parked first attempts settle their page");
        crate::metrics::assert_exposed(
            &run.metrics.render(),
            &[
                r#"fanout_breaker_open{channel="fcm"} 1"#,
                r#"fanout_breaker_opened_total{channel="fcm",scope="channel"} 1"#,
                r#"fanout_parked_total{channel="fcm",reason="breaker"} 25"#,
                r#"fanout_parked_total{channel="fcm",reason="retry"} 5"#,
                r#"fanout_deliveries_total{channel="fcm",outcome="exhausted"} 0"#,
                r#"fanout_retry_queue_depth 0"#,
            ],
        );
    }

    /// A provider that answers `Delivered` while up and hangs while down
    /// (an answer comes once it is up again).
    struct Switch {
        channel: Channel,
        up: tokio::sync::watch::Sender<bool>,
        sent: AtomicUsize,
        delivered: AtomicUsize,
    }

    impl Switch {
        fn new(channel: Channel, up: bool) -> Arc<Self> {
            Arc::new(Self {
                channel,
                up: tokio::sync::watch::channel(up).0,
                sent: AtomicUsize::new(0),
                delivered: AtomicUsize::new(0),
            })
        }
    }

    #[async_trait]
    impl Provider for Switch {
        fn channel(&self) -> Channel {
            self.channel
        }
        async fn send(&self, _push: Push<'_>) -> Result<Outcome, Refusal> {
            self.sent.fetch_add(1, Ordering::SeqCst);
            let mut up = self.up.subscribe();
            let _ = up.wait_for(|up| *up).await;
            self.delivered.fetch_add(1, Ordering::SeqCst);
            Ok(Outcome::Delivered)
        }
        fn timed_out(&self) -> Outcome {
            Outcome::transient(Duration::from_secs(1))
        }
    }

    /// One worker over two channels, four slots each (a ready queue of
    /// eight each), and an embedded store in `dir`.
    struct TwoChannels {
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        parking: Arc<Parking>,
        workers: DeliveryWorkers,
        handles: Vec<tokio::task::JoinHandle<()>>,
    }

    fn two_channels(a: Arc<dyn Provider>, b: Arc<dyn Provider>, dir: &std::path::Path) -> TwoChannels {
        let mut channels = Channels::default();
        channels.insert(a);
        channels.insert(b);
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir, 4).unwrap());
        let metrics = Arc::new(Metrics::new());
        let settings = DeliverySettings { workers: NonZeroUsize::MIN, ..DeliverySettings::default() };
        let parking = Arc::new(Parking::of_providers(&channels, 4, 4, metrics.clone()));
        let (workers, handles) = DeliveryWorkers::start(WorkerContext::for_tests(
            8,
            settings,
            channels,
            store.clone(),
            metrics.clone(),
            parking.clone(),
            Fence::default(),
        ));
        TwoChannels { store, metrics, parking, workers, handles }
    }

    /// Real time: parks are store writes on the blocking pool, which a
    /// paused clock would jump past. Every wait is bounded.
    #[tokio::test]
    async fn a_hung_channel_parks_what_it_cannot_take_and_the_other_channel_goes_on() {
        let apns = Switch::new(Channel::Apns, false);
        let fcm = Switch::new(Channel::Fcm, true);
        let dir = tempfile::tempdir().unwrap();
        let TwoChannels { store, metrics, parking, workers, handles } =
            two_channels(apns.clone(), fcm.clone(), dir.path());
        // 20 pages of 4 APNs and 4 FCM recipients, one envelope each.
        let fired = Arc::new(AtomicUsize::new(0));
        for page in 0..20u64 {
            let f = fired.clone();
            let latch = Arc::new(FirstAttemptLatch::new(8, Arc::default(), move || {
                f.fetch_add(1, Ordering::SeqCst);
            }));
            let envelope = Arc::new(StoredEnvelope { sequence_id: page + 1, ..envelope() });
            let batch = (0..8u8)
                .map(|i| {
                    let target = if i < 4 {
                        DeliveryTarget::Apns { token: "a".into() }
                    } else {
                        DeliveryTarget::Fcm { token: "f".into() }
                    };
                    let r = Recipient { id: RecipientId::from_bytes([i; 32]), ..recipient(target) };
                    Delivery::new(
                        envelope.clone(),
                        Arc::new(r),
                        FirstAttempt { latch: latch.clone(), index: usize::from(i) },
                    )
                })
                .collect();
            // Never waits for long: what APNs cannot take is parked.
            tokio::time::timeout(Duration::from_secs(30), workers.submit(batch)).await.expect("not held").unwrap();
        }
        let bounded = std::time::Instant::now() + Duration::from_secs(30);
        while fcm.delivered.load(Ordering::SeqCst) < 80 || fired.load(Ordering::SeqCst) < 17 {
            assert!(std::time::Instant::now() < bounded, "FCM or the pages waited behind APNs");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(fcm.delivered.load(Ordering::SeqCst), 80, "every FCM delivery went");
        assert_eq!(apns.sent.load(Ordering::SeqCst), 4, "APNs has its four slots and no more");
        // A second on, with FCM active, the four first attempts in flight are
        // detached from their page and the eight ready ones are parked: every
        // page settles although APNs has not answered.
        while fired.load(Ordering::SeqCst) < 20 {
            assert!(std::time::Instant::now() < bounded, "a page waited for APNs attempts in flight");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let parked = store.parked().parked(ShardId::FIRST, Channel::Apns, None, 1000).await.unwrap();
        assert_eq!(parked.len(), 80, "every APNs delivery has its row");
        assert!(parked.iter().all(|p| p.attempts == 0), "none attempted yet");
        let (in_flight, waiting): (Vec<_>, Vec<_>) = parked.iter().partition(|p| parking.is_detached(&p.place()));
        assert_eq!(in_flight.len(), 4, "the rows of the attempts in flight are left alone by their shard's owner");
        assert!(in_flight.iter().all(|p| p.sequence_id == 1), "the first page's");
        assert!(store.parked().parked(ShardId::FIRST, Channel::Fcm, None, 10).await.unwrap().is_empty());
        let lowest = waiting.iter().map(|p| p.sequence_id).min().unwrap();
        assert_eq!(parking.take_parked(ShardId::FIRST), vec![(Channel::Apns, lowest)], "its shard is told");
        crate::metrics::assert_exposed(
            &metrics.render(),
            &[
                r#"fanout_parked_total{channel="apns",reason="saturated"} 76"#,
                r#"fanout_parked_total{channel="apns",reason="in_flight"} 4"#,
            ],
        );
        // APNs answers again: the four attempts in flight are delivered and
        // their rows deleted, and the worker ends.
        apns.up.send_replace(true);
        drop(workers);
        for handle in handles {
            tokio::time::timeout(Duration::from_secs(30), handle).await.expect("the worker ends").unwrap();
        }
        assert_eq!(apns.delivered.load(Ordering::SeqCst), 4);
        let left = store.parked().parked(ShardId::FIRST, Channel::Apns, None, 1000).await.unwrap();
        assert_eq!(left.len(), 76, "the delivered ones' rows went");
        assert!(left.iter().all(|p| !parking.is_detached(&p.place()) && p.sequence_id > 1));
        assert_eq!(parking.take_parked(ShardId::FIRST), vec![], "a deleted row lowers no floor");
    }

    /// A provider that answers each send after `latency` with the next of
    /// its script (then `Delivered`).
    fn slow(channel: Channel, script: &[Outcome], latency: Duration) -> Arc<Scripted> {
        Scripted::build(channel, script, 0, latency)
    }

    /// One page of an APNs and an FCM delivery through one worker, APNs
    /// answering after three seconds with `apns_answer`; returns the store,
    /// the parking and the metrics once the worker has ended, and when the
    /// page settled (real time: the rows are store writes).
    async fn one_slow_attempt_beside_a_fast_one(
        apns_answer: Outcome,
    ) -> (Arc<dyn Store>, Arc<Parking>, Arc<Metrics>, Duration, tempfile::TempDir) {
        let apns = slow(Channel::Apns, &[apns_answer], Duration::from_secs(3));
        let fcm = slow(Channel::Fcm, &[], Duration::ZERO);
        let dir = tempfile::tempdir().unwrap();
        let TwoChannels { store, metrics, parking, workers, handles } =
            two_channels(apns.clone(), fcm.clone(), dir.path());
        let settled = Arc::new(Mutex::new(None));
        let at = settled.clone();
        let started = std::time::Instant::now();
        let latch = Arc::new(FirstAttemptLatch::new(2, Arc::default(), move || {
            *at.lock().unwrap() = Some(started.elapsed());
        }));
        let envelope = Arc::new(envelope());
        let batch = [DeliveryTarget::Apns { token: "a".into() }, DeliveryTarget::Fcm { token: "f".into() }]
            .into_iter()
            .enumerate()
            .map(|(index, target)| {
                let r = Recipient { id: RecipientId::from_bytes([index as u8; 32]), ..recipient(target) };
                Delivery::new(envelope.clone(), Arc::new(r), FirstAttempt { latch: latch.clone(), index })
            })
            .collect();
        workers.submit(batch).await.unwrap();
        drop(workers);
        for handle in handles {
            tokio::time::timeout(Duration::from_secs(30), handle).await.expect("the worker ends").unwrap();
        }
        assert_eq!(apns.sent.load(Ordering::SeqCst), 1);
        let settled = settled.lock().unwrap().expect("the page settled");
        (store, parking, metrics, settled, dir)
    }

    #[tokio::test]
    async fn a_slow_first_attempt_is_detached_from_its_page_and_its_answer_deletes_its_row() {
        let (store, parking, metrics, settled, _dir) = one_slow_attempt_beside_a_fast_one(Outcome::Delivered).await;
        // Detached a second on (checked every quarter second), long before
        // the answer three seconds on.
        assert!(settled < Duration::from_millis(2500), "the page waited {settled:?} for the slow answer");
        assert!(store.parked().parked(ShardId::FIRST, Channel::Apns, None, 10).await.unwrap().is_empty());
        assert!(parking.take_parked(ShardId::FIRST).is_empty(), "nothing for the shard's owner to send");
        crate::metrics::assert_exposed(
            &metrics.render(),
            &[
                r#"fanout_parked_total{channel="apns",reason="in_flight"} 1"#,
                r#"fanout_deliveries_total{channel="apns",outcome="delivered"} 1"#,
            ],
        );
    }

    #[tokio::test]
    async fn a_detached_first_attempt_to_retry_keeps_its_row_with_the_attempt_made() {
        let timed_out = Outcome::transient(Duration::from_secs(1));
        let (store, parking, metrics, settled, _dir) = one_slow_attempt_beside_a_fast_one(timed_out).await;
        assert!(settled < Duration::from_millis(2500), "the page waited {settled:?} for the slow answer");
        let rows = store.parked().parked(ShardId::FIRST, Channel::Apns, None, 10).await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].attempts, rows[0].all_gone), (1, false), "its retry, with the attempt made");
        assert!(!parking.is_detached(&rows[0].place()), "its shard's owner sends it from here");
        assert_eq!(parking.take_parked(ShardId::FIRST), vec![(Channel::Apns, 1)]);
        crate::metrics::assert_exposed(
            &metrics.render(),
            &[
                r#"fanout_parked_total{channel="apns",reason="in_flight"} 1"#,
                r#"fanout_parked_total{channel="apns",reason="retry"} 1"#,
                r#"fanout_attempts_total{channel="apns",outcome="transient"} 1"#,
            ],
        );
    }

    fn http_target(url: &str) -> DeliveryTarget {
        DeliveryTarget::Http {
            url: crate::domain::WebhookUrl::parse(url).unwrap(),
            signing_key: crate::domain::SigningKey::parse(&[7; 16]).unwrap(),
        }
    }

    fn count(m: &prometheus::IntCounterVec, channel: Channel, label: &str) -> u64 {
        m.with_label_values(&[channel.as_str(), label]).get()
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivered_first_attempt_settles_once() {
        let p = Scripted::new(Channel::Apns, &[]);
        let r = recipient(DeliveryTarget::Apns { token: "t".into() });
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 1);
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 1);
        assert_eq!(count(&run.metrics.deliveries, Channel::Apns, "delivered"), 1);
        assert_eq!(count(&run.metrics.attempts, Channel::Apns, "delivered"), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_answers_are_retried_up_to_max_attempts_then_exhausted() {
        let t = Outcome::transient(Duration::from_secs(60));
        let p = Scripted::new(Channel::Fcm, &[t, t, t, t]);
        let r = recipient(DeliveryTarget::Fcm { token: "t".into() });
        let started = tokio::time::Instant::now();
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 3, "max_attempts in total");
        assert!(started.elapsed() >= Duration::from_secs(120), "each retry waited its delay");
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 1, "the latch fires once");
        assert_eq!(count(&run.metrics.attempts, Channel::Fcm, "transient"), 3);
        assert_eq!(count(&run.metrics.deliveries, Channel::Fcm, "exhausted"), 1);
        assert!(run.store.recipient(&r.id).await.unwrap().is_some(), "kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_transient_then_delivered_attempt_is_delivered() {
        let p = Scripted::new(Channel::Apns, &[Outcome::transient(Duration::from_secs(1))]);
        let r = recipient(DeliveryTarget::Apns { token: "t".into() });
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 2);
        assert_eq!(count(&run.metrics.deliveries, Channel::Apns, "delivered"), 1);
        assert_eq!(run.metrics.retries.with_label_values(&["apns"]).get(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn gone_on_every_attempt_is_terminal_and_deletes_the_recipient() {
        let g = Outcome::Gone { delay: Duration::from_secs(1) };
        let p = Scripted::new(Channel::Http, &[g, g, g]);
        let r = recipient(http_target("https://a.example/"));
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 3);
        assert_eq!(count(&run.metrics.deliveries, Channel::Http, "terminal"), 1);
        assert!(run.store.recipient(&r.id).await.unwrap().is_none(), "deleted (PUSH-234)");
    }

    #[tokio::test(start_paused = true)]
    async fn gone_mixed_with_another_transient_answer_is_exhausted_not_terminal() {
        let g = Outcome::Gone { delay: Duration::from_secs(1) };
        let p = Scripted::new(Channel::Http, &[g, Outcome::transient(Duration::from_secs(1)), g]);
        let r = recipient(http_target("https://a.example/"));
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(count(&run.metrics.deliveries, Channel::Http, "exhausted"), 1);
        assert!(run.store.recipient(&r.id).await.unwrap().is_some(), "kept");
    }

    #[tokio::test(start_paused = true)]
    async fn terminal_spares_a_recipient_that_re_registered() {
        let p = Scripted::new(Channel::Apns, &[Outcome::Terminal]);
        let stored = recipient(DeliveryTarget::Apns { token: "new".into() });
        let used = recipient(DeliveryTarget::Apns { token: "old".into() });
        let run = deliver(p.clone(), &stored, used).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 1, "terminal is not retried");
        assert_eq!(count(&run.metrics.deliveries, Channel::Apns, "terminal"), 1);
        assert!(run.store.recipient(&stored.id).await.unwrap().is_some(), "PUSH-234 compare-and-delete");
    }

    #[tokio::test(start_paused = true)]
    async fn rejected_and_mismatch_stop_after_one_attempt() {
        for outcome in [Outcome::Rejected, Outcome::Mismatch] {
            let p = Scripted::new(Channel::Fcm, &[outcome]);
            let r = recipient(DeliveryTarget::Fcm { token: "t".into() });
            let run = deliver(p.clone(), &r, r.clone()).await;
            assert_eq!(p.sent.load(Ordering::SeqCst), 1);
            assert_eq!(count(&run.metrics.deliveries, Channel::Fcm, outcome.label()), 1);
            assert!(run.store.recipient(&r.id).await.unwrap().is_some());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_stuck_before_its_request_is_not_an_attempt() {
        // The first two sends never answer: the watchdog gives up on each.
        let p = Scripted::build(Channel::Apns, &[], 2, Duration::ZERO);
        let r = recipient(DeliveryTarget::Apns { token: "t".into() });
        let started = tokio::time::Instant::now();
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 3);
        assert!(started.elapsed() >= WATCHDOG * 2 + WATCHDOG_DELAY * 2);
        // The sweep gives up on each within WATCHDOG_SWEEP of its time.
        assert!(started.elapsed() <= (WATCHDOG + WATCHDOG_SWEEP + WATCHDOG_DELAY) * 2, "{:?}", started.elapsed());
        assert_eq!(run.metrics.unsent.with_label_values(&["apns"]).get(), 2);
        assert_eq!(count(&run.metrics.attempts, Channel::Apns, "delivered"), 1, "one attempt in all");
        assert_eq!(count(&run.metrics.deliveries, Channel::Apns, "delivered"), 1);
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn not_sent_never_counts_towards_max_attempts() {
        let n = Outcome::NotSent { delay: Duration::from_secs(10) };
        let p = Scripted::new(Channel::Fcm, &[n, n, n, n, n]);
        let r = recipient(DeliveryTarget::Fcm { token: "t".into() });
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 6);
        assert_eq!(count(&run.metrics.deliveries, Channel::Fcm, "delivered"), 1);
        assert_eq!(run.metrics.unsent.with_label_values(&["fcm"]).get(), 5);
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 1, "the latch waits for the real attempt");
    }

    #[tokio::test(start_paused = true)]
    async fn an_unconfigured_channel_is_rejected_without_a_request() {
        let p = Scripted::new(Channel::Fcm, &[]);
        let r = recipient(DeliveryTarget::Apns { token: "t".into() });
        let run = deliver(p.clone(), &r, r.clone()).await;
        assert_eq!(p.sent.load(Ordering::SeqCst), 0);
        assert_eq!(count(&run.metrics.deliveries, Channel::Apns, "rejected"), 1);
    }

    /// The probe channel (`channel/probe/`) exists only as a folder and a
    /// test-only row of the channel table: from its `[engine.channels.probe]`
    /// table alone it is built, counted in the workers' bound, stored under
    /// its row's tag, and delivered through by a real worker, which counts
    /// it under its row's metric slot.
    #[tokio::test(start_paused = true)]
    async fn a_channel_that_is_a_folder_and_a_row_is_built_and_delivered_through() {
        let file: toml::Table = toml::from_str("[engine.channels]\nhttp = {}\nprobe = { max_in_flight = 8 }").unwrap();
        let table: ChannelSettings = file["engine"]["channels"].clone().try_into().unwrap();
        assert_eq!(table.max_in_flight(), 1000 + 8, "the webhook's default and the probe's");
        let ctx = ChannelContext::new(Arc::new(Metrics::new()));
        let channels = Channels::build(&table, &ctx).unwrap();
        assert!(channels.is_configured(Channel::Probe) && channels.is_configured(Channel::Http));
        assert!(!channels.is_configured(Channel::Apns), "no table, no channel (PUSH-210)");
        let probe = channels.get(Channel::Probe).expect("built as a provider");
        assert_eq!(probe.channel(), Channel::Probe);
        // Its row says `relayed false`.
        let payload = serde_json::Map::new();
        let relayed = RelayedPush {
            token: "t",
            app_id: None,
            sandbox: false,
            collapse_id: None,
            priority: RelayPriority::High,
            payload: &payload,
            ttl: Duration::from_secs(60),
            web_push_keys: None,
        };
        assert_eq!(probe.send(Push::Relayed(relayed)).await, Err(Refusal::Unsupported));

        let r = recipient(DeliveryTarget::Probe { token: "probe-token".into() });
        let three: Vec<_> = (0..3u8).map(|i| Recipient { id: RecipientId::from_bytes([i; 32]), ..r.clone() }).collect();
        let settings = DeliverySettings { workers: NonZeroUsize::MIN, ..DeliverySettings::default() };
        let run = deliver_through(channels, &r, three.clone(), settings).await;

        let logged = ctx.push_log.notifications(None);
        let mut devices: Vec<&str> =
            logged["notifications"].as_array().unwrap().iter().map(|e| e["device_id"].as_str().unwrap()).collect();
        devices.sort_unstable();
        let expected: Vec<String> = three.iter().map(|r| hex::encode(r.id.as_bytes())).collect();
        assert_eq!(devices, expected, "each delivery reached the probe once, the relayed push none");
        assert!(logged["notifications"].as_array().unwrap().iter().all(|e| e["token"] == "probe-token"));
        assert_eq!(count(&run.metrics.attempts, Channel::Probe, "delivered"), 3);
        assert_eq!(count(&run.metrics.deliveries, Channel::Probe, "delivered"), 3);
        let exposed = run.metrics.render();
        assert!(exposed.contains(r#"fanout_deliveries_total{channel="probe",outcome="delivered"} 3"#), "{exposed}");
        assert_eq!(run.first_attempts.load(Ordering::SeqCst), 1, "the page's latch fired once");
        let stored = run.store.recipient(&r.id).await.unwrap().expect("stored under the probe's tag");
        assert_eq!(stored.target, r.target);
    }
}
