//! Retry-After, read the same way by every channel whose outcome table
//! honours it (FCM and Web Push: spec 000 section 7, up to 300 s; the relay
//! webhook: 003 §2.4, up to 60 s). No channel's own module: a channel never
//! imports another.
//!
//! RFC 9110 §10.2.3 allows two forms, and both are read: delay-seconds, and
//! an HTTP-date (IMF-fixdate, and the obsolete RFC 850 and asctime forms a
//! recipient must accept, RFC 9110 §5.6.7), taken as the delay from `now`.
//! Either is capped by the caller's limit; anything else is ignored and the
//! table's delay alone applies.

use std::time::{Duration, SystemTime};

use super::outcome::Outcome;

/// The delay a Retry-After value asks for, at most `cap`. A date already
/// past asks for none.
pub(crate) fn parse(value: &str, now: SystemTime, cap: Duration) -> Option<Duration> {
    let value = value.trim();
    let delay = if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Digits beyond u64 are a delay beyond any cap.
        value.parse::<u64>().map_or(Duration::MAX, Duration::from_secs)
    } else {
        httpdate::parse_http_date(value).ok()?.duration_since(now).unwrap_or(Duration::ZERO)
    };
    Some(delay.min(cap))
}

/// The answer's Retry-After header, as [`parse`] reads it.
pub(crate) fn from_headers(headers: &http::HeaderMap, now: SystemTime, cap: Duration) -> Option<Duration> {
    parse(headers.get(http::header::RETRY_AFTER)?.to_str().ok()?, now, cap)
}

/// A transient outcome waits for the longer of its table delay and the
/// (already capped) Retry-After; any other outcome is left as it is.
pub(crate) fn honour(outcome: Outcome, retry_after: Option<Duration>) -> Outcome {
    match (outcome, retry_after) {
        (Outcome::Transient { delay }, Some(after)) => Outcome::transient(delay.max(after)),
        (outcome, _) => outcome,
    }
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::*;

    /// Wed, 21 Oct 2015 07:28:00 GMT.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480)
    }

    const CAP: Duration = Duration::from_secs(300);

    fn s(secs: u64) -> Option<Duration> {
        Some(Duration::from_secs(secs))
    }

    #[test]
    fn delay_seconds_are_read_as_sent_and_capped() {
        assert_eq!(parse("120", now(), CAP), s(120));
        assert_eq!(parse(" 7 ", now(), CAP), s(7));
        assert_eq!(parse("0", now(), CAP), s(0));
        assert_eq!(parse("86400", now(), CAP), s(300));
        assert_eq!(parse("99999999999999999999999", now(), CAP), s(300), "beyond u64: capped, not ignored");
        assert_eq!(parse("120", now(), Duration::from_secs(60)), s(60));
        for ignored in ["", "-5", "+5", "1.5", "soon", "5 s"] {
            assert_eq!(parse(ignored, now(), CAP), None, "{ignored:?}");
        }
    }

    #[test]
    fn an_http_date_in_any_of_the_three_forms_is_the_delay_from_now() {
        assert_eq!(parse("Wed, 21 Oct 2015 07:28:06 GMT", now(), CAP), s(6), "IMF-fixdate");
        assert_eq!(parse("Wednesday, 21-Oct-15 07:28:06 GMT", now(), CAP), s(6), "RFC 850");
        assert_eq!(parse("Wed Oct 21 07:28:06 2015", now(), CAP), s(6), "asctime");
        assert_eq!(parse("Wed, 21 Oct 2015 07:27:00 GMT", now(), CAP), s(0), "past: no delay");
        assert_eq!(parse("Wed, 21 Oct 2015 09:28:00 GMT", now(), CAP), s(300), "capped like delay-seconds");
        assert_eq!(parse("Wed, 21 Oct 2015 07:29:00 GMT", now(), Duration::from_secs(30)), s(30));
        assert_eq!(parse("Wed, 32 Oct 2015 07:28:06 GMT", now(), CAP), None);
    }

    #[test]
    fn the_header_is_read_in_both_forms() {
        let mut headers = HeaderMap::new();
        assert_eq!(from_headers(&headers, now(), CAP), None);
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("Wed, 21 Oct 2015 07:28:06 GMT"));
        assert_eq!(from_headers(&headers, now(), CAP), s(6));
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static("42"));
        assert_eq!(from_headers(&headers, now(), CAP), s(42));
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(from_headers(&headers, now(), CAP), None);
    }

    #[test]
    fn only_a_longer_retry_after_lengthens_a_transient_outcome() {
        let t = |secs| Outcome::transient(Duration::from_secs(secs));
        assert_eq!(honour(t(10), s(30)), t(30));
        assert_eq!(honour(t(10), s(5)), t(10), "shorter than the delay: the delay");
        assert_eq!(honour(t(10), None), t(10));
        assert_eq!(honour(Outcome::Rejected, s(30)), Outcome::Rejected);
        assert_eq!(honour(Outcome::Terminal, s(30)), Outcome::Terminal);
        assert_eq!(honour(Outcome::Delivered, s(30)), Outcome::Delivered);
    }
}
