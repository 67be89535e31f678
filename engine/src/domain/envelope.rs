use super::{ParseError, ShardId, Topic, TopicKind};

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
            Self::Application | Self::Commit | Self::Proposal | Self::CommitLog => {
                TopicKind::GroupMessage
            }
            Self::Welcome => TopicKind::Welcome,
            Self::IdentityUpdate => TopicKind::IdentityUpdates,
            Self::KeyPackage => TopicKind::KeyPackages,
        }
    }
}

/// A validated envelope on its way into storage.
#[derive(Debug, Clone)]
pub struct NewEnvelope {
    pub topic: Topic,
    pub shard: ShardId,
    pub kind: EnvelopeKind,
    pub should_push: bool,
    pub sender_hmac: Vec<u8>,
    pub data: Vec<u8>,
    /// The publisher's own sequence id for the shard, or `None` to let fanout allocate.
    pub sequence_id: Option<u64>,
}

impl NewEnvelope {
    pub fn new(
        topic: Topic,
        shard_count: u16,
        kind: EnvelopeKind,
        should_push: bool,
        sender_hmac: Vec<u8>,
        data: Vec<u8>,
        sequence_id: Option<u64>,
    ) -> Result<Self, ParseError> {
        if topic.kind() != kind.topic_kind() {
            return Err(ParseError("envelope kind does not match the topic kind"));
        }
        Ok(Self { shard: topic.shard(shard_count), topic, kind, should_push, sender_hmac, data, sequence_id })
    }

    /// PUSH-219: a Welcome, or a group message that asked for a push or is a
    /// commit or a proposal. Nothing else is ever pushed.
    pub fn is_push_eligible(&self) -> bool {
        match self.kind {
            EnvelopeKind::Welcome => true,
            EnvelopeKind::Application => self.should_push,
            EnvelopeKind::Commit | EnvelopeKind::Proposal => true,
            EnvelopeKind::KeyPackage | EnvelopeKind::IdentityUpdate | EnvelopeKind::CommitLog => {
                false
            }
        }
    }

    /// The HMAC input is kept only where suppression can use it (PUSH-230):
    /// a 32-byte sender_hmac. Otherwise no ciphertext is stored at all.
    pub fn suppression_data(&self) -> Option<(&[u8], &[u8])> {
        (self.sender_hmac.len() == 32).then_some((&self.sender_hmac, &self.data))
    }
}

/// A push-eligible envelope as dispatch reads it: what a window, a page and a
/// delivery need, never the ciphertext. Issue 11: `data` can be large and a
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
    /// Exactly 32 bytes when suppression may apply (the store then keeps the
    /// data too); else empty.
    pub sender_hmac: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(kind: EnvelopeKind, topic: &[u8], should_push: bool) -> Result<NewEnvelope, ParseError> {
        NewEnvelope::new(Topic::parse(topic).unwrap(), 16, kind, should_push, vec![], vec![], None)
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
    fn kind_must_match_topic() {
        assert!(env(EnvelopeKind::Welcome, &[0, 1], true).is_err());
        assert!(env(EnvelopeKind::Application, &[1, 1], true).is_err());
    }
}
