//! The APNs request of spec 000 section 7 (PUSH-259).

use std::borrow::Cow;
use std::fmt::Write as _;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Uri};

use super::token::ProviderToken;
use crate::channel::collapse::fit_collapse_id;
use crate::channel::relayed::{Fitted, Refusal, RelayedPush, fit};
use crate::domain::StoredEnvelope;
use crate::transport::pool::{decimal_len, push_path_segment};

/// APNs refuses a push whose body is over 4096 bytes (PayloadTooLarge).
pub const MAX_BODY_BYTES: usize = 4096;

/// Spec 003 §3 on APNs: a background push (`content-available`) whose
/// `payload` key holds the relayed payload object unchanged, so the app
/// hands `userInfo["payload"]` to gim-core's process_push. Over 4096 bytes,
/// `mls_message` is dropped.
pub fn relayed_apns_body(payload: &serde_json::Map<String, serde_json::Value>) -> Result<Fitted, Refusal> {
    fit(payload, MAX_BODY_BYTES, |p| {
        let body = serde_json::json!({"aps": {"content-available": 1}, "payload": p}).to_string();
        let n = body.len();
        (body, n)
    })
}

/// The APNs push body (PUSH-259): a background push carrying only the topic
/// (standard base64) and the sequence id (decimal text). The values hold only
/// base64 characters and digits, so nothing needs escaping.
pub fn apns_body(envelope: &StoredEnvelope) -> String {
    apns_body_with(&envelope.topic.to_base64(), envelope.sequence_id)
}

/// `apns_body` from the topic's base64, written into one buffer of its
/// exact length (built for every push, handed to the request without a copy).
fn apns_body_with(topic_base64: &str, sequence_id: u64) -> String {
    const FRAME: &str = r#"{"aps":{"content-available":1},"topic":"","sequence_id":""}"#;
    let mut body = String::with_capacity(FRAME.len() + topic_base64.len() + decimal_len(sequence_id));
    body.push_str(r#"{"aps":{"content-available":1},"topic":""#);
    body.push_str(topic_base64);
    let _ = write!(body, r#"","sequence_id":"{sequence_id}"}}"#);
    body
}

/// `{base}/3/device/{token}`, the token percent-encoded, built in one buffer.
fn device_uri(base: &str, device: &str) -> Option<Uri> {
    const PATH: &str = "/3/device/";
    let mut uri = String::with_capacity(base.len() + PATH.len() + device.len());
    uri.push_str(base);
    uri.push_str(PATH);
    push_path_segment(&mut uri, device);
    Uri::try_from(uri).ok()
}

// The APNs request headers, parsed once: a `&str` name is parsed (and a
// custom one copied) again on every request.
const APNS_TOPIC: HeaderName = HeaderName::from_static("apns-topic");
const APNS_PUSH_TYPE: HeaderName = HeaderName::from_static("apns-push-type");
const APNS_PRIORITY: HeaderName = HeaderName::from_static("apns-priority");
const APNS_COLLAPSE_ID: HeaderName = HeaderName::from_static("apns-collapse-id");
const APNS_EXPIRATION: HeaderName = HeaderName::from_static("apns-expiration");
const BACKGROUND: HeaderValue = HeaderValue::from_static("background");
const PRIORITY_BACKGROUND: HeaderValue = HeaderValue::from_static("5");

/// One push's request parts, built once and reused for the resend after
/// ExpiredProviderToken.
pub(super) struct ApnsRequest {
    uri: Uri,
    /// `apns-topic` when it is not the channel's bundle id (a relayed
    /// push's `app_id`).
    topic: Option<HeaderValue>,
    collapse_id: Option<HeaderValue>,
    /// `apns-expiration`: Unix seconds, or 0 for "deliver once, store nothing".
    expiration: HeaderValue,
    body: Bytes,
}

impl ApnsRequest {
    /// A spec 000 push (PUSH-259) that APNs may store until `expires_at`
    /// (`apns-expiration`, sent explicitly from `expiration_seconds`). `None` when
    /// the device token or topic cannot form a request.
    pub(super) fn new(base: &str, device: &str, envelope: &StoredEnvelope, expires_at: u64) -> Option<Self> {
        let uri = device_uri(base, device)?;
        let topic = envelope.topic.to_base64();
        let body = Bytes::from(apns_body_with(&topic, envelope.sequence_id));
        // PUSH-259, fitted to APNs's 64 bytes (see `collapse`).
        let collapse_id = match fit_collapse_id(&topic) {
            Cow::Borrowed(_) => HeaderValue::try_from(topic),
            Cow::Owned(stand_in) => HeaderValue::try_from(stand_in),
        };
        Some(Self {
            uri,
            topic: None,
            collapse_id: Some(collapse_id.ok()?),
            expiration: HeaderValue::from(expires_at),
            body,
        })
    }

    /// A relayed push (spec 003) to `base`, with `body` from
    /// `relayed_apns_body`, kept for its ttl. `None` when a value cannot form
    /// a request. A collapse id over APNs's 64 bytes is replaced by its
    /// stand-in, as for topics: the push still collapses with its repeats.
    pub(super) fn relayed(base: &str, push: &RelayedPush<'_>, body: String, now_unix_s: u64) -> Option<Self> {
        let uri = device_uri(base, push.token)?;
        let topic = push.app_id.map(HeaderValue::try_from).transpose().ok()?;
        let collapse_id = match push.collapse_id {
            Some(id) => Some(HeaderValue::try_from(fit_collapse_id(id).as_ref()).ok()?),
            None => None,
        };
        let expiration = HeaderValue::from(now_unix_s.saturating_add(push.ttl.as_secs()));
        Some(Self { uri, topic, collapse_id, expiration, body: Bytes::from(body) })
    }

    /// The request under `token` for `bundle_id` (apns-topic).
    pub(super) fn build(&self, token: &ProviderToken, bundle_id: &HeaderValue) -> Option<Request<Bytes>> {
        // A background push must use priority 5 (Apple's rule), whatever
        // the relayed priority says.
        let mut request = Request::new(self.body.clone());
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = self.uri.clone();
        let fields = request.headers_mut();
        fields.reserve(6);
        fields.insert(http::header::AUTHORIZATION, token.authorization.clone());
        fields.insert(APNS_TOPIC, self.topic.as_ref().unwrap_or(bundle_id).clone());
        fields.insert(APNS_PUSH_TYPE, BACKGROUND);
        fields.insert(APNS_PRIORITY, PRIORITY_BACKGROUND);
        if let Some(collapse_id) = &self.collapse_id {
            fields.insert(APNS_COLLAPSE_ID, collapse_id.clone());
        }
        fields.insert(APNS_EXPIRATION, self.expiration.clone());
        Some(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::envelope;

    use super::super::token::ProviderTokens;
    use crate::domain::Topic;
    use fanout_testkit::mock::apns::ApnsTestKey;

    fn provider_token() -> ProviderToken {
        let key = ApnsTestKey::generate().unwrap();
        let key = jsonwebtoken::EncodingKey::from_ec_pem(key.private_pem.as_bytes()).unwrap();
        let metrics = crate::metrics::Metrics::new();
        ProviderTokens::new(key, "KEY1234567".into(), "TEAM123456".into(), &metrics).sign(0).unwrap()
    }

    /// A group topic whose identifier is `identifier_len` bytes.
    fn on_topic(identifier_len: usize) -> StoredEnvelope {
        let mut bytes = vec![0x00];
        bytes.extend((0..identifier_len).map(|i| i as u8));
        StoredEnvelope { topic: Topic::parse(&bytes).unwrap(), ..envelope(5) }
    }

    /// PUSH-259's headers, the collapse id fitted to 64 bytes (the deviation in `channel::collapse`):
    /// a 47-byte identifier keeps the spec's value (64 characters), 48 and
    /// 64 get the stand-in; `apns-expiration` is the value given.
    #[test]
    fn request_headers_for_47_48_and_64_byte_identifiers() {
        let token = provider_token();
        let bundle = HeaderValue::from_static("com.example.app");
        for (len, spec_len, kept) in [(47, 64, true), (48, 68, false), (64, 88, false)] {
            let e = on_topic(len);
            let spec = e.topic.to_base64();
            assert_eq!(spec.len(), spec_len, "identifier of {len} bytes");
            let request = ApnsRequest::new("https://apns.test", "dev1", &e, 1_700_086_400).unwrap();
            let request = request.build(&token, &bundle).unwrap();
            let h = request.headers();
            let collapse = h["apns-collapse-id"].to_str().unwrap();
            assert!(collapse.len() <= 64, "{len}: {collapse}");
            if kept {
                assert_eq!(collapse, spec);
            } else {
                assert_eq!((collapse, collapse.len()), (fit_collapse_id(&spec).as_ref(), 45));
            }
            assert_eq!(h["apns-expiration"], "1700086400");
            assert_eq!(h["apns-topic"], "com.example.app");
            assert_eq!(h["apns-push-type"], "background");
            assert_eq!(h["apns-priority"], "5");
            assert!(h["authorization"].is_sensitive());
            assert_eq!(request.uri(), "https://apns.test/3/device/dev1");
        }
        // 0: deliver once, store nothing.
        let request = ApnsRequest::new("https://apns.test", "dev1", &on_topic(3), 0).unwrap();
        assert_eq!(request.build(&token, &bundle).unwrap().headers()["apns-expiration"], "0");
    }

    #[test]
    fn body_is_a_content_free_background_push() {
        let body = apns_body(&envelope(9_007_199_254_740_993));
        assert_eq!(body, r#"{"aps":{"content-available":1},"topic":"AAECAw==","sequence_id":"9007199254740993"}"#);
        let json: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(json["aps"]["content-available"], 1);
        for sequence_id in [0, 9, 10, u64::MAX] {
            let body = apns_body(&envelope(sequence_id));
            assert_eq!(body.capacity(), body.len(), "allocated at its length, sequence id {sequence_id}");
        }
    }

    #[test]
    fn relayed_body_carries_the_payload_and_fits_4096_bytes() {
        let payload = serde_json::json!({"v": 1, "type": "message", "collapse_id": "c1", "mls_message": "QUJD"});
        let payload = payload.as_object().unwrap();
        let fitted = relayed_apns_body(payload).unwrap();
        assert!(!fitted.dropped_mls_message);
        let json: serde_json::Value = serde_json::from_str(&fitted.body).unwrap();
        assert_eq!(json["aps"], serde_json::json!({"content-available": 1}));
        assert_eq!(json["payload"], serde_json::Value::Object(payload.clone()));

        let mut big = payload.clone();
        big.insert("mls_message".into(), "A".repeat(4000).into());
        let fitted = relayed_apns_body(&big).unwrap();
        assert!(fitted.dropped_mls_message && fitted.body.len() <= MAX_BODY_BYTES);
        let json: serde_json::Value = serde_json::from_str(&fitted.body).unwrap();
        assert_eq!(json["payload"], serde_json::json!({"v": 1, "type": "message", "collapse_id": "c1"}));
    }
}
