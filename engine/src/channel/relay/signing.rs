//! 003 §2.2: `X-Gim-Signature: t=<unix seconds>,v1=<lowercase hex HMAC-SHA256>`
//! over `"<t>."` and the raw body bytes, under the webhook secret.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub const HEADER_SIGNATURE: &str = "x-gim-signature";
pub const HEADER_DELIVERY: &str = "x-gim-delivery";

/// The webhook secret (`secret_file`): raw bytes. Debug hides it (PUSH-254).
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret(Vec<u8>);

/// Shortest secret accepted: 16 bytes, the floor of spec 000's signing keys.
pub const MIN_SECRET_LEN: usize = 16;

impl WebhookSecret {
    /// The file's contents without a trailing line break (editors add one).
    pub fn from_file_contents(contents: &[u8]) -> Result<Self, &'static str> {
        let trimmed = contents.strip_suffix(b"\n").unwrap_or(contents);
        let trimmed = trimmed.strip_suffix(b"\r").unwrap_or(trimmed);
        if trimmed.len() < MIN_SECRET_LEN {
            return Err("the secret must be at least 16 bytes");
        }
        Ok(Self(trimmed.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

crate::domain::redacted_debug!(WebhookSecret);

/// The header value for `body` sent at `t` (Unix seconds).
pub fn signature_header(secret: &WebhookSecret, t: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("hmac accepts any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_vector() {
        let secret = WebhookSecret::from_file_contents(b"example-secret-0123456789abcdef0123\n").unwrap();
        let body = br#"{"v":1,"hub_id":"hubexample","delivery_id":"3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c"}"#;
        assert_eq!(
            signature_header(&secret, 1_760_600_000, body),
            "t=1760600000,v1=41f7f7c39db767f966e6c1cd60c6a460266194f33b271d1244ac9bb7b38e544e"
        );
        // The mock receiver verifies it independently.
        let header = signature_header(&secret, 1_760_600_000, body);
        assert!(fanout_testkit::mock::webhook::verify_gim_signature(secret.as_bytes(), &header, body));
    }

    #[test]
    fn secrets_are_long_enough_and_hidden() {
        assert!(WebhookSecret::from_file_contents(b"short\n").is_err());
        let s = WebhookSecret::from_file_contents(b"0123456789abcdef\r\n").unwrap();
        assert_eq!(s.as_bytes(), b"0123456789abcdef");
        assert_eq!(format!("{s:?}"), "WebhookSecret(..)");
    }
}
