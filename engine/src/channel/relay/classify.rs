//! 003 §2.4: the push server's answer → what the hub does, and the retry
//! schedule (1, 2, 4, 8 s; five attempts; never before Retry-After, honoured
//! up to 60 s). Pure functions, tested row by row.

use std::time::{Duration, SystemTime};

use crate::channel::retry_after;

/// What an attempt's answer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 2xx.
    Delivered,
    /// 404, 410: the registration is invalid (compare-and-delete).
    InvalidToken,
    /// 429, 5xx, timeout, transport error: retried, not before `retry_after`.
    Retry { retry_after: Option<Duration> },
    /// Anything else, 3xx (redirects are never followed) and other 4xx
    /// included: dropped and logged, the registration kept.
    Permanent,
}

/// Five attempts in all (003 §2.4).
pub const MAX_ATTEMPTS: u32 = 5;
/// The waits after attempts 1 to 4.
const BACKOFF: [Duration; 4] =
    [Duration::from_secs(1), Duration::from_secs(2), Duration::from_secs(4), Duration::from_secs(8)];
/// Retry-After is honoured up to this.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(60);

/// A timed-out attempt or a transport error.
pub const NO_ANSWER: Answer = Answer::Retry { retry_after: None };

/// First match wins.
pub fn classify(status: u16, retry_after: Option<&str>, now: SystemTime) -> Answer {
    match status {
        200..=299 => Answer::Delivered,
        404 | 410 => Answer::InvalidToken,
        429 | 500..=599 => Answer::Retry { retry_after: retry_after.and_then(|v| parse_retry_after(v, now)) },
        _ => Answer::Permanent,
    }
}

/// Retry-After in either form of RFC 9110 §10.2.3: delay-seconds (the one
/// the spec names) or an HTTP-date, read as the delay from `now` (a date in
/// the past is no delay). Capped at 60 s; anything else is ignored and the
/// schedule alone applies.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    retry_after::parse(value, now, RETRY_AFTER_CAP)
}

/// The wait before the next attempt after `attempts` attempts failed
/// retryably, or `None` when all five were made.
pub fn next_delay(attempts: u32, retry_after: Option<Duration>) -> Option<Duration> {
    if attempts >= MAX_ATTEMPTS {
        return None;
    }
    let backoff = *BACKOFF.get(usize::try_from(attempts.checked_sub(1)?).ok()?)?;
    Some(retry_after.map_or(backoff, |r| r.max(backoff)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Wed, 21 Oct 2015 07:28:00 GMT.
    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480)
    }

    #[test]
    fn the_answer_table() {
        assert_eq!(classify(200, None, now()), Answer::Delivered);
        assert_eq!(classify(202, None, now()), Answer::Delivered);
        assert_eq!(classify(404, None, now()), Answer::InvalidToken);
        assert_eq!(classify(410, None, now()), Answer::InvalidToken);
        assert_eq!(classify(429, None, now()), Answer::Retry { retry_after: None });
        assert_eq!(classify(500, Some("30"), now()), Answer::Retry { retry_after: Some(Duration::from_secs(30)) });
        assert_eq!(classify(503, Some("120"), now()), Answer::Retry { retry_after: Some(Duration::from_secs(60)) });
        // An HTTP-date: the delay from now, none when it has passed, capped.
        let at = |date: &str| classify(429, Some(date), now());
        assert_eq!(at("Wed, 21 Oct 2015 07:28:30 GMT"), Answer::Retry { retry_after: Some(Duration::from_secs(30)) });
        assert_eq!(at("Wed, 21 Oct 2015 07:27:00 GMT"), Answer::Retry { retry_after: Some(Duration::ZERO) });
        assert_eq!(at("Wed, 21 Oct 2015 09:28:00 GMT"), Answer::Retry { retry_after: Some(Duration::from_secs(60)) });
        assert_eq!(at("soon"), Answer::Retry { retry_after: None });
        for status in [301, 302, 307, 308, 400, 401, 403, 409, 413, 100] {
            assert_eq!(classify(status, Some("5"), now()), Answer::Permanent, "{status}");
        }
        assert_eq!(NO_ANSWER, Answer::Retry { retry_after: None });
    }

    #[test]
    fn the_schedule_is_0_1_3_7_15() {
        let mut at = Duration::ZERO;
        let mut times = vec![at];
        let mut attempts = 1;
        while let Some(delay) = next_delay(attempts, None) {
            at += delay;
            times.push(at);
            attempts += 1;
        }
        assert_eq!(times.iter().map(Duration::as_secs).collect::<Vec<_>>(), [0, 1, 3, 7, 15]);
        assert_eq!(attempts, MAX_ATTEMPTS);
        assert_eq!(next_delay(0, None), None);
    }

    #[test]
    fn retry_after_is_a_floor_capped_at_60_seconds() {
        assert_eq!(next_delay(1, parse_retry_after("30", now())), Some(Duration::from_secs(30)));
        assert_eq!(next_delay(1, parse_retry_after("120", now())), Some(Duration::from_secs(60)));
        assert_eq!(
            next_delay(4, parse_retry_after("0", now())),
            Some(Duration::from_secs(8)),
            "never before the schedule"
        );
        assert_eq!(next_delay(5, parse_retry_after("1", now())), None, "five attempts in all");
    }

    /// Push server answers, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        use std::time::UNIX_EPOCH;

        proptest! {
            /// Any header text: no delay or one of at most 60 s.
            #[test]
            fn any_retry_after_is_capped(value in "\\PC{0,40}|[0-9 ]{0,25}", status: u16) {
                if let Some(delay) = parse_retry_after(&value, now()) {
                    prop_assert!(delay <= RETRY_AFTER_CAP);
                }
                if let Answer::Retry { retry_after: Some(delay) } = classify(status, Some(&value), now()) {
                    prop_assert!(delay <= RETRY_AFTER_CAP);
                }
            }

            /// Both forms give back the delay they say, capped: seconds as
            /// digits, and an HTTP-date that far from now.
            #[test]
            fn both_forms_round_trip(secs: u64, ahead in 0u64..200, behind in 0u64..1_000_000) {
                let want = Duration::from_secs(secs).min(RETRY_AFTER_CAP);
                prop_assert_eq!(parse_retry_after(&secs.to_string(), now()), Some(want));
                prop_assert_eq!(parse_retry_after(&format!(" {secs}\t"), now()), Some(want));
                let date = httpdate::fmt_http_date(now() + Duration::from_secs(ahead));
                prop_assert_eq!(parse_retry_after(&date, now()), Some(Duration::from_secs(ahead).min(RETRY_AFTER_CAP)));
                let past = httpdate::fmt_http_date(now() - Duration::from_secs(behind));
                prop_assert_eq!(parse_retry_after(&past, now()), Some(Duration::ZERO));
                // Any clock, even before 1970's dates run out.
                let _ = parse_retry_after(&date, UNIX_EPOCH);
            }

            /// The schedule never waits less than its backoff and never
            /// goes past five attempts, whatever Retry-After said.
            #[test]
            fn the_schedule_is_bounded(attempts: u32, retry_after in proptest::option::of(0u64..100)) {
                let retry_after = retry_after.map(Duration::from_secs);
                match next_delay(attempts, retry_after) {
                    Some(delay) => {
                        prop_assert!((1..MAX_ATTEMPTS).contains(&attempts));
                        prop_assert!(delay >= BACKOFF[attempts as usize - 1]);
                        prop_assert!(delay <= BACKOFF[3].max(retry_after.unwrap_or_default()));
                    }
                    None => prop_assert!(attempts == 0 || attempts >= MAX_ATTEMPTS),
                }
            }
        }
    }
}
