//! 003 §3: what the device receives. `mls_message` is inlined only while the
//! payload JSON stays within the limit (3072 bytes for the webhook, leaving
//! room for the push server's platform envelope; 4096 for the log provider).
//! Minimal mode sends exactly the wake object.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;

use super::event::Notification;

/// 003 §3: the webhook's payload stays within this many bytes of JSON.
pub const WEBHOOK_PAYLOAD_LIMIT: usize = 3072;
/// 003 §5: the log provider inlines `mls_message` within this many bytes.
pub const LOG_PAYLOAD_LIMIT: usize = 4096;

/// A payload, serialized in the spec's key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Payload<'a> {
    Full(Full<'a>),
    /// Minimal mode: `{"v":1,"type":"wake","collapse_id":"<message_id>"}`.
    Wake {
        v: u8,
        r#type: &'static str,
        collapse_id: &'a str,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Full<'a> {
    v: u8,
    r#type: &'static str,
    gid: &'a str,
    seq: u64,
    message_id: &'a str,
    collapse_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    mls_message: Option<String>,
}

impl<'a> Payload<'a> {
    /// The payload of `n`: the wake object in minimal mode, else the full
    /// payload with `mls_message` only if the JSON stays within `limit` bytes.
    pub fn new(n: &'a Notification, minimal: bool, limit: usize) -> Self {
        if minimal {
            return Self::Wake { v: 1, r#type: "wake", collapse_id: &n.message_id };
        }
        let mut full = Full {
            v: 1,
            r#type: n.kind.as_str(),
            gid: &n.gid,
            seq: n.seq,
            message_id: &n.message_id,
            collapse_id: &n.message_id,
            mls_message: n.mls_message.as_deref().map(|m| STANDARD.encode(m)),
        };
        if full.mls_message.is_some() && serde_json::to_vec(&full).map_or(usize::MAX, |b| b.len()) > limit {
            // The client fetches the message by (gid, seq) instead.
            full.mls_message = None;
        }
        Self::Full(full)
    }

    pub fn collapse_id(&self) -> &str {
        match self {
            Self::Full(f) => f.collapse_id,
            Self::Wake { collapse_id, .. } => collapse_id,
        }
    }

    pub fn has_mls_message(&self) -> bool {
        matches!(self, Self::Full(Full { mls_message: Some(_), .. }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::channel::relay::event::EventType;

    fn notification(kind: EventType, data: Option<Vec<u8>>) -> Notification {
        Notification {
            kind,
            gid: "group-1".into(),
            seq: 42,
            message_id: "b76b4f49cf0d311f53af81576f61d459".into(),
            mls_message: data.map(Arc::from),
        }
    }

    fn json(p: &Payload<'_>) -> String {
        serde_json::to_string(p).unwrap()
    }

    #[test]
    fn the_full_payload_in_the_spec_order() {
        let n = notification(EventType::Message, Some(b"hi".to_vec()));
        assert_eq!(
            json(&Payload::new(&n, false, WEBHOOK_PAYLOAD_LIMIT)),
            r#"{"v":1,"type":"message","gid":"group-1","seq":42,"message_id":"b76b4f49cf0d311f53af81576f61d459","collapse_id":"b76b4f49cf0d311f53af81576f61d459","mls_message":"aGk="}"#
        );
        let m = notification(EventType::MemberAdded, None);
        assert!(!json(&Payload::new(&m, false, WEBHOOK_PAYLOAD_LIMIT)).contains("mls_message"));
    }

    #[test]
    fn mls_message_is_inlined_only_within_the_limit() {
        // Without mls_message the payload is 146 bytes; `,"mls_message":""`
        // adds 17, so base64 of up to 3072 - 163 = 2909 characters fits:
        // 2908 of them, 2181 raw bytes (3071 bytes of JSON); 2182 make 3075.
        let base = json(&Payload::new(&notification(EventType::Message, None), false, 3072)).len();
        assert_eq!(base, 146);
        let fits = notification(EventType::Message, Some(vec![0; 2181]));
        let p = Payload::new(&fits, false, WEBHOOK_PAYLOAD_LIMIT);
        assert!(p.has_mls_message());
        assert_eq!(json(&p).len(), 3071, "within the limit");
        let over = notification(EventType::Message, Some(vec![0; 2182]));
        let p = Payload::new(&over, false, WEBHOOK_PAYLOAD_LIMIT);
        assert!(!p.has_mls_message(), "one byte more: omitted");
        assert!(Payload::new(&over, false, LOG_PAYLOAD_LIMIT).has_mls_message(), "the log provider's limit is 4096");
    }

    #[test]
    fn minimal_mode_is_exactly_the_wake_object() {
        let n = notification(EventType::Welcome, Some(b"hi".to_vec()));
        let p = Payload::new(&n, true, WEBHOOK_PAYLOAD_LIMIT);
        assert_eq!(json(&p), r#"{"v":1,"type":"wake","collapse_id":"b76b4f49cf0d311f53af81576f61d459"}"#);
        assert_eq!(p.collapse_id(), "b76b4f49cf0d311f53af81576f61d459");
    }
}
