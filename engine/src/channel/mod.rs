//! Channels: one provider per channel behind the `Provider` trait (spec 000
//! section 7). Every channel is a folder of the same shape:
//!
//! - `mod.rs`: the provider, built by one constructor from its settings;
//! - `settings.rs`: its typed `[engine.channels.<name>]` table;
//! - `request.rs` or `body.rs`: what goes on the wire;
//! - `classify.rs`: the channel's row of the outcome table as a pure function
//!   from the answer to an `Outcome`, with its timeout and Retry-After rules.
//!
//! Every channel sends through the shared HTTP client `pool::Pool` (in-flight
//! bound, rate limit, response-body cap). `docs/ARCHITECTURE.md` walks
//! through adding a channel.

mod alpn;
pub mod apns;
pub mod fcm;
pub mod http;
pub mod http2;
mod outcome;
pub mod pool;
pub mod relay;
pub mod relayed;
mod retry_after;
mod settings;
pub(crate) mod tls;
pub mod webpush;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;

pub use outcome::Outcome;
pub use relayed::{RelayPriority, RelayRefusal, RelayedPush};
pub use settings::{ChannelSettings, Connections, HttpsBase, PushLifetime};
pub use tls::client_tls_config;

use crate::delivery::Delivery;
use crate::domain::{Channel, DeliveryTarget, Recipient, StoredEnvelope};
use crate::metrics::Metrics;
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
        _keys: &crate::domain::WebPushKeys,
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

/// The configured channels, keyed by `Channel`. A channel without a table has
/// no entry (section 2, PUSH-210).
#[derive(Clone, Default)]
pub struct Channels {
    providers: HashMap<Channel, Arc<dyn Provider>>,
    /// The relay's debug ring, when its endpoint is enabled (003 §5).
    push_log: Option<Arc<relay::PushLog>>,
}

impl Channels {
    /// Builds every channel whose table is present.
    pub fn build(settings: &ChannelSettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
        let mut channels = Self::default();
        if let Some(s) = &settings.apns {
            channels.insert(Arc::new(apns::ApnsProvider::new(s, ctx)?));
        }
        if let Some(s) = &settings.fcm {
            channels.insert(Arc::new(fcm::FcmProvider::new(s, ctx)?));
        }
        if let Some(s) = &settings.http {
            channels.insert(Arc::new(http::WebhookProvider::new(s, ctx)?));
        }
        if let Some(s) = &settings.webpush {
            channels.insert(Arc::new(webpush::WebPushProvider::new(s, ctx)?));
        }
        if let Some(s) = &settings.relay {
            let relay = relay::RelayProvider::new(s, ctx)?;
            channels.push_log = relay.push_log();
            channels.insert(Arc::new(relay));
        }
        Ok(channels)
    }

    /// Adds (or replaces) the provider of its channel.
    pub fn insert(&mut self, provider: Arc<dyn Provider>) {
        self.providers.insert(provider.channel(), provider);
    }

    pub fn get(&self, channel: Channel) -> Option<&Arc<dyn Provider>> {
        self.providers.get(&channel)
    }

    /// Every configured provider, in no particular order.
    pub fn providers(&self) -> impl Iterator<Item = &Arc<dyn Provider>> {
        self.providers.values()
    }

    pub fn is_configured(&self, channel: Channel) -> bool {
        self.providers.contains_key(&channel)
    }

    /// The relay's debug ring, only when `dangerous_push_log_endpoint` is on.
    pub fn push_log(&self) -> Option<Arc<relay::PushLog>> {
        self.push_log.clone()
    }
}
