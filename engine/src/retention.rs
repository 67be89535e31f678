//! PUSH-226: delete every recipient that has not renewed within
//! recipient_ttl_seconds, in one pass at start and then `interval_seconds`
//! after the previous pass ended, run by a supervised actor.

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::Deserialize;

use crate::clock::unix_now_ns;
use crate::metrics::Metrics;
use crate::store::Store;

/// `[engine.retention]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    /// Seconds between the end of one retention pass and the start of the next.
    pub interval_seconds: u64,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self { interval_seconds: 3600 }
    }
}

#[derive(Clone)]
pub struct RetentionArgs {
    pub store: Arc<dyn Store>,
    pub metrics: Arc<Metrics>,
    pub ttl_seconds: u64,
    pub interval_seconds: u64,
}

/// One pass. A failure is logged and retried at the next pass.
pub async fn run_pass(args: &RetentionArgs) {
    let cutoff = unix_now_ns().saturating_sub((args.ttl_seconds as i64).saturating_mul(1_000_000_000));
    // A failure is counted and logged by the instrumented store; the next pass retries.
    if let Ok(n) = args.store.delete_expired(cutoff).await {
        args.metrics.recipients_deleted.with_label_values(&["expired"]).inc_by(n);
        if n > 0 {
            tracing::info!(deleted = n, "retention pass deleted expired recipients");
        }
    }
}

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
