//! Channels: one provider per channel behind the `Provider` trait (spec 000
//! section 7). Every channel is a folder of the same shape:
//!
//! - `mod.rs`: the provider, built by one constructor from its settings;
//! - `settings.rs`: its typed `[engine.channels.<name>]` table;
//! - `request.rs` or `body.rs`: what goes on the wire;
//! - `classify.rs`: the channel's row of the outcome table as a pure function
//!   from the answer to an `Outcome`, with its timeout and Retry-After rules.
//!
//! The contract is `provider`'s (a channel that keeps its own queue is a
//! dispatch `Sink` instead, `crate::page`); what several channels share lies
//! beside it (`common` value types, `collapse`, `retry_after`, `relayed`,
//! `push_log`), never in another channel's folder. Every channel sends through the transport's
//! shared HTTP client `transport::pool::Pool` (in-flight bound, rate limit,
//! response-body cap). `docs/ARCHITECTURE.md` walks through adding a channel.

pub mod apns;
pub mod collapse;
mod common;
pub mod fcm;
pub mod http;
mod outcome;
mod provider;
pub mod push_log;
pub mod relay;
pub mod relayed;
mod retry_after;
mod settings;
pub mod webpush;

use std::collections::HashMap;
use std::sync::Arc;

pub use common::{Connections, HttpsBase, PushLifetime};
pub use outcome::Outcome;
pub use provider::{BuildError, ChannelContext, Provider, Push, Refused};
pub use relayed::{Refusal, RelayPriority, RelayedPush};
pub use settings::ChannelSettings;

use crate::domain::Channel;
use crate::page::Sink;

/// The configured channels, keyed by `Channel`. A channel without a table has
/// no entry (section 2, PUSH-210).
#[derive(Clone, Default)]
pub struct Channels {
    providers: HashMap<Channel, Arc<dyn Provider>>,
    /// The channels that keep their own queue: dispatch's sinks for them.
    sinks: HashMap<Channel, Arc<dyn Sink>>,
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
            channels.sinks.insert(Channel::Relay, Arc::new(relay::Relay::start(s, ctx)?));
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

    /// The sink of a channel that keeps its own queue; `None`: the delivery
    /// workers send its deliveries through its provider.
    pub fn sink(&self, channel: Channel) -> Option<&Arc<dyn Sink>> {
        self.sinks.get(&channel)
    }

    pub fn is_configured(&self, channel: Channel) -> bool {
        self.providers.contains_key(&channel) || self.sinks.contains_key(&channel)
    }
}
