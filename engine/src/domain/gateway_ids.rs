//! Spec 002's ids as a request names them and the gateway's records keep
//! them: `DeviceId`, `AccountId`, service DIDs, `SaltEpochId`,
//! `PushRouteId`, the pairwise pseudonym `PushTargetId` (§2.2), the opaque
//! `RegistrationId` (§3.1) and the `Idempotency-Key` (§5.2). Deriving a
//! pseudonym or a fresh registration id is the gateway's
//! (`gateway/identity.rs`); here each only parses strictly and is valid once
//! built.
//!
//! None of their `Debug` output shows a personal value, and error messages
//! name the rule, never the value (ids are personal data: they stay out of
//! logs and error bodies).

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// §2.2: the wire prefix of a push target pseudonym.
pub const PUSH_TARGET_PREFIX: &str = "ak:pseudonym:push:";
/// §3.1: the prefix of a typed device id.
pub const DEVICE_PREFIX: &str = "ak:device:";

/// Why an id was refused. The message names the rule only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("push_target_id must be \"ak:pseudonym:push:\" and the canonical unpadded base64url of 32 octets")]
    PushTarget,
    #[error("device_id must be \"ak:device:\" and a lowercase UUIDv7")]
    Device,
    #[error("account ids are 1 to 255 visible ASCII characters")]
    Account,
    #[error("service ids are 1 to 255 visible ASCII characters")]
    Service,
    #[error("salt epoch ids are 1 to 64 characters of A-Z a-z 0-9 . _ -")]
    SaltEpoch,
    #[error("push_route_id must be fcm_main, apns_main or apns_sandbox")]
    PushRoute,
    #[error("registration_id must be 22 to 128 base64url characters, never \"ak:\"-prefixed")]
    Registration,
    #[error("Idempotency-Key is 1 to 255 visible ASCII characters")]
    IdempotencyKey,
}

/// Visible ASCII (0x21..=0x7E), 1 to `max` bytes: the shape of the opaque ids
/// and header values spec 002 leaves unspecified.
pub(crate) fn visible_ascii(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len()) && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// An id held as its text: `parse`, `as_str`, `FromStr`, `Display` and serde
/// as that text, and a `Debug` that shows the value only when it is not
/// personal (`shown`; `hidden` ids show none of it).
macro_rules! string_id {
    (@debug hidden, $f:expr, $name:ident, $value:expr) => {
        write!($f, "{}(..)", stringify!($name))
    };
    (@debug shown, $f:expr, $name:ident, $value:expr) => {
        write!($f, "{}({})", stringify!($name), $value)
    };
    ($(#[$doc:meta])* $name:ident, $check:expr, $err:expr, $debug:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: &str) -> Result<Self, IdError> {
                let check: fn(&str) -> bool = $check;
                if check(s) { Ok(Self(s.to_owned())) } else { Err($err) }
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl FromStr for $name {
            type Err = IdError;

            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::parse(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                string_id!(@debug $debug, f, $name, self.0)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

string_id!(
    /// §3.1 `device_id`: `ak:device:<uuidv7>`. Compared byte for byte (§3.2),
    /// so only the lowercase canonical text form is accepted: an uppercase
    /// twin would be a second id for the same device.
    DeviceId,
    is_device_id,
    IdError::Device,
    hidden
);

string_id!(
    /// The complete AccountId of the authenticated session (§3.1): an input
    /// of the pseudonym, never taken from a body. Opaque to the gateway.
    AccountId,
    |s| visible_ascii(s, 255),
    IdError::Account,
    hidden
);

string_id!(
    /// A service DID as carried by `Source-Service-ID` / `Destination-Service-ID`
    /// (§5.1) and named in the settings; the tenant of every gateway record
    /// (§3.4). Opaque; compared byte for byte.
    ServiceId,
    |s| visible_ascii(s, 255),
    IdError::Service,
    shown
);

string_id!(
    /// `salt_epoch_id` (§2.2): names the secret a pseudonym was derived under.
    SaltEpochId,
    |s| (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
    IdError::SaltEpoch,
    shown
);

string_id!(
    /// §3.1 `registration_id`: opaque, at least 128 bits of entropy, never
    /// `ak:`-prefixed, encoding nothing. Any opaque id of the base64url
    /// alphabet from 22 characters (128 bits) to 128 parses; fanout's own
    /// are 43 (`RegistrationId::generate`).
    RegistrationId,
    |s| {
        let alphabet = s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        (22..=128).contains(&s.len()) && alphabet && !s.starts_with("ak:")
    },
    IdError::Registration,
    hidden
);

string_id!(
    /// An `Idempotency-Key` (§5.2). Reading: an opaque value of 1 to 255
    /// visible ASCII characters, compared byte for byte (a structured-field
    /// string's quotes are part of it).
    IdempotencyKey,
    |s| visible_ascii(s, 255),
    IdError::IdempotencyKey,
    hidden
);

/// `ak:device:` + `xxxxxxxx-xxxx-7xxx-[89ab]xxx-xxxxxxxxxxxx`, lowercase hex.
fn is_device_id(s: &str) -> bool {
    let Some(uuid) = s.strip_prefix(DEVICE_PREFIX) else { return false };
    let b = uuid.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, &c)| match i {
            8 | 13 | 18 | 23 => c == b'-',
            _ => matches!(c, b'0'..=b'9' | b'a'..=b'f'),
        })
        // RFC 9562: version nibble 7, variant 10xx.
        && b[14] == b'7'
        && matches!(b[19], b'8' | b'9' | b'a' | b'b')
}

/// `push_route_id` (§2.2's third input): the provider route a registration
/// uses. Reading (docs/GATEWAY.md): one route per provider environment, named
/// `fcm_main`, `apns_main`, `apns_sandbox` (the checklist's vector uses
/// `fcm_main`); a token rotation on the same route keeps the pseudonym.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, strum::IntoStaticStr, strum::EnumString)]
#[strum(serialize_all = "snake_case")]
pub enum PushRouteId {
    FcmMain,
    ApnsMain,
    ApnsSandbox,
}

impl PushRouteId {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Result<Self, IdError> {
        s.parse().map_err(|_| IdError::PushRoute)
    }
}

/// §2.2 `push_target_id`: the full 32-octet HMAC tag, on the wire as
/// `ak:pseudonym:push:` + canonical unpadded base64url (43 characters).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PushTargetId([u8; 32]);

impl PushTargetId {
    /// Strict (§2.2 "接收方 MUST 解码恰好 32 octets 并执行 canonical 重编码校验"):
    /// the prefix, unpadded base64url of exactly 32 octets, and the text must
    /// be the re-encoding of those octets (the `…sm9` twin of `…sm8` decodes
    /// leniently to the same bytes and is refused).
    pub fn parse(s: &str) -> Result<Self, IdError> {
        let b64 = s.strip_prefix(PUSH_TARGET_PREFIX).ok_or(IdError::PushTarget)?;
        if b64.len() != 43 {
            return Err(IdError::PushTarget);
        }
        let bytes = URL_SAFE_NO_PAD.decode(b64).map_err(|_| IdError::PushTarget)?;
        let tag: [u8; 32] = bytes.try_into().map_err(|_| IdError::PushTarget)?;
        // The engine refuses non-zero trailing bits already; the re-encoding
        // comparison is the spec's own rule and does not depend on that.
        if URL_SAFE_NO_PAD.encode(tag) != b64 {
            return Err(IdError::PushTarget);
        }
        Ok(Self(tag))
    }

    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    pub fn from_bytes(tag: [u8; 32]) -> Self {
        Self(tag)
    }
}

impl fmt::Display for PushTargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(PUSH_TARGET_PREFIX)?;
        f.write_str(&URL_SAFE_NO_PAD.encode(self.0))
    }
}

crate::domain::redacted_debug!(PushTargetId);

impl FromStr for PushTargetId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, IdError> {
        Self::parse(s)
    }
}

impl Serialize for PushTargetId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PushTargetId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's example pseudonym (§5.1) and its non-canonical twin.
    const SPEC_EXAMPLE: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
    const SPEC_EXAMPLE_TWIN: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm9";
    const DEVICE: &str = "ak:device:01964137-0000-7000-8000-000000000000";

    #[test]
    fn the_spec_example_is_canonical_and_its_twin_is_refused() {
        let id = PushTargetId::parse(SPEC_EXAMPLE).unwrap();
        assert_eq!(id.to_string(), SPEC_EXAMPLE);
        assert_eq!(hex::encode(id.as_bytes()), "928b1cf6243881572dd4e07e6fa5f7eb8588148b091556d5ce7ec1301b35b26f");
        // A lenient decoder maps the twin to the same 32 octets; the
        // re-encoding differs, so it is refused.
        let lenient = base64::engine::GeneralPurpose::new(
            &base64::alphabet::URL_SAFE,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_allow_trailing_bits(true)
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireNone),
        );
        let twin_bytes = lenient.decode(&SPEC_EXAMPLE_TWIN[PUSH_TARGET_PREFIX.len()..]).unwrap();
        assert_eq!(twin_bytes, id.as_bytes());
        assert_eq!(PushTargetId::parse(SPEC_EXAMPLE_TWIN), Err(IdError::PushTarget));
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{SPEC_EXAMPLE}\""));
        assert_eq!(serde_json::from_str::<PushTargetId>(&format!("\"{SPEC_EXAMPLE}\"")).unwrap(), id);
    }

    #[test]
    fn malformed_push_target_ids_are_refused() {
        let b64 = &SPEC_EXAMPLE[PUSH_TARGET_PREFIX.len()..];
        for bad in [
            String::new(),
            b64.to_owned(),                                                     // no prefix
            format!("ak:pseudonym:push:{b64}="),                                // padded
            format!("ak:pseudonym:push:{}", &b64[..42]),                        // 31.5 octets
            format!("ak:pseudonym:push:{b64}AA"),                               // 33 octets
            format!("ak:pseudonym:push:{}", b64.replace('-', "+")),             // standard alphabet
            format!("AK:pseudonym:push:{b64}"),                                 // prefix case
            format!("ak:pseudonym:push: {}", &b64[1..]),                        // space
            format!("ak:pseudonym:push:{}", URL_SAFE_NO_PAD.encode([0u8; 16])), // raw 16
        ] {
            assert_eq!(PushTargetId::parse(&bad), Err(IdError::PushTarget), "{bad}");
        }
        assert!(serde_json::from_str::<PushTargetId>("\"ak:pseudonym:push:x\"").is_err());
    }

    #[test]
    fn device_ids_are_strict_uuidv7() {
        for good in
            [DEVICE, "ak:device:0192f3a1-4c2b-7d5e-9f10-2a3b4c5d6e7f", "ak:device:0192f3a1-4c2b-7d5e-b021-3c4d5e6f7a8b"]
        {
            assert_eq!(DeviceId::parse(good).unwrap().as_str(), good);
        }
        for bad in [
            "",
            "01964137-0000-7000-8000-000000000000",            // no prefix
            "ak:device:01964137-0000-4000-8000-000000000000",  // v4
            "ak:device:01964137-0000-7000-c000-000000000000",  // variant 110x
            "ak:device:01964137-0000-7000-8000-00000000000",   // short
            "ak:device:01964137-0000-7000-8000-0000000000000", // long
            "ak:device:01964137000070008000000000000000",      // no hyphens
            "ak:device:0192F3A1-4C2B-7D5E-9F10-2A3B4C5D6E7F",  // uppercase
            "ak:device:{01964137-0000-7000-8000-000000000000}",
            "ak:Device:01964137-0000-7000-8000-000000000000",
            "ak:device:01964137-0000-7000-8000-00000000000g",
            "ak:device:01964137_0000-7000-8000-000000000000",
        ] {
            assert_eq!(DeviceId::parse(bad), Err(IdError::Device), "{bad}");
        }
        assert_eq!(format!("{:?}", DeviceId::parse(DEVICE).unwrap()), "DeviceId(..)");
    }

    #[test]
    fn registration_ids_are_opaque_base64url_and_never_ak() {
        for bad in ["", "ak:0123456789abcdefghijklmnop", "short", "has space 0123456789abcdefgh", "ak:registration:x"] {
            assert_eq!(RegistrationId::parse(bad), Err(IdError::Registration), "{bad}");
        }
        assert_eq!(RegistrationId::parse(&"a".repeat(129)), Err(IdError::Registration));
        let id = RegistrationId::parse(&"a".repeat(22)).unwrap();
        assert_eq!(format!("{id:?}"), "RegistrationId(..)");
    }

    #[test]
    fn opaque_ids_are_visible_ascii() {
        assert!(ServiceId::parse("did:web:station.example").is_ok());
        assert_eq!(ServiceId::parse(""), Err(IdError::Service));
        assert_eq!(ServiceId::parse("did:web:a b"), Err(IdError::Service));
        assert_eq!(ServiceId::parse(&"x".repeat(256)), Err(IdError::Service));
        assert_eq!(AccountId::parse("ak:account:é"), Err(IdError::Account));
        assert_eq!(SaltEpochId::parse("e 1"), Err(IdError::SaltEpoch));
        assert_eq!(SaltEpochId::parse("2026-05.a_b").unwrap().as_str(), "2026-05.a_b");
        assert_eq!(PushRouteId::parse("fcm_main"), Ok(PushRouteId::FcmMain));
        assert_eq!(PushRouteId::parse("fcm"), Err(IdError::PushRoute));
        assert!(IdempotencyKey::parse(&"k".repeat(255)).is_ok());
        assert_eq!(IdempotencyKey::parse("a key"), Err(IdError::IdempotencyKey));
    }
}
