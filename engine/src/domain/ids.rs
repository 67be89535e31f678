use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::ParseError;

/// 32 random bytes naming a push endpoint. Debug never prints the bytes.
/// The field is private: an id is built from exactly 32 bytes, never from
/// a slice of another length.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecipientId([u8; 32]);

impl RecipientId {
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        bytes.try_into().map(Self).map_err(|_| ParseError("recipient_id must be exactly 32 bytes"))
    }

    /// Any 32 bytes name a recipient: e.g. a key read back from storage.
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// A stable partition index, e.g. for choosing a delivery worker. Every
    /// byte counts: ids that share a prefix (a client's or a harness's own
    /// scheme) still spread over the partitions.
    pub fn partition(&self, n: usize) -> usize {
        let folded = self.0.chunks_exact(8).fold(0u64, |h, c| {
            (h ^ u64::from_le_bytes(c.try_into().expect("8 bytes"))).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        });
        // splitmix64's finaliser: high and low bits both depend on every input bit.
        let mut z = folded;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

crate::domain::redacted_debug!(RecipientId);

/// The bearer secret. Only its SHA-256 is ever stored (PUSH-254).
#[derive(Clone)]
pub struct RecipientSecret([u8; 32]);

impl RecipientSecret {
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        bytes.try_into().map(Self).map_err(|_| ParseError("recipient_secret must be exactly 32 bytes"))
    }

    pub fn hash(&self) -> SecretHash {
        SecretHash(Sha256::digest(self.0).into())
    }
}

crate::domain::redacted_debug!(RecipientSecret);

/// SHA-256 of a recipient secret. Equality is constant-time (PUSH-253 check 3).
#[derive(Clone, Copy)]
pub struct SecretHash(pub [u8; 32]);

impl PartialEq for SecretHash {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}
impl Eq for SecretHash {}

crate::domain::redacted_debug!(SecretHash);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_sharing_a_prefix_spread_over_partitions() {
        let mut counts = [0usize; 8];
        for i in 0..8000u32 {
            let mut id = [7u8; 32];
            id[8..12].copy_from_slice(&i.to_be_bytes());
            counts[RecipientId::from_bytes(id).partition(8)] += 1;
        }
        assert!(counts.iter().all(|&c| (800..1200).contains(&c)), "{counts:?}");
    }

    /// Partitions are pinned: a delivery worker is chosen by them, so a
    /// change moves recipients between workers. The values are computed
    /// apart from this code (the fold and splitmix64's finaliser, in Python).
    #[test]
    fn partitions_are_pinned() {
        let nines = RecipientId::from_bytes([9; 32]);
        assert_eq!((nines.partition(8), nines.partition(1000)), (6, 398));
        let counting: [u8; 32] = std::array::from_fn(|i| i as u8 * 7 + 1);
        assert_eq!(RecipientId::from_bytes(counting).partition(1000), 764);
    }

    #[test]
    fn ids_must_be_32_bytes() {
        assert!(RecipientId::parse(&[1; 31]).is_err());
        assert!(RecipientId::parse(&[1; 33]).is_err());
        assert_eq!(RecipientId::parse(&[1; 32]).unwrap().as_bytes(), &[1; 32]);
        assert!(RecipientSecret::parse(&[]).is_err());
    }

    #[test]
    fn secret_hash_is_sha256_and_debug_hides_values() {
        let s = RecipientSecret::parse(&[0; 32]).unwrap();
        assert_eq!(hex::encode(s.hash().0), "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925");
        assert_eq!(format!("{:?}", s.hash()), "SecretHash(..)");
        assert_eq!(format!("{:?}", RecipientId::from_bytes([7; 32])), "RecipientId(..)");
    }
}
