use std::collections::HashMap;
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};

use super::{DispatchContext, RetentionActor, ShardActor, ShardMsg};
use crate::domain::ShardId;
use crate::retention::RetentionArgs;

pub enum SupervisorMsg {
    /// These shards stored new envelopes.
    Wake(Vec<ShardId>),
    /// Let every shard finish its current window and stop; then stop.
    Drain,
    /// Stop restarting children, then stop them and this actor.
    Shutdown,
}

/// The root of the dispatch tree: starts one actor per owned shard and the
/// retention actor, and restarts any that fails. A restarted child resumes
/// from durable state, never from memory.
pub struct DispatchSupervisor;

pub struct SupervisorArgs {
    pub ctx: Arc<DispatchContext>,
    pub shards: Vec<ShardId>,
    pub retention: RetentionArgs,
}

pub struct SupervisorState {
    ctx: Arc<DispatchContext>,
    retention: RetentionArgs,
    shards: HashMap<ActorId, ShardId>,
    refs: HashMap<ShardId, ActorRef<ShardMsg>>,
    retention_actor: Option<ActorId>,
    stopping: bool,
}

impl Actor for DispatchSupervisor {
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
            retention_actor: None,
            stopping: false,
        };
        for shard in args.shards {
            state.spawn_shard(myself.get_cell(), shard).await?;
        }
        state.spawn_retention(myself.get_cell()).await?;
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
                    if let Some(actor) = state.refs.get(&shard) {
                        let _ = actor.cast(ShardMsg::Wake);
                    }
                }
            }
            SupervisorMsg::Drain => {
                state.stopping = true;
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
        }
        Ok(())
    }
}

impl SupervisorState {
    async fn spawn_shard(&mut self, supervisor: ActorCell, shard: ShardId) -> Result<(), ActorProcessingErr> {
        let (actor, _) =
            Actor::spawn_linked(None, ShardActor, (shard, self.ctx.clone()), supervisor).await?;
        // Resume straight away: the checkpoint may be below the boundary.
        let _ = actor.cast(ShardMsg::Wake);
        self.shards.insert(actor.get_id(), shard);
        self.refs.insert(shard, actor);
        Ok(())
    }

    async fn spawn_retention(&mut self, supervisor: ActorCell) -> Result<(), ActorProcessingErr> {
        let (actor, _) =
            Actor::spawn_linked(None, RetentionActor, self.retention.clone(), supervisor).await?;
        self.retention_actor = Some(actor.get_id());
        Ok(())
    }
}
