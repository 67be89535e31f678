//! The HTTPS row of spec 000 section 7's outcome table.

use std::time::Duration;

use crate::channel::outcome::Outcome;

/// Every retry of the HTTPS row waits at least one second.
const RETRY_DELAY: Duration = Duration::from_secs(1);

/// A timed-out attempt: transient, delay 1 second.
pub(super) const TIMED_OUT: Outcome = Outcome::transient(RETRY_DELAY);
/// A connection error, including a connect refused by the address check:
/// transient, delay 1 second.
pub(super) const CONNECTION_ERROR: Outcome = Outcome::transient(RETRY_DELAY);

/// First match wins. 404/410 are `Gone`: transient, and terminal when every
/// attempt answered so. Redirects are never followed: a 3xx is "anything else".
pub(super) fn classify(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered,
        404 | 410 => Outcome::Gone { delay: RETRY_DELAY },
        500..=599 => Outcome::transient(RETRY_DELAY),
        _ => Outcome::Rejected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_outcome_table() {
        assert_eq!(classify(200), Outcome::Delivered);
        assert_eq!(classify(204), Outcome::Delivered);
        assert_eq!(classify(404), Outcome::Gone { delay: RETRY_DELAY });
        assert_eq!(classify(410), Outcome::Gone { delay: RETRY_DELAY });
        assert_eq!(classify(500), Outcome::transient(RETRY_DELAY));
        assert_eq!(classify(503), Outcome::transient(RETRY_DELAY));
        assert_eq!(classify(301), Outcome::Rejected);
        assert_eq!(classify(302), Outcome::Rejected);
        assert_eq!(classify(400), Outcome::Rejected);
        assert_eq!(classify(429), Outcome::Rejected);
        assert_eq!(TIMED_OUT, Outcome::transient(Duration::from_secs(1)));
        assert_eq!(CONNECTION_ERROR, Outcome::transient(Duration::from_secs(1)));
    }
}
