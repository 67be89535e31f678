//! The Web Push request (RFC 8030 section 5): an encrypted body (RFC 8291)
//! POSTed to the subscription's endpoint with `TTL`, `Urgency`, an optional
//! `Topic`, and the VAPID `Authorization` (RFC 8292).

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::{HeaderValue, Request, Uri};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::encryption::MAX_PLAINTEXT;
use crate::channel::relayed::{Fitted, Refusal, RelayPriority, RelayedPush, fit};
use crate::domain::StoredEnvelope;

/// RFC 8030 section 5.3. Spec 000 wake-ups go `normal`: delivered on battery
/// and cellular data, held back only when the battery is low, since a
/// wake-up that waits for a charger is a message that arrives hours late;
/// `low` would wait for power or Wi-Fi. Relayed pushes map their priority:
/// `high` to `high`, `normal` to `normal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "lowercase")]
pub enum Urgency {
    Normal,
    High,
}

impl Urgency {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

impl From<RelayPriority> for Urgency {
    fn from(p: RelayPriority) -> Self {
        match p {
            RelayPriority::High => Self::High,
            RelayPriority::Normal => Self::Normal,
        }
    }
}

/// The headers of one push besides the VAPID Authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushHeaders {
    /// RFC 8030 section 5.2: seconds the push service keeps it for an
    /// offline browser; 0 = deliver now or drop.
    pub ttl: u64,
    pub urgency: Urgency,
    /// RFC 8030 section 5.4: a newer push with the same topic replaces an
    /// undelivered older one.
    pub topic: Option<String>,
}

/// The wake-up a browser decrypts: the topic (standard base64) and the
/// sequence id (decimal text), as FCM's data carries them (PUSH-259) and
/// nothing else. The values are base64 and digits, so no escaping.
pub fn wake_up(envelope: &StoredEnvelope) -> String {
    format!(r#"{{"topic":"{}","sequence_id":"{}"}}"#, envelope.topic.to_base64(), envelope.sequence_id)
}

/// Spec 003 section 3 over Web Push: the relayed payload as JSON, within
/// one record (the body stays within 4096 bytes); over it, `mls_message` is
/// dropped.
pub fn relayed_payload(push: &RelayedPush<'_>) -> Result<Fitted, Refusal> {
    fit(push.payload, MAX_PLAINTEXT, |payload: &Map<String, Value>| {
        let json = Value::Object(payload.clone()).to_string();
        let size = json.len();
        (json, size)
    })
}

/// A `Topic` for a collapse id: RFC 8030 section 5.4 allows at most 32
/// characters of base64url, so the value is the first 24 bytes of the
/// id's SHA-256 in base64url (exactly 32 characters). Equal ids collapse;
/// the push service never sees the id itself.
pub fn topic_for(collapse_id: &str) -> String {
    URL_SAFE_NO_PAD.encode(&Sha256::digest(collapse_id.as_bytes())[..24])
}

/// The POST of `body` (already encrypted) to the endpoint.
pub fn request(
    endpoint: &Uri,
    authorization: HeaderValue,
    headers: &PushHeaders,
    body: Vec<u8>,
) -> Result<Request<Bytes>, http::Error> {
    let mut request = Request::post(endpoint.clone())
        .header(http::header::AUTHORIZATION, authorization)
        .header(http::header::CONTENT_ENCODING, "aes128gcm")
        .header(http::header::CONTENT_TYPE, "application/octet-stream")
        .header("ttl", headers.ttl)
        .header("urgency", headers.urgency.as_str());
    if let Some(topic) = &headers.topic {
        request = request.header("topic", topic.as_str());
    }
    request.body(Bytes::from(body))
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::testing::envelope;

    #[test]
    fn the_wake_up_is_topic_and_sequence_id_only() {
        let json: Value = serde_json::from_str(&wake_up(&envelope(9_007_199_254_740_993))).unwrap();
        assert_eq!(json, serde_json::json!({"topic": "AAECAw==", "sequence_id": "9007199254740993"}));
    }

    #[test]
    fn topics_fit_rfc_8030() {
        for id in ["", "c1", &"k".repeat(500), "ünïcode"] {
            let topic = topic_for(id);
            assert_eq!(topic.len(), 32);
            assert!(topic.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "{topic}");
            assert_eq!(topic, topic_for(id), "stable");
        }
        assert_ne!(topic_for("a"), topic_for("b"));
    }

    #[tokio::test]
    async fn the_request_carries_the_rfc_8030_headers() {
        let uri: Uri = "https://push.example.net/wpush/v2/abc".parse().unwrap();
        let auth = HeaderValue::from_static("vapid t=x.y.z, k=K");
        let headers = PushHeaders { ttl: 600, urgency: Urgency::Normal, topic: None };
        let r = request(&uri, auth.clone(), &headers, vec![1, 2, 3]).unwrap();
        assert_eq!((r.method(), r.uri()), (&http::Method::POST, &uri));
        let h = r.headers();
        assert_eq!(h["authorization"], auth);
        assert_eq!(h["content-encoding"], "aes128gcm");
        assert_eq!(h["content-type"], "application/octet-stream");
        assert_eq!(h["ttl"], "600");
        assert_eq!(h["urgency"], "normal");
        assert!(h.get("topic").is_none());
        assert_eq!(r.into_body().as_ref(), [1, 2, 3]);

        let headers = PushHeaders { ttl: 0, urgency: Urgency::High, topic: Some(topic_for("c1")) };
        let r = request(&uri, auth, &headers, Vec::new()).unwrap();
        assert_eq!((r.headers()["ttl"].to_str().unwrap(), r.headers()["urgency"].to_str().unwrap()), ("0", "high"));
        assert_eq!(r.headers()["topic"], topic_for("c1").as_str());
    }

    #[test]
    fn relayed_payloads_fit_one_record() {
        let payload = serde_json::json!({"v": 1, "type": "message", "mls_message": "QUJD"});
        let push = RelayedPush {
            token: "https://push.example.net/x",
            app_id: None,
            sandbox: false,
            collapse_id: None,
            priority: RelayPriority::High,
            payload: payload.as_object().unwrap(),
            ttl: std::time::Duration::from_secs(60),
            web_push_keys: None,
        };
        let fitted = relayed_payload(&push).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&fitted.body).unwrap(), payload);
        assert!(!fitted.dropped_mls_message);
        assert_eq!(Urgency::from(push.priority), Urgency::High);
        let mut big = payload.as_object().unwrap().clone();
        big.insert("mls_message".into(), "A".repeat(MAX_PLAINTEXT).into());
        let fitted = relayed_payload(&RelayedPush { payload: &big, ..push }).unwrap();
        assert!(fitted.dropped_mls_message && fitted.body.len() <= MAX_PLAINTEXT);
        big.insert("other".into(), "A".repeat(MAX_PLAINTEXT).into());
        assert_eq!(relayed_payload(&RelayedPush { payload: &big, ..push }), Err(Refusal::TooLarge));
    }
}
