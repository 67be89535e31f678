//! Outside destinations (PUSH-256) as the channels that send to URLs given by
//! recipients see them: the webhook channel and Web Push build the same
//! checked pool and check each URL the same way before every attempt.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;

use super::CLIENT_OPTIONS;
use super::connect::CheckedResolver;
use super::resolve::HostResolver;
use super::safety::{DomainPattern, SafetyError, WebhookPolicy, WebhookUrl};
use crate::channel::pool::{Pool, PoolMetrics, PoolOptions, Resolver};
use crate::channel::{BuildError, ChannelContext, Connections, client_tls_config};
use crate::domain::Channel;

/// The keys both channels' tables share, borrowed from their settings.
pub struct DestinationSettings<'a> {
    /// The channel, for its metrics label and its table's name in errors.
    pub channel: Channel,
    pub allowed_domains: &'a [DomainPattern],
    pub allow_private_addresses: bool,
    pub allow_reserved_addresses: bool,
    pub extra_ca_files: &'a [PathBuf],
    pub connections: Connections,
    pub max_in_flight: NonZeroUsize,
    pub rate_limit_per_second: u32,
}

/// A pool whose every connection goes to a checked address, and the check
/// the channel makes before every attempt (which also covers IP-literal
/// hosts, which the connector reaches without its resolver).
pub struct CheckedDestinations {
    pub pool: Pool,
    policy: Arc<WebhookPolicy>,
    resolver: Arc<dyn HostResolver>,
}

impl CheckedDestinations {
    pub fn new(
        settings: DestinationSettings<'_>,
        resolver: Arc<dyn HostResolver>,
        ctx: &ChannelContext,
    ) -> Result<Self, BuildError> {
        let policy = Arc::new(WebhookPolicy {
            allowed_domains: settings.allowed_domains.to_vec(),
            allow_private_addresses: settings.allow_private_addresses,
            allow_reserved_addresses: settings.allow_reserved_addresses,
        });
        let ca_key = match settings.channel {
            Channel::WebPush => "engine.channels.webpush.extra_ca_files",
            _ => "engine.channels.http.extra_ca_files",
        };
        let tls = client_tls_config(settings.extra_ca_files).map_err(|e| BuildError::new(ca_key, e))?;
        let pool = Pool::new(
            &tls,
            PoolOptions {
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
                client: CLIENT_OPTIONS,
            },
            Resolver::Checked(CheckedResolver::new(resolver.clone(), policy.clone())),
            PoolMetrics::new(&ctx.metrics, settings.channel),
        );
        Ok(Self { pool, policy, resolver })
    }

    /// PUSH-256: resolve, and check every address (the URL was parsed
    /// when it was registered).
    pub async fn check(&self, url: &WebhookUrl) -> Result<(), SafetyError> {
        self.policy.check(url, self.resolver.as_ref()).await.map(|_| ())
    }
}
