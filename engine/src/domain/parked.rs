//! A delivery parked durably while its channel cannot take it (ARCHITECTURE,
//! "Channels fail alone"): it counts as settled for its dispatch window, so
//! the checkpoint may pass it (PUSH-257 still holds: the parked row is
//! durable), and the shard's owner feeds it to its channel again later.

use super::{Channel, EnvelopeKind, RecipientId, ShardId, Topic};

/// A delivery held durably while its channel cannot take it (see
/// ARCHITECTURE "Channels fail alone").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParkedDelivery {
    pub shard: ShardId,
    pub channel: Channel,
    pub sequence_id: u64,
    pub recipient: RecipientId,
    /// What the attempt needs of the envelope (the envelope itself is
    /// pruned once the checkpoint passes it).
    pub topic: Topic,
    pub kind: EnvelopeKind,
    pub server_ts_ns: i64,
    /// Attempts already made (0: its first attempt is still to come).
    pub attempts: u32,
    /// Every attempt so far answered Gone (the HTTPS 404/410 rule of spec 000 §7).
    pub all_gone: bool,
}

/// A parked delivery's place in its (shard, channel): ordered by sequence
/// id, then recipient id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ParkedKey {
    pub sequence_id: u64,
    pub recipient: RecipientId,
}

/// Where a parked delivery's row is: its shard, its channel and its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParkedPlace {
    pub shard: ShardId,
    pub channel: Channel,
    pub key: ParkedKey,
}

impl ParkedDelivery {
    pub fn key(&self) -> ParkedKey {
        ParkedKey { sequence_id: self.sequence_id, recipient: self.recipient }
    }

    pub fn place(&self) -> ParkedPlace {
        ParkedPlace { shard: self.shard, channel: self.channel, key: self.key() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_by_sequence_id_then_recipient() {
        let key = |sequence_id, r| ParkedKey { sequence_id, recipient: RecipientId::from_bytes([r; 32]) };
        let mut keys = vec![key(2, 1), key(1, 9), key(1, 2), key(3, 0)];
        keys.sort();
        assert_eq!(keys, [key(1, 2), key(1, 9), key(2, 1), key(3, 0)]);
    }
}
