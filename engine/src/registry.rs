//! The notification service's rules (spec 000 sections 1–3): ordered admission
//! (PUSH-253), Register (PUSH-255), Unregister (PUSH-207) and UpdateSubscriptions
//! (PUSH-215/216/217). Transport-free: `fanout-api` maps `AdmissionError` to
//! gRPC statuses once.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::channel::{Channels, Refused};
use crate::domain::{
    Channel, Clock, DeliveryTarget, FieldError, KeyWindow, ParseError, RecipientId, RecipientSecret, RecipientSummary,
    RegistrationInput, RelayRegistration, SigningKey, Subscription, SubscriptionUpdate, Timestamp, Topic, WebPushKeys,
    WebhookUrl,
};
use crate::metrics::{Limit, Metrics};
use crate::store::{MAX_SUBSCRIPTION_CHANGES, RegistrationRemoval, Store, StoreError};

/// `engine.max_subscription_changes`: the most adds plus removes one
/// UpdateSubscriptions may carry, 1000 to 65534, default 2000.
/// All of them are applied in one transaction (PUSH-216), so this bounds
/// that transaction. Spec clients send at most 1000 subscriptions per
/// request (section 8) and stop for good on INVALID_ARGUMENT (PUSH-262), so
/// a smaller limit would strand conforming clients; the ScyllaDB backend
/// applies one update in one batch of at most 65534 statements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "u64")]
pub struct SubscriptionChanges(usize);

impl SubscriptionChanges {
    /// Section 8: a client's batch of subscriptions.
    pub const MIN: usize = 1000;
    pub const MAX: usize = MAX_SUBSCRIPTION_CHANGES;
    /// Twice a client's batch, for clients that count adds and removes apart.
    pub const DEFAULT: SubscriptionChanges = SubscriptionChanges(2000);

    pub fn get(self) -> usize {
        self.0
    }
}

impl Default for SubscriptionChanges {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl TryFrom<u64> for SubscriptionChanges {
    type Error = String;

    fn try_from(n: u64) -> Result<Self, String> {
        match usize::try_from(n) {
            Ok(n) if (Self::MIN..=Self::MAX).contains(&n) => Ok(Self(n)),
            _ => Err(format!("must be between {} and {}", Self::MIN, Self::MAX)),
        }
    }
}

/// Register's delivery as received, before admission check 4.
pub enum DeliveryInput<'a> {
    Apns {
        token: &'a str,
    },
    Fcm {
        token: &'a str,
    },
    Http {
        url: &'a str,
        signing_key: &'a [u8],
    },
    /// Spec 003 §1: a device's push route through the operator's push server.
    Relay(RegistrationInput<'a>),
    /// A browser's Web Push subscription (RFC 8030, 8291).
    WebPush {
        endpoint: &'a str,
        p256dh: &'a [u8],
        auth: &'a [u8],
    },
}

/// A Subscription as received, before PUSH-215.
pub struct SubscriptionInput<'a> {
    pub topic: &'a [u8],
    pub hmac_epoch_base: i64,
    pub hmac_keys: &'a [Vec<u8>],
    pub include_commits: bool,
}

/// The backend's view returned by every successful mutating call (PUSH-255).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecipientState {
    pub topic_count: u64,
    pub channel: Channel,
    pub expires_at_ns: i64,
}

/// The admission statuses, one variant per status the spec names. Messages
/// name the rule that failed, never a value (PUSH-254).
#[derive(Debug, thiserror::Error)]
pub enum AdmissionError {
    #[error("{0}")]
    InvalidArgument(String),
    /// A relay registration field breaks its 003 §1 rule: INVALID_ARGUMENT
    /// over gRPC, `400 validation_failed` naming the field over HTTP.
    #[error("{0}")]
    InvalidField(FieldError),
    #[error("recipient not found")]
    NotFound,
    #[error("recipient secret does not match")]
    PermissionDenied,
    #[error("{0}")]
    FailedPrecondition(&'static str),
    #[error("the request would exceed max_push_topics")]
    ResourceExhausted,
    #[error("storage unavailable")]
    Unavailable(#[source] StoreError),
    /// A check the request needs could not be made now (e.g. DNS failed).
    #[error("{0}")]
    TryAgain(String),
}

impl From<ParseError> for AdmissionError {
    fn from(e: ParseError) -> Self {
        Self::InvalidArgument(e.0.to_owned())
    }
}

impl From<StoreError> for AdmissionError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound => Self::NotFound,
            StoreError::SecretMismatch => Self::PermissionDenied,
            StoreError::TopicLimit => Self::ResourceExhausted,
            e @ StoreError::Backend(_) => Self::Unavailable(e),
        }
    }
}

pub struct Registry {
    store: Arc<dyn Store>,
    channels: Channels,
    max_push_topics: u64,
    max_subscription_changes: SubscriptionChanges,
    recipient_ttl_seconds: u64,
    metrics: Arc<Metrics>,
    /// The time a registration or a subscription change renews a
    /// recipient at (PUSH-255's TTL runs from it).
    clock: Arc<dyn Clock>,
}

impl Registry {
    /// Admission on `store` for the `channels` configured, under the
    /// engine's limits (`[engine]` `max_push_topics`,
    /// `max_subscription_changes`, `recipient_ttl_seconds`).
    pub fn new(
        store: Arc<dyn Store>,
        channels: Channels,
        max_push_topics: u64,
        max_subscription_changes: SubscriptionChanges,
        recipient_ttl: Duration,
        metrics: Arc<Metrics>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let recipient_ttl_seconds = recipient_ttl.as_secs();
        Self { store, channels, max_push_topics, max_subscription_changes, recipient_ttl_seconds, metrics, clock }
    }

    /// PUSH-253 rows 1, 3, 4 then PUSH-255.
    pub async fn register(
        &self,
        recipient_id: &[u8],
        recipient_secret: &[u8],
        delivery: Option<DeliveryInput<'_>>,
    ) -> Result<RecipientState, AdmissionError> {
        let (id, secret) = parse_credentials(recipient_id, recipient_secret)?;
        let hash = secret.hash();
        if let Some(stored) = self.store.recipient(&id).await? {
            // Row 3, constant-time (SecretHash's PartialEq).
            if stored.secret_hash != hash {
                return Err(AdmissionError::PermissionDenied);
            }
        }
        let target = self.parse_delivery(delivery).await?;
        let summary = self.store.register(&id, &hash, &target, self.clock.now().as_unix_nanos()).await?;
        Ok(self.state(summary))
    }

    /// PUSH-253 rows 1–3 then PUSH-207.
    pub async fn unregister(&self, recipient_id: &[u8], recipient_secret: &[u8]) -> Result<(), AdmissionError> {
        let (id, secret) = parse_credentials(recipient_id, recipient_secret)?;
        self.admit_existing(&id, &secret).await?;
        self.store.unregister(&id, &secret.hash()).await?;
        Ok(())
    }

    /// 003 §1 `DELETE /v2/push/registration`: PUSH-253 rows 1–3, then the
    /// registration is removed and the device kept with its subscriptions
    /// (spec 000's Unregister, PUSH-207, deletes the recipient instead). A
    /// device with nothing registered, or unknown, has nothing to remove:
    /// that is success too, as §1 answers 204.
    pub async fn remove_relay_registration(
        &self,
        recipient_id: &[u8],
        recipient_secret: &[u8],
    ) -> Result<(), AdmissionError> {
        let (id, secret) = parse_credentials(recipient_id, recipient_secret)?;
        let removal = RegistrationRemoval::Deleted { id, secret_hash: secret.hash() };
        match self.store.remove_relay_registration(&removal).await {
            Ok(_) | Err(StoreError::NotFound) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// PUSH-253 rows 1–4 (with the request's size in row 4) then PUSH-216/217.
    pub async fn update_subscriptions(
        &self,
        recipient_id: &[u8],
        recipient_secret: &[u8],
        adds: &[SubscriptionInput<'_>],
        removes: &[Vec<u8>],
    ) -> Result<RecipientState, AdmissionError> {
        let (id, secret) = parse_credentials(recipient_id, recipient_secret)?;
        self.admit_existing(&id, &secret).await?;
        // Row 4, first: the request's size (`engine.max_subscription_changes`), before any topic is
        // parsed or anything written.
        let limit = self.max_subscription_changes.get();
        if adds.len().saturating_add(removes.len()) > limit {
            self.metrics.limit_refused(Limit::SubscriptionChanges, 1);
            return Err(AdmissionError::InvalidArgument(format!(
                "an UpdateSubscriptions request carries at most {limit} adds and removes together \
                 (engine.max_subscription_changes); send them in batches"
            )));
        }
        let update = parse_update(adds, removes)?;
        let summary = self
            .store
            .update_subscriptions(&id, &secret.hash(), &update, self.clock.now().as_unix_nanos(), self.max_push_topics)
            .await?;
        Ok(self.state(summary))
    }

    /// Rows 2 and 3 for calls that need a stored recipient.
    async fn admit_existing(&self, id: &RecipientId, secret: &RecipientSecret) -> Result<(), AdmissionError> {
        let stored = self.store.recipient(id).await?.ok_or(AdmissionError::NotFound)?;
        if stored.secret_hash != secret.hash() {
            return Err(AdmissionError::PermissionDenied);
        }
        Ok(())
    }

    /// Row 4 for Register: section 2 and the token/URL text rules.
    async fn parse_delivery(&self, delivery: Option<DeliveryInput<'_>>) -> Result<DeliveryTarget, AdmissionError> {
        let delivery = delivery.ok_or_else(|| {
            AdmissionError::InvalidArgument("a delivery (apns, fcm, http, relay or webpush) is required".into())
        })?;
        let channel = match delivery {
            DeliveryInput::Apns { .. } => Channel::Apns,
            DeliveryInput::Fcm { .. } => Channel::Fcm,
            DeliveryInput::Http { .. } => Channel::Http,
            DeliveryInput::Relay(_) => Channel::Relay,
            DeliveryInput::WebPush { .. } => Channel::WebPush,
        };
        if !self.channels.is_configured(channel) {
            // PUSH-210
            return Err(AdmissionError::FailedPrecondition("this channel is not configured on this deployment"));
        }
        let target = match delivery {
            DeliveryInput::Apns { token } => {
                DeliveryTarget::check_token(token)?;
                DeliveryTarget::Apns { token: token.to_owned() }
            }
            DeliveryInput::Fcm { token } => {
                DeliveryTarget::check_token(token)?;
                DeliveryTarget::Fcm { token: token.to_owned() }
            }
            DeliveryInput::Http { url, signing_key } => {
                DeliveryTarget::check_url_text(url)?;
                let signing_key = SigningKey::parse(signing_key)?;
                // PUSH-256's syntactic rules; the address rules are the channel's.
                let url = WebhookUrl::parse(url).map_err(|e| {
                    self.metrics.webhook_refused_at_register.inc();
                    AdmissionError::InvalidArgument(e.describe("webhook url"))
                })?;
                DeliveryTarget::Http { url, signing_key }
            }
            DeliveryInput::Relay(input) => {
                DeliveryTarget::Relay(Some(RelayRegistration::parse(input).map_err(AdmissionError::InvalidField)?))
            }
            DeliveryInput::WebPush { endpoint, p256dh, auth } => {
                DeliveryTarget::check_endpoint_text(endpoint)?;
                let keys = WebPushKeys::parse(p256dh, auth)?;
                let endpoint = WebhookUrl::parse(endpoint)
                    .map_err(|e| AdmissionError::InvalidArgument(e.describe("webpush endpoint")))?;
                DeliveryTarget::WebPush { endpoint, keys }
            }
        };
        // The channel's own rules (PUSH-256 for HTTPS); a sink has none.
        if let Some(provider) = self.channels.get(channel) {
            provider.admit(&target).await.map_err(|e| match e {
                Refused::Invalid(rule) => AdmissionError::InvalidArgument(rule),
                Refused::Unavailable(why) => AdmissionError::TryAgain(why),
            })?;
        }
        Ok(target)
    }

    fn state(&self, summary: RecipientSummary) -> RecipientState {
        RecipientState {
            topic_count: summary.topic_count,
            channel: summary.channel,
            expires_at_ns: Timestamp::from_unix_nanos(summary.renewed_at_ns)
                .saturating_add(Duration::from_secs(self.recipient_ttl_seconds))
                .as_unix_nanos(),
        }
    }
}

/// Row 1: both exactly 32 bytes.
fn parse_credentials(id: &[u8], secret: &[u8]) -> Result<(RecipientId, RecipientSecret), AdmissionError> {
    Ok((RecipientId::parse(id)?, RecipientSecret::parse(secret)?))
}

/// PUSH-215: every rule, before anything is applied.
fn parse_update(adds: &[SubscriptionInput<'_>], removes: &[Vec<u8>]) -> Result<SubscriptionUpdate, AdmissionError> {
    let adds = adds
        .iter()
        .map(|a| {
            Ok(Subscription {
                topic: Topic::parse_subscribable(a.topic)?,
                keys: KeyWindow::parse(a.hmac_epoch_base, a.hmac_keys)?,
                include_commits: a.include_commits,
            })
        })
        .collect::<Result<Vec<_>, ParseError>>()?;
    let removes = removes.iter().map(|t| Topic::parse_subscribable(t)).collect::<Result<Vec<_>, _>>()?;
    Ok(SubscriptionUpdate::new(adds, removes)?)
}

#[cfg(test)]
mod tests {
    //! Admission (PUSH-253) in order, over a real store, with in-memory
    //! providers: the rows that refuse change nothing.

    use async_trait::async_trait;

    use super::*;
    use crate::channel::{Outcome, Provider, Push, Refusal};
    use crate::store::RedbStore;
    use crate::testing::TestClock;

    /// A channel that refuses every target whose URL or token says "blocked".
    struct Picky(Channel);

    #[async_trait]
    impl Provider for Picky {
        fn channel(&self) -> Channel {
            self.0
        }
        async fn admit(&self, target: &DeliveryTarget) -> Result<(), Refused> {
            let text = match target {
                DeliveryTarget::Http { url, .. } => url.as_str(),
                DeliveryTarget::Apns { token } | DeliveryTarget::Fcm { token } => token,
                DeliveryTarget::Probe { token } => token,
                DeliveryTarget::Relay(r) => r.as_ref().map_or("", RelayRegistration::token),
                DeliveryTarget::WebPush { endpoint, .. } => endpoint.as_str(),
            };
            if text.contains("blocked") {
                Err(Refused::Invalid("webhook host does not resolve to an allowed address".into()))
            } else if text.contains("dns-down") {
                Err(Refused::Unavailable("webhook host cannot be resolved right now".into()))
            } else {
                Ok(())
            }
        }
        async fn send(&self, _: Push<'_>) -> Result<Outcome, Refusal> {
            Ok(Outcome::Delivered)
        }
        fn timed_out(&self) -> Outcome {
            Outcome::Rejected
        }
    }

    const ID: [u8; 32] = [1; 32];
    const SECRET: [u8; 32] = [2; 32];
    const KEY: [u8; 16] = [7; 16];

    fn registry(dir: &tempfile::TempDir, channels: &[Channel], max_push_topics: u64) -> Registry {
        let mut configured = Channels::default();
        for c in channels {
            configured.insert(Arc::new(Picky(*c)));
        }
        Registry {
            store: Arc::new(RedbStore::open(dir.path(), 4).unwrap()),
            channels: configured,
            max_push_topics,
            max_subscription_changes: SubscriptionChanges::try_from(SubscriptionChanges::MIN as u64).unwrap(),
            recipient_ttl_seconds: 60,
            metrics: Arc::new(Metrics::new()),
            clock: TestClock::at(T0),
        }
    }

    /// The controlled clock's start, Unix ms.
    const T0: i64 = 1_767_225_600_000;

    #[tokio::test]
    async fn registration_and_subscription_changes_renew_at_the_clocks_time() {
        let dir = tempfile::tempdir().unwrap();
        let clock = TestClock::at(T0);
        let r = Registry { clock: clock.clone(), ..registry(&dir, &[Channel::Http], 2) };
        let ttl_ns = 60 * 1_000_000_000;
        let http = Some(DeliveryInput::Http { url: "https://push.example.com/hook", signing_key: &KEY });
        let first = r.register(&ID, &SECRET, http).await.unwrap();
        assert_eq!(first.expires_at_ns, T0 * 1_000_000 + ttl_ns, "PUSH-255: the TTL runs from the registration");
        clock.advance(Duration::from_secs(30));
        let renewed = r.update_subscriptions(&ID, &SECRET, &[add(&[0, 1])], &[]).await.unwrap();
        assert_eq!(renewed.expires_at_ns, (T0 + 30_000) * 1_000_000 + ttl_ns, "and again from each change");
    }

    fn add(topic: &[u8]) -> SubscriptionInput<'_> {
        SubscriptionInput { topic, hmac_epoch_base: 0, hmac_keys: &[], include_commits: false }
    }

    fn invalid(r: Result<RecipientState, AdmissionError>) -> String {
        match r {
            Err(AdmissionError::InvalidArgument(m)) => m,
            other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn rows_apply_in_order_and_refusals_store_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(&dir, &[Channel::Http, Channel::Apns], 2);
        let http = |url| Some(DeliveryInput::Http { url, signing_key: &KEY });

        // Row 1: lengths first, whatever else is wrong.
        invalid(r.register(&ID[..31], &SECRET, None).await);
        // Row 4: a delivery is required; an unconfigured channel is a precondition.
        invalid(r.register(&ID, &SECRET, None).await);
        let fcm = Some(DeliveryInput::Fcm { token: "t" });
        assert!(matches!(r.register(&ID, &SECRET, fcm).await, Err(AdmissionError::FailedPrecondition(_))));
        // The text rules, then the channel's own (PUSH-256 for HTTPS).
        invalid(r.register(&ID, &SECRET, http("")).await);
        let short_key = Some(DeliveryInput::Http { url: "https://a.example/", signing_key: &KEY[..15] });
        invalid(r.register(&ID, &SECRET, short_key).await);
        let refused = invalid(r.register(&ID, &SECRET, http("https://blocked.example/")).await);
        assert_eq!(refused, "webhook host does not resolve to an allowed address", "the rule, never the URL");
        let later = r.register(&ID, &SECRET, http("https://dns-down.example/")).await;
        assert!(matches!(later, Err(AdmissionError::TryAgain(_))), "a failed lookup is not the client's fault");
        assert!(r.store.recipient(&RecipientId::from_bytes(ID)).await.unwrap().is_none(), "nothing stored");

        // Stored once admitted; the state carries the channel and the TTL.
        let state = r.register(&ID, &SECRET, http("https://a.example/")).await.unwrap();
        assert_eq!((state.channel, state.topic_count), (Channel::Http, 0));
        let stored = r.store.recipient(&RecipientId::from_bytes(ID)).await.unwrap().unwrap();
        assert_eq!(state.expires_at_ns, stored.renewed_at_ns + 60_000_000_000);

        // Row 3: another secret for an existing recipient, before the payload rules.
        let other = [3u8; 32];
        assert!(matches!(r.register(&ID, &other, None).await, Err(AdmissionError::PermissionDenied)));
        assert!(matches!(r.unregister(&ID, &other).await, Err(AdmissionError::PermissionDenied)));
        // Row 2: unknown recipients.
        assert!(matches!(r.unregister(&[9; 32], &SECRET).await, Err(AdmissionError::NotFound)));
        let adds = [add(&[0, 1])];
        assert!(matches!(r.update_subscriptions(&[9; 32], &SECRET, &adds, &[]).await, Err(AdmissionError::NotFound)));
    }

    #[tokio::test]
    async fn relay_registrations_follow_section_1_and_replace_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(&dir, &[Channel::Relay, Channel::Apns], 2);
        let relay =
            |provider, token| Some(DeliveryInput::Relay(RegistrationInput { provider, token, ..Default::default() }));
        match r.register(&ID, &SECRET, relay("APNS", "t")).await {
            Err(AdmissionError::InvalidField(e)) => assert_eq!(e.field, "provider"),
            other => panic!("expected the provider rule, got {other:?}"),
        }
        assert!(r.store.recipient(&RecipientId::from_bytes(ID)).await.unwrap().is_none(), "nothing stored");
        r.register(&ID, &SECRET, Some(DeliveryInput::Apns { token: "t" })).await.unwrap();
        r.update_subscriptions(&ID, &SECRET, &[add(&[0, 1])], &[]).await.unwrap();
        let state = r.register(&ID, &SECRET, relay("fcm", "device-token")).await.unwrap();
        assert_eq!((state.channel, state.topic_count), (Channel::Relay, 1), "replaced, subscriptions kept");
        let stored = r.store.recipient(&RecipientId::from_bytes(ID)).await.unwrap().unwrap();
        let DeliveryTarget::Relay(Some(reg)) = stored.target else { panic!("a relay target") };
        assert_eq!((reg.provider(), reg.token(), reg.app_id()), ("fcm", "device-token", None));
    }

    #[tokio::test]
    async fn subscription_rules_and_the_topic_limit_change_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(&dir, &[Channel::Apns], 2);
        r.register(&ID, &SECRET, Some(DeliveryInput::Apns { token: "t" })).await.unwrap();
        // PUSH-215: every rule before anything is applied.
        let bad = [add(&[0, 1]), add(&[0x02, 1])]; // identity updates cannot be subscribed
        invalid(r.update_subscriptions(&ID, &SECRET, &bad, &[]).await);
        let twice = [add(&[0, 1])];
        invalid(r.update_subscriptions(&ID, &SECRET, &twice, &[vec![0, 1]]).await);
        assert!(r.store.subscriptions(&RecipientId::from_bytes(ID)).await.unwrap().is_empty());
        // PUSH-217: over max_push_topics, nothing changes.
        let three = [add(&[0, 1]), add(&[0, 2]), add(&[1, 3])];
        assert!(matches!(
            r.update_subscriptions(&ID, &SECRET, &three, &[]).await,
            Err(AdmissionError::ResourceExhausted)
        ));
        assert!(r.store.subscriptions(&RecipientId::from_bytes(ID)).await.unwrap().is_empty());
        let two = &three[..2];
        assert_eq!(r.update_subscriptions(&ID, &SECRET, two, &[]).await.unwrap().topic_count, 2);
    }

    #[tokio::test]
    async fn an_update_over_the_change_limit_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let r = registry(&dir, &[Channel::Apns], 100_000);
        let limit = SubscriptionChanges::MIN;
        // Rows 2 and 3 still come first.
        let topics: Vec<Vec<u8>> = (0..=limit as u32).map(|i| [vec![0], i.to_be_bytes().to_vec()].concat()).collect();
        let adds: Vec<SubscriptionInput<'_>> = topics.iter().map(|t| add(t)).collect();
        assert!(matches!(r.update_subscriptions(&ID, &SECRET, &adds, &[]).await, Err(AdmissionError::NotFound)));
        r.register(&ID, &SECRET, Some(DeliveryInput::Apns { token: "t" })).await.unwrap();
        assert!(matches!(
            r.update_subscriptions(&ID, &[3; 32], &adds, &[]).await,
            Err(AdmissionError::PermissionDenied)
        ));

        // One over: refused, whatever else is wrong, and nothing stored.
        let message = invalid(r.update_subscriptions(&ID, &SECRET, &adds, &[]).await);
        assert_eq!(
            message,
            "an UpdateSubscriptions request carries at most 1000 adds and removes together \
             (engine.max_subscription_changes); send them in batches"
        );
        let (some_adds, removes) = (&adds[..600], &topics[600..]);
        invalid(r.update_subscriptions(&ID, &SECRET, some_adds, removes).await);
        assert!(r.store.subscriptions(&RecipientId::from_bytes(ID)).await.unwrap().is_empty());
        assert!(r.metrics.render().contains("fanout_limit_refusals_total{limit=\"subscription_changes\"} 2"));
        // At the limit: applied.
        assert_eq!(r.update_subscriptions(&ID, &SECRET, &adds[..limit], &[]).await.unwrap().topic_count, limit as u64);
    }

    #[test]
    fn the_change_limit_is_between_a_client_batch_and_a_scylla_batch() {
        assert_eq!(SubscriptionChanges::default().get(), 2000);
        assert_eq!(SubscriptionChanges::try_from(1000).unwrap().get(), 1000);
        assert_eq!(SubscriptionChanges::try_from(65534).unwrap().get(), 65534);
        for bad in [0, 999, 65535, u64::MAX] {
            assert_eq!(SubscriptionChanges::try_from(bad).unwrap_err(), "must be between 1000 and 65534");
        }
    }

    /// UpdateSubscriptions as received, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn topic() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                4 => (0u8..2, 0u8..4).prop_map(|(k, id)| vec![k, id]),
                1 => prop::collection::vec(any::<u8>(), 0..4),
            ]
        }

        fn add_fields() -> impl Strategy<Value = (Vec<u8>, i64, Vec<Vec<u8>>, bool)> {
            let key = prop_oneof![4 => Just(vec![7u8; 42]), 1 => prop::collection::vec(any::<u8>(), 0..44)];
            (topic(), prop_oneof![Just(0i64), any::<i64>()], prop::collection::vec(key, 0..5), any::<bool>())
        }

        proptest! {
            /// PUSH-215: an update is accepted exactly when every add and
            /// remove passes on its own and no topic repeats, and then holds
            /// what was sent, in order.
            #[test]
            fn updates_parse_by_push_215(
                adds in prop::collection::vec(add_fields(), 0..5),
                removes in prop::collection::vec(topic(), 0..5),
            ) {
                let inputs: Vec<SubscriptionInput<'_>> = adds
                    .iter()
                    .map(|(topic, base, keys, commits)| SubscriptionInput {
                        topic,
                        hmac_epoch_base: *base,
                        hmac_keys: keys,
                        include_commits: *commits,
                    })
                    .collect();
                let each_ok = adds.iter().all(|(t, base, keys, _)| {
                    Topic::parse_subscribable(t).is_ok() && KeyWindow::parse(*base, keys).is_ok()
                }) && removes.iter().all(|t| Topic::parse_subscribable(t).is_ok());
                let all: Vec<&Vec<u8>> = adds.iter().map(|a| &a.0).chain(removes.iter()).collect();
                let distinct: std::collections::HashSet<_> = all.iter().collect();
                match parse_update(&inputs, &removes) {
                    Ok(update) => {
                        prop_assert!(each_ok && distinct.len() == all.len());
                        let added: Vec<(&[u8], bool)> =
                            update.adds.iter().map(|s| (s.topic.as_bytes(), s.include_commits)).collect();
                        let sent: Vec<(&[u8], bool)> = adds.iter().map(|a| (&a.0[..], a.3)).collect();
                        prop_assert_eq!(added, sent);
                        let removed: Vec<&[u8]> = update.removes.iter().map(Topic::as_bytes).collect();
                        let sent: Vec<&[u8]> = removes.iter().map(Vec::as_slice).collect();
                        prop_assert_eq!(removed, sent);
                    }
                    Err(AdmissionError::InvalidArgument(_)) => prop_assert!(!each_ok || distinct.len() < all.len()),
                    Err(other) => prop_assert!(false, "parse_update never answers {other:?}"),
                }
            }

            /// Row 1: exactly 32 bytes each, whatever else they hold.
            #[test]
            fn credentials_are_32_bytes(
                id in prop::collection::vec(any::<u8>(), 0..40),
                secret in prop::collection::vec(any::<u8>(), 0..40),
            ) {
                prop_assert_eq!(parse_credentials(&id, &secret).is_ok(), id.len() == 32 && secret.len() == 32);
            }
        }
    }
}
