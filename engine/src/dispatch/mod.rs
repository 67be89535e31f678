//! Windowed dispatch (spec 000 section 5) in supervised shard actors: read
//! eligible envelopes above the checkpoint up to the boundary, join them with
//! their topic's subscribers page by page, apply PUSH-257 and PUSH-230, hand
//! batches to the delivery workers, and move the checkpoint once every
//! delivery of the window has had its first attempt.

mod condition;
mod lease;
mod retention;
mod shard;
mod supervisor;
mod ticker;

use std::sync::Arc;

pub use condition::{Decision, decide};
pub use lease::{LeaseActor, LeaseConfig, LeaseMsg, OwnedShards};
pub use retention::RetentionActor;
pub use shard::{ShardActor, ShardMsg};
pub use supervisor::{DispatchSupervisor, SupervisorArgs, SupervisorMsg};

use crate::channel::Channels;
use crate::delivery::DeliveryWorkers;
use crate::metrics::Metrics;
use crate::settings::DispatchSettings;
use crate::store::Store;

/// What every shard actor shares (read-only).
pub struct DispatchContext {
    pub store: Arc<dyn Store>,
    pub workers: DeliveryWorkers,
    pub channels: Channels,
    pub settings: DispatchSettings,
    pub metrics: Arc<Metrics>,
    /// Test hook: the first shard actor to process this many pages panics once,
    /// to prove supervision and replay. Zero (the default) disables it.
    pub dangerous_panic_after_pages: u64,
}
