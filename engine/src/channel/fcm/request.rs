//! The FCM HTTP v1 message of spec 000 section 7 (PUSH-259).

use serde_json::{Map, Value};

use crate::channel::relayed::{Fitted, RelayPriority, RelayRefusal, RelayedPush, fit};
use crate::domain::StoredEnvelope;

/// FCM refuses a message whose data is over 4096 bytes.
pub const MAX_DATA_BYTES: usize = 4096;

/// Spec 003 §3 on FCM: a data message whose `data.payload` is the relayed
/// payload as JSON text (FCM data values are strings), with the collapse id
/// as Android `collapse_key` and `apns-collapse-id`, `high` → Android HIGH
/// and `normal` → NORMAL, the ttl as Android `ttl`, and on Apple devices a
/// background push at priority 5 (Apple's rule for content-available).
/// Over 4096 bytes of data, `mls_message` is dropped.
pub fn relayed_fcm_body(push: &RelayedPush<'_>) -> Result<Fitted, RelayRefusal> {
    fit(push.payload, MAX_DATA_BYTES, |payload: &Map<String, Value>| {
        let data = serde_json::json!({ "payload": Value::Object(payload.clone()).to_string() });
        // What FCM counts: the data's keys and values.
        let size = data.to_string().len();
        let priority = match push.priority {
            RelayPriority::High => "HIGH",
            RelayPriority::Normal => "NORMAL",
        };
        let mut android = serde_json::json!({"priority": priority, "ttl": format!("{}s", push.ttl.as_secs())});
        let mut apns_headers = serde_json::json!({"apns-priority": "5", "apns-push-type": "background"});
        if let Some(collapse_id) = push.collapse_id {
            android["collapse_key"] = collapse_id.into();
            apns_headers["apns-collapse-id"] = collapse_id.into();
        }
        let message = serde_json::json!({"message": {
            "token": push.token,
            "data": data,
            "android": android,
            "apns": {"headers": apns_headers, "payload": {"aps": {"content-available": 1}}},
        }});
        (message.to_string(), size)
    })
}

/// The FCM message (PUSH-259): data holding only the topic (standard base64)
/// and the sequence id (decimal text), a high-priority Android message, a
/// background APNs push at priority 5, and no collapse key.
pub fn fcm_body(envelope: &StoredEnvelope, token: &str) -> String {
    // The token is caller-supplied text: JSON-escape it. The other values are
    // base64 and digits.
    let token = serde_json::Value::from(token).to_string();
    format!(
        concat!(
            r#"{{"message":{{"token":{},"data":{{"topic":"{}","sequence_id":"{}"}},"#,
            r#""android":{{"priority":"HIGH"}},"#,
            r#""apns":{{"headers":{{"apns-priority":"5","apns-push-type":"background"}},"payload":{{"aps":{{"content-available":1}}}}}}}}}}"#
        ),
        token,
        envelope.topic.to_base64(),
        envelope.sequence_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::envelope;

    #[test]
    fn body_carries_data_priorities_and_no_collapse_key() {
        let body = fcm_body(&envelope(9_007_199_254_740_993), "reg\"token");
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let expected = serde_json::json!({"message": {
            "token": "reg\"token",
            "data": {"topic": "AAECAw==", "sequence_id": "9007199254740993"},
            "android": {"priority": "HIGH"},
            "apns": {"headers": {"apns-priority": "5", "apns-push-type": "background"},
                     "payload": {"aps": {"content-available": 1}}}
        }});
        assert_eq!(json, expected);
        assert!(!body.contains("collapse"));
    }

    #[test]
    fn relayed_body_maps_collapse_priority_and_payload() {
        let payload = serde_json::json!({"v": 1, "type": "message", "collapse_id": "c1", "mls_message": "QUJD"});
        let push = RelayedPush {
            token: "reg\"token",
            app_id: None,
            sandbox: false,
            collapse_id: Some("c1"),
            priority: RelayPriority::Normal,
            payload: payload.as_object().unwrap(),
            ttl: std::time::Duration::from_secs(86_400),
        };
        let fitted = relayed_fcm_body(&push).unwrap();
        let json: Value = serde_json::from_str(&fitted.body).unwrap();
        let expected = serde_json::json!({"message": {
            "token": "reg\"token",
            "data": {"payload": payload.to_string()},
            "android": {"priority": "NORMAL", "ttl": "86400s", "collapse_key": "c1"},
            "apns": {"headers": {"apns-priority": "5", "apns-push-type": "background", "apns-collapse-id": "c1"},
                     "payload": {"aps": {"content-available": 1}}}
        }});
        assert_eq!(json, expected);
        let high = RelayedPush { priority: RelayPriority::High, collapse_id: None, ..push };
        let json: Value = serde_json::from_str(&relayed_fcm_body(&high).unwrap().body).unwrap();
        assert_eq!(json["message"]["android"], serde_json::json!({"priority": "HIGH", "ttl": "86400s"}));

        let mut big = payload.as_object().unwrap().clone();
        big.insert("mls_message".into(), "A".repeat(4100).into());
        let fitted = relayed_fcm_body(&RelayedPush { payload: &big, ..push }).unwrap();
        assert!(fitted.dropped_mls_message);
        assert!(!fitted.body.contains("mls_message"));
    }
}
