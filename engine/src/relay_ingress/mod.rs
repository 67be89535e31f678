//! Spec 003, push-server side: fanout receives the signed webhooks
//! of hubs (§2) and delivers each push over its own APNs or FCM channel.
//!
//! One webhook, in order, nothing acted on before it is verified:
//! 1. a slot among `max_in_flight` (else 429, the hub retries);
//! 2. `X-Gim-Signature` (§2.2, `signature.rs`) under the secret of the body's
//!    `hub_id` (unknown hub: 401), over the raw bytes, within the window;
//! 3. the body (§2.3, `request.rs`): `v` = 1, `delivery_id` equal to
//!    `X-Gim-Delivery`, the registration's shape (400 otherwise);
//! 4. the provider (apns, fcm, webpush) and `app_id` this server delivers (422 otherwise);
//! 5. §2.5 idempotency through the `Store` (`idempotency.rs`): a delivery
//!    settled within its ttl is answered as it was, with no provider request;
//! 6. one provider attempt, answered by its outcome.
//!
//! **When the answer is 2xx.** fanout answers 200 only after the provider
//! (APNs, FCM) accepted the push: the provider's acceptance is the durable
//! one, so "never 2xx before the push is durably accepted" (003 §2.4)
//! holds without a second queue here. A transient provider answer releases
//! the claim and answers 503 with Retry-After, so the retry is the hub's (its
//! §2.4 schedule: 1, 2, 4, 8 s); fanout keeps no push it did not deliver.
//! The attempt runs in its own task: a hub that hangs up early does not
//! cancel it, and its retry finds the settled record.

mod error;
mod idempotency;
pub mod request;
pub mod settings;
pub mod signature;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use self::idempotency::{Claimed, Ledger};
use self::request::Webhook;
use self::signature::{SignatureError, SignatureHeader};
use crate::channel::{BuildError, Channels, Outcome, Provider, Push, Refusal, RelayedPush};
use crate::domain::{Channel, Clock, RelaySettled};
use crate::metrics::Metrics;
use crate::store::Store;

pub use self::error::IngressError;
pub use self::settings::RelayIngressSettings;

/// The hub honours Retry-After up to 60 s (§2.4): a longer one would only
/// be cut.
const MAX_RETRY_AFTER_SECS: u64 = 60;

/// A 2xx answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// The provider accepted the push now.
    Delivered,
    /// §2.5: already delivered within its ttl; no provider request.
    Duplicate,
}

/// A hub's secret. Debug prints nothing of it.
struct Secret(Vec<u8>);

crate::domain::redacted_debug!(Secret);

/// §1's `p256dh` and `auth` (base64url, padding optional) as Web Push
/// keys; `None` when either is missing or not a valid key.
fn web_push_keys(webhook: &Webhook) -> Option<crate::domain::WebPushKeys> {
    use base64::Engine as _;
    let decode = |key: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(key.trim_end_matches('=')).ok();
    let (p256dh, auth) = (decode(webhook.p256dh.as_deref()?)?, decode(webhook.auth.as_deref()?)?);
    crate::domain::WebPushKeys::parse(&p256dh, &auth).ok()
}

/// The `outcome` label of `fanout_relay_ingress_pushes_total`.
const PUSH_OUTCOMES: [&str; 5] = ["delivered", "dead_token", "rejected", "payload_too_large", "transient"];

/// The ingress: verifies, deduplicates and delivers one webhook at a time
/// per call; shared by every connection of the HTTP listener.
pub struct RelayIngress {
    path: String,
    window: Duration,
    max_body_bytes: usize,
    secrets: HashMap<String, Secret>,
    apns_app_ids: HashSet<String>,
    fcm_app_ids: HashSet<String>,
    channels: Channels,
    ledger: Ledger,
    metrics: Arc<Metrics>,
    in_flight: Arc<Semaphore>,
    /// The time signatures' freshness (§2.2) and the ledger's leases and
    /// expiry (§2.5) run on.
    clock: Arc<dyn Clock>,
}

impl RelayIngress {
    /// Reads every hub's secret file. Fails on an unreadable or empty one.
    pub fn new(
        settings: &RelayIngressSettings,
        channels: Channels,
        store: Arc<dyn Store>,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, BuildError> {
        const HUBS: &str = "engine.relay_ingress.hubs";
        let mut secrets = HashMap::new();
        for (hub, path) in settings.hubs.iter() {
            let bytes = std::fs::read(path)
                .map_err(|e| BuildError::new(HUBS, format!("hub {hub}: cannot read {}: {e}", path.display())))?;
            // A file written by `echo` ends with a newline that is not part
            // of the hub's GIM_HUB_PUSH_WEBHOOK_SECRET.
            let len = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
            if len == 0 {
                return Err(BuildError::new(HUBS, format!("hub {hub}: {} is empty", path.display())));
            }
            secrets.insert(hub.clone(), Secret(bytes[..len].to_vec()));
        }
        for reason in IngressError::labels() {
            metrics.relay_ingress_rejected.with_label_values(&[reason]);
        }
        // Every outcome of every configured channel from the start, so rates
        // and alerts see a zero rather than nothing.
        let configured = Channel::ALL.iter().filter(|c| c.takes_relayed() && channels.get(**c).is_some());
        for channel in configured {
            for outcome in PUSH_OUTCOMES {
                metrics.relay_ingress_pushes.with_label_values(&[channel.as_str(), outcome]);
            }
        }
        Ok(Self {
            path: settings.path.as_str().to_owned(),
            window: settings.signature_window,
            max_body_bytes: settings.max_body_bytes.get(),
            secrets,
            apns_app_ids: settings.apns_app_ids.iter().cloned().collect(),
            fcm_app_ids: settings.fcm_app_ids.iter().cloned().collect(),
            channels,
            ledger: Ledger::new(store, clock.clone()),
            metrics,
            in_flight: Arc::new(Semaphore::new(settings.max_in_flight.get())),
            clock,
        })
    }

    /// The path the HTTP listener routes here.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The largest body the HTTP edge reads.
    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    /// Counts a refusal the HTTP edge decided (`BodyTooLarge`).
    pub fn count_rejected(&self, error: &IngressError) {
        self.metrics.relay_ingress_rejected.with_label_values(&[error.label()]).inc();
    }

    /// Handles one webhook: `signature` and `delivery` are the header
    /// values, `body` the raw bytes as received.
    pub async fn handle(
        self: &Arc<Self>,
        signature: Option<&str>,
        delivery: Option<&str>,
        body: bytes::Bytes,
    ) -> Result<Accepted, IngressError> {
        let result = self.handle_counted(signature, delivery, body).await;
        match &result {
            Ok(Accepted::Delivered) => {}
            Ok(Accepted::Duplicate) => self.metrics.relay_ingress_webhooks.with_label_values(&["duplicate"]).inc(),
            Err(e) => self.count_rejected(e),
        }
        result
    }

    async fn handle_counted(
        self: &Arc<Self>,
        signature: Option<&str>,
        delivery: Option<&str>,
        body: bytes::Bytes,
    ) -> Result<Accepted, IngressError> {
        let permit = self.in_flight.clone().try_acquire_owned().map_err(|_| IngressError::Overloaded)?;
        let webhook = self.verify(signature, delivery, &body)?;
        // §1's provider names the channel; only a row that takes relayed pushes delivers it.
        let channel = Channel::parse(&webhook.provider).filter(|c| c.takes_relayed());
        let channel = channel.ok_or(IngressError::UnsupportedProvider)?;
        let allowed = match channel {
            Channel::Apns => Some(&self.apns_app_ids),
            Channel::Fcm => Some(&self.fcm_app_ids),
            // Web Push has no app ids: any app_id is one this server does not deliver.
            _ => None,
        };
        let provider = self.channels.get(channel).ok_or(IngressError::ProviderNotConfigured)?.clone();
        if webhook.app_id.as_ref().is_some_and(|app| !allowed.is_some_and(|ids| ids.contains(app))) {
            return Err(IngressError::UnknownApp);
        }
        // Its own task: a hub that hangs up must not cancel a claimed
        // attempt half way (its retry would wait out the lease).
        let this = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            this.deliver(&webhook, channel, provider.as_ref()).await
        })
        .await
        .unwrap_or(Err(IngressError::ProviderUnavailable { retry_after_secs: 1 }))
    }

    /// Steps 2 and 3: nothing of the body but `hub_id` is read before the
    /// signature over its raw bytes verified.
    fn verify(&self, signature: Option<&str>, delivery: Option<&str>, body: &[u8]) -> Result<Webhook, IngressError> {
        let header = SignatureHeader::parse(signature.ok_or(SignatureError::Missing)?)?;
        let hub = request::hub_id(body)?;
        let secret = self.secrets.get(&hub).ok_or(IngressError::UnknownHub)?;
        header.verify(&secret.0, body, self.clock.now().as_secs(), self.window)?;
        Ok(request::parse(body, delivery)?)
    }

    /// Steps 5 and 6.
    async fn deliver(
        &self,
        webhook: &Webhook,
        channel: Channel,
        provider: &dyn Provider,
    ) -> Result<Accepted, IngressError> {
        let claim = match self.ledger.claim(webhook).await? {
            Claimed::New(claim) => claim,
            Claimed::Settled(settled) => {
                return match settled {
                    RelaySettled::Delivered => Ok(Accepted::Duplicate),
                    RelaySettled::Gone => Err(IngressError::DeadToken),
                    RelaySettled::Rejected => Err(IngressError::ProviderRejected),
                };
            }
        };
        self.metrics.relay_ingress_webhooks.with_label_values(&["accepted"]).inc();
        let keys = web_push_keys(webhook);
        let push = RelayedPush {
            token: &webhook.token,
            app_id: webhook.app_id.as_deref(),
            sandbox: webhook.sandbox,
            collapse_id: webhook.collapse_id.as_deref(),
            priority: webhook.priority,
            payload: &webhook.payload,
            ttl: webhook.ttl,
            web_push_keys: keys.as_ref(),
        };
        let outcome = provider.send_within_attempt_bound(Push::Relayed(push)).await;
        let pushes =
            |label: &str| self.metrics.relay_ingress_pushes.with_label_values(&[channel.as_str(), label]).inc();
        let (label, settled, answer) = match outcome {
            Ok(Outcome::Delivered) => ("delivered", RelaySettled::Delivered, Ok(Accepted::Delivered)),
            Ok(Outcome::Terminal) => ("dead_token", RelaySettled::Gone, Err(IngressError::DeadToken)),
            Ok(Outcome::Rejected | Outcome::Mismatch) => {
                ("rejected", RelaySettled::Rejected, Err(IngressError::ProviderRejected))
            }
            Err(Refusal::TooLarge) => ("payload_too_large", RelaySettled::Rejected, Err(IngressError::PayloadTooLarge)),
            Err(Refusal::Unsupported) => {
                self.ledger.release(&claim).await;
                return Err(IngressError::UnsupportedProvider);
            }
            Ok(Outcome::Transient { delay } | Outcome::Gone { delay } | Outcome::NotSent { delay }) => {
                pushes("transient");
                // The hub retries (§2.4); its retry must send again.
                self.ledger.release(&claim).await;
                let retry_after_secs = delay.as_secs_f64().ceil().clamp(1.0, MAX_RETRY_AFTER_SECS as f64) as u64;
                return Err(IngressError::ProviderUnavailable { retry_after_secs });
            }
        };
        pushes(label);
        // Delivered whatever the store says now: a failed settle only means a
        // retry of this delivery_id may be sent again (a duplicate push, which
        // §2.5 tolerates), never a lost one.
        self.ledger.settle(&claim, settled).await;
        answer
    }
}

#[cfg(test)]
mod tests;
