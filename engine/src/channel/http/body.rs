use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

use crate::domain::{Recipient, StoredEnvelope};
use crate::transport::pool::decimal_len;

/// The field names, quotes and braces.
const FRAME_LEN: usize = r#"{"topic":"","sequence_id":"","recipient_id":""}"#.len();

/// The HTTPS push body (PUSH-259): topic as standard base64, sequence_id as
/// decimal text, recipient_id as lowercase hex, and nothing else. The field
/// values contain only base64, digits and hex, so no escaping is needed.
/// Written into one buffer of its exact length (built for every attempt,
/// then handed to the request as it is, without a copy).
pub fn webhook_body(envelope: &StoredEnvelope, recipient: &Recipient) -> String {
    let topic = envelope.topic.as_bytes();
    let digits = decimal_len(envelope.sequence_id);
    let mut body = String::with_capacity(FRAME_LEN + topic.len().div_ceil(3) * 4 + digits + 64);
    body.push_str(r#"{"topic":""#);
    STANDARD.encode_string(topic, &mut body);
    let _ = write!(body, r#"","sequence_id":"{}","recipient_id":""#, envelope.sequence_id);
    let mut hex = [0u8; 64];
    hex::encode_to_slice(recipient.id.as_bytes(), &mut hex).expect("64 hex digits for 32 bytes");
    body.push_str(std::str::from_utf8(&hex).expect("hex digits are ASCII"));
    body.push_str(r#""}"#);
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DeliveryTarget, RecipientId};
    use crate::testing;

    #[test]
    fn the_body_has_the_three_fields_and_nothing_else() {
        let mut recipient = testing::recipient(DeliveryTarget::Apns { token: "t".into() });
        recipient.id = RecipientId::from_bytes([0xab; 32]);
        let envelope = testing::envelope(9_007_199_254_740_993);
        let body = webhook_body(&envelope, &recipient);
        let expected = format!(
            r#"{{"topic":"{}","sequence_id":"9007199254740993","recipient_id":"{}"}}"#,
            envelope.topic.to_base64(),
            "ab".repeat(32)
        );
        assert_eq!(body, expected);
        assert_eq!(body.capacity(), body.len(), "allocated at its length");
        for sequence_id in [0, 9, 10, u64::MAX] {
            let body = webhook_body(&testing::envelope(sequence_id), &recipient);
            assert_eq!(body.capacity(), body.len(), "sequence id {sequence_id}");
        }
        let parsed: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(parsed.as_object().unwrap().len(), 3);
    }
}
