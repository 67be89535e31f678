use aws_lc_rs::agreement::{ECDH_P256, ParsedPublicKey, UnparsedPublicKey};

use super::WebhookUrl;
use super::{ParseError, RelayRegistration};

/// Longest token or URL a registration may carry (spec 000 section 1, check 4).
pub const MAX_TARGET_LEN: usize = 2048;
pub const MIN_SIGNING_KEY_LEN: usize = 16;
pub const MAX_SIGNING_KEY_LEN: usize = 64;

/// The channels, one row each, and the one list every enumeration of them
/// derives from: the `Channel` enum here, `ChannelSettings` and
/// `Channels::build` in `crate::channel`, the metric slots (a row's
/// position). A row: the variant; its name (the `[engine.channels.<name>]`
/// table, the `channel` metric label, its folder `channel/<name>/`); its
/// wire number (proto `Channel`, PUSH-200); its storage tag (the byte both
/// stores keep, at most 127; never reused); whether it takes relayed pushes (spec 003
/// §2–3, spec 002 §5.2) besides envelopes; its settings; and what its
/// folder builds: a `provider` the delivery workers send through, or a
/// `sink` that takes its deliveries from dispatch into its own queue.
/// A row's attributes (`#[cfg(..)]`) go onto everything generated from it.
/// `for_each_channel!(m)` calls `m!` with the rows.
macro_rules! for_each_channel {
    ($then:ident) => {
        $then! {
            Apns apns wire 1 tag 1 relayed true: apns::ApnsSettings => provider apns::ApnsProvider;
            Fcm fcm wire 2 tag 2 relayed true: fcm::FcmSettings => provider fcm::FcmProvider;
            Http http wire 3 tag 3 relayed false: http::HttpSettings => provider http::WebhookProvider;
            Relay relay wire 4 tag 4 relayed false: relay::RelaySettings => sink relay::Relay;
            WebPush webpush wire 5 tag 5 relayed true: webpush::WebPushSettings => provider webpush::WebPushProvider;
            // Added as any channel is, for the engine's unit tests only: the
            // crates that link the engine build it without cfg(test), so the
            // proto has no value for it.
            #[cfg(test)]
            Probe probe wire 100 tag 100 relayed false: probe::ProbeSettings => provider probe::ProbeProvider;
        }
    };
}
pub(crate) use for_each_channel;

/// `Channel` and its lookups from the rows (`for_each_channel!`).
macro_rules! channel_enum {
    ($($(#[$meta:meta])* $variant:ident $name:ident wire $wire:literal tag $tag:literal relayed $relayed:literal: $settings:ty => $role:ident $built:ty;)*) => {
        /// How the backend reaches a recipient.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Channel {
            $($(#[$meta])* $variant,)*
        }

        impl Channel {
            /// Every channel, in the table's order. An array's elements take
            /// no `#[cfg]`, so it is filled slot by slot from `at_slot`.
            pub const ALL: &[Channel] = &{
                let mut all = [Self::at_slot(0).expect("the table has a row"); Self::COUNT];
                let mut slot = 1;
                while slot < Self::COUNT {
                    all[slot] = Self::at_slot(slot).expect("slots below COUNT are rows");
                    slot += 1;
                }
                all
            };

            /// How many rows this build has.
            const COUNT: usize = {
                let mut n = 0;
                while Self::at_slot(n).is_some() {
                    n += 1;
                }
                n
            };

            /// The channel whose metric slot is `slot`.
            const fn at_slot(slot: usize) -> Option<Self> {
                match slot {
                    $($(#[$meta])* s if s == Self::$variant as usize => Some(Self::$variant),)*
                    _ => None,
                }
            }

            /// From its wire number (proto `Channel`).
            pub fn from_wire(v: u8) -> Option<Self> {
                Self::ALL.iter().copied().find(|c| c.wire() == v)
            }

            pub fn wire(self) -> u8 {
                match self {
                    $($(#[$meta])* Self::$variant => $wire,)*
                }
            }

            /// From the byte the stores keep.
            pub fn from_storage_tag(v: u8) -> Option<Self> {
                Self::ALL.iter().copied().find(|c| c.storage_tag() == v)
            }

            pub fn storage_tag(self) -> u8 {
                match self {
                    $($(#[$meta])* Self::$variant => $tag,)*
                }
            }

            /// A bounded label value for metrics; the settings table's name.
            pub fn as_str(&self) -> &'static str {
                match self {
                    $($(#[$meta])* Self::$variant => stringify!($name),)*
                }
            }

            pub fn parse(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|c| c.as_str() == name)
            }

            /// Whether its row takes `Push::Relayed` besides envelopes.
            pub fn takes_relayed(self) -> bool {
                match self {
                    $($(#[$meta])* Self::$variant => $relayed,)*
                }
            }

            /// Its metric slot: its row's position.
            pub fn slot(self) -> usize {
                self as usize
            }
        }

        // The ScyllaDB store keeps a tag in a `tinyint` (engine/schema/scylla/001_init.cql).
        $($(#[$meta])* const _: () = assert!($tag <= i8::MAX as u8, concat!(stringify!($name), "'s tag does not fit a tinyint"));)*
    };
}

for_each_channel!(channel_enum);

/// A webhook signing key: 16 to 64 raw bytes (PUSH-256). Debug hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKey(Vec<u8>);

impl SigningKey {
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        if !(MIN_SIGNING_KEY_LEN..=MAX_SIGNING_KEY_LEN).contains(&bytes.len()) {
            return Err(ParseError("signing_key must be 16 to 64 bytes"));
        }
        Ok(Self(bytes.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

crate::domain::redacted_debug!(SigningKey);

/// A browser's Web Push subscription keys (RFC 8291 section 2): the user
/// agent's ECDH public key `p256dh`, an uncompressed P-256 point on the
/// curve, and its 16-byte authentication secret `auth`. Debug hides them.
#[derive(Clone, PartialEq, Eq)]
pub struct WebPushKeys {
    p256dh: [u8; WebPushKeys::P256DH_LEN],
    auth: [u8; WebPushKeys::AUTH_LEN],
}

impl WebPushKeys {
    pub const P256DH_LEN: usize = 65;
    pub const AUTH_LEN: usize = 16;

    pub fn parse(p256dh: &[u8], auth: &[u8]) -> Result<Self, ParseError> {
        const NOT_A_POINT: ParseError = ParseError("p256dh must be an uncompressed P-256 point of 65 bytes");
        let p256dh: [u8; Self::P256DH_LEN] = p256dh.try_into().map_err(|_| NOT_A_POINT)?;
        // 0x04: uncompressed (SEC 1 2.3.3); the parse checks the point is on the curve.
        let on_curve = ParsedPublicKey::try_from(UnparsedPublicKey::new(&ECDH_P256, &p256dh)).is_ok();
        if p256dh[0] != 0x04 || !on_curve {
            return Err(NOT_A_POINT);
        }
        let auth = auth.try_into().map_err(|_| ParseError("auth must be 16 bytes"))?;
        Ok(Self { p256dh, auth })
    }

    pub fn p256dh(&self) -> &[u8; Self::P256DH_LEN] {
        &self.p256dh
    }

    pub fn auth(&self) -> &[u8; Self::AUTH_LEN] {
        &self.auth
    }
}

crate::domain::redacted_debug!(WebPushKeys);

/// Where a recipient's pushes go. The URL of an `Http` target and the
/// endpoint of a `WebPush` one are kept parsed (`WebhookUrl`: the syntactic
/// rules of PUSH-256); the address checks run at every attempt.
#[derive(Clone, PartialEq, Eq)]
pub enum DeliveryTarget {
    Apns {
        token: String,
    },
    Fcm {
        token: String,
    },
    Http {
        url: WebhookUrl,
        signing_key: SigningKey,
    },
    /// A device's push route through the operator's push server (003 §1),
    /// `None` once the registration was removed (DELETE, or a 404/410 from
    /// the push server): the device keeps its subscriptions, gets no push,
    /// and a later PUT resumes its pushes.
    Relay(Option<RelayRegistration>),
    /// A browser's Web Push subscription: the push service's endpoint (an
    /// https URL that passed the syntactic webhook checks, PUSH-256) and
    /// its keys.
    WebPush {
        endpoint: WebhookUrl,
        keys: WebPushKeys,
    },
    /// The test-only probe channel's address: a token, stored as APNs and
    /// FCM tokens are, under its row's tag.
    #[cfg(test)]
    Probe {
        token: String,
    },
}

impl DeliveryTarget {
    pub fn channel(&self) -> Channel {
        match self {
            Self::Apns { .. } => Channel::Apns,
            Self::Fcm { .. } => Channel::Fcm,
            Self::Http { .. } => Channel::Http,
            Self::Relay(_) => Channel::Relay,
            Self::WebPush { .. } => Channel::WebPush,
            #[cfg(test)]
            Self::Probe { .. } => Channel::Probe,
        }
    }

    /// The host a push to this target reaches when it is one the recipient
    /// chose (a webhook's, a Web Push service's), for a breaker of its own:
    /// one such host's outage is not its channel's. `None` for a provider's
    /// own host (APNs, FCM), which the channel's breaker covers.
    pub fn destination_host(&self) -> Option<&str> {
        match self {
            Self::Http { url, .. } => Some(url.host()),
            Self::WebPush { endpoint, .. } => Some(endpoint.host()),
            _ => None,
        }
    }

    /// Compare-and-delete: whether a dead-token answer to a push sent to
    /// `sent` still applies to this, the stored target. Spec 000's channels
    /// (PUSH-234) need the whole target unchanged. A relay registration is
    /// removed "unless the device registered a different provider or token
    /// meanwhile" (003 §1, §2.4): only those two count, so a device that
    /// re-registered the dead token with another `sandbox` or `app_id`
    /// loses it all the same.
    pub fn still_names(&self, sent: &DeliveryTarget) -> bool {
        match (self, sent) {
            (Self::Relay(Some(now)), Self::Relay(Some(then))) => {
                now.provider() == then.provider() && now.token() == then.token()
            }
            (now, then) => now == then,
        }
    }

    /// Admission check 4 for an APNs or FCM token.
    pub fn check_token(token: &str) -> Result<(), ParseError> {
        check_text(token, ["token is empty", "token is longer than 2048 characters", "token contains a NUL character"])
    }

    /// Admission check 4 for a webhook URL, before the safety checks.
    pub fn check_url_text(url: &str) -> Result<(), ParseError> {
        check_text(url, ["url is empty", "url is longer than 2048 characters", "url contains a NUL character"])
    }

    /// Admission check 4 for a Web Push endpoint: the webhook URL's rule,
    /// naming the field the caller sent (WebPushDelivery.endpoint).
    pub fn check_endpoint_text(endpoint: &str) -> Result<(), ParseError> {
        check_text(
            endpoint,
            ["endpoint is empty", "endpoint is longer than 2048 characters", "endpoint contains a NUL character"],
        )
    }
}

/// Not empty, at most 2048 characters, no NUL (spec 000 section 1, check 4).
fn check_text(text: &str, [empty, long, nul]: [&'static str; 3]) -> Result<(), ParseError> {
    if text.is_empty() {
        return Err(ParseError(empty));
    }
    if text.chars().count() > MAX_TARGET_LEN {
        return Err(ParseError(long));
    }
    if text.contains('\0') {
        return Err(ParseError(nul));
    }
    Ok(())
}

impl std::fmt::Debug for DeliveryTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeliveryTarget({:?}, ..)", self.channel())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_every_lookup_both_ways() {
        let names: Vec<_> = Channel::ALL.iter().map(|c| c.as_str()).collect();
        // The last row is the test builds' probe (`channel/probe/`).
        assert_eq!(names, ["apns", "fcm", "http", "relay", "webpush", "probe"]);
        assert_eq!((Channel::Probe.wire(), Channel::Probe.storage_tag(), Channel::Probe.slot()), (100, 100, 5));
        for (slot, &c) in Channel::ALL.iter().enumerate() {
            assert_eq!(c.slot(), slot, "a row's slot is its position");
            assert_eq!(Channel::from_wire(c.wire()), Some(c));
            assert_eq!(Channel::from_storage_tag(c.storage_tag()), Some(c));
            assert_eq!(Channel::parse(c.as_str()), Some(c));
        }
        let relayed: Vec<_> = Channel::ALL.iter().filter(|c| c.takes_relayed()).map(|c| c.as_str()).collect();
        assert_eq!(relayed, ["apns", "fcm", "webpush"]);
    }

    #[test]
    fn signing_key_bounds() {
        assert!(SigningKey::parse(&[0; 15]).is_err());
        assert!(SigningKey::parse(&[0; 16]).is_ok());
        assert!(SigningKey::parse(&[0; 64]).is_ok());
        assert!(SigningKey::parse(&[0; 65]).is_err());
    }

    #[test]
    fn web_push_keys_are_a_point_on_the_curve_and_16_bytes() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(s).unwrap();
        // RFC 8291 appendix A's user agent.
        let p256dh = b64("BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4");
        let auth = b64("BTBZMqHH6r4Tts7J_aSIgg");
        let keys = WebPushKeys::parse(&p256dh, &auth).unwrap();
        assert_eq!((&keys.p256dh()[..], &keys.auth()[..]), (&p256dh[..], &auth[..]));
        assert_eq!(format!("{keys:?}"), "WebPushKeys(..)");
        let point = "p256dh must be an uncompressed P-256 point of 65 bytes";
        assert_eq!(WebPushKeys::parse(&p256dh[..64], &auth), Err(ParseError(point)));
        let mut off_curve = p256dh.clone();
        off_curve[64] ^= 1;
        assert_eq!(WebPushKeys::parse(&off_curve, &auth), Err(ParseError(point)));
        let mut compressed_tag = p256dh.clone();
        compressed_tag[0] = 0x02;
        assert_eq!(WebPushKeys::parse(&compressed_tag, &auth), Err(ParseError(point)));
        assert_eq!(WebPushKeys::parse(&[0; 65], &auth), Err(ParseError(point)));
        assert_eq!(WebPushKeys::parse(&p256dh, &auth[..15]), Err(ParseError("auth must be 16 bytes")));
        assert_eq!(WebPushKeys::parse(&p256dh, &[0; 17]), Err(ParseError("auth must be 16 bytes")));
    }

    #[test]
    fn target_text_rules() {
        assert!(DeliveryTarget::check_token("").is_err());
        assert!(DeliveryTarget::check_token("a\0b").is_err());
        assert!(DeliveryTarget::check_token(&"é".repeat(2048)).is_ok());
        assert!(DeliveryTarget::check_url_text(&"a".repeat(2049)).is_err());
    }

    #[test]
    fn a_relay_registration_is_still_named_while_its_provider_and_token_are() {
        use crate::domain::{RegistrationInput, RelayRegistration};
        let relay = |provider, token, sandbox, app_id| {
            let input = RegistrationInput { provider, token, sandbox, app_id, ..Default::default() };
            DeliveryTarget::Relay(Some(RelayRegistration::parse(input).unwrap()))
        };
        let sent = relay("apns", "tok-1", None, None);
        assert!(sent.still_names(&sent));
        assert!(relay("apns", "tok-1", Some(true), None).still_names(&sent), "only sandbox changed");
        assert!(relay("apns", "tok-1", Some(false), Some("im.g.apps")).still_names(&sent), "only app_id changed");
        assert!(!relay("apns", "tok-2", None, None).still_names(&sent), "another token");
        assert!(!relay("fcm", "tok-1", None, None).still_names(&sent), "another provider");
        // Spec 000's channels compare the whole target (PUSH-234).
        let apns = DeliveryTarget::Apns { token: "tok-1".into() };
        assert!(apns.still_names(&apns));
        assert!(!apns.still_names(&DeliveryTarget::Fcm { token: "tok-1".into() }));
        assert!(!apns.still_names(&sent) && !sent.still_names(&apns));
        let removed = DeliveryTarget::Relay(None);
        assert!(!removed.still_names(&sent), "removed already: nothing left to remove");
    }

    #[test]
    fn web_push_endpoint_errors_name_the_endpoint() {
        let e = |text: &str| DeliveryTarget::check_endpoint_text(text).unwrap_err().0;
        assert_eq!(e(""), "endpoint is empty");
        assert_eq!(e(&"a".repeat(2049)), "endpoint is longer than 2048 characters");
        assert_eq!(e("https://push.example.net/\0"), "endpoint contains a NUL character");
        assert!(DeliveryTarget::check_endpoint_text(&"é".repeat(2048)).is_ok());
    }

    /// Device tokens, webhook URL text and signing keys, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Not empty, at most 2048 characters, no NUL: the same rule for
            /// tokens and URLs, whatever the text.
            #[test]
            fn target_text_follows_the_rule(text in "\\PC{0,40}|[a-z\\x00]{0,8}|.{2040,2060}") {
                let valid = !text.is_empty() && text.chars().count() <= 2048 && !text.contains('\0');
                prop_assert_eq!(DeliveryTarget::check_token(&text).is_ok(), valid);
                prop_assert_eq!(DeliveryTarget::check_url_text(&text).is_ok(), valid);
                prop_assert_eq!(DeliveryTarget::check_endpoint_text(&text).is_ok(), valid);
            }

            #[test]
            fn signing_keys_are_16_to_64_bytes(key in prop::collection::vec(any::<u8>(), 0..80)) {
                prop_assert_eq!(SigningKey::parse(&key).is_ok(), (16..=64).contains(&key.len()));
            }
        }
    }
}
