//! PUSH-226: delete every recipient that has not renewed within
//! recipient_ttl_seconds, in one pass at start and then `interval_seconds`
//! after the previous pass ended, run by a supervised actor. The same pass
//! deletes the relay ingress's delivery records whose ttl ran out (spec 003
//! §2.5), and clears the dispatch copy marks crashed changes left
//! (`stale_marks`): on one node of several, the owner of the first shard.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::Deserialize;

use tokio::sync::watch;

use crate::domain::{Clock, ShardId};
use crate::metrics::{Deleted, Metrics};
use crate::ownership::OwnedShards;
use crate::stale_marks::{SETTLE_AFTER, StaleMarks};
use crate::store::Store;

/// `[engine.retention]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// From the end of one retention pass to the start of the next.
    #[serde(rename = "interval_seconds")]
    pub interval: RetentionInterval,
}

/// `interval_seconds`: 1 to 3600 whole seconds. PUSH-226 wants a pass at
/// most 3600 s after the previous one ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct RetentionInterval(Duration);

impl RetentionInterval {
    pub const MAX_SECONDS: u64 = 3600;

    pub fn get(self) -> Duration {
        self.0
    }
}

impl Default for RetentionInterval {
    fn default() -> Self {
        Self(Duration::from_secs(Self::MAX_SECONDS))
    }
}

impl TryFrom<u64> for RetentionInterval {
    type Error = String;

    fn try_from(seconds: u64) -> Result<Self, String> {
        if (1..=Self::MAX_SECONDS).contains(&seconds) {
            Ok(Self(Duration::from_secs(seconds)))
        } else {
            Err(format!("must be between 1 and {} seconds (PUSH-226)", Self::MAX_SECONDS))
        }
    }
}

#[derive(Clone)]
pub struct RetentionArgs {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    /// recipient_ttl_seconds.
    pub ttl: Duration,
    pub interval: RetentionInterval,
    /// The shards this node owns, when several nodes share the store: only
    /// the owner of the first one clears marks. `None`: this node alone.
    pub ownership: Option<watch::Receiver<OwnedShards>>,
    /// The time the TTL's cutoff is taken from.
    pub clock: Arc<dyn Clock>,
}

impl RetentionArgs {
    /// Whether this node clears the dispatch copy marks: one node does.
    fn clears_marks(&self) -> bool {
        self.ownership.as_ref().is_none_or(|o| o.borrow().shards.contains_key(&ShardId::FIRST))
    }
}

/// One pass. A failure is logged and retried at the next pass.
pub async fn run_pass(args: &RetentionArgs) {
    let now = args.clock.now();
    let cutoff = now.saturating_sub(args.ttl).as_unix_nanos();
    // A failure is counted and logged by the instrumented store; the next pass retries.
    if let Ok(n) = args.store.delete_expired(cutoff).await {
        args.metrics.recipients_deleted_by(Deleted::Expired).inc_by(n);
        if n > 0 {
            tracing::info!(deleted = n, "retention pass deleted expired recipients");
        }
    }
    if let Ok(n) = args.store.relay().delete_expired(now.as_millis()).await {
        args.metrics.relay_records_expired.inc_by(n);
    }
    // Spec 002: expired registrations, notify records and window state.
    if let Ok(n) = args.store.gateway().delete_expired(now.as_millis()).await
        && n > 0
    {
        tracing::debug!(deleted = n, "retention pass deleted expired gateway records");
    }
}

/// Clears the dispatch copy marks seen long enough (`stale_marks`), on the
/// node that does. A failure is logged by the instrumented store and
/// retried at the next pass.
async fn clear_marks(args: &RetentionArgs, marks: &mut StaleMarks) {
    if !args.clears_marks() {
        return;
    }
    if let Ok(n) = marks.pass(args.store.as_ref(), SETTLE_AFTER, tokio::time::Instant::now()).await
        && n > 0
    {
        tracing::info!(cleared = n, "retention pass cleared dispatch copy marks that interrupted changes left");
    }
}

/// Runs the retention pass (PUSH-226) at start and then `interval` after the
/// previous pass ended.
pub struct RetentionActor;

pub enum RetentionMsg {
    Pass,
}

/// The actor's state: its arguments, and the marks its passes saw.
pub struct Retention {
    args: RetentionArgs,
    marks: StaleMarks,
}

impl Actor for RetentionActor {
    type Msg = RetentionMsg;
    type State = Retention;
    type Arguments = RetentionArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<RetentionMsg>,
        args: RetentionArgs,
    ) -> Result<Retention, ActorProcessingErr> {
        let _ = myself.cast(RetentionMsg::Pass);
        Ok(Retention { args, marks: StaleMarks::default() })
    }

    async fn handle(
        &self,
        myself: ActorRef<RetentionMsg>,
        _: RetentionMsg,
        state: &mut Retention,
    ) -> Result<(), ActorProcessingErr> {
        run_pass(&state.args).await;
        clear_marks(&state.args, &mut state.marks).await;
        myself.send_after(state.args.interval.get(), || RetentionMsg::Pass);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The pass over a real embedded store, its cutoff on a controlled
    //! clock; the actor's schedule on tokio's paused clock.

    use super::*;
    use crate::domain::{DeliveryTarget, RecipientId, RecipientSecret};
    use crate::store::{Instrumented, RedbStore};
    use crate::testing::TestClock;

    /// The controlled clock's start, Unix ms.
    const T0: i64 = 1_767_225_600_000;

    const TTL: Duration = Duration::from_secs(3600);
    const MINUTE: Duration = Duration::from_secs(60);

    /// The store instrumented, so a test can count the passes that ended.
    fn args(dir: &tempfile::TempDir, interval_seconds: u64) -> RetentionArgs {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(RedbStore::open(dir.path(), 4).unwrap());
        RetentionArgs {
            store: Arc::new(Instrumented::new(store, metrics.clone())),
            metrics,
            ttl: TTL,
            interval: RetentionInterval::try_from(interval_seconds).unwrap(),
            ownership: None,
            clock: TestClock::at(T0),
        }
    }

    /// Registers recipient `n`, last renewed `age` ago.
    async fn registered(args: &RetentionArgs, n: u8, age: Duration) -> RecipientId {
        let id = RecipientId::from_bytes([n; 32]);
        let hash = RecipientSecret::parse(&[n; 32]).unwrap().hash();
        let target = DeliveryTarget::Apns { token: format!("t{n}") };
        let renewed = args.clock.now().saturating_sub(age).as_unix_nanos();
        args.store.register(&id, &hash, &target, renewed).await.unwrap();
        id
    }

    async fn exists(args: &RetentionArgs, id: &RecipientId) -> bool {
        args.store.recipient(id).await.unwrap().is_some()
    }

    fn expired(args: &RetentionArgs) -> u64 {
        args.metrics.recipients_deleted_by(Deleted::Expired).get()
    }

    #[tokio::test]
    async fn a_pass_deletes_the_recipients_not_renewed_within_the_ttl_and_keeps_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let args = args(&dir, 60);
        let stale = registered(&args, 1, TTL + MINUTE).await;
        let fresh = registered(&args, 2, TTL - MINUTE).await;

        run_pass(&args).await;
        assert!(!exists(&args, &stale).await, "renewed more than recipient_ttl_seconds ago (PUSH-226)");
        assert!(exists(&args, &fresh).await);
        assert_eq!(expired(&args), 1);

        // Nothing more to delete: the count stays.
        run_pass(&args).await;
        assert!(exists(&args, &fresh).await);
        assert_eq!(expired(&args), 1);
    }

    #[tokio::test]
    async fn a_recipient_expires_once_the_clock_passes_its_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(T0);
        let args = RetentionArgs { clock: clock.clone(), ..args(&dir, 60) };
        let id = registered(&args, 1, Duration::ZERO).await;
        clock.set(T0 + TTL.as_millis() as i64 - 1);
        run_pass(&args).await;
        assert!(exists(&args, &id).await, "within its TTL");
        clock.set(T0 + TTL.as_millis() as i64 + 1);
        run_pass(&args).await;
        assert!(!exists(&args, &id).await, "past its TTL (PUSH-226)");
        assert_eq!(expired(&args), 1);
    }

    /// Runs `f` with the paused clock held still. The embedded store works
    /// on its own commit thread; while a test waits for it the runtime is
    /// idle and the paused clock would jump to the next timer (the actor's
    /// next pass). A task that keeps yielding leaves it never idle.
    async fn clock_held<T>(f: impl Future<Output = T>) -> T {
        let keeper = tokio::spawn(async {
            loop {
                tokio::task::yield_now().await;
            }
        });
        let out = f.await;
        keeper.abort();
        out
    }

    /// Passes that ended: each ends with the gateway's expiry.
    fn passes(args: &RetentionArgs) -> u64 {
        args.metrics.store_latency.with_label_values(&["delete_expired_gateway"]).get_sample_count()
    }

    async fn until_passes(args: &RetentionArgs, n: u64) {
        while passes(args) < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_actor_passes_at_start_and_then_an_interval_after_each_pass() {
        let dir = tempfile::tempdir().unwrap();
        let args = args(&dir, 60);
        let first = registered(&args, 1, TTL + MINUTE).await;
        let started = tokio::time::Instant::now();
        let (actor, handle) = Actor::spawn(None, RetentionActor, args.clone()).await.unwrap();

        clock_held(until_passes(&args, 1)).await;
        assert_eq!(tokio::time::Instant::now(), started, "a pass at start");
        assert!(!clock_held(exists(&args, &first)).await);

        // The next pass comes an interval after this one ended, not before.
        let second = clock_held(registered(&args, 2, TTL + MINUTE)).await;
        tokio::time::advance(MINUTE - Duration::from_millis(1)).await;
        clock_held(tokio::task::yield_now()).await;
        assert_eq!(passes(&args), 1, "no pass before the interval");
        tokio::time::advance(Duration::from_millis(2)).await;
        clock_held(until_passes(&args, 2)).await;
        assert!(!clock_held(exists(&args, &second)).await);
        assert_eq!(expired(&args), 2);

        actor.stop(None);
        handle.await.unwrap();
    }

    #[tokio::test]
    async fn of_several_nodes_only_the_first_shards_owner_clears_marks() {
        let dir = tempfile::tempdir().unwrap();
        let mut args = args(&dir, 60);
        assert!(args.clears_marks(), "a node alone clears them");
        let (owned, ownership) = watch::channel(OwnedShards::default());
        args.ownership = Some(ownership);
        assert!(!args.clears_marks(), "a node that does not own the first shard");
        let until = tokio::time::Instant::now() + MINUTE;
        owned.send_modify(|o| {
            o.shards.insert(ShardId::parse(1, 4).unwrap(), until);
        });
        assert!(!args.clears_marks());
        owned.send_modify(|o| {
            o.shards.insert(ShardId::FIRST, until);
        });
        assert!(args.clears_marks(), "the first shard's owner");
    }

    #[test]
    fn the_interval_is_one_to_3600_whole_seconds() {
        for refused in [0, 3601, u64::MAX] {
            let err = RetentionInterval::try_from(refused).unwrap_err();
            assert!(err.contains("PUSH-226"), "{err}");
        }
        for accepted in [1, 3600] {
            assert_eq!(RetentionInterval::try_from(accepted).unwrap().get(), Duration::from_secs(accepted));
        }
        assert_eq!(RetentionInterval::default().get(), Duration::from_secs(3600), "PUSH-226's bound by default");
    }
}
