//! The recipient identity (PUSH-201): 32 random bytes of id and 32 of
//! secret, drawn from the operating system's CSPRNG when notifications are
//! first enabled on a database, derived from nothing, and kept across disable
//! and enable so the backend never holds two recipients for one device.

use rand::TryRngCore;
use rand::rngs::OsRng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind};

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecipientIdentity {
    #[serde(with = "hex32")]
    id: [u8; 32],
    #[serde(with = "hex32")]
    secret: [u8; 32],
}

impl RecipientIdentity {
    /// A fresh pair from the OS random source.
    pub fn generate() -> Result<RecipientIdentity, Error> {
        let mut id = [0; 32];
        let mut secret = [0; 32];
        OsRng
            .try_fill_bytes(&mut id)
            .and_then(|()| OsRng.try_fill_bytes(&mut secret))
            .map_err(|_| Error::new(ErrorKind::Host, "the operating system's random source failed"))?;
        Ok(RecipientIdentity { id, secret })
    }

    pub fn id(&self) -> &[u8; 32] {
        &self.id
    }

    pub fn secret(&self) -> &[u8; 32] {
        &self.secret
    }

    /// For hosts that migrate an identity from elsewhere, and for tests.
    pub fn from_parts(id: [u8; 32], secret: [u8; 32]) -> RecipientIdentity {
        RecipientIdentity { id, secret }
    }
}

// The id names whose device this is and the secret is a credential: neither
// is ever printed (PUSH-254).
impl std::fmt::Debug for RecipientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecipientIdentity(..)")
    }
}

pub(crate) mod hex32 {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let text = String::deserialize(d)?;
        let mut out = [0; 32];
        hex::decode_to_slice(text, &mut out).map_err(serde::de::Error::custom)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_generated_identities_share_nothing() {
        let a = RecipientIdentity::generate().unwrap();
        let b = RecipientIdentity::generate().unwrap();
        assert_ne!(a.id(), b.id());
        assert_ne!(a.secret(), b.secret());
        assert_ne!(a.id(), a.secret());
        assert_ne!(a.id(), &[0; 32]);
    }

    #[test]
    fn the_identity_round_trips_and_never_prints() {
        let a = RecipientIdentity::from_parts([7; 32], [9; 32]);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<RecipientIdentity>(&json).unwrap(), a);
        assert_eq!(format!("{a:?}"), "RecipientIdentity(..)");
    }
}
