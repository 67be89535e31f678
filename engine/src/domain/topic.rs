use base64::Engine as _;

use super::ParseError;

/// Longest topic identifier after the kind byte (TOPIC-001 as DESIGN.md fixes it).
pub const MAX_TOPIC_ID_LEN: usize = 64;

/// The kind byte of a topic (TOPIC-001).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TopicKind {
    GroupMessage = 0x00,
    Welcome = 0x01,
    IdentityUpdates = 0x02,
    KeyPackages = 0x03,
}

impl TopicKind {
    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0x00 => Some(Self::GroupMessage),
            0x01 => Some(Self::Welcome),
            0x02 => Some(Self::IdentityUpdates),
            0x03 => Some(Self::KeyPackages),
            _ => None,
        }
    }
}

/// A valid topic: a known kind byte followed by a 1..=64 byte identifier.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Topic(Vec<u8>);

impl Topic {
    /// Any valid topic, of any kind (envelopes may carry all four).
    pub fn parse(bytes: &[u8]) -> Result<Self, ParseError> {
        let (&kind, id) = bytes.split_first().ok_or(ParseError("topic is empty"))?;
        TopicKind::from_byte(kind).ok_or(ParseError("topic has an unknown kind byte"))?;
        if id.is_empty() || id.len() > MAX_TOPIC_ID_LEN {
            return Err(ParseError("topic identifier must be 1 to 64 bytes"));
        }
        Ok(Self(bytes.to_vec()))
    }

    /// A topic a subscription may carry: group-message or welcome only (PUSH-215).
    pub fn parse_subscribable(bytes: &[u8]) -> Result<Self, ParseError> {
        let topic = Self::parse(bytes)?;
        match topic.kind() {
            TopicKind::GroupMessage | TopicKind::Welcome => Ok(topic),
            _ => Err(ParseError("only group-message and welcome topics can be subscribed")),
        }
    }

    /// Rebuilds a topic read back from storage, where it was valid when written.
    pub fn from_stored(bytes: Vec<u8>) -> Self {
        debug_assert!(Self::parse(&bytes).is_ok());
        Self(bytes)
    }

    pub fn kind(&self) -> TopicKind {
        TopicKind::from_byte(self.0[0]).expect("validated at parse")
    }

    /// The identifier after the kind byte (1 to 64 bytes): e.g. the group id.
    pub fn identifier(&self) -> &[u8] {
        &self.as_bytes()[1..]
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Standard base64, as every push body carries it (PUSH-259).
    pub fn to_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.0)
    }

    /// The topic's shard: a stable hash (FNV-1a 64) of the topic bytes. Stable
    /// across versions and machines, because shard ids are stored.
    pub fn shard(&self, shard_count: u16) -> ShardId {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in &self.0 {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        ShardId((h % u64::from(shard_count.max(1))) as u16)
    }
}

impl std::fmt::Debug for Topic {
    // Topics never reach logs (PUSH-254): Debug shows the kind only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Topic({:?}, ..)", self.kind())
    }
}

/// One topic shard: its own sequence ids, boundary and checkpoint. The
/// index is private: a shard id comes from a topic (`Topic::shard`), from
/// the shard count (`ShardId::all`) or is checked against it (`parse`), so
/// none is out of range for the count it was made with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(u16);

impl ShardId {
    /// Shard 0, which every shard count (at least 1) has.
    pub const FIRST: Self = Self(0);

    /// The shard with `index` of `shard_count` shards, e.g. one read back
    /// from storage.
    pub fn parse(index: u16, shard_count: u16) -> Result<Self, ParseError> {
        if index < shard_count { Ok(Self(index)) } else { Err(ParseError("shard id is out of range")) }
    }

    /// Every shard of `shard_count`, in index order.
    pub fn all(shard_count: u16) -> impl DoubleEndedIterator<Item = Self> + Clone {
        (0..shard_count).map(Self)
    }

    /// The shard's number, 0 to the shard count − 1: for storage keys, logs
    /// and the publish answer.
    pub const fn index(self) -> u16 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_rules() {
        assert!(Topic::parse(&[]).is_err());
        assert!(Topic::parse(&[0x00]).is_err(), "identifier must not be empty");
        assert!(Topic::parse(&[0x04, 1]).is_err(), "unknown kind");
        assert!(Topic::parse(&[0x00; 66]).is_err(), "65-byte identifier");
        assert!(Topic::parse(&[0x00; 65]).is_ok(), "64-byte identifier");
        assert!(Topic::parse(&[0x02, 9]).is_ok());
        assert!(Topic::parse_subscribable(&[0x02, 9]).is_err());
        assert!(Topic::parse_subscribable(&[0x03, 9]).is_err());
        assert_eq!(Topic::parse_subscribable(&[0x01, 9]).unwrap().kind(), TopicKind::Welcome);
    }

    #[test]
    fn shard_is_pinned_and_in_range() {
        // Pinned: changing the hash would strand every stored envelope. The
        // values are FNV-1a 64 of the topic bytes modulo the shard count as
        // docs/CLIENT.md words it, computed apart from this code (in Python).
        let pinned: [(&[u8], u16, u16); 5] = [
            (&[0, 1, 2, 3], 256, 17),
            (&[0, 1, 2, 3], 7, 4),
            (b"\x01welcome", 256, 168),
            (b"\x00group-1", 1024, 192),
            (b"\x00group-1", 65535, 15869),
        ];
        for (bytes, count, shard) in pinned {
            assert_eq!(Topic::parse(bytes).unwrap().shard(count).index(), shard, "{bytes:?} mod {count}");
        }
        for i in 0..=255u8 {
            assert!(Topic::parse(&[0, i]).unwrap().shard(7).index() < 7);
        }
        assert_eq!(Topic::parse(&[1, 2, 3]).unwrap().to_base64(), "AQID");
    }

    #[test]
    fn shard_ids_stay_below_their_count() {
        assert_eq!(ShardId::parse(3, 4).map(ShardId::index), Ok(3));
        assert!(ShardId::parse(4, 4).is_err());
        assert!(ShardId::parse(0, 0).is_err());
        assert_eq!(ShardId::all(3).map(ShardId::index).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(ShardId::all(0).count(), 0);
    }

    /// Outside bytes, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any bytes parse or are refused by the TOPIC-001 rule alone; a
            /// parsed topic is exactly its input, and every derived view
            /// (kind, identifier, base64, shard) agrees with it.
            #[test]
            fn any_bytes_parse_exactly_by_the_rule(bytes in prop::collection::vec(any::<u8>(), 0..80), shards: u16) {
                let valid = bytes.len() >= 2 && bytes.len() <= 1 + MAX_TOPIC_ID_LEN && bytes[0] <= 0x03;
                let parsed = Topic::parse(&bytes);
                prop_assert_eq!(parsed.is_ok(), valid);
                prop_assert_eq!(Topic::parse_subscribable(&bytes).is_ok(), valid && bytes[0] <= 0x01);
                if let Ok(topic) = parsed {
                    prop_assert_eq!(topic.as_bytes(), &bytes[..]);
                    prop_assert_eq!(topic.identifier(), &bytes[1..]);
                    prop_assert_eq!(topic.kind() as u8, bytes[0]);
                    let decoded = base64::engine::general_purpose::STANDARD.decode(topic.to_base64()).unwrap();
                    prop_assert_eq!(&decoded, &bytes);
                    prop_assert!(topic.shard(shards).index() < shards.max(1));
                    prop_assert_eq!(Topic::from_stored(bytes.clone()), topic);
                }
            }
        }
    }
}
