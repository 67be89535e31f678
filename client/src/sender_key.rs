//! Sender suppression keys: the HMAC epoch, the per-group key of PUSH-258,
//! the sender HMAC, and the three-epoch key window of PUSH-229 with its
//! re-upload rule.

use hkdf::Hkdf;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};

use crate::error::{Error, ErrorKind};
use crate::topic::GroupId;

/// One HMAC epoch is 30 days of Unix seconds.
pub const EPOCH_SECONDS: i64 = 2_592_000;
/// Root and group keys are 42 bytes (SYNC-015, PUSH-258).
pub const KEY_BYTES: usize = 42;
/// PUSH-258's HKDF salt, 18 bytes.
const HKDF_SALT: &[u8] = b"libXMTP HKDF salt!";

/// An HMAC epoch: floor(unix seconds / 2592000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HmacEpoch(pub i64);

impl HmacEpoch {
    pub fn at_unix_seconds(seconds: i64) -> HmacEpoch {
        HmacEpoch(seconds.div_euclid(EPOCH_SECONDS))
    }

    pub fn at(time: std::time::SystemTime) -> HmacEpoch {
        HmacEpoch::at_unix_seconds(unix_seconds(time))
    }

    /// The first second of this epoch.
    pub fn start_unix_seconds(self) -> i64 {
        self.0 * EPOCH_SECONDS
    }
}

pub(crate) fn unix_seconds(time: std::time::SystemTime) -> i64 {
    match time.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs_f64().ceil() as i64),
    }
}

/// The inbox's 42-byte root HMAC key (SYNC-015: how it is made and shared is
/// the host's business; the client only derives from it).
#[derive(Clone, PartialEq, Eq)]
pub struct RootKey([u8; KEY_BYTES]);

impl RootKey {
    pub fn new(bytes: &[u8]) -> Result<RootKey, Error> {
        let bytes: [u8; KEY_BYTES] = bytes
            .try_into()
            .map_err(|_| Error::new(ErrorKind::Host, format!("a root key must be {KEY_BYTES} bytes")))?;
        Ok(RootKey(bytes))
    }

    /// A stable name for this key, kept beside each uploaded subscription so
    /// a root key change is seen (PUSH-229). One-way: the key is random, so
    /// its hash reveals nothing.
    pub fn id(&self) -> RootKeyId {
        let digest = Sha256::new().chain_update(b"fanout-client root key id\0").chain_update(self.0).finalize();
        let mut id = [0; 16];
        id.copy_from_slice(&digest[..16]);
        RootKeyId(id)
    }
}

impl std::fmt::Debug for RootKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RootKey(..)")
    }
}

/// See [`RootKey::id`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootKeyId([u8; 16]);

impl Serialize for RootKeyId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for RootKeyId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RootKeyId, D::Error> {
        let text = String::deserialize(d)?;
        let mut id = [0; 16];
        hex::decode_to_slice(text, &mut id).map_err(serde::de::Error::custom)?;
        Ok(RootKeyId(id))
    }
}

/// A group's key for one epoch (PUSH-258).
#[derive(Clone, PartialEq, Eq)]
pub struct GroupKey([u8; KEY_BYTES]);

impl GroupKey {
    /// HKDF-SHA256 (RFC 5869) with salt `libXMTP HKDF salt!`, IKM = root key
    /// ‖ group id, info = group id ‖ epoch as i64 little-endian, 42 bytes.
    pub fn derive(root: &RootKey, group: &GroupId, epoch: HmacEpoch) -> GroupKey {
        let mut ikm = Vec::with_capacity(KEY_BYTES + group.as_bytes().len());
        ikm.extend_from_slice(&root.0);
        ikm.extend_from_slice(group.as_bytes());
        let mut info = Vec::with_capacity(group.as_bytes().len() + 8);
        info.extend_from_slice(group.as_bytes());
        info.extend_from_slice(&epoch.0.to_le_bytes());
        let mut okm = [0; KEY_BYTES];
        Hkdf::<Sha256>::new(Some(HKDF_SALT), &ikm)
            .expand(&info, &mut okm)
            .expect("42 bytes is far below HKDF-SHA256's 8160-byte limit");
        GroupKey(okm)
    }

    /// HMAC-SHA256 (RFC 2104) of `data` under this key: the envelope's
    /// sender_hmac.
    pub fn sender_hmac(&self, data: &[u8]) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(data);
        mac.finalize().into_bytes().into()
    }

    pub fn as_bytes(&self) -> &[u8; KEY_BYTES] {
        &self.0
    }
}

impl std::fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupKey(..)")
    }
}

/// The keys uploaded with a group subscription: epochs base, base+1, base+2
/// in that order, where base is the current epoch minus one (PUSH-229).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyWindow {
    pub base: HmacEpoch,
    pub keys: [GroupKey; 3],
}

impl KeyWindow {
    pub fn for_epoch(root: &RootKey, group: &GroupId, current: HmacEpoch) -> KeyWindow {
        let base = HmacEpoch(current.0 - 1);
        let key = |n: i64| GroupKey::derive(root, group, HmacEpoch(base.0 + n));
        KeyWindow { base, keys: [key(0), key(1), key(2)] }
    }
}

/// PUSH-229's re-upload rule: a window uploaded with `base` holds base,
/// base+1 and base+2, and must be sent again once it no longer covers the
/// epoch after the current one — in either direction. Time moving on lapses
/// it at current ≥ base + 2; the device clock moving back (a window uploaded
/// while the clock ran fast) lapses it at current ≤ base − 2, else
/// suppression would fail open until time caught up with the window.
pub fn window_lapses(base: HmacEpoch, current: HmacEpoch) -> bool {
    let next = current.0.saturating_add(1);
    next < base.0 || next > base.0.saturating_add(2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checklist_root() -> RootKey {
        RootKey::new(&[0x2a; 42]).unwrap()
    }

    fn checklist_group() -> GroupId {
        GroupId::new(hex::decode("0102030405060708").unwrap()).unwrap()
    }

    #[test]
    fn the_epoch_of_1700000000_is_655_and_its_window_starts_at_654() {
        let current = HmacEpoch::at_unix_seconds(1_700_000_000);
        assert_eq!(current, HmacEpoch(655));
        let window = KeyWindow::for_epoch(&checklist_root(), &checklist_group(), current);
        assert_eq!(window.base, HmacEpoch(654));
    }

    #[test]
    fn a_window_based_at_654_lapses_from_1700352000() {
        let base = HmacEpoch(654);
        assert!(!window_lapses(base, HmacEpoch::at_unix_seconds(1_700_000_000)));
        assert!(!window_lapses(base, HmacEpoch::at_unix_seconds(1_700_351_999)));
        assert_eq!(HmacEpoch(656).start_unix_seconds(), 1_700_352_000);
        assert!(window_lapses(base, HmacEpoch::at_unix_seconds(1_700_352_000)));
    }

    #[test]
    fn a_window_lapses_when_the_clock_moves_back_past_it() {
        // Uploaded while the clock ran 60+ days fast: current 657, base 656.
        let base = HmacEpoch(656);
        assert!(!window_lapses(base, HmacEpoch(657)));
        assert!(!window_lapses(base, HmacEpoch(655)), "the next epoch, 656, is still the window's first");
        assert!(window_lapses(base, HmacEpoch(654)), "the next epoch, 655, lies before the window");
        assert!(window_lapses(base, HmacEpoch(600)));
        assert!(window_lapses(HmacEpoch(i64::MAX), HmacEpoch(0)));
        assert!(!window_lapses(HmacEpoch(i64::MAX - 1), HmacEpoch(i64::MAX)), "no overflow at the edge");
    }

    #[test]
    fn the_checklist_keys_k654_to_k656_in_window_order() {
        let window = KeyWindow::for_epoch(&checklist_root(), &checklist_group(), HmacEpoch(655));
        let hex: Vec<String> = window.keys.iter().map(|k| hex::encode(k.as_bytes())).collect();
        assert_eq!(
            hex,
            [
                "50ade85e133a0195c7eb5c70ee5c8b14dd9fd8f6fd35f6609a5356b0e5c5118eee359348152c7682a108",
                "279eccb4ec4961adafd2d8b2c244030cb0b6c42ae793a2148c896605974fc9552789b1518b8c0fc05093",
                "802c1f227e4ff80a33480c9186112a30971199dd37e8916a2e49b2c3f68381e9dfe03f4e405662f4d2fd",
            ]
        );
    }

    #[test]
    fn the_checklist_sender_hmac_of_hello_under_k655() {
        let k655 = GroupKey::derive(&checklist_root(), &checklist_group(), HmacEpoch(655));
        assert_eq!(
            hex::encode(k655.sender_hmac(b"hello")),
            "263f212b11cb867582adf355cc9166b2c66b91b4feb0765649e20076268bdb3c"
        );
    }

    #[test]
    fn epochs_before_1970_round_down() {
        assert_eq!(HmacEpoch::at_unix_seconds(-1), HmacEpoch(-1));
        assert_eq!(HmacEpoch::at_unix_seconds(0), HmacEpoch(0));
    }

    #[test]
    fn root_keys_are_42_bytes_and_their_ids_differ() {
        assert!(RootKey::new(&[1; 41]).is_err());
        assert!(RootKey::new(&[1; 43]).is_err());
        let a = RootKey::new(&[1; 42]).unwrap();
        let b = RootKey::new(&[2; 42]).unwrap();
        assert_ne!(a.id(), b.id());
        assert_eq!(a.id(), RootKey::new(&[1; 42]).unwrap().id());
        assert_eq!(format!("{a:?}"), "RootKey(..)");
    }
}
