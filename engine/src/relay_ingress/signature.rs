//! Spec 003 §2.2: `X-Gim-Signature: t=<unix seconds>,v1=<lowercase hex>`,
//! `v1 = hex(HMAC-SHA256(secret, "<t>." || raw body))`.
//!
//! The receiver checks the timestamp window before computing anything, and
//! the MAC over the bytes exactly as they arrived: the body is parsed only
//! after this passes (§2.2 "before any JSON parsing or re-serialization").

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// The header name (§2.1).
pub const HEADER_SIGNATURE: &str = "x-gim-signature";

/// Why a signature is refused. Every variant answers 401; the variants
/// exist for the `reason` label of the rejection counter and for tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case", prefix = "signature_")]
pub enum SignatureError {
    #[error("the X-Gim-Signature header is missing")]
    Missing,
    #[error("the X-Gim-Signature header is malformed")]
    Malformed,
    #[error("the signature timestamp is outside the accepted window")]
    Stale,
    #[error("the signature does not match")]
    Mismatch,
}

impl SignatureError {
    /// A bounded label value.
    pub fn label(self) -> &'static str {
        self.into()
    }
}

/// The parsed header: the timestamp as sent (its decimal text is what the
/// MAC covers) and every `v1` value (several let a hub rotate secrets).
#[derive(Debug, PartialEq, Eq)]
pub struct SignatureHeader<'a> {
    t_text: &'a str,
    t: i64,
    v1: Vec<&'a str>,
}

impl<'a> SignatureHeader<'a> {
    /// §2.2: split on `,` into `key=value` pairs, take `t` and `v1`; other
    /// keys are ignored (a later scheme version may add them).
    pub fn parse(header: &'a str) -> Result<Self, SignatureError> {
        let mut t = None;
        let mut v1 = Vec::new();
        for pair in header.split(',') {
            let (key, value) = pair.trim().split_once('=').ok_or(SignatureError::Malformed)?;
            match key {
                // Two timestamps would make "the" signed one ambiguous.
                "t" if t.is_some() => return Err(SignatureError::Malformed),
                "t" => t = Some(value),
                "v1" => v1.push(value),
                _ => {}
            }
        }
        let t_text = t.ok_or(SignatureError::Malformed)?;
        // Decimal digits only: the MAC covers this text, so "+5" or " 5"
        // must not pass as 5.
        if t_text.is_empty() || t_text.len() > 18 || !t_text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(SignatureError::Malformed);
        }
        let t = t_text.parse().map_err(|_| SignatureError::Malformed)?;
        if v1.is_empty() {
            return Err(SignatureError::Malformed);
        }
        Ok(Self { t_text, t, v1 })
    }

    /// The signed Unix time.
    pub fn timestamp(&self) -> i64 {
        self.t
    }

    /// §2.2: refuse when |now − t| > window, then compare the lowercase hex
    /// of the MAC with each `v1` in constant time.
    pub fn verify(&self, secret: &[u8], body: &[u8], now_unix_s: i64, window: Duration) -> Result<(), SignatureError> {
        let window = i64::try_from(window.as_secs()).unwrap_or(i64::MAX);
        if now_unix_s.abs_diff(self.t) > window.unsigned_abs() {
            return Err(SignatureError::Stale);
        }
        let expected = sign_hex(secret, self.t_text, body);
        // ct_eq on slices of different lengths answers false without
        // looking at the contents; the length of a hex MAC is public.
        let matched = self.v1.iter().fold(0u8, |any, v| any | expected.as_bytes().ct_eq(v.as_bytes()).unwrap_u8());
        if matched == 1 { Ok(()) } else { Err(SignatureError::Mismatch) }
    }
}

/// `hex(HMAC-SHA256(secret, "<t>." || body))`, lowercase.
pub fn sign_hex(secret: &[u8], t: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("hmac accepts any key length");
    mac.update(t.as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// The header a hub sends for `body` at `t` (tests and the load harness).
pub fn header_value(secret: &[u8], t: i64, body: &[u8]) -> String {
    let t = t.to_string();
    format!("t={t},v1={}", sign_hex(secret, &t, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Spec 003 §2.2's example (checklist item 6).
    const SECRET: &[u8] = b"example-secret-0123456789abcdef0123";
    const T: i64 = 1_760_600_000;
    const BODY: &[u8] = br#"{"v":1,"hub_id":"hubexample","delivery_id":"3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c"}"#;
    const HEADER: &str = "t=1760600000,v1=41f7f7c39db767f966e6c1cd60c6a460266194f33b271d1244ac9bb7b38e544e";
    const WINDOW: Duration = Duration::from_secs(300);

    fn verify(header: &str, body: &[u8], now: i64) -> Result<(), SignatureError> {
        SignatureHeader::parse(header)?.verify(SECRET, body, now, WINDOW)
    }

    #[test]
    fn the_spec_vector() {
        assert_eq!(header_value(SECRET, T, BODY), HEADER);
        assert_eq!(verify(HEADER, BODY, T), Ok(()));
    }

    #[test]
    fn the_window_is_inclusive_and_both_ways() {
        assert_eq!(verify(HEADER, BODY, T + 300), Ok(()));
        assert_eq!(verify(HEADER, BODY, T - 300), Ok(()));
        // A replay after the window, and a timestamp from the future.
        assert_eq!(verify(HEADER, BODY, T + 301), Err(SignatureError::Stale));
        assert_eq!(verify(HEADER, BODY, T - 301), Err(SignatureError::Stale));
        let narrow = SignatureHeader::parse(HEADER).unwrap().verify(SECRET, BODY, T + 11, Duration::from_secs(10));
        assert_eq!(narrow, Err(SignatureError::Stale));
    }

    #[test]
    fn tampered_and_reserialised_bodies_are_refused() {
        let tampered = br#"{"v":1,"hub_id":"hubexample","delivery_id":"3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7d"}"#;
        assert_eq!(verify(HEADER, tampered, T), Err(SignatureError::Mismatch));
        // The same JSON value, serialised again with other whitespace and key order.
        let value: serde_json::Value = serde_json::from_slice(BODY).unwrap();
        let pretty = serde_json::to_vec_pretty(&value).unwrap();
        assert_eq!(verify(HEADER, &pretty, T), Err(SignatureError::Mismatch));
        let reordered = br#"{"hub_id":"hubexample","v":1,"delivery_id":"3f1c0d9a8b7e6f5a4b3c2d1e0f9a8b7c"}"#;
        assert_eq!(verify(HEADER, reordered, T), Err(SignatureError::Mismatch));
        // Another secret, and the right MAC under another timestamp.
        let other = SignatureHeader::parse(HEADER).unwrap().verify(b"other", BODY, T, WINDOW);
        assert_eq!(other, Err(SignatureError::Mismatch));
        let shifted = HEADER.replace("t=1760600000", "t=1760600001");
        assert_eq!(verify(&shifted, BODY, T), Err(SignatureError::Mismatch));
    }

    #[test]
    fn the_hex_must_be_the_lowercase_mac() {
        assert_eq!(
            verify(&HEADER.to_uppercase().replace("T=", "t=").replace("V1=", "v1="), BODY, T),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(verify(&HEADER[..HEADER.len() - 1], BODY, T), Err(SignatureError::Mismatch));
    }

    #[test]
    fn header_shapes() {
        // Order, spaces after commas, unknown keys and a second v1 (rotation).
        let v1 = HEADER.split_once(",").unwrap().1;
        assert_eq!(verify(&format!("{v1},t={T}"), BODY, T), Ok(()));
        assert_eq!(verify(&format!("t={T}, v0=abc, {v1}"), BODY, T), Ok(()));
        assert_eq!(verify(&format!("t={T},v1=00,{v1}"), BODY, T), Ok(()));
        // Malformed: no t, no v1, two t, a t that is not plain digits, no '='.
        for bad in [
            v1.to_owned(),
            format!("t={T}"),
            format!("t={T},t={T},{v1}"),
            format!("t=+{T},{v1}"),
            format!("t=-1,{v1}"),
            format!("t=,{v1}"),
            format!("t={T},{v1},junk"),
            String::new(),
        ] {
            assert_eq!(SignatureHeader::parse(&bad).err(), Some(SignatureError::Malformed), "{bad}");
        }
    }

    /// X-Gim-Signature headers, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any header text parses or is refused; nothing else happens.
            #[test]
            fn any_header_parses_or_is_refused(header in "\\PC{0,80}|(t=[0-9+ -]{0,20},)?(v1=[0-9a-f]{0,70},?){0,3}") {
                if let Ok(parsed) = SignatureHeader::parse(&header) {
                    prop_assert!(parsed.timestamp() >= 0);
                    let _ = parsed.verify(SECRET, BODY, T, WINDOW);
                }
            }

            /// A hub's own header verifies at any time within the window and
            /// for no other body, secret or time.
            #[test]
            fn signed_headers_verify_exactly(
                secret in prop::collection::vec(any::<u8>(), 1..40),
                body in prop::collection::vec(any::<u8>(), 0..100),
                t in 0i64..999_999_999_999_999_999,
                skew in -300i64..=300,
                now: i64,
                flip in any::<prop::sample::Index>(),
            ) {
                let header = header_value(&secret, t, &body);
                let parsed = SignatureHeader::parse(&header).unwrap();
                prop_assert_eq!(parsed.timestamp(), t);
                prop_assert_eq!(parsed.verify(&secret, &body, t.saturating_add(skew), WINDOW), Ok(()));
                let outside = now.abs_diff(t) > WINDOW.as_secs();
                prop_assert_eq!(parsed.verify(&secret, &body, now, WINDOW).is_err(), outside);
                // (Not an appended zero: HMAC pads its key with zeros.)
                let mut other = secret.clone();
                other[0] ^= 1;
                prop_assert_eq!(parsed.verify(&other, &body, t, WINDOW), Err(SignatureError::Mismatch));
                if !body.is_empty() {
                    let mut tampered = body.clone();
                    let i = flip.index(tampered.len());
                    tampered[i] ^= 1;
                    prop_assert_eq!(parsed.verify(&secret, &tampered, t, WINDOW), Err(SignatureError::Mismatch));
                }
            }
        }
    }
}
