//! PUSH-230's sender HMAC: what a publisher claims the envelope's data
//! hashes to under the sender's own key of the epoch.

/// HMAC-SHA256 of an envelope's data under the sender's HMAC key: exactly 32
/// bytes. An envelope without one (the field absent, or of another length)
/// is never suppressed: PUSH-230 fails open, so a wrong length is not an
/// error, only no HMAC.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SenderHmac([u8; SenderHmac::LEN]);

impl SenderHmac {
    pub const LEN: usize = 32;

    /// `None` unless `bytes` are exactly 32 bytes.
    pub fn parse(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    pub const fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }
}

crate::domain::redacted_debug!(SenderHmac);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_32_bytes_are_an_hmac() {
        assert_eq!(SenderHmac::parse(&[7; 32]).map(|h| *h.as_bytes()), Some([7; 32]));
        for len in [0, 1, 31, 33, 64] {
            assert_eq!(SenderHmac::parse(&vec![7; len]), None, "{len} bytes");
        }
        assert_eq!(format!("{:?}", SenderHmac::parse(&[7; 32]).unwrap()), "SenderHmac(..)");
    }
}
