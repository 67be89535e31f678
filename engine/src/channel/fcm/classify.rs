//! The FCM row of spec 000 section 7's outcome table.

use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::channel::outcome::Outcome;
use crate::channel::retry_after;

/// 429, QuotaFailure, QUOTA_EXCEEDED: transient, delay 60 seconds.
pub(super) const QUOTA_DELAY: Duration = Duration::from_secs(60);
/// 500, 503, timeout, connection error, UNAVAILABLE, INTERNAL: transient,
/// delay 10 seconds; also a failed token fetch, which is part of the attempt.
pub(super) const RETRY_DELAY: Duration = Duration::from_secs(10);
/// A Retry-After longer than the delay is honoured up to this.
pub(super) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// A timed-out attempt.
pub(super) const TIMED_OUT: Outcome = Outcome::transient(RETRY_DELAY);
/// A connection error.
pub(super) const CONNECTION_ERROR: Outcome = Outcome::transient(RETRY_DELAY);

const QUOTA_FAILURE_TYPE: &str = "type.googleapis.com/google.rpc.QuotaFailure";
const FCM_ERROR_TYPE: &str = "type.googleapis.com/google.firebase.fcm.v1.FcmError";

#[derive(Deserialize)]
struct ErrorBody {
    error: Option<ErrorInfo>,
}

#[derive(Deserialize)]
struct ErrorInfo {
    #[serde(default)]
    details: Vec<serde_json::Value>,
}

/// What an FCM error body says: a QuotaFailure detail and the typed FcmError code.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct ErrorDetails {
    quota_failure: bool,
    fcm_error: Option<String>,
}

impl ErrorDetails {
    /// The FcmError code (`UNREGISTERED`, `SENDER_ID_MISMATCH`, ...).
    pub(super) fn code(&self) -> Option<&str> {
        self.fcm_error.as_deref()
    }
}

pub(super) fn error_details(body: &[u8]) -> ErrorDetails {
    let mut found = ErrorDetails::default();
    let Ok(ErrorBody { error: Some(info) }) = serde_json::from_slice::<ErrorBody>(body) else {
        return found;
    };
    for detail in &info.details {
        match detail.get("@type").and_then(|t| t.as_str()) {
            Some(QUOTA_FAILURE_TYPE) => found.quota_failure = true,
            Some(FCM_ERROR_TYPE) if found.fcm_error.is_none() => {
                found.fcm_error = detail.get("errorCode").and_then(|c| c.as_str()).map(str::to_owned);
            }
            _ => {}
        }
    }
    found
}

/// The FCM row of the outcome table, first match wins, before Retry-After.
pub(super) fn classify(status: u16, details: &ErrorDetails) -> Outcome {
    let code = details.fcm_error.as_deref();
    if status == 200 {
        Outcome::Delivered
    } else if status == 429 || details.quota_failure || code == Some("QUOTA_EXCEEDED") {
        Outcome::transient(QUOTA_DELAY)
    } else if status == 500 || status == 503 {
        Outcome::transient(RETRY_DELAY)
    } else if code == Some("UNREGISTERED") {
        Outcome::Terminal
    } else if code == Some("SENDER_ID_MISMATCH") {
        Outcome::Mismatch
    } else if matches!(code, Some("UNAVAILABLE" | "INTERNAL")) {
        Outcome::transient(RETRY_DELAY)
    } else {
        Outcome::Rejected
    }
}

/// The answer to one request, Retry-After applied: "a Retry-After longer
/// than the delay is honoured up to 300 seconds" (section 7), in either of
/// its forms (delay-seconds or an HTTP-date from `now`); with the error
/// details it was classified by (none for a 200), read once.
pub(super) fn classify_answer(
    status: http::StatusCode,
    headers: &http::HeaderMap,
    body: &[u8],
    now: SystemTime,
) -> (Outcome, ErrorDetails) {
    let details = if status == http::StatusCode::OK { ErrorDetails::default() } else { error_details(body) };
    let retry_after = retry_after::from_headers(headers, now, MAX_RETRY_AFTER);
    (retry_after::honour(classify(status.as_u16(), &details), retry_after), details)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn details(quota_failure: bool, code: Option<&str>) -> ErrorDetails {
        ErrorDetails { quota_failure, fcm_error: code.map(str::to_owned) }
    }
    #[test]
    fn fcm_outcome_table_first_match_wins() {
        let none = details(false, None);
        let q = Outcome::transient(QUOTA_DELAY);
        let r = Outcome::transient(RETRY_DELAY);
        assert_eq!(classify(200, &none), Outcome::Delivered);
        // 200 wins over anything in a body.
        assert_eq!(classify(200, &details(true, Some("UNREGISTERED"))), Outcome::Delivered);
        assert_eq!(classify(429, &none), q);
        assert_eq!(classify(429, &details(false, Some("UNREGISTERED"))), q);
        assert_eq!(classify(403, &details(true, None)), q);
        assert_eq!(classify(400, &details(false, Some("QUOTA_EXCEEDED"))), q);
        // Quota beats 500/503.
        assert_eq!(classify(503, &details(true, None)), q);
        assert_eq!(classify(500, &details(false, Some("QUOTA_EXCEEDED"))), q);
        assert_eq!(classify(500, &none), r);
        assert_eq!(classify(503, &none), r);
        // 500/503 beat the typed codes below them.
        assert_eq!(classify(500, &details(false, Some("UNREGISTERED"))), r);
        assert_eq!(classify(503, &details(false, Some("SENDER_ID_MISMATCH"))), r);
        assert_eq!(classify(404, &details(false, Some("UNREGISTERED"))), Outcome::Terminal);
        assert_eq!(classify(400, &details(false, Some("UNREGISTERED"))), Outcome::Terminal);
        assert_eq!(classify(403, &details(false, Some("SENDER_ID_MISMATCH"))), Outcome::Mismatch);
        assert_eq!(classify(502, &details(false, Some("UNAVAILABLE"))), r);
        assert_eq!(classify(400, &details(false, Some("INTERNAL"))), r);
        // Anything else, including an error with no typed FcmError.
        assert_eq!(classify(400, &details(false, Some("INVALID_ARGUMENT"))), Outcome::Rejected);
        assert_eq!(classify(401, &details(false, Some("THIRD_PARTY_AUTH_ERROR"))), Outcome::Rejected);
        assert_eq!(classify(404, &none), Outcome::Rejected);
        assert_eq!(classify(502, &none), Outcome::Rejected);
        assert_eq!(classify(401, &none), Outcome::Rejected);
        assert_eq!(classify(204, &none), Outcome::Rejected);
    }
    #[test]
    fn error_details_are_parsed_from_google_rpc_errors() {
        let body = br#"{"error":{"code":404,"message":"Requested entity was not found.","status":"NOT_FOUND",
            "details":[{"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"UNREGISTERED"}]}}"#;
        assert_eq!(error_details(body), details(false, Some("UNREGISTERED")));
        let quota = br#"{"error":{"code":429,"status":"RESOURCE_EXHAUSTED","details":[
            {"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"subject":"s","description":"d"}]},
            {"@type":"type.googleapis.com/google.firebase.fcm.v1.FcmError","errorCode":"QUOTA_EXCEEDED"}]}}"#;
        assert_eq!(error_details(quota), details(true, Some("QUOTA_EXCEEDED")));
        // Status text alone is not a typed FcmError.
        assert_eq!(error_details(br#"{"error":{"code":400,"status":"UNREGISTERED"}}"#), details(false, None));
        // Another detail type with an errorCode is not an FcmError.
        assert_eq!(
            error_details(br#"{"error":{"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","errorCode":"UNREGISTERED"}]}}"#),
            details(false, None)
        );
        assert_eq!(error_details(b"<html>bad gateway</html>"), details(false, None));
        assert_eq!(error_details(b""), details(false, None));
    }
    #[test]
    fn retry_after_is_honoured_up_to_300_seconds_in_both_forms() {
        // Wed, 21 Oct 2015 07:28:00 GMT.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_445_412_480);
        let answer = |status: u16, retry_after: Option<&'static str>| {
            let mut headers = http::HeaderMap::new();
            if let Some(value) = retry_after {
                headers.insert(http::header::RETRY_AFTER, HeaderValue::from_static(value));
            }
            classify_answer(http::StatusCode::from_u16(status).unwrap(), &headers, b"", now).0
        };
        let t = |secs| Outcome::transient(Duration::from_secs(secs));
        assert_eq!(answer(503, Some(" 120 ")), t(120));
        assert_eq!(answer(503, Some("5")), t(10), "shorter than the delay: the delay");
        assert_eq!(answer(429, Some("3600")), t(300), "capped");
        assert_eq!(answer(429, Some("120")), t(120));
        assert_eq!(answer(503, None), t(10));
        assert_eq!(answer(400, Some("30")), Outcome::Rejected);
        // An HTTP-date is the delay from now, under the same cap.
        assert_eq!(answer(503, Some("Wed, 21 Oct 2015 07:30:00 GMT")), t(120));
        assert_eq!(answer(503, Some("Wed, 21 Oct 2015 08:28:00 GMT")), t(300));
        assert_eq!(answer(503, Some("Wed, 21 Oct 2015 07:27:00 GMT")), t(10), "past: the delay");
        assert_eq!(answer(429, Some("Wednesday, 21-Oct-15 07:30:00 GMT")), t(120), "RFC 850");
    }

    /// FCM answers, property-tested.
    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// One `details` entry: a QuotaFailure, an FcmError (with a code of
        /// any JSON type), or anything else.
        fn detail() -> impl Strategy<Value = serde_json::Value> {
            prop_oneof![
                Just(serde_json::json!({"@type": QUOTA_FAILURE_TYPE, "violations": []})),
                "[A-Z_]{0,20}".prop_map(|code| serde_json::json!({"@type": FCM_ERROR_TYPE, "errorCode": code})),
                any::<i64>().prop_map(|code| serde_json::json!({"@type": FCM_ERROR_TYPE, "errorCode": code})),
                "\\PC{0,20}".prop_map(|t| serde_json::json!({"@type": t})),
                Just(serde_json::json!([1, 2])),
            ]
        }

        proptest! {
            /// Any bytes: details or none, never a panic; a code no longer
            /// than the body.
            #[test]
            fn any_body_gives_bounded_details(body in prop::collection::vec(any::<u8>(), 0..200)) {
                let details = error_details(&body);
                prop_assert!(details.fcm_error.as_ref().is_none_or(|c| c.len() <= body.len()));
            }

            /// A google.rpc error body says QuotaFailure when any detail is
            /// one, and the first string code of an FcmError detail.
            #[test]
            fn details_are_read_from_rpc_errors(details in prop::collection::vec(detail(), 0..5)) {
                let body = serde_json::json!({"error": {"code": 400, "status": "X", "details": details.clone()}});
                let got = error_details(body.to_string().as_bytes());
                let quota = details.iter().any(|d| d["@type"] == QUOTA_FAILURE_TYPE);
                let code = details
                    .iter()
                    .filter(|d| d["@type"] == FCM_ERROR_TYPE)
                    .find_map(|d| d["errorCode"].as_str())
                    .map(str::to_owned);
                prop_assert_eq!(got, ErrorDetails { quota_failure: quota, fcm_error: code });
            }

            /// Any status, Retry-After and body: a retried outcome waits at
            /// most 300 s; Retry-After seconds are read as sent.
            #[test]
            fn any_answer_is_bounded(
                status in 100u16..600,
                retry_after in proptest::option::of("[0-9]{1,25}|\\PC{0,20}"),
                body in "\\PC{0,40}|\\{\"error\":\\{\"details\":\\[\\]\\}\\}",
            ) {
                let mut headers = http::HeaderMap::new();
                let mut sent = None;
                if let Some(value) = retry_after.as_deref().and_then(|v| HeaderValue::from_str(v).ok()) {
                    headers.insert(http::header::RETRY_AFTER, value);
                    sent = value_secs(retry_after.as_deref().unwrap());
                }
                let status = http::StatusCode::from_u16(status).unwrap();
                let (outcome, _) = classify_answer(status, &headers, body.as_bytes(), SystemTime::now());
                if let (Some(secs), Outcome::Transient { delay }) = (sent, outcome) {
                    // Read as sent: the delay is at least the Retry-After, capped.
                    prop_assert!(delay >= Duration::from_secs(secs).min(MAX_RETRY_AFTER));
                }
                if let Some(delay) = outcome.retry_delay() {
                    prop_assert!(delay <= MAX_RETRY_AFTER);
                }
                prop_assert_eq!(outcome == Outcome::Delivered, status == http::StatusCode::OK);
            }
        }

        /// delay-seconds: digits only.
        fn value_secs(text: &str) -> Option<u64> {
            let text = text.trim();
            text.bytes().all(|b| b.is_ascii_digit()).then(|| text.parse().ok()).flatten()
        }
    }
}
