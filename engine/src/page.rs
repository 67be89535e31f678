//! A page of deliveries as dispatch hands it to a `Sink` (the delivery
//! workers, or a channel with its own queue): each `Delivery`, and the
//! page's `FirstAttemptLatch`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

use crate::domain::{Recipient, StoredEnvelope, Timestamp};

/// Where dispatch hands a channel's deliveries: the delivery workers, or a
/// channel that keeps its own queue (the relay's, spec 003 §4).
pub trait Sink: Send + Sync + 'static {
    /// Opens the batch of one dispatch read. Dropping it ends the read: a
    /// queue lets go what it held so the read's pushes coalesce (003 §4).
    fn open(&self) -> Box<dyn Batch>;
}

/// The deliveries of one dispatch read into one sink.
pub trait Batch: Send + Sync {
    /// Takes a page's deliveries. The sink settles each first-attempt latch
    /// (PUSH-257) once its first attempt has an answer, or once the delivery
    /// is coalesced away or dropped; one whose page was abandoned is dropped
    /// unsettled (the replay sends it). The future finishes the hand-off,
    /// waiting while the sink is full: the backpressure on dispatch.
    fn take(&mut self, deliveries: Vec<Delivery>) -> Handoff;
}

/// The rest of a hand-off (see `Batch::take`).
pub type Handoff = futures::future::BoxFuture<'static, Result<(), SinkStopped>>;

#[derive(Debug, thiserror::Error)]
#[error("the sink has stopped")]
pub struct SinkStopped;

/// One (envelope, subscription) send and its state.
pub struct Delivery {
    pub envelope: Arc<StoredEnvelope>,
    /// The recipient as loaded for the window: the attempt uses this target, and
    /// PUSH-234 compares against it.
    pub recipient: Arc<Recipient>,
    /// Settled once, when the first attempt has an answer (or timed out).
    pub first_attempt: Option<FirstAttempt>,
    pub attempts: u32,
    /// Every attempt so far was `Outcome::Gone` (the HTTPS 404/410 rule).
    pub all_gone: bool,
    /// Handed out again from the parked table: `first_attempt` is then its
    /// unpark batch's, settled at its next attempt (or when parked again),
    /// which is when its row may go.
    pub unparked: bool,
    /// When its first attempt left, once it has (the delivery history's).
    pub first_sent_at: Option<Timestamp>,
}

impl Delivery {
    pub fn new(envelope: Arc<StoredEnvelope>, recipient: Arc<Recipient>, first_attempt: FirstAttempt) -> Self {
        Self {
            envelope,
            recipient,
            first_attempt: Some(first_attempt),
            attempts: 0,
            all_gone: true,
            unparked: false,
            first_sent_at: None,
        }
    }
}

/// Where one delivery of a page stands.
const PENDING: u8 = 0;
const STARTED: u8 = 1;
const SETTLED: u8 = 2;
/// Stored in the parked deliveries of its channel (`Store::parked`), which
/// survive a crash and a handover: settled as far as the window is
/// concerned (PUSH-257), its attempt still to come from the parked row.
const PARKED: u8 = 3;

/// Counts down the first attempts of one page of deliveries, then calls its
/// completion once. A delivery dropped without an attempt (a shutdown, a crash)
/// never counts down, so its page is replayed rather than skipped.
///
/// It remembers where each of the page's deliveries stands (pending, taken by
/// a worker, answered), so a replay re-sends only the pending ones (never
/// started, or lost with a panicking attempt), and it can be abandoned: a
/// pending delivery of an abandoned latch is dropped by its worker, because
/// the replay sends it again.
pub struct FirstAttemptLatch {
    remaining: AtomicUsize,
    state: Vec<AtomicU8>,
    abandoned: AtomicBool,
    /// The whole window was dropped (its shard actor stopped, or a step
    /// failed): it is read again from the stored checkpoint, which is below
    /// this page because the page never completed. A first attempt of it not
    /// yet sent is then never sent: the replay, here or on the shard's next
    /// owner, sends it.
    window_dropped: AtomicBool,
    /// Shared by every page of a window: first attempts started and answered
    /// so far, the window's measure of progress.
    progress: Arc<AtomicU64>,
    on_done: Box<dyn Fn() + Send + Sync>,
}

impl FirstAttemptLatch {
    pub fn new(count: usize, progress: Arc<AtomicU64>, on_done: impl Fn() + Send + Sync + 'static) -> Self {
        Self {
            remaining: AtomicUsize::new(count),
            state: (0..count).map(|_| AtomicU8::new(PENDING)).collect(),
            abandoned: AtomicBool::new(false),
            window_dropped: AtomicBool::new(false),
            progress,
            on_done: Box::new(on_done),
        }
    }

    /// A worker takes delivery `index` for its first attempt. False when the
    /// page was abandoned while the delivery was still pending: the replay
    /// sends it again, so this copy is dropped.
    pub fn accept(&self, index: usize) -> bool {
        let Some(state) = self.state.get(index) else { return true };
        if self.abandoned.load(Ordering::Acquire) && state.load(Ordering::Acquire) == PENDING {
            return false;
        }
        if state.compare_exchange(PENDING, STARTED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.progress.fetch_add(1, Ordering::Relaxed);
        }
        true
    }

    /// The first attempt of delivery `index` died without an answer (a
    /// panicking task): pending again, for a replay to re-send.
    pub fn lost(&self, index: usize) {
        if let Some(state) = self.state.get(index) {
            let _ = state.compare_exchange(STARTED, PENDING, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The first attempt of delivery `index` of the page has its answer.
    pub fn count_down(&self, index: usize) {
        self.settle_as(index, SETTLED);
    }

    /// Delivery `index` was parked durably instead of attempted: settled
    /// for the page, since the parked row makes its attempt survive a crash
    /// or a handover (the shard's owner sends it from there).
    pub fn park(&self, index: usize) {
        self.settle_as(index, PARKED);
    }

    /// Moves delivery `index` from pending or started to `settled` (answered
    /// or parked) once; the first such move counts the page down.
    fn settle_as(&self, index: usize, settled: u8) {
        let Some(state) = self.state.get(index) else { return };
        let moved = state.fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| (!is_settled(s)).then_some(settled));
        if moved.is_err() {
            return; // already counted
        }
        self.progress.fetch_add(1, Ordering::Relaxed);
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            (self.on_done)();
        }
    }

    /// How many of the page's deliveries, from the first, have their first
    /// attempt answered or are parked: what a record of progress may claim
    /// of the page.
    pub fn settled_prefix(&self) -> usize {
        self.state.iter().take_while(|s| is_settled(s.load(Ordering::Acquire))).count()
    }

    /// The deliveries whose first attempt is answered or which are parked,
    /// wherever they are in the page (workers answer out of order).
    pub fn settled(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.state.len()).filter(|&i| is_settled(self.state[i].load(Ordering::Acquire)))
    }

    /// The deliveries whose attempt was made (answered), not parked.
    pub fn attempted(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.state.len()).filter(|&i| self.state[i].load(Ordering::Acquire) == SETTLED)
    }

    /// Marks the page replayed; returns the pending deliveries' indices.
    pub fn abandon(&self) -> Vec<usize> {
        self.abandoned.store(true, Ordering::Release);
        (0..self.state.len()).filter(|&i| self.state[i].load(Ordering::Acquire) == PENDING).collect()
    }

    /// The page's window was dropped: abandoned, and its deliveries taken but
    /// not yet sent are dropped too (see `window_dropped`).
    pub fn drop_window(&self) {
        self.window_dropped.store(true, Ordering::Release);
        self.abandoned.store(true, Ordering::Release);
    }

    pub fn window_dropped(&self) -> bool {
        self.window_dropped.load(Ordering::Acquire)
    }

    #[cfg(test)]
    fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::Acquire)
    }
}

/// A delivery's place in its page's latch.
#[derive(Clone)]
pub struct FirstAttempt {
    pub latch: Arc<FirstAttemptLatch>,
    pub index: usize,
}

/// Settled states: answered, or parked.
fn is_settled(state: u8) -> bool {
    state == SETTLED || state == PARKED
}

impl FirstAttempt {
    pub fn accept(&self) -> bool {
        self.latch.accept(self.index)
    }

    pub fn lost(&self) {
        self.latch.lost(self.index);
    }

    pub fn settle(self) {
        self.latch.count_down(self.index);
    }

    /// Parked durably instead of attempted (`FirstAttemptLatch::park`).
    pub fn park(self) {
        self.latch.park(self.index);
    }

    /// Its window was dropped: a replay from the stored checkpoint sends it.
    pub fn window_dropped(&self) -> bool {
        self.latch.window_dropped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_once_at_zero_and_counts_progress() {
        let fired = Arc::new(AtomicUsize::new(0));
        let progress = Arc::new(AtomicU64::new(0));
        let f = fired.clone();
        let latch = FirstAttemptLatch::new(3, progress.clone(), move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        latch.count_down(0);
        latch.count_down(1);
        latch.count_down(1); // the same delivery twice counts once
        assert_eq!(fired.load(Ordering::SeqCst), 0);
        assert_eq!(progress.load(Ordering::SeqCst), 2);
        assert_eq!(latch.settled_prefix(), 2);
        latch.count_down(2);
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        assert_eq!(progress.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn abandoning_names_the_pending_deliveries() {
        let progress = Arc::new(AtomicU64::new(0));
        let latch = FirstAttemptLatch::new(5, progress.clone(), || {});
        assert!(latch.accept(1));
        latch.count_down(1);
        assert!(latch.accept(2)); // taken by a worker: not re-sent
        latch.count_down(3); // answered without a recorded start
        assert_eq!(latch.settled_prefix(), 0, "the first is still pending");
        assert!(latch.accept(4));
        latch.lost(4); // its task panicked: pending again
        assert_eq!(progress.load(Ordering::SeqCst), 5, "takes and answers are progress");
        assert!(!latch.is_abandoned());
        assert_eq!(latch.abandon(), vec![0, 4]);
        assert!(latch.is_abandoned());
        assert!(!latch.accept(0), "a pending copy of an abandoned page is dropped");
        assert!(latch.accept(2), "a taken one is kept");
    }

    #[test]
    fn a_parked_delivery_settles_the_page_once_and_is_not_attempted() {
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let latch = FirstAttemptLatch::new(3, Arc::default(), move || {
            f.fetch_add(1, Ordering::SeqCst);
        });
        assert!(latch.accept(0));
        latch.park(0);
        latch.park(0); // twice counts once
        latch.count_down(0); // a late answer of a parked copy counts nothing
        latch.count_down(1);
        assert_eq!(fired.load(Ordering::SeqCst), 0);
        assert_eq!(latch.settled_prefix(), 2, "parked counts as settled for progress");
        latch.park(2);
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        assert_eq!(latch.attempted().collect::<Vec<_>>(), vec![1], "only the answered one was attempted");
        assert_eq!(latch.settled().count(), 3);
        assert!(latch.abandon().is_empty(), "nothing pending: a replay re-sends none");
    }
}
