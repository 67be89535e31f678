//! `apns-collapse-id`, fitted to APNs's 64-byte limit: the APNs channel and the APNs block of an FCM message use it.
//!
//! PUSH-259 (spec 000 section 7) sets it to the standard base64 of the
//! topic. APNs refuses a collapse id over 64 bytes (400 BadCollapseId, which
//! the table classifies as rejected), and TOPIC-001 allows a 64-byte
//! identifier: a topic whose identifier is 48 bytes or more (49 topic bytes
//! with the kind byte) has a base64 of 68 characters or more, so every push
//! on it would be lost. **Deviation from PUSH-259:** a value
//! that fits is sent as the spec says; one that does not is replaced by
//! `~` followed by the standard base64 of SHA-256(`TAG` ‖ value). That is 45
//! bytes, the same for every push of the topic (APNs still collapses per
//! topic), and never equal to a spec value (`~` is outside the base64
//! alphabet). Relayed pushes (spec 003) go through the same rule, also for
//! the APNs block of an FCM message.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

/// APNs refuses an `apns-collapse-id` over 64 bytes (BadCollapseId).
pub const MAX_COLLAPSE_ID_BYTES: usize = 64;

/// Domain separation: these digests mean nothing else.
pub const TAG: &[u8] = b"fanout/apns-collapse-id/v1\0";

/// `value` when APNs accepts it, else its fixed-length stand-in.
pub fn fit_collapse_id(value: &str) -> Cow<'_, str> {
    if value.len() <= MAX_COLLAPSE_ID_BYTES {
        return Cow::Borrowed(value);
    }
    let digest = Sha256::new().chain_update(TAG).chain_update(value.as_bytes()).finalize();
    Cow::Owned(format!("~{}", STANDARD.encode(digest)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Topic;

    fn topic(identifier_len: usize, fill: u8) -> Topic {
        let mut bytes = vec![0x00];
        bytes.extend(std::iter::repeat_n(fill, identifier_len));
        Topic::parse(&bytes).unwrap()
    }

    #[test]
    fn the_spec_value_is_kept_while_it_fits() {
        // 1 kind byte + 47 identifier bytes: base64 of 48 bytes is 64 characters.
        let t = topic(47, 7);
        let spec = t.to_base64();
        assert_eq!(spec.len(), 64);
        assert_eq!(fit_collapse_id(&spec), Cow::Borrowed(spec.as_str()));
        assert_eq!(fit_collapse_id("AAECAw=="), "AAECAw==");
    }

    #[test]
    fn a_long_topic_gets_a_deterministic_per_topic_stand_in() {
        let (a, b) = (topic(64, 1), topic(64, 2));
        let (sa, sb) = (a.to_base64(), b.to_base64());
        assert_eq!(sa.len(), 88, "a 64-byte identifier: APNs would refuse the spec value");
        let fa = fit_collapse_id(&sa);
        assert_eq!(fa.len(), 45);
        assert!(fa.len() <= MAX_COLLAPSE_ID_BYTES);
        assert!(fa.starts_with('~'), "{fa}: never a base64 value");
        assert_eq!(fit_collapse_id(&sa), fa, "the same for every push of the topic");
        assert_ne!(fit_collapse_id(&sb), fa, "distinct per topic");
        // The documented derivation, computed independently.
        let mut h = Sha256::new();
        h.update(b"fanout/apns-collapse-id/v1\0");
        h.update(sa.as_bytes());
        assert_eq!(fa, format!("~{}", STANDARD.encode(h.finalize())));
        // A 48-byte identifier is the shortest whose spec value (68
        // characters) does not fit.
        let first = topic(48, 3).to_base64();
        assert_eq!(first.len(), 68);
        assert_eq!(fit_collapse_id(&first).len(), 45);
        // The first value that does not fit (65 bytes) is replaced too.
        assert!(fit_collapse_id(&"x".repeat(65)).starts_with('~'));
    }
}
