//! The channel contract: what a provider is handed (`Push`, or a `Delivery`
//! for a channel with its own queue), what it answers (`Outcome`, `Refused`),
//! and what its constructor may use (`ChannelContext`, `BuildError`).

use std::sync::Arc;

use async_trait::async_trait;

use super::outcome::Outcome;
use super::relayed::{RelayRefusal, RelayedPush};
use crate::domain::{Channel, DeliveryTarget, Recipient, StoredEnvelope, WebPushKeys};
use crate::metrics::Metrics;
use crate::page::Delivery;
use crate::store::Store;

/// One attempt's input: the envelope and the recipient as loaded for the window.
#[derive(Debug, Clone, Copy)]
pub struct Push<'a> {
    pub recipient: &'a Recipient,
    pub envelope: &'a StoredEnvelope,
}

/// Why a channel refuses a registration's target. Messages name the rule,
/// never the value (PUSH-254).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The target breaks a rule: the same request will fail again.
    #[error("{0}")]
    Invalid(String),
    /// The check could not be made now (e.g. DNS failed): try again later.
    #[error("{0}")]
    Unavailable(String),
}

#[async_trait]
pub trait Provider: Send + Sync + 'static {
    fn channel(&self) -> Channel;

    /// The channel's own checks of a target at registration, after the
    /// domain's text rules (the HTTPS channel applies PUSH-256 here).
    async fn admit(&self, _target: &DeliveryTarget) -> Result<(), Refused> {
        Ok(())
    }

    /// Makes one attempt and classifies the answer. The caller bounds it to
    /// `ATTEMPT_TIMEOUT` and then uses `timed_out`.
    async fn send(&self, push: Push<'_>) -> Outcome;

    /// Spec 003 ingress: makes one attempt of a push a hub relayed, with its
    /// own payload, collapse id and priority, and classifies the answer by
    /// the channel's outcome table. Bounded by the caller like `send`.
    /// Only the platform channels (APNs, FCM) deliver relayed pushes.
    async fn send_relayed(&self, _push: &RelayedPush<'_>) -> Result<Outcome, RelayRefusal> {
        Err(RelayRefusal::Unsupported)
    }

    /// Spec 003 ingress with provider `webpush`: like `send_relayed`, to
    /// the subscription whose endpoint is `push.token` and whose keys are
    /// the registration's `p256dh` and `auth`. Only the Web Push channel.
    async fn send_relayed_web_push(
        &self,
        _push: &RelayedPush<'_>,
        _keys: &WebPushKeys,
    ) -> Result<Outcome, RelayRefusal> {
        Err(RelayRefusal::Unsupported)
    }

    /// The outcome of an attempt that ran out of time (the table's timeout row).
    fn timed_out(&self) -> Outcome;

    /// A channel that keeps its own queue (the relay channel's per-device
    /// coalescing, spec 003 §4) takes its deliveries from dispatch directly
    /// instead of through the delivery workers. None for every other channel.
    fn queue(&self) -> Option<Arc<dyn PushQueue>> {
        None
    }
}

/// A channel's own queue (see `Provider::queue`).
pub trait PushQueue: Send + Sync + 'static {
    /// Opens a batch for one dispatch read: the deliveries pushed into it
    /// coalesce before any is sent, and are released when it is dropped.
    fn batch(&self) -> Box<dyn QueueBatch>;
}

/// The deliveries of one dispatch read, held until dropped.
pub trait QueueBatch: Send + Sync {
    /// Takes a delivery. The queue settles its first-attempt latch
    /// (PUSH-257) when its first attempt has an answer or when it is
    /// coalesced away or dropped, and drops it unsettled when its page was
    /// abandoned (the replay sends it).
    fn push(&mut self, delivery: Delivery);
}

/// What every channel constructor may use besides its own settings.
#[derive(Clone)]
pub struct ChannelContext {
    pub metrics: Arc<Metrics>,
    /// The relay channel compare-and-deletes on 404/410 (003 §2.4); `None`
    /// in tests that need no store.
    pub store: Option<Arc<dyn Store>>,
}

impl ChannelContext {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics, store: None }
    }
}

/// Why a channel could not be built from its settings. `key` is the full
/// configuration path of the value at fault.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {message}")]
pub struct BuildError {
    pub key: &'static str,
    pub message: String,
}

impl BuildError {
    pub fn new(key: &'static str, message: impl Into<String>) -> Self {
        Self { key, message: message.into() }
    }
}
