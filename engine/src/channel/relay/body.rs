//! 003 §2.3: the webhook body. Serialized once per attempt from values that
//! do not change across retries (delivery_id, sent_at of the first attempt),
//! so every attempt of a push sends the same bytes. No user or device id.

use serde::Serialize;

use super::event::Priority;
use super::payload::Payload;
use crate::domain::RelayRegistration;

/// 003 §2.3: seconds the push server may keep trying, for every push.
pub const TTL_SECONDS: u32 = 86_400;

#[derive(Serialize)]
struct Body<'a> {
    v: u8,
    hub_id: &'a str,
    delivery_id: &'a str,
    sent_at: i64,
    registration: Registration<'a>,
    priority: &'static str,
    collapse_id: &'a str,
    ttl: u32,
    payload: &'a Payload<'a>,
}

/// The stored registration; unset optional fields are absent, and p256dh and
/// auth are unpadded base64url (stored so).
#[derive(Serialize)]
struct Registration<'a> {
    provider: &'a str,
    token: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    app_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p256dh: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    auth: Option<&'a str>,
}

/// What one push's body is made of.
pub struct BodyInput<'a> {
    pub hub_id: &'a str,
    pub delivery_id: &'a str,
    /// Unix milliseconds of the first attempt.
    pub sent_at_ms: i64,
    pub registration: &'a RelayRegistration,
    pub priority: Priority,
    pub payload: &'a Payload<'a>,
}

pub fn webhook_body(input: &BodyInput<'_>) -> Vec<u8> {
    let r = input.registration;
    let body = Body {
        v: 1,
        hub_id: input.hub_id,
        delivery_id: input.delivery_id,
        sent_at: input.sent_at_ms,
        registration: Registration {
            provider: r.provider(),
            token: r.token(),
            app_id: r.app_id(),
            sandbox: r.sandbox(),
            p256dh: r.p256dh(),
            auth: r.auth(),
        },
        priority: input.priority.as_str(),
        // 003 §2.3: equal to the payload's (the message id).
        collapse_id: input.payload.collapse_id(),
        ttl: TTL_SECONDS,
        payload: input.payload,
    };
    serde_json::to_vec(&body).expect("the body always serializes")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::relay::event::{EventType, Notification};
    use crate::domain::RegistrationInput;

    #[test]
    fn the_body_has_exactly_the_spec_fields() {
        let registration = RelayRegistration::parse(RegistrationInput {
            provider: "apns",
            token: "tok",
            app_id: Some("im.g.apps"),
            sandbox: Some(false),
            p256dh: None,
            auth: Some("dGVzdA=="),
        })
        .unwrap();
        let n = Notification {
            kind: EventType::MemberAdded,
            gid: "group-1".into(),
            seq: 42,
            message_id: "b76b4f49cf0d311f53af81576f61d459".into(),
            mls_message: None,
        };
        let payload = Payload::new(&n, false, 3072);
        let body = webhook_body(&BodyInput {
            hub_id: "hub-a",
            delivery_id: "3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c",
            sent_at_ms: 1_760_600_000_123,
            registration: &registration,
            priority: Priority::High,
            payload: &payload,
        });
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "v": 1, "hub_id": "hub-a", "delivery_id": "3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c",
                "sent_at": 1_760_600_000_123_i64,
                "registration": {"provider": "apns", "token": "tok", "app_id": "im.g.apps", "sandbox": false, "auth": "dGVzdA"},
                "priority": "high", "collapse_id": "b76b4f49cf0d311f53af81576f61d459", "ttl": 86400,
                "payload": {"v": 1, "type": "group.member_added", "gid": "group-1", "seq": 42,
                    "message_id": "b76b4f49cf0d311f53af81576f61d459", "collapse_id": "b76b4f49cf0d311f53af81576f61d459"}
            })
        );
        let text = String::from_utf8(body).unwrap();
        assert!(!text.contains("user_id") && !text.contains("device_id"));
    }
}
