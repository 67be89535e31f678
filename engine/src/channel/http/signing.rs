//! Webhook signing in the Standard Webhooks v1 shape (PUSH-235, spec 000
//! section 7.1): `webhook-signature: v1,<base64 HMAC-SHA256(key, id.ts.body)>`.
//!
//! Deviation from Standard Webhooks, as the spec states: webhook-id is new for
//! every attempt, and the key is the raw 16 to 64 byte signing key.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use rand::RngCore;
use sha2::Sha256;

use crate::domain::SigningKey;

pub const HEADER_ID: &str = "webhook-id";
pub const HEADER_TIMESTAMP: &str = "webhook-timestamp";
pub const HEADER_SIGNATURE: &str = "webhook-signature";

/// `v1,` and the standard base64 of a SHA-256 MAC.
const SIGNATURE_LEN: usize = 3 + 44;
/// `msg_` and the base64url of 24 bytes.
const WEBHOOK_ID_LEN: usize = 4 + 32;

/// `v1,` followed by the standard base64 of HMAC-SHA256 under `key` over
/// `{webhook_id}.{timestamp}.` and the exact body bytes (PUSH-235).
pub fn sign(key: &SigningKey, webhook_id: &str, timestamp: i64, body: &[u8]) -> String {
    sign_text(key, webhook_id, &timestamp.to_string(), body)
}

/// `sign` with the timestamp already in its decimal text, as the header
/// carries it. Every string is allocated once at its final length: this
/// runs for every attempt.
fn sign_text(key: &SigningKey, webhook_id: &str, timestamp: &str, body: &[u8]) -> String {
    // HMAC takes a key of any length; SigningKey holds 16 to 64 bytes.
    let mut mac = Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("hmac accepts any key length");
    mac.update(webhook_id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body);
    let mut signature = String::with_capacity(SIGNATURE_LEN);
    signature.push_str("v1,");
    STANDARD.encode_string(mac.finalize().into_bytes(), &mut signature);
    signature
}

/// A webhook-id unique to one attempt: `msg_` and 24 random bytes, base64url.
pub fn new_webhook_id() -> String {
    let mut bytes = [0u8; 24];
    rand::rng().fill_bytes(&mut bytes);
    let mut id = String::with_capacity(WEBHOOK_ID_LEN);
    id.push_str("msg_");
    URL_SAFE_NO_PAD.encode_string(bytes, &mut id);
    id
}

/// The three PUSH-235 header values for one attempt. Debug hides the
/// signature (it is derived from the key).
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookHeaders {
    /// webhook-id
    pub id: String,
    /// webhook-timestamp: Unix seconds as decimal text.
    pub timestamp: String,
    /// webhook-signature
    pub signature: String,
}

impl WebhookHeaders {
    /// A fresh id, `now_unix_s` as the timestamp, and the signature of `body`.
    pub fn for_attempt(key: &SigningKey, body: &[u8], now_unix_s: i64) -> WebhookHeaders {
        let id = new_webhook_id();
        let timestamp = now_unix_s.to_string();
        let signature = sign_text(key, &id, &timestamp, body);
        WebhookHeaders { id, timestamp, signature }
    }
}

impl std::fmt::Debug for WebhookHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookHeaders")
            .field("id", &self.id)
            .field("timestamp", &self.timestamp)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = br#"{"topic":"AQID","sequence_id":"9007199254740993","recipient_id":"0101"}"#;

    #[test]
    fn spec_test_vector() {
        // Spec 000 section 7.1.
        let key = SigningKey::parse(&[0x07; 32]).unwrap();
        assert_eq!(sign(&key, "fixed-id", 1_700_000_000, BODY), "v1,IszeBLRjxb7spJ5RLi+KW0w/aK3Buioq9E6jl3MKWZw=");
    }

    #[test]
    fn every_input_changes_the_signature() {
        let key = SigningKey::parse(&[0x07; 32]).unwrap();
        let other = SigningKey::parse(&[0x08; 32]).unwrap();
        let base = sign(&key, "fixed-id", 1_700_000_000, BODY);
        assert_ne!(base, sign(&other, "fixed-id", 1_700_000_000, BODY));
        assert_ne!(base, sign(&key, "fixed-id2", 1_700_000_000, BODY));
        assert_ne!(base, sign(&key, "fixed-id", 1_700_000_001, BODY));
        assert_ne!(base, sign(&key, "fixed-id", 1_700_000_000, b"{}"));
    }

    #[test]
    fn headers_for_attempt() {
        let key = SigningKey::parse(&[0x07; 16]).unwrap();
        let a = WebhookHeaders::for_attempt(&key, BODY, 1_700_000_000);
        let b = WebhookHeaders::for_attempt(&key, BODY, 1_700_000_000);
        assert_ne!(a.id, b.id, "webhook-id is unique per attempt");
        assert!(a.id.starts_with("msg_") && a.id.len() == WEBHOOK_ID_LEN && a.id.capacity() == WEBHOOK_ID_LEN);
        assert_eq!((a.signature.len(), a.signature.capacity()), (SIGNATURE_LEN, SIGNATURE_LEN));
        assert_eq!(a.timestamp, "1700000000");
        assert_eq!(a.signature, sign(&key, &a.id, 1_700_000_000, BODY));
        assert!(!format!("{a:?}").contains(&a.signature));
    }
}
