//! PUSH-226: delete every recipient that has not renewed within
//! recipient_ttl_seconds, in one pass at start and then `interval_seconds`
//! after the previous pass ended, run by a supervised actor. The same pass
//! deletes the relay ingress's delivery records whose ttl ran out (spec 003
//! §2.5).

use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use serde::Deserialize;

use crate::domain::Timestamp;
use crate::metrics::{Deleted, Metrics};
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
}

/// One pass. A failure is logged and retried at the next pass.
pub async fn run_pass(args: &RetentionArgs) {
    let now = Timestamp::now();
    let cutoff = now.saturating_sub(args.ttl).as_unix_nanos();
    // A failure is counted and logged by the instrumented store; the next pass retries.
    if let Ok(n) = args.store.delete_expired(cutoff).await {
        args.metrics.recipients_deleted_by(Deleted::Expired).inc_by(n);
        if n > 0 {
            tracing::info!(deleted = n, "retention pass deleted expired recipients");
        }
    }
    if let Ok(n) = args.store.delete_expired_relay(now.as_millis()).await {
        args.metrics.relay_records_expired.inc_by(n);
    }
    // Spec 002: expired registrations, notify records and window state.
    if let Ok(n) = args.store.delete_expired_gateway(now.as_millis()).await
        && n > 0
    {
        tracing::debug!(deleted = n, "retention pass deleted expired gateway records");
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

    async fn pre_start(
        &self,
        myself: ActorRef<RetentionMsg>,
        args: RetentionArgs,
    ) -> Result<RetentionArgs, ActorProcessingErr> {
        let _ = myself.cast(RetentionMsg::Pass);
        Ok(args)
    }

    async fn handle(
        &self,
        myself: ActorRef<RetentionMsg>,
        _: RetentionMsg,
        args: &mut RetentionArgs,
    ) -> Result<(), ActorProcessingErr> {
        run_pass(args).await;
        let me = myself.clone();
        let interval = args.interval.get();
        tokio::spawn(async move {
            tokio::time::sleep(interval).await;
            let _ = me.cast(RetentionMsg::Pass);
        });
        Ok(())
    }
}
