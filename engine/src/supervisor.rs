//! The root supervisor of the engine's actors: shard actors, retention and,
//! on a coordinating store, the lease actor.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use crate::dispatch::{DispatchContext, ShardActor, ShardMsg};
use crate::domain::ShardId;
use crate::ownership::{LeaseActor, LeaseConfig, LeaseMsg};
use crate::retention::{RetentionActor, RetentionArgs};
use crate::supervision::SupervisorMsg;

/// The root supervisor: starts one actor per owned shard, the
/// retention actor and (on a coordinating store) the lease actor, and
/// restarts any that fails. A restarted child resumes
/// from durable state, never from memory.
pub struct Supervisor;

pub struct SupervisorArgs {
    pub ctx: Arc<DispatchContext>,
    /// Owned from the start: every shard on a single node, none with leases.
    pub shards: Vec<ShardId>,
    pub retention: RetentionArgs,
    /// Several nodes (shard leases): shards come and go as leases say.
    pub lease: Option<LeaseConfig>,
}

pub struct SupervisorState {
    ctx: Arc<DispatchContext>,
    retention: RetentionArgs,
    shards: HashMap<ActorId, ShardId>,
    refs: HashMap<ShardId, ActorRef<ShardMsg>>,
    /// Per shard: a Wake is queued and not yet handled.
    wakes: HashMap<ShardId, Arc<AtomicBool>>,
    retention_actor: Option<ActorId>,
    lease: Option<LeaseConfig>,
    lease_actor: Option<ActorRef<LeaseMsg>>,
    stopping: bool,
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMsg>,
        args: SupervisorArgs,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let mut state = SupervisorState {
            ctx: args.ctx,
            retention: args.retention,
            shards: HashMap::new(),
            refs: HashMap::new(),
            wakes: HashMap::new(),
            retention_actor: None,
            lease: args.lease,
            lease_actor: None,
            stopping: false,
        };
        for shard in args.shards {
            state.spawn_shard(myself.get_cell(), shard).await?;
        }
        state.spawn_retention(myself.get_cell()).await?;
        state.spawn_lease(&myself).await?;
        state.report_owned();
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMsg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Wake(shards) => {
                for shard in shards {
                    // Coalesced: one Wake waits in a shard's mailbox at most.
                    if let (Some(actor), Some(pending)) = (state.refs.get(&shard), state.wakes.get(&shard))
                        && !pending.swap(true, Ordering::AcqRel)
                    {
                        let _ = actor.cast(ShardMsg::Wake);
                    }
                }
            }
            SupervisorMsg::Own(shard) => {
                if !state.stopping && !state.refs.contains_key(&shard) {
                    state.spawn_shard(myself.get_cell(), shard).await?;
                }
            }
            SupervisorMsg::Disown { shard, drain, reply } => {
                let actor = state.refs.remove(&shard);
                if let Some(actor) = &actor {
                    state.shards.remove(&actor.get_id());
                    if drain {
                        // Its next owner is another node: stop at the pages in flight.
                        let _ = actor.cast(ShardMsg::Release);
                    }
                }
                let _ = reply.send(actor.map(|a| a.get_cell()));
            }
            SupervisorMsg::Drain => {
                state.stopping = true;
                // No more acquiring; the lease actor releases its leases as it stops.
                if let Some(lease) = state.lease_actor.take() {
                    lease.stop(None);
                }
                for actor in state.refs.values() {
                    let _ = actor.cast(ShardMsg::Drain);
                }
                if state.refs.is_empty() {
                    myself.stop(None);
                }
            }
            SupervisorMsg::Shutdown => {
                state.stopping = true;
                myself.stop(None);
            }
            // Passed on, not awaited: the lease actor's drain asks this
            // actor to disown each shard meanwhile.
            SupervisorMsg::Leave(reply) => match &state.lease_actor {
                // A lease actor gone drops the reply: the caller hears it failed.
                Some(lease) => {
                    let _ = lease.cast(LeaseMsg::Leave(reply));
                }
                None => {
                    let _ = reply.send(());
                }
            },
        }
        state.report_owned();
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMsg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, failed) = match event {
            SupervisionEvent::ActorFailed(cell, err) => {
                tracing::error!(error = %err, "dispatch actor failed; restarting it");
                (cell, true)
            }
            SupervisionEvent::ActorTerminated(cell, _, _) => (cell, false),
            _ => return Ok(()),
        };
        if state.stopping {
            // Draining: stop once the last shard has stored its checkpoint.
            if let Some(shard) = state.shards.remove(&cell.get_id()) {
                state.refs.remove(&shard);
            }
            if state.refs.is_empty() {
                myself.stop(None);
            }
            return Ok(());
        }
        if let Some(shard) = state.shards.remove(&cell.get_id()) {
            state.refs.remove(&shard);
            if failed {
                state.ctx.metrics.shard_restarts.inc();
            }
            state.spawn_shard(myself.get_cell(), shard).await?;
        } else if state.retention_actor == Some(cell.get_id()) {
            state.spawn_retention(myself.get_cell()).await?;
        } else if state.lease_actor.as_ref().is_some_and(|l| l.get_id() == cell.get_id()) {
            state.spawn_lease(&myself).await?;
        }
        state.report_owned();
        Ok(())
    }
}

impl SupervisorState {
    /// fanout_owned_shards: the shards this node runs a shard actor for.
    fn report_owned(&self) {
        self.ctx.metrics.owned_shards.set(self.refs.len() as i64);
    }

    async fn spawn_shard(&mut self, supervisor: ActorCell, shard: ShardId) -> Result<(), ActorProcessingErr> {
        let wake = self.wakes.entry(shard).or_default().clone();
        let (actor, _) =
            Actor::spawn_linked(None, ShardActor, (shard, self.ctx.clone(), wake.clone()), supervisor).await?;
        // Resume straight away: the checkpoint may be below the boundary.
        let _ = actor.cast(ShardMsg::Wake);
        self.shards.insert(actor.get_id(), shard);
        self.refs.insert(shard, actor);
        Ok(())
    }

    async fn spawn_lease(&mut self, myself: &ActorRef<SupervisorMsg>) -> Result<(), ActorProcessingErr> {
        if let Some(config) = self.lease.clone() {
            let (actor, _) = Actor::spawn_linked(None, LeaseActor, (config, myself.clone()), myself.get_cell()).await?;
            self.lease_actor = Some(actor);
        }
        Ok(())
    }

    async fn spawn_retention(&mut self, supervisor: ActorCell) -> Result<(), ActorProcessingErr> {
        let (actor, _) = Actor::spawn_linked(None, RetentionActor, self.retention.clone(), supervisor).await?;
        self.retention_actor = Some(actor.get_id());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The supervisor over a real store, real shard actors and delivery
    //! workers, with an in-memory provider and tokio's paused clock.

    use std::collections::HashSet;
    use std::sync::Mutex;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::channel::{Channels, Outcome, Provider, Push, Refusal};
    use crate::delivery::{DeliverySettings, DeliveryWorkers, Parking, WorkerContext};
    use crate::dispatch::{DispatchSettings, PanicHook, Routes};
    use crate::domain::{
        Channel, DeliveryTarget, EnvelopeKind, NewEnvelope, RecipientId, RecipientSecret, Subscription,
        SubscriptionUpdate, Topic,
    };
    use crate::metrics::Metrics;
    use crate::ownership::Fence;
    use crate::retention::RetentionInterval;
    use crate::store::{Appended, RedbStore, Store};

    const SHARDS: u16 = 4;
    const RECIPIENTS: u8 = 4;
    /// Real time a test may wait for the store's threads.
    const REAL_BOUND: Duration = Duration::from_secs(30);

    /// Answers `Delivered`, remembering each (sequence id, recipient).
    #[derive(Default)]
    struct Recording {
        sent: Mutex<HashSet<(u64, RecipientId)>>,
    }

    #[async_trait]
    impl Provider for Recording {
        fn channel(&self) -> Channel {
            Channel::Apns
        }
        async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
            let Push::Envelope { recipient, envelope } = push else { return Err(Refusal::Unsupported) };
            self.sent.lock().unwrap().insert((envelope.sequence_id, recipient.id));
            Ok(Outcome::Delivered)
        }
        fn timed_out(&self) -> Outcome {
            Outcome::Rejected
        }
    }

    struct Fixture {
        store: Arc<dyn Store>,
        provider: Arc<Recording>,
        metrics: Arc<Metrics>,
        supervisor: ActorRef<SupervisorMsg>,
        handle: tokio::task::JoinHandle<()>,
        topic: Topic,
        recipients: Vec<RecipientId>,
        _dir: tempfile::TempDir,
    }

    impl Fixture {
        /// Recipients subscribed to one topic and a supervisor owning
        /// `shards`; the first shard actor to process `panic_after` pages
        /// panics once (0: never).
        async fn start(shards: Vec<ShardId>, panic_after: u64) -> Self {
            let dir = tempfile::tempdir().unwrap();
            let store: Arc<dyn Store> = Arc::new(RedbStore::open(dir.path(), SHARDS).unwrap());
            let topic = Topic::parse(&[0, 42]).unwrap();
            let mut recipients = Vec::new();
            // Renewed now: the retention actor's pass at start keeps them.
            let now = crate::domain::Timestamp::now().as_unix_nanos();
            for i in 0..RECIPIENTS {
                let id = RecipientId::from_bytes([i + 1; 32]);
                let hash = RecipientSecret::parse(&[i + 1; 32]).unwrap().hash();
                store.register(&id, &hash, &DeliveryTarget::Apns { token: format!("t{i}") }, now).await.unwrap();
                let add = Subscription { topic: topic.clone(), keys: None, include_commits: false };
                let update = SubscriptionUpdate::new(vec![add], vec![]).unwrap();
                store.update_subscriptions(&id, &hash, &update, now, 100).await.unwrap();
                recipients.push(id);
            }
            let provider = Arc::new(Recording::default());
            let metrics = Arc::new(Metrics::new());
            let mut channels = Channels::default();
            channels.insert(provider.clone());
            let delivery = DeliverySettings::default();
            let (workers, _) = DeliveryWorkers::start(WorkerContext::for_tests(
                64,
                delivery,
                channels.clone(),
                store.clone(),
                metrics.clone(),
                Arc::new(Parking::of_providers(&channels, 64, SHARDS, metrics.clone())),
                Fence::default(),
            ));
            // Pages of one subscriber, so a few envelopes make several pages.
            let settings = DispatchSettings { subscriber_page: std::num::NonZeroUsize::MIN, ..Default::default() };
            let ctx = Arc::new(DispatchContext {
                store: store.clone(),
                routes: Routes::new(Arc::new(workers.clone()), &channels),
                workers,
                channels,
                settings,
                pages_ahead: 2,
                progress_interval: None,
                metrics: metrics.clone(),
                fence: Fence::default(),
                panic_hook: PanicHook::new(panic_after),
            });
            let retention = RetentionArgs {
                store: store.clone(),
                metrics: metrics.clone(),
                ttl: Duration::from_secs(86_400),
                interval: RetentionInterval::default(),
                ownership: None,
                clock: Arc::new(crate::domain::SystemClock),
            };
            let args = SupervisorArgs { ctx, shards, retention, lease: None };
            let (supervisor, handle) = Actor::spawn(None, Supervisor, args).await.unwrap();
            Self { store, provider, metrics, supervisor, handle, topic, recipients, _dir: dir }
        }

        fn shard(&self) -> ShardId {
            self.topic.shard(SHARDS)
        }

        /// Stores `n` envelopes on the topic and wakes its shard; their ids.
        async fn publish(&self, n: usize) -> Vec<u64> {
            let new =
                || NewEnvelope::new(self.topic.clone(), SHARDS, EnvelopeKind::Application, true, None, vec![], None);
            let batch: Vec<NewEnvelope> = (0..n).map(|_| new().unwrap()).collect();
            let appended = self.store.append(&batch, 2).await.unwrap();
            let _ = self.supervisor.cast(SupervisorMsg::Wake(vec![self.shard()]));
            appended
                .into_iter()
                .map(|a| match a {
                    Appended::Stored { sequence_id } => sequence_id,
                    Appended::Refused(r) => panic!("refused: {r:?}"),
                })
                .collect()
        }

        fn delivered(&self, ids: &[u64]) -> bool {
            let sent = self.provider.sent.lock().unwrap();
            ids.iter().all(|s| self.recipients.iter().all(|r| sent.contains(&(*s, *r))))
        }

        fn owned(&self) -> i64 {
            self.metrics.owned_shards.get()
        }

        /// Until the topic's shard has its checkpoint at its boundary.
        async fn until_dispatched(&self) {
            let deadline = std::time::Instant::now() + REAL_BOUND;
            loop {
                let p = self.store.shard_position(self.shard()).await.unwrap();
                if p.checkpoint == p.boundary {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "the checkpoint never reached the boundary: {p:?}");
                tokio::task::yield_now().await;
            }
        }

        /// Yields until `done` holds. The store works on threads of its own;
        /// a test that slept here would leave the runtime idle, and the paused
        /// clock would race ahead of that work. Yielding holds the clock still
        /// (no timer is needed for what these tests wait for), bounded in real
        /// time.
        async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
            let deadline = std::time::Instant::now() + REAL_BOUND;
            while !done(self) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "never: {what}; {} sends",
                    self.provider.sent.lock().unwrap().len()
                );
                tokio::task::yield_now().await;
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_shard_actor_is_restarted_counted_and_its_shard_delivered() {
        let f = Fixture::start(ShardId::all(SHARDS).collect(), 2).await;
        assert_eq!(f.owned(), i64::from(SHARDS));
        let ids = f.publish(3).await;
        f.until("every delivery, across the restart", |f| f.delivered(&ids)).await;
        assert_eq!(f.metrics.shard_restarts.get(), 1, "one injected panic, one restart");
        assert_eq!(f.owned(), i64::from(SHARDS), "the restarted actor is supervised again");
        f.until_dispatched().await;
    }

    #[tokio::test(start_paused = true)]
    async fn own_starts_a_shard_actor_and_disown_hands_it_back_unsupervised() {
        let f = Fixture::start(Vec::new(), 0).await;
        assert_eq!(f.owned(), 0);
        let shard = f.shard();
        let ids = f.publish(2).await;

        let _ = f.supervisor.cast(SupervisorMsg::Own(shard));
        f.until("the owned shard's deliveries", |f| f.delivered(&ids)).await;
        assert_eq!(f.owned(), 1);

        let cell = ractor::call!(f.supervisor, |reply| SupervisorMsg::Disown { shard, drain: true, reply })
            .unwrap()
            .expect("the actor of an owned shard");
        f.until("the disowned actor drained and stopped", |_| cell.get_status() == ractor::ActorStatus::Stopped).await;
        assert_eq!(f.owned(), 0, "a disowned actor that stops is not restarted");
        assert_eq!(f.metrics.shard_restarts.get(), 0);
        let none = ractor::call!(f.supervisor, |reply| SupervisorMsg::Disown { shard, drain: true, reply }).unwrap();
        assert!(none.is_none(), "nothing to hand back for a shard it does not run");
    }

    #[tokio::test(start_paused = true)]
    async fn drain_stops_the_supervisor_once_every_shard_stored_its_checkpoint() {
        let f = Fixture::start(ShardId::all(SHARDS).collect(), 0).await;
        let ids = f.publish(3).await;
        f.until("every delivery", |f| f.delivered(&ids)).await;
        let _ = f.supervisor.cast(SupervisorMsg::Drain);
        f.until("the supervisor stopped", |f| f.handle.is_finished()).await;
        let position = f.store.shard_position(f.topic.shard(SHARDS)).await.unwrap();
        assert_eq!(position.checkpoint, position.boundary, "nothing left to dispatch after the drain");
        assert_eq!(f.metrics.shard_restarts.get(), 0, "a drained actor's stop is not a failure");
    }
}
