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
    /// Several nodes (issue 7): shards come and go as leases say.
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
                        let _ = actor.cast(ShardMsg::Drain);
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
