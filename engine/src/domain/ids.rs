use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::ParseError;

/// 32 random bytes naming a push endpoint. Debug never prints the bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecipientId(pub [u8; 32]);

impl RecipientId {
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        bytes
            .try_into()
            .map(Self)
            .map_err(|_| ParseError("recipient_id must be exactly 32 bytes"))
    }

    /// Lowercase hex, as the webhook body carries it (PUSH-259).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// A stable partition index, e.g. for choosing a delivery worker.
    pub fn partition(&self, n: usize) -> usize {
        (u64::from_le_bytes(self.0[..8].try_into().expect("8 bytes")) % n as u64) as usize
    }
}

impl std::fmt::Debug for RecipientId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecipientId(..)")
    }
}

/// The bearer secret. Only its SHA-256 is ever stored (PUSH-254).
#[derive(Clone)]
pub struct RecipientSecret([u8; 32]);

impl RecipientSecret {
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        bytes
            .try_into()
            .map(Self)
            .map_err(|_| ParseError("recipient_secret must be exactly 32 bytes"))
    }

    pub fn hash(&self) -> SecretHash {
        SecretHash(Sha256::digest(self.0).into())
    }
}

impl std::fmt::Debug for RecipientSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecipientSecret(..)")
    }
}

/// SHA-256 of a recipient secret. Equality is constant-time (PUSH-253 check 3).
#[derive(Clone, Copy)]
pub struct SecretHash(pub [u8; 32]);

impl PartialEq for SecretHash {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}
impl Eq for SecretHash {}

impl std::fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretHash(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_must_be_32_bytes() {
        assert!(RecipientId::parse(&[1; 31]).is_err());
        assert!(RecipientId::parse(&[1; 33]).is_err());
        assert_eq!(RecipientId::parse(&[1; 32]).unwrap().0, [1; 32]);
        assert!(RecipientSecret::parse(&[]).is_err());
    }

    #[test]
    fn secret_hash_is_sha256_and_debug_hides_values() {
        let s = RecipientSecret::parse(&[0; 32]).unwrap();
        assert_eq!(
            hex::encode(s.hash().0),
            "66687aadf862bd776c8fc18b8e9f8e20089714856ee233b3902a591d0d5f2925"
        );
        assert_eq!(format!("{:?}", s.hash()), "SecretHash(..)");
        assert_eq!(format!("{:?}", RecipientId([7; 32])), "RecipientId(..)");
    }
}
