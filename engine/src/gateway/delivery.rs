//! §5.2 `accepted` is a durable takeover: the wakeups notify stored are sent
//! here, by a worker that leases them from the `Store`, so a wakeup outlives
//! the request and the process that accepted it.
//!
//! One loop per engine: it leases at most the free in-flight slots' worth of
//! due wakeups (`max_in_flight` bounds the provider requests at once), sends
//! each in its own task through the channel's `Provider::send` (the
//! APNs/FCM request builders and outcome tables of the relay ingress, in the
//! same pools), and applies the outcome:
//!
//! | outcome | then |
//! | --- | --- |
//! | delivered | the wakeup is deleted |
//! | terminal (APNs 410 Unregistered, FCM UNREGISTERED) | the registration is marked `token_invalid` (only if it is still the one used), the wakeup deleted: the next notify answers `push_token_invalid` |
//! | rejected, mismatch, too large | deleted (counted; the caller is not told: provider states never reach notify's answer) |
//! | transient, 429, timeout, not sent | rescheduled after the provider's delay (Retry-After) or the backoff, whichever is later; given up after `max_attempts` attempts or at its `expires_at` |
//!
//! The route is read again before each attempt: a revoked, superseded,
//! expired or dead registration is never used (§3.3 "旧注册不得因 worker、缓存
//! 或延迟请求复活"); its wakeup is dropped. A lease is three attempt bounds,
//! so a crashed worker's wakeups are taken over by the next poll after it.
//!
//! Each wakeup is also an entry of its device's pending ledger (`pending`,
//! the bound behind §5.2 `rate_limited`): a reschedule moves the entry's
//! next attempt, a delete removes it. Operators see the worker through
//! `fanout_gateway_wakeups_total` (what followed each attempt) and three
//! gauges: wakeups in flight, how late the last lease's oldest wakeup was,
//! and how long the worker has had work without finishing any.

use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Map, Value};
use tokio::sync::{Notify, Semaphore, watch};
use tokio::task::JoinSet;

use super::egress::CollapseKeys;
use super::pending::ledger_key;
use super::schema::PushKey;
use super::state::{held_batch, update_ledger};
use crate::channel::{Channels, Outcome, Push, Refusal, RelayPriority, RelayedPush};
use crate::domain::{Channel, Clock, GatewayRegistration, LeasedWakeup, PushRouteId};
use crate::metrics::Metrics;
use crate::store::{Store, StoreError};
use crate::transport::ATTEMPT_TIMEOUT;

/// How long a leased wakeup stays with its worker: three attempt bounds.
pub const LEASE: Duration = Duration::from_secs(3 * ATTEMPT_TIMEOUT.as_secs());

/// `[engine.gateway.delivery]`: how the worker runs.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeliverySettings {
    /// Provider requests in flight at once.
    pub max_in_flight: NonZeroUsize,
    /// Attempts before a wakeup is given up.
    pub max_attempts: NonZeroU32,
    /// How often the store is asked for due wakeups when nothing wakes the
    /// worker sooner (a retry's time, another node's wakeups).
    #[serde(rename = "poll_interval_ms", deserialize_with = "crate::duration::millis")]
    pub poll_interval: Duration,
}

impl Default for DeliverySettings {
    fn default() -> Self {
        Self {
            max_in_flight: NonZeroUsize::new(64).unwrap(),
            max_attempts: NonZeroU32::new(8).unwrap(),
            poll_interval: Duration::from_millis(500),
        }
    }
}

/// The provider channel and APNs host of a route.
pub fn route_channel(route: PushRouteId) -> (Channel, bool) {
    match route {
        PushRouteId::FcmMain => (Channel::Fcm, false),
        PushRouteId::ApnsMain => (Channel::Apns, false),
        PushRouteId::ApnsSandbox => (Channel::Apns, true),
    }
}

/// The backoff before attempt `attempts + 1`: 1, 2, 4, ... s, at most 5 min.
fn backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(8)).min(Duration::from_secs(300))
}

/// What became of one leased wakeup: the `outcome` of
/// `fanout_gateway_wakeups_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Sent {
    /// The provider took it; deleted.
    Delivered,
    /// Tried again later (429, 5xx, timeout, no credential).
    Retried,
    /// The token is dead; the registration is marked, the wakeup deleted.
    DeadToken,
    /// Refused for good by the provider (bad topic, sender mismatch, too
    /// large), or unsendable here (its channel no longer configured, an
    /// unreadable route or payload); deleted.
    Rejected,
    /// Given up: `max_attempts` attempts, or its lifetime ran out.
    Exhausted,
    /// Its registration is revoked, superseded, expired or dead (§3.3):
    /// never sent; deleted.
    Revoked,
}

impl Sent {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// What the worker loop knows of its progress, for the stalled gauge: it
/// "has work" while attempts are in flight, its last lease found due
/// wakeups, or the store could not be read; progress is an attempt
/// finished, or a look that found nothing to do.
struct Progress {
    last: Instant,
}

impl Progress {
    /// Seconds without progress, given whether the worker has work now.
    fn stalled(&mut self, has_work: bool, now: Instant) -> f64 {
        if !has_work {
            self.last = now;
        }
        now.duration_since(self.last).as_secs_f64()
    }
}

/// The wakeup sender: cheap to clone, shared by the notify service (which
/// nudges it after a commit) and its loop.
#[derive(Clone)]
pub struct Delivery {
    store: Arc<dyn Store>,
    channels: Channels,
    settings: DeliverySettings,
    keys: CollapseKeys,
    wake: Arc<Notify>,
    metrics: Arc<Metrics>,
    /// The time wakeups fall due, are retried and expire on.
    clock: Arc<dyn Clock>,
}

impl Delivery {
    pub fn new(
        store: Arc<dyn Store>,
        channels: Channels,
        settings: DeliverySettings,
        keys: CollapseKeys,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self { store, channels, settings, keys, wake: Arc::new(Notify::new()), metrics, clock }
    }

    /// The clock the gateway runs on (its service shares it).
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// Says that wakeups were stored: the loop looks now, not at its next poll.
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Runs until `shutdown` turns true, then lets the attempts in flight
    /// finish (their leases cover them if the process stops first).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let max_in_flight = self.settings.max_in_flight.get();
        let slots = Arc::new(Semaphore::new(max_in_flight));
        let mut tasks = JoinSet::new();
        let gauges = &self.metrics.gateway;
        let mut progress = Progress { last: Instant::now() };
        loop {
            if *shutdown.borrow() {
                break;
            }
            let free = slots.available_permits();
            let mut taken = 0;
            let mut unreadable = false;
            if free > 0 {
                match self.lease_due(free).await {
                    Ok(due) => {
                        taken = due.len();
                        for leased in due {
                            let Ok(permit) = slots.clone().try_acquire_owned() else { break };
                            let this = self.clone();
                            tasks.spawn(async move {
                                let _permit = permit;
                                this.send(leased).await
                            });
                        }
                    }
                    Err(e) => {
                        unreadable = true;
                        tracing::warn!(error = %e, "cannot read the gateway's wakeups");
                    }
                }
            }
            let mut finished = false;
            while tasks.try_join_next().is_some() {
                finished = true;
            }
            let at = Instant::now();
            if finished {
                progress.last = at;
            }
            let has_work = !tasks.is_empty() || taken > 0 || unreadable || free == 0;
            gauges.worker_stalled.set(progress.stalled(has_work, at));
            gauges.wakeups_in_flight.set((max_in_flight - slots.available_permits()) as i64);
            // A full batch: there may be more due at once.
            if taken > 0 && taken == free {
                continue;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(self.settings.poll_interval) => {}
                Some(_) = tasks.join_next(), if !tasks.is_empty() => progress.last = Instant::now(),
                _ = shutdown.changed() => {}
            }
        }
        while tasks.join_next().await.is_some() {}
        gauges.wakeups_in_flight.set(0);
    }

    /// Leases at most `free` of the wakeups due now, and tells the lateness
    /// gauge how late the most overdue of them is.
    async fn lease_due(&self, free: usize) -> Result<Vec<LeasedWakeup>, StoreError> {
        let now = self.clock.now_ms();
        let lease_until = now + LEASE.as_millis() as i64;
        let due = self.store.gateway().wakeups_due(now, lease_until, free).await?;
        let late_ms = due.iter().map(|l| now - l.wakeup.not_before_ms).max().unwrap_or(0);
        self.metrics.gateway.wakeup_lateness.set(late_ms.max(0) as f64 / 1000.0);
        Ok(due)
    }

    /// One attempt of one leased wakeup, counted by what followed.
    pub async fn send(&self, leased: LeasedWakeup) -> Sent {
        let sent = self.attempt(&leased).await;
        self.metrics.gateway.wakeups.with_label_values(&[sent.as_str()]).inc();
        sent
    }

    /// One attempt of one leased wakeup, and what follows from its outcome.
    async fn attempt(&self, leased: &LeasedWakeup) -> Sent {
        let now = self.clock.now_ms();
        let w = &leased.wakeup;
        let Ok(route) = self.store.gateway().route(&w.route, now).await else {
            return self.retry(leased, Duration::from_secs(1), false).await;
        };
        let Some(reg) = route.filter(|r| r.registration_id == w.registration_id && !r.token_invalid) else {
            return self.finish(leased, Sent::Revoked).await;
        };
        if w.expires_at_ms <= now {
            return self.finish(leased, Sent::Exhausted).await;
        }
        let Some((channel, sandbox, token)) = self.route_of(&reg) else {
            return self.finish(leased, Sent::Rejected).await;
        };
        // §2.4: the key of the window this attempt is sent in, not the one the
        // wake-up was accepted in (a retry may cross into the next window).
        let Some(collapse_key) = self.keys.at(&reg.salt_epoch_id, &reg.push_target_id, now.max(0) as u64) else {
            // Its salt epoch was retired: the registration no longer resolves.
            return self.finish(leased, Sent::Revoked).await;
        };
        let Some(provider) = self.channels.get(channel).cloned() else {
            // Configuration changed since the wakeup was accepted.
            return self.finish(leased, Sent::Rejected).await;
        };
        let held = held_batch(self.store.as_ref(), w, now).await;
        let Ok(payload) = serde_json::from_slice::<Map<String, Value>>(held.as_deref().unwrap_or(&w.payload)) else {
            return self.finish(leased, Sent::Rejected).await;
        };
        let priority = if payload.get("wakeup_kind").and_then(Value::as_str) == Some("call_invite") {
            RelayPriority::High
        } else {
            RelayPriority::Normal
        };
        let ttl = Duration::from_millis((w.expires_at_ms - now).max(1000) as u64);
        let push = RelayedPush {
            token: &token,
            // The channel's own topic / project: a device-chosen app_id is
            // never an APNs topic here (docs/GATEWAY.md).
            app_id: None,
            sandbox,
            collapse_id: Some(collapse_key.as_str()),
            priority,
            payload: &payload,
            ttl,
            web_push_keys: None,
        };
        let outcome = provider.send_within_attempt_bound(Push::Relayed(push)).await;
        match outcome {
            Ok(Outcome::Delivered) => self.finish(leased, Sent::Delivered).await,
            Ok(Outcome::Terminal) => {
                if let Err(e) = self.store.gateway().mark_token_invalid(&w.route, &w.registration_id).await {
                    tracing::warn!(error = %e, "cannot mark a dead push token");
                }
                self.finish(leased, Sent::DeadToken).await
            }
            Ok(Outcome::Rejected | Outcome::Mismatch) | Err(Refusal::TooLarge | Refusal::Unsupported) => {
                self.finish(leased, Sent::Rejected).await
            }
            Ok(Outcome::NotSent { delay }) => self.retry(leased, delay, false).await,
            Ok(Outcome::Transient { delay } | Outcome::Gone { delay }) => self.retry(leased, delay, true).await,
        }
    }

    /// The channel, APNs host and provider token of a registration.
    fn route_of(&self, reg: &GatewayRegistration) -> Option<(Channel, bool, String)> {
        let route = reg.push_route_id;
        let platform = reg.platform.as_deref().and_then(super::schema::Platform::parse);
        let key = PushKey::parse(&reg.push_key, platform).ok()?;
        let (channel, sandbox) = route_channel(route);
        Some((channel, sandbox, key.provider_token().to_owned()))
    }

    async fn retry(&self, leased: &LeasedWakeup, delay: Duration, attempted: bool) -> Sent {
        let attempts = leased.wakeup.attempts + u32::from(attempted);
        if attempts >= self.settings.max_attempts.get() {
            return self.finish(leased, Sent::Exhausted).await;
        }
        let wait = delay.max(backoff(attempts.saturating_sub(1)));
        let now = self.clock.now_ms();
        let not_before = now + wait.as_millis() as i64;
        if not_before >= leased.wakeup.expires_at_ms {
            return self.finish(leased, Sent::Exhausted).await;
        }
        match self.store.gateway().wakeup_reschedule(leased, not_before, attempts).await {
            Ok(true) => self.change_ledger(leased, now, |l| l.reschedule(&leased.wakeup.id, not_before, now)).await,
            Ok(false) => {}
            // The lease runs out and the wakeup is taken again.
            Err(e) => tracing::warn!(error = %e, "cannot reschedule a wakeup"),
        }
        Sent::Retried
    }

    /// Deletes a finished wakeup (and its ledger entry): `sent` says why.
    async fn finish(&self, leased: &LeasedWakeup, sent: Sent) -> Sent {
        match self.store.gateway().wakeup_delete(leased).await {
            // Not ours any more (the lease ran out): its holder finishes it.
            Ok(false) => {}
            Ok(true) => {
                let now = self.clock.now_ms();
                self.change_ledger(leased, now, |l| l.remove(&leased.wakeup.id, now)).await;
            }
            Err(e) => tracing::warn!(error = %e, "cannot delete a sent wakeup; it may be sent again"),
        }
        sent
    }

    /// A change of the wakeup's device ledger. A failure leaves the entry
    /// until it expires: the device's bound is then one lower meanwhile.
    async fn change_ledger(
        &self,
        leased: &LeasedWakeup,
        now: i64,
        change: impl FnMut(&mut super::pending::PendingWakeups) -> bool,
    ) {
        let route = &leased.wakeup.route;
        let key = ledger_key(&route.account_id, &route.device_id);
        if let Err(e) = update_ledger(self.store.as_ref(), &route.tenant, &key, now, change).await {
            tracing::warn!(error = %e, "cannot update a device's pending wakeups");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{
        AccountId, DeviceId, GatewayWakeup, IdempotencyKey, NotifyClaim, NotifyKey, PushTargetId, RegistrationId,
        Revoke, SaltEpochId, ServiceId,
    };
    use crate::gateway::pending::{Admission, PendingWakeups};
    use crate::store::RedbStore;
    use crate::testing::{Scripted, TestClock, salt_secrets as secrets};

    struct Setup {
        _dir: tempfile::TempDir,
        store: Arc<dyn Store>,
        provider: Arc<Scripted>,
        clock: Arc<TestClock>,
        delivery: Delivery,
        registration: GatewayRegistration,
        metrics: Arc<Metrics>,
    }

    impl Setup {
        fn now(&self) -> i64 {
            self.clock.now_ms()
        }

        fn sent(&self) -> usize {
            self.provider.sent.lock().unwrap().len()
        }
    }

    async fn setup(answers: Vec<Outcome>) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), 4).unwrap());
        let provider = Scripted::new(answers);
        let mut channels = Channels::default();
        channels.insert(provider.clone());
        let metrics = Arc::new(Metrics::new());
        let keys = CollapseKeys::new(secrets(), WINDOW);
        let clock = TestClock::at(T0);
        let delivery =
            Delivery::new(store.clone(), channels, DeliverySettings::default(), keys, metrics.clone(), clock.clone());
        let registration = GatewayRegistration {
            tenant: station(),
            account_id: AccountId::parse("ak:account:a").unwrap(),
            device_id: DeviceId::parse("ak:device:01964137-0000-7000-8000-000000000001").unwrap(),
            registration_id: RegistrationId::parse(REG).unwrap(),
            push_target_id: PushTargetId::parse(TARGET).unwrap(),
            push_route_id: PushRouteId::FcmMain,
            salt_epoch_id: SaltEpochId::parse("e1").unwrap(),
            push_key: "fcm:the-token".into(),
            platform: None,
            app_id: Some("com.example".into()),
            visible_opt_in: false,
            created_at_ms: T0,
            expires_at_ms: T0 + 3_600_000,
            token_invalid: false,
        };
        store.gateway().register(&registration).await.unwrap();
        Setup { _dir: dir, store, provider, clock, delivery, registration, metrics }
    }

    /// A window's start: 2026-01-01T00:00:00Z.
    const T0: i64 = 1_767_225_600_000;
    const WINDOW: Duration = Duration::from_secs(60);
    const TARGET: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
    /// The registration's id, and one it superseded.
    const REG: &str = "registration-current-1";
    const SUPERSEDED: &str = "registration-superseded";

    fn station() -> ServiceId {
        ServiceId::parse("station").unwrap()
    }

    /// §2.4's key for the registration's wake-ups sent in the window of `at_ms`.
    fn key_at(at_ms: i64) -> String {
        let (epoch, target) = (SaltEpochId::parse("e1").unwrap(), PushTargetId::parse(TARGET).unwrap());
        CollapseKeys::new(secrets(), WINDOW).at(&epoch, &target, at_ms as u64).unwrap().as_str().to_owned()
    }

    /// Stores one wakeup for the registration as notify does, due at
    /// `not_before_ms`, living until `expires_at_ms`.
    async fn stored(s: &Setup, registration_id: &str, not_before_ms: i64, expires_at_ms: i64) {
        let now = s.now();
        let id = format!("{:032x}", rand::random::<u128>());
        let key = NotifyKey { tenant: station(), idempotency_key: IdempotencyKey::parse(&format!("k-{id}")).unwrap() };
        let claim = s.store.gateway().notify_claim(&key, &[1; 32], now, now + 30_000, now + 60_000).await.unwrap();
        assert_eq!(claim, NotifyClaim::Claimed);
        let wakeup = GatewayWakeup {
            id: id.clone(),
            route: s.registration.route_key(),
            registration_id: RegistrationId::parse(registration_id).unwrap(),
            payload: br#"{"push_target_id":"ak:pseudonym:push:t","wakeup_kind":"call_invite"}"#.to_vec(),
            // The acceptance window's key: the sender uses its own window's.
            collapse_key: key_at(now),
            not_before_ms,
            attempts: 0,
            expires_at_ms,
        };
        update_ledger(s.store.as_ref(), &station(), &ledger_key_of(s), now, |l| {
            l.add(&id, not_before_ms, expires_at_ms, now)
        })
        .await
        .unwrap();
        assert!(s.store.gateway().notify_commit(&key, now + 30_000, b"{}", &[wakeup], now + 60_000).await.unwrap());
    }

    /// Stores one wakeup due now (as notify does) and leases it.
    async fn leased(s: &Setup, registration_id: &str) -> LeasedWakeup {
        leased_until(s, registration_id, s.now() + 3_600_000).await
    }

    /// The same, living until `expires_at_ms`.
    async fn leased_until(s: &Setup, registration_id: &str, expires_at_ms: i64) -> LeasedWakeup {
        stored(s, registration_id, s.now(), expires_at_ms).await;
        let mut due = s.store.gateway().wakeups_due(s.now(), s.now() + 30_000, 10).await.unwrap();
        assert_eq!(due.len(), 1);
        due.remove(0)
    }

    fn ledger_key_of(s: &Setup) -> Vec<u8> {
        ledger_key(&s.registration.account_id, &s.registration.device_id)
    }

    /// The device's pending ledger as stored.
    async fn ledger(s: &Setup) -> PendingWakeups {
        let held = s.store.gateway().state(&station(), &ledger_key_of(s), s.now()).await.unwrap();
        held.map(|b| serde_json::from_slice(&b).unwrap()).unwrap_or_default()
    }

    fn counted(s: &Setup, sent: Sent) -> u64 {
        s.metrics.gateway.wakeups.with_label_values(&[sent.as_str()]).get()
    }

    async fn nothing_due(s: &Setup, at_ms: i64) -> bool {
        s.store.gateway().wakeups_due(at_ms, at_ms + 1, 10).await.unwrap().is_empty()
    }

    #[tokio::test]
    async fn a_delivered_wakeup_is_deleted_and_went_out_as_stored() {
        let s = setup(vec![Outcome::Delivered]).await;
        let w = leased(&s, REG).await;
        assert_eq!(s.delivery.send(w).await, Sent::Delivered);
        let sent = s.provider.sent.lock().unwrap().clone();
        assert_eq!(sent.len(), 1);
        // The provider token without its route prefix, the stored payload,
        // and the collapse key of the window it was sent in.
        assert_eq!(sent[0].0, "the-token");
        assert_eq!(sent[0].1["wakeup_kind"], "call_invite");
        assert_eq!(sent[0].2.clone().unwrap(), key_at(T0));
        assert!(nothing_due(&s, s.now() + 3_600_000).await);
        // Its place in the device's ledger is free again; it was counted.
        assert!(ledger(&s).await.is_empty(s.now()));
        assert_eq!((counted(&s, Sent::Delivered), counted(&s, Sent::Retried)), (1, 0));
    }

    #[tokio::test]
    async fn a_retried_wakeup_carries_the_collapse_key_of_the_window_it_is_sent_in() {
        // Accepted near the end of a window, answered 503, retried in the
        // next: every attempt carries the key of the window it is sent in
        // (§2.4, docs/GATEWAY.md reading 3).
        let s = setup(vec![Outcome::transient(Duration::from_secs(1)), Outcome::Delivered]).await;
        s.clock.set(T0 + WINDOW.as_millis() as i64 - 500);
        let first = leased(&s, REG).await;
        let accepted_in = first.wakeup.collapse_key.clone();
        assert_eq!(s.delivery.send(first).await, Sent::Retried);
        s.clock.advance(Duration::from_secs(1));
        let mut due = s.store.gateway().wakeups_due(s.now(), s.now() + 30_000, 10).await.unwrap();
        assert_eq!(s.delivery.send(due.remove(0)).await, Sent::Delivered);
        let keys: Vec<String> = s.provider.sent.lock().unwrap().iter().map(|(_, _, k)| k.clone().unwrap()).collect();
        assert_eq!(keys, [accepted_in.clone(), key_at(T0 + WINDOW.as_millis() as i64)]);
        assert_ne!(keys[1], accepted_in, "the retry's window, not the acceptance window's");
    }

    #[tokio::test]
    async fn a_dead_token_marks_the_registration_it_was_sent_for() {
        let s = setup(vec![Outcome::Terminal]).await;
        let w = leased(&s, REG).await;
        assert_eq!(s.delivery.send(w).await, Sent::DeadToken);
        let route = s.store.gateway().route(&s.registration.route_key(), s.now()).await.unwrap().unwrap();
        assert!(route.token_invalid);
        assert!(nothing_due(&s, s.now() + 3_600_000).await);
    }

    #[tokio::test]
    async fn a_transient_answer_is_retried_after_its_delay_and_then_given_up() {
        let answers = vec![Outcome::transient(Duration::from_secs(5)); 8];
        let s = setup(answers).await;
        let w = leased(&s, REG).await;
        assert_eq!(s.delivery.send(w).await, Sent::Retried);
        assert!(nothing_due(&s, T0 + 4_999).await, "not before the provider's delay");
        let mut due = s.store.gateway().wakeups_due(T0 + 5_000, T0 + 35_000, 10).await.unwrap();
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].wakeup.attempts, 1);
        // Still pending for its device, next tried after the delay: a
        // device at its bound is told to retry after that attempt.
        let pending = ledger(&s).await;
        assert_eq!(pending.len(s.now()), 1);
        let Admission::Full { retry_after } = pending.admit("another", 1, T0) else { panic!("full") };
        assert_eq!(retry_after, Duration::from_secs(5) + ATTEMPT_TIMEOUT);
        // A wakeup at its last attempt is given up.
        let mut last = due.remove(0);
        last.wakeup.attempts = DeliverySettings::default().max_attempts.get() - 1;
        assert_eq!(s.delivery.send(last).await, Sent::Exhausted);
        assert!(nothing_due(&s, s.now() + 3_600_000).await);
        assert!(ledger(&s).await.is_empty(s.now()));
        assert_eq!((counted(&s, Sent::Retried), counted(&s, Sent::Exhausted)), (1, 1));
    }

    #[tokio::test]
    async fn a_wakeup_is_sent_until_its_expiry_and_given_up_at_it() {
        let s = setup(vec![]).await;
        let expires = T0 + 10_000;
        let (before, at) = (leased_until(&s, REG, expires).await, leased_until(&s, REG, expires).await);
        s.clock.set(expires - 1);
        assert_eq!(s.delivery.send(before).await, Sent::Delivered);
        s.clock.set(expires);
        assert_eq!(s.delivery.send(at).await, Sent::Exhausted);
        assert_eq!(s.sent(), 1, "never sent at its expiry");
    }

    #[tokio::test]
    async fn a_retry_that_would_fall_past_the_expiry_is_given_up() {
        let s = setup(vec![Outcome::transient(Duration::from_secs(10))]).await;
        let w = leased_until(&s, REG, T0 + 10_000).await;
        assert_eq!(s.delivery.send(w).await, Sent::Exhausted);
        assert!(nothing_due(&s, T0 + 9_999).await);
    }

    #[tokio::test]
    async fn the_worker_takes_a_wakeup_once_the_clock_reaches_its_time() {
        let s = setup(vec![]).await;
        stored(&s, REG, T0 + 5_000, T0 + 3_600_000).await;
        assert!(s.delivery.lease_due(10).await.unwrap().is_empty(), "not due yet");
        s.clock.set(T0 + 4_999);
        assert!(s.delivery.lease_due(10).await.unwrap().is_empty(), "not due yet");
        s.clock.set(T0 + 5_250);
        let due = s.delivery.lease_due(10).await.unwrap();
        assert_eq!(due.len(), 1, "due: taken");
        assert_eq!(due[0].lease_until_ms, T0 + 5_250 + LEASE.as_millis() as i64);
        assert_eq!(s.metrics.gateway.wakeup_lateness.get(), 0.25, "taken 250 ms after its time");
        // Leased: no other worker takes it while its lease runs.
        s.clock.set(due[0].lease_until_ms - 1);
        assert!(s.delivery.lease_due(10).await.unwrap().is_empty(), "leased");
        // Its worker died: the lease ran out, the next look takes it over.
        s.clock.set(due[0].lease_until_ms);
        let again = s.delivery.lease_due(10).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!(s.delivery.send(again.into_iter().next().unwrap()).await, Sent::Delivered);
        assert_eq!(s.sent(), 1);
    }

    #[tokio::test]
    async fn the_worker_retries_on_the_clock_not_before_the_backoff() {
        let s = setup(vec![Outcome::transient(Duration::ZERO); 2]).await;
        stored(&s, REG, T0, T0 + 3_600_000).await;
        let first = s.delivery.lease_due(10).await.unwrap().remove(0);
        assert_eq!(s.delivery.send(first).await, Sent::Retried);
        s.clock.set(T0 + 999);
        assert!(s.delivery.lease_due(10).await.unwrap().is_empty(), "the first retry waits 1 s");
        s.clock.set(T0 + 1_000);
        let second = s.delivery.lease_due(10).await.unwrap().remove(0);
        assert_eq!(second.wakeup.attempts, 1);
        assert_eq!(s.delivery.send(second).await, Sent::Retried);
        s.clock.set(T0 + 2_999);
        assert!(s.delivery.lease_due(10).await.unwrap().is_empty(), "the second waits 2 s");
        s.clock.set(T0 + 3_000);
        let third = s.delivery.lease_due(10).await.unwrap().remove(0);
        assert_eq!(s.delivery.send(third).await, Sent::Delivered);
        assert_eq!(s.sent(), 3);
        assert_eq!((counted(&s, Sent::Retried), counted(&s, Sent::Delivered)), (2, 1));
    }

    #[tokio::test]
    async fn a_superseded_or_revoked_route_is_never_used() {
        let s = setup(vec![]).await;
        let stale = leased(&s, SUPERSEDED).await;
        assert_eq!(s.delivery.send(stale).await, Sent::Revoked);
        let w = leased(&s, REG).await;
        let revoke = Revoke { route: s.registration.route_key(), push_key: None, app_id: None };
        assert!(s.store.gateway().unregister(&revoke).await.unwrap());
        assert_eq!(s.delivery.send(w).await, Sent::Revoked);
        assert!(s.provider.sent.lock().unwrap().is_empty());
        assert!(ledger(&s).await.is_empty(s.now()));
        assert_eq!(counted(&s, Sent::Revoked), 2);
    }

    #[test]
    fn stalled_counts_only_while_there_is_work() {
        let t0 = Instant::now();
        let mut p = Progress { last: t0 };
        assert_eq!(p.stalled(true, t0 + Duration::from_secs(5)), 5.0);
        // Nothing to do is progress: the clock restarts.
        assert_eq!(p.stalled(false, t0 + Duration::from_secs(6)), 0.0);
        assert_eq!(p.stalled(true, t0 + Duration::from_secs(9)), 3.0);
    }

    #[test]
    fn backoff_doubles_up_to_five_minutes() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(3), Duration::from_secs(8));
        assert_eq!(backoff(20), Duration::from_secs(256).min(Duration::from_secs(300)));
    }

    #[test]
    fn routes_map_to_channels() {
        assert_eq!(route_channel(PushRouteId::FcmMain), (Channel::Fcm, false));
        assert_eq!(route_channel(PushRouteId::ApnsMain), (Channel::Apns, false));
        assert_eq!(route_channel(PushRouteId::ApnsSandbox), (Channel::Apns, true));
    }
}
