//! What the client keeps locally (spec 000 §8): the notification state, the
//! channel and its target, the rules, the uploaded set, overrides, and the
//! last RecipientState's expiry. One value, saved whole by a
//! [`StateStore`](crate::store::StateStore).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind};
use crate::identity::RecipientIdentity;
use crate::sender_key::RootKeyId;
use crate::topic::{GroupId, Topic};

/// The notification state an app reads without a backend call (PUSH-263).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "state", content = "cause")]
pub enum NotificationState {
    #[default]
    Disabled,
    Enabled,
    /// A terminal status of PUSH-262: no request until the app enables again.
    Failed(FailureCause),
}

/// The statuses that fail the state (PUSH-262), each its own cause (PUSH-251).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureCause {
    PermissionDenied,
    InvalidArgument,
    OutOfRange,
    Unimplemented,
    FailedPrecondition,
    /// FAILED_PRECONDITION on Register: no table for the channel (PUSH-210).
    ChannelNotConfigured,
}

impl FailureCause {
    /// The cause for an error kind, when that kind fails the state.
    pub fn of(kind: ErrorKind) -> Option<FailureCause> {
        Some(match kind {
            ErrorKind::PermissionDenied => FailureCause::PermissionDenied,
            ErrorKind::InvalidArgument => FailureCause::InvalidArgument,
            ErrorKind::OutOfRange => FailureCause::OutOfRange,
            ErrorKind::Unimplemented => FailureCause::Unimplemented,
            ErrorKind::FailedPrecondition => FailureCause::FailedPrecondition,
            ErrorKind::ChannelNotConfigured => FailureCause::ChannelNotConfigured,
            _ => return None,
        })
    }

    pub fn kind(self) -> ErrorKind {
        match self {
            FailureCause::PermissionDenied => ErrorKind::PermissionDenied,
            FailureCause::InvalidArgument => ErrorKind::InvalidArgument,
            FailureCause::OutOfRange => ErrorKind::OutOfRange,
            FailureCause::Unimplemented => ErrorKind::Unimplemented,
            FailureCause::FailedPrecondition => ErrorKind::FailedPrecondition,
            FailureCause::ChannelNotConfigured => ErrorKind::ChannelNotConfigured,
        }
    }
}

/// The channel and its delivery target. The app supplies it: only the app
/// holds a platform token or operates a receiver (spec 000 §9).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "channel")]
pub enum DeliveryTarget {
    Apns {
        token: String,
    },
    Fcm {
        token: String,
    },
    /// A signed HTTPS webhook: the URL and a 16 to 64 byte signing key.
    Http {
        url: String,
        #[serde(with = "hex_bytes")]
        signing_key: Vec<u8>,
    },
}

/// The bounds of HttpDelivery.signing_key (PUSH-256, PUSH-261).
pub const SIGNING_KEY_BYTES: std::ops::RangeInclusive<usize> = 16..=64;

impl DeliveryTarget {
    /// PUSH-261's local check: an HTTPS signing key of 16 to 64 bytes.
    pub fn validate(&self) -> Result<(), Error> {
        if let DeliveryTarget::Http { signing_key, .. } = self
            && !SIGNING_KEY_BYTES.contains(&signing_key.len())
        {
            return Err(Error::new(
                ErrorKind::InvalidSigningKey,
                format!("a webhook signing key must be 16 to 64 bytes, not {}", signing_key.len()),
            ));
        }
        Ok(())
    }

    pub fn channel_name(&self) -> &'static str {
        match self {
            DeliveryTarget::Apns { .. } => "apns",
            DeliveryTarget::Fcm { .. } => "fcm",
            DeliveryTarget::Http { .. } => "http",
        }
    }
}

// Tokens, URLs and keys say whose device this is: never printed (PUSH-254).
impl std::fmt::Debug for DeliveryTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeliveryTarget({})", self.channel_name())
    }
}

/// A conversation's consent state (CONS, out of this spec's scope: the host
/// owns it; the client only reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConsentState {
    Unknown,
    Allowed,
    Denied,
}

/// The subscription rules of PUSH-238 and PUSH-263, every one set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rules {
    pub consent_states: BTreeSet<ConsentState>,
    pub include_welcomes: bool,
    pub include_sync_groups: bool,
    pub include_commits: bool,
}

impl Default for Rules {
    /// PUSH-263's defaults: consent_states = [allowed], include_welcomes,
    /// no sync groups, no commits.
    fn default() -> Rules {
        Rules {
            consent_states: BTreeSet::from([ConsentState::Allowed]),
            include_welcomes: true,
            include_sync_groups: false,
            include_commits: false,
        }
    }
}

/// Rules as an app gives them: an omitted rule takes its PUSH-263 default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleOptions {
    pub consent_states: Option<BTreeSet<ConsentState>>,
    pub include_welcomes: Option<bool>,
    pub include_sync_groups: Option<bool>,
    pub include_commits: Option<bool>,
}

impl RuleOptions {
    pub fn resolve(self) -> Rules {
        let defaults = Rules::default();
        Rules {
            consent_states: self.consent_states.unwrap_or(defaults.consent_states),
            include_welcomes: self.include_welcomes.unwrap_or(defaults.include_welcomes),
            include_sync_groups: self.include_sync_groups.unwrap_or(defaults.include_sync_groups),
            include_commits: self.include_commits.unwrap_or(defaults.include_commits),
        }
    }
}

/// A per-conversation override: it replaces the rules for that conversation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Override {
    Enabled,
    Disabled,
}

/// What the client sent for one uploaded topic (the uploaded set's entry).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadedSubscription {
    /// hmac_epoch_base of the sent key window; `None` when no keys were sent
    /// (a welcome topic, or a group before its root key arrived).
    pub hmac_epoch_base: Option<i64>,
    /// Which root key the window derived from.
    pub root_key_id: Option<RootKeyId>,
    pub include_commits: bool,
    /// False while the request carrying it has not been answered: written
    /// before the request, so a crash mid-request leaves the topic marked to
    /// be sent again rather than unknown to the client.
    pub confirmed: bool,
}

/// The renewal times of the last RecipientState (PUSH-255, PUSH-260).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewal {
    /// When the client received it, by its clock (Unix ns).
    pub received_at_ns: i64,
    /// The backend's expires_at_ns.
    pub expires_at_ns: i64,
}

impl Renewal {
    /// Renew at the midpoint between receipt and expiry, so a run that is
    /// late by up to half the TTL still renews in time; at once when the
    /// backend's clock or TTL leaves no room.
    pub fn due_at_ns(&self) -> i64 {
        let remaining = self.expires_at_ns.saturating_sub(self.received_at_ns).max(0);
        self.received_at_ns.saturating_add(remaining / 2)
    }
}

/// Everything the client stores, saved whole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredState {
    /// Created at the first enable, kept for ever (PUSH-201).
    pub identity: Option<RecipientIdentity>,
    pub state: NotificationState,
    pub target: Option<DeliveryTarget>,
    pub rules: Rules,
    /// The uploaded set: every topic sent as an add and not since removed.
    pub uploaded: BTreeMap<Topic, UploadedSubscription>,
    /// Kept across disable and enable (PUSH-261).
    pub overrides: BTreeMap<GroupId, Override>,
    /// Whether Register succeeded since the last enable or NOT_FOUND.
    pub registered: bool,
    pub renewal: Option<Renewal>,
    /// A topic_count mismatch was seen: later runs re-send every desired topic
    /// (PUSH-260), keeping the uploaded set.
    pub resend_all: bool,
    /// RESOURCE_EXHAUSTED answered an add: no adds while the desired set's
    /// digest is still this one (PUSH-262).
    #[serde(with = "hex_option32", default)]
    pub adds_blocked_for: Option<[u8; 32]>,
    /// When the last sync run ended (Unix ns), for the hourly run.
    pub last_sync_end_ns: Option<i64>,
}

impl StoredState {
    /// The size of the uploaded set as the backend should count it, or None
    /// while some entry's request is unanswered (then no count is known).
    pub fn confirmed_count(&self) -> Option<u64> {
        self.uploaded.values().all(|s| s.confirmed).then_some(self.uploaded.len() as u64)
    }
}

mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        hex::decode(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

mod hex_option32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<[u8; 32]>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_some(&hex::encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<[u8; 32]>, D::Error> {
        let Some(text) = Option::<String>::deserialize(d)? else { return Ok(None) };
        let mut out = [0; 32];
        hex::decode_to_slice(text, &mut out).map_err(serde::de::Error::custom)?;
        Ok(Some(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn omitted_rules_take_the_push_263_defaults() {
        let rules = RuleOptions::default().resolve();
        assert_eq!(rules.consent_states, BTreeSet::from([ConsentState::Allowed]));
        assert!(rules.include_welcomes);
        assert!(!rules.include_sync_groups);
        assert!(!rules.include_commits);
        let rules = RuleOptions { include_commits: Some(true), ..RuleOptions::default() }.resolve();
        assert!(rules.include_commits);
        assert!(rules.include_welcomes);
    }

    #[test]
    fn signing_keys_of_15_and_65_bytes_are_refused() {
        let http = |n| DeliveryTarget::Http { url: "https://h.example/x".into(), signing_key: vec![1; n] };
        for n in [0, 15, 65] {
            assert_eq!(http(n).validate().unwrap_err().kind(), ErrorKind::InvalidSigningKey, "{n}");
        }
        for n in [16, 64] {
            assert!(http(n).validate().is_ok(), "{n}");
        }
        assert!(DeliveryTarget::Apns { token: "t".into() }.validate().is_ok());
    }

    #[test]
    fn the_stored_state_round_trips_through_json() {
        let mut state = StoredState {
            identity: Some(RecipientIdentity::from_parts([1; 32], [2; 32])),
            state: NotificationState::Failed(FailureCause::ChannelNotConfigured),
            target: Some(DeliveryTarget::Http { url: "https://h.example/x".into(), signing_key: vec![3; 16] }),
            adds_blocked_for: Some([4; 32]),
            renewal: Some(Renewal { received_at_ns: 10, expires_at_ns: 30 }),
            ..StoredState::default()
        };
        state.overrides.insert(GroupId::new(vec![5]).unwrap(), Override::Disabled);
        state.uploaded.insert(
            GroupId::new(vec![6]).unwrap().topic(),
            UploadedSubscription {
                hmac_epoch_base: Some(654),
                root_key_id: None,
                include_commits: true,
                confirmed: true,
            },
        );
        let json = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<StoredState>(&json).unwrap(), state);
    }

    #[test]
    fn renewal_is_due_halfway_to_expiry() {
        assert_eq!(Renewal { received_at_ns: 100, expires_at_ns: 300 }.due_at_ns(), 200);
        assert_eq!(Renewal { received_at_ns: 100, expires_at_ns: 50 }.due_at_ns(), 100);
    }

    #[test]
    fn no_count_is_known_while_a_request_is_unanswered() {
        let mut state = StoredState::default();
        let sub = |confirmed| UploadedSubscription {
            hmac_epoch_base: None,
            root_key_id: None,
            include_commits: false,
            confirmed,
        };
        state.uploaded.insert(GroupId::new(vec![1]).unwrap().topic(), sub(true));
        assert_eq!(state.confirmed_count(), Some(1));
        state.uploaded.insert(GroupId::new(vec![2]).unwrap().topic(), sub(false));
        assert_eq!(state.confirmed_count(), None);
    }

    #[test]
    fn targets_never_print_their_token_url_or_key() {
        let t = DeliveryTarget::Http { url: "https://secret.example/x".into(), signing_key: vec![3; 16] };
        assert_eq!(format!("{t:?}"), "DeliveryTarget(http)");
    }
}
