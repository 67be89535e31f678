use crate::domain::Recipient;
use crate::domain::StoredEnvelope;

/// The HTTPS push body (PUSH-259): topic as standard base64, sequence_id as
/// decimal text, recipient_id as lowercase hex, and nothing else. The field
/// values contain only base64, digits and hex, so no escaping is needed.
pub fn webhook_body(envelope: &StoredEnvelope, recipient: &Recipient) -> String {
    format!(
        r#"{{"topic":"{}","sequence_id":"{}","recipient_id":"{}"}}"#,
        envelope.topic.to_base64(),
        envelope.sequence_id,
        recipient.id.to_hex()
    )
}
