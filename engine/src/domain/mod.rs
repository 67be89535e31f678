//! The domain: types that can only hold valid values. Parse at the edge, trust inside.

mod channel;
mod envelope;
mod epoch;
mod gateway;
mod gateway_ids;
mod ids;
mod parked;
mod progress;
mod recipient;
mod registration;
mod relay;
mod sender_hmac;
mod sequence;
mod subscription;
mod time;
mod topic;
mod webhook_url;

pub(crate) use channel::for_each_channel;
pub use channel::{Channel, DeliveryTarget, SigningKey, WebPushKeys};
pub use envelope::{
    EnvelopeKind, MAX_INLINE_DATA, MAX_MESSAGE_ID_LEN, MembershipChange, MessageId, NewEnvelope, RelayMeta,
    StoredEnvelope,
};
pub use epoch::{HMAC_EPOCH_SECONDS, hmac_epoch};
pub use gateway::{GatewayRegistration, GatewayWakeup, LeasedWakeup, NotifyClaim, NotifyKey, Revoke, RouteKey};
pub(crate) use gateway_ids::visible_ascii;
pub use gateway_ids::{
    AccountId, DEVICE_PREFIX, DeviceId, IdError, IdempotencyKey, PUSH_TARGET_PREFIX, PushRouteId, PushTargetId,
    RegistrationId, SaltEpochId, ServiceId,
};
pub use ids::{RecipientId, RecipientSecret, SecretHash};
pub use parked::{ParkedDelivery, ParkedKey, ParkedPlace};
pub use progress::{Answered, Partly, ShardProgress};
pub use recipient::{Recipient, RecipientSummary, Subscriber};
pub use registration::{FieldError, LOG_PROVIDER, RegistrationInput, RelayRegistration};
pub use relay::{RelayClaim, RelayKey, RelaySettled};
pub use sender_hmac::SenderHmac;
pub use sequence::{MAX_SEQUENCE_GAP, MAX_SEQUENCE_ID, SequenceRefusal, next_sequence_id};
pub use subscription::{
    HMAC_KEY_LEN, HmacKey, KeyWindow, MAX_HMAC_KEYS, StoredSubscription, Subscription, SubscriptionUpdate,
};
pub use time::{Clock, SystemClock, Timestamp};
pub use topic::{ShardId, Topic, TopicKind};
pub(crate) use webhook_url::is_host_name;
pub use webhook_url::{UrlError, WebhookUrl};

/// `Debug` that prints the type's name only, for values that hold a secret,
/// a token, an address or an id that must not reach a log line (PUSH-254).
macro_rules! redacted_debug {
    ($name:ident) => {
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(concat!(stringify!($name), "(..)"))
            }
        }
    };
}
pub(crate) use redacted_debug;

/// Why a value from outside failed to parse. Messages never echo the value
/// itself: ids, topics and secrets stay out of status messages (PUSH-254).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub &'static str);
