//! Circuit breakers: a provider (or a webhook host) that failed every recent
//! attempt is not hammered. After `failures` failed attempts in a row the
//! breaker opens: the workers send nothing more to it and park its
//! deliveries (`super::parking`) instead of holding a slot for the 10 s
//! attempt bound. After a cooldown one attempt goes through as a probe; its
//! answer closes the breaker or opens it again for twice as long (up to the
//! longest cooldown).
//!
//! A failure is an attempt whose outcome is transient (5xx, 429, a timeout,
//! a connection error: spec 000 §7's retried rows) or a send that made no
//! request (`Outcome::NotSent`: a credential fetch that failed). Any other
//! answer (delivered, rejected, mismatch, terminal, the HTTPS channel's
//! 404/410) shows the provider answering, and closes the breaker.
//!
//! On the healthy path a breaker costs an atomic load per attempt, and a
//! store of zero only after a failure; the lock is taken only while it is
//! open or opening.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

const CLOSED: u8 = 0;
const OPEN: u8 = 1;

/// What the breaker lets a delivery do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Closed: send.
    Send,
    /// Open and its cooldown is over: send this one as the probe.
    Probe,
    /// Open: do not send; park it.
    Shed,
}

/// What an answer changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Opened,
    Closed,
}

/// The breaker's rules (`DeliverySettings`).
#[derive(Debug, Clone, Copy)]
pub struct BreakerRules {
    /// Failed attempts in a row that open it; 0 never opens.
    pub failures: u32,
    /// The first cooldown before a probe.
    pub cooldown: Duration,
    /// The longest cooldown (it doubles after each failed probe).
    pub max_cooldown: Duration,
}

pub struct Breaker {
    rules: BreakerRules,
    state: AtomicU8,
    failures: AtomicU32,
    open: Mutex<Open>,
}

struct Open {
    /// When a probe may go.
    probe_at: Instant,
    cooldown: Duration,
    probe_in_flight: bool,
}

impl Breaker {
    pub fn new(rules: BreakerRules) -> Self {
        Self {
            rules,
            state: AtomicU8::new(CLOSED),
            failures: AtomicU32::new(0),
            open: Mutex::new(Open { probe_at: Instant::now(), cooldown: rules.cooldown, probe_in_flight: false }),
        }
    }

    pub fn is_open(&self) -> bool {
        self.state.load(Ordering::Acquire) == OPEN
    }

    /// Whether a delivery may be sent now. A `Probe` must be sent (its
    /// answer is what closes or reopens the breaker).
    pub fn admit(&self, now: Instant) -> Admit {
        if !self.is_open() {
            return Admit::Send;
        }
        let mut open = self.open.lock().unwrap();
        if !open.probe_in_flight && now >= open.probe_at {
            open.probe_in_flight = true;
            Admit::Probe
        } else {
            Admit::Shed
        }
    }

    /// Whether a probe could go now: what lets parked deliveries out again.
    pub fn probe_due(&self, now: Instant) -> bool {
        let open = self.open.lock().unwrap();
        !open.probe_in_flight && now >= open.probe_at
    }

    /// Records an attempt's answer; `probe` when `admit` made it the probe.
    pub fn record(&self, success: bool, probe: bool, now: Instant) -> Option<Transition> {
        if success {
            if self.failures.load(Ordering::Relaxed) != 0 {
                self.failures.store(0, Ordering::Relaxed);
            }
            if !self.is_open() {
                return None;
            }
            let mut open = self.open.lock().unwrap();
            open.probe_in_flight &= !probe;
            open.cooldown = self.rules.cooldown;
            // Any answer shows the provider answering again, the probe's
            // or that of an attempt started before the breaker opened.
            return (self.state.swap(CLOSED, Ordering::AcqRel) == OPEN).then_some(Transition::Closed);
        }
        let failures = self.failures.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        if self.is_open() {
            if probe {
                let mut open = self.open.lock().unwrap();
                open.probe_in_flight = false;
                open.cooldown = (open.cooldown * 2).min(self.rules.max_cooldown);
                open.probe_at = now + open.cooldown;
            }
            // Attempts started before it opened fail as they time out: they
            // do not push the probe further away.
            return None;
        }
        if self.rules.failures == 0 || failures < self.rules.failures {
            return None;
        }
        let mut open = self.open.lock().unwrap();
        if self.state.swap(OPEN, Ordering::AcqRel) == OPEN {
            return None;
        }
        open.cooldown = self.rules.cooldown;
        open.probe_at = now + open.cooldown;
        open.probe_in_flight = false;
        Some(Transition::Opened)
    }
}

/// The breakers of one channel's destination hosts (the HTTPS and Web Push
/// channels reach many): one host's outage must not open its channel's
/// breaker for every other host. Only hosts that failed recently are kept,
/// at most `MAX_HOSTS`; on the healthy path, with none kept, an attempt
/// costs an atomic load.
pub struct HostBreakers {
    rules: BreakerRules,
    kept: AtomicUsize,
    hosts: Mutex<HashMap<String, Breaker>>,
}

/// Hosts with a failure on record, at most; beyond, a new host's failures
/// are not tracked until one of them answers (its channel's breaker still
/// covers a provider-wide outage).
const MAX_HOSTS: usize = 4096;

impl HostBreakers {
    pub fn new(rules: BreakerRules) -> Self {
        Self { rules, kept: AtomicUsize::new(0), hosts: Mutex::new(HashMap::new()) }
    }

    pub fn admit(&self, host: &str, now: Instant) -> Admit {
        if self.kept.load(Ordering::Acquire) == 0 {
            return Admit::Send;
        }
        self.hosts.lock().unwrap().get(host).map_or(Admit::Send, |b| b.admit(now))
    }

    pub fn record(&self, host: &str, success: bool, probe: bool, now: Instant) -> Option<Transition> {
        if success && self.kept.load(Ordering::Acquire) == 0 {
            return None;
        }
        let mut hosts = self.hosts.lock().unwrap();
        let transition = match hosts.get(host) {
            Some(breaker) => breaker.record(success, probe, now),
            None if success || hosts.len() >= MAX_HOSTS || self.rules.failures == 0 => return None,
            None => {
                let breaker = Breaker::new(self.rules);
                let transition = breaker.record(false, false, now);
                hosts.insert(host.to_owned(), breaker);
                transition
            }
        };
        if success {
            // Answering again: nothing to remember.
            hosts.remove(host);
        }
        self.kept.store(hosts.len(), Ordering::Release);
        transition
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> BreakerRules {
        BreakerRules { failures: 3, cooldown: Duration::from_secs(1), max_cooldown: Duration::from_secs(4) }
    }

    #[test]
    fn opens_after_the_failures_in_a_row_and_a_success_in_between_resets_the_count() {
        let b = Breaker::new(rules());
        let now = Instant::now();
        assert_eq!(b.record(false, false, now), None);
        assert_eq!(b.record(false, false, now), None);
        assert_eq!(b.record(true, false, now), None, "an answer resets the count");
        assert_eq!(b.record(false, false, now), None);
        assert_eq!(b.record(false, false, now), None);
        assert_eq!(b.admit(now), Admit::Send);
        assert_eq!(b.record(false, false, now), Some(Transition::Opened));
        assert_eq!(b.admit(now), Admit::Shed);
    }

    #[test]
    fn one_probe_after_the_cooldown_closes_it_or_doubles_the_cooldown_up_to_the_longest() {
        let b = Breaker::new(rules());
        let t0 = Instant::now();
        for _ in 0..3 {
            b.record(false, false, t0);
        }
        assert!(b.is_open());
        assert_eq!(b.admit(t0 + Duration::from_millis(999)), Admit::Shed);
        let t1 = t0 + Duration::from_secs(1);
        assert!(b.probe_due(t1));
        assert_eq!(b.admit(t1), Admit::Probe);
        assert_eq!(b.admit(t1), Admit::Shed, "one probe at a time");
        assert!(!b.probe_due(t1));
        // An attempt started before it opened times out: no effect.
        assert_eq!(b.record(false, false, t1), None);
        // The probe fails: two seconds now, then four, never more.
        assert_eq!(b.record(false, true, t1), None);
        assert_eq!(b.admit(t1 + Duration::from_millis(1999)), Admit::Shed);
        let t2 = t1 + Duration::from_secs(2);
        assert_eq!(b.admit(t2), Admit::Probe);
        b.record(false, true, t2);
        let t3 = t2 + Duration::from_secs(4);
        assert_eq!(b.admit(t3), Admit::Probe);
        b.record(false, true, t3);
        assert_eq!(b.admit(t3 + Duration::from_secs(3)), Admit::Shed, "capped at the longest cooldown");
        let t4 = t3 + Duration::from_secs(4);
        assert_eq!(b.admit(t4), Admit::Probe);
        assert_eq!(b.record(true, true, t4), Some(Transition::Closed));
        assert_eq!(b.admit(t4), Admit::Send);
        // Opened again, it starts from the first cooldown.
        for _ in 0..3 {
            b.record(false, false, t4);
        }
        assert_eq!(b.admit(t4 + Duration::from_secs(1)), Admit::Probe);
    }

    #[test]
    fn zero_failures_never_opens() {
        let b = Breaker::new(BreakerRules { failures: 0, ..rules() });
        let now = Instant::now();
        for _ in 0..1000 {
            assert_eq!(b.record(false, false, now), None);
        }
        assert_eq!(b.admit(now), Admit::Send);
    }

    #[test]
    fn one_hosts_breaker_leaves_the_others_alone_and_answering_hosts_are_forgotten() {
        let hosts = HostBreakers::new(rules());
        let now = Instant::now();
        assert_eq!(hosts.record("up.example", true, false, now), None);
        for _ in 0..2 {
            assert_eq!(hosts.record("down.example", false, false, now), None);
        }
        assert_eq!(hosts.record("down.example", false, false, now), Some(Transition::Opened));
        assert_eq!(hosts.admit("down.example", now), Admit::Shed);
        assert_eq!(hosts.admit("up.example", now), Admit::Send);
        hosts.record("flaky.example", false, false, now);
        assert_eq!(hosts.hosts.lock().unwrap().len(), 2);
        hosts.record("flaky.example", true, false, now);
        assert_eq!(hosts.hosts.lock().unwrap().len(), 1, "an answering host is forgotten");
        let later = now + Duration::from_secs(1);
        assert_eq!(hosts.admit("down.example", later), Admit::Probe);
        assert_eq!(hosts.record("down.example", true, true, later), Some(Transition::Closed));
        assert_eq!(hosts.kept.load(Ordering::Acquire), 0);
        assert_eq!(hosts.admit("down.example", later), Admit::Send);
    }
}
