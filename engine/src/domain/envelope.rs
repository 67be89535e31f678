use super::{ParseError, SenderHmac, ShardId, Topic, TopicKind};

/// The kinds of envelope a network publishes (API-210 stand-in, DESIGN.md).
/// Numbers match the wire enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EnvelopeKind {
    Application = 1,
    Commit = 2,
    Proposal = 3,
    Welcome = 4,
    KeyPackage = 5,
    IdentityUpdate = 6,
    CommitLog = 7,
}

impl EnvelopeKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Application,
            2 => Self::Commit,
            3 => Self::Proposal,
            4 => Self::Welcome,
            5 => Self::KeyPackage,
            6 => Self::IdentityUpdate,
            7 => Self::CommitLog,
            _ => return None,
        })
    }

    /// Commits and proposals reach only subscriptions with include_commits (PUSH-257).
    pub fn is_commit_or_proposal(self) -> bool {
        matches!(self, Self::Commit | Self::Proposal)
    }

    /// The only topic kind this envelope kind may be published on.
    fn topic_kind(self) -> TopicKind {
        match self {
            Self::Application | Self::Commit | Self::Proposal | Self::CommitLog => TopicKind::GroupMessage,
            Self::Welcome => TopicKind::Welcome,
            Self::IdentityUpdate => TopicKind::IdentityUpdates,
            Self::KeyPackage => TopicKind::KeyPackages,
        }
    }
}

/// What a publisher may say about a Commit's membership change (spec 003 §3:
/// `group.member_added` / `group.member_removed` events). Numbers match the
/// wire enum `MembershipChange`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MembershipChange {
    MemberAdded = 1,
    MemberRemoved = 2,
}

impl MembershipChange {
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::MemberAdded),
            2 => Some(Self::MemberRemoved),
            _ => None,
        }
    }
}

/// Longest publisher-supplied message id: it becomes the push's
/// `collapse_id`, and APNs caps its collapse id at 64 bytes.
pub const MAX_MESSAGE_ID_LEN: usize = 64;

/// The publisher's id of the message (spec 003 §3 `message_id`): 1 to 64
/// visible ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MessageId(String);

impl MessageId {
    pub fn parse(id: &str) -> Result<Self, ParseError> {
        if !(1..=MAX_MESSAGE_ID_LEN).contains(&id.len()) || !id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(ParseError("message_id must be 1 to 64 visible ASCII characters"));
        }
        Ok(Self(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What the relay channel (spec 003) reads from an envelope besides its kind
/// and data; both optional, both absent for every other channel's needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RelayMeta {
    pub message_id: Option<MessageId>,
    /// Only meaningful on a Commit.
    pub membership: Option<MembershipChange>,
}

/// Longest ciphertext kept for the relay channel's `mls_message` (003 §3):
/// its standard base64 is 4096 bytes, the log provider's inline limit; the
/// webhook's 3072-byte payload limit is smaller still. Longer data is never
/// inlined, so it is not stored for that.
pub const MAX_INLINE_DATA: usize = 3072;

/// A validated envelope on its way into storage. Topic, shard and kind are
/// private: `new` derives the shard from the topic and checks the kind
/// against it, and nothing can change one without the others.
#[derive(Debug, Clone)]
pub struct NewEnvelope {
    topic: Topic,
    shard: ShardId,
    kind: EnvelopeKind,
    pub should_push: bool,
    /// `None` when the publisher sent no 32-byte HMAC: never suppressed (PUSH-230).
    pub sender_hmac: Option<SenderHmac>,
    pub data: Vec<u8>,
    /// The publisher's own sequence id for the shard, or `None` to let fanout allocate.
    pub sequence_id: Option<u64>,
    /// Spec 003's optional metadata; set after `new` (default: none).
    pub relay: RelayMeta,
}

impl NewEnvelope {
    pub fn new(
        topic: Topic,
        shard_count: u16,
        kind: EnvelopeKind,
        should_push: bool,
        sender_hmac: Option<SenderHmac>,
        data: Vec<u8>,
        sequence_id: Option<u64>,
    ) -> Result<Self, ParseError> {
        if topic.kind() != kind.topic_kind() {
            return Err(ParseError("envelope kind does not match the topic kind"));
        }
        Ok(Self {
            shard: topic.shard(shard_count),
            topic,
            kind,
            should_push,
            sender_hmac,
            data,
            sequence_id,
            relay: RelayMeta::default(),
        })
    }

    pub fn topic(&self) -> &Topic {
        &self.topic
    }

    /// `topic.shard(shard_count)` for the shard count given to `new`.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    pub fn kind(&self) -> EnvelopeKind {
        self.kind
    }

    /// PUSH-219: a Welcome, or a group message that asked for a push or is a
    /// commit or a proposal. Nothing else is ever pushed.
    pub fn is_push_eligible(&self) -> bool {
        match self.kind {
            EnvelopeKind::Welcome => true,
            EnvelopeKind::Application => self.should_push,
            EnvelopeKind::Commit | EnvelopeKind::Proposal => true,
            EnvelopeKind::KeyPackage | EnvelopeKind::IdentityUpdate | EnvelopeKind::CommitLog => false,
        }
    }

    /// The HMAC input is kept only where suppression can use it (PUSH-230):
    /// a sender HMAC. Otherwise no ciphertext is stored for it.
    pub fn suppression_data(&self) -> Option<(&SenderHmac, &[u8])> {
        self.sender_hmac.as_ref().map(|h| (h, self.data.as_slice()))
    }

    /// The data a window keeps for the relay channel (003 §3): all of it when
    /// at most `MAX_INLINE_DATA` bytes, else nothing.
    pub fn inline_data(&self) -> &[u8] {
        if self.data.len() <= MAX_INLINE_DATA { &self.data } else { &[] }
    }

    /// What is stored of the envelope: the sender HMAC only where suppression
    /// can use it (PUSH-230), and the data then, or when it is small enough
    /// to be inlined as the relay channel's `mls_message` (003 §3).
    pub fn stored_hmac_and_data(&self) -> (Option<SenderHmac>, Vec<u8>) {
        match self.suppression_data() {
            Some((h, d)) => (Some(*h), d.to_vec()),
            None if self.data.len() <= MAX_INLINE_DATA => (None, self.data.clone()),
            None => (None, Vec::new()),
        }
    }
}

/// A push-eligible envelope as dispatch reads it: what a window, a page and a
/// delivery need, never the ciphertext. `data` can be large and a
/// window holds hundreds of envelopes, each shared by every delivery (and
/// retry) of it, so the HMAC input stays in the store and is read for a page
/// only when PUSH-230 needs it (`Store::envelope_data`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEnvelope {
    pub shard: ShardId,
    pub sequence_id: u64,
    pub topic: Topic,
    pub kind: EnvelopeKind,
    /// Server timestamp stamped at storage, Unix nanoseconds.
    pub server_ts_ns: i64,
    /// Present when suppression may apply (the store then keeps the data too).
    pub sender_hmac: Option<SenderHmac>,
    /// The data itself only when at most `MAX_INLINE_DATA` bytes: the relay
    /// channel's `mls_message` (003 §3). Larger data stays in the store and
    /// is read per page for suppression only (windows hold what
    /// dispatch needs, not whole payloads).
    pub data: Vec<u8>,
    pub relay: RelayMeta,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(kind: EnvelopeKind, topic: &[u8], should_push: bool) -> Result<NewEnvelope, ParseError> {
        NewEnvelope::new(Topic::parse(topic).unwrap(), 16, kind, should_push, None, vec![], None)
    }

    #[test]
    fn eligibility_per_kind() {
        use EnvelopeKind::*;
        assert!(env(Welcome, &[1, 1], false).unwrap().is_push_eligible());
        assert!(env(Application, &[0, 1], true).unwrap().is_push_eligible());
        assert!(!env(Application, &[0, 1], false).unwrap().is_push_eligible());
        assert!(env(Commit, &[0, 1], false).unwrap().is_push_eligible());
        assert!(env(Proposal, &[0, 1], false).unwrap().is_push_eligible());
        assert!(!env(CommitLog, &[0, 1], true).unwrap().is_push_eligible());
        assert!(!env(KeyPackage, &[3, 1], true).unwrap().is_push_eligible());
        assert!(!env(IdentityUpdate, &[2, 1], true).unwrap().is_push_eligible());
    }

    #[test]
    fn data_is_kept_for_suppression_or_when_small_enough_to_inline() {
        let hmac = SenderHmac::parse(&[1; 32]);
        let with = |hmac: Option<SenderHmac>, data: Vec<u8>| {
            NewEnvelope::new(Topic::parse(&[0, 1]).unwrap(), 16, EnvelopeKind::Application, true, hmac, data, None)
                .unwrap()
                .stored_hmac_and_data()
        };
        assert_eq!(with(hmac, vec![2; 5000]), (hmac, vec![2; 5000]));
        assert_eq!(with(None, vec![2; MAX_INLINE_DATA]), (None, vec![2; MAX_INLINE_DATA]));
        assert_eq!(with(None, vec![2; MAX_INLINE_DATA + 1]), (None, vec![]));
    }

    #[test]
    fn message_ids() {
        assert!(MessageId::parse("b76b4f49cf0d311f53af81576f61d459").is_ok());
        assert!(MessageId::parse(&"a".repeat(64)).is_ok());
        assert!(MessageId::parse("").is_err());
        assert!(MessageId::parse(&"a".repeat(65)).is_err());
        assert!(MessageId::parse("a b").is_err());
        assert!(MessageId::parse("é").is_err());
    }

    #[test]
    fn kind_must_match_topic() {
        assert!(env(EnvelopeKind::Welcome, &[0, 1], true).is_err());
        assert!(env(EnvelopeKind::Application, &[1, 1], true).is_err());
    }

    /// Publisher-sent fields, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// A message id is 1 to 64 visible ASCII characters, kept as sent.
            #[test]
            fn message_ids_follow_the_rule(id in "\\PC{0,70}|[!-~]{0,70}") {
                let valid = (1..=MAX_MESSAGE_ID_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic());
                match MessageId::parse(&id) {
                    Ok(parsed) => prop_assert!(valid && parsed.as_str() == id),
                    Err(_) => prop_assert!(!valid),
                }
            }

            /// Every byte is a known kind and membership change or none, and
            /// a known one round-trips.
            #[test]
            fn wire_bytes_map_to_known_values_only(b: u8) {
                if let Some(kind) = EnvelopeKind::from_u8(b) {
                    prop_assert_eq!(kind as u8, b);
                }
                if let Some(change) = MembershipChange::from_u8(b) {
                    prop_assert_eq!(change as u8, b);
                }
            }
        }
    }
}
