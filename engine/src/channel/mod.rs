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
//! `push_log`), never in another channel's folder. Every channel sends
//! through the transport's shared HTTP client `transport::pool::Pool`
//! (in-flight bound, rate limit, response-body cap). `docs/ARCHITECTURE.md`
//! walks through adding a channel.

pub mod apns;
pub mod collapse;
mod common;
pub mod fcm;
pub mod http;
mod outcome;
#[cfg(test)]
mod probe;
mod provider;
pub mod push_log;
pub mod relay;
pub mod relayed;
mod retry_after;
pub mod webpush;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

pub use common::{Connections, HttpsBase, PushLifetime, TrustedCas};
pub use outcome::{Answer, Outcome, Reason, Sent};
pub use provider::{BuildError, ChannelContext, Provider, Push, Refused};
pub use relayed::{Refusal, RelayPriority, RelayedPush};

use crate::domain::{Channel, for_each_channel};
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

    /// Adds (or replaces) the queue of a channel that keeps its own: the
    /// table's `sink` rows build theirs; tests stand one in.
    #[cfg(test)]
    pub fn insert_sink(&mut self, channel: Channel, sink: Arc<dyn Sink>) {
        self.sinks.insert(channel, sink);
    }

    pub fn is_configured(&self, channel: Channel) -> bool {
        self.providers.contains_key(&channel) || self.sinks.contains_key(&channel)
    }
}

/// `ChannelSettings`, its workers' bound and `Channels::build` from the rows
/// of the channel table (`crate::domain::for_each_channel!`).
macro_rules! channel_table {
    ($($(#[$meta:meta])* $variant:ident $name:ident wire $wire:literal tag $tag:literal relayed $relayed:literal: $settings:ty => $role:ident $built:ty;)*) => {
        /// `[engine.channels]`: one optional table per channel, named as the
        /// channel is everywhere else (`Channel::as_str`). A channel exists
        /// only when its table is present (section 2, PUSH-210). With no
        /// `[engine.channels]` table at all, the HTTPS channel is configured
        /// with safe defaults; once the table is written, exactly the
        /// channels it lists exist (an empty table configures none).
        #[derive(Debug, Clone, Default, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub struct ChannelSettings {
            $($(#[$meta])* pub $name: Option<$settings>,)*
        }

        impl ChannelSettings {
            /// The requests the channels the delivery workers send through
            /// may have in flight together: the sum of their `max_in_flight`.
            /// A sink (the relay) is not among them: it sends from its own
            /// queue, never through the workers.
            pub fn max_in_flight(&self) -> usize {
                // Statements, not a sum: a row's `#[cfg]` takes a statement.
                let mut bound = 0;
                $($(#[$meta])* if let Some(_s) = &self.$name {
                    bound += role!($role in_flight _s);
                })*
                bound
            }

            /// Each configured channel with the CA files it trusts.
            pub fn extra_ca_files(&self) -> Vec<(Channel, &[PathBuf])> {
                let mut files = Vec::new();
                $($(#[$meta])* if let Some(s) = &self.$name {
                    files.push((Channel::$variant, TrustedCas::extra_ca_files(s)));
                })*
                files
            }

            /// Each channel the delivery workers send through, with its
            /// `max_in_flight`: the workers' slots for it.
            pub fn in_flight_by_channel(&self) -> Vec<(Channel, usize)> {
                let mut channels = Vec::new();
                $($(#[$meta])* if let Some(_s) = &self.$name {
                    let n = role!($role in_flight _s);
                    if n > 0 {
                        channels.push((Channel::$variant, n));
                    }
                })*
                channels
            }
        }

        impl Channels {
            /// Builds every channel whose table is present.
            pub fn build(settings: &ChannelSettings, ctx: &ChannelContext) -> Result<Self, BuildError> {
                let mut channels = Self::default();
                $($(#[$meta])* if let Some(s) = &settings.$name {
                    role!($role build channels Channel::$variant, $built, s, ctx);
                })*
                Ok(channels)
            }
        }
    };
}

/// What a row's role means for the workers' bound and for building it.
macro_rules! role {
    (provider in_flight $s:ident) => {
        $s.max_in_flight.get()
    };
    (sink in_flight $s:ident) => {
        0
    };
    (provider build $channels:ident $channel:expr, $built:ty, $s:ident, $ctx:ident) => {
        $channels.providers.insert($channel, Arc::new(<$built>::new($s, $ctx)?))
    };
    (sink build $channels:ident $channel:expr, $built:ty, $s:ident, $ctx:ident) => {
        $channels.sinks.insert($channel, Arc::new(<$built>::start($s, $ctx)?))
    };
}

for_each_channel!(channel_table);

impl ChannelSettings {
    /// What a deployment gets with no `[engine.channels]` table: HTTPS only.
    pub fn https_only() -> Self {
        Self { http: Some(http::HttpSettings::default()), ..Self::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channels(json: serde_json::Value) -> Result<ChannelSettings, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    #[test]
    fn provider_channel_tables_are_absent_by_default() {
        let c = ChannelSettings::https_only();
        assert!(c.http.is_some() && c.apns.is_none() && c.fcm.is_none(), "no table: HTTPS only");
        let c = channels(serde_json::json!({})).unwrap();
        assert!(c.http.is_none() && c.apns.is_none() && c.fcm.is_none(), "an empty table: no channel");
        let c = channels(serde_json::json!({"http": {}})).unwrap();
        assert!(c.http.is_some() && c.apns.is_none(), "an empty http table configures HTTPS");
    }

    #[test]
    fn the_workers_bound_sums_the_channels_they_send_through() {
        let mut c = ChannelSettings::https_only();
        assert_eq!(c.max_in_flight(), 1000);
        c.relay = Some(relay::RelaySettings::default());
        assert_eq!(c.max_in_flight(), 1000, "the relay sends from its own queue");
        assert_eq!(c.in_flight_by_channel(), vec![(Channel::Http, 1000)], "and has no slots of the workers");
    }
}
