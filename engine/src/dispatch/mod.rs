//! Windowed dispatch (spec 000 section 5) in supervised shard actors: read
//! eligible envelopes above the checkpoint up to the boundary, join them with
//! their topic's subscribers page by page, apply PUSH-257 and PUSH-230 (the
//! ciphertext read per page, never held in a window), hand
//! batches to the delivery workers, and move the checkpoint once every
//! delivery of the window has had its first attempt.

mod condition;
mod routes;
mod settings;
mod shard;
mod suppression;
mod unpark;
mod window;
mod window_pages;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub use condition::{Decision, decide};
pub use routes::Routes;
pub use settings::DispatchSettings;
pub use shard::{ShardActor, ShardMsg};

use crate::channel::Channels;
use crate::delivery::DeliveryWorkers;
use crate::metrics::Metrics;
use crate::ownership::Fence;
use crate::store::Store;

/// What every shard actor shares (read-only).
pub struct DispatchContext {
    pub store: Arc<dyn Store>,
    pub workers: DeliveryWorkers,
    /// Each channel's sink (the workers, or the channel's own queue).
    pub routes: Routes,
    pub channels: Channels,
    pub settings: DispatchSettings,
    /// Subscriber pages each shard reads ahead (`DispatchSettings::pages_ahead`).
    pub pages_ahead: usize,
    /// How often a running window records its progress
    /// (`DispatchSettings::progress_interval`); `None` never.
    pub progress_interval: Option<std::time::Duration>,
    pub metrics: Arc<Metrics>,
    /// Fencing: a shard is dispatched only while this node surely holds its lease.
    pub fence: Fence,
    /// Test hook: the first shard actor to process this many pages panics once.
    pub panic_hook: PanicHook,
}

/// Test hook (`FANOUT_DANGEROUS_PANIC_AFTER_PAGES`): the shard actor that
/// processes the `after`-th page of this engine panics, once, to prove
/// supervision and replay. `after` = 0 (the default) disables it.
#[derive(Default)]
pub struct PanicHook {
    after: u64,
    pages: AtomicU64,
    fired: AtomicBool,
}

impl PanicHook {
    pub fn new(after: u64) -> Self {
        Self { after, ..Self::default() }
    }

    /// Counts a page; true exactly once, at the `after`-th.
    pub fn page_done(&self) -> bool {
        self.after > 0
            && self.pages.fetch_add(1, Ordering::SeqCst) + 1 >= self.after
            && !self.fired.swap(true, Ordering::SeqCst)
    }
}
