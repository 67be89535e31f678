//! One worker's deliveries by channel: each channel has its own slots (its
//! share of the channel's `max_in_flight`) and its own ready queue, so a
//! channel whose provider hangs fills only its own slots and queue, never
//! another channel's.
//!
//! A batch from the worker's queue mixes channels. It is taken when every
//! channel in it fits in its ready queue. When one does not, the batch waits
//! for it, which is the backpressure on dispatch, but only for `LAG_AFTER`
//! while another channel is active: then the channel is *lagging*, the
//! batch is taken and what does not fit is parked (`super::parking`), and so
//! are the following batches' deliveries of that channel beyond its ready
//! queue, until the queue has drained. A ready queue whose front waited
//! `LAG_AFTER` for a slot while another channel was active is parked too
//! (`overdue`), so a lagging channel's first attempts hold their windows for
//! about one attempt, not for its backlog. With one channel busy alone
//! nothing is parked: its batches wait until they fit.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::Delivery;
use super::parking::{ACTIVE, Parking, STALLED_AFTER};
use crate::domain::Channel;
use crate::metrics::ParkReason;

/// One slot per row of the channel table (`Channel::slot`).
const SLOTS: usize = Channel::ALL.len();

/// How long a channel may keep a batch (or the front of its ready queue)
/// waiting for room while another channel is active, before it counts as
/// lagging: a healthy channel near its limit makes room within
/// milliseconds; one that does not for a second cannot keep up. A stalled
/// channel (`Parking::stalled`: nothing of it answered lately) lags after
/// `STALLED_AFTER` already: every page that holds its deliveries waits that
/// long.
const LAG_AFTER: Duration = Duration::from_secs(1);

/// Ready deliveries a channel's queue holds, in its slots: enough to start
/// the next attempts as soon as slots free, without holding a second
/// channel's worth of a slow provider's deliveries in memory.
const READY_PER_SLOT: usize = 2;

pub(super) struct Lanes {
    lanes: [Lane; SLOTS],
    /// The lane the next start looks at first (round robin).
    next: usize,
    in_flight: usize,
    /// The worker's own bound over every channel (`max_in_flight_per_worker`).
    max_in_flight: usize,
}

#[derive(Default)]
struct Lane {
    /// Ready deliveries and since when.
    ready: VecDeque<(Instant, Delivery)>,
    in_flight: usize,
    slots: usize,
    bound: usize,
    /// Deliveries waiting for a retry timer.
    retrying: usize,
    last_seen: Option<Instant>,
    /// It could not keep up (see the module doc): what does not fit its
    /// ready queue is parked, until the queue has drained.
    lagging: bool,
}

impl Lanes {
    /// `slots`: each channel's slots in this worker; a channel not listed
    /// (not configured: its deliveries are answered without a request) is
    /// bounded by `max_in_flight` only.
    pub(super) fn new(slots: &[(Channel, usize)], max_in_flight: usize) -> Self {
        let mut lanes: [Lane; SLOTS] = Default::default();
        for lane in &mut lanes {
            lane.slots = max_in_flight;
            lane.bound = max_in_flight.saturating_mul(READY_PER_SLOT);
        }
        for &(channel, n) in slots {
            let lane = &mut lanes[channel.slot()];
            lane.slots = n.max(1);
            lane.bound = lane.slots.saturating_mul(READY_PER_SLOT);
        }
        Self { lanes, next: 0, in_flight: 0, max_in_flight }
    }

    fn lane(&mut self, channel: Channel) -> &mut Lane {
        &mut self.lanes[channel.slot()]
    }

    pub(super) fn is_idle(&self) -> bool {
        self.in_flight == 0 && self.lanes.iter().all(|l| l.ready.is_empty())
    }

    /// The next delivery that may start: from a channel with a free slot,
    /// channels taking turns. The caller starts it (`started`) or lets it go.
    pub(super) fn next_to_start(&mut self) -> Option<Delivery> {
        if self.in_flight >= self.max_in_flight {
            return None;
        }
        for i in 0..SLOTS {
            let slot = (self.next + i) % SLOTS;
            let lane = &mut self.lanes[slot];
            if lane.in_flight < lane.slots
                && let Some((_, delivery)) = lane.ready.pop_front()
            {
                // Caught up: it holds batches again rather than parking.
                lane.lagging &= !lane.ready.is_empty();
                self.next = (slot + 1) % SLOTS;
                return Some(delivery);
            }
        }
        None
    }

    pub(super) fn started(&mut self, channel: Channel) {
        self.lane(channel).in_flight += 1;
        self.in_flight += 1;
    }

    pub(super) fn finished(&mut self, channel: Channel) {
        self.lane(channel).in_flight -= 1;
        self.in_flight -= 1;
    }

    /// A delivery that must go out whatever the bound (a retry due, one the
    /// fence held back): ready at the back of its channel's queue.
    pub(super) fn push(&mut self, delivery: Delivery, parking: &Parking, now: Instant) {
        let channel = delivery.recipient.target.channel();
        parking.held(channel, 1);
        self.lane(channel).ready.push_back((now, delivery));
    }

    /// Whether a ready queue waits with every slot of its channel taken:
    /// `overdue` may then have something to park.
    pub(super) fn waiting(&self) -> bool {
        self.lanes.iter().any(|l| !l.ready.is_empty() && l.in_flight >= l.slots)
    }

    /// The ready deliveries of each channel whose front waited `LAG_AFTER`
    /// for a slot while another channel was active (see the module doc),
    /// to be parked; the channel is lagging from then. Unparked ones stay: their shard handed out only what
    /// the channel had room for.
    pub(super) fn overdue(&mut self, parking: &Parking, now: Instant) -> Vec<(Delivery, ParkReason)> {
        let active: Vec<bool> = (0..SLOTS).map(|slot| self.active(slot, parking, now)).collect();
        let mut parked = Vec::new();
        for (slot, lane) in self.lanes.iter_mut().enumerate() {
            let channel = Channel::ALL[slot];
            let overdue = lane.in_flight >= lane.slots
                && lane.ready.front().is_some_and(|(since, _)| {
                    lag_after([channel], parking, now) <= now.saturating_duration_since(*since)
                });
            if !overdue || !active.iter().enumerate().any(|(other, &a)| a && other != slot) {
                continue;
            }
            lane.lagging = true;
            for (since, delivery) in std::mem::take(&mut lane.ready) {
                if delivery.unparked {
                    lane.ready.push_back((since, delivery));
                    continue;
                }
                parking.held(channel, -1);
                let reason = if delivery.first_attempt.is_some() { ParkReason::Saturated } else { ParkReason::Retry };
                parked.push((delivery, reason));
            }
        }
        parked
    }

    /// `batch` came from the worker's queue: its channels have deliveries
    /// waiting, here, whether or not the batch can be taken yet (one held
    /// behind a channel that cannot keep up is what `takes` lets go).
    /// The workers' shared record of it (`Parking::arrived`) is told once
    /// per channel and batch.
    pub(super) fn arrived(&mut self, batch: &[Delivery], parking: &Parking, now: Instant) {
        for delivery in batch {
            let channel = delivery.recipient.target.channel();
            let lane = self.lane(channel);
            if lane.last_seen != Some(now) {
                lane.last_seen = Some(now);
                parking.arrived(channel, now);
            }
        }
    }

    /// Whether the channel in `slot` had deliveries lately and its breaker
    /// is closed: it is waiting for more.
    fn active(&self, slot: usize, parking: &Parking, now: Instant) -> bool {
        self.lanes[slot].last_seen.is_some_and(|seen| now.saturating_duration_since(seen) < ACTIVE)
            && !parking.is_open(Channel::ALL[slot])
    }

    pub(super) fn retrying(&mut self, channel: Channel) -> &mut usize {
        &mut self.lane(channel).retrying
    }

    /// Whether to take `batch` now, held since `held` (see the module
    /// doc): every channel in it fits, or lags; or the batch waited
    /// `LAG_AFTER` while another channel was active, and the channels that
    /// do not fit lag from now.
    pub(super) fn takes(&mut self, batch: &[Delivery], parking: &Parking, now: Instant, held: Instant) -> bool {
        let parts = self.parts(batch, parking);
        let short: Vec<usize> = (0..SLOTS)
            .filter(|&slot| {
                let (lane, n) = (&self.lanes[slot], parts[slot]);
                n > 0 && !lane.lagging && lane.ready.len() + n > lane.bound.max(n)
            })
            .collect();
        if short.is_empty() {
            return true;
        }
        let others_active = (0..SLOTS).any(|slot| !short.contains(&slot) && self.active(slot, parking, now));
        let after = lag_after(short.iter().map(|&slot| Channel::ALL[slot]), parking, now);
        if now.saturating_duration_since(held) < after || !others_active {
            return false;
        }
        for slot in short {
            self.lanes[slot].lagging = true;
        }
        true
    }

    /// Takes `batch`: each delivery into its channel's ready queue, or
    /// returned to be parked: its breaker is open, or its channel's queue
    /// is full. Unparked deliveries are always taken (their shard hands out
    /// only what their channel has room for).
    pub(super) fn take(
        &mut self,
        batch: Vec<Delivery>,
        parking: &Parking,
        now: Instant,
    ) -> Vec<(Delivery, ParkReason)> {
        let parts = self.parts(&batch, parking);
        // A batch that fits is taken whole (one larger than the queue's
        // bound, when the queue is empty); a lagging channel keeps its
        // bound.
        let mut room: [usize; SLOTS] = std::array::from_fn(|slot| {
            let lane = &self.lanes[slot];
            let bound = if lane.lagging { lane.bound } else { lane.bound.max(parts[slot]) };
            bound.saturating_sub(lane.ready.len())
        });
        let mut parked = Vec::new();
        for delivery in batch {
            let channel = delivery.recipient.target.channel();
            let slot = channel.slot();
            if !delivery.unparked {
                if parking.is_open(channel) {
                    parked.push((delivery, ParkReason::Breaker));
                    continue;
                }
                if room[slot] == 0 {
                    parked.push((delivery, ParkReason::Saturated));
                    continue;
                }
                room[slot] -= 1;
            }
            self.push(delivery, parking, now);
        }
        parked
    }

    /// How many of `batch`'s deliveries would go into each channel's ready
    /// queue (not those of a channel whose breaker is open, nor unparked
    /// ones).
    fn parts(&self, batch: &[Delivery], parking: &Parking) -> [usize; SLOTS] {
        let mut parts = [0; SLOTS];
        for delivery in batch.iter().filter(|d| !d.unparked) {
            let channel = delivery.recipient.target.channel();
            if !parking.is_open(channel) {
                parts[channel.slot()] += 1;
            }
        }
        parts
    }
}

/// How long deliveries of `channels` may wait for room before they lag:
/// `STALLED_AFTER` when every one of them is stalled, else `LAG_AFTER`.
fn lag_after(channels: impl IntoIterator<Item = Channel>, parking: &Parking, now: Instant) -> Duration {
    if channels.into_iter().all(|c| parking.stalled(c, now)) { STALLED_AFTER } else { LAG_AFTER }
}
