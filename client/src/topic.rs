//! Group ids and the two subscribable topic kinds (TOPIC-001 as DESIGN.md
//! fixes it): a kind byte, 0x00 group message or 0x01 welcome, then an
//! identifier of 1 to 64 bytes. Parsed once at the edge; inside the client a
//! [`Topic`] is always subscribable.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{Error, ErrorKind};

/// The longest identifier a topic carries.
pub const MAX_ID_BYTES: usize = 64;

const GROUP_MESSAGE: u8 = 0x00;
const WELCOME: u8 = 0x01;

/// A conversation's group id: 1 to 64 bytes.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId(Vec<u8>);

impl GroupId {
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<GroupId, Error> {
        let bytes = bytes.into();
        check_id(&bytes, "group id")?;
        Ok(GroupId(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The group-message topic of this group.
    pub fn topic(&self) -> Topic {
        let mut bytes = Vec::with_capacity(1 + self.0.len());
        bytes.push(GROUP_MESSAGE);
        bytes.extend_from_slice(&self.0);
        Topic(bytes)
    }
}

// Ids are private values (PUSH-254): never print them.
impl std::fmt::Debug for GroupId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GroupId({} bytes)", self.0.len())
    }
}

/// Which of the two subscribable kinds a topic is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopicKind {
    GroupMessage,
    Welcome,
}

/// A subscribable topic: a group-message or a welcome topic.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Topic(Vec<u8>);

impl Topic {
    /// Parses topic bytes; anything but a group-message or welcome topic with
    /// a 1..=64 byte identifier is refused.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<Topic, Error> {
        let bytes = bytes.into();
        match bytes.first() {
            Some(&GROUP_MESSAGE) | Some(&WELCOME) => {
                check_id(&bytes[1..], "topic identifier")?;
                Ok(Topic(bytes))
            }
            _ => Err(Error::new(ErrorKind::Host, "a topic must be a group-message (0x00) or welcome (0x01) topic")),
        }
    }

    /// The welcome topic of an installation.
    pub fn welcome(installation_id: &[u8]) -> Result<Topic, Error> {
        check_id(installation_id, "installation id")?;
        let mut bytes = Vec::with_capacity(1 + installation_id.len());
        bytes.push(WELCOME);
        bytes.extend_from_slice(installation_id);
        Ok(Topic(bytes))
    }

    pub fn kind(&self) -> TopicKind {
        if self.0[0] == GROUP_MESSAGE { TopicKind::GroupMessage } else { TopicKind::Welcome }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Topic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Topic({:?}, {} bytes)", self.kind(), self.0.len())
    }
}

fn check_id(id: &[u8], what: &str) -> Result<(), Error> {
    if id.is_empty() || id.len() > MAX_ID_BYTES {
        return Err(Error::new(ErrorKind::Host, format!("a {what} must be 1 to {MAX_ID_BYTES} bytes")));
    }
    Ok(())
}

// Stored as lowercase hex: a JSON state file keeps its maps keyed by text.
impl Serialize for Topic {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Topic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Topic, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = hex::decode(text).map_err(serde::de::Error::custom)?;
        Topic::from_bytes(bytes).map_err(serde::de::Error::custom)
    }
}

impl Serialize for GroupId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for GroupId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<GroupId, D::Error> {
        let text = String::deserialize(d)?;
        let bytes = hex::decode(text).map_err(serde::de::Error::custom)?;
        GroupId::new(bytes).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_topic_is_the_kind_byte_then_the_group_id() {
        let group = GroupId::new(vec![1, 2, 3]).unwrap();
        assert_eq!(group.topic().as_bytes(), &[0, 1, 2, 3]);
        assert_eq!(group.topic().kind(), TopicKind::GroupMessage);
        assert_eq!(Topic::welcome(&[9]).unwrap().as_bytes(), &[1, 9]);
    }

    #[test]
    fn only_subscribable_topics_with_bounded_ids_parse() {
        assert!(Topic::from_bytes(vec![0, 1]).is_ok());
        assert!(Topic::from_bytes(vec![1; 65]).is_ok());
        assert!(Topic::from_bytes(vec![0]).is_err(), "empty identifier");
        assert!(Topic::from_bytes(vec![1; 66]).is_err(), "65-byte identifier");
        assert!(Topic::from_bytes(vec![2, 1]).is_err(), "identity updates are not subscribable");
        assert!(Topic::from_bytes(vec![]).is_err());
        assert!(GroupId::new(vec![]).is_err());
        assert!(GroupId::new(vec![0; 65]).is_err());
    }

    #[test]
    fn topics_round_trip_through_json_as_hex_and_never_debug_print_their_bytes() {
        let topic = GroupId::new(vec![0xab, 0xcd]).unwrap().topic();
        let json = serde_json::to_string(&topic).unwrap();
        assert_eq!(json, "\"00abcd\"");
        assert_eq!(serde_json::from_str::<Topic>(&json).unwrap(), topic);
        assert!(serde_json::from_str::<Topic>("\"05ab\"").is_err());
        assert!(!format!("{topic:?}").contains("abcd"));
    }
}
