//! The FCM HTTP v1 message of spec 000 section 7 (PUSH-259).

use crate::domain::StoredEnvelope;

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
}
