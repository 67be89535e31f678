//! The channel contract: what a provider is handed (`Push`: an envelope's
//! wake-up, or a relayed push), what it answers (`Outcome`, `Refusal`,
//! `Refused`), and what its constructor may use (`ChannelContext`,
//! `BuildError`).

use std::sync::Arc;

use async_trait::async_trait;

use super::outcome::{Outcome, Sent};
use super::push_log::PushLog;
use super::relayed::{Refusal, RelayedPush};
use crate::domain::{Channel, DeliveryTarget, Recipient, StoredEnvelope};
use crate::metrics::Metrics;
use crate::store::Store;
use crate::transport::ATTEMPT_TIMEOUT;
use crate::transport::destination::HostResolver;
use crate::transport::pool::{Dialer, Resolver};
use crate::transport::proxy::OutboundProxy;

/// What one attempt sends. Each channel's row of the table says which kinds
/// it takes (`Channel::takes_relayed`); handed another, a provider answers
/// `Refusal::Unsupported` without a request.
#[derive(Debug, Clone, Copy)]
pub enum Push<'a> {
    /// Spec 000 section 7: the wake-up of an envelope, to the recipient as
    /// loaded for the window (its target is this channel's).
    Envelope { recipient: &'a Recipient, envelope: &'a StoredEnvelope },
    /// Spec 003 §2–3 (the ingress) and spec 002 §5.2 (the gateway): a push
    /// with its own payload, collapse id and priority.
    Relayed(RelayedPush<'a>),
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
    /// domain's text rules (the HTTPS and Web Push channels apply PUSH-256
    /// here; a token is checked by its platform at the first push).
    async fn admit(&self, _target: &DeliveryTarget) -> Result<(), Refused> {
        Ok(())
    }

    /// Makes one attempt and classifies the answer by the channel's outcome
    /// table. The caller bounds it to `ATTEMPT_TIMEOUT` and then uses
    /// `timed_out`.
    async fn send(&self, push: Push<'_>) -> Result<Outcome, Refusal>;

    /// `send`, with what the provider answered (its status and reason) for
    /// the delivery history. Channels whose answers say more than the
    /// outcome provide it; the default knows only the outcome.
    async fn send_answered(&self, push: Push<'_>) -> Result<Sent, Refusal> {
        self.send(push).await.map(Sent::from)
    }

    /// The outcome of an attempt that ran out of time (the table's timeout row).
    fn timed_out(&self) -> Outcome;

    /// `send` bounded to `ATTEMPT_TIMEOUT` (section 7), the table's timeout
    /// row when the bound runs out: what a role that sends one push and
    /// waits for its outcome calls (the gateway, the relay ingress).
    async fn send_within_attempt_bound(&self, push: Push<'_>) -> Result<Outcome, Refusal> {
        tokio::time::timeout(ATTEMPT_TIMEOUT, self.send(push)).await.unwrap_or_else(|_| Ok(self.timed_out()))
    }
}

/// What every channel constructor may use besides its own settings.
#[derive(Clone)]
pub struct ChannelContext {
    pub metrics: Arc<Metrics>,
    /// The relay channel compare-and-deletes on 404/410 (003 §2.4); `None`
    /// in tests that need no store.
    pub store: Option<Arc<dyn Store>>,
    /// The resolver of destinations a recipient chose (PUSH-256); `None`:
    /// each such channel's `dns_servers` (tests give fixed answers).
    pub resolver: Option<Arc<dyn HostResolver>>,
    /// The debug ring a channel records its in-process pushes in (003 §5).
    pub push_log: Arc<PushLog>,
    /// `[engine.outbound_proxy]`: the proxy the channels it serves connect
    /// through; `None`: every channel connects directly.
    pub proxy: Option<Arc<OutboundProxy>>,
}

impl ChannelContext {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics, store: None, resolver: None, push_log: Arc::default(), proxy: None }
    }

    /// The outbound proxy when it serves `channel`.
    pub fn proxy_for(&self, channel: Channel) -> Option<Arc<OutboundProxy>> {
        self.proxy.clone().filter(|p| p.serves(channel))
    }

    /// How `channel`'s connections reach the addresses `resolver` finds:
    /// through the outbound proxy when it serves the channel.
    pub fn dialer(&self, channel: Channel, resolver: Resolver) -> Dialer {
        Dialer::through(resolver, self.proxy_for(channel))
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
