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

pub mod apns;
pub mod fcm;
pub mod http;
mod outcome;
pub mod pool;
pub mod relayed;
mod settings;
mod tls;

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;

pub use outcome::Outcome;
pub use relayed::{RelayPriority, RelayRefusal, RelayedPush};
pub use settings::{ChannelSettings, Connections, HttpsBase};
pub use tls::client_tls_config;

use crate::domain::{Channel, DeliveryTarget, StoredEnvelope};
use crate::metrics::Metrics;
use crate::store::Recipient;

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

    /// The outcome of an attempt that ran out of time (the table's timeout row).
    fn timed_out(&self) -> Outcome;
}

/// What every channel constructor may use besides its own settings.
#[derive(Clone)]
pub struct ChannelContext {
    pub metrics: Arc<Metrics>,
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
pub struct Channels(HashMap<Channel, Arc<dyn Provider>>);

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
        Ok(channels)
    }

    /// Adds (or replaces) the provider of its channel.
    pub fn insert(&mut self, provider: Arc<dyn Provider>) {
        self.0.insert(provider.channel(), provider);
    }

    pub fn get(&self, channel: Channel) -> Option<&Arc<dyn Provider>> {
        self.0.get(&channel)
    }

    pub fn is_configured(&self, channel: Channel) -> bool {
        self.0.contains_key(&channel)
    }
}
