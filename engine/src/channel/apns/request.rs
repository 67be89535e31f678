//! The APNs request of spec 000 section 7 (PUSH-259).

use bytes::Bytes;
use http::{HeaderValue, Request, Uri};
use http_body_util::Full;

use super::token::ProviderToken;
use crate::channel::pool::encode_path_segment;
use crate::domain::StoredEnvelope;

/// The APNs push body (PUSH-259): a background push carrying only the topic
/// (standard base64) and the sequence id (decimal text). The values hold only
/// base64 characters and digits, so nothing needs escaping.
pub fn apns_body(envelope: &StoredEnvelope) -> String {
    format!(
        r#"{{"aps":{{"content-available":1}},"topic":"{}","sequence_id":"{}"}}"#,
        envelope.topic.to_base64(),
        envelope.sequence_id
    )
}

/// One push's request parts, built once and reused for the resend after
/// ExpiredProviderToken.
pub(super) struct ApnsRequest {
    uri: Uri,
    collapse_id: HeaderValue,
    body: Bytes,
}

impl ApnsRequest {
    /// `None` when the device token or topic cannot form a request.
    pub(super) fn new(base: &str, device: &str, envelope: &StoredEnvelope) -> Option<Self> {
        let uri = format!("{base}/3/device/{}", encode_path_segment(device)).parse().ok()?;
        let collapse_id = HeaderValue::try_from(envelope.topic.to_base64()).ok()?;
        Some(Self { uri, collapse_id, body: Bytes::from(apns_body(envelope)) })
    }

    /// The request under `token` for `bundle_id` (apns-topic).
    pub(super) fn build(&self, token: &ProviderToken, bundle_id: &HeaderValue) -> Option<Request<Full<Bytes>>> {
        Request::post(self.uri.clone())
            .header(http::header::AUTHORIZATION, token.authorization.clone())
            .header("apns-topic", bundle_id.clone())
            .header("apns-push-type", "background")
            .header("apns-priority", "5")
            .header("apns-collapse-id", self.collapse_id.clone())
            .body(Full::new(self.body.clone()))
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::envelope;

    #[test]
    fn body_is_a_content_free_background_push() {
        let body = apns_body(&envelope(9_007_199_254_740_993));
        assert_eq!(body, r#"{"aps":{"content-available":1},"topic":"AAECAw==","sequence_id":"9007199254740993"}"#);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["aps"]["content-available"], 1);
    }
}
