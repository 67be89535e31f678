//! Outside destinations (PUSH-256) as the channels that send to URLs given by
//! recipients see them: the webhook channel and Web Push build the same
//! checked pool and check each URL the same way before every attempt.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::destination::connect::CheckedResolver;
use super::destination::resolve::HostResolver;
use super::destination::safety::{DomainPattern, SafetyError, WebhookPolicy, WebhookUrl};
use super::pool::{ClientOptions, Connections, Dialer, Pool, PoolMetrics, PoolOptions, Protocols, Resolver};
use super::proxy::OutboundProxy;
use super::tls::client_tls_config;
use crate::domain::Channel;
use crate::metrics::Metrics;

/// How each checked client is built: HTTP/2 or HTTP/1.1 as the receiver
/// prefers; idle pooled connections closed after 30 s, so a connection never
/// outlives the address check that opened it by long. The load harness's
/// ceiling client uses the same.
pub const CLIENT_OPTIONS: ClientOptions =
    ClientOptions { protocols: Protocols::Http1Or2, idle_timeout: Duration::from_secs(30) };

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
    /// The outbound proxy the channel's connections tunnel through, to the
    /// checked addresses; `None`: direct.
    pub proxy: Option<Arc<OutboundProxy>>,
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
    /// Fails with the reason `extra_ca_files` could not be read.
    pub fn new(
        settings: DestinationSettings<'_>,
        resolver: Arc<dyn HostResolver>,
        metrics: &Metrics,
    ) -> Result<Self, String> {
        let policy = Arc::new(WebhookPolicy {
            allowed_domains: settings.allowed_domains.to_vec(),
            allow_private_addresses: settings.allow_private_addresses,
            allow_reserved_addresses: settings.allow_reserved_addresses,
        });
        let tls = client_tls_config(settings.extra_ca_files)?;
        let pool = Pool::new(
            &tls,
            PoolOptions {
                connections: settings.connections,
                max_in_flight: settings.max_in_flight,
                rate_limit_per_second: settings.rate_limit_per_second,
                client: CLIENT_OPTIONS,
            },
            Dialer::through(Resolver::Checked(CheckedResolver::new(resolver.clone(), policy.clone())), settings.proxy),
            PoolMetrics::new(metrics, settings.channel),
        );
        Ok(Self { pool, policy, resolver })
    }

    /// PUSH-256: resolve, and check every address (the URL was parsed
    /// when it was registered).
    pub async fn check(&self, url: &WebhookUrl) -> Result<(), SafetyError> {
        self.policy.check(url, self.resolver.as_ref()).await.map(|_| ())
    }
}
