use super::Timestamp;

/// An HMAC epoch is 30 days (spec 000, Terms).
pub const HMAC_EPOCH_SECONDS: i64 = 2_592_000;

/// The HMAC epoch of a Unix time in nanoseconds: seconds / 2592000, rounded down.
pub fn hmac_epoch(unix_ns: i64) -> i64 {
    Timestamp::from_unix_nanos(unix_ns).as_secs().div_euclid(HMAC_EPOCH_SECONDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_boundaries() {
        let s = 1_000_000_000i64;
        assert_eq!(hmac_epoch(0), 0);
        assert_eq!(hmac_epoch(HMAC_EPOCH_SECONDS * s - 1), 0);
        assert_eq!(hmac_epoch(HMAC_EPOCH_SECONDS * s), 1);
        assert_eq!(hmac_epoch(1_700_000_000 * s), 655);
    }
}
