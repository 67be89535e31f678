//! What lets one channel fail alone (docs/ARCHITECTURE.md, "Channels fail
//! alone"), shared by the delivery workers and the shard actors: each
//! channel's breaker (and its hosts'), how much of each channel the workers
//! hold, and which shards have parked deliveries of which channel.
//!
//! A delivery the workers cannot send now without holding back another
//! channel (its breaker is open, or its channel is saturated while another
//! channel has room) is *parked*: stored in the parked table
//! (`store::ParkedStore`) and counted settled in its page, so the window
//! and the checkpoint move on (PUSH-257 holds: the row survives a crash and
//! a handover). The shard actor that owns the shard hands its parked
//! deliveries back to the workers when their channel can take them
//! (`may_unpark`), and deletes each row once that delivery had an attempt.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::time::Instant;

use super::breaker::{Admit, Breaker, BreakerRules, HostBreakers, Transition};
use crate::channel::Channels;
use crate::domain::{Channel, DeliveryTarget, ParkedPlace, ShardId};
use crate::metrics::Metrics;

/// One slot per row of the channel table (`Channel::slot`).
const SLOTS: usize = Channel::ALL.len();

/// A channel that had deliveries this recently is waiting for more: what
/// is held back behind another channel is its deliveries.
pub(super) const ACTIVE: Duration = Duration::from_secs(10);

/// A channel none of whose attempts ended this long, in any worker, is
/// *stalled*: its provider hangs, stalls in the TLS handshake, or is slower
/// than this. Its deliveries hold pages for this long at most before they
/// are parked or detached (`super::lanes`, `super::detach`). A channel whose
/// attempts end, however long each one takes (a provider at its
/// concurrency, or an engine short of CPU), is not stalled: its deliveries
/// get the longer waits, so a healthy but busy channel is not parked. An
/// attempt that failed fast ended too: failures are the breaker's to judge.
pub(super) const STALLED_AFTER: Duration = Duration::from_millis(250);

pub struct Parking {
    lanes: [Option<Lane>; SLOTS],
    /// Per shard and channel slot: the lowest sequence id parked since its
    /// owner last looked (`u64::MAX`: none).
    floors: Vec<AtomicU64>,
    /// The rows of first attempts detached while in flight
    /// (`super::detach`), which their shard's owner leaves alone until their
    /// answer has been applied; and how many, so the owner's check costs an
    /// atomic load while there are none.
    detached: Mutex<HashSet<ParkedPlace>>,
    detached_count: AtomicUsize,
    epoch: Instant,
    metrics: Arc<Metrics>,
}

/// One channel the workers send through.
struct Lane {
    /// Its `max_in_flight`: the requests its provider takes at once.
    capacity: usize,
    breaker: Breaker,
    hosts: HostBreakers,
    /// Deliveries the workers hold for it: ready, in flight, or waiting for
    /// a probe (not those waiting for a retry timer).
    held: AtomicUsize,
    /// Unparked deliveries handed to the workers and not yet attempted.
    unparked: AtomicUsize,
    /// When deliveries of it last reached a worker, in milliseconds since
    /// `Parking::epoch`, plus one (0: never).
    seen_ms: AtomicU64,
    /// When an attempt of it last ended (answered or not), the same way.
    ended_ms: AtomicU64,
}

/// How a delivery may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Send,
    /// Send it; its answer decides the breaker of this scope.
    Probe(Scope),
    /// A breaker is open: park it.
    Shed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Channel,
    Host,
}

impl Scope {
    fn as_str(self) -> &'static str {
        match self {
            Scope::Channel => "channel",
            Scope::Host => "host",
        }
    }
}

impl Parking {
    /// For the channels the workers send through, each with its
    /// `max_in_flight`, over `shard_count` shards.
    pub fn new(rules: BreakerRules, channels: &[(Channel, usize)], shard_count: u16, metrics: Arc<Metrics>) -> Self {
        let mut lanes: [Option<Lane>; SLOTS] = Default::default();
        for &(channel, capacity) in channels {
            metrics.parking.initialise(channel);
            lanes[channel.slot()] = Some(Lane {
                capacity,
                breaker: Breaker::new(rules),
                hosts: HostBreakers::new(rules),
                held: AtomicUsize::new(0),
                unparked: AtomicUsize::new(0),
                seen_ms: AtomicU64::new(0),
                ended_ms: AtomicU64::new(0),
            });
        }
        let floors = (0..usize::from(shard_count) * SLOTS).map(|_| AtomicU64::new(u64::MAX)).collect();
        Self {
            lanes,
            floors,
            detached: Mutex::default(),
            detached_count: AtomicUsize::new(0),
            epoch: Instant::now(),
            metrics,
        }
    }

    /// Every provider of `channels` with `max_in_flight` slots each, and
    /// the default breaker rules (benchmarks and tests).
    pub fn of_providers(channels: &Channels, max_in_flight: usize, shard_count: u16, metrics: Arc<Metrics>) -> Self {
        let slots: Vec<_> = channels.providers().map(|p| (p.channel(), max_in_flight)).collect();
        Self::new(super::DeliverySettings::default().breaker(), &slots, shard_count, metrics)
    }

    fn lane(&self, channel: Channel) -> Option<&Lane> {
        self.lanes[channel.slot()].as_ref()
    }

    /// The channels the workers send through.
    pub fn channels(&self) -> impl Iterator<Item = Channel> + '_ {
        Channel::ALL.iter().copied().filter(|c| self.lane(*c).is_some())
    }

    /// Each channel's slots in one of `workers` workers: its
    /// `max_in_flight` shared over them, rounded up.
    pub fn slots(&self, workers: usize) -> Vec<(Channel, usize)> {
        self.channels().map(|c| (c, self.lane(c).map_or(1, |l| l.capacity.div_ceil(workers.max(1))))).collect()
    }

    /// Whether `channel`'s breaker is open (its deliveries are parked as
    /// they come).
    pub fn is_open(&self, channel: Channel) -> bool {
        self.lane(channel).is_some_and(|l| l.breaker.is_open())
    }

    /// Whether a delivery to `target` may be sent now.
    pub fn admit(&self, target: &DeliveryTarget, now: Instant) -> Admission {
        let Some(lane) = self.lane(target.channel()) else { return Admission::Send };
        match lane.breaker.admit(now) {
            Admit::Shed => return Admission::Shed,
            Admit::Probe => return Admission::Probe(Scope::Channel),
            Admit::Send => {}
        }
        match target.destination_host().map(|host| lane.hosts.admit(host, now)) {
            Some(Admit::Shed) => Admission::Shed,
            Some(Admit::Probe) => Admission::Probe(Scope::Host),
            _ => Admission::Send,
        }
    }

    /// Records an attempt's answer to `target` (`success`: any answer but
    /// a transient one or none): the breakers of its channel and host.
    pub fn record(&self, target: &DeliveryTarget, success: bool, admission: Admission, now: Instant) {
        let channel = target.channel();
        let Some(lane) = self.lane(channel) else { return };
        let probe = |scope| admission == Admission::Probe(scope);
        let label = channel.as_str();
        let m = &self.metrics.parking;
        match lane.breaker.record(success, probe(Scope::Channel), now) {
            Some(Transition::Opened) => {
                m.breaker_opened.with_label_values(&[label, Scope::Channel.as_str()]).inc();
                m.breaker_open.with_label_values(&[label]).set(1);
                tracing::warn!(
                    channel = label,
                    "provider failed every recent attempt; breaker open, deliveries parked"
                );
            }
            Some(Transition::Closed) => {
                m.breaker_open.with_label_values(&[label]).set(0);
                tracing::info!(channel = label, "provider answers again; breaker closed");
            }
            None => {}
        }
        if let Some(host) = target.destination_host()
            && lane.hosts.record(host, success, probe(Scope::Host), now) == Some(Transition::Opened)
        {
            // The host is never named (it is part of a recipient's target).
            m.breaker_opened.with_label_values(&[label, Scope::Host.as_str()]).inc();
        }
    }

    /// The workers took (`+`) or let go of (`-`) deliveries of `channel`.
    pub fn held(&self, channel: Channel, delta: isize) {
        if let Some(lane) = self.lane(channel) {
            if delta >= 0 {
                lane.held.fetch_add(delta as usize, Ordering::Relaxed);
            } else {
                lane.held.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
            }
        }
    }

    /// A delivery of `channel` was parked for `shard` at `sequence_id`: its
    /// owner looks for it from there (rows parked again, and retries, can
    /// lie behind where its reading got to).
    pub fn parked(&self, shard: ShardId, channel: Channel, sequence_id: u64) {
        if let Some(floor) = self.floors.get(usize::from(shard.index()) * SLOTS + channel.slot()) {
            floor.fetch_min(sequence_id, Ordering::AcqRel);
        }
    }

    /// Deliveries of `channel` reached a worker at `now`.
    pub fn arrived(&self, channel: Channel, now: Instant) {
        if let Some(lane) = self.lane(channel) {
            lane.seen_ms.fetch_max(self.ms(now), Ordering::Relaxed);
        }
    }

    /// An attempt of `channel` ended at `now`.
    pub fn ended(&self, channel: Channel, now: Instant) {
        if let Some(lane) = self.lane(channel) {
            let ms = self.ms(now);
            // At most one write per millisecond, not one per attempt.
            if lane.ended_ms.load(Ordering::Relaxed) < ms {
                lane.ended_ms.fetch_max(ms, Ordering::Relaxed);
            }
        }
    }

    /// Whether no attempt of `channel` ended for `STALLED_AFTER`.
    pub fn stalled(&self, channel: Channel, now: Instant) -> bool {
        self.lane(channel).is_some_and(|lane| {
            let since = self.ms(now).saturating_sub(lane.ended_ms.load(Ordering::Relaxed));
            since >= STALLED_AFTER.as_millis() as u64
        })
    }

    /// `now` in milliseconds since `epoch`, plus one (0 stands for never).
    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64 + 1
    }

    /// Whether a channel other than `channel` had deliveries reach any
    /// worker lately and its breaker is closed: a page that `channel` holds
    /// back may be waited for by its deliveries, in any worker (a worker that
    /// has seen only `channel` lately may hold the pages the others wait on).
    pub fn others_active(&self, channel: Channel, now: Instant) -> bool {
        let ms = self.ms(now);
        let active = ACTIVE.as_millis() as u64;
        self.channels().filter(|&c| c != channel).any(|c| {
            let lane = self.lane(c).expect("a configured channel");
            let seen = lane.seen_ms.load(Ordering::Relaxed);
            seen != 0 && ms.saturating_sub(seen) < active && !lane.breaker.is_open()
        })
    }

    /// The row at `place` belongs to a first attempt still in flight: its
    /// shard's owner does not hand it out.
    pub fn detach(&self, place: ParkedPlace) {
        if self.detached.lock().expect("not poisoned").insert(place) {
            self.detached_count.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The attempt whose row is at `place` was answered and its row deleted
    /// or rewritten: its owner may hand it out again.
    pub fn attach(&self, place: ParkedPlace) {
        if self.detached.lock().expect("not poisoned").remove(&place) {
            self.detached_count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Whether the row at `place` belongs to an attempt in flight.
    pub fn is_detached(&self, place: &ParkedPlace) -> bool {
        self.detached_count.load(Ordering::Acquire) > 0 && self.detached.lock().expect("not poisoned").contains(place)
    }

    /// The channels of `shard` with deliveries parked since the last call,
    /// each with the lowest sequence id parked.
    pub fn take_parked(&self, shard: ShardId) -> Vec<(Channel, u64)> {
        let base = usize::from(shard.index()) * SLOTS;
        self.channels()
            .filter_map(|c| {
                let floor = self.floors.get(base + c.slot())?.swap(u64::MAX, Ordering::AcqRel);
                (floor != u64::MAX).then_some((c, floor))
            })
            .collect()
    }

    /// Reserves up to `want` parked deliveries of `channel` to hand back to
    /// the workers now, and returns how many: none while its breaker is
    /// open (one when a probe is due, so that a channel whose deliveries
    /// are all parked still probes), else as many as fit in its
    /// `max_in_flight` beside what the workers hold and what other shards
    /// reserved. What is not handed out is given back (`unparked`).
    pub fn reserve_unpark(&self, channel: Channel, want: usize, now: Instant) -> usize {
        let Some(lane) = self.lane(channel) else { return 0 };
        let mut granted = 0;
        let _ = lane.unparked.fetch_update(Ordering::AcqRel, Ordering::Acquire, |out| {
            let room = if lane.breaker.is_open() {
                usize::from(out == 0 && lane.breaker.probe_due(now))
            } else {
                lane.capacity.saturating_sub(lane.held.load(Ordering::Relaxed)).saturating_sub(out)
            };
            granted = room.min(want);
            (granted > 0).then_some(out + granted)
        });
        granted
    }

    /// `n` unparked deliveries of `channel` were attempted, parked again or
    /// dropped, or reserved and not handed out.
    pub fn unparked(&self, channel: Channel, n: usize) {
        if let Some(lane) = self.lane(channel) {
            lane.unparked.fetch_sub(n, Ordering::AcqRel);
        }
    }

    /// Counts `n` parked deliveries of `channel` handed back to the workers.
    pub fn count_unparked(&self, channel: Channel, n: usize) {
        self.metrics.parking.unparked.with_label_values(&[channel.as_str()]).inc_by(n as u64);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parking() -> Parking {
        let rules =
            BreakerRules { failures: 2, cooldown: Duration::from_secs(1), max_cooldown: Duration::from_secs(8) };
        Parking::new(rules, &[(Channel::Apns, 10), (Channel::Http, 100)], 4, Arc::new(Metrics::new()))
    }

    #[test]
    fn marks_are_per_shard_and_channel_and_taken_once() {
        let p = parking();
        let shard = ShardId::all(4).nth(2).unwrap();
        p.parked(shard, Channel::Apns, 9);
        p.parked(shard, Channel::Apns, 4);
        p.parked(shard, Channel::Apns, 7);
        assert!(p.take_parked(ShardId::FIRST).is_empty());
        assert_eq!(p.take_parked(shard), vec![(Channel::Apns, 4)], "the lowest");
        assert!(p.take_parked(shard).is_empty());
    }

    #[test]
    fn a_channel_is_stalled_once_none_of_its_attempts_ended_for_a_while_in_any_worker() {
        let p = parking();
        let t0 = p.epoch;
        let at = |ms| t0 + Duration::from_millis(ms);
        p.ended(Channel::Apns, at(1_000));
        assert!(!p.stalled(Channel::Apns, at(1_100)), "an attempt ended 100 ms ago");
        // Another worker's attempt ending counts as much as this one's; an
        // earlier time told later does not move it back.
        p.ended(Channel::Apns, at(1_200));
        p.ended(Channel::Apns, at(1_150));
        assert!(!p.stalled(Channel::Apns, at(1_449)));
        assert!(p.stalled(Channel::Apns, at(1_450)), "nothing ended for STALLED_AFTER");
        assert!(p.stalled(Channel::Http, at(1_450)), "nothing of it ever ended");
        assert!(!p.stalled(Channel::Fcm, at(1_450)), "not a channel the workers send through");
    }

    #[test]
    fn unparking_fits_beside_what_the_workers_hold_and_waits_for_a_probe_while_open() {
        let p = parking();
        let now = Instant::now();
        assert_eq!(p.reserve_unpark(Channel::Apns, 3, now), 3);
        p.held(Channel::Apns, 4);
        assert_eq!(p.reserve_unpark(Channel::Apns, 100, now), 3, "10 slots, 4 held, 3 reserved");
        assert_eq!(p.reserve_unpark(Channel::Apns, 100, now), 0);
        p.count_unparked(Channel::Apns, 3);
        p.held(Channel::Apns, -4);
        p.unparked(Channel::Apns, 6);
        let target = DeliveryTarget::Apns { token: "t".into() };
        p.record(&target, false, Admission::Send, now);
        p.record(&target, false, Admission::Send, now);
        assert!(p.is_open(Channel::Apns));
        assert_eq!(p.admit(&target, now), Admission::Shed);
        assert_eq!(p.reserve_unpark(Channel::Apns, 100, now), 0, "open: nothing");
        let later = now + Duration::from_secs(1);
        assert_eq!(p.reserve_unpark(Channel::Apns, 100, later), 1, "one, to be the probe");
        assert_eq!(p.reserve_unpark(Channel::Apns, 100, later), 0, "only one");
        p.unparked(Channel::Apns, 1);
        assert_eq!(p.admit(&target, later), Admission::Probe(Scope::Channel));
        p.record(&target, true, Admission::Probe(Scope::Channel), later);
        assert!(!p.is_open(Channel::Apns));
        assert_eq!(p.reserve_unpark(Channel::Http, 1000, later), 100, "the other channel never noticed");
        let exposed = p.metrics.render();
        crate::metrics::assert_exposed(
            &exposed,
            &[
                r#"fanout_breaker_opened_total{channel="apns",scope="channel"} 1"#,
                r#"fanout_breaker_open{channel="apns"} 0"#,
                r#"fanout_unparked_total{channel="apns"} 3"#,
                r#"fanout_parked_total{channel="http",reason="breaker"} 0"#,
            ],
        );
    }
}
