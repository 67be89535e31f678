//! The Web Push row of the outcome table (RFC 8030 section 5 and 7.3,
//! RFC 8292 section 4.2). First match wins:
//!
//! | answer | outcome |
//! |---|---|
//! | 2xx (201 Created, 202 Accepted with a receipt) | delivered |
//! | 404, 410: the subscription expired or never existed | terminal (PUSH-234 compare-and-delete) |
//! | 429, 5xx | transient, 10 s / 1 s, Retry-After (delay-seconds or HTTP-date) honoured up to 300 s |
//! | timeout, connection error, failed DNS lookup | transient, 1 s |
//! | 413 (payload too large), any other 4xx, 3xx (never followed) | rejected |
//!
//! Unlike the HTTPS row, one 404/410 is enough: the push service, not the
//! recipient's own server, answers for the subscription (as FCM's
//! UNREGISTERED does). A 401/403 (a VAPID token the service refused) is
//! rejected, and the channel signs a new token for the next push.

use std::time::{Duration, SystemTime};

use crate::channel::outcome::Outcome;
use crate::channel::retry_after;

/// 5xx, timeout, connection error: transient, delay 1 second.
pub(super) const RETRY_DELAY: Duration = Duration::from_secs(1);
/// 429: the push service is throttling this sender; back off longer.
pub(super) const RATE_LIMITED_DELAY: Duration = Duration::from_secs(10);
/// A Retry-After longer than the delay is honoured up to this: the bound
/// spec 000 section 7 sets for FCM, the other push service it names.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

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
pub(super) fn classify_answer(status: http::StatusCode, headers: &http::HeaderMap, now: SystemTime) -> Outcome {
    retry_after::honour(classify(status.as_u16()), retry_after::from_headers(headers, now, MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, StatusCode};

    use super::*;

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
        let with = |value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static(value));
            h
        };
        // Wed, 21 Oct 2015 07:28:00 GMT.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let answer = |status, headers: &HeaderMap| classify_answer(status, headers, now);
        let s = Duration::from_secs;
        assert_eq!(answer(StatusCode::TOO_MANY_REQUESTS, &with("120")), Outcome::transient(s(120)));
        assert_eq!(answer(StatusCode::TOO_MANY_REQUESTS, &with("3")), Outcome::transient(RATE_LIMITED_DELAY));
        assert_eq!(answer(StatusCode::SERVICE_UNAVAILABLE, &with("86400")), Outcome::transient(MAX_RETRY_AFTER));
        assert_eq!(answer(StatusCode::SERVICE_UNAVAILABLE, &HeaderMap::new()), Outcome::transient(RETRY_DELAY));
        assert_eq!(answer(StatusCode::GONE, &with("30")), Outcome::Terminal);
        assert_eq!(answer(StatusCode::PAYLOAD_TOO_LARGE, &with("30")), Outcome::Rejected);
        assert_eq!(answer(StatusCode::CREATED, &with("30")), Outcome::Delivered);
    }

    #[test]
    fn retry_after_as_an_http_date_is_the_delay_from_now() {
        let with = |value: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::RETRY_AFTER, HeaderValue::from_static(value));
            h
        };
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let answer = |headers: &HeaderMap| classify_answer(StatusCode::SERVICE_UNAVAILABLE, headers, now);
        let s = Duration::from_secs;
        assert_eq!(answer(&with("Wed, 21 Oct 2015 07:28:06 GMT")), Outcome::transient(s(6)));
        assert_eq!(answer(&with("Wed Oct 21 07:28:06 2015")), Outcome::transient(s(6)), "asctime");
        assert_eq!(answer(&with("Thu, 22 Oct 2015 07:28:00 GMT")), Outcome::transient(MAX_RETRY_AFTER));
        assert_eq!(answer(&with("Wed, 21 Oct 2015 07:00:00 GMT")), Outcome::transient(RETRY_DELAY), "past");
    }
}
