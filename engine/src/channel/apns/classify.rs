//! The APNs row of spec 000 section 7's outcome table.

use std::time::Duration;

use serde::Deserialize;

use crate::channel::outcome::Outcome;

/// 429, 500, 503, timeout, connection error: transient, delay 1 second.
pub(super) const RETRY_DELAY: Duration = Duration::from_secs(1);

/// A timed-out attempt.
pub(super) const TIMED_OUT: Outcome = Outcome::transient(RETRY_DELAY);
/// A connection error.
pub(super) const CONNECTION_ERROR: Outcome = Outcome::transient(RETRY_DELAY);

/// What one request's answer means, before the refresh rule applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Classified {
    Outcome(Outcome),
    /// 403 ExpiredProviderToken: refresh the token and resend once.
    ExpiredProviderToken,
}

/// The APNs row of the outcome table, first match wins.
pub(super) fn classify(status: u16, reason: Option<&str>) -> Classified {
    let outcome = match (status, reason) {
        (200, _) => Outcome::Delivered,
        (410, Some("Unregistered" | "ExpiredToken")) => Outcome::Terminal,
        (400, Some("BadDeviceToken" | "DeviceTokenNotForTopic")) => Outcome::Mismatch,
        (429 | 500 | 503, _) => Outcome::transient(RETRY_DELAY),
        (403, Some("ExpiredProviderToken")) => return Classified::ExpiredProviderToken,
        _ => Outcome::Rejected,
    };
    Classified::Outcome(outcome)
}

#[derive(Deserialize)]
struct ErrorBody {
    reason: Option<String>,
}

/// The reason of an APNs error body, `{"reason":"..."}`.
pub(super) fn reason(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ErrorBody>(body).ok().and_then(|b| b.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apns_outcome_table() {
        use Classified::ExpiredProviderToken as Expired;
        let o = Classified::Outcome;
        assert_eq!(classify(200, None), o(Outcome::Delivered));
        assert_eq!(classify(410, Some("Unregistered")), o(Outcome::Terminal));
        assert_eq!(classify(410, Some("ExpiredToken")), o(Outcome::Terminal));
        assert_eq!(classify(410, None), o(Outcome::Rejected));
        assert_eq!(classify(410, Some("Other")), o(Outcome::Rejected));
        assert_eq!(classify(400, Some("BadDeviceToken")), o(Outcome::Mismatch));
        assert_eq!(classify(400, Some("DeviceTokenNotForTopic")), o(Outcome::Mismatch));
        assert_eq!(classify(400, Some("BadCollapseId")), o(Outcome::Rejected));
        assert_eq!(classify(400, None), o(Outcome::Rejected));
        // Status decides for the transient row, whatever the reason.
        assert_eq!(classify(429, Some("TooManyRequests")), o(Outcome::transient(RETRY_DELAY)));
        assert_eq!(classify(500, None), o(Outcome::transient(RETRY_DELAY)));
        assert_eq!(classify(503, Some("ServiceUnavailable")), o(Outcome::transient(RETRY_DELAY)));
        assert_eq!(classify(403, Some("ExpiredProviderToken")), Expired);
        assert_eq!(classify(403, Some("InvalidProviderToken")), o(Outcome::Rejected));
        assert_eq!(classify(403, Some("TooManyProviderTokenUpdates")), o(Outcome::Rejected));
        // The reason only matters with its own status.
        assert_eq!(classify(400, Some("Unregistered")), o(Outcome::Rejected));
        assert_eq!(classify(410, Some("BadDeviceToken")), o(Outcome::Rejected));
        assert_eq!(classify(502, None), o(Outcome::Rejected));
        assert_eq!(classify(201, None), o(Outcome::Rejected));
        assert_eq!(classify(404, Some("BadPath")), o(Outcome::Rejected));
        // Timeouts and connection errors.
        assert_eq!(TIMED_OUT, Outcome::transient(Duration::from_secs(1)));
        assert_eq!(CONNECTION_ERROR, Outcome::transient(Duration::from_secs(1)));
    }

    #[test]
    fn reasons_are_read_from_the_json_body() {
        assert_eq!(reason(br#"{"reason":"BadDeviceToken"}"#).as_deref(), Some("BadDeviceToken"));
        assert_eq!(reason(br#"{"reason":"Unregistered","timestamp":1700000000000}"#).as_deref(), Some("Unregistered"));
        assert_eq!(reason(b"not json"), None);
        assert_eq!(reason(b""), None);
    }

    /// APNs answers, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any body: a reason no longer than the body, or none; a reason
            /// APNs sends comes back as sent.
            #[test]
            fn any_body_gives_a_bounded_reason(
                body in prop::collection::vec(any::<u8>(), 0..200),
                sent in "\\PC{0,40}",
            ) {
                if let Some(reason) = reason(&body) {
                    prop_assert!(reason.len() <= body.len());
                }
                let json = serde_json::json!({"reason": sent, "timestamp": 1}).to_string();
                prop_assert_eq!(reason(json.as_bytes()), Some(sent));
            }

            /// Any status and reason: one row of the table; 200 alone delivers.
            #[test]
            fn any_answer_has_one_row(
                status: u16,
                reason in proptest::option::of("\\PC{0,30}|Unregistered|BadDeviceToken|ExpiredProviderToken"),
            ) {
                let classified = classify(status, reason.as_deref());
                prop_assert_eq!(classified == Classified::Outcome(Outcome::Delivered), status == 200);
                if let Classified::Outcome(Outcome::Transient { delay }) = classified {
                    prop_assert_eq!(delay, RETRY_DELAY);
                }
            }
        }
    }
}
