//! 003 §3–4: which notifications an envelope becomes, and the fields they
//! carry (type, gid, seq, message_id, mls_message).

use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::domain::{EnvelopeKind, MembershipChange, StoredEnvelope};

/// The event types of 003 §3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum EventType {
    Message,
    Welcome,
    #[strum(serialize = "group.member_added")]
    MemberAdded,
    #[strum(serialize = "group.member_removed")]
    MemberRemoved,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// 003 §4: an alert for `message` and `welcome`, silent for membership events.
    pub fn priority(self) -> Priority {
        match self {
            Self::Message | Self::Welcome => Priority::High,
            Self::MemberAdded | Self::MemberRemoved => Priority::Normal,
        }
    }
}

/// 003 §4: exactly two levels; an alert outranks a silent push.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Priority {
    /// Silent.
    Normal,
    /// Alert.
    High,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// One notification: what a device's payload says (003 §3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub kind: EventType,
    pub gid: String,
    pub seq: u64,
    /// Also the collapse_id (003 §4).
    pub message_id: String,
    /// The ciphertext, when stored (it is inlined only while it fits).
    /// Never for membership events.
    pub mls_message: Option<Arc<[u8]>>,
}

/// The notifications of one envelope, in the order the hub queues them
/// (003 §4): an application message or a Commit is a `message` (a Commit
/// with a membership change, when member events are on, is followed by its
/// membership event, which coalesces with it per device); a Welcome is a
/// `welcome`; a Proposal is never pushed.
pub fn notifications(envelope: &StoredEnvelope, member_events: bool) -> Vec<Notification> {
    let kind = match envelope.kind {
        EnvelopeKind::Application | EnvelopeKind::Commit => EventType::Message,
        EnvelopeKind::Welcome => EventType::Welcome,
        // 003 §4: a Proposal changes nothing until a Commit covers it.
        EnvelopeKind::Proposal | EnvelopeKind::KeyPackage | EnvelopeKind::IdentityUpdate | EnvelopeKind::CommitLog => {
            return Vec::new();
        }
    };
    let id = envelope.topic.identifier();
    let gid = gid(id);
    let message_id = match &envelope.relay.message_id {
        Some(m) => m.as_str().to_owned(),
        None => stand_in_message_id(id, envelope.sequence_id),
    };
    let data: Option<Arc<[u8]>> = (!envelope.data.is_empty()).then(|| envelope.data.as_slice().into());
    let mut out = vec![Notification {
        kind,
        gid: gid.clone(),
        seq: envelope.sequence_id,
        message_id: message_id.clone(),
        mls_message: data,
    }];
    let membership = envelope.relay.membership.filter(|_| member_events && envelope.kind == EnvelopeKind::Commit);
    if let Some(change) = membership {
        let kind = match change {
            MembershipChange::MemberAdded => EventType::MemberAdded,
            MembershipChange::MemberRemoved => EventType::MemberRemoved,
        };
        out.push(Notification { kind, gid, seq: envelope.sequence_id, message_id, mls_message: None });
    }
    out
}

/// 003 §3's stand-in message id for a message the hub does not store: the
/// first 16 bytes of SHA-256(gid || 0x00 || seq as u64 big-endian), in
/// lowercase hex.
pub fn stand_in_message_id(gid: &[u8], seq: u64) -> String {
    let mut h = Sha256::new();
    h.update(gid);
    h.update([0u8]);
    h.update(seq.to_be_bytes());
    hex::encode(&h.finalize()[..16])
}

/// The group id as text: the topic's identifier when it is UTF-8 without
/// control characters (the usual case: the network's group id), else its
/// lowercase hex. The stand-in message id hashes the identifier's bytes.
pub fn gid(identifier: &[u8]) -> String {
    match std::str::from_utf8(identifier) {
        Ok(text) if !text.chars().any(char::is_control) => text.to_owned(),
        _ => hex::encode(identifier),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{MessageId, RelayMeta, ShardId, Topic};

    #[test]
    fn the_stand_in_message_id_vector() {
        // Checklist item 11 (derived from the seed's formula).
        assert_eq!(stand_in_message_id(b"group-1", 42), "b76b4f49cf0d311f53af81576f61d459");
    }

    fn envelope(kind: EnvelopeKind, topic_kind: u8, relay: RelayMeta) -> StoredEnvelope {
        let mut topic = vec![topic_kind];
        topic.extend_from_slice(b"group-1");
        StoredEnvelope {
            shard: ShardId::FIRST,
            sequence_id: 42,
            topic: Topic::parse(&topic).unwrap(),
            kind,
            server_ts_ns: 0,
            sender_hmac: None,
            data: b"ciphertext".to_vec(),
            relay,
        }
    }

    #[test]
    fn envelopes_become_notifications() {
        let m = notifications(&envelope(EnvelopeKind::Application, 0, RelayMeta::default()), false);
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].kind, m[0].gid.as_str(), m[0].seq), (EventType::Message, "group-1", 42));
        assert_eq!(m[0].message_id, "b76b4f49cf0d311f53af81576f61d459");
        assert_eq!(m[0].mls_message.as_deref(), Some(&b"ciphertext"[..]));
        let w = notifications(&envelope(EnvelopeKind::Welcome, 1, RelayMeta::default()), true);
        assert_eq!((w.len(), w[0].kind), (1, EventType::Welcome));
        assert!(notifications(&envelope(EnvelopeKind::Proposal, 0, RelayMeta::default()), true).is_empty());

        let added = RelayMeta { membership: Some(MembershipChange::MemberAdded), message_id: None };
        let c = notifications(&envelope(EnvelopeKind::Commit, 0, added.clone()), false);
        assert_eq!(c.iter().map(|n| n.kind).collect::<Vec<_>>(), [EventType::Message], "member events off");
        let c = notifications(&envelope(EnvelopeKind::Commit, 0, added), true);
        assert_eq!(c.iter().map(|n| n.kind).collect::<Vec<_>>(), [EventType::Message, EventType::MemberAdded]);
        assert_eq!(c[1].mls_message, None, "never for membership events");
        assert_eq!(c[1].message_id, c[0].message_id);

        let own = RelayMeta { message_id: Some(MessageId::parse("msg-7").unwrap()), membership: None };
        assert_eq!(notifications(&envelope(EnvelopeKind::Application, 0, own), false)[0].message_id, "msg-7");
    }

    #[test]
    fn priorities_and_gids() {
        assert!(Priority::High > Priority::Normal);
        assert_eq!(EventType::Welcome.priority(), Priority::High);
        assert_eq!(EventType::MemberRemoved.priority(), Priority::Normal);
        assert_eq!(gid(b"group-1"), "group-1");
        assert_eq!(gid(&[0xff, 0x00]), "ff00");
        assert_eq!(gid(b"a\nb"), "610a62");
    }
}
