//! Channels: one provider per channel behind the `Provider` trait (spec 000
//! section 7). Every channel is a folder of the same shape:
//!
//! - `mod.rs`: the provider, built by one constructor from its settings;
//! - `settings.rs`: its typed `[engine.channels.<name>]` table;
//! - `request.rs` or `body.rs`: what goes on the wire;
//! - `classify.rs`: the channel's row of the outcome table as a pure function
//!   from the answer to an `Outcome`, with its timeout and Retry-After rules.
//!
//! The contract is `provider`'s; what several channels share lies beside it
//! (`common` value types, `collapse`, `retry_after`, `relayed`), never in
//! another channel's folder. Every channel sends through the transport's
//! shared HTTP client `transport::pool::Pool` (in-flight bound, rate limit,
//! response-body cap). `docs/ARCHITECTURE.md` walks through adding a channel.

pub mod apns;
pub mod collapse;
mod common;
pub mod fcm;
pub mod http;
mod outcome;
mod provider;
pub mod relay;
pub mod relayed;
mod retry_after;
mod settings;
pub mod webpush;

use std::collections::HashMap;
use std::sync::Arc;

pub use common::{Connections, HttpsBase, PushLifetime};
pub use outcome::Outcome;
pub use provider::{BuildError, ChannelContext, Provider, Push, PushQueue, QueueBatch, Refused};
pub use relayed::{RelayPriority, RelayRefusal, RelayedPush};
pub use settings::ChannelSettings;

use crate::domain::Channel;

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
