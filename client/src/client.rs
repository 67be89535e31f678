//! The notification client: the SDK surface of PUSH-263 (enable, disable,
//! state, overrides, effective values) and the sync run of PUSH-260 with its
//! error transitions (PUSH-262), driven by host triggers, a start run, an
//! hourly run and renewal.
//!
//! Requests go one at a time (the request lock) and each checks, under that
//! lock, that the configuration it was planned for is still the enabled one
//! (the generation): a request never leaves after a disable (PUSH-261), and
//! an answer for a superseded configuration is not recorded.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use fanout_proto::v1 as pb;
use tokio::sync::Notify;

use crate::backend::{Backend, BackendConfig, RecipientState};
use crate::desired::{DesiredSet, DesiredSubscription, desired_set, effective_value};
use crate::error::{Error, ErrorKind};
use crate::host::{BackgroundRunner, Clock, Conversations, Keys, SystemClock, unix_nanos};
use crate::identity::RecipientIdentity;
use crate::plan::{Batch, MAX_BATCH, PlanInputs, batches, plan};
use crate::sender_key::{HmacEpoch, KeyWindow, RootKey};
use crate::state::{
    DeliveryTarget, FailureCause, NotificationState, Override, Renewal, RuleOptions, StoredState, UploadedSubscription,
};
use crate::store::StateStore;
use crate::topic::{GroupId, Topic};

/// PUSH-260: a run at least this often while the client runs.
pub const MAX_SYNC_INTERVAL: Duration = Duration::from_secs(3600);

/// How the client runs.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub backend: BackendConfig,
    /// The periodic run, at most [`MAX_SYNC_INTERVAL`] after the last ended.
    pub sync_interval: Duration,
    /// The first wait before retrying a run that failed with a retryable
    /// status; doubled after each further failure, up to `sync_interval`.
    pub retry_delay: Duration,
    /// Subscriptions per request, 1 to 1000.
    pub max_batch: usize,
}

impl ClientConfig {
    pub fn new(endpoint: impl Into<String>) -> ClientConfig {
        ClientConfig {
            backend: BackendConfig::new(endpoint),
            sync_interval: MAX_SYNC_INTERVAL,
            retry_delay: Duration::from_secs(30),
            max_batch: MAX_BATCH,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |m: &str| Err(Error::new(ErrorKind::InvalidConfig, m));
        if self.sync_interval.is_zero() || self.sync_interval > MAX_SYNC_INTERVAL {
            return bad("sync_interval must be above zero and at most 3600 s");
        }
        if self.retry_delay.is_zero() {
            return bad("retry_delay must be above zero");
        }
        if !(1..=MAX_BATCH).contains(&self.max_batch) {
            return bad("max_batch must be 1 to 1000");
        }
        Ok(())
    }
}

/// What the host tells the client: something that can change the desired
/// set happened (PUSH-260). Returns at once and never fails: the run happens
/// in the background, outside the host's transaction (PUSH-240).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    ConsentWrite,
    MembershipCommit,
    OverrideChange,
    GroupCreated,
    Welcome,
    RootKeyChanged,
}

/// What one sync run sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Register was sent (after enable, NOT_FOUND, or a failed Register).
    pub registered: bool,
    /// Each UpdateSubscriptions as (adds, removes), in order.
    pub updates: Vec<(usize, usize)>,
    /// An empty UpdateSubscriptions renewed the recipient.
    pub renewed: bool,
    /// A NOT_FOUND was recovered in this run.
    pub recovered: bool,
    /// The last RecipientState's topic_count differed from the uploaded set.
    pub count_mismatch: bool,
}

/// The in-memory side of the client: the stored state and what is not
/// stored (the generation, the retry schedule).
struct Local {
    stored: StoredState,
    /// Bumped by enable, disable and a NOT_FOUND reset: a request planned
    /// under an older one is not sent, its answer not recorded.
    generation: u64,
    /// When a failed run is retried, and the delay that got it there.
    retry: Option<(i64, Duration)>,
}

struct Inner {
    config: ClientConfig,
    store: Arc<dyn StateStore>,
    conversations: Arc<dyn Conversations>,
    keys: Arc<dyn Keys>,
    runner: Arc<dyn BackgroundRunner>,
    clock: Arc<dyn Clock>,
    backend: Backend,
    local: Mutex<Local>,
    /// One notification request at a time.
    request: tokio::sync::Mutex<()>,
    /// One sync run at a time.
    run: tokio::sync::Mutex<()>,
    wake: Arc<Notify>,
    closed: Arc<AtomicBool>,
    started: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The background loop holds no strong reference while it waits: tell
        // it to look, and it finds the client gone.
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }
}

/// The notification client. Cheap to clone; every clone is the same client.
#[derive(Clone)]
pub struct NotificationClient {
    inner: Arc<Inner>,
}

/// The host's parts, handed to [`NotificationClient::new`].
pub struct HostParts {
    pub store: Arc<dyn StateStore>,
    pub conversations: Arc<dyn Conversations>,
    pub keys: Arc<dyn Keys>,
    pub runner: Arc<dyn BackgroundRunner>,
    pub clock: Arc<dyn Clock>,
}

impl HostParts {
    /// With the system clock.
    pub fn new(
        store: Arc<dyn StateStore>,
        conversations: Arc<dyn Conversations>,
        keys: Arc<dyn Keys>,
        runner: Arc<dyn BackgroundRunner>,
    ) -> HostParts {
        HostParts { store, conversations, keys, runner, clock: Arc::new(SystemClock) }
    }
}

/// A request's outcome as a run treats it.
enum Disposition {
    /// Terminal (PUSH-262): the state is now failed.
    Failed,
    /// RESOURCE_EXHAUSTED: adds stop until the desired set changes.
    AddsBlocked,
    /// NOT_FOUND: register again from nothing.
    Gone,
    /// A timeout or any other status: stay enabled, retry later.
    Retry,
}

fn disposition(kind: ErrorKind) -> Disposition {
    match kind {
        k if FailureCause::of(k).is_some() => Disposition::Failed,
        ErrorKind::TopicLimit => Disposition::AddsBlocked,
        ErrorKind::NotFound => Disposition::Gone,
        _ => Disposition::Retry,
    }
}

/// Whether a refusal means the backend applied nothing (PUSH-253, 216, 217)
/// rather than an answer that may or may not have been acted on.
fn applied_nothing(kind: ErrorKind) -> bool {
    !matches!(kind, ErrorKind::Timeout | ErrorKind::Unavailable)
}

fn superseded() -> Error {
    Error::new(ErrorKind::NotEnabled, "notifications were disabled or re-enabled meanwhile")
}

impl NotificationClient {
    /// Loads the stored state. Sends nothing: call [`start`](Self::start).
    pub fn new(config: ClientConfig, host: HostParts) -> Result<NotificationClient, Error> {
        config.validate()?;
        let backend = Backend::new(&config.backend)?;
        let stored = host.store.load()?.unwrap_or_default();
        Ok(NotificationClient {
            inner: Arc::new(Inner {
                config,
                store: host.store,
                conversations: host.conversations,
                keys: host.keys,
                runner: host.runner,
                clock: host.clock,
                backend,
                local: Mutex::new(Local { stored, generation: 0, retry: None }),
                request: tokio::sync::Mutex::new(()),
                run: tokio::sync::Mutex::new(()),
                wake: Arc::new(Notify::new()),
                closed: Arc::new(AtomicBool::new(false)),
                started: AtomicBool::new(false),
            }),
        })
    }

    /// Starts the background loop on the host's runner, and a run at once
    /// while enabled (PUSH-260: at client start).
    pub fn start(&self) {
        self.ensure_loop();
        if self.state() == NotificationState::Enabled {
            self.inner.wake.notify_one();
        }
    }

    /// The notification state, from local state alone (PUSH-263).
    pub fn state(&self) -> NotificationState {
        self.lock().stored.state
    }

    /// A copy of everything stored (for diagnostics and tests).
    pub fn stored(&self) -> StoredState {
        self.lock().stored.clone()
    }

    /// Something that can change the desired set happened.
    pub fn changed(&self, trigger: Trigger) {
        tracing::debug!(?trigger, "notification sync requested");
        self.inner.wake.notify_one();
    }

    /// PUSH-261 enable: refused without storing anything when the runner is
    /// disabled or an HTTPS signing key is outside 16..=64 bytes; otherwise
    /// stores the target and rules, sets enabled, sends Register and returns
    /// its result. A terminal status fails the state; any other failure
    /// leaves it enabled with the registration retried in the background.
    pub async fn enable(&self, target: DeliveryTarget, rules: RuleOptions) -> Result<RecipientState, Error> {
        if !self.inner.runner.is_enabled() {
            return Err(Error::new(
                ErrorKind::BackgroundTasksDisabled,
                "notifications need the host's background task runner",
            ));
        }
        target.validate()?;
        let rules = rules.resolve();
        // Drawn before the update so the update cannot half-fail on entropy;
        // dropped unused when the database already has an identity.
        let fresh = RecipientIdentity::generate()?;
        let generation = self.update(|l| {
            let s = &mut l.stored;
            s.identity.get_or_insert(fresh);
            s.target = Some(target);
            s.rules = rules;
            s.state = NotificationState::Enabled;
            s.registered = false;
            s.adds_blocked_for = None;
            l.generation += 1;
            l.retry = None;
            l.generation
        })?;
        self.ensure_loop();
        // Holding the run lock, a background run never sends a second
        // Register beside this one; a run in progress stops at its next
        // request, superseded by the new generation.
        let result = match tokio::time::timeout(self.lock_wait(), self.inner.run.lock()).await {
            Ok(_one_run) => self.register(generation).await,
            Err(_) => Err(Error::new(ErrorKind::Timeout, "a sync run in progress did not stop")),
        };
        // Enabling is a sync trigger (PUSH-260).
        self.inner.wake.notify_one();
        result
    }

    /// PUSH-261 disable: the state becomes disabled and the target and
    /// uploaded set are cleared before the Unregister is sent; NOT_FOUND is
    /// success; overrides are kept; a failed Unregister is not retried (the
    /// backend expires the recipient).
    pub async fn disable(&self) -> Result<(), Error> {
        let (identity, generation) = self.update(|l| {
            let s = &mut l.stored;
            s.state = NotificationState::Disabled;
            s.target = None;
            s.uploaded.clear();
            s.registered = false;
            s.renewal = None;
            s.resend_all = false;
            s.adds_blocked_for = None;
            l.generation += 1;
            l.retry = None;
            (s.identity.clone(), l.generation)
        })?;
        let Some(identity) = identity else { return Ok(()) };
        let _one = self.request_permit().await?;
        if self.lock().generation != generation {
            // Enabled again meanwhile: that configuration wins.
            return Ok(());
        }
        match self.inner.backend.unregister(&identity).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Sets (or with `None` clears) a conversation's override, and syncs.
    pub fn set_override(&self, group: &GroupId, value: Option<Override>) -> Result<(), Error> {
        self.update(|l| match value {
            Some(v) => l.stored.overrides.insert(group.clone(), v),
            None => l.stored.overrides.remove(group),
        })?;
        self.changed(Trigger::OverrideChange);
        Ok(())
    }

    pub fn override_of(&self, group: &GroupId) -> Option<Override> {
        self.lock().stored.overrides.get(group).copied()
    }

    /// Whether a conversation is desired (its override, else its consent
    /// under the rules); `None` when the host does not know the group.
    pub fn effective_value(&self, group: &GroupId) -> Result<Option<bool>, Error> {
        let conversations = self.inner.conversations.conversations()?;
        let local = self.lock();
        Ok(conversations
            .iter()
            .find(|c| &c.group_id == group)
            .map(|c| effective_value(c, &local.stored.overrides, &local.stored.rules)))
    }

    /// One sync run now, in the caller's task (the background loop calls the
    /// same). Runs one at a time.
    pub async fn sync_now(&self) -> Result<SyncReport, Error> {
        let _one_run = self.inner.run.lock().await;
        let mut report = SyncReport::default();
        let result = self.run(&mut report).await;
        let now = self.now_ns();
        let base = self.inner.config.retry_delay;
        let cap = self.inner.config.sync_interval;
        self.update(|l| {
            l.stored.last_sync_end_ns = Some(now);
            l.retry = match &result {
                Err(e) if matches!(disposition(e.kind()), Disposition::Retry | Disposition::Gone) => {
                    let delay = l.retry.map_or(base, |(_, d)| (d * 2).min(cap));
                    Some((now.saturating_add(delay.as_nanos() as i64), delay))
                }
                _ => None,
            };
        })?;
        result.map(|()| report)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Local> {
        self.inner.local.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ns(&self) -> i64 {
        unix_nanos(self.inner.clock.now())
    }

    /// Applies `f` to a copy, saves it, and keeps it only when the save
    /// succeeded: a failed write changes nothing in memory either.
    fn update<T>(&self, f: impl FnOnce(&mut Local) -> T) -> Result<T, Error> {
        let mut local = self.lock();
        let mut next = Local { stored: local.stored.clone(), generation: local.generation, retry: local.retry };
        let out = f(&mut next);
        if next.stored != local.stored {
            self.inner.store.save(&next.stored)?;
        }
        *local = next;
        Ok(out)
    }

    /// How long to wait for the request or run lock: a holder gives it up
    /// within one bounded request (a run stops at its next request once
    /// superseded), so two bounds and a margin.
    fn lock_wait(&self) -> Duration {
        self.inner.config.backend.request_timeout * 2 + Duration::from_secs(1)
    }

    /// Waits for the request lock (see [`lock_wait`](Self::lock_wait)).
    async fn request_permit(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, Error> {
        tokio::time::timeout(self.lock_wait(), self.inner.request.lock())
            .await
            .map_err(|_| Error::new(ErrorKind::Timeout, "another notification request did not finish"))
    }

    /// The identity and target when `generation` is still the enabled one.
    fn enabled_as(&self, generation: u64) -> Option<(RecipientIdentity, DeliveryTarget)> {
        let local = self.lock();
        let s = &local.stored;
        (local.generation == generation && s.state == NotificationState::Enabled)
            .then(|| Some((s.identity.clone()?, s.target.clone()?)))
            .flatten()
    }

    /// Records a terminal status: failed with its cause (PUSH-262).
    fn fail(&self, generation: u64, error: &Error) -> Result<(), Error> {
        if let Some(cause) = FailureCause::of(error.kind()) {
            self.update(|l| {
                if l.generation == generation && l.stored.state == NotificationState::Enabled {
                    l.stored.state = NotificationState::Failed(cause);
                }
            })?;
        }
        Ok(())
    }

    /// Records a RecipientState: the renewal times, and the count check
    /// (PUSH-260). Returns whether the count disagreed.
    fn record_state(local: &mut Local, state: &RecipientState, now: i64) -> bool {
        local.stored.renewal = Some(Renewal { received_at_ns: now, expires_at_ns: state.expires_at_ns });
        let mismatch = local.stored.confirmed_count().is_some_and(|n| n != state.topic_count);
        if mismatch {
            // Never clear the uploaded set: re-send every desired topic over
            // later runs instead, so a set larger than a request converges.
            local.stored.resend_all = true;
        }
        mismatch
    }

    async fn register(&self, generation: u64) -> Result<RecipientState, Error> {
        let _one = self.request_permit().await?;
        let Some((identity, target)) = self.enabled_as(generation) else { return Err(superseded()) };
        match self.inner.backend.register(&identity, &target).await {
            Ok(state) => {
                let now = self.now_ns();
                self.update(|l| {
                    if l.generation == generation {
                        l.stored.registered = true;
                        Self::record_state(l, &state, now);
                    }
                })?;
                Ok(state)
            }
            Err(e) => {
                self.fail(generation, &e)?;
                Err(e)
            }
        }
    }

    /// One run: Register when needed, then the diff in batches, then a
    /// renewal when nothing else renewed; NOT_FOUND once per run resets the
    /// uploaded set and starts again from Register.
    async fn run(&self, report: &mut SyncReport) -> Result<(), Error> {
        let mut recovered = false;
        loop {
            let (generation, registered) = {
                let local = self.lock();
                if local.stored.state != NotificationState::Enabled {
                    return Err(Error::new(ErrorKind::NotEnabled, "notifications are not enabled"));
                }
                (local.generation, local.stored.registered)
            };
            let result = async {
                if !registered {
                    report.registered = true;
                    self.register(generation).await?;
                }
                self.subscriptions(generation, report).await
            }
            .await;
            match result {
                Err(e) if e.kind() == ErrorKind::NotFound && !recovered => {
                    // The recipient is gone (expired, revoked, a restored
                    // backend): register again from nothing (spec 000 §8).
                    recovered = true;
                    report.recovered = true;
                    self.update(|l| {
                        if l.generation == generation {
                            l.stored.uploaded.clear();
                            l.stored.registered = false;
                            l.stored.resend_all = false;
                            l.generation += 1;
                        }
                    })?;
                }
                other => return other,
            }
        }
    }

    /// The desired set and what the plan needs, from the host.
    fn desired(&self) -> Result<(DesiredSet, Option<RootKey>), Error> {
        // Host calls happen outside the client's lock: a host may read the
        // client's state from inside its own callbacks.
        let (rules, overrides) = {
            let local = self.lock();
            (local.stored.rules.clone(), local.stored.overrides.clone())
        };
        let conversations = self.inner.conversations.conversations()?;
        let root = self.inner.keys.root_key()?;
        let welcome = if rules.include_welcomes { Some(self.inner.keys.welcome_topic()?) } else { None };
        Ok((desired_set(&conversations, &overrides, &rules, welcome), root))
    }

    async fn subscriptions(&self, generation: u64, report: &mut SyncReport) -> Result<(), Error> {
        let (desired, root) = self.desired()?;
        let digest = desired.digest();
        let epoch = HmacEpoch::at(self.inner.clock.now());
        let (todo, resending, blocked) = {
            let mut local = self.lock();
            // A changed desired set lifts a RESOURCE_EXHAUSTED block.
            if local.stored.adds_blocked_for.is_some_and(|d| d != digest) {
                local.stored.adds_blocked_for = None;
            }
            let inputs = PlanInputs {
                current_epoch: epoch,
                root_key_id: root.as_ref().map(RootKey::id),
                resend_all: local.stored.resend_all,
                adds_blocked: local.stored.adds_blocked_for.is_some(),
            };
            (plan(&desired, &local.stored.uploaded, &inputs), inputs.resend_all, inputs.adds_blocked)
        };
        let mut last_mismatch = None;
        for batch in batches(todo, self.inner.config.max_batch) {
            let state = self.send_batch(generation, batch, root.as_ref(), epoch, digest, report).await?;
            last_mismatch = Some(state);
        }
        if last_mismatch.is_none() && self.renewal_due() {
            report.renewed = true;
            last_mismatch =
                Some(self.send_batch(generation, Batch::Removes(Vec::new()), None, epoch, digest, report).await?);
        }
        // A full resend that ended with the counts in agreement is done.
        if resending && !blocked && last_mismatch == Some(false) {
            self.update(|l| {
                if l.generation == generation {
                    l.stored.resend_all = false;
                }
            })?;
        }
        report.count_mismatch = last_mismatch.unwrap_or(false);
        Ok(())
    }

    fn renewal_due(&self) -> bool {
        let now = self.now_ns();
        self.lock().stored.renewal.is_none_or(|r| now >= r.due_at_ns())
    }

    /// Sends one UpdateSubscriptions and records its outcome. Adds are
    /// written to the uploaded set as unconfirmed before the request leaves,
    /// so a crash or an unknown outcome re-sends them. Returns whether the
    /// answer's topic_count disagreed with the uploaded set.
    async fn send_batch(
        &self,
        generation: u64,
        batch: Batch,
        root: Option<&RootKey>,
        epoch: HmacEpoch,
        digest: [u8; 32],
        report: &mut SyncReport,
    ) -> Result<bool, Error> {
        let (adds, removes): (Vec<DesiredSubscription>, Vec<Topic>) = match batch {
            Batch::Adds(a) => (a, Vec::new()),
            Batch::Removes(r) => (Vec::new(), r),
        };
        let mut wire = Vec::with_capacity(adds.len());
        let mut entries = Vec::with_capacity(adds.len());
        for add in &adds {
            let (sub, entry) = subscription(add, root, epoch);
            wire.push(sub);
            entries.push((add.topic.clone(), entry));
        }
        let _one = self.request_permit().await?;
        let Some((identity, _)) = self.enabled_as(generation) else { return Err(superseded()) };
        let previous: BTreeMap<Topic, Option<UploadedSubscription>> = self.update(|l| {
            entries
                .iter()
                .map(|(topic, entry)| {
                    let pending = UploadedSubscription { confirmed: false, ..entry.clone() };
                    (topic.clone(), l.stored.uploaded.insert(topic.clone(), pending))
                })
                .collect()
        })?;
        report.updates.push((adds.len(), removes.len()));
        let removes_wire = removes.iter().map(|t| t.as_bytes().to_vec()).collect();
        let result = self.inner.backend.update_subscriptions(&identity, wire, removes_wire).await;
        let now = self.now_ns();
        match result {
            Ok(state) => self.update(|l| {
                if l.generation != generation {
                    return false;
                }
                for (topic, entry) in entries {
                    l.stored.uploaded.insert(topic, entry);
                }
                for topic in &removes {
                    l.stored.uploaded.remove(topic);
                }
                Self::record_state(l, &state, now)
            }),
            Err(e) => {
                self.update(|l| {
                    if l.generation != generation {
                        return;
                    }
                    if applied_nothing(e.kind()) {
                        // Refused whole: put back what was there.
                        for (topic, before) in previous {
                            match before {
                                Some(entry) => l.stored.uploaded.insert(topic, entry),
                                None => l.stored.uploaded.remove(&topic),
                            };
                        }
                    }
                    if e.kind() == ErrorKind::TopicLimit {
                        l.stored.adds_blocked_for = Some(digest);
                    }
                })?;
                self.fail(generation, &e)?;
                Err(e)
            }
        }
    }

    /// Starts the background loop once, on the host's runner.
    fn ensure_loop(&self) {
        if !self.inner.runner.is_enabled() || self.inner.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        let wake = self.inner.wake.clone();
        let closed = self.inner.closed.clone();
        self.inner.runner.spawn(Box::pin(background(weak, wake, closed)));
    }

    /// How long until the next run is due, or `None` while not enabled.
    fn next_run_in(&self) -> Option<Duration> {
        let now = self.now_ns();
        let local = self.lock();
        let s = &local.stored;
        if s.state != NotificationState::Enabled {
            return None;
        }
        let interval = self.inner.config.sync_interval.as_nanos() as i64;
        let mut due = match s.last_sync_end_ns {
            Some(end) if s.registered => end.saturating_add(interval),
            _ => now,
        };
        if let Some(renewal) = s.renewal {
            // Not sooner than a retry delay after the last run: a backend
            // whose expiry is already past must not spin the loop.
            let floor =
                s.last_sync_end_ns.unwrap_or(now).saturating_add(self.inner.config.retry_delay.as_nanos() as i64);
            due = due.min(renewal.due_at_ns().max(floor));
        }
        if let Some((at, _)) = local.retry {
            // A failed run waits for its retry even if the hour has passed.
            due = at;
        }
        Some(Duration::from_nanos(due.saturating_sub(now).max(0) as u64))
    }
}

/// The background loop: a run on every trigger, and when the next run is
/// due (the hourly run, renewal, a retry). Ends once the client is dropped.
async fn background(weak: Weak<Inner>, wake: Arc<Notify>, closed: Arc<AtomicBool>) {
    loop {
        let wait = match weak.upgrade() {
            Some(inner) => NotificationClient { inner }.next_run_in(),
            None => return,
        };
        match wait {
            Some(wait) => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(wait) => {}
                }
            }
            None => wake.notified().await,
        }
        if closed.load(Ordering::SeqCst) {
            return;
        }
        let Some(inner) = weak.upgrade() else { return };
        let client = NotificationClient { inner };
        if client.state() != NotificationState::Enabled {
            continue;
        }
        if let Err(e) = client.sync_now().await {
            tracing::info!(kind = %e.kind(), "notification sync run failed");
        }
    }
}

/// The wire subscription for `add` and the uploaded entry that records it:
/// a group gets the key window of PUSH-229 when the root key is known.
fn subscription(
    add: &DesiredSubscription,
    root: Option<&RootKey>,
    epoch: HmacEpoch,
) -> (pb::Subscription, UploadedSubscription) {
    let window = match (&add.group, root) {
        (Some(group), Some(root)) => Some((KeyWindow::for_epoch(root, group, epoch), root.id())),
        _ => None,
    };
    let sub = pb::Subscription {
        topic: add.topic.as_bytes().to_vec(),
        hmac_epoch_base: window.as_ref().map_or(0, |(w, _)| w.base.0),
        hmac_keys: window
            .as_ref()
            .map_or_else(Vec::new, |(w, _)| w.keys.iter().map(|k| k.as_bytes().to_vec()).collect()),
        include_commits: add.include_commits,
    };
    let entry = UploadedSubscription {
        hmac_epoch_base: window.as_ref().map(|(w, _)| w.base.0),
        root_key_id: window.map(|(_, id)| id),
        include_commits: add.include_commits,
        confirmed: true,
    };
    (sub, entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_push_262_status_drives_its_transition() {
        use ErrorKind::*;
        for kind in
            [PermissionDenied, InvalidArgument, OutOfRange, Unimplemented, FailedPrecondition, ChannelNotConfigured]
        {
            assert!(matches!(disposition(kind), Disposition::Failed), "{kind}");
            assert!(applied_nothing(kind));
        }
        assert!(matches!(disposition(TopicLimit), Disposition::AddsBlocked));
        assert!(matches!(disposition(NotFound), Disposition::Gone));
        for kind in [Timeout, Unavailable] {
            assert!(matches!(disposition(kind), Disposition::Retry), "{kind}");
            assert!(!applied_nothing(kind), "{kind}: the outcome is unknown");
        }
    }

    #[test]
    fn a_group_add_carries_the_three_keys_from_current_minus_one() {
        let group = GroupId::new(hex::decode("0102030405060708").unwrap()).unwrap();
        let root = RootKey::new(&[0x2a; 42]).unwrap();
        let add = DesiredSubscription { topic: group.topic(), group: Some(group.clone()), include_commits: true };
        let (sub, entry) = subscription(&add, Some(&root), HmacEpoch(655));
        assert_eq!(sub.hmac_epoch_base, 654);
        assert_eq!(sub.hmac_keys.len(), 3);
        assert_eq!(
            hex::encode(&sub.hmac_keys[1]),
            "279eccb4ec4961adafd2d8b2c244030cb0b6c42ae793a2148c896605974fc9552789b1518b8c0fc05093"
        );
        assert!(sub.include_commits);
        assert_eq!(entry.hmac_epoch_base, Some(654));
        assert_eq!(entry.root_key_id, Some(root.id()));

        let welcome = Topic::welcome(&[1]).unwrap();
        let add = DesiredSubscription { topic: welcome.clone(), group: None, include_commits: false };
        let (sub, entry) = subscription(&add, Some(&root), HmacEpoch(655));
        assert_eq!((sub.hmac_epoch_base, sub.hmac_keys.len()), (0, 0), "the welcome subscription has no keys");
        assert_eq!(entry.hmac_epoch_base, None);
    }

    #[test]
    fn the_config_bounds_hold() {
        let mut c = ClientConfig::new("http://127.0.0.1:1");
        assert!(c.validate().is_ok());
        c.sync_interval = Duration::from_secs(3601);
        assert_eq!(c.validate().unwrap_err().kind(), ErrorKind::InvalidConfig);
        c = ClientConfig::new("http://127.0.0.1:1");
        c.max_batch = 1001;
        assert!(c.validate().is_err());
        c.max_batch = 0;
        assert!(c.validate().is_err());
    }
}
