use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};

use crate::retention::{RetentionArgs, run_pass};

/// Runs the retention pass (PUSH-226) at start and then `interval` after the
/// previous pass ended.
pub struct RetentionActor;

pub enum RetentionMsg {
    Pass,
}

impl Actor for RetentionActor {
    type Msg = RetentionMsg;
    type State = RetentionArgs;
    type Arguments = RetentionArgs;

    async fn pre_start(&self, myself: ActorRef<RetentionMsg>, args: RetentionArgs) -> Result<RetentionArgs, ActorProcessingErr> {
        let _ = myself.cast(RetentionMsg::Pass);
        Ok(args)
    }

    async fn handle(&self, myself: ActorRef<RetentionMsg>, _: RetentionMsg, args: &mut RetentionArgs) -> Result<(), ActorProcessingErr> {
        run_pass(args).await;
        let me = myself.clone();
        let interval = Duration::from_secs(args.interval_seconds);
        tokio::spawn(async move {
            tokio::time::sleep(interval).await;
            let _ = me.cast(RetentionMsg::Pass);
        });
        Ok(())
    }
}
