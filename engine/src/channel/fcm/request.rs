//! The FCM HTTP v1 message of spec 000 section 7 (PUSH-259).

use serde_json::{Map, Value};

use crate::channel::collapse::fit_collapse_id;
use crate::channel::common::PushLifetime;
use crate::channel::relayed::{Fitted, Refusal, RelayPriority, RelayedPush, fit};
use crate::domain::StoredEnvelope;

/// FCM refuses a message whose data is over 4096 bytes.
pub const MAX_DATA_BYTES: usize = 4096;

/// Spec 003 §3 on FCM: a data message whose `data.payload` is the relayed
/// payload as JSON text (FCM data values are strings), with the collapse id
/// as Android `collapse_key` and `apns-collapse-id`, `high` → Android HIGH
/// and `normal` → NORMAL, the ttl as Android `ttl` and as `apns-expiration`
/// (from `now_unix_s`), and on Apple devices a background push at priority 5
/// (Apple's rule for content-available). Over 4096 bytes of data,
/// `mls_message` is dropped.
///
/// Collapse ids: FCM documents no length limit for
/// `collapse_key` (only four keys per device at a time), so it goes as it
/// is; the APNs block's `apns-collapse-id` reaches APNs, which refuses more
/// than 64 bytes, so it gets the APNs channel's stand-in when longer.
pub fn relayed_fcm_body(push: &RelayedPush<'_>, now_unix_s: u64) -> Result<Fitted, Refusal> {
    fit(push.payload, MAX_DATA_BYTES, |payload: &Map<String, Value>| {
        let data = serde_json::json!({ "payload": Value::Object(payload.clone()).to_string() });
        // What FCM counts: the data's keys and values.
        let size = data.to_string().len();
        let priority = match push.priority {
            RelayPriority::High => "HIGH",
            RelayPriority::Normal => "NORMAL",
        };
        let ttl = push.ttl.as_secs();
        let mut android = serde_json::json!({"priority": priority, "ttl": format!("{ttl}s")});
        let mut apns_headers = serde_json::json!({"apns-priority": "5", "apns-push-type": "background",
            "apns-expiration": now_unix_s.saturating_add(ttl).to_string()});
        if let Some(collapse_id) = push.collapse_id {
            android["collapse_key"] = collapse_id.into();
            apns_headers["apns-collapse-id"] = fit_collapse_id(collapse_id).as_ref().into();
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
/// background APNs push at priority 5, and no collapse key. It also says how
/// long FCM may keep it for an offline device (`ttl_seconds`): Android
/// `ttl`, and for Apple devices `apns-expiration` (Unix seconds from
/// `now_unix_s`, or 0 for "deliver once, store nothing", as on the APNs
/// channel).
pub fn fcm_body(envelope: &StoredEnvelope, token: &str, lifetime: PushLifetime, now_unix_s: u64) -> String {
    // The token is caller-supplied text: JSON-escape it. The other values are
    // base64 and digits.
    let token = serde_json::Value::from(token).to_string();
    format!(
        concat!(
            r#"{{"message":{{"token":{},"data":{{"topic":"{}","sequence_id":"{}"}},"#,
            r#""android":{{"priority":"HIGH","ttl":"{}s"}},"#,
            r#""apns":{{"headers":{{"apns-priority":"5","apns-push-type":"background","apns-expiration":"{}"}},"#,
            r#""payload":{{"aps":{{"content-available":1}}}}}}}}}}"#
        ),
        token,
        envelope.topic.to_base64(),
        envelope.sequence_id,
        lifetime.seconds(),
        lifetime.expires_at(now_unix_s),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::envelope;

    #[test]
    fn body_carries_data_priorities_lifetime_and_no_collapse_key() {
        let now = 1_700_000_000;
        let body = fcm_body(&envelope(9_007_199_254_740_993), "reg\"token", PushLifetime::DEFAULT, now);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        let expected = serde_json::json!({"message": {
            "token": "reg\"token",
            "data": {"topic": "AAECAw==", "sequence_id": "9007199254740993"},
            "android": {"priority": "HIGH", "ttl": "86400s"},
            "apns": {"headers": {"apns-priority": "5", "apns-push-type": "background", "apns-expiration": "1700086400"},
                     "payload": {"aps": {"content-available": 1}}}
        }});
        assert_eq!(json, expected);
        assert!(!body.contains("collapse"));
        // 0: now or never, on both platforms.
        let body = fcm_body(&envelope(1), "t", PushLifetime::new(0).unwrap(), now);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["message"]["android"]["ttl"], "0s");
        assert_eq!(json["message"]["apns"]["headers"]["apns-expiration"], "0");
        let body = fcm_body(&envelope(1), "t", PushLifetime::new(2_419_200).unwrap(), now);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["message"]["android"]["ttl"], "2419200s");
        assert_eq!(json["message"]["apns"]["headers"]["apns-expiration"], "1702419200");
    }

    #[test]
    fn relayed_body_maps_collapse_priority_ttl_and_payload() {
        let now = 1_700_000_000;
        let payload = serde_json::json!({"v": 1, "type": "message", "collapse_id": "c1", "mls_message": "QUJD"});
        let push = RelayedPush {
            token: "reg\"token",
            app_id: None,
            sandbox: false,
            collapse_id: Some("c1"),
            priority: RelayPriority::Normal,
            payload: payload.as_object().unwrap(),
            ttl: std::time::Duration::from_secs(86_400),
            web_push_keys: None,
        };
        let fitted = relayed_fcm_body(&push, now).unwrap();
        let json: Value = serde_json::from_str(&fitted.body).unwrap();
        let expected = serde_json::json!({"message": {
            "token": "reg\"token",
            "data": {"payload": payload.to_string()},
            "android": {"priority": "NORMAL", "ttl": "86400s", "collapse_key": "c1"},
            "apns": {"headers": {"apns-priority": "5", "apns-push-type": "background", "apns-collapse-id": "c1",
                                 "apns-expiration": "1700086400"},
                     "payload": {"aps": {"content-available": 1}}}
        }});
        assert_eq!(json, expected);
        let high = RelayedPush { priority: RelayPriority::High, collapse_id: None, ..push };
        let json: Value = serde_json::from_str(&relayed_fcm_body(&high, now).unwrap().body).unwrap();
        assert_eq!(json["message"]["android"], serde_json::json!({"priority": "HIGH", "ttl": "86400s"}));
        assert!(json["message"]["apns"]["headers"].get("apns-collapse-id").is_none());

        // Over APNs's 64 bytes: collapse_key as it is (FCM documents no
        // limit), the APNs block's collapse id replaced by its stand-in.
        let long = "k".repeat(100);
        let json: Value = serde_json::from_str(
            &relayed_fcm_body(&RelayedPush { collapse_id: Some(&long), ..push }, now).unwrap().body,
        )
        .unwrap();
        assert_eq!(json["message"]["android"]["collapse_key"], long.as_str());
        let apns_id = json["message"]["apns"]["headers"]["apns-collapse-id"].as_str().unwrap();
        assert_eq!(apns_id, fit_collapse_id(&long));
        assert!(apns_id.len() <= 64);

        let mut big = payload.as_object().unwrap().clone();
        big.insert("mls_message".into(), "A".repeat(4100).into());
        let fitted = relayed_fcm_body(&RelayedPush { payload: &big, ..push }, now).unwrap();
        assert!(fitted.dropped_mls_message);
        assert!(!fitted.body.contains("mls_message"));
    }
}
