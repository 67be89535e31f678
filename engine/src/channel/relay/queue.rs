//! 003 §4's queue: at most one pending push per device, at most `capacity`
//! devices with one, one attempt in flight per device, and pushes held back
//! while the dispatch window that queued them is still being read, so that
//! the pushes of one read coalesce per device before any is sent.
//!
//! A synchronous state machine under one mutex (no await inside), so every
//! rule is unit-tested without a clock; `sender.rs` drives it.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use prometheus::{IntCounter, IntGauge};
use tokio::sync::Notify;

use super::coalesce::{RelayPush, coalesce, retry_meets_pending};
use crate::domain::RecipientId;

/// The 003 §4 counters and the queue's gauges.
#[derive(Clone)]
pub struct Counters {
    pub enqueued: IntCounter,
    pub coalesced: IntCounter,
    pub upgraded: IntCounter,
    pub dropped: IntCounter,
    pub sent: IntCounter,
    pub skipped: IntCounter,
    pub invalid_token: IntCounter,
    pub retried: IntCounter,
    pub failed: IntCounter,
    /// Devices with a pending push.
    pub pending: IntGauge,
    /// Pushes waiting for a retry timer.
    pub retrying: IntGauge,
}

impl Counters {
    pub fn new(metrics: &crate::metrics::Metrics) -> Self {
        let c = |event: &str| metrics.relay_pushes.with_label_values(&[event]);
        Self {
            enqueued: c("enqueued"),
            coalesced: c("coalesced"),
            upgraded: c("upgraded"),
            dropped: c("dropped"),
            sent: c("sent"),
            skipped: c("skipped"),
            invalid_token: c("invalid_token"),
            retried: c("retried"),
            failed: c("failed"),
            pending: metrics.relay_queue_devices.clone(),
            retrying: metrics.relay_retry_waiting.clone(),
        }
    }
}

/// A push taken for an attempt, with the device's generation when it was
/// taken: a retry of it is stale once a newer push was queued since.
pub struct Taken {
    pub push: RelayPush,
    generation: u64,
}

/// A hold on the pushes of one dispatch read (`open_hold`/`release`).
pub type HoldId = u64;

#[derive(Default)]
struct Device {
    pending: Option<Slot>,
    in_flight: bool,
    /// Retries of this device waiting for their timer.
    retrying: u32,
    /// Pushes queued for this device so far.
    generation: u64,
}

impl Device {
    fn is_idle(&self) -> bool {
        self.pending.is_none() && !self.in_flight && self.retrying == 0
    }
}

struct Slot {
    push: RelayPush,
    /// Not sent before this hold is released.
    hold: Option<HoldId>,
}

#[derive(Default)]
struct State {
    devices: HashMap<RecipientId, Device>,
    /// Devices whose pending push may be sent now, oldest first.
    ready: VecDeque<RecipientId>,
    pending: usize,
    retrying: usize,
    next_hold: HoldId,
}

pub struct Queue {
    state: Mutex<State>,
    ready: Notify,
    capacity: usize,
    /// Retries waiting at most (beyond, a retry is dropped): a bound that
    /// keeps the timer queue finite whatever the push server does.
    max_retrying: usize,
    counters: Counters,
}

impl Queue {
    pub fn new(capacity: usize, counters: Counters) -> Self {
        Self { state: Mutex::default(), ready: Notify::new(), capacity, max_retrying: capacity, counters }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn open_hold(&self) -> HoldId {
        let mut s = self.lock();
        s.next_hold += 1;
        s.next_hold
    }

    /// Queues a new push (003 §4). It replaces the device's pending push if
    /// there is one; else it takes a free place, or is dropped when
    /// `capacity` devices already wait. A replaced or dropped push's window
    /// latch is settled here.
    pub fn enqueue(&self, mut push: RelayPush, hold: Option<HoldId>) {
        self.counters.enqueued.inc();
        let id = push.recipient.id;
        let mut s = self.lock();
        let has_pending = s.devices.get(&id).is_some_and(|d| d.pending.is_some());
        if s.pending >= self.capacity && !has_pending {
            drop(s);
            self.counters.dropped.inc();
            tracing::warn!("relay queue full: push dropped");
            push.settle();
            return;
        }
        let State { devices, ready, pending, .. } = &mut *s;
        let device = devices.entry(id).or_default();
        device.generation += 1;
        match &mut device.pending {
            Some(slot) => {
                let (mut replaced, c) = coalesce(&mut slot.push, push);
                slot.hold = hold;
                replaced.settle();
                self.counters.coalesced.inc();
                if c.upgraded {
                    self.counters.upgraded.inc();
                }
            }
            None => {
                device.pending = Some(Slot { push, hold });
                *pending += 1;
                self.counters.pending.inc();
                if hold.is_none() && !device.in_flight {
                    ready.push_back(id);
                    self.ready.notify_one();
                }
            }
        }
    }

    /// The read that queued under `hold` is over: its pushes may be sent.
    pub fn release(&self, hold: HoldId, devices: &[RecipientId]) {
        let mut s = self.lock();
        let State { devices: all, ready, .. } = &mut *s;
        for id in devices {
            let Some(device) = all.get_mut(id) else { continue };
            let Some(slot) = device.pending.as_mut().filter(|slot| slot.hold == Some(hold)) else { continue };
            slot.hold = None;
            if !device.in_flight {
                ready.push_back(*id);
                self.ready.notify_one();
            }
        }
    }

    /// The next push to send, if one may be sent now: its device is marked
    /// in flight until `finished` or `failed_retryably`.
    pub fn try_take(&self) -> Option<Taken> {
        let mut s = self.lock();
        while let Some(id) = s.ready.pop_front() {
            let Some(device) = s.devices.get_mut(&id) else { continue };
            // A device can be listed twice (released, then made ready again).
            if device.in_flight || device.pending.as_ref().is_none_or(|slot| slot.hold.is_some()) {
                continue;
            }
            let slot = device.pending.take().expect("checked above");
            device.in_flight = true;
            let generation = device.generation;
            s.pending -= 1;
            self.counters.pending.dec();
            return Some(Taken { push: slot.push, generation });
        }
        None
    }

    /// Waits for the next push to send.
    pub async fn next(&self) -> Taken {
        loop {
            let notified = self.ready.notified();
            if let Some(taken) = self.try_take() {
                return taken;
            }
            notified.await;
        }
    }

    /// The attempt of a taken push is over and it will not be retried.
    pub fn finished(&self, id: RecipientId) {
        let mut s = self.lock();
        self.end_attempt(&mut s, id);
    }

    /// The attempt failed retryably and attempts remain. `Some` when the
    /// retry is to be scheduled; `None` when a newer push was queued for the
    /// device since (003 §4: the retry is dropped, an alert raising a silent
    /// pending push to alert) or too many retries wait.
    pub fn failed_retryably(&self, taken: Taken) -> Option<Taken> {
        let mut s = self.lock();
        let id = taken.push.recipient.id;
        let superseded = s.devices.get(&id).is_some_and(|d| d.generation > taken.generation);
        let refused = !superseded && s.retrying >= self.max_retrying;
        if !superseded && !refused {
            // Counted before the attempt ends, so the device (and its
            // generation, which later pushes compare against) is kept.
            s.devices.entry(id).or_default().retrying += 1;
            s.retrying += 1;
            self.counters.retrying.inc();
        }
        self.end_attempt(&mut s, id);
        if superseded {
            if let Some(device) = s.devices.get_mut(&id) {
                self.supersede(device, &taken);
            }
            return None;
        }
        if refused {
            self.counters.dropped.inc();
            tracing::warn!("too many relay retries waiting: push dropped");
            return None;
        }
        Some(taken)
    }

    /// A retry's timer expired: it becomes the device's pending push, unless
    /// a newer push was queued meanwhile (then it is dropped, see above).
    pub fn retry_due(&self, taken: Taken) {
        let mut s = self.lock();
        let id = taken.push.recipient.id;
        s.retrying -= 1;
        self.counters.retrying.dec();
        let State { devices, ready, pending, .. } = &mut *s;
        let device = devices.entry(id).or_default();
        device.retrying -= 1;
        if device.generation > taken.generation {
            self.supersede(device, &taken);
            self.remove_if_idle(&mut s, id);
            return;
        }
        // No push was queued since, so nothing is pending and nothing in flight.
        device.pending = Some(Slot { push: taken.push, hold: None });
        *pending += 1;
        self.counters.pending.inc();
        ready.push_back(id);
        self.ready.notify_one();
    }

    fn supersede(&self, device: &mut Device, retry: &Taken) {
        self.counters.dropped.inc();
        if let Some(slot) = device.pending.as_mut()
            && retry_meets_pending(retry.push.priority, &mut slot.push)
        {
            self.counters.upgraded.inc();
        }
    }

    fn end_attempt(&self, s: &mut State, id: RecipientId) {
        let Some(device) = s.devices.get_mut(&id) else { return };
        device.in_flight = false;
        if device.pending.as_ref().is_some_and(|slot| slot.hold.is_none()) {
            s.ready.push_back(id);
            self.ready.notify_one();
        }
        self.remove_if_idle(s, id);
    }

    fn remove_if_idle(&self, s: &mut State, id: RecipientId) {
        if s.devices.get(&id).is_some_and(Device::is_idle) {
            s.devices.remove(&id);
        }
    }

    #[cfg(test)]
    fn tracked_devices(&self) -> usize {
        self.lock().devices.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::channel::relay::coalesce::tests::push;
    use crate::channel::relay::event::{EventType, Priority};
    use crate::metrics::Metrics;
    use crate::page::{FirstAttempt, FirstAttemptLatch};

    fn queue(capacity: usize) -> (Queue, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        (Queue::new(capacity, Counters::new(&metrics)), metrics)
    }

    fn count(m: &Metrics, event: &str) -> u64 {
        m.relay_pushes.with_label_values(&[event]).get()
    }

    fn dev(id: u8) -> RecipientId {
        RecipientId::from_bytes([id; 32])
    }

    #[test]
    fn a_held_burst_coalesces_to_the_newest_per_device() {
        let (q, m) = queue(10);
        let hold = q.open_hold();
        for seq in 1..=5 {
            q.enqueue(push(1, EventType::Message, seq), Some(hold));
            q.enqueue(push(2, EventType::Message, seq), Some(hold));
        }
        assert!(q.try_take().is_none(), "nothing is sent while the read holds");
        q.release(hold, &[dev(1), dev(2), dev(1)]);
        let a = q.try_take().unwrap();
        let b = q.try_take().unwrap();
        assert!(q.try_take().is_none());
        assert_eq!((a.push.notification.seq, b.push.notification.seq), (5, 5));
        assert_eq!((count(&m, "enqueued"), count(&m, "coalesced")), (10, 8));
        q.finished(dev(1));
        q.finished(dev(2));
        assert_eq!(q.tracked_devices(), 0, "idle devices are forgotten");
        assert_eq!(m.relay_queue_devices.get(), 0);
    }

    #[test]
    fn priorities_merge_and_count_upgrades() {
        let (q, m) = queue(10);
        let hold = q.open_hold();
        q.enqueue(push(1, EventType::Message, 1), Some(hold));
        q.enqueue(push(1, EventType::MemberAdded, 1), Some(hold));
        q.release(hold, &[dev(1)]);
        let t = q.try_take().unwrap();
        assert_eq!((t.push.notification.kind, t.push.priority), (EventType::MemberAdded, Priority::High));
        assert_eq!(count(&m, "upgraded"), 1);
    }

    #[test]
    fn overflow_is_dropped_counted_and_settled() {
        let (q, m) = queue(2);
        let settled = Arc::new(AtomicUsize::new(0));
        let s = settled.clone();
        let latch = Arc::new(FirstAttemptLatch::new(1, Arc::default(), move || {
            s.fetch_add(1, Ordering::SeqCst);
        }));
        q.enqueue(push(1, EventType::Message, 1), None);
        q.enqueue(push(2, EventType::Message, 1), None);
        let mut third = push(3, EventType::Message, 1);
        third.first_attempt = Some(FirstAttempt { latch, index: 0 });
        q.enqueue(third, None);
        assert_eq!(count(&m, "dropped"), 1);
        assert_eq!(settled.load(Ordering::SeqCst), 1, "a dropped push counts as settled (PUSH-257)");
        q.enqueue(push(1, EventType::Message, 2), None);
        assert_eq!(count(&m, "coalesced"), 1, "a device already queued still coalesces when full");
    }

    #[test]
    fn one_attempt_in_flight_per_device() {
        let (q, _) = queue(10);
        q.enqueue(push(1, EventType::Message, 1), None);
        let first = q.try_take().unwrap();
        q.enqueue(push(1, EventType::Message, 2), None);
        assert!(q.try_take().is_none(), "the newer push waits for the attempt");
        q.finished(first.push.recipient.id);
        assert_eq!(q.try_take().unwrap().push.notification.seq, 2);
    }

    #[test]
    fn a_retry_is_dropped_once_a_newer_push_is_queued() {
        let (q, m) = queue(10);
        // The newer push arrives while the attempt is in flight.
        q.enqueue(push(1, EventType::Message, 1), None);
        let t = q.try_take().unwrap();
        q.enqueue(push(1, EventType::MemberRemoved, 2), None);
        assert!(q.failed_retryably(t).is_none());
        assert_eq!((count(&m, "dropped"), count(&m, "upgraded")), (1, 1), "the alert raised the silent pending push");
        let pending = q.try_take().unwrap();
        assert_eq!((pending.push.notification.seq, pending.push.priority), (2, Priority::High));
        q.finished(dev(1));

        // The newer push arrives while the retry waits for its timer.
        q.enqueue(push(1, EventType::Message, 3), None);
        let t = q.try_take().unwrap();
        let retry = q.failed_retryably(t).expect("nothing newer yet: scheduled");
        assert_eq!(m.relay_retry_waiting.get(), 1);
        q.enqueue(push(1, EventType::Message, 4), None);
        let newer = q.try_take().unwrap();
        q.finished(newer.push.recipient.id);
        q.retry_due(retry);
        assert!(q.try_take().is_none(), "the stale retry was dropped");
        assert_eq!(count(&m, "dropped"), 2);
        assert_eq!(q.tracked_devices(), 0);
        assert_eq!(m.relay_retry_waiting.get(), 0);
    }

    #[test]
    fn a_due_retry_is_sent_with_its_delivery_id() {
        let (q, _) = queue(10);
        q.enqueue(push(1, EventType::Message, 1), None);
        let t = q.try_take().unwrap();
        let id = t.push.delivery_id.clone();
        let retry = q.failed_retryably(t).unwrap();
        q.retry_due(retry);
        assert_eq!(q.try_take().unwrap().push.delivery_id, id);
    }

    #[tokio::test]
    async fn next_waits_for_a_release() {
        let (q, _) = queue(10);
        let q = Arc::new(q);
        let hold = q.open_hold();
        q.enqueue(push(1, EventType::Message, 1), Some(hold));
        let waiting = tokio::spawn({
            let q = q.clone();
            async move { q.next().await.push.notification.seq }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        q.release(hold, &[dev(1)]);
        assert_eq!(waiting.await.unwrap(), 1);
    }
}
