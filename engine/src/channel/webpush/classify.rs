//! The Web Push row of the outcome table (RFC 8030 section 5 and 7.3,
//! RFC 8292 section 4.2). First match wins:
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx (201 Created, 202 Accepted with a receipt) | delivered |
//! | 404, 410: the subscription expired or never existed | terminal (PUSH-234 compare-and-delete) |
//! | 429, 5xx | transient, 10 s / 1 s, Retry-After honoured up to 300 s |
//! | timeout, connection error, failed DNS lookup | transient, 1 s |
//! | 413 (payload too large), any other 4xx, 3xx (never followed) | rejected |
//!
//! Unlike the HTTPS row, one 404/410 is enough: the push service, not the
//! recipient's own server, answers for the subscription (as FCM's
//! UNREGISTERED does). A 401/403 (a VAPID token the service refused) is
//! rejected, and the channel signs a new token for the next push.

use std::time::Duration;

use crate::channel::Outcome;
use crate::channel::fcm::classify::{honour_retry_after, retry_after};

/// 5xx, timeout, connection error: transient, delay 1 second.
pub(super) const RETRY_DELAY: Duration = Duration::from_secs(1);
/// 429: the push service is throttling this sender; back off longer.
pub(super) const RATE_LIMITED_DELAY: Duration = Duration::from_secs(10);

pub(super) const TIMED_OUT: Outcome = Outcome::transient(RETRY_DELAY);
pub(super) const CONNECTION_ERROR: Outcome = Outcome::transient(RETRY_DELAY);

pub(super) fn classify(status: u16) -> Outcome {
    match status {
        200..=299 => Outcome::Delivered,
        404 | 410 => Outcome::Terminal,
        429 => Outcome::transient(RATE_LIMITED_DELAY),
        500..=599 => Outcome::transient(RETRY_DELAY),
        _ => Outcome::Rejected,
    }
}

/// The answer to one request, Retry-After applied to a transient outcome.
pub(super) fn classify_answer(status: http::StatusCode, headers: &http::HeaderMap) -> Outcome {
    honour_retry_after(classify(status.as_u16()), retry_after(headers))
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::*;
    use crate::channel::fcm::classify::MAX_RETRY_AFTER;

    #[test]
    fn web_push_outcome_table() {
        assert_eq!(classify(201), Outcome::Delivered);
        assert_eq!(classify(202), Outcome::Delivered);
        assert_eq!(classify(200), Outcome::Delivered);
        assert_eq!(classify(404), Outcome::Terminal);
        assert_eq!(classify(410), Outcome::Terminal);
        assert_eq!(classify(429), Outcome::transient(RATE_LIMITED_DELAY));
        assert_eq!(classify(500), Outcome::transient(RETRY_DELAY));
        assert_eq!(classify(503), Outcome::transient(RETRY_DELAY));
        for rejected in [301, 302, 400, 401, 403, 413, 415, 100] {
            assert_eq!(classify(rejected), Outcome::Rejected, "{rejected}");
        }
        assert_eq!(TIMED_OUT, Outcome::transient(Duration::from_secs(1)));
        assert_eq!(CONNECTION_ERROR, Outcome::transient(Duration::from_secs(1)));
    }

    #[test]
    fn retry_after_is_honoured_on_transient_answers_only() {
        let with = |secs: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static(secs));
            h
        };
        let s = Duration::from_secs;
        assert_eq!(classify_answer(StatusCode::TOO_MANY_REQUESTS, &with("120")), Outcome::transient(s(120)));
        assert_eq!(classify_answer(StatusCode::TOO_MANY_REQUESTS, &with("3")), Outcome::transient(RATE_LIMITED_DELAY));
        assert_eq!(
            classify_answer(StatusCode::SERVICE_UNAVAILABLE, &with("86400")),
            Outcome::transient(MAX_RETRY_AFTER)
        );
        assert_eq!(
            classify_answer(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new()),
            Outcome::transient(RETRY_DELAY)
        );
        assert_eq!(classify_answer(StatusCode::GONE, &with("30")), Outcome::Terminal);
        assert_eq!(classify_answer(StatusCode::PAYLOAD_TOO_LARGE, &with("30")), Outcome::Rejected);
        assert_eq!(classify_answer(StatusCode::CREATED, &with("30")), Outcome::Delivered);
    }
}
