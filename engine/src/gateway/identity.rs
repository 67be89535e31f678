//! Spec 002's identities: the typed ids a request names (`DeviceId`,
//! `AccountId`, service DIDs), the pairwise pseudonym `PushTargetId` (§2.2)
//! with the per-epoch secrets it is derived under, the opaque
//! `RegistrationId` (§3.1) and the per-window collapse key (§2.4).
//!
//! Every type here parses strictly and is valid once built; none of their
//! `Debug` output shows a secret, and error messages name the rule, never the
//! value (ids are personal data: they stay out of logs and error bodies).

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::Sha256;

use super::jcs;

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
    #[error("registration_id must be 22 to 128 base64url characters, never \"ak:\"-prefixed")]
    Registration,
}

/// Visible ASCII (0x21..=0x7E), 1 to `max` bytes: the shape of the opaque ids
/// and header values spec 002 leaves unspecified.
pub(crate) fn visible_ascii(s: &str, max: usize) -> bool {
    (1..=max).contains(&s.len()) && s.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $check:expr, $err:expr) => {
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
    /// twin would be a second id for the same device. Debug shows nothing of
    /// it (personal data).
    DeviceId,
    is_device_id,
    IdError::Device
);

string_id!(
    /// The complete AccountId of the authenticated session (§3.1): an input
    /// of the pseudonym, never taken from a body. Opaque to the gateway.
    AccountId,
    |s| visible_ascii(s, 255),
    IdError::Account
);

string_id!(
    /// A service DID as carried by `Source-Service-ID` / `Destination-Service-ID`
    /// (§5.1) and named in the settings. Opaque; compared byte for byte.
    ServiceId,
    |s| visible_ascii(s, 255),
    IdError::Service
);

string_id!(
    /// `salt_epoch_id` (§2.2): names the secret a pseudonym was derived under.
    SaltEpochId,
    |s| (1..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)),
    IdError::SaltEpoch
);

impl fmt::Debug for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeviceId(..)")
    }
}

impl fmt::Debug for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AccountId(..)")
    }
}

impl fmt::Debug for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServiceId({})", self.0)
    }
}

impl fmt::Debug for SaltEpochId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SaltEpochId({})", self.0)
    }
}

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PushRouteId {
    FcmMain,
    ApnsMain,
    ApnsSandbox,
}

impl PushRouteId {
    pub const ALL: [Self; 3] = [Self::FcmMain, Self::ApnsMain, Self::ApnsSandbox];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::FcmMain => "fcm_main",
            Self::ApnsMain => "apns_main",
            Self::ApnsSandbox => "apns_sandbox",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// A per-epoch `service_push_secret` (§2.2). Never on the wire, never
/// printed.
#[derive(Clone)]
pub struct PushSecret(Vec<u8>);

/// §2.2 does not size the secret; HMAC-SHA256 gains nothing past 64 bytes and
/// less than 32 would weaken the pseudonym.
const MIN_SECRET_BYTES: usize = 32;

impl PushSecret {
    /// At least 32 bytes.
    pub fn new(bytes: Vec<u8>) -> Result<Self, SecretError> {
        if bytes.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort);
        }
        Ok(Self(bytes))
    }

    /// A secret file's content: the hex of at least 32 bytes (e.g.
    /// `openssl rand -hex 32`), surrounding whitespace ignored. Hex rather
    /// than raw bytes so that a trailing newline cannot change the secret.
    pub fn from_file_text(text: &[u8]) -> Result<Self, SecretError> {
        let text = text.trim_ascii();
        let bytes = hex::decode(text).map_err(|_| SecretError::NotHex)?;
        Self::new(bytes)
    }

    /// A MAC keyed with the secret (the secret itself never leaves).
    pub(super) fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }
}

impl fmt::Debug for PushSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PushSecret(..)")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("the secret must be at least 32 bytes")]
    TooShort,
    #[error("the secret file must hold hex digits only")]
    NotHex,
    #[error("salt epoch {epoch}: cannot read the secret file: {reason}")]
    Unreadable { epoch: String, reason: String },
    #[error("salt epoch {epoch}: {source}")]
    Invalid { epoch: String, source: Box<SecretError> },
    #[error("no secret is configured for the current salt epoch")]
    NoCurrent,
}

/// Every configured epoch's secret and the epoch new pseudonyms use (§2.2).
/// Old epochs keep resolving the registrations derived under them.
#[derive(Debug, Clone)]
pub struct SaltSecrets {
    current: SaltEpochId,
    by_epoch: HashMap<SaltEpochId, PushSecret>,
}

impl SaltSecrets {
    pub fn new(current: SaltEpochId, by_epoch: HashMap<SaltEpochId, PushSecret>) -> Result<Self, SecretError> {
        if !by_epoch.contains_key(&current) {
            return Err(SecretError::NoCurrent);
        }
        Ok(Self { current, by_epoch })
    }

    /// Reads each epoch's secret file (`PushSecret::from_file_text`).
    pub fn load<'a>(
        current: &SaltEpochId,
        files: impl IntoIterator<Item = (&'a SaltEpochId, &'a Path)>,
    ) -> Result<Self, SecretError> {
        let mut by_epoch = HashMap::new();
        for (epoch, path) in files {
            let text = std::fs::read(path)
                .map_err(|e| SecretError::Unreadable { epoch: epoch.to_string(), reason: e.to_string() })?;
            let secret = PushSecret::from_file_text(&text)
                .map_err(|e| SecretError::Invalid { epoch: epoch.to_string(), source: Box::new(e) })?;
            by_epoch.insert(epoch.clone(), secret);
        }
        Self::new(current.clone(), by_epoch)
    }

    pub fn current_epoch(&self) -> &SaltEpochId {
        &self.current
    }

    pub fn current(&self) -> &PushSecret {
        &self.by_epoch[&self.current]
    }

    /// `None`: the epoch was retired from the configuration; its pseudonyms
    /// no longer resolve.
    pub fn get(&self, epoch: &SaltEpochId) -> Option<&PushSecret> {
        self.by_epoch.get(epoch)
    }
}

/// §2.2 `push_target_id`: the full 32-octet HMAC tag, on the wire as
/// `ak:pseudonym:push:` + canonical unpadded base64url (43 characters).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PushTargetId([u8; 32]);

/// The JCS input of §2.2, fields in JCS order.
#[derive(Serialize)]
struct PseudonymInput<'a> {
    account_id: &'a str,
    device_id: &'a str,
    push_route_id: &'a str,
    salt_epoch_id: &'a str,
}

impl PushTargetId {
    /// `HMAC-SHA256(secret[epoch], JCS({account_id, device_id, push_route_id,
    /// salt_epoch_id}))`, untruncated (§2.2 "不得截断 HMAC").
    pub fn derive(
        secret: &PushSecret,
        epoch: &SaltEpochId,
        account: &AccountId,
        device: &DeviceId,
        route: PushRouteId,
    ) -> Self {
        let input = PseudonymInput {
            account_id: account.as_str(),
            device_id: device.as_str(),
            push_route_id: route.as_str(),
            salt_epoch_id: epoch.as_str(),
        };
        let mut mac = secret.mac();
        mac.update(&jcs::to_vec(&input));
        Self(mac.finalize().into_bytes().into())
    }

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

impl fmt::Debug for PushTargetId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PushTargetId(..)")
    }
}

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

/// §3.1 `registration_id`: opaque, at least 128 bits of entropy, never
/// `ak:`-prefixed, encoding nothing. fanout's own are 256 random bits in
/// unpadded base64url (43 characters; `:` is not in that alphabet, so the
/// `ak:` rule holds by construction). Parsing accepts any opaque id of that
/// alphabet from 22 characters (128 bits) to 128.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RegistrationId(String);

impl RegistrationId {
    /// A fresh id from the thread's CSPRNG: new for every registration,
    /// token rotation or replacement, so never a revoked one.
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Self(URL_SAFE_NO_PAD.encode(bytes))
    }

    pub fn parse(s: &str) -> Result<Self, IdError> {
        let alphabet = s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if (22..=128).contains(&s.len()) && alphabet && !s.starts_with("ak:") {
            Ok(Self(s.to_owned()))
        } else {
            Err(IdError::Registration)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RegistrationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RegistrationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RegistrationId(..)")
    }
}

impl Serialize for RegistrationId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for RegistrationId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// §2.4 `delivery_window_id`: the index of the fixed window (aligned to the
/// Unix epoch) that an instant falls in. A JSON integer in the collapse-key
/// input (reading: the checklist's vectors are reproduced only so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeliveryWindowId(u64);

impl DeliveryWindowId {
    /// The window holding `unix_ms`, for windows of `window_secs` seconds.
    pub fn at(unix_ms: u64, window_secs: u64) -> Self {
        Self(unix_ms / 1000 / window_secs.max(1))
    }

    pub fn new(id: u64) -> Self {
        Self(id)
    }

    pub fn get(self) -> u64 {
        self.0
    }

    /// When this window ends (the next one starts), in Unix milliseconds.
    pub fn end_ms(self, window_secs: u64) -> u64 {
        (self.0 + 1) * window_secs.max(1) * 1000
    }
}

/// §2.4 provider collapse key: `HMAC-SHA256(secret[epoch],
/// JCS({push_target_id, delivery_window_id}))` truncated to 16 bytes
/// (128 bits: collision-free in practice, and fits APNs' 64-byte
/// `apns-collapse-id`) and unpadded base64url (22 characters). A new window
/// gives an unrelated key; nothing of an event enters it.
#[derive(Clone, PartialEq, Eq)]
pub struct CollapseKey(String);

pub const COLLAPSE_KEY_BYTES: usize = 16;

#[derive(Serialize)]
struct CollapseInput<'a> {
    delivery_window_id: u64,
    push_target_id: &'a str,
}

impl CollapseKey {
    /// `secret` is the one of the registration's salt epoch.
    pub fn derive(secret: &PushSecret, target: &PushTargetId, window: DeliveryWindowId) -> Self {
        let target = target.to_string();
        let input = CollapseInput { delivery_window_id: window.get(), push_target_id: &target };
        let mut mac = secret.mac();
        mac.update(&jcs::to_vec(&input));
        let tag = mac.finalize().into_bytes();
        Self(URL_SAFE_NO_PAD.encode(&tag[..COLLAPSE_KEY_BYTES]))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for CollapseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CollapseKey(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's example pseudonym (§5.1) and its non-canonical twin.
    const SPEC_EXAMPLE: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
    const SPEC_EXAMPLE_TWIN: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm9";
    /// Checklist rule 2's derived vector.
    const DERIVED: &str = "ak:pseudonym:push:t4HdMLcxrKLBBUctAnf0JllNzR_ofUKouLhxnri6FOQ";
    const DEVICE: &str = "ak:device:01964137-0000-7000-8000-000000000000";

    fn secret_11() -> PushSecret {
        PushSecret::new(vec![0x11; 32]).unwrap()
    }

    fn epoch(s: &str) -> SaltEpochId {
        SaltEpochId::parse(s).unwrap()
    }

    fn derived() -> PushTargetId {
        PushTargetId::derive(
            &secret_11(),
            &epoch("e1"),
            &AccountId::parse("ak:account:example").unwrap(),
            &DeviceId::parse(DEVICE).unwrap(),
            PushRouteId::FcmMain,
        )
    }

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
    }

    #[test]
    fn the_derived_vector_of_the_checklist() {
        let input = PseudonymInput {
            account_id: "ak:account:example",
            device_id: DEVICE,
            push_route_id: "fcm_main",
            salt_epoch_id: "e1",
        };
        assert_eq!(
            String::from_utf8(jcs::to_vec(&input)).unwrap(),
            r#"{"account_id":"ak:account:example","device_id":"ak:device:01964137-0000-7000-8000-000000000000","push_route_id":"fcm_main","salt_epoch_id":"e1"}"#
        );
        let id = derived();
        assert_eq!(id.to_string(), DERIVED);
        assert_eq!(PushTargetId::parse(DERIVED).unwrap(), id);
        assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{DERIVED}\""));
        assert_eq!(serde_json::from_str::<PushTargetId>(&format!("\"{DERIVED}\"")).unwrap(), id);
    }

    #[test]
    fn every_input_changes_the_pseudonym() {
        let base = derived();
        let account = AccountId::parse("ak:account:example").unwrap();
        let device = DeviceId::parse(DEVICE).unwrap();
        let other_secret = PushSecret::new(vec![0x22; 32]).unwrap();
        let variants = [
            PushTargetId::derive(&other_secret, &epoch("e1"), &account, &device, PushRouteId::FcmMain),
            PushTargetId::derive(&secret_11(), &epoch("e2"), &account, &device, PushRouteId::FcmMain),
            PushTargetId::derive(
                &secret_11(),
                &epoch("e1"),
                &AccountId::parse("ak:account:other").unwrap(),
                &device,
                PushRouteId::FcmMain,
            ),
            PushTargetId::derive(
                &secret_11(),
                &epoch("e1"),
                &account,
                &DeviceId::parse("ak:device:01964137-0000-7000-8000-000000000001").unwrap(),
                PushRouteId::FcmMain,
            ),
            PushTargetId::derive(&secret_11(), &epoch("e1"), &account, &device, PushRouteId::ApnsMain),
        ];
        for v in variants {
            assert_ne!(v, base);
        }
    }

    #[test]
    fn malformed_push_target_ids_are_refused() {
        let b64 = &DERIVED[PUSH_TARGET_PREFIX.len()..];
        for bad in [
            String::new(),
            b64.to_owned(),                                                     // no prefix
            format!("ak:pseudonym:push:{b64}="),                                // padded
            format!("ak:pseudonym:push:{}", &b64[..42]),                        // 31.5 octets
            format!("ak:pseudonym:push:{b64}AA"),                               // 33 octets
            format!("ak:pseudonym:push:{}", b64.replace('_', "/")),             // standard alphabet
            format!("AK:pseudonym:push:{b64}"),                                 // prefix case
            format!("ak:pseudonym:push: {}", &b64[1..]),                        // space
            format!("ak:pseudonym:push:{}", URL_SAFE_NO_PAD.encode([0u8; 16])), // raw 16
        ] {
            assert_eq!(PushTargetId::parse(&bad), Err(IdError::PushTarget), "{bad}");
        }
        // The spec example written with '+' and '/' for '-' and '_'.
        let std_alphabet = SPEC_EXAMPLE.replace('-', "+");
        assert_eq!(PushTargetId::parse(&std_alphabet), Err(IdError::PushTarget));
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
    fn registration_ids_are_fresh_opaque_and_never_ak() {
        let a = RegistrationId::generate();
        let b = RegistrationId::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 43);
        assert_eq!(URL_SAFE_NO_PAD.decode(a.as_str()).unwrap().len(), 32);
        assert!(!a.as_str().starts_with("ak:"));
        assert_eq!(RegistrationId::parse(a.as_str()).unwrap(), a);
        for bad in ["", "ak:0123456789abcdefghijklmnop", "short", "has space 0123456789abcdefgh", "ak:registration:x"] {
            assert_eq!(RegistrationId::parse(bad), Err(IdError::Registration), "{bad}");
        }
        assert_eq!(RegistrationId::parse(&"a".repeat(129)), Err(IdError::Registration));
        assert!(RegistrationId::parse(&"a".repeat(22)).is_ok());
        assert_eq!(format!("{a:?}"), "RegistrationId(..)");
    }

    #[test]
    fn collapse_keys_of_the_checklist_and_unlinkable_across_windows() {
        let target = PushTargetId::parse(DERIVED).unwrap();
        let k1 = CollapseKey::derive(&secret_11(), &target, DeliveryWindowId::new(29343333));
        let k2 = CollapseKey::derive(&secret_11(), &target, DeliveryWindowId::new(29343334));
        assert_eq!(k1.as_str(), "fFwYmh5Rc70O2MAFM35hPg");
        assert_eq!(k2.as_str(), "TQ5V0QZi6HlP6G0bujZ0lg");
        let input = CollapseInput { delivery_window_id: 29343333, push_target_id: DERIVED };
        assert_eq!(
            String::from_utf8(jcs::to_vec(&input)).unwrap(),
            format!(r#"{{"delivery_window_id":29343333,"push_target_id":"{DERIVED}"}}"#)
        );
        // Same window, same target: the same key (collapses); another target
        // in the same window: another key.
        assert_eq!(CollapseKey::derive(&secret_11(), &target, DeliveryWindowId::new(29343333)), k1);
        let other = PushTargetId::parse(SPEC_EXAMPLE).unwrap();
        assert_ne!(CollapseKey::derive(&secret_11(), &other, DeliveryWindowId::new(29343333)), k1);
    }

    #[test]
    fn delivery_windows_are_aligned_to_the_epoch() {
        // 29343333 × 60 s = 1760599980 s.
        assert_eq!(DeliveryWindowId::at(1_760_599_980_000, 60).get(), 29343333);
        assert_eq!(DeliveryWindowId::at(1_760_600_039_999, 60).get(), 29343333);
        assert_eq!(DeliveryWindowId::at(1_760_600_040_000, 60).get(), 29343334);
        assert_eq!(DeliveryWindowId::new(29343333).end_ms(60), 1_760_600_040_000);
    }

    #[test]
    fn secrets_come_from_hex_files_and_keep_old_epochs() {
        assert_eq!(PushSecret::from_file_text(b"11").unwrap_err(), SecretError::TooShort);
        assert_eq!(PushSecret::from_file_text(b"zz").unwrap_err(), SecretError::NotHex);
        let dir = tempfile::tempdir().unwrap();
        let e1 = dir.path().join("e1");
        let e2 = dir.path().join("e2");
        std::fs::write(&e1, format!("{}\n", "11".repeat(32))).unwrap();
        std::fs::write(&e2, "22".repeat(40)).unwrap();
        let (id1, id2) = (epoch("e1"), epoch("e2"));
        let secrets = SaltSecrets::load(&id2, [(&id1, e1.as_path()), (&id2, e2.as_path())]).unwrap();
        assert_eq!(secrets.current_epoch(), &id2);
        // An e1 pseudonym still derives the same under the reloaded secret.
        let account = AccountId::parse("ak:account:example").unwrap();
        let device = DeviceId::parse(DEVICE).unwrap();
        let old = PushTargetId::derive(secrets.get(&id1).unwrap(), &id1, &account, &device, PushRouteId::FcmMain);
        assert_eq!(old.to_string(), DERIVED);
        assert!(secrets.get(&epoch("e3")).is_none());
        let err = SaltSecrets::load(&epoch("e3"), [(&id1, e1.as_path())]).unwrap_err();
        assert_eq!(err, SecretError::NoCurrent);
        let missing = dir.path().join("missing");
        let err = SaltSecrets::load(&id1, [(&id1, missing.as_path())]).unwrap_err();
        assert!(matches!(err, SecretError::Unreadable { .. }), "{err}");
        assert_eq!(format!("{:?}", secrets.current()), "PushSecret(..)");
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
        assert_eq!(PushRouteId::parse("fcm_main"), Some(PushRouteId::FcmMain));
        assert_eq!(PushRouteId::parse("fcm"), None);
    }
}
