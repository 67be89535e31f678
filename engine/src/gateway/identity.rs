//! Spec 002's derived identities: the pairwise pseudonym `PushTargetId`
//! (§2.2) under the per-epoch secrets it is derived with, fresh
//! `RegistrationId`s (§3.1) and the per-window collapse key (§2.4). The ids
//! themselves, which only parse, are domain types (`domain/gateway_ids.rs`);
//! what needs a secret, a CSPRNG or canonical JSON is here.
//!
//! None of these types' `Debug` output shows a secret.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::jcs;
use crate::domain::{AccountId, DeviceId, PushRouteId, PushTargetId, RegistrationId, SaltEpochId};

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

crate::domain::redacted_debug!(PushSecret);

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
        Self::from_bytes(mac.finalize().into_bytes().into())
    }
}

impl RegistrationId {
    /// A fresh id from the thread's CSPRNG: 256 random bits in unpadded
    /// base64url (43 characters; `:` is not in that alphabet, so the `ak:`
    /// rule holds by construction), new for every registration, token
    /// rotation or replacement, so never a revoked one (§3.1).
    pub fn generate() -> Self {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        Self::parse(&URL_SAFE_NO_PAD.encode(bytes)).expect("43 base64url characters")
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

crate::domain::redacted_debug!(CollapseKey);

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's example pseudonym (§5.1).
    const SPEC_EXAMPLE: &str = "ak:pseudonym:push:kosc9iQ4gVct1OB-b6X364WIFIsJFVbVzn7BMBs1sm8";
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
    fn registration_ids_are_fresh_and_never_ak() {
        let a = RegistrationId::generate();
        let b = RegistrationId::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 43);
        assert_eq!(URL_SAFE_NO_PAD.decode(a.as_str()).unwrap().len(), 32);
        assert!(!a.as_str().starts_with("ak:"));
        assert_eq!(RegistrationId::parse(a.as_str()).unwrap(), a);
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
}
