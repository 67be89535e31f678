//! Identities of one run, derived from a seed so that nothing per recipient
//! has to be stored: the receiver reads a recipient's index straight out of
//! its id, and recomputes its signing key to check the signature.
//!
//! - recipient id (32 bytes): run nonce (8) ‖ index (u32 BE) ‖ 20 derived bytes
//! - Web Push keys: a P-256 scalar and an `auth` secret per recipient
//! - topic (13 bytes): 0x00 (group-message kind) ‖ run nonce (8) ‖ index (u32 BE)
//!
//! Secrets and keys are derived with splitmix64: fine for a benchmark on
//! 127.0.0.1, not for anything real.

use std::time::{SystemTime, UNIX_EPOCH};

use fanout_testkit::webpush::Subscriber;

/// Per-run identity space. Two runs against one engine never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunIds {
    nonce: [u8; 8],
    seed: u64,
}

const TAG_ID: u64 = 0x1d;
const TAG_SECRET: u64 = 0x5e;
const TAG_KEY: u64 = 0x4b;
const TAG_PUSH_KEY: u64 = 0x70;
const TAG_PUSH_AUTH: u64 = 0x61;

impl RunIds {
    pub fn from_seed(seed: u64) -> Self {
        RunIds { nonce: splitmix64(seed ^ 0x6e6f6e6365).to_be_bytes(), seed }
    }

    /// A fresh identity space (time and pid as the seed).
    pub fn fresh() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Self::from_seed(nanos ^ (u64::from(std::process::id()) << 32))
    }

    pub fn recipient_id(&self, index: u32) -> [u8; 32] {
        let mut id = derive32(self.seed, TAG_ID, index);
        id[..8].copy_from_slice(&self.nonce);
        id[8..12].copy_from_slice(&index.to_be_bytes());
        id
    }

    /// The index of a recipient id of this run, or `None`.
    pub fn recipient_index(&self, id: &[u8]) -> Option<u32> {
        if id.len() != 32 || id[..8] != self.nonce {
            return None;
        }
        let index = u32::from_be_bytes(id[8..12].try_into().ok()?);
        (self.recipient_id(index)[..] == *id).then_some(index)
    }

    pub fn secret(&self, index: u32) -> [u8; 32] {
        derive32(self.seed, TAG_SECRET, index)
    }

    /// The webhook signing key registered for recipient `index` (32 bytes).
    pub fn signing_key(&self, index: u32) -> [u8; 32] {
        derive32(self.seed, TAG_KEY, index)
    }

    /// Recipient `index`'s Web Push subscription as its browser holds it:
    /// the P-256 private key behind `p256dh` and the `auth` secret (RFC
    /// 8291), so the receiver can decrypt without storing keys.
    pub fn webpush_subscriber(&self, index: u32) -> Subscriber {
        let mut auth = [0u8; 16];
        auth.copy_from_slice(&derive32(self.seed, TAG_PUSH_AUTH, index)[..16]);
        // A derived scalar is at or above the group order about once in 2^32:
        // derive again from the next tag until it is a key.
        (0u64..)
            .find_map(|i| {
                let scalar = derive32(self.seed ^ splitmix64(i), TAG_PUSH_KEY, index);
                Subscriber::from_private_key(&scalar, auth).ok()
            })
            .expect("some derived scalar is a P-256 key")
    }

    pub fn topic(&self, index: u32) -> Vec<u8> {
        let mut topic = Vec::with_capacity(13);
        topic.push(0x00);
        topic.extend_from_slice(&self.nonce);
        topic.extend_from_slice(&index.to_be_bytes());
        topic
    }

    /// The index of a topic of this run, or `None`.
    pub fn topic_index(&self, topic: &[u8]) -> Option<u32> {
        if topic.len() != 13 || topic[0] != 0x00 || topic[1..9] != self.nonce {
            return None;
        }
        Some(u32::from_be_bytes(topic[9..13].try_into().ok()?))
    }

    /// A well-mixed 64-bit hash of a delivery (topic, sequence id, recipient):
    /// the receiver's fault decisions depend only on this.
    pub fn delivery_hash(&self, topic: u32, seq: u64, recipient: u32) -> u64 {
        splitmix64(self.seed ^ splitmix64(seq ^ splitmix64((u64::from(topic) << 32) | u64::from(recipient))))
    }
}

/// splitmix64 finaliser: a cheap, well-distributed 64-bit mix.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn derive32(seed: u64, tag: u64, index: u32) -> [u8; 32] {
    let mut out = [0u8; 32];
    let base = splitmix64(seed ^ (tag << 56) ^ u64::from(index));
    for (i, chunk) in out.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&splitmix64(base ^ i as u64).to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_runs_do_not_collide() {
        let a = RunIds::from_seed(1);
        let b = RunIds::from_seed(2);
        for i in [0, 1, 999_999, u32::MAX] {
            assert_eq!(a.recipient_index(&a.recipient_id(i)), Some(i));
            assert_eq!(b.recipient_index(&a.recipient_id(i)), None);
            assert_eq!(a.topic_index(&a.topic(i)), Some(i));
            assert_eq!(b.topic_index(&a.topic(i)), None);
        }
        assert_ne!(a.signing_key(1), a.signing_key(2));
        assert_ne!(a.secret(1), a.signing_key(1));
        // A forged id with the right prefix but wrong tail is refused.
        let mut forged = a.recipient_id(5);
        forged[31] ^= 1;
        assert_eq!(a.recipient_index(&forged), None);
        // Web Push keys: stable per recipient, distinct across recipients.
        let (k1, k2) = (a.webpush_subscriber(1), a.webpush_subscriber(2));
        assert_eq!((k1.p256dh(), k1.auth()), (a.webpush_subscriber(1).p256dh(), a.webpush_subscriber(1).auth()));
        assert_ne!(k1.p256dh(), k2.p256dh());
        assert_ne!(k1.auth(), k2.auth());
        assert_eq!(k1.p256dh().len(), 65);
    }
}
